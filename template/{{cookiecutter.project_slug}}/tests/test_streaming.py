"""Streaming train loaders (engine/data/streams.py) against the real libraries and locally generated files: Hugging
Face `datasets` streaming with a seeded shuffle buffer and litdata's StreamingDataset, read as their documentation
shows, and streams of the user's own (helpers/stream_task.py). A run SIGKILLed mid-epoch, or resumed from an epoch's
end, ends bit-identical to the run that never stopped; what the engine cannot make exact gets its notice, and what
would make a resume inexact is refused in one line."""

import importlib.util
import multiprocessing
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from template_package.engine.data import streams
from template_package.engine.data.preparing import prepare_keeping_global_state
from template_package.engine.training import trainer as engine_trainer

from helpers.cli import WarmProcess, cli, extra_config, resume, scalars, started
from helpers.runs import assert_same_run, finish, freeze_config, kill_when_frozen
from helpers.stream_task import HeldOrder, HFStreamData, LitStreamData, UnseededDraws


def needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed: pip install -e '.[streaming]'"
    )


@pytest.fixture(scope="module", autouse=True)
def caches_of_the_tests_own(tmp_path_factory):
    """The libraries' caches (Hugging Face's, litdata's optimize folders) in a temporary folder, for this process and
    the runs it starts."""
    caches = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(caches / "huggingface"))
        patch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(caches / "chunks"))
        patch.setenv("DATA_OPTIMIZER_DATA_CACHE_FOLDER", str(caches / "data"))
        yield


@pytest.fixture(scope="module", autouse=True)
def no_shared_memory_left_behind():
    """MosaicML Streaming's shared memory, which its runs killed here leave in /dev/shm, removed after the module."""
    shm = Path("/dev/shm")
    before = set(shm.iterdir()) if shm.is_dir() else set()
    yield
    for path in (set(shm.iterdir()) if shm.is_dir() else set()) - before:
        if path.name[:6].isdigit() and path.name[6:7] == "_":
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The folder the DataModules write their shards and chunks into (their prepare_data), shared by the module."""
    return tmp_path_factory.mktemp("data")


def task(data_module: str, *args: str, module: str = "stream_task") -> list[str]:
    """The stream task (helpers/stream_task.py) with `data_module` (of `module`): 3 epochs of 38 batches, train/loss
    logged at every step, validation on one batch. (Not limit_val_batches=1: in this process the command line parses
    it as 1.0, all the batches, where a child process parses it as one batch.)"""
    return ["--model=null", "--model=helpers.stream_task.StreamModel", "--data=null",
            f"--data=helpers.{module}.{data_module}", "--checkpoint.monitor=val/loss", "--checkpoint.mode=min",
            "--trainer.max_epochs=3", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", *args]  # fmt: skip


def hf(data: Path, workers: int, *args: str) -> list[str]:
    return task("HFStreamData", f"--data.folder={data / 'json'}", f"--data.num_workers={workers}", *args)


def lit(data: Path, workers: int, *args: str) -> list[str]:
    return task("LitStreamData", f"--data.folder={data / 'chunks'}", f"--data.num_workers={workers}", *args)


def held(workers: int, *args: str) -> list[str]:
    return task("IterableData", "--data.kind=held", f"--data.num_workers={workers}", *args)


def start_fit(run_dir: Path, args: list[str]) -> WarmProcess:
    return started(WarmProcess(["fit", f"--trainer.default_root_dir={run_dir}", *args]))


REFERENCES: dict[tuple[str, ...], Path] = {}


def reference_run(tmp_path_factory, args: list[str]) -> Path:
    """The uninterrupted run with `args`, trained once per session, in this process."""
    if tuple(args) not in REFERENCES:
        run_dir = tmp_path_factory.mktemp("reference") / "run"
        cli("fit", f"--trainer.default_root_dir={run_dir}", *args, task=[])
        REFERENCES[tuple(args)] = run_dir
    return REFERENCES[tuple(args)]


# Killed in epoch 1 (steps 38-75) at step 53: resumed mid-epoch from step 50 (a checkpoint every 5 steps), or from
# epoch 0's end (step 38: a checkpoint at epoch ends only).
MID_EPOCH = ["--last_checkpoint.every_n_steps=5"]
EPOCH_END = ["--last_checkpoint.every_n_steps=0"]


def killed(tmp_path: Path, args: list[str], cadence: list[str], step: int = 53) -> Path:
    """A run with `args` SIGKILLed at `step`; its run directory."""
    run_dir = tmp_path / "run"
    freeze = freeze_config(tmp_path, hook="on_train_batch_end", step=step)
    kill_when_frozen(start_fit(run_dir, [*args, *cadence, "-c", freeze]), tmp_path / "frozen")
    return run_dir


def assert_resumes_exactly(tmp_path: Path, tmp_path_factory, args: list[str], cadence: list[str], resumed_at: int,
                           capsys) -> Path:  # fmt: skip
    """Kill a run with `args`, resume it from step `resumed_at`, and compare it with the uninterrupted run, which
    got no notice; returns the killed run's directory as it was before the resume (a copy)."""
    reference = reference_run(tmp_path_factory, args)
    assert "notice" not in capsys.readouterr().err
    run_dir = killed(tmp_path, args, cadence)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == resumed_at
    copy = shutil.copytree(run_dir, tmp_path / "killed")
    resume(run_dir, *args, *cadence, task=[])
    assert_same_run(reference, run_dir)
    return copy


