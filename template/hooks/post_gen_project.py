"""Keeps the chosen example task, gives the reference package the project's name, and drops the files of options that
were answered "no".

The template's Python and YAML name the placeholder package `template_package` and hold both example tasks, so that
they run and are tested without baking. Here the other task's files go: its folder in the package and in the tests,
its variants of the configs (`configs/NAME.<task>.yaml` replaces `configs/NAME.yaml` for its own task), and the files
only it uses. Then the folder is renamed and every mention replaced. Safe to run twice (cruft does).
"""

import shutil
from pathlib import Path

PLACEHOLDER = "template_package"
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".md", ".cfg", ".txt", ".sh", ".sbatch"}
OPTIONAL_PATHS = {
    "include_slurm": ["scripts/slurm.sbatch", "tests/test_slurm.py"],
    "include_github_actions": [".github"],
}
# Each task's folder (in the package and in tests/) and the files that only it uses.
TASKS = {
    "image_classifier": {
        "folder": "classifier",
        "only": [
            "benchmarks",
            "configs/compile.yaml",
            "docs/performance.md",
            "tests/helpers/classifier_task.py",
            "tests/helpers/golden.py",
        ],
    },
    "char_lm": {"folder": "char_lm", "only": ["tests/helpers/char_lm_task.py"]},
}
JUNK = ("__pycache__", ".pytest_cache", ".ruff_cache", "lightning_logs", "runs", "*.egg-info")


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def keep_task(root: Path, package_dir: Path, task: str) -> None:
    """Remove every other task's files; put the chosen task's config variants in place."""
    for name, spec in TASKS.items():
        if name == task:
            continue
        for path in [package_dir / spec["folder"], root / "tests" / spec["folder"], *map(root.joinpath, spec["only"])]:
            remove(path)
    for variant in sorted((root / "configs").glob("*.*.yaml")):
        stem, variant_task = variant.name.removesuffix(".yaml").rsplit(".", 1)
        if variant_task == task:
            variant.replace(variant.with_name(f"{stem}.yaml"))
        elif variant_task in TASKS:
            variant.unlink()


def finish_project(root: Path, package: str, options: dict[str, str]) -> None:
    for pattern in JUNK:
        for path in list(root.rglob(pattern)):
            shutil.rmtree(path, ignore_errors=True)
    for option, paths in OPTIONAL_PATHS.items():
        if options[option] != "yes":
            for relative in paths:
                remove(root / relative)
    for folder in (root / "scripts", root / ".github"):  # left empty by an option answered "no"
        if folder.is_dir() and not any(path.is_file() for path in folder.rglob("*")):
            shutil.rmtree(folder)
    placeholder_dir = root / "src" / PLACEHOLDER
    package_dir = placeholder_dir if placeholder_dir.is_dir() else root / "src" / package
    keep_task(root, package_dir, options["task"])
    if placeholder_dir.is_dir() and package != PLACEHOLDER:
        placeholder_dir.rename(root / "src" / package)
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            text = path.read_text()
            if PLACEHOLDER in text:
                path.write_text(text.replace(PLACEHOLDER, package))


if __name__ == "__main__":
    finish_project(
        Path.cwd(),
        "{{ cookiecutter.package_name }}",
        {
            "task": "{{ cookiecutter.task }}",
            "include_slurm": "{{ cookiecutter.include_slurm }}",
            "include_github_actions": "{{ cookiecutter.include_github_actions }}",
        },
    )
