"""The example's classes, named on the command line of the example's tests: they test the example whatever
configs/default.yaml names."""

import pytest

from helpers.cli import cli

CLASSIFIER = ["--model=template_package.classifier.model.ImageClassifier",
              "--data=template_package.classifier.data.ImageDataModule"]  # fmt: skip


def error_line(*args: str) -> str:
    """Run the CLI on the example in this process and return its error message, checked to be one line."""
    with pytest.raises(SystemExit) as exit_info:
        cli(*args, task=CLASSIFIER)
    message = str(exit_info.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message
