"""K-fold cross-validation: `fold_indices`, the split a DataModule calls, and `sweep --sweep.folds K`, whose trial is
worth the mean of its K folds, each fold a run directory of its own."""

import statistics

import pytest
import torch
import yaml

from template_package.engine.data.folds import fold_indices

from helpers.cli import cli, scalars
from helpers.sweeps import finish_sweep, start_sweep, sweep_command

optuna = pytest.importorskip("optuna", reason='sweeps need the sweep extra: pip install -e ".[sweep]"')

FOLDED = "--data=helpers.folded_stand_in.FoldedStandInData"


def test_the_folds_validate_every_sample_once_and_are_the_same_in_every_run():
    folds = [fold_indices(10, 3, fold, seed=0) for fold in range(3)]
    validated = torch.cat([val for _, val in folds])
    assert sorted(validated.tolist()) == list(range(10)) and [len(val) for _, val in folds] == [4, 3, 3]
    for train, val in folds:
        assert sorted(torch.cat([train, val]).tolist()) == list(range(10))
    assert all(torch.equal(a, b) for a, b in zip(fold_indices(10, 3, 1, 0), folds[1], strict=True))
    assert not torch.equal(fold_indices(10, 3, 1, seed=1)[1], folds[1][1])


@pytest.mark.slow
def test_a_cross_validated_trial_is_worth_the_mean_of_its_folds(tmp_path):
    """One trial of 3 folds: 3 run directories under the trial's folder, and a value and spread equal to the mean and
    standard deviation of the folds' own best val/acc, read back from each fold's TensorBoard events."""
    folder = tmp_path / "sweep"
    out = finish_sweep(start_sweep(folder, 1, "--sweep.folds=3", FOLDED))
    values = []
    for fold in range(3):
        run_dir = folder / "trial-0" / f"fold-{fold}"
        assert (run_dir / "checkpoints" / "last.ckpt").is_file()
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["data"]["init_args"]["folds"] == 3 and config["data"]["init_args"]["fold"] == fold
        values.append(max(value for _, value in scalars(run_dir)["val/acc"]))
    mean, spread = statistics.fmean(values), statistics.pstdev(values)
    assert len(set(values)) > 1  # folds of their own, not one run three times
    [trial] = optuna.load_study(study_name="sweep", storage=f"sqlite:///{folder / 'study.db'}").trials
    assert trial.value == pytest.approx(mean, abs=1e-6)
    assert trial.user_attrs["spread"] == pytest.approx(spread, abs=1e-6)
    assert f"{mean:.4f} ± {spread:.4f} over 3 folds" in out
    best = (folder / "best.yaml").read_text()
    assert f"± {spread:.4f} over 3 folds" in best.splitlines()[0]
    assert "folds" not in yaml.safe_load(best)["data"]["init_args"]  # the preset trains on the data's own split


def test_a_datamodule_without_folds_costs_one_line_naming_it(tmp_path):
    folder = tmp_path / "sweep"
    with pytest.raises(SystemExit) as stop:
        cli(*sweep_command(folder, 1, "--sweep.folds=3"))
    assert str(stop.value.code).startswith(
        "error: sweep.folds=3: helpers.stand_in.StandInData takes no folds: give its __init__ the arguments "
        "folds: int = 1 and fold: int = 0"
    ), stop.value.code
    assert not list(folder.glob("trial-*"))