@needs("datasets")
@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_hf_stream_killed_mid_epoch_resumes_bit_identical(tmp_path, tmp_path_factory, data, workers, capsys):
    killed_dir = assert_resumes_exactly(tmp_path, tmp_path_factory, hf(data, workers), MID_EPOCH, 50, capsys)
    if workers:  # each worker builds batches of its own part of the stream: another number trains other samples
        with pytest.raises(SystemExit) as refused:
            resume(killed_dir, *hf(data, 0), task=[])
        assert str(refused.value.code) == (
            "error: the checkpoint's train stream was read by 2 loader workers and this run's train loader has 0: "
            "each worker builds batches of its own part of a stream, so another number trains other samples; resume "
            "with num_workers=2, or start a new run"
        )


@needs("datasets")
@pytest.mark.slow
def test_hf_stream_resumed_from_an_epoch_end_is_bit_identical(tmp_path, tmp_path_factory, data, capsys):
    assert_resumes_exactly(tmp_path, tmp_path_factory, hf(data, 2), EPOCH_END, 38, capsys)


@needs("datasets")
@pytest.mark.slow
def test_a_stream_resumed_from_an_epoch_end_with_max_steps_is_bit_identical(tmp_path, tmp_path_factory, data, capsys):
    """With max_steps set (the length a schedule needs), Lightning re-entered the finished epoch on resume
    (resume/finished_epochs.py) and ended the stream's next epoch after one batch, exit 0. Negative control: without
    keep_finished_epochs_finished, this test fails on the weights."""
    assert_resumes_exactly(tmp_path, tmp_path_factory, hf(data, 0, "--trainer.max_steps=1000"), EPOCH_END, 38, capsys)


@needs("litdata")
@pytest.mark.slow
def test_litdata_stream_killed_mid_epoch_resumes_bit_identical(tmp_path, tmp_path_factory, data, capsys):
    assert_resumes_exactly(tmp_path, tmp_path_factory, lit(data, 2), MID_EPOCH, 50, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "cadence", "resumed_at"), [(2, MID_EPOCH, 50), (0, EPOCH_END, 38)],
                         ids=["workers2_mid_epoch", "workers0_epoch_end"])  # fmt: skip
def test_a_stream_with_a_state_of_its_own_resumes_bit_identical(tmp_path, tmp_path_factory, workers, cadence,
                                                                 resumed_at, capsys):  # fmt: skip
    """No set_epoch, an order drawn from a generator it holds, and state_dict/load_state_dict: its state as it was
    when the trained batches had been read (Lightning had read one more)."""
    assert_resumes_exactly(tmp_path, tmp_path_factory, held(workers), cadence, resumed_at, capsys)


def test_an_iterable_of_unseeded_draws_gets_one_notice_before_training(run_dir, tmp_path, capsys):
    marker = {
        "class_path": "helpers.kill_points.Say",
        "init_args": {"hook": "on_train_batch_start", "text": "first batch"},
    }
    say = extra_config(tmp_path / "say.yaml", callbacks=[marker])
    cli("fit", f"--trainer.default_root_dir={run_dir}", *task("IterableData", "--data.kind=unseeded"),
        "--trainer.max_steps=3", "-c", say, task=[])  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("notice:") == 1, err
    notice = err.split("notice: ", 1)[1].splitlines()[0]
    assert notice.startswith(
        "the train loader cannot resume exactly: it reads an iterable dataset without set_epoch or "
        "state_dict/load_state_dict: the engine cannot know that its order repeats; a run resumed"
    )
    assert "To resume exactly, give the dataset set_epoch(epoch)" in notice
    assert err.index("notice:") < err.index("first batch")


