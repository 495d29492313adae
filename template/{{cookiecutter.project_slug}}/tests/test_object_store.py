"""A run directory in object storage (`--trainer.default_root_dir s3://bucket/run`), against a real S3 API server
(moto's, started here) through the real clients (s3fs, botocore), and a TCP proxy in front of it for faults: the run
lives in the store, one fit trains it at a time across machines, a run killed on one machine resumes exactly on
another, and a failing store stops a run in one line with its last checkpoint intact."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from template_package.engine.resume.remote_run import RemoteRun, StoreSettings

from helpers.cli import PROJECT_ROOT, STAND_IN, WarmProcess, cli, extra_config, started, subprocess_env
from helpers.object_store import S3Server, TcpProxy, client_env
from helpers.runs import assert_same_run, reference_run

s3fs = pytest.importorskip("s3fs", reason='a run in object storage needs s3fs: pip install -e ".[s3]"')

BASE = [*STAND_IN, "--trainer.max_epochs=3", "--last_checkpoint.every_n_steps=5", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]  # fmt: skip
# Short enough for a test: a dead holder's lock expires after 8 s; a store down for 2 s stops the run. A request may
# take 3 s: the store and the run share two loaded cores with the rest of the suite (1 s failed a run's start once).
QUICK_STORE = ["--store.renew_every=1", "--store.expire_after=8", "--store.give_up_after=2",
               "--store.request_timeout=3"]  # fmt: skip


@pytest.fixture(scope="module")
def s3_server():
    if shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None and not shutil.which("moto_server"):
        pytest.skip("moto's S3 server is not installed: pip install 'moto[server]'")
    server = S3Server()
    yield server
    server.stop()


def point_clients_at(endpoint: str, monkeypatch) -> None:
    for name, value in client_env(endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def store(endpoint: str | None = None) -> "s3fs.S3FileSystem":
    """A client of the store; at `endpoint` (the server itself, not a proxy) or where the environment points."""
    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, endpoint_url=endpoint)


@pytest.fixture
def bucket(s3_server, monkeypatch) -> str:
    """A new bucket, and this process's environment (and its children's) pointed at the server."""
    point_clients_at(s3_server.endpoint, monkeypatch)
    name = f"runs-{uuid.uuid4().hex[:12]}"
    store().mkdir(name)
    return name


def saved_step(fs, path: str) -> int:
    with fs.open(path, "rb") as file:
        return torch.load(file, weights_only=True)["global_step"]


def wait_for(condition, process, timeout: float = 300, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}: {process.communicate()[1][-3000:]}"
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s; its standard error and stacks: {process.stacks()}")
        time.sleep(0.05)


def slowed(tmp_path: Path, seconds: float = 0.15) -> list[str]:
    slow = {"class_path": "helpers.kill_points.SlowDown", "init_args": {"seconds": seconds}}
    return ["-c", extra_config(tmp_path / "slow.yaml", callbacks=[slow])]


def kill(process) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_a_run_in_the_store_keeps_its_files_there_and_evaluates_from_there(bucket, tmp_path, capsys):
    url = f"s3://{bucket}/ref"
    csv = ["--trainer.logger+=template_package.engine.report.loggers.RunCSVLogger"]
    cli("fit", f"--trainer.default_root_dir={url}", *BASE, *csv)
    out = capsys.readouterr().out
    assert f"last state (step 57): {url}/checkpoints/last.ckpt" in out
    assert f"tensorboard --logdir {url}" in out and f"{url}/metrics.csv" in out
    fs = store()
    files = {path.removeprefix(f"{bucket}/ref/") for path in fs.find(f"{bucket}/ref")}
    assert {"checkpoints/last.ckpt", "config.yaml", "metrics.csv", "hparams.yaml"} <= files
    assert any(name.startswith("checkpoints/epoch=") for name in files)
    assert any(name.startswith("events.out.tfevents") for name in files)
    assert not (tmp_path / "s3:").exists() and not list(tmp_path.iterdir()), "nothing local named after the URL"
    config = yaml.safe_load(fs.cat(f"{bucket}/ref/config.yaml"))
    assert config["trainer"]["default_root_dir"] == url
    assert {logger["init_args"]["save_dir"] for logger in config["trainer"]["logger"]} == {url}  # not the local folder
    assert saved_step(fs, f"{bucket}/ref/checkpoints/last.ckpt") == 57
    steps = [int(line.split(",")[list(fs.cat(f"{bucket}/ref/metrics.csv").decode().splitlines()[0].split(",")).index(
        "step")]) for line in fs.cat(f"{bucket}/ref/metrics.csv").decode().splitlines()[1:]]  # fmt: skip
    assert max(steps) >= 56
    # validate and predict read the checkpoint from the store and add their files to the run there.
    cli("validate", f"--ckpt_path={url}/checkpoints/last.ckpt")
    assert "val/acc" in capsys.readouterr().out
    cli("predict", f"--ckpt_path={url}/checkpoints/last.ckpt")
    assert fs.exists(f"{bucket}/ref/predictions.csv")
    assert not list(tmp_path.iterdir())
    cli("export", f"--ckpt_path={url}/checkpoints/last.ckpt", f"--output={tmp_path / 'exported' / 'model.pt'}")
    assert (tmp_path / "exported" / "model.pt").is_file()


def test_a_damaged_last_ckpt_in_the_store_is_refused_and_a_resume_goes_on_from_previous_ckpt(
    bucket, tmp_path, tmp_path_factory, capsys
):
    """Stopped by SIGTERM at step 40 (last.ckpt) after the save of step 35 (previous.ckpt), each uploaded with its
    digest; a byte of last.ckpt changed in the store: validate refuses it in one line, and --ckpt_path last goes on
    from previous.ckpt, read from the store, to the uninterrupted run's end."""
    url, fs = f"s3://{bucket}/damaged", store()
    signal_ = {"class_path": "helpers.faults.SignalAt",
               "init_args": {"hook": "on_train_batch_end", "signal_name": "SIGTERM", "step": 40}}  # fmt: skip
    with pytest.raises(SystemExit):
        cli("fit", f"--trainer.default_root_dir={url}", *BASE, "-c", extra_config(tmp_path / "s.yaml", [signal_]))
    last = f"{bucket}/damaged/checkpoints/last.ckpt"
    assert saved_step(fs, last) == 40 and saved_step(fs, f"{bucket}/damaged/checkpoints/previous.ckpt") == 35
    data = bytearray(fs.cat(last))
    data[len(data) // 2] ^= 0x10
    fs.pipe(last, bytes(data))
    with pytest.raises(SystemExit) as stop:
        cli("validate", f"--ckpt_path={url}/checkpoints/last.ckpt")
    assert "/last.ckpt is damaged: its CRC-32 is " in stop.value.code and "\n" not in stop.value.code
    capsys.readouterr()
    cli("fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", *BASE)
    err = capsys.readouterr().err
    assert f"notice: {url}/checkpoints/last.ckpt (step 40) is damaged: its CRC-32 is " in err
    assert f": resuming from {url}/checkpoints/previous.ckpt, the state before it (step 35)" in err
    got = tmp_path / "from_the_store"
    fs.get(f"{bucket}/damaged", str(got), recursive=True)
    assert_same_run(reference_run(tmp_path_factory, []), got)


def test_a_second_fit_on_a_live_run_is_refused_in_one_line_and_writes_nothing(bucket, tmp_path, monkeypatch, capsys):
    url = f"s3://{bucket}/live"
    freeze = {"class_path": "helpers.kill_points.FreezeAt", "init_args": {"marker": str(tmp_path / "frozen"),
              "hook": "on_train_batch_end", "step": 3}}  # fmt: skip
    first = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE,
                                 "-c", extra_config(tmp_path / "freeze.yaml", callbacks=[freeze])]))  # fmt: skip
    wait_for((tmp_path / "frozen").exists, first, what="the first fit's step 3")
    fs = store()
    before = {path: info["ETag"] for path, info in fs.find(bucket, detail=True).items()}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    started_at = time.monotonic()
    with pytest.raises(SystemExit) as refused:
        cli("fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", *BASE)
    assert time.monotonic() - started_at < 60
    message = str(refused.value.code)
    assert message.startswith(f"error: {url} is being trained by another fit (host ") and "\n" not in message
    assert f"pid {first.pid}, which renewed its lock" in message and "--run_lock takeover" in message
    assert {path: info["ETag"] for path, info in fs.find(bucket, detail=True).items()} == before
    assert not list(elsewhere.iterdir())
    # The machine of the first fit is gone (frozen here): --run_lock takeover takes its lock at once and trains.
    cli("fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", "--run_lock=takeover", *BASE)
    assert f"notice: took over the run lock of {url} from host" in capsys.readouterr().err
    assert saved_step(fs, f"{bucket}/live/checkpoints/last.ckpt") == 57
    assert not fs.exists(f"{bucket}/live/.lock"), "a fit that ends gives its lock back"
    kill(first)


