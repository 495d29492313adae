"""The last good state is never lost: failed writes, a full disk, two writers on one run directory, stop signals in
every phase of a run, Ctrl-C. After each: the exit code, the one line, `last.ckpt` byte-identical to the last good
one (or absent when no step ran), and a `--ckpt_path last` resume that ends bit-identical to the run that never
stopped."""

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from template_package.engine.resume.run_lock import RunLock

from helpers.cli import QUICK, STAND_IN, TESTS_CONFIG, cli, extra_config, resume, scalars, subprocess_env
from helpers.disks import fill
from helpers.runs import (
    BASE,
    assert_same_run,
    finish,
    freeze_config,
    reference_run,
    resume_fit,
    start_fit,
    wait_until_frozen,
)

# In-process runs: 2 epochs of 6 batches, last.ckpt every 5 optimizer steps, train/loss logged at every step.
ARGS = [*QUICK, "--trainer.log_every_n_steps=1", "--last_checkpoint.every_n_steps=5"]


def fit(run_dir: Path, *args: str):
    return cli("fit", f"--trainer.default_root_dir={run_dir}", *ARGS, *args)


def stopped_fit(run_dir: Path, *args: str) -> SystemExit:
    """A fit that must stop with SystemExit; returns it."""
    with pytest.raises(SystemExit) as stop:
        fit(run_dir, *args)
    return stop.value


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted in-process run of ARGS."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    fit(run_dir)
    return run_dir


def last_ckpt(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


def saved_step(run_dir: Path) -> int:
    return torch.load(last_ckpt(run_dir), weights_only=True)["global_step"]


def failing_io(tmp_path: Path, **init_args) -> str:
    plugin = {"class_path": "helpers.faults.FailingCheckpointIO", "init_args": init_args}
    return extra_config(tmp_path / "failing_io.yaml", plugins=[plugin])


def signal_at(tmp_path: Path, **init_args) -> str:
    callback = {"class_path": "helpers.faults.SignalAt", "init_args": init_args}
    return extra_config(tmp_path / f"signal_{init_args['hook']}.yaml", callbacks=[callback])


# --- Failed writes ---------------------------------------------------------------------------------------------------


def test_a_failed_last_ckpt_write_stops_the_run_and_leaves_the_previous_one(tmp_path, run_dir, reference):
    """last.ckpt every 2 steps; the second write (step 4) fails half-way with EIO: the run stops at the next
    optimizer step, with one line; last.ckpt still holds step 2, byte for byte; the run resumes from it to the
    uninterrupted run's end."""
    before = tmp_path / "before.ckpt"
    failing = failing_io(tmp_path, fail_at=2, copy_before=str(before))
    stop = stopped_fit(run_dir, "-c", failing, "--last_checkpoint.every_n_steps=2")
    last = last_ckpt(run_dir)
    assert str(stop.code) == (
        f"error: cannot write the checkpoint {last} (Input/output error): check the disk (an I/O error), or give "
        f"another --trainer.default_root_dir; {last} still holds step 2"
    )
    assert last.read_bytes() == before.read_bytes() and saved_step(run_dir) == 2
    assert not list(last.parent.glob("*.tmp"))
    # Stopped at the first optimizer step after the background write failed: step 5, or, when the write thread is slow
    # to fail (a loaded machine), step 6, whose due write waits for the failed one first; each is logged (as 4 or 5)
    # after the module's own batch-end hook, before the engine stops the run.
    assert max(step for step, _ in scalars(run_dir)["train/loss"]) in (4, 5)
    resume(run_dir, *ARGS)
    assert_same_run(reference, run_dir)


def test_a_failed_top_k_write_stops_the_run_with_the_file_named(tmp_path, run_dir, reference):
    stop = stopped_fit(run_dir, "-c", failing_io(tmp_path, fail_at=1, name="val_acc"))
    message = str(stop.code)
    assert message.startswith(f"error: cannot write the checkpoint {run_dir / 'checkpoints' / 'epoch=0-val_acc='}")
    assert message.endswith(f"(Input/output error): check the disk (an I/O error), or give another "
                            f"--trainer.default_root_dir; {last_ckpt(run_dir)} still holds step 5")  # fmt: skip
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "last.ckpt.crc32"]  # no top-k
    resume(run_dir, *ARGS)
    assert_same_run(reference, run_dir)


