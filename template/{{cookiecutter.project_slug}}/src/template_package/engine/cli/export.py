"""Export a trained checkpoint's model for inference without Lightning.

    python -m template_package export --ckpt_path runs/default/checkpoints/last.ckpt --output model.onnx [options]

The model is built as `predict` builds it: its class and arguments from the run's own config.yaml (beside the
checkpoint's checkpoints/ folder; else configs/default.yaml), then from `-c` files and options given here, never from
a class the checkpoint names; its weights from the checkpoint. The sample input is the model's `example_input_array`
(Lightning's attribute for a sample input of `forward`). The format follows the file suffix, or `--format`: `.onnx`
ONNX (needs the `onnx` extra: pip install -e ".[onnx]"), `.pt2` torch.export, `.pt` TorchScript. The batch dimension
stays dynamic. After writing, the exported model runs on a batch of another size and its outputs are compared with
the LightningModule's; the command fails if they differ.

`.ckpt` writes the checkpoint itself as one file, a sharded one (a folder, configs/fsdp.yaml) gathered whole: a
normal Lightning checkpoint that validate, test, predict and `load_from_checkpoint` read without FSDP.
"""

import argparse
import sys
from pathlib import Path

import lightning as L
import torch

from ..errors import UsageError
from ..resume.digests import DamagedCheckpoint
from ..resume.durable import CheckpointWriteError, DurableCheckpointIO
from ..resume.remote_run import is_url
from ..resume.whole_checkpoint import is_checkpoint, is_sharded, read_whole
from .help import program
from .run_directory import fetched_with_its_config

FORMATS = {".onnx": "onnx", ".pt2": "torch.export", ".pt": "torchscript", ".ckpt": "checkpoint"}


def load_for_inference(ckpt_path: str, options: list[str] = ()) -> tuple[L.LightningModule, torch.Tensor]:
    """The model of a checkpoint in eval mode, built from its run's config, and its sample input."""
    from .main import build_cli, quiet_third_party_notices

    quiet_third_party_notices()
    run_config = Path(ckpt_path).resolve().parent.parent / "config.yaml"
    config = ["-c", str(run_config)] if run_config.is_file() else []
    quiet = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    quiet += ["--trainer.callbacks=[]"]  # (the model alone: the run's config and a `-c` may both name its callbacks)
    cli = build_cli(["predict", *config, *options, f"--ckpt_path={ckpt_path}", *quiet], run_subcommand=False)
    model = cli.model
    weights = read_whole(ckpt_path)["state_dict"] if is_sharded(ckpt_path) else cli.checkpoint["state_dict"]
    model.load_state_dict(weights)  # the architecture was checked against it
    sample = getattr(model, "example_input_array", None)
    if not isinstance(sample, torch.Tensor):
        raise UsageError(
            f"export needs {type(model).__name__}.example_input_array, a sample input of its forward (Lightning's "
            "attribute, e.g. torch.zeros(2, 3, 224, 224)): set it in the model's __init__"
        )
    return model.eval(), sample


def another_batch(sample: torch.Tensor) -> torch.Tensor:
    """A batch of another size than the sample (the batch dimension is dynamic), with other values where they are
    floating point (for token ids, the sample's own)."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.cat([sample, sample[:1]])
    if rows.is_floating_point():
        return torch.randn(rows.shape, generator=generator, dtype=rows.dtype)
    return rows


def export(model: torch.nn.Module, sample: torch.Tensor, output: Path, fmt: str) -> None:
    batch = torch.export.Dim("batch", min=1)
    if fmt == "torchscript":
        torch.jit.save(model.to_torchscript(method="trace", example_inputs=sample), output)  # Lightning's, no Trainer
    elif fmt == "torch.export":
        torch.export.save(torch.export.export(model, (sample,), dynamic_shapes=({0: batch},)), output)
    else:
        torch.onnx.export(
            model, (sample,), output, input_names=["inputs"], output_names=["outputs"],
            dynamic_shapes=({0: batch},), dynamo=True,
        )  # fmt: skip


def run_exported(output: Path, fmt: str, images: torch.Tensor) -> torch.Tensor:
    """Run the exported file the way a deployment would, without this package's model code."""
    if fmt == "torchscript":
        return torch.jit.load(output)(images)
    if fmt == "torch.export":
        return torch.export.load(output).module()(images)
    import onnxruntime

    session = onnxruntime.InferenceSession(output, providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(["outputs"], {"inputs": images.numpy()})[0])


def write_whole(ckpt_path: str, output: Path) -> None:
    """The checkpoint as one file (temporary file, fsync, rename), whatever its form."""
    try:
        DurableCheckpointIO().save_checkpoint(read_whole(ckpt_path), output)
    except (CheckpointWriteError, DamagedCheckpoint) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"exported {output} (checkpoint): one file that loads without FSDP (--ckpt_path {output})")


def main(argv: list[str] | None = None) -> None:
    epilog = "Other options (-c FILE, --model.<name> VALUE, ...) build the model as predict does."
    parser = argparse.ArgumentParser(prog=f"{program()} export", description=__doc__.split("\n")[0], epilog=epilog)
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by `fit`")
    parser.add_argument("--output", required=True, type=Path, help="the file to write: .onnx, .pt2, .pt or .ckpt")
    parser.add_argument("--format", choices=sorted(set(FORMATS.values())), help="default: from the suffix")
    args, options = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    fmt = args.format or FORMATS.get(args.output.suffix)
    if fmt is None:
        parser.error(f"--output {args.output} has no known suffix: use .onnx, .pt2, .pt or .ckpt, or give --format")
    if is_url(args.ckpt_path):  # a checkpoint in object storage, with its run's config.yaml where it has one
        args.ckpt_path = fetched_with_its_config(args.ckpt_path)
    if not is_checkpoint(args.ckpt_path):
        parser.error(f"--ckpt_path {args.ckpt_path} is not a checkpoint file or sharded folder")
    if fmt == "checkpoint":
        write_whole(args.ckpt_path, args.output)
        return
    try:
        model, sample = load_for_inference(args.ckpt_path, options)
    except UsageError as mistake:
        raise SystemExit(f"error: {mistake}") from None
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        export(model, sample, args.output, fmt)
        check = another_batch(sample)
        difference = (run_exported(args.output, fmt, check) - model(check)).abs().max().item()
    print(f"exported {args.output} ({fmt}); max |output difference| vs the LightningModule: {difference:.2e}")
    if difference > 1e-4:
        sys.exit(f"error: the exported model's outputs differ from the LightningModule's by {difference:.2e}")


if __name__ == "__main__":
    main()