def test_a_store_that_ignores_conditional_writes_is_refused_unless_the_lock_is_off(bucket, monkeypatch, capsys):
    """A store that drops the conditions (here: a client that does not send them) to the real server."""
    call = s3fs.S3FileSystem.call_s3

    def without_conditions(self, method, *args, **kwargs):
        kwargs.pop("IfNoneMatch", None), kwargs.pop("IfMatch", None)
        return call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "call_s3", without_conditions)
    url = f"s3://{bucket}/unconditional"
    with pytest.raises(SystemExit) as refused:
        cli("fit", f"--trainer.default_root_dir={url}", *BASE)
    assert "the store ignores conditional writes (If-None-Match)" in str(refused.value.code)
    assert "--run_lock off" in str(refused.value.code)
    assert not store().exists(f"{bucket}/unconditional/.lock")
    cli("fit", f"--trainer.default_root_dir={url}", "--run_lock=off", *BASE)
    assert saved_step(store(), f"{bucket}/unconditional/checkpoints/last.ckpt") == 57


def test_credentials_in_the_url_never_reach_the_output_or_config_yaml(bucket, capsys):
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    url = f"s3://test:{secret}@{bucket}/keyed"
    cli("fit", f"--trainer.default_root_dir={url}", *BASE)
    shown = capsys.readouterr()
    assert f"s3://{bucket}/keyed/checkpoints/last.ckpt" in shown.out
    assert f":{secret}@" not in shown.out + shown.err
    config = store().cat(f"{bucket}/keyed/config.yaml").decode()
    assert f":{secret}@" not in config and f"default_root_dir: s3://{bucket}/keyed" in config


