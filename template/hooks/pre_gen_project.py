"""Checks the answers before anything is written; a bad answer stops generation with one line naming it."""

import keyword
import re
import sys

# Importing the project's package must not shadow what it depends on (or the standard library).
DEPENDENCIES = {
    "torch", "torchvision", "torchmetrics", "torchdata", "lightning", "pytorch_lightning", "lightning_fabric",
    "tensorboard", "sklearn", "numpy", "jsonargparse", "yaml", "rich", "onnx", "pytest", "cookiecutter", "cruft",
}  # fmt: skip
CHOICES = {
    "task": ("image_classifier", "char_lm"),
    "include_slurm": ("yes", "no"),
    "include_github_actions": ("yes", "no"),
}


def validate(answers: dict[str, str]) -> str | None:
    """The first problem with the answers as one line, or None when they are fine."""
    if not answers["project_name"].strip():
        return "project_name is empty: give the project a name, e.g. project_name='Digits Classifier'"
    slug = answers["project_slug"]
    if not re.fullmatch(r"[a-z0-9]+([-_.][a-z0-9]+)*", slug):
        return f"project_slug {slug!r} is not a valid folder/distribution name: use lowercase letters, digits and -"
    package = answers["package_name"]
    if not package.isidentifier() or not package.isascii():
        return f"package_name {package!r} is not a Python identifier: use letters, digits and _, e.g. 'my_project'"
    suggestion = f"pick another name, e.g. '{package}_project'"
    if keyword.iskeyword(package) or keyword.issoftkeyword(package):
        return f"package_name {package!r} is a Python keyword: {suggestion}"
    if package in DEPENDENCIES or package in sys.stdlib_module_names:
        return f"package_name {package!r} would shadow the module {package!r}: {suggestion}"
    for key, valid in CHOICES.items():
        if answers[key] not in valid:
            return f"{key}={answers[key]!r} is not a valid choice: use one of {', '.join(valid)}"
    return None


if __name__ == "__main__":
    error = validate(
        {
            "project_name": """{{ cookiecutter.project_name }}""",
            "project_slug": """{{ cookiecutter.project_slug }}""",
            "package_name": """{{ cookiecutter.package_name }}""",
            "task": """{{ cookiecutter.task }}""",
            "include_slurm": """{{ cookiecutter.include_slurm }}""",
            "include_github_actions": """{{ cookiecutter.include_github_actions }}""",
        }
    )
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
