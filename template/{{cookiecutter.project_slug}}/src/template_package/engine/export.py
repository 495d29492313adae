"""Export a trained checkpoint for inference without Lightning.

    python -m template_package.engine.export --ckpt_path runs/default/checkpoints/last.ckpt --output model.onnx

The format follows the file suffix, or `--format`: `.onnx` ONNX (needs the `onnx` extra: pip install -e ".[onnx]"),
`.pt2` torch.export, `.pt` TorchScript. The batch dimension stays dynamic. After writing, the exported model runs
on a sample batch and its outputs are compared with the LightningModule's; the command fails if they differ.
"""

import argparse
import sys
from pathlib import Path

import torch

from ..classifier.model import ImageClassifier

FORMATS = {".onnx": "onnx", ".pt2": "torch.export", ".pt": "torchscript"}


def load_for_inference(ckpt_path: str) -> tuple[ImageClassifier, torch.Tensor]:
    """The model of a checkpoint in eval mode, and a sample batch of the input size it was trained on."""
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    # Lightning's own entries start with "_"; the weights come from the checkpoint, never download pretrained ones.
    hparams = {k: v for k, v in checkpoint["hyper_parameters"].items() if not k.startswith("_")}
    model = ImageClassifier(**{**hparams, "pretrained": False})
    model.load_state_dict(checkpoint["state_dict"])
    data = checkpoint.get("datamodule_hyper_parameters", {})
    size = 8 if data.get("data_dir") is None else data["image_size"]  # digits are 8x8
    return model.eval(), torch.randn(
        3, model.hparams.in_channels, size, size, generator=torch.Generator().manual_seed(0)
    )


def export(model: torch.nn.Module, sample: torch.Tensor, output: Path, fmt: str) -> None:
    batch = torch.export.Dim("batch", min=1)
    if fmt == "torchscript":
        torch.jit.save(torch.jit.trace(model, sample), output)
    elif fmt == "torch.export":
        torch.export.save(torch.export.export(model, (sample,), dynamic_shapes=({0: batch},)), output)
    else:
        torch.onnx.export(
            model, (sample,), output, input_names=["images"], output_names=["logits"],
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
    return torch.from_numpy(session.run(["logits"], {"images": images.numpy()})[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m template_package export", description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by `fit`")
    parser.add_argument("--output", required=True, type=Path, help="the file to write: .onnx, .pt2 or .pt")
    parser.add_argument("--format", choices=sorted(set(FORMATS.values())), help="default: from the suffix")
    args = parser.parse_args(argv)
    fmt = args.format or FORMATS.get(args.output.suffix)
    if fmt is None:
        parser.error(f"--output {args.output} has no known suffix: use .onnx, .pt2 or .pt, or give --format")
    if not Path(args.ckpt_path).is_file():
        parser.error(f"--ckpt_path {args.ckpt_path} does not exist")
    model, sample = load_for_inference(args.ckpt_path)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        export(model.net, sample, args.output, fmt)  # the plain network: the LightningModule's forward is just it
        check = torch.cat([sample, sample.flip(0), sample[:1]])  # another batch size: the batch dim is dynamic
        difference = (run_exported(args.output, fmt, check) - model(check)).abs().max().item()
    print(f"exported {args.output} ({fmt}); max |output difference| vs the LightningModule: {difference:.2e}")
    if difference > 1e-4:
        sys.exit(f"error: the exported model's outputs differ from the LightningModule's by {difference:.2e}")


if __name__ == "__main__":
    main()