def test_a_store_whose_package_is_missing_stops_before_any_work_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # (as where it is not installed)
    with pytest.raises(SystemExit) as stop:
        cli("fit", "--trainer.default_root_dir=gs://bucket/run", *BASE)
    assert stop.value.code == "error: gs://bucket/run needs gcsfs: pip install gcsfs"
    assert not list(tmp_path.iterdir())


def test_a_checkpoint_handed_over_again_while_it_goes_up_is_not_pulled_from_under_its_upload():
    """The uploads in-process on fsspec's memory filesystem (memory:// is for in-process tests only): a newer
    last.ckpt handed over while the older one is being uploaded waits its turn, and the store ends with the newer."""
    run = RemoteRun(f"memory://race-{uuid.uuid4().hex[:8]}/run", StoreSettings(give_up_after=2))
    uploads = run.start_uploads()
    going_up, let_it_finish, put = threading.Event(), threading.Event(), run.fs.put_file

    def slow_put(local, target, **kwargs):
        going_up.set()
        let_it_finish.wait(30)
        return put(local, target, **kwargs)

    run.fs.put_file = slow_put
    last = run.local / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    for version in (b"older", b"newer"):
        last.with_suffix(".tmp").write_bytes(version)
        os.replace(last.with_suffix(".tmp"), last)  # (as durable.py writes it)
        uploads.file(last)
        assert going_up.wait(30)
    let_it_finish.set()
    assert run.finish(30) and uploads.error is None, uploads.error
    assert run.fs.cat_file(f"{run.root}/checkpoints/last.ckpt") == b"newer"
    run.close()