@needs("litdata")
def test_preparing_the_data_leaves_the_first_run_equal_to_a_later_one(tmp_path, monkeypatch):
    """The first run's prepare_data builds the chunks with litdata.optimize (which seeds the global generators and
    switches multiprocessing to spawn); a later run finds them built. Negative control: without keeping the global
    state around prepare_data, the first run's losses differ from step 0."""

    def two_runs(folder: Path) -> tuple[dict, dict]:
        args = lit(folder, 0, "--trainer.max_steps=6")
        for name in ("first", "later"):
            cli("fit", f"--trainer.default_root_dir={folder / name}", *args, task=[])
        return scalars(folder / "first")["train/loss"], scalars(folder / "later")["train/loss"]

    start_method = multiprocessing.get_start_method(allow_none=True)
    first, later = two_runs(tmp_path / "kept")
    assert first == later and len(first) == 6
    assert multiprocessing.get_start_method(allow_none=True) == start_method
    monkeypatch.setattr(engine_trainer, "keep_global_state_in_prepare_data", lambda owners: None)
    try:
        first, later = two_runs(tmp_path / "not_kept")
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    assert first[0] != later[0]


DDP = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [pytest.param("hf_uneven_parts", marks=needs("datasets")), "held"])
def test_ddp_ranks_read_their_own_parts_take_equal_steps_and_resume_bit_identical(tmp_path, data, stream):
    """hf_uneven_parts: shards of 150, 150, 150 and 110 samples split by the engine between 2 processes: rank 0 reads
    300 (19 batches an epoch), rank 1 260 (17). Every rank takes 17 steps an epoch (rank 0 would otherwise wait forever
    in its 18th step's gradient all-reduce). held: a stream with a state of its own on each rank, every rank's state in
    the checkpoint (19 steps an epoch). Killed mid-epoch 1 and resumed, bit-identical; on 1 process it is refused."""
    if stream == "held":
        stream_args, steps = task("IterableData", "--data.kind=held"), 19
    else:
        shards = ["--data.shard_sizes=[150,150,150,110]", f"--data.folder={data / 'uneven'}"]
        stream_args, steps = task("HFStreamData", *shards), 17
    args = [*DDP, *stream_args, "--last_checkpoint.every_n_steps=5"]
    reference = tmp_path / "reference"
    finish(start_fit(reference, args))
    assert torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3 * steps
    run_dir = killed(tmp_path, args, [], step=steps + 6)
    finish(start_fit(run_dir, [*args, "--ckpt_path=last"]))
    assert_same_run(reference, run_dir)
    for allow in ([], ["--allow_change=world_size"]):
        with pytest.raises(SystemExit) as refused:
            resume(run_dir, *args[len(DDP) :], *allow, task=[])
        assert str(refused.value.code) == (
            f"error: --ckpt_path {run_dir / 'checkpoints' / 'last.ckpt'} was saved by 2 processes and this run has 1, "
            "and its train loader reads a stream, of which each process reads its own part: on another number of "
            "processes it would train other samples; resume it on 2"
        )


def test_a_stream_without_a_length_trains_by_epochs_and_the_schedule_names_max_steps(run_dir, data):
    """max_epochs alone trains a stream; only the warmup-cosine schedule needs the run's length, and says what to
    set."""
    pytest.importorskip("datasets", reason="datasets is not installed: pip install -e '.[streaming]'")
    cli("fit", f"--trainer.default_root_dir={run_dir}", *hf(data, 0, "--trainer.max_epochs=1"), task=[])
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 38
    recipe = [
        "--model=null",
        "--model=helpers.stand_in.StandInClassifier",
        "--model.num_classes=3",
        "--model.in_channels=1",
    ]
    with pytest.raises(SystemExit) as stop:  # (no sanity check: the stand-in reads images)
        cli("fit", f"--trainer.default_root_dir={run_dir.parent / 'recipe'}", *hf(data, 0), *recipe,
            "--trainer.num_sanity_val_steps=0", task=[])  # fmt: skip
    assert str(stop.value.code) == (
        "error: the warmup-cosine schedule needs the run's length in optimizer steps, which a train loader without a "
        "length (a stream's) cannot give: set trainer.max_steps"
    )


