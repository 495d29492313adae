"""`sweep`: Optuna on a real SQLite study, trials as run directories, pruning, preemption at any moment, parallel
processes on one study, the results, and one line for each mistake."""

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from helpers.cli import cli, cli_subprocess, extra_config
from helpers.sweeps import SWEEP_YAML, TRIAL, finish_sweep, start_sweep, sweep_command

optuna = pytest.importorskip("optuna", reason='sweeps need the sweep extra: pip install -e ".[sweep]"')


def study_of(folder: Path) -> list[tuple]:
    """What makes a study: each trial's number, parameters, value, state and intermediate values."""
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{folder / 'study.db'}")
    return [(t.number, t.params, t.value, t.state.name, t.intermediate_values) for t in study.trials]


@pytest.fixture(scope="module")
def uninterrupted_sweep(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("sweep") / "uninterrupted"
    return folder, finish_sweep(start_sweep(folder, 2))


@pytest.mark.slow
def test_a_sweep_runs_its_trials_as_run_directories_and_says_what_it_found(uninterrupted_sweep, tmp_path, capsys):
    folder, out = uninterrupted_sweep
    trials = study_of(folder)
    assert [number for number, *_ in trials] == [0, 1]
    assert all(state in ("COMPLETE", "PRUNED") for *_, state, _ in trials)
    for number, params, value, state, values in trials:
        run_dir = folder / f"trial-{number}"
        assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "config.yaml").is_file()
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (
            config["model"]["init_args"]["lr"] == params["model.lr"]
            and config["data"]["init_args"]["batch_size"] == params["data.batch_size"]
        )
        if state == "COMPLETE":
            assert value == max(values.values())  # the best val/acc over its validations
        line = next(line for line in out.splitlines() if line.startswith(f"{number} "))
        assert state.lower() in line and str(run_dir) in line
    best = max((t for t in trials if t[3] == "COMPLETE"), key=lambda t: t[2])
    assert f"best: trial {best[0]}, val/acc {best[2]:.4f}" in out
    assert (folder / "history.png").stat().st_size > 1000 and (folder / "importances.png").stat().st_size > 1000
    # best.yaml is a preset that fit trains: the best trial's settings in a new run directory.
    fit = cli("fit", "-c", str(folder / "best.yaml"), f"--trainer.default_root_dir={tmp_path / 'best'}")
    assert fit.model.hparams.lr == best[1]["model.lr"] and fit.trainer.global_step == 12
    # The same command again shows the results only. (Options are read in order, later ones win: after the config
    # file, whose sweep.dir and n_trials would otherwise run its 20 trials in runs/sweep.)
    capsys.readouterr()
    cli("sweep", "-c", SWEEP_YAML, f"--sweep.dir={folder}", "--sweep.n_trials=0", *TRIAL)
    assert f"best: trial {best[0]}" in capsys.readouterr().out
    assert study_of(folder) == trials


@pytest.mark.slow
def test_a_sweep_killed_at_any_moment_and_run_again_ends_with_the_same_study(uninterrupted_sweep, tmp_path):
    """The outside harness: SIGKILL the sweep (its trial's fit with it) once trial 1 has a checkpoint, then run the
    same command: trial 1 resumes from its last.ckpt (not from scratch, not twice), and the finished study equals the
    uninterrupted one: trial numbers, parameters, values, states, intermediate values. The same command giving the
    same trials is part of it."""
    reference, _ = uninterrupted_sweep
    folder = tmp_path / "sweep"
    slow = {
        "class_path": "helpers.kill_points.SlowDown",
        "init_args": {"seconds": 0.5},
    }  # (a trial that outlives the kill)
    process = start_sweep(folder, 2, "-c", extra_config(tmp_path / "slow.yaml", callbacks=[slow]))
    deadline = time.monotonic() + 300
    while not (folder / "trial-1" / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.02)
    assert set(processes_using(folder)) - {process.pid}, "the trial's fit is not seen"  # (so the check below can fail)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 2
    while processes_using(folder) and time.monotonic() < deadline:  # the trial's fit, in a session of its own
        time.sleep(0.1)
    assert not processes_using(folder), "the trial's fit outlived its sweep"
    assert [state for *_, state, _ in study_of(folder)] == ["COMPLETE", "RUNNING"]
    assert "trial 1 lost its process: taken over, from its last.ckpt" in finish_sweep(start_sweep(folder, 2))
    assert study_of(folder) == study_of(reference)
    log = (folder / "trial-1" / "fit.log").read_text()
    assert log.count("starting a fresh run") == 1 and "Restoring states from the checkpoint path" in log