def test_a_file_url_is_the_local_folder_it_names(tmp_path, capsys):
    run_dir = tmp_path / "elsewhere" / "run"
    cli("fit", f"--trainer.default_root_dir=file://{run_dir}", *BASE)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "config.yaml").is_file()
    assert not (tmp_path / "file:").exists()
    assert f"last state (step 57): {run_dir}/checkpoints/last.ckpt" in capsys.readouterr().out


def test_a_sharded_run_in_the_store_is_refused_in_one_line(bucket, tmp_path):
    fsdp = ["-c", str(PROJECT_ROOT / "configs" / "fsdp.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1",
            "--trainer.precision=32-true"]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir=s3://{bucket}/sharded", *BASE, *fsdp)
    assert "a sharded checkpoint (configs/fsdp.yaml) cannot be kept in object storage yet" in str(stop.value.code)
    assert not store().exists(f"{bucket}/sharded/checkpoints"), "refused before any training"


@pytest.mark.slow
def test_a_run_killed_after_its_checkpoint_reached_the_store_resumes_exactly_on_another_machine(
    bucket, tmp_path, tmp_path_factory
):
    """SIGKILLed once a last.ckpt is in the store, then resumed in a new process with another working directory, HOME
    and TMPDIR (nothing of the first machine's local folder): retried while the dead run's lock has not expired, it
    ends with the uninterrupted run's weights, optimizer state and every logged value."""
    reference = reference_run(tmp_path_factory, [])
    url = f"s3://{bucket}/moved"
    killed = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *QUICK_STORE, *slowed(tmp_path)]))
    fs = store()
    wait_for(lambda: fs.exists(f"{bucket}/moved/checkpoints/last.ckpt"), killed, what="a last.ckpt in the store")
    kill(killed)
    step = saved_step(fs, f"{bucket}/moved/checkpoints/last.ckpt")
    assert 0 < step < 57
    machine = tmp_path / "another_machine"
    for folder in ("work", "home", "tmp"):
        (machine / folder).mkdir(parents=True)
    env = subprocess_env(HOME=str(machine / "home"), TMPDIR=str(machine / "tmp"))
    command = [sys.executable, "-m", "template_package", "fit", f"--trainer.default_root_dir={url}",
               "--ckpt_path=last", *BASE, *QUICK_STORE]  # fmt: skip
    deadline = time.monotonic() + 300
    while True:
        resumed = subprocess.run(command, cwd=machine / "work", env=env, capture_output=True, text=True, timeout=300)
        if resumed.returncode == 0 or time.monotonic() > deadline or "is being trained by" not in resumed.stderr:
            break
        time.sleep(1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"last state (step 57): {url}/checkpoints/last.ckpt" in resumed.stdout
    assert not list((machine / "work").iterdir()) and not list((machine / "tmp").iterdir())
    got = tmp_path / "from_the_store"
    fs.get(f"{bucket}/moved", str(got), recursive=True)
    assert_same_run(reference, got)


@pytest.mark.slow
def test_a_stop_signal_uploads_the_state_it_saved_before_the_process_exits(bucket, tmp_path):
    url, fs = f"s3://{bucket}/stopped", store()
    run = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *slowed(tmp_path)]))
    wait_for(lambda: fs.exists(f"{bucket}/stopped/checkpoints/last.ckpt"), run, what="a last.ckpt in the store")
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 143, err[-3000:]
    step = int(err.split(f"stopped by SIGTERM: {url}/checkpoints/last.ckpt holds step ")[1].split()[0])
    assert f"uploaded to {url}: continue the run with --ckpt_path last" in err
    assert saved_step(fs, f"{bucket}/stopped/checkpoints/last.ckpt") == step
    assert not fs.exists(f"{bucket}/stopped/.lock")


