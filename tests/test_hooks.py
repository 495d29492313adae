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
    "task": "image_classifier",
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
        ({"task": "gan"}, "task='gan' is not a valid choice: use one of image_classifier, char_lm"),
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


def make_tree(root, files: dict[str, str]) -> None:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)


@pytest.mark.parametrize("task", ["image_classifier", "char_lm"])
def test_post_gen_hook_keeps_the_chosen_task_and_is_idempotent(tmp_path, task):
    """The other task's folders, config variants and files go; the chosen task's variants replace the defaults. cruft
    runs the hook again on update: a second run must change nothing."""
    finish_project = load_hook("post_gen_project").finish_project
    make_tree(tmp_path, {
        "src/template_package/engine/cli.py": "from template_package import x\n",
        "src/template_package/classifier/model.py": "", "src/template_package/char_lm/model.py": "",
        "tests/classifier/test_a.py": "", "tests/char_lm/test_b.py": "", "benchmarks/overhead.py": "",
        "configs/default.yaml": "the classifier's\n", "configs/default.char_lm.yaml": "the language model's\n",
        "configs/compile.yaml": "", "configs/ddp.yaml": "", "scripts/slurm.sbatch": "python -m template_package fit\n",
    })  # fmt: skip
    options = {"task": task, "include_slurm": "no", "include_github_actions": "no"}
    finish_project(tmp_path, "digits", options)
    first = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    finish_project(tmp_path, "digits", options)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == first
    assert (tmp_path / "src" / "digits" / "engine" / "cli.py").read_text() == "from digits import x\n"
    assert not (tmp_path / "src" / "template_package").exists() and not (tmp_path / "scripts" / "slurm.sbatch").exists()
    kept, dropped = ("classifier", "char_lm") if task == "image_classifier" else ("char_lm", "classifier")
    assert (tmp_path / "src" / "digits" / kept / "model.py").is_file() and (tmp_path / "tests" / kept).is_dir()
    assert not (tmp_path / "src" / "digits" / dropped).exists() and not (tmp_path / "tests" / dropped).exists()
    assert (tmp_path / "configs" / "default.yaml").read_text() == (
        "the classifier's\n" if task == "image_classifier" else "the language model's\n"
    )
    assert not (tmp_path / "configs" / "default.char_lm.yaml").exists() and (tmp_path / "configs" / "ddp.yaml").exists()
    classifier_only = [tmp_path / "benchmarks", tmp_path / "configs" / "compile.yaml"]
    assert all(path.exists() == (kept == "classifier") for path in classifier_only)
