"""scripts/slurm.sbatch on a real one-node SLURM cluster that this module starts (slurmctld and slurmd with a config
in a temporary folder) and stops: submitted as a user would on CPU-only nodes, preempted with `scancel --signal TERM`,
requeued by the script, resumed with --ckpt_path last, and ending equal to a job that was never preempted. (SIGUSR1,
which the script asks for before the time limit, takes the same way through the script: exit 138, requeue; the
engine's handling of both signals is tested in test_resume.py.)"""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import PROJECT_ROOT, extra_config, subprocess_env
from helpers.runs import BASE, DDP, assert_same_run, freeze_config, reference_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(program) for program in ("slurmctld", "slurmd", "sbatch")),
        reason="needs Debian's slurmctld, slurmd and slurm-client (apt-get install slurmctld slurmd slurm-client; "
        ".ci/run installs them)",
    ),
]
SLURM_CONF = """\
ClusterName=test
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=bf_interval=1,sched_interval=1
FirstJobId={first_job_id}
NodeName=localhost CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
# auth/none and cred/none: no munged to start (tried: with auth/munge it behaves the same); proctrack/linuxproc:
# this kind of machine has no usable cgroups; cred_expire=5: a requeued job waits 5 s, not 120, before it runs again.
# FirstJobId: Lightning's SLURM plugin takes the ranks' MASTER_PORT from the job id (15000 + its last 4 digits), so
# two suites' clusters on one machine, each numbering from 1, would give their jobs the same port.


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict[str, str]:
    """A one-node cluster with 2 CPUs; yields the environment that sbatch, squeue and scontrol need."""
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    ports = [_free_port() for _ in range(2)]
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, ctld_port=ports[0], d_port=ports[1], cpus=min(os.cpu_count(), 2),
                                      first_job_id=_first_job_id()))  # fmt: skip
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = time.monotonic()
    daemons = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for command in (
            ["slurmctld", "-D", "-i", "-f", str(conf)],
            ["slurmd", "-D", "-N", "localhost", "-f", str(conf)],
        )
    ]
    try:
        while _run(["sinfo", "-h", "-o", "%T"], env).stdout.strip() != "idle":
            assert time.monotonic() - started < 60, (root / "slurmctld.log").read_text()[-3000:]
            assert all(daemon.poll() is None for daemon in daemons), (root / "slurmd.log").read_text()[-3000:]
            time.sleep(0.2)
        print(f"SLURM cluster up in {time.monotonic() - started:.1f} s")
        yield env
    finally:
        _run(["scancel", "--full", "--signal=KILL", "--user", "root"], env)  # jobs of a test that failed
        deadline = time.monotonic() + 30
        while _run(["squeue", "-h"], env).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        for daemon in daemons:
            daemon.send_signal(signal.SIGTERM)
        for daemon in daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _first_job_id(jobs: int = 4) -> int:
    """A first job id whose jobs' MASTER_PORTs (15000 + the id's last 4 digits) are free on this machine now."""
    for _ in range(1000):
        first = random.randrange(1, 10000 - jobs)
        if all(_port_is_free(15000 + first + job) for job in range(jobs)):
            return first
    raise AssertionError("no 4 free ports between 15001 and 24999 for the SLURM jobs' MASTER_PORT")


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)


def submit(slurm: dict[str, str], run_dir: Path, *fit_args: str) -> str:
    """`sbatch` the project's script as a user on CPU-only nodes would; returns the job id."""
    env = {**slurm, "RUN_DIR": str(run_dir), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": subprocess_env()["PYTHONPATH"]}  # fmt: skip
    result = _run(
        ["sbatch", "--parsable", "--ntasks-per-node", "2", "--cpus-per-task", "1", f"--output={run_dir}.log",
         "scripts/slurm.sbatch", "--trainer.accelerator", "cpu", *BASE, *fit_args],
        env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job(slurm: dict[str, str], job_id: str) -> dict[str, str]:
    """The job's fields, as `scontrol show job` gives them."""
    text = _run(["scontrol", "show", "job", "-o", job_id], slurm).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def wait_for_job(slurm: dict[str, str], job_id: str, states: set[str], timeout: float = 300) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while (fields := job(slurm, job_id)).get("JobState") not in states:
        assert time.monotonic() < deadline, f"job {job_id}: {fields}"
        time.sleep(0.2)
    return fields


@pytest.fixture(scope="module")
def uninterrupted_job(tmp_path_factory) -> Path:
    """The same run never preempted, on 2 processes that Lightning's launcher starts on this machine: the job's 2
    SLURM tasks train the same bits."""
    return reference_run(tmp_path_factory, DDP)


def test_a_preempted_job_is_requeued_and_ends_like_the_job_that_was_not(slurm, uninterrupted_job, tmp_path):
    """Rank 0 waits at step 12 until the signal has reached it, so it lands at a known step; `scancel --signal TERM`
    reaches both tasks, which save step 12 and exit with 143; the script requeues the job, which resumes and
    completes."""
    run_dir = tmp_path / "run"
    freeze = freeze_config(tmp_path, hook="on_train_batch_end", step=12, until_signal=True)
    job_id = submit(slurm, run_dir, "-c", freeze)
    marker = tmp_path / "frozen"
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert time.monotonic() < deadline and job(slurm, job_id)["JobState"] in ("PENDING", "RUNNING")
        time.sleep(0.1)
    started = time.monotonic()
    assert _run(["scancel", "--signal", "TERM", job_id], slurm).returncode == 0
    fields = wait_for_job(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"})
    log = Path(f"{run_dir}.log").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", log[-3000:]
    print(f"preempted: SIGTERM to completed after one requeue in {time.monotonic() - started:.1f} s")
    assert f"stopped by SIGTERM: {run_dir / 'checkpoints' / 'last.ckpt'} holds step 12" in log
    assert "Exited with exit code 143" in log
    assert_same_run(uninterrupted_job, run_dir)


def test_a_dead_task_leaves_no_survivor_hanging(slurm, tmp_path):
    """One task SIGKILLed (an out-of-memory kill): the other fails on the closed connection and the job ends at
    once; the script does not requeue a crash."""
    run_dir = tmp_path / "run"
    kill = {"class_path": "helpers.kill_points.KillRankAt",
            "init_args": {"marker": str(tmp_path / "killed"), "rank": 1, "step": 8}}  # fmt: skip
    job_id = submit(slurm, run_dir, "-c", extra_config(tmp_path / "kill.yaml", callbacks=[kill]))
    fields = wait_for_job(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"})
    ended = time.time()
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0"
    seconds = ended - float((tmp_path / "killed").read_text())
    print(f"a dead task: the job ended {seconds:.1f} s after the kill")
    assert seconds < 30