@pytest.mark.slow
def test_two_processes_killed_and_resumed_from_the_store_end_bit_identical(bucket, tmp_path, tmp_path_factory):
    ddp = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    reference = reference_run(tmp_path_factory, ddp)
    url, fs = f"s3://{bucket}/ddp", store()
    killed = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *ddp, *slowed(tmp_path)]))
    wait_for(lambda: fs.exists(f"{bucket}/ddp/checkpoints/last.ckpt"), killed, what="a last.ckpt in the store")
    kill(killed)
    # On the machine it ran on, the lock of a process that has ended is taken over at once (its lease runs 150 s).
    resumed = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", *BASE, *ddp]))
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"notice: took over the run lock of {url} from host {socket.gethostname()} pid {killed.pid}, which has " \
           "ended on this machine" in err  # fmt: skip
    got = tmp_path / "from_the_store"
    fs.get(f"{bucket}/ddp", str(got), recursive=True)
    assert_same_run(reference, got)


@pytest.mark.slow
def test_a_run_killed_after_a_best_checkpoint_newer_than_last_ckpt_leaves_the_uninterrupted_runs_files_in_the_store(
    bucket, tmp_path, tmp_path_factory, capsys
):
    """save_top_k 2, killed at step 40 once all it wrote is in the store: epoch 1's best checkpoint (step 38), last.ckpt
    holding step 35. The resumed run removes that checkpoint from the store before its first save: resumed to step 37
    only, the bucket holds none of epoch 1; resumed to the end, it holds the uninterrupted run's files, each with its
    digest (test_checkpoint_integrity.py: in a local folder)."""
    args = ["--checkpoint.save_top_k=2"]
    reference = reference_run(tmp_path_factory, args)
    url, fs = f"s3://{bucket}/stale", store()
    freeze = {"class_path": "helpers.kill_points.FreezeAt", "init_args": {"marker": str(tmp_path / "frozen"),
              "hook": "on_train_batch_end", "step": 40, "uploaded": True}}  # fmt: skip
    killed = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *args,
                                  "-c", extra_config(tmp_path / "freeze.yaml", callbacks=[freeze])]))  # fmt: skip
    wait_for((tmp_path / "frozen").exists, killed, what="step 40")
    kill(killed)
    names = lambda: sorted(path.rsplit("/", 1)[1] for path in fs.ls(f"{bucket}/stale/checkpoints"))  # noqa: E731
    best = [name for name in names() if name.startswith("epoch=")]
    assert [name[:8] for name in best] == ["epoch=0-"] * 2 + ["epoch=1-"] * 2  # each with its digest
    assert saved_step(fs, f"{bucket}/stale/checkpoints/last.ckpt") == 35
    cli("fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", *BASE, *args, "--trainer.max_steps=37")
    assert [name for name in names() if name.startswith("epoch=")] == best[:2]
    assert "notice: removed epoch=1-val_acc=" in capsys.readouterr().err
    cli("fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", *BASE, *args)
    assert names() == sorted(path.name for path in (reference / "checkpoints").iterdir())
    got = tmp_path / "from_the_store"
    fs.get(f"{bucket}/stale", str(got), recursive=True)
    assert_same_run(reference, got)


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """A TCP proxy in front of the server, which this process's clients and its children's go through."""
    proxy = TcpProxy(s3_server.port)
    yield proxy
    proxy.stop()


@pytest.mark.slow
def test_a_kill_during_a_slowed_upload_leaves_the_previous_checkpoint_which_resumes_exactly(
    s3_server, bucket, proxy, monkeypatch, tmp_path, tmp_path_factory
):
    """The machine is lost while last.ckpt goes up: its connections are cut with it (a SIGKILLed process alone would
    leave the kernel to send what it had buffered), and the store keeps the checkpoint before, whole."""
    reference = reference_run(tmp_path_factory, [])
    url, fs, last = f"s3://{bucket}/slowed", store(s3_server.endpoint), f"{bucket}/slowed/checkpoints/last.ckpt"
    point_clients_at(proxy.endpoint, monkeypatch)  # (the bucket was made directly, and the test reads it directly)
    killed = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *slowed(tmp_path, 0.05)]))
    wait_for(lambda: fs.exists(last), killed, what="a last.ckpt in the store")
    proxy.rate = 20_000  # bytes a second: a checkpoint now takes seconds to go up
    begun = len(proxy.requests)
    wait_for(lambda: any(r.endswith(f"/{last}") for r in proxy.requests[begun:]), killed, what="an upload of last.ckpt")
    sent = proxy.sent
    wait_for(lambda: proxy.sent > sent + 20_000, killed, what="20 kB of it sent")
    proxy.stalled = True  # nothing more arrives while the test reads the store's checkpoint
    step = saved_step(fs, last)
    proxy.stop()
    kill(killed)
    proxy.stalled, proxy.rate = False, None
    proxy.start()
    assert saved_step(fs, last) == step >= 5, f"the store holds step {saved_step(fs, last)}, not {step}"
    cli("fit", f"--trainer.default_root_dir={url}", "--ckpt_path=last", "--run_lock=takeover", *BASE)
    got = tmp_path / "from_the_store"
    fs.get(f"{bucket}/slowed", str(got), recursive=True)
    assert_same_run(reference, got)


