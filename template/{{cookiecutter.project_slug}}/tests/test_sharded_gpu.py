"""configs/fsdp.yaml on CUDA GPUs: NCCL for training, bf16 compute with float32 reduction (precision auto), the
checkpoints' own gloo group beside NCCL. The checks test_sharded.py makes on CPU, for a GPU machine
(.ci/gpu_check.sh); skipped, saying why, without one. On one GPU the run is one sharded process (NCCL refuses two
processes on one GPU); the checks between processes need two GPUs."""

import json
import os
import re
import signal
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from template_package.engine.resume.whole_checkpoint import read_whole

from helpers.cli import cli, extra_config, scalars
from helpers.runs import finish, kill_group, start_fit, wait_until_frozen
from helpers.sharded import FSDP, assert_no_leftovers, assert_same_sharded_run, faulty, is_running, last_ckpt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")
needs_two = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: NCCL refuses two processes on one GPU"
)
GPUS = min(2, torch.cuda.device_count())
ON_GPUS = ["-c", FSDP, "--trainer.accelerator=gpu", f"--trainer.devices={GPUS}"]  # precision auto: bf16-mixed
RUN = [*ON_GPUS, "--model.dropout=0.3", "--trainer.max_epochs=2", "--trainer.limit_val_batches=2",
       "--last_checkpoint.every_n_steps=1", "--trainer.log_every_n_steps=1"]  # fmt: skip


class RecordComputeDtype(L.Callback):
    """Writes to `path`, at the first training batch, the dtype a sharded layer's weight has while it computes (FSDP2
    gathers it in the policy's param_dtype) and the dtype its shard is kept in."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_start(self, trainer, pl_module) -> None:
        layer = next(m for m in pl_module.modules() if isinstance(m, torch.nn.Linear))
        kept = layer.weight.dtype

        def record(module, inputs) -> None:
            if trainer.is_global_zero and not self.path.exists():
                self.path.write_text(json.dumps({"compute": str(module.weight.dtype), "kept": str(kept)}))

        layer.register_forward_pre_hook(record)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("gpu_reference") / "run"
    finish(start_fit(run_dir, *RUN))
    return run_dir


@pytest.mark.slow
def test_bf16_sharded_run_killed_and_resumed_is_bit_identical(tmp_path, reference):
    """The run computes in bfloat16 and keeps float32 shards; SIGKILLed after step 7 and resumed, it ends with the
    uninterrupted run's bits (deterministic kernels, NCCL's fixed reduction order)."""
    record = {"class_path": "test_sharded_gpu.RecordComputeDtype", "init_args": {"path": str(tmp_path / "dtype")}}
    freeze = {"class_path": "helpers.kill_points.FreezeAt",
              "init_args": {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end", "step": 7}}  # fmt: skip
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, *RUN, "-c", extra_config(tmp_path / "extra.yaml", [record, freeze]))
    wait_until_frozen(process, tmp_path / "frozen")
    kill_group(process)
    assert json.loads((tmp_path / "dtype").read_text()) == {"compute": "torch.bfloat16", "kept": "torch.float32"}
    finish(start_fit(run_dir, "--ckpt_path=last", *RUN))
    assert_same_sharded_run(reference, run_dir)
    assert all(w.dtype == torch.float32 for w in read_whole(last_ckpt(run_dir))["state_dict"].values() if
               w.is_floating_point())  # fmt: skip
    assert_no_leftovers(run_dir)


@pytest.mark.slow
def test_validate_a_bf16_sharded_checkpoint_on_one_gpu(reference, tmp_path):
    """On one GPU, read whole without the sharded strategy, and sharded over that one GPU: the fit's final val/loss
    (bf16: the same values, summed over another split of the batches)."""
    final = scalars(reference)["val/loss"][-1][1]
    for strategy in ([], ["-c", FSDP]):
        evaluation = cli("validate", *strategy, "--trainer.accelerator=gpu", "--trainer.devices=1",
                         f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={last_ckpt(reference)}",
                         "--trainer.limit_val_batches=4", "--trainer.enable_progress_bar=false")  # fmt: skip
        assert evaluation.trainer.callback_metrics["val/loss"].item() == pytest.approx(final, abs=1e-2), strategy


@pytest.mark.slow
@needs_two
def test_a_stalled_rank_stops_the_nccl_run_with_one_line(tmp_path):
    """Rank 1 stalls inside its save: rank 0, whose training collectives are NCCL's, waits on the checkpoints' gloo
    group for save_timeout (3 s) only, then stops with one line and takes rank 1 down; last.ckpt holds step 2."""
    process = start_fit(tmp_path / "run", *RUN, "-c", faulty(tmp_path, fault="stall", rank=1, step=3, save_timeout=3))
    _, err = process.communicate(timeout=300)
    seconds = time.time() - (tmp_path / "frozen").stat().st_mtime
    print(f"stalled rank on NCCL: every process ended {seconds:.1f} s after the fault")
    assert process.returncode == 1 and seconds < 60, err[-3000:]
    last = last_ckpt(tmp_path / "run")
    assert re.fullmatch(rf"error: cannot write the checkpoint {re.escape(str(last))} \(another process of the run "
                        rf"stopped or stalled during the save: .+\); {re.escape(str(last))} still holds step 2",
                        err.strip().splitlines()[-1])  # fmt: skip
    assert read_whole(last)["global_step"] == 2
    assert not is_running(int((tmp_path / "frozen").read_text()))


@pytest.mark.slow
@needs_two
def test_a_rank_killed_inside_a_save_leaves_the_previous_checkpoint(tmp_path):
    """Rank 1 SIGKILLed half-way through its shards of step 3: rank 0 stops without a traceback (the gloo group sees
    the closed connection), last.ckpt is step 2's folder, whole, before and after."""
    process = start_fit(tmp_path / "run", *RUN, "-c", faulty(tmp_path, fault="stall", rank=1, step=3))
    wait_until_frozen(process, tmp_path / "frozen")
    last = last_ckpt(tmp_path / "run")
    previous = read_whole(last)
    os.kill(int((tmp_path / "frozen").read_text()), signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert previous["global_step"] == 2 and read_whole(last)["global_step"] == 2