def test_what_the_engine_cannot_make_exact_is_named():
    assert streams.why_not_exact(DataLoader(HeldOrder(8), batch_size=2)) is None
    assert streams.stream_order(DataLoader(HeldOrder(8), batch_size=2)) == "state"
    assert "without set_epoch or state_dict" in streams.why_not_exact(DataLoader(UnseededDraws(8)))
    unordered = DataLoader(HeldOrder(8), batch_size=2, num_workers=2, in_order=False)
    assert "in_order=False" in streams.why_not_exact(unordered)


def fit_loop(epoch: int = 0) -> SimpleNamespace:
    """The two counters of Lightning's fit loop that a ResumableStream reads: the epoch, the batches trained in it."""
    trained = SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(processed=0)))
    return SimpleNamespace(epoch_progress=SimpleNamespace(current=SimpleNamespace(processed=epoch)), epoch_loop=trained)


def stream_loader(library: str, data: Path) -> DataLoader:
    if library == "datasets":
        module = HFStreamData(str(data / "json"))
    else:
        module = LitStreamData(str(data / "chunks"), num_workers=0)
        prepare_keeping_global_state(module)
    return module.train_dataloader()


@pytest.mark.parametrize("library", [pytest.param(name, marks=needs(name)) for name in ("datasets", "litdata")])
def test_each_epoch_of_a_stream_is_a_new_order_and_a_resume_reads_on_after_the_trained_batches(library, data):
    def indices(stream: streams.ResumableStream, epoch: int) -> list[list[int]]:
        stream.fit_loop.epoch_progress.current.processed = epoch
        return [batch["index"].tolist() for batch in stream]

    stream = streams.ResumableStream(stream_loader(library, data), seed=42, fit_loop=fit_loop())
    first, second = indices(stream, 0), indices(stream, 1)
    assert len(first) == len(second) == 38 and first != second
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(600))
    assert indices(stream, 0) == first
    stream.fit_loop.epoch_loop.batch_progress.current.processed = 5
    state = stream.state_dict()
    assert state == {streams.KEY: "epochs", "epoch": 0, "trained": 5, "num_workers": 0, "world_size": 1}
    resumed = streams.ResumableStream(stream_loader(library, data), seed=42, fit_loop=fit_loop())
    resumed.load_state_dict(state)
    assert indices(resumed, 0) == first[5:]
    assert indices(resumed, 1) == second


def web(data: Path, loader: str, workers: int, *args: str) -> list[str]:
    """The stream task on WebDataset shards (tests/helpers/webdataset_task.py)."""
    return task("WebDatasetData", f"--data.folder={data / 'tars'}", f"--data.loader={loader}",
                f"--data.num_workers={workers}", *args, module="webdataset_task")  # fmt: skip


@needs("webdataset")
@pytest.mark.slow
@pytest.mark.parametrize(("loader", "workers", "cadence", "resumed_at"), [
    ("dataloader", 0, MID_EPOCH, 50), ("dataloader", 2, EPOCH_END, 38), ("webloader", 2, MID_EPOCH, 50),
    ("webloader", 0, EPOCH_END, 38)])  # fmt: skip
def test_a_seeded_webdataset_pipeline_resumes_bit_identical(tmp_path, tmp_path_factory, data, loader, workers,
                                                           cadence, resumed_at, capsys):  # fmt: skip
    """Shard and sample shuffles seeded (the same order every epoch), in a DataLoader or a WebLoader whose own stages
    reshuffle in the training process; the resumed run re-reads its epoch and says what the skip cost."""
    args = web(data, loader, workers)
    assert_resumes_exactly(tmp_path, tmp_path_factory, args, cadence, resumed_at, capsys)
    said = capsys.readouterr().err
    if cadence is MID_EPOCH:
        assert re.search(r"resumed the train stream at batch 12 of epoch 1: re-read the 12 batches before it in "
                         r"\d+\.\d s", said), said  # fmt: skip
    assert "notice" not in said


@needs("webdataset")
@pytest.mark.slow
def test_a_webdataset_shard_shuffle_by_epoch_gets_the_runs_epoch_and_resumes_bit_identical(
    tmp_path, tmp_path_factory, data, capsys
):
    """detshuffle=True counts the iterations of each worker's copy of the pipeline: every epoch would shuffle the
    shards as the first did. The engine gives it the run's epoch: the epochs differ, and a resume is exact."""
    args = web(data, "dataloader", 2, "--data.detshuffle=true")
    copy = assert_resumes_exactly(tmp_path, tmp_path_factory, args, MID_EPOCH, 50, capsys)
    records = tmp_path / "indices.txt"
    callback = extra_config(tmp_path / "record.yaml", callbacks=[
        {"class_path": "helpers.stream_task.RecordIndices", "init_args": {"path": str(records)}}])  # fmt: skip
    cli("fit", f"--trainer.default_root_dir={copy.parent / 'again'}", *args, "-c", callback, task=[])
    epochs = {}
    for line in records.read_text().splitlines():
        head, indices = line.split(": ")
        epochs.setdefault(head.split()[1], []).append(indices)
    assert len(epochs) == 3 and epochs["0"] != epochs["1"] != epochs["2"]