@pytest.mark.slow
def test_a_store_down_past_the_limit_stops_the_run_in_one_line_with_its_last_checkpoint_intact(
    bucket, proxy, monkeypatch, tmp_path
):
    url, fs = f"s3://{bucket}/down", store()
    point_clients_at(proxy.endpoint, monkeypatch)
    run = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *QUICK_STORE, *slowed(tmp_path)]))
    wait_for(lambda: fs.exists(f"{bucket}/down/checkpoints/last.ckpt"), run, what="a last.ckpt in the store")
    proxy.stop()
    stopped_at = time.monotonic()
    out, err = run.communicate(timeout=120)
    proxy.start()
    assert run.returncode == 1, err[-3000:]
    assert time.monotonic() - stopped_at < 60  # the 2-s limit, its retries and the exit, on a loaded machine too
    last = err.strip().splitlines()[-1]
    assert last.startswith((f"error: cannot upload to {url} for 2 s (", f"error: cannot renew the run lock of {url}"))
    assert 0 < saved_step(fs, f"{bucket}/down/checkpoints/last.ckpt") < 57


@pytest.mark.slow
def test_a_store_that_stops_answering_ends_the_run_in_one_line_and_a_stop_signal_in_time(bucket, proxy, monkeypatch,
                                                                                          tmp_path):  # fmt: skip
    """A store that takes requests and never answers (a hung server, a black-holed network): requests time out, so
    training stops past the limit in one line, and a SIGTERM meanwhile exits within --store.stop_timeout, naming the
    local folder that keeps the newest state. The store's last checkpoint stays whole."""
    fs = store()
    point_clients_at(proxy.endpoint, monkeypatch)
    for name, signaled in (("stalled", False), ("stalled-stopped", True)):
        url = f"s3://{bucket}/{name}"
        longer = ["--store.stop_timeout=3", "--trainer.max_epochs=30", *slowed(tmp_path)]
        run = started(WarmProcess(["fit", f"--trainer.default_root_dir={url}", *BASE, *QUICK_STORE, *longer]))
        last_ckpt = f"{bucket}/{name}/checkpoints/last.ckpt"
        wait_for(lambda: fs.exists(last_ckpt), run, what="a last.ckpt in the store")  # noqa: B023
        proxy.stalled = True
        stalled_at = time.monotonic()
        if signaled:
            run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
        ended = time.monotonic() - stalled_at
        proxy.stalled = False
        last = err.strip().splitlines()[-1]
        if signaled:
            assert run.returncode == 143, err[-3000:]
            assert ended < 3 + 2 + 10, ended  # the stop timeout, the lock's release, the step in flight
            assert f"did not reach {url} within 3 s: they are kept in " in err
        else:
            assert run.returncode == 1, err[-3000:]
            assert ended < 60, ended
            said = (f"error: cannot upload to {url} for 2 s (FSTimeoutError",
                    f"error: cannot renew the run lock of {url} for 2 s (FSTimeoutError")  # fmt: skip
            assert last.startswith(said), last
            assert "the newest state is in " in last
        assert 0 < saved_step(fs, last_ckpt) < 30 * 19
