"""Helpers to bake the template and to run commands inside a baked project (tests import it as `bakery`)."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "template"
PRESETS = sorted((REPO / "configs").glob("*.yaml"))


def preset_context(preset: Path) -> dict[str, str]:
    return yaml.safe_load(preset.read_text())["default_context"]


def run(cmd: list[str], cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """Run a command with this interpreter's environment; the baked package is found through PYTHONPATH=src."""
    full_env = {**os.environ, "PYTHONPATH": str(cwd / "src"), **env}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def cookiecutter_cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("cookiecutter")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, input=input, timeout=120)
