"""Fixtures of the template's tests; plain helpers live in bakery.py."""

import shutil
import subprocess
from pathlib import Path

import pytest

from bakery import REPO


def pytest_collection_modifyitems(items: list) -> None:
    """The longest test first (the default preset's project suite), so that the others run beside it, not after."""
    items.sort(key=lambda item: item.name != "test_preset_project_passes_its_own_tests[default]")


@pytest.fixture
def template_repo(tmp_path: Path) -> Path:
    """A committed git copy of this repository, as cruft needs one to record the template's commit."""
    copy = tmp_path / "template-repo"
    ignore = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "runs", "projects", "*.egg-info")
    shutil.copytree(REPO, copy, ignore=ignore)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "template"]):
        subprocess.run([*git, *cmd], cwd=copy, check=True, capture_output=True)
    return copy
