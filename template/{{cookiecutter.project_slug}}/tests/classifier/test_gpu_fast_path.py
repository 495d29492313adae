"""The GPU fast path's switches (configs/fast.yaml), checked on the CPU: data held on the device gives the same
batches, FLOPs are counted right, MFU is logged against the right peak. Their speed and their CUDA resume are in
test_gpu.py and benchmarks/overhead.py --gpu."""

import pytest
import torch

from template_package.classifier.model import ImageClassifier
from template_package.engine.report import throughput
from template_package.engine.report.flops import peak_flops

from helpers.classifier_task import CLASSIFIER, error_line
from helpers.cli import QUICK, cli, scalars

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")


def test_data_on_device_trains_the_same_bits_as_the_loader(tmp_path):
    """Batches gathered from device tensors are the loader's batches: same losses, same validation, same weights."""
    runs = {name: tmp_path / name for name in ("loader", "on_device")}
    for name, run_dir in runs.items():
        cli("fit", f"--trainer.default_root_dir={run_dir}", f"--data.on_device={name == 'on_device'}",
            "--trainer.log_every_n_steps=1", *QUICK, task=CLASSIFIER)  # fmt: skip
    logged = {name: scalars(run_dir) for name, run_dir in runs.items()}
    for tag in ("train/loss", "val/loss", "val/acc"):
        assert logged["on_device"][tag] == logged["loader"][tag], tag
    assert len(logged["loader"]["train/loss"]) == 12
    weights = {
        name: torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for name, run_dir in runs.items()
    }
    assert all(torch.equal(weights["on_device"][k], v) for k, v in weights["loader"].items())


def test_data_on_device_refuses_loader_workers(run_dir):
    message = error_line(
        "fit", f"--trainer.default_root_dir={run_dir}", "--data.on_device=true", "--data.num_workers=2"
    )
    assert "data.num_workers=2 with data.on_device" in message and "set data.num_workers 0" in message


def test_flops_per_sample_match_a_count_by_hand():
    """small_cnn on 1x8x8 digits, counted as FlopCounterMode does (2 FLOPs a multiply-add): convolutions 1->32 and
    32->64 at 8x8, 64->128 at 4x4 after the pooling, a 128->10 head. Backward costs twice the forward, less the
    first convolution's input gradient, which nothing needs."""
    conv1, conv2, conv3, head = 8 * 8 * 32 * 1 * 9, 8 * 8 * 64 * 32 * 9, 4 * 4 * 128 * 64 * 9, 128 * 10
    forward = 2 * (conv1 + conv2 + conv3 + head)
    model = ImageClassifier(num_classes=10, in_channels=1, input_size=8)
    rng = torch.get_rng_state()
    assert model.flops_per_sample() == 3 * forward - 2 * conv1
    assert torch.equal(torch.get_rng_state(), rng)  # the count leaves training's random numbers alone


@pytest.mark.parametrize(
    "name, precision, expected",
    [("NVIDIA H200", "bf16-mixed", 989e12), ("NVIDIA H100 80GB HBM3", "16-mixed", 989e12),
     ("NVIDIA A100-SXM4-80GB", "bf16-mixed", 312e12), ("Some Future GPU", "bf16-mixed", None)],
)  # fmt: skip
def test_peak_flops_are_dense_tensor_core_peaks(monkeypatch, name, precision, expected):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda"), precision) == expected
    assert peak_flops(torch.device("cpu"), precision) is None


def test_mfu_is_throughput_times_flops_over_the_peak(run_dir, monkeypatch):
    """On a GPU perf/mfu is logged with perf/samples_per_sec; here the CPU is given a peak of 1 GFLOP/s."""
    monkeypatch.setattr(throughput, "peak_flops", lambda device, precision: 1e9)
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.log_every_n_steps=2", *QUICK, task=CLASSIFIER)
    logged = scalars(run_dir)
    flops = ImageClassifier(num_classes=10, in_channels=1, input_size=8).flops_per_sample()
    expected = [(step, rate * flops / 1e9) for step, rate in logged["perf/samples_per_sec"]]
    assert len(expected) >= 4
    assert [step for step, _ in logged["perf/mfu"]] == [step for step, _ in expected]
    torch.testing.assert_close([v for _, v in logged["perf/mfu"]], [v for _, v in expected], rtol=1e-6, atol=0)


def test_no_mfu_without_a_known_peak(run_dir):
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.log_every_n_steps=2", *QUICK, task=CLASSIFIER)
    logged = scalars(run_dir)
    assert "perf/samples_per_sec" in logged and "perf/mfu" not in logged


@needs_cuda
@pytest.mark.slow
def test_fast_path_switches_resume_bit_identical_on_cuda(tmp_path, tmp_path_factory):
    """configs/fast.yaml's switches but cuDNN autotuning (which gives up bit-exactness, see its comments): data held
    on the GPU, fused AdamW, channels_last and CUDA graphs resume exactly."""
    from helpers.runs import assert_kill_and_resume_exact

    args = [*CLASSIFIER, "--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.precision=bf16-mixed",
            "--data.on_device=true", "--model.fused_optimizer=true", "--model.channels_last=true",
            "--model.compile=reduce-overhead"]  # fmt: skip
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end", step=8)


@needs_cuda
def test_fast_preset_trains_on_cuda_and_logs_mfu(tmp_path):
    from helpers.cli import PROJECT_ROOT

    cli("fit", "-c", str(PROJECT_ROOT / "configs" / "fast.yaml"), f"--trainer.default_root_dir={tmp_path}",
        "--trainer.log_every_n_steps=2", *QUICK, task=CLASSIFIER)  # fmt: skip
    logged = scalars(tmp_path)
    losses = [value for _, value in logged["train/loss"]]
    assert losses[-1] < losses[0]
    assert all(0 < value < 1 for _, value in logged["perf/mfu"]), logged["perf/mfu"]


@pytest.mark.slow
def test_fast_path_switches_resume_bit_identical_on_cpu(tmp_path, tmp_path_factory):
    """configs/fast.yaml's switches that exist on the CPU: data held on the device, fused AdamW, channels_last."""
    from helpers.runs import assert_kill_and_resume_exact

    args = [*CLASSIFIER, "--data.on_device=true", "--model.fused_optimizer=true", "--model.channels_last=true"]
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end", step=8)
