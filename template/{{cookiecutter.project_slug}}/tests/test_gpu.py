"""CUDA-only checks: skipped on machines without a GPU (the CPU suite covers bf16 autocast)."""

import pytest
import torch

from template_package.engine.training.trainer import Trainer, auto_precision

from helpers.cli import QUICK, cli, scalars

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")


def test_auto_precision_is_32_true_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; see test_auto_precision_picks_mixed_precision_on_cuda")
    assert auto_precision() == "32-true"
    assert Trainer(accelerator="cpu", logger=False).precision == "32-true"


@needs_cuda
def test_auto_precision_picks_mixed_precision_on_cuda():
    expected = "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"
    assert Trainer(logger=False).precision == expected
    assert torch.backends.cuda.matmul.allow_tf32


@needs_cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_trains_on_cuda(tmp_path, precision):
    cli("fit", f"--trainer.precision={precision}", "--trainer.accelerator=gpu", "--trainer.devices=1",
        f"--trainer.default_root_dir={tmp_path}", "--trainer.log_every_n_steps=1", *QUICK)  # fmt: skip
    losses = [value for _, value in scalars(tmp_path)["train/loss"]]
    assert losses[-1] < losses[0]


@needs_cuda
def test_checkpoint_snapshot_copies_cuda_tensors_to_pinned_host_memory():
    from template_package.engine.resume.durable import snapshot

    weights = torch.ones(1 << 20, device="cuda")
    state, copied = snapshot({"w": weights})
    weights.add_(1)  # queued after the copy on the same stream
    copied.synchronize()
    assert state["w"].device.type == "cpu" and state["w"].is_pinned()
    assert torch.equal(state["w"], torch.ones(1 << 20))


@needs_cuda
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_resume_is_bit_identical_on_cuda(tmp_path, tmp_path_factory, precision):
    """16-mixed also carries the GradScaler's scale and growth tracker through the checkpoint."""
    from helpers.runs import assert_kill_and_resume_exact

    args = ["--trainer.accelerator=gpu", "--trainer.devices=1", f"--trainer.precision={precision}"]
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end", step=8)