@pytest.mark.slow
def test_a_file_size_limit_stops_the_run_at_the_first_write(tmp_path, run_dir):
    """Under `ulimit -f` a write fails with EFBIG: named, with its path, when it happens."""
    limit = 64 * 1024  # below a checkpoint (~145 kB), above everything else the run writes

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # No best checkpoints (save_top_k=0): last.ckpt's write at step 5 is the run's first checkpoint write.
    command = ["fit", *STAND_IN, f"--trainer.default_root_dir={run_dir}", *ARGS, "--checkpoint.save_top_k=0"]
    result = subprocess.run(
        [sys.executable, "-m", "template_package", *command], env=subprocess_env(), capture_output=True, text=True,
        timeout=300, preexec_fn=limit_file_size,
    )  # fmt: skip
    assert result.returncode == 1
    last = last_ckpt(run_dir)
    advice = "raise the file size limit (ulimit -f), or give another --trainer.default_root_dir"
    expected = f"error: cannot write the checkpoint {last} (File too large): {advice}; no {last} was written"
    assert result.stderr.strip().splitlines()[-1] == expected, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not list(last.parent.glob("*"))


@pytest.mark.slow
def test_a_disk_that_fills_up_mid_run_keeps_the_last_good_state(tmp_path, tmp_path_factory, small_disk):
    """The outside harness: freeze the run at step 12 (last.ckpt holds step 10), fill its disk, let it go on. The
    write of step 15 fails with ENOSPC; the run stops with one line; last.ckpt is byte-identical; with space freed,
    --ckpt_path last ends like the run that never stopped."""
    run_dir = small_disk / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=12, flush_logs=True))
    wait_until_frozen(process, tmp_path / "frozen")
    good = last_ckpt(run_dir).read_bytes()
    filler = fill(small_disk)
    os.killpg(process.pid, signal.SIGCONT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1, err[-3000:]
    last = last_ckpt(run_dir)
    # Whichever write meets the full disk first, TensorBoard's events or the checkpoint, is named.
    failed = rf"(cannot write the checkpoint {last}|cannot write into {run_dir})"
    advice = f"free space on that disk, or give another --trainer.default_root_dir; {last} still holds step 10"
    assert re.fullmatch(rf"error: {failed} \(No space left on device\): {re.escape(advice)}", err.splitlines()[-1])
    assert "Traceback" not in err
    assert last.read_bytes() == good and not list(last.parent.glob("*.tmp"))
    filler.unlink()
    resume_fit(run_dir)
    assert_same_run(reference_run(tmp_path_factory, []), run_dir)


# --- One writer per run directory ------------------------------------------------------------------------------------


def run_dir_bytes(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_second_fit_on_a_live_run_is_refused_and_the_lock_dies_with_its_holder(tmp_path, tmp_path_factory):
    """A frozen fit (alive, holding the lock) with 2 loader workers; a second fit, fresh or resuming, stops before
    touching anything and names the holder. Then the holder is SIGKILLed alone, as the out-of-memory killer would,
    leaving its workers behind for a moment: the next --ckpt_path last takes the run over and ends exactly."""
    args = ["--data.num_workers=2"]
    run_dir = tmp_path / "run"
    holder = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=12), *args)
    wait_until_frozen(holder, tmp_path / "frozen")
    before = run_dir_bytes(run_dir)
    for extra in ([], ["--ckpt_path=last"]):  # (in this process: a second process is not needed to be refused)
        with pytest.raises(SystemExit) as second:
            cli("fit", f"--trainer.default_root_dir={run_dir}", *BASE[len(STAND_IN) :], *extra, *args)
        assert second.value.code == (
            f"error: {run_dir} is being trained by another fit (host {socket.gethostname()} pid {holder.pid}): let "
            "it finish or stop it, or give another --trainer.default_root_dir"
        )
        assert run_dir_bytes(run_dir) == before  # no events file, no config, no checkpoint touched
    os.kill(holder.pid, signal.SIGKILL)  # the main process only: its loader workers outlive it for a few seconds
    holder.wait(timeout=30)
    lock = RunLock(run_dir)
    lock.acquire()  # at once: the workers do not hold it
    lock.release()
    resume_fit(run_dir, *args)
    assert_same_run(reference_run(tmp_path_factory, args), run_dir)


