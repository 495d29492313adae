"""`python -m template_package export` (run in this process) writes a model whose outputs match the
LightningModule's."""

import pytest
import torch

from template_package.engine.cli.export import load_for_inference, run_exported

from helpers.cli import QUICK, cli, extra_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    run_dir = tmp_path_factory.mktemp("export") / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    return str(run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize(
    "suffix, fmt", [(".pt2", "torch.export"), (".pt", "torchscript"), (".onnx", "onnx")], ids=["export", "ts", "onnx"]
)
def test_exported_model_matches_the_lightning_module(checkpoint, tmp_path, capsys, suffix, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxscript", reason="the onnx extra is not installed")
        pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    output = tmp_path / f"model{suffix}"
    cli("export", f"--ckpt_path={checkpoint}", f"--output={output}")
    assert f"exported {output} ({fmt})" in capsys.readouterr().out
    model, _ = load_for_inference(checkpoint)
    images = torch.rand(7, 1, 8, 8)  # a batch size the export never saw
    with torch.no_grad():
        torch.testing.assert_close(run_exported(output, fmt, images), model(images), atol=1e-5, rtol=1e-5)


def test_unknown_suffix_is_refused(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli("export", f"--ckpt_path={checkpoint}", f"--output={tmp_path / 'model.bin'}")
    assert stop.value.code == 2
    assert "has no known suffix: use .onnx, .pt2, .pt or .ckpt" in capsys.readouterr().err


def test_a_run_exported_with_the_config_it_was_trained_with_builds_no_callback_twice(tmp_path, capsys):
    """The run's config.yaml holds the callbacks its `-c` added, and export reads it first: the same `-c` given to
    export added them again, and Lightning refused two stateful callbacks of one kind with a traceback."""
    stateful = {"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": {"monitor": "val/acc"}}
    extra = extra_config(tmp_path / "extra.yaml", callbacks=[stateful])
    run_dir = tmp_path / "run"
    cli("fit", "-c", extra, f"--trainer.default_root_dir={run_dir}", *QUICK)
    output = tmp_path / "model.pt"
    cli("export", "-c", extra, f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", f"--output={output}")
    assert f"exported {output} (torchscript)" in capsys.readouterr().out
