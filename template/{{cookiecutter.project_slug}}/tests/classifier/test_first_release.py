"""A project updated from the template's first release keeps working: the config.yaml a run of that release saved
(tests/classifier/fixtures/first_release_config.yaml, written by commit e0b5353 with its own engine) names engine
classes that have moved since, and with it the checkpoint of that release validates, one warning naming each."""

from pathlib import Path

from helpers.classifier_task import CLASSIFIER
from helpers.cli import cli
from helpers.golden import CHECKPOINT

CONFIG = Path(__file__).resolve().parent / "fixtures" / "first_release_config.yaml"
MOVED = ["callbacks.TimedProgressBar", "callbacks.ConfusionMatrixImage", "callbacks.Throughput"]


def test_the_first_releases_saved_config_validates_its_checkpoint_with_a_warning_for_each_moved_class(
    tmp_path: Path, capsys
):
    cli("validate", "-c", str(CONFIG), f"--ckpt_path={CHECKPOINT}", f"--trainer.default_root_dir={tmp_path / 'run'}",
        task=CLASSIFIER)  # fmt: skip
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert [line.split(" names ")[1].split(",")[0] for line in warnings] == [
        f"template_package.engine.{old}" for old in sorted(MOVED)
    ]
    assert all("read as the new one; update it (CHANGELOG.md)" in line for line in warnings)
    assert "val/acc" in out
