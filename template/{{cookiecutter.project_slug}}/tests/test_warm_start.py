"""A command started warm (helpers/warm_start.py: the tests' runs, and the guarantee kit's in the tests) is the
command a new `python -m template_package` runs: the same imports from its working directory, the same ranks, the
same bits. Its other DDP ranks, and a sweep's trials, are forked from it instead of starting a new interpreter each."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from template_package.engine.cli.main import DEFAULT_CONFIG_VARIABLE

from helpers.cli import PROJECT_ROOT, QUICK, TESTS, WarmProcess, extra_config, started, subprocess_env
from helpers.sweeps import finish_sweep, start_sweep
from helpers.warm_start import WarmStart

pytestmark = pytest.mark.slow

# What each rank of a run was started as: a forked process keeps the command line of the warm server it comes from.
RANK_REPORT = """

import pathlib

from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_info


class ReportRank(Callback):
    def __init__(self):
        rank_zero_info("ReportRank built")  # before the Trainer exists: a rank-zero line of the process's own start

    def setup(self, trainer, pl_module, stage):
        warm = b"warm_start" in pathlib.Path("/proc/self/cmdline").read_bytes()
        (pathlib.Path(trainer.default_root_dir) / f"rank{trainer.global_rank}").write_text(f"warm={warm}")
"""


def test_classes_in_the_working_directory_reach_every_rank_started_fresh_or_warm(tmp_path: Path, monkeypatch):
    """A model and data module in the working directory alone (not on PYTHONPATH, not in the package): both DDP ranks
    import them, as `python -m` puts the working directory on sys.path, whether the run is a new interpreter whose
    rank 1 Lightning's launcher starts, or started warm, from a server in another folder, with rank 1 forked. Both
    train the same bits and say each rank-zero line once."""
    shutil.copy(TESTS / "helpers" / "stand_in.py", tmp_path / "my_task.py")
    with (tmp_path / "my_task.py").open("a") as task:
        task.write(RANK_REPORT)
    args = ["fit", "--model=my_task.StandInClassifier", "--data=my_task.StandInData", "--checkpoint.monitor=val/acc",
            "--checkpoint.mode=max", "--trainer.callbacks+=my_task.ReportRank", *QUICK, "--trainer.strategy=ddp",
            "--trainer.accelerator=cpu", "--trainer.devices=2"]  # fmt: skip
    # The package, not tests/, and no default config (the tests' names their stand-in, in tests/).
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src"), DEFAULT_CONFIG_VARIABLE: ""}
    fresh = subprocess.run(
        [sys.executable, "-m", "template_package", *args, f"--trainer.default_root_dir={tmp_path / 'fresh'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # where this test process's warm server starts, if it has none yet
    warm = started(WarmProcess([*args, f"--trainer.default_root_dir={tmp_path / 'warm'}"], cwd=tmp_path))
    warm_out, warm_err = warm.communicate(timeout=300)
    assert warm.returncode == 0, warm_err[-3000:]

    assert [(tmp_path / "fresh" / f"rank{rank}").read_text() for rank in (0, 1)] == ["warm=False", "warm=False"]
    assert [(tmp_path / "warm" / f"rank{rank}").read_text() for rank in (0, 1)] == ["warm=True", "warm=True"]
    weights = [torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True) for run in ("fresh", "warm")]
    assert weights[0]["hyper_parameters"]["_class_path"] == "my_task.StandInClassifier"
    assert weights[0]["rng_states"]["torch"].shape[0] == 2  # both ranks trained
    for name, tensor in weights[0]["state_dict"].items():
        assert torch.equal(tensor, weights[1]["state_dict"][name]), name
    for said in ("ReportRank built", "GPU available:", "Trainer.fit` stopped", "continue it with --ckpt_path last"):
        assert (fresh.stdout + fresh.stderr).count(said) == (warm_out + warm_err).count(said) == 1, said


def test_a_run_that_outlives_its_wait_shows_where_each_of_its_processes_waits(tmp_path: Path):
    """A test's wait that times out shows the stacks of the run and of its loader workers, so that a run that hangs
    once in a full suite says where."""
    slow = extra_config(
        tmp_path / "slow.yaml", callbacks=[{"class_path": "helpers.kill_points.SlowDown", "init_args": {"seconds": 60}}]
    )
    args = ["fit", f"--trainer.default_root_dir={tmp_path / 'run'}", "-c", slow, "--data.num_workers=1", *QUICK]
    run = started(WarmProcess(args))
    with pytest.raises(subprocess.TimeoutExpired) as waited:
        run.wait(timeout=25)
    assert "in on_train_batch_end" in waited.value.stderr  # the run's main thread, asleep in the callback
    assert waited.value.stderr.count("Current thread") >= 2  # and its loader worker


def test_a_run_that_ended_is_seen_ended_by_poll():
    """poll(), as a test's wait loop calls it, reads the server's answers: a run that failed at its start is seen
    ended, not alive until the loop's deadline."""
    run = started(WarmProcess(["fit", "--no_such_option=1"]))
    deadline = time.monotonic() + 120
    while run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.returncode == 1, run.output()[1][-2000:]
    assert "unknown option --no_such_option" in run.output()[1]


