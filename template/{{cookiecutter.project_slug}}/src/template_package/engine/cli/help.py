"""What `--help` says: `usage: python -m <package>`, the project's own description, every subcommand (the tools
too), and for fit, validate, test and predict the options of the model and data classes the config names (in
subclass mode jsonargparse itself lists only `--model` and `--data`)."""

import importlib.metadata
import sys

from lightning.pytorch.cli import LightningArgumentParser

from ..internals import parser_actions
from .checks import class_options

# Subcommands that are not Trainer methods, run by cli/main.py before LightningCLI parses anything: the description
# --help shows, and the engine's module whose main() runs it.
TOOLS = {
    "sweep": "Search hyperparameters with Optuna: trials as run directories, a study that survives preemption.",
    "export": "Export a checkpoint's model for inference (ONNX, torch.export, TorchScript), checked against it.",
    "grad_norms": "Print the gradient norms of a few training steps and a clip value for them.",
    "guarantees": "Check that the configured model and data get every guarantee (the guarantee kit).",
}
TOOL_MODULES = {
    "sweep": "sweep.search", "export": "cli.export", "grad_norms": "cli.grad_norms", "guarantees": "guarantees"
}  # fmt: skip


def program() -> str:
    """How the user started the command: `python -m <package>`."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else sys.argv[0]


def project_description(package: str) -> str:
    """The description of the installed project that holds `package` (pyproject.toml's), else a generic one."""
    for distribution in importlib.metadata.packages_distributions().get(package.split(".")[0], []):
        summary = importlib.metadata.metadata(distribution).get("Summary")
        if summary and summary != "UNKNOWN":
            return summary
    return "Train, evaluate and sweep a LightningModule on a LightningDataModule."


class ProjectArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose help also lists the options of the configured model and data classes."""

    def format_help(self) -> str:
        text = super().format_help()
        defaults = self.get_defaults() if any(a.dest == "model" for a in parser_actions(self)) else {}
        for group in ("model", "data"):
            configured = defaults.get(group)
            if configured is None or "class_path" not in configured:
                continue
            own = class_options(group, configured.class_path).format_help()
            options = own.split(f"  --{group} CONFIG", 1)[-1].split("\n", 1)[-1]
            text += (
                f"\n{group}: {configured.class_path} (the config's; --{group} a.b.Class for another, "
                f"--{group}.help a.b.Class for its options):\n{options}"
            )
        return text