@pytest.mark.slow
def test_two_fits_started_at_once_on_a_fresh_directory_train_it_once(tmp_path, tmp_path_factory):
    run_dir = tmp_path / "run"
    processes = [start_fit(run_dir, "--ckpt_path=last") for _ in range(2)]
    results = [(p, *p.communicate(timeout=300)) for p in processes]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 1], [err[-2000:] for _, _, err in results]
    refused = next(err for p, _, err in results if p.returncode == 1)
    assert "is being trained by another fit" in refused.strip().splitlines()[-1]
    assert_same_run(reference_run(tmp_path_factory, []), run_dir)


# --- Stop signals in every phase -------------------------------------------------------------------------------------

# (where the signal arrives, signal, the exit code, the step last.ckpt holds afterwards: None for no last.ckpt)
PHASES = {
    "setup": ("setup", "SIGTERM", 0, 143, None),
    "sanity_check": ("sanity_check", "SIGTERM", 0, 143, None),
    "first_batch": ("on_train_batch_start", "SIGUSR1", 0, 138, 1),
    "ctrl_c_mid_epoch": ("on_train_batch_end", "SIGINT", 3, 130, 3),
    "validation": ("validation", "SIGUSR1", 6, 138, 6),
    "last_epoch_end": ("on_train_epoch_end", "SIGTERM", 12, 143, 12),
    "teardown": ("teardown", "SIGTERM", 0, 143, 12),
}


@pytest.mark.parametrize("phase", PHASES)
def test_a_stop_signal_in_any_phase_exits_non_zero_with_the_newest_state(tmp_path, run_dir, reference, phase):
    """Never exit 0 while training remained (Lightning exits 0 on a SIGTERM in the sanity check); last.ckpt holds the
    newest state there is, or nothing when no step ran; --ckpt_path last then ends exactly like the reference."""
    hook, signal_name, step, exit_code, saved = PHASES[phase]
    stop = stopped_fit(run_dir, "-c", signal_at(tmp_path, hook=hook, signal_name=signal_name, step=step))
    assert stop.code == exit_code
    if saved is None:
        assert not last_ckpt(run_dir).exists()
    else:
        assert saved_step(run_dir) == saved
    resume(run_dir, *ARGS)
    assert_same_run(reference, run_dir)