@needs("webdataset")
@pytest.mark.parametrize(("option", "stage"), [
    ("--data.seeded=false", "its shuffle(50) stage is unseeded: it seeds itself from the process ID and the time, so "
                            "the run does not repeat, and a run resumed mid-epoch reads that epoch again from its "
                            "start: give it a seed (.shuffle(50, seed=...))"),
    ("--data.resampled=true", "its ResampledShards stage (resampled=True) seeds itself from the process ID, the time "
                              "and os.urandom, so the run does not repeat, and a run resumed mid-epoch reads that "
                              "epoch again from its start: use wds.ResampledShards(urls, deterministic=True)"),
], ids=["unseeded_shuffle", "resampled"])  # fmt: skip
def test_a_webdataset_stage_that_does_not_repeat_gets_one_notice_naming_it(run_dir, data, option, stage, capsys):
    args = web(data, "webloader", 0, option, "--trainer.max_epochs=1", "--trainer.max_steps=3")
    cli("fit", f"--trainer.default_root_dir={run_dir}", *args, task=[])
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice")]
    assert notices == [
        f"notice: the train loader cannot resume exactly: {stage}; a run resumed from a checkpoint then reads other "
        "samples than the run that never stopped. To resume exactly, see docs/data.md"
    ]


@needs("webdataset")
@pytest.mark.slow
def test_webdataset_split_by_node_ranks_take_equal_steps_and_resume_bit_identical(tmp_path, data):
    """5 shards of 120 samples split by node, then by 2 workers (each batching its own shards, the last batch of 120
    samples partial): rank 0 reads 3 (23 batches an epoch), rank 1 2 (16); every rank takes 16 steps an epoch, and a
    run killed in epoch 1 resumes bit-identical."""
    five = web(data, "dataloader", 2, "--data.shards=5", f"--data.folder={data / 'five'}")
    args = [*DDP, *five, "--last_checkpoint.every_n_steps=5"]
    reference = tmp_path / "reference"
    finish(start_fit(reference, args))
    assert torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3 * 16
    run_dir = killed(tmp_path, args, [], step=16 + 6)
    finish(start_fit(run_dir, [*args, "--ckpt_path=last"]))
    assert_same_run(reference, run_dir)


def mosaic(data: Path, loader: str, workers: int, *args: str) -> list[str]:
    """The stream task on MosaicML Streaming shards (tests/helpers/mosaic_task.py)."""
    return task("MosaicData", f"--data.folder={data / 'mds'}", f"--data.loader={loader}",
                f"--data.num_workers={workers}", *args, module="mosaic_task")  # fmt: skip


@needs("streaming")
@pytest.mark.slow
@pytest.mark.parametrize(("loader", "workers", "cadence", "resumed_at"), [
    ("mosaic", 0, MID_EPOCH, 50), ("mosaic", 2, MID_EPOCH, 50), ("mosaic", 0, EPOCH_END, 38),
    ("mosaic", 2, EPOCH_END, 38), ("torch", 2, MID_EPOCH, 50)])  # fmt: skip
def test_a_mosaicml_streaming_dataset_resumes_bit_identical(tmp_path, data, loader, workers, cadence, resumed_at):
    """A shuffled StreamingDataset in its StreamingDataLoader or torch's, SIGKILLed (its shared memory left behind)
    and resumed: the engine gives it the run's epoch and the trained samples, which it skips itself. Every run in a
    process of its own, as a user's are: its workers' barriers deadlocked in a process that had run it before."""
    args = mosaic(data, loader, workers)
    reference = tmp_path / "reference"
    finish(start_fit(reference, args))
    run_dir = killed(tmp_path, args, cadence)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == resumed_at
    resumed = start_fit(run_dir, [*args, *cadence, "--ckpt_path=last"])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0 and "notice" not in err, err[-3000:]
    assert_same_run(reference, run_dir)
