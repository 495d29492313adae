"""The suite itself: a test that writes into the project it tests fails the whole run (conftest.py)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.cli import TESTS, subprocess_env


def test_a_suite_whose_test_writes_into_the_project_fails(tmp_path: Path):
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", project / "tests")
    (project / "tests" / "test_writes.py").write_text(
        "from conftest import PROJECT_ROOT\n\n\n"
        "def test_writes_a_run():\n"
        "    (PROJECT_ROOT / 'runs' / 'default').mkdir(parents=True)\n"
        "    (PROJECT_ROOT / 'runs' / 'default' / 'events').write_text('')\n"
    )
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project,
                            env=subprocess_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "1 passed" in result.stdout
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: the tests wrote into the project: {project / 'runs' / 'default' / 'events'}" in result.stderr


def test_no_test_file_imports_another_test_file_or_conftest():
    """What tests share lives in tests/helpers/, never in a test file or a conftest.py another one imports."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(TESTS)}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[-1].startswith("test_") or name.split(".")[-1] == "conftest"]  # fmt: skip
    assert not found, found


def test_the_tests_helpers_live_in_tests_helpers():
    """Outside tests/helpers/, every Python file under tests/ is a test file or pytest's conftest.py."""
    strays = [str(path.relative_to(TESTS)) for path in sorted(TESTS.rglob("*.py"))
              if "helpers" not in path.relative_to(TESTS).parts[:1]
              and not path.name.startswith("test_") and path.name != "conftest.py"]  # fmt: skip
    assert not strays, f"helpers belong in tests/helpers/: {strays}"
