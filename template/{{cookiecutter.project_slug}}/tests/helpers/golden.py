"""The golden loss curve: the per-step train/loss of a short default run (CPU, fp32, deterministic, one thread), and a
checkpoint of that run at step 19, kept as test fixtures. test_golden.py reproduces both.

Any change to the template that alters the numerics of training (the model, the data order, the optimizer, the
schedule, clipping, precision, a dependency's kernels) then fails loudly; if the change is meant, write the files
again with:

    python tests/helpers/golden.py

and commit tests/classifier/fixtures/. On the machine that wrote them (same CPU model, torch version and thread
count, recorded in the JSON) the losses must be equal bit for bit; elsewhere within RELATIVE_TOLERANCE, since another
CPU's kernels may sum in another order.
"""

import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: the thread count is part of the curve

FIXTURES = Path(__file__).resolve().parents[1] / "classifier" / "fixtures"
CURVE = FIXTURES / "golden_loss.json"
CHECKPOINT = FIXTURES / "golden_step19.ckpt"
# 2 epochs of the default digits run (38 optimizer steps), every step logged, a checkpoint at step 19.
ARGS = ["--trainer.max_epochs=2", "--trainer.log_every_n_steps=1", "--last_checkpoint.every_n_steps=19",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.precision=32-true"]  # fmt: skip
RELATIVE_TOLERANCE = 1e-3


def machine() -> dict[str, str]:
    """What the curve's bits depend on beyond the code."""
    import torch

    cpu, isa = platform.processor() or platform.machine(), ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # the model's name, and the vector instructions that pick the kernels torch runs
        lines = cpuinfo.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
        cpu = names[0] if names else cpu
        isa = " ".join(sorted({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "fma"} & set(flags)))
    return {"cpu": cpu, "isa": isa, "torch": torch.__version__, "threads": str(torch.get_num_threads())}


def run(run_dir: Path, *args: str) -> list[tuple[int, float]]:
    """A fit in this process; its logged train/loss series."""
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    from helpers.classifier_task import CLASSIFIER
    from helpers.cli import cli, scalars

    cli("fit", f"--trainer.default_root_dir={run_dir}", *ARGS, *args, task=CLASSIFIER)
    return scalars(run_dir)["train/loss"]


def write() -> None:
    """Run the golden run and write its curve, then the same run stopped (SIGTERM) at its first epoch's end, and
    keep the checkpoint it saves there (step 19)."""
    from helpers.cli import extra_config

    with tempfile.TemporaryDirectory() as folder:
        losses = run(Path(folder) / "whole")
        stop = {"class_path": "helpers.faults.SignalAt", "init_args": {"hook": "on_train_epoch_end", "step": 19}}
        try:
            run(Path(folder) / "stopped", "-c", extra_config(Path(folder) / "stop.yaml", callbacks=[stop]))
        except SystemExit as exit_:
            assert exit_.code == 143, exit_.code
        FIXTURES.mkdir(exist_ok=True)
        shutil.copyfile(Path(folder) / "stopped" / "checkpoints" / "last.ckpt", CHECKPOINT)
    CURVE.write_text(json.dumps({"machine": machine(), "args": ARGS, "train/loss": losses}, indent=1) + "\n")
    print(f"wrote {CURVE} ({len(losses)} steps) and {CHECKPOINT} ({CHECKPOINT.stat().st_size} bytes)")


if __name__ == "__main__":
    write()
