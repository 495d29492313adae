"""The ways users create a project: cookiecutter interactive or --no-input with key=value answers, and cruft."""

import os
import subprocess
import sys
from pathlib import Path

from bakery import REPO, cookiecutter_cli, run


def test_no_input_bakes_the_default_project(tmp_path):
    result = cookiecutter_cli(str(REPO), "--no-input", "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "digits-classifier" / "src" / "digits_classifier" / "engine" / "cli" / "main.py").is_file()
    assert (tmp_path / "digits-classifier" / "src" / "digits_classifier" / "classifier" / "model.py").is_file()


def test_key_value_answers_are_honoured(tmp_path):
    result = cookiecutter_cli(str(REPO), "--no-input", "-o", str(tmp_path), "project_name=Cat Detector", "license=MIT")
    assert result.returncode == 0, result.stderr
    project = tmp_path / "cat-detector"
    assert (project / "src" / "cat_detector" / "classifier" / "model.py").is_file()
    assert "# Cat Detector" in (project / "README.md").read_text()
    assert "MIT License" in (project / "LICENSE").read_text()


def test_interactive_prompts_take_typed_answers(tmp_path):
    # One line per prompt: template choice, then each variable; an empty line keeps the default.
    answers = "\n".join(["1", "Moon Lander", "2", "", "lander", "", "", "", "2", "2", "2"]) + "\n"
    result = cookiecutter_cli(str(REPO), "-o", str(tmp_path), input=answers)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    project = tmp_path / "moon-lander"
    assert (project / "src" / "lander" / "char_lm" / "model.py").is_file()  # the second task, chosen at its prompt
    assert not (project / "src" / "lander" / "classifier").exists()
    assert "class_path: lander.char_lm.model.CharTransformer" in (project / "configs" / "default.yaml").read_text()
    assert not (project / "scripts" / "slurm.sbatch").exists()
    assert not (project / ".github").exists()


def test_cruft_create_links_the_project_to_the_template(tmp_path, template_repo):
    cruft = str(Path(sys.executable).with_name("cruft"))
    result = run([cruft, "create", str(template_repo), "--directory", "template", "--no-input"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "digits-classifier"
    assert (project / ".cruft.json").is_file()
    assert (project / "src" / "digits_classifier" / "classifier" / "model.py").is_file()
    check = run([cruft, "check"], cwd=project)
    assert check.returncode == 0, check.stdout + check.stderr


CRUFT = str(Path(sys.executable).with_name("cruft"))
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def project_of_cruft(tmp_path: Path, template_repo: Path) -> Path:
    """A project made with `cruft create` from the template repository, committed in a git repository of its own."""
    created = run([CRUFT, "create", str(template_repo), "--directory", "template", "--no-input"], cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    project = tmp_path / "digits-classifier"
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "project"]):
        subprocess.run([*GIT, *cmd], cwd=project, check=True, capture_output=True)
    return project


def test_cruft_update_brings_a_template_change_into_the_project(tmp_path, template_repo):
    cruft, git = CRUFT, GIT
    project = project_of_cruft(tmp_path, template_repo)
    # The template moves on: a new line in a preset, committed upstream.
    preset = template_repo / "template" / "{{cookiecutter.project_slug}}" / "configs" / "fast.yaml"
    preset.write_text(preset.read_text() + "# a template change\n")
    subprocess.run([*git, "commit", "-q", "-am", "change"], cwd=template_repo, check=True, capture_output=True)
    assert run([cruft, "check"], cwd=project).returncode != 0  # behind the template
    updated = run([cruft, "update", "-y"], cwd=project)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert (project / "configs" / "fast.yaml").read_text().endswith("# a template change\n")
    assert (project / "src" / "digits_classifier" / "classifier" / "model.py").is_file()  # the hook survived the update
    assert run([cruft, "check"], cwd=project).returncode == 0


def pre_commit(project: Path, *args: str) -> subprocess.CompletedProcess:
    """`pre-commit run` in a project with this venv's bin first on PATH, as in an activated venv: the project's hooks
    run what its dev extra installs (language: system), so nothing is fetched."""
    bin_dir = Path(sys.executable).parent
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    home = str(project.parent / "pre-commit-home")  # pre-commit's own store, out of the user's home
    return run([str(bin_dir / "pre-commit"), "run", *args], cwd=project, PATH=path, PRE_COMMIT_HOME=home)


def test_a_cruft_update_that_conflicts_with_a_local_change_leaves_markers_that_pre_commit_names(
    tmp_path, template_repo
):
    """What the READMEs say of a conflict (cruft 2.16): `git apply -3` leaves conflict markers and cruft exits 0; the
    project's pre-commit hooks (and CI, which runs them) then fail naming each marker's file and line."""
    cruft, git = CRUFT, GIT
    project = project_of_cruft(tmp_path, template_repo)
    clean = pre_commit(project, "check-merge-conflict", "--all-files")
    assert clean.returncode == 0, clean.stdout + clean.stderr  # no line of a new project looks like a marker
    mine = project / "configs" / "fast.yaml"
    mine.write_text(mine.read_text().replace("\n", "\n# my change\n", 1))
    subprocess.run([*git, "commit", "-q", "-am", "mine"], cwd=project, check=True, capture_output=True)
    theirs = template_repo / "template" / "{{cookiecutter.project_slug}}" / "configs" / "fast.yaml"
    theirs.write_text(theirs.read_text().replace("\n", "\n# the template's change\n", 1))
    subprocess.run([*git, "commit", "-q", "-am", "change"], cwd=template_repo, check=True, capture_output=True)
    updated = run([cruft, "update", "-y"], cwd=project)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "Applied patch to 'configs/fast.yaml' with conflicts." in updated.stdout + updated.stderr
    text = mine.read_text()
    assert "<<<<<<<" in text and "# my change" in text and "# the template's change" in text
    checked = pre_commit(project, "--all-files")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    for line, marker in ((2, "<<<<<<<"), (4, "======="), (6, ">>>>>>>")):
        assert f"configs/fast.yaml:{line}: Merge conflict string '{marker}' found" in checked.stdout, checked.stdout
