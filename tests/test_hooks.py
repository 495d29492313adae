"""Bad answers stop generation with one line that names the value, and nothing is written."""

import importlib.util

import pytest

from bakery import REPO, TEMPLATE, cookiecutter_cli


def load_hook(name: str):
    spec = importlib.util.spec_from_file_location(name, TEMPLATE / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GOOD = {
    "project_name": "Digits",
    "project_slug": "digits",
    "package_name": "digits",
    "include_slurm": "yes",
    "include_github_actions": "no",
}


@pytest.mark.parametrize(
    "answers, message",
    [
        ({"project_name": "  "}, "project_name is empty"),
        ({"package_name": "my-pkg"}, "package_name 'my-pkg' is not a Python identifier"),
        ({"package_name": "2fast"}, "package_name '2fast' is not a Python identifier"),
        ({"package_name": "class"}, "package_name 'class' is a Python keyword"),
        ({"package_name": "torch"}, "package_name 'torch' would shadow the module 'torch'"),
        ({"package_name": "lightning"}, "package_name 'lightning' would shadow"),
        ({"package_name": "json"}, "package_name 'json' would shadow"),
        ({"project_slug": "My Project"}, "project_slug 'My Project' is not a valid"),
        ({"include_slurm": "maybe"}, "include_slurm='maybe' is not a valid choice: use one of yes, no"),
    ],
)
def test_validate_names_the_bad_answer(answers, message):
    assert message in load_hook("pre_gen_project").validate({**GOOD, **answers})


def test_validate_accepts_good_answers():
    assert load_hook("pre_gen_project").validate(GOOD) is None


@pytest.mark.parametrize(
    "answer, message",
    [
        ("package_name=class", "error: package_name 'class' is a Python keyword"),
        ("package_name=torch", "error: package_name 'torch' would shadow the module 'torch'"),
        ("project_name=", "error: project_name is empty"),
    ],
)
def test_cookiecutter_stops_with_one_clear_line(tmp_path, answer, message):
    result = cookiecutter_cli(str(REPO), "--no-input", "-o", str(tmp_path), answer)
    assert result.returncode != 0
    # Our line stands alone; cookiecutter itself then logs the failed hook with its own traceback.
    assert any(line.startswith(message) for line in result.stderr.splitlines())
    assert list(tmp_path.iterdir()) == []  # nothing half-generated is left behind


def test_invalid_choice_is_refused(tmp_path):
    result = cookiecutter_cli(str(REPO), "--no-input", "-o", str(tmp_path), "include_slurm=maybe")
    assert result.returncode != 0
    assert "maybe" in result.stderr + result.stdout
    assert list(tmp_path.iterdir()) == []


def test_post_gen_hook_is_idempotent(tmp_path):
    """cruft runs the hook again on update: a second run must change nothing."""
    finish_project = load_hook("post_gen_project").finish_project
    src = tmp_path / "src" / "template_package"
    src.mkdir(parents=True)
    (src / "cli.py").write_text("from template_package import x\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "slurm.sbatch").write_text("python -m template_package fit\n")
    options = {"include_slurm": "no", "include_github_actions": "no"}
    finish_project(tmp_path, "digits", options)
    finish_project(tmp_path, "digits", options)
    assert (tmp_path / "src" / "digits" / "cli.py").read_text() == "from digits import x\n"
    assert not (tmp_path / "src" / "template_package").exists()
    assert not (tmp_path / "scripts" / "slurm.sbatch").exists()
