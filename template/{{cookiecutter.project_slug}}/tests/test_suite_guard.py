"""The suite itself: a test that writes into the project it tests fails the whole run (conftest.py)."""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import TESTS, subprocess_env


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
