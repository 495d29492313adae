"""Gives the reference package the project's name and drops the files of options that were answered "no".

The template's Python and YAML name the placeholder package `template_package` so that they run and are tested
without baking; here the folder is renamed and every mention replaced. Safe to run twice (cruft does).
"""

import shutil
from pathlib import Path

PLACEHOLDER = "template_package"
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".md", ".cfg", ".txt", ".sh", ".sbatch"}
OPTIONAL_PATHS = {
    "include_slurm": ["scripts/slurm.sbatch", "tests/test_slurm.py"],
    "include_github_actions": [".github"],
}
JUNK = ("__pycache__", ".pytest_cache", ".ruff_cache", "lightning_logs", "runs", "*.egg-info")


def finish_project(root: Path, package: str, options: dict[str, str]) -> None:
    for pattern in JUNK:
        for path in list(root.rglob(pattern)):
            shutil.rmtree(path, ignore_errors=True)
    for option, paths in OPTIONAL_PATHS.items():
        if options[option] != "yes":
            for relative in paths:
                path = root / relative
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    placeholder_dir = root / "src" / PLACEHOLDER
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
            "include_slurm": "{{ cookiecutter.include_slurm }}",
            "include_github_actions": "{{ cookiecutter.include_github_actions }}",
        },
    )