def processes_using(folder: Path) -> list[int]:
    """The live processes whose command line names `folder` or that hold a file under it open (a trial's fit holds its
    fit.log as its output, whether the sweep started it as a new interpreter or the tests' warm start forked it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                status = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                named = str(folder).encode() in (entry / "cmdline").read_bytes()
                if status != "Z" and (named or any(is_under(fd, folder) for fd in (entry / "fd").iterdir())):
                    found.append(int(entry.name))
    return found


def is_under(descriptor: Path, folder: Path) -> bool:
    with contextlib.suppress(OSError):
        return os.readlink(descriptor).startswith(f"{folder}/")
    return False


@pytest.mark.slow
def test_two_sweeps_on_one_study_split_the_trials(tmp_path):
    folder = tmp_path / "sweep"
    processes = [start_sweep(folder, 3) for _ in range(2)]
    for process in processes:
        finish_sweep(process)
    trials = study_of(folder)
    assert [number for number, *_ in trials] == [0, 1, 2]
    assert all(state in ("COMPLETE", "PRUNED") for *_, state, _ in trials)
    for number in range(3):  # each trial trained once, by one process
        log = (folder / f"trial-{number}" / "fit.log").read_text()
        assert log.count("starting a fresh run") == 1 and "Restoring" not in log


@pytest.mark.slow
def test_sigterm_saves_the_running_trial_and_exits_143(tmp_path):
    folder = tmp_path / "sweep"
    process = start_sweep(folder, 2)
    while not (folder / "trial-0" / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)  # to the sweep alone: it passes it to the trial's fit
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in (folder / "trial-0" / "fit.log").read_text()
    assert [state for *_, state, _ in study_of(folder)] == ["RUNNING"]


def study_with_two_good_trials(tmp_path: Path) -> tuple[str, str, int]:
    """A study whose two finished trials reached val/acc 0.9 and 0.95 at epoch 1, and a third trial asked; returns
    the storage, a config that reports a fit to that trial, and its number."""
    from template_package.engine.sweep.search import pruner

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="sweep", direction="maximize", pruner=pruner(True))
    for values in ([0.5, 0.9, 0.92], [0.6, 0.95, 0.97]):
        trial = study.ask()
        for step, value in enumerate(values):
            trial.report(value, step)
        study.tell(trial, max(values))
    number = study.ask().number
    report = {"class_path": "template_package.engine.sweep.search.ReportToTrial",
              "init_args": {"storage": storage, "trial_number": number}}  # fmt: skip
    config = tmp_path / "report.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"callbacks+": [report]}}))
    return storage, str(config), number


def assert_pruned_after_epoch_1(storage: str, number: int, run_dir: Path) -> None:
    trial = optuna.load_study(study_name="sweep", storage=storage).trials[number]
    assert trial.user_attrs["pruned"] is True and trial.user_attrs["value"] == max(trial.intermediate_values.values())
    assert list(trial.intermediate_values) == [0, 1]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 12  # of 24


def test_a_trial_below_the_median_is_pruned_and_stops_cleanly(tmp_path):
    """A third trial at lr 1e-6 stays near chance: pruned at its second validation; its training ends there with a
    final last.ckpt, and it records its best value."""
    storage, config, number = study_with_two_good_trials(tmp_path)
    run = cli("fit", "-c", config, f"--trainer.default_root_dir={tmp_path / 'run'}", *TRIAL,
              "--trainer.max_epochs=4", "--model.lr=1e-6")  # fmt: skip
    assert run.trainer.current_epoch == 2  # stopped after epoch 1 of 4
    assert_pruned_after_epoch_1(storage, number, tmp_path / "run")


@pytest.mark.slow
def test_under_ddp_rank_0_decides_and_every_rank_stops_together(tmp_path):
    storage, config, number = study_with_two_good_trials(tmp_path)
    result = cli_subprocess("fit", "-c", config, f"--trainer.default_root_dir={tmp_path / 'run'}", *TRIAL,
                            "--trainer.max_epochs=4", "--model.lr=1e-6", "--trainer.strategy=ddp",
                            "--trainer.accelerator=cpu", "--trainer.devices=2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert_pruned_after_epoch_1(storage, number, tmp_path / "run")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--sweep.space={modell.lr: {type: float, low: 0.001, high: 0.01}}"],
            "in a trial's fit options: unknown option --modell.lr: did you mean --model.lr?",
        ),
        (
            ["--sweep.space={data.batch_size: {type: categorical, choices: []}}"],
            "sweep.space.data.batch_size has no choices: give a non-empty list",
        ),
        (
            ["--sweep.space={model.lr: {type: float, low: 0.1, high: 0.01}}"],
            "sweep.space.model.lr: low=0.1 is above high=0.01",
        ),
        (["--sweep.n_trials=-1"], "sweep.n_trials=-1 must be a whole number >= 0 (0 shows the results)"),
        (
            ["--sweep.storage=sqlite:////no/such/folder/study.db"],
            "cannot open the study storage sqlite:////no/such/folder/study.db (",
        ),
        (["--sweep.nn_trials=3"], "unknown option sweep.nn_trials: use one of dir, n_trials, "),
        (
            ["--sweep.dir=s3://bucket/sweep"],
            "sweep.dir=s3://bucket/sweep: its SQLite study cannot live in object storage",
        ),
    ],
    ids=[
        "unknown_option",
        "empty_choices",
        "low_above_high",
        "negative_n_trials",
        "bad_storage",
        "unknown_setting",
        "in_object_storage",
    ],  # fmt: skip
)
def test_a_mistake_in_a_sweep_costs_one_line_and_no_trial(tmp_path, args, message):
    folder = tmp_path / "sweep"
    with pytest.raises(SystemExit) as stop:
        cli(*sweep_command(folder, 2, *args))
    assert str(stop.value.code).startswith(f"error: {message}"), stop.value.code
    assert not list(folder.glob("trial-*"))
    if (folder / "study.db").exists():
        assert study_of(folder) == []


def test_a_study_made_with_another_search_space_is_refused(tmp_path):
    folder = tmp_path / "sweep"
    cli(*sweep_command(folder, 0))  # creates the study, runs no trial
    with pytest.raises(SystemExit) as stop:
        cli(*sweep_command(folder, 2, "--sweep.space={model.lr: {type: float, low: 0.001, high: 0.01}}"))
    assert str(stop.value.code).startswith(f"error: the study in sqlite:///{folder / 'study.db'} was made with "
                                           "another space, {'model.lr': ")  # fmt: skip
    assert study_of(folder) == []