def test_a_run_has_the_environment_it_is_started_with_not_the_servers(tmp_path: Path):
    """A run started warm has the environment its request gives, as a subprocess has the `env` it is given, not the
    one the server was started with: a test process's server starts with the environment of the first test that asks
    for one, and a TMPDIR that test had set made the loader workers' socket paths of later tests' runs too long for
    AF_UNIX (107 characters: they hung)."""
    probe = "import os, pathlib\npathlib.Path('seen').write_text(os.environ.get('TMPDIR', 'unset'))\n"
    (tmp_path / "probe.py").write_text(probe + "from helpers.stand_in import StandInClassifier as Model\n")
    env = subprocess_env()
    server = WarmStart(env={**env, "TMPDIR": str(tmp_path)}, cwd=tmp_path)
    try:
        pid = server.start(["fit", "--model=probe.Model", "--print_config"], tmp_path, tmp_path / "out", env=env)
        assert server.returncode(pid, timeout=120) == 0, (tmp_path / "out").read_text()[-2000:]
    finally:
        server.close()
    assert (tmp_path / "seen").read_text() == env.get("TMPDIR", "unset")


TRIAL_REPORT = """
import os
import pathlib

from lightning.pytorch import Callback


class ReportProcess(Callback):
    def setup(self, trainer, pl_module, stage):
        warm = b"warm_start" in pathlib.Path("/proc/self/cmdline").read_bytes()
        said = f"warm={warm} parent={os.getppid()} leads_its_session={os.getsid(0) == os.getpid()}"
        pathlib.Path(trainer.default_root_dir, "process").write_text(said)
"""


def test_a_sweep_started_warm_forks_its_trials_as_the_sweep_would_start_them(tmp_path: Path):
    """A sweep's trial, which the sweep starts as a new `python -m` (sweep/search.py), is forked from the sweep when
    the sweep was started warm: still the sweep's child, leading a session of its own, with the sweep's output file."""
    pytest.importorskip("optuna", reason='sweeps need the sweep extra: pip install -e ".[sweep]"')
    (tmp_path / "trial_report.py").write_text(TRIAL_REPORT)
    sweep = start_sweep(tmp_path / "sweep", 1, "--trainer.callbacks+=trial_report.ReportProcess")
    finish_sweep(sweep)
    said = (tmp_path / "sweep" / "trial-0" / "process").read_text()
    assert said == f"warm=True parent={sweep.pid} leads_its_session=True"
    assert "last state (step 12)" in (tmp_path / "sweep" / "trial-0" / "fit.log").read_text()