@pytest.mark.slow
def test_ctrl_c_from_a_terminal_saves_the_step_and_exits_130(tmp_path, tmp_path_factory):
    """SIGINT to the whole process group, as a terminal sends it, loader workers included: the workers keep serving
    until the main process has saved the current step."""
    args = ["--data.num_workers=2"]
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=8), *args)
    wait_until_frozen(process, tmp_path / "frozen")
    os.killpg(process.pid, signal.SIGINT)
    os.killpg(process.pid, signal.SIGCONT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == f"stopped by SIGINT: {last_ckpt(run_dir)} holds step 8"
    finish(start_fit(run_dir, "--ckpt_path=last", *args))
    assert_same_run(reference_run(tmp_path_factory, args), run_dir)


@pytest.mark.slow
def test_a_second_ctrl_c_while_saving_aborts_at_once_and_keeps_the_last_complete_save(tmp_path, tmp_path_factory):
    """The first Ctrl-C (at step 8) starts the save of step 8, which stalls half-written; a second Ctrl-C ends the
    process at once: last.ckpt still holds step 5, byte for byte."""
    run_dir = tmp_path / "run"
    ctrl_c = {"class_path": "helpers.faults.SignalAt",
              "init_args": {"hook": "on_train_batch_end", "signal_name": "SIGINT", "step": 8}}  # fmt: skip
    stall = {
        "class_path": "helpers.faults.StallingCheckpointIO",
        "init_args": {"marker": str(tmp_path / "frozen"), "step": 8},
    }
    process = start_fit(run_dir, "-c", extra_config(tmp_path / "c.yaml", callbacks=[ctrl_c], plugins=[stall]))
    wait_until_frozen(process, tmp_path / "frozen")
    good = last_ckpt(run_dir).read_bytes()
    assert torch.load(last_ckpt(run_dir), weights_only=True)["global_step"] == 5
    os.kill(process.pid, signal.SIGINT)
    started = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and time.monotonic() - started < 10
    assert (
        err.strip().splitlines()[-1] == "stopped by a second Ctrl-C without saving: last.ckpt holds the last "
        "complete save"
    )
    assert last_ckpt(run_dir).read_bytes() == good
    finish(start_fit(run_dir, "--ckpt_path=last"))
    assert_same_run(reference_run(tmp_path_factory, []), run_dir)


# --- What a run says -------------------------------------------------------------------------------------------------


def test_only_the_third_party_notices_a_user_can_do_nothing_about_are_hidden():
    import logging
    import warnings

    from template_package.engine.cli.main import quiet_third_party_notices

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party_notices()
        warnings.warn("'set_vital' is deprecated, please do not call", UserWarning, stacklevel=1)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    tip = logger.makeRecord(logger.name, logging.INFO, "", 0, "💡 Tip: try installing [litlogger](...)", (), None)
    other = logger.makeRecord(logger.name, logging.INFO, "", 0, "`Trainer.fit` stopped", (), None)
    assert not logger.filter(tip) and logger.filter(other)


def test_a_finished_run_says_what_it_got_and_where_it_is(run_dir, capsys):
    """With the progress bar off too: the final and best val/acc, last.ckpt and the best checkpoint, and the command
    to look at the run."""
    fit(run_dir)
    out = capsys.readouterr().out
    best = max((run_dir / "checkpoints").glob("epoch=*.ckpt"), key=lambda p: float(p.stem.split("val_acc=")[1]))
    assert f"best {best.stem.split('val_acc=')[1]}: {best}" in out and "val/acc 0." in out
    assert f"last state (step 12): {last_ckpt(run_dir)}; continue it with --ckpt_path last" in out
    assert f"tensorboard --logdir {run_dir}" in out


def test_help_tells_the_truth(capsys):
    """`--help` says how the command is started, what the project is, every subcommand (the tools too), and for fit
    the options of the model and data classes the config names, each with its help text."""
    from helpers.cli import cli_subprocess

    top = cli_subprocess("--help").stdout
    from template_package.engine.cli.help import project_description

    assert top.startswith("usage: python -m template_package ")
    assert project_description("template_package") in top  # pyproject.toml's, when installed; else a generic one
    for subcommand, description in [("fit", "Train the model in the run directory"),
                                    ("validate", "Compute the validation metrics"),
                                    ("test", "Compute the test metrics"), ("predict", "Write predictions.csv"),
                                    ("sweep", "Search hyperparameters"), ("export", "Export a checkpoint"),
                                    ("grad_norms", "Print the gradient norms")]:  # fmt: skip
        assert f"{subcommand}  " in top and description in top, subcommand
    with pytest.raises(SystemExit):  # in this process (its usage line names pytest: checked above, in a child)
        cli("fit", "--help", task=[])
    fit_help = capsys.readouterr().out
    assert "os.getcwd()" not in fit_help and "default: runs/default" in fit_help
    assert "last: resume the run from its checkpoints/last.ckpt" in fit_help
    assert "lacks type and help" not in fit_help
    import yaml

    from template_package.engine.cli.checks import class_options

    configured = yaml.safe_load(TESTS_CONFIG.read_text())  # (the tests' default config)
    options = [line.split()[0] for line in fit_help.splitlines() if line.strip().startswith("--")]
    project_options = [o for o in options if o.split(".")[0] in ("--model", "--data", "--last_checkpoint")]
    for group in ("model", "data"):  # the configured class's own options, whatever the class
        class_path = configured[group]["class_path"]
        assert f"{group}: {class_path} (the config's" in fit_help
        own = [action.option_strings[0] for action in class_options(group, class_path)._actions]
        assert {o for o in own if o.startswith(f"--{group}.") and not o.endswith(".help")} <= set(project_options)
    for option in project_options:  # the line after the option (or its own rest) carries its help text
        block = fit_help.split(f"\n  {option} ", 1)[1].split("\n  --", 1)[0]
        assert len(block.split("(type:")[0].split()) > 2, f"{option} has no help text"


def test_sweep_help_shows_the_sweeps_own_options():
    from helpers.cli import cli_subprocess

    pytest.importorskip("optuna", reason='sweeps need the sweep extra: pip install -e ".[sweep]"')

    result = cli_subprocess("sweep", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m template_package sweep")
    for option in ("--sweep.dir", "--sweep.n_trials", "--sweep.storage", "--sweep.metric", "--sweep.space"):
        assert option in result.stdout
    assert "checkpoint.monitor" in result.stdout and "Trainer" not in result.stdout  # not a trial's help
