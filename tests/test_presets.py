"""Every answer preset in configs/ bakes a project that is complete, clean and passes its own tests."""

import re
import sys
from pathlib import Path

import pytest

from bakery import PRESETS, TEMPLATE, preset_context, run

OPTIONAL_FILES = {
    "include_slurm": ["scripts/slurm.sbatch", "tests/test_slurm.py"],
    "include_github_actions": [".github/workflows/tests.yml"],
}


@pytest.fixture(params=PRESETS, ids=[p.stem for p in PRESETS])
def baked(request, cookies) -> tuple[Path, dict]:
    context = preset_context(request.param)
    result = cookies.bake(extra_context=context, template=str(TEMPLATE))
    assert result.exit_code == 0, result.exception
    return result.project_path, result.context


def test_preset_bakes_a_complete_clean_project(baked):
    project, context = baked
    package = context["package_name"]
    files = [p for p in project.rglob("*") if p.is_file()]
    for path in files:
        if path.parent.name == "fixtures" and path.suffix == ".ckpt":
            continue  # a checkpoint kept as a test fixture: binary, copied unrendered
        text = path.read_text()
        assert not re.search(r"\{\{|\{%|cookiecutter\.", text), f"unrendered Jinja in {path}"
        assert "template_package" not in text, f"placeholder package name left in {path}"
    folder = {"image_classifier": "classifier", "char_lm": "char_lm"}[context["task"]]
    package_dir = project / "src" / package
    assert (package_dir / folder / "model.py").is_file() and (package_dir / "engine").is_dir()
    assert len(list((project / "src" / package).iterdir())) == 4  # __init__, __main__, the engine and one task
    assert not (project / "src" / "template_package").exists()
    assert not [p for p in files if "__pycache__" in p.parts or (p.suffix == ".ckpt" and p.parent.name != "fixtures")]
    assert not [p for p in project.rglob("*") if p.is_dir() and not any(p.iterdir())], "an empty folder"
    for option, paths in OPTIONAL_FILES.items():
        for relative in paths:
            assert (project / relative).is_file() == (context[option] == "yes"), relative
    assert f'name = "{context["project_slug"]}"' in (project / "pyproject.toml").read_text()
    assert f"python -m {package} fit" in (project / "README.md").read_text()
    assert context["author_name"] in (project / "LICENSE").read_text()


def test_preset_project_is_ruff_clean(baked):
    project, _ = baked
    for cmd in (["check", "."], ["format", "--check", "."]):
        result = run([sys.executable, "-m", "ruff", *cmd], cwd=project)
        assert result.returncode == 0, result.stdout + result.stderr


# The other presets differ from the default in names and optional files only, not in code: their projects run the
# tests that depend on those (the package's name in training, help and copied modules), not the whole suite again;
# the char_lm preset, another example task on the same engine, runs its example's tests and the guarantee kit.
SMOKE = [
    "tests/test_cli.py::test_fit_writes_the_run_directory_contract",
    "tests/test_faults.py::test_help_tells_the_truth",
    "tests/test_copy_modules.py::test_the_engine_imports_nothing_outside_itself_and_has_no_import_circle",
    "tests/test_copy_modules.py::test_the_engine_copied_into_another_project_trains_its_own_model_with_the_engines_"
    "defaults",
]


def test_preset_project_passes_its_own_tests(baked, request):
    project, _ = baked
    preset = request.node.callspec.id
    if preset == "minimal":
        pytest.skip("the same code as custom_names with other names and fewer files: baked and ruff-checked above")
    select = [] if preset == "default" else ["-n", "0", *SMOKE]
    if preset == "char_lm":  # the other task (the engine's tests ran in the default preset): its own and the kit's,
        select = ["-n", "0", "-m", "example or guarantees"]  # in one process (3 workers: twice its CPU time)
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select], cwd=project, timeout=2400)
    failures = result.stdout.find("= FAILURES =")  # (the tail is the warnings' summary: the failure comes before it)
    shown = result.stdout[failures : failures + 8000] if failures >= 0 else result.stdout[-4000:]
    assert result.returncode == 0, shown + result.stdout[-1500:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", result.stdout)
