"""A damaged checkpoint is never trained on or evaluated, a good state is always at hand, and the run folder holds what
docs/run-directory.md says. Every checkpoint file the project writes has its digest beside it (engine/resume/
digests.py), checked whenever one is read: a byte changed anywhere, a file cut short, a tail of zeros, a record taken
from another checkpoint with its own CRC, each stops the command in one line. A resume whose last.ckpt is damaged goes
on from previous.ckpt and ends as the run that never stopped; with nothing good left it stops and changes nothing. A
run killed after a best checkpoint newer than its last.ckpt, resumed, ends with the uninterrupted run's files, in a
local folder and in object storage."""

import contextlib
import io
import os
import random
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from template_package.engine.cli import export
from template_package.engine.resume import durable
from template_package.engine.resume.digests import damage, digest_of
from template_package.engine.resume.durable import DurableCheckpointIO

from helpers.cli import QUICK, cli, extra_config, resume
from helpers.runs import assert_kill_and_resume_exact, assert_same_run, reference_run, resume_fit, start_fit

# In-process runs: 2 epochs of 6 batches, last.ckpt every 5 optimizer steps, train/loss logged at every step.
ARGS = [*QUICK, "--trainer.log_every_n_steps=1", "--last_checkpoint.every_n_steps=5"]


def fit(run_dir: Path, *args: str):
    return cli("fit", f"--trainer.default_root_dir={run_dir}", *ARGS, *args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    fit(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run stopped by SIGTERM at step 8: last.ckpt holds step 8, previous.ckpt step 5, a best checkpoint step 6."""
    folder = tmp_path_factory.mktemp("stopped")
    signal = {"class_path": "helpers.faults.SignalAt",
              "init_args": {"hook": "on_train_batch_end", "signal_name": "SIGTERM", "step": 8}}  # fmt: skip
    with pytest.raises(SystemExit):
        fit(folder / "run", "-c", extra_config(folder / "signal.yaml", callbacks=[signal]))
    return folder / "run"


@pytest.fixture
def copied(stopped, tmp_path) -> Path:
    """The stopped run, copied (its files' times too) for a test to damage."""
    return Path(shutil.copytree(stopped, tmp_path / "run"))


def checkpoint_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "checkpoints").iterdir())}


def flipped(path: Path, offset: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(data)


def copy_of(original: Path, data: bytes, path: Path) -> Path:
    """`data` written to `path`, with `original`'s digest beside it."""
    path.write_bytes(data)
    shutil.copyfile(digest_of(original), digest_of(path))
    return path


# --- Damage anywhere in a file is found ------------------------------------------------------------------------------


def test_a_byte_changed_anywhere_in_a_checkpoint_is_found(copied, tmp_path):
    """100 random offsets over the whole file, each byte changed to another random value: each is found. torch's
    loader takes most of these files without a word (a change inside a tensor's record), and the zip's own CRCs miss
    those in its headers and the pickle's framing; the digest covers every byte."""
    last = copied / "checkpoints" / "last.ckpt"
    original, rng = last.read_bytes(), random.Random(0)
    loaded, passed_the_zip_check = 0, 0
    for i in range(100):
        offset = rng.randrange(len(original))
        data = bytearray(original)
        data[offset] ^= rng.randrange(1, 256)
        damaged = copy_of(last, bytes(data), tmp_path / f"flip{i}.ckpt")
        why = damage(damaged)
        assert why is not None and why.startswith("its CRC-32 is ") and "says" in why, (offset, why)
        with contextlib.suppress(Exception):
            torch.load(damaged, weights_only=True)
            loaded += 1
        with contextlib.suppress(Exception), zipfile.ZipFile(damaged) as archive:
            passed_the_zip_check += archive.testzip() is None
    assert loaded > 50 and passed_the_zip_check > 0, (loaded, passed_the_zip_check)  # (95 and 7 of the 100)


def test_a_file_cut_short_grown_or_with_a_tail_of_zeros_is_found(copied, tmp_path):
    last = copied / "checkpoints" / "last.ckpt"
    original, rng = last.read_bytes(), random.Random(1)
    size = len(original)
    for i, length in enumerate([0, 1, size - 1, *(rng.randrange(size) for _ in range(20))]):
        damaged = copy_of(last, original[:length], tmp_path / f"cut{i}.ckpt")
        assert damage(damaged) == (
            f"it has {length:,} bytes, its digest {damaged.name}.crc32 says {size:,}: cut short or grown since it was "
            "written"
        )
    zeros = copy_of(last, original[: size - 4096] + bytes(4096), tmp_path / "zeros.ckpt")
    assert damage(zeros).startswith("its CRC-32 is ")
    grown = copy_of(last, original + b"\0", tmp_path / "grown.ckpt")
    assert "cut short or grown" in damage(grown)


def splice(target: bytes, source: bytes, name: str) -> bytes:
    """`target` with the record `name` taken from `source`: its data and its CRC, in the record's data descriptor and
    in the zip's central directory, so that the zip's own check passes."""
    out = bytearray(target)
    ours, theirs = record(target, name), record(source, name)
    assert ours[1] == theirs[1], "records of the same size"
    start, size, central = ours
    out[start : start + size] = source[theirs[0] : theirs[0] + size]
    crc = source[theirs[0] + size + 4 : theirs[0] + size + 8]  # (its data descriptor: PK\x07\x08, CRC, sizes)
    assert out[start + size : start + size + 4] == b"PK\x07\x08"
    out[start + size + 4 : start + size + 8] = crc
    out[central + 16 : central + 20] = crc
    return bytes(out)


def record(data: bytes, name: str) -> tuple[int, int, int]:
    """Where the record `name`'s data starts, its size, and where its entry in the central directory starts."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info, names, central = archive.getinfo(name), archive.namelist(), archive.start_dir
    n, m = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    for entry in names[: names.index(name)]:
        n_, m_, k = struct.unpack("<HHH", data[central + 28 : central + 34])
        central += 46 + n_ + m_ + k
        assert entry
    return info.header_offset + 30 + n + m, info.file_size, central


def tensors(checkpoint: dict) -> list[bytes]:
    """Every tensor of the model's and the optimizer's states, as bytes."""
    found = [*checkpoint["state_dict"].values()]
    found += [v for state in checkpoint["optimizer_states"] for p in state["state"].values() for v in p.values()]
    return [tensor.numpy().tobytes() for tensor in found if isinstance(tensor, torch.Tensor)]


def test_a_record_swapped_in_from_another_runs_checkpoint_is_found(copied, reference, tmp_path):
    """A weight's record from the uninterrupted run's last.ckpt, with its own CRC: the zip's own check passes, torch
    loads the mix, and the digest finds it."""
    ours, theirs = (run / "checkpoints" / "last.ckpt" for run in (copied, reference))
    mine, other = ours.read_bytes(), theirs.read_bytes()
    with zipfile.ZipFile(ours) as archive, zipfile.ZipFile(theirs) as others:
        name = max((i.filename for i in archive.infolist() if "/data/" in i.filename and archive.read(i) !=
                    others.read(i.filename)), key=lambda n: archive.getinfo(n).file_size)  # fmt: skip
    spliced = copy_of(ours, splice(mine, other, name), tmp_path / "spliced.ckpt")
    with zipfile.ZipFile(spliced) as archive:
        assert archive.testzip() is None  # the zip's own check cannot tell
    mixed, original = torch.load(spliced, weights_only=True), torch.load(ours, weights_only=True)
    assert tensors(mixed) != tensors(original), "the spliced record holds other values"
    assert damage(spliced).startswith("its CRC-32 is ")


def test_a_checkpoint_without_a_digest_is_read_as_before_with_the_zips_own_check(copied, tmp_path):
    """An earlier release's file (no digest): it evaluates; a change inside a record fails the zip's CRC, named."""
    best = next((copied / "checkpoints").glob("epoch=*.ckpt"))
    digest_of(best).unlink()
    assert damage(best) is None
    cli("validate", f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={best}")
    with zipfile.ZipFile(best) as archive:
        name = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size).filename
    start, size, _ = record(best.read_bytes(), name)
    flipped(best, start + size // 2)
    assert damage(best) == f"its record {name} fails the zip's CRC-32 (it has no digest {best.name}.crc32)"


# --- Every read checks ------------------------------------------------------------------------------------------------


def test_validate_test_predict_and_export_refuse_a_damaged_checkpoint_in_one_line(copied, tmp_path):
    best = next((copied / "checkpoints").glob("epoch=*.ckpt"))
    flipped(best, best.stat().st_size // 2)
    why = damage(best)
    expected = f"error: --ckpt_path {best} is damaged: {why}: use another checkpoint"
    for command in ("validate", "test", "predict"):
        with pytest.raises(SystemExit) as stop:
            cli(command, f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={best}")
        assert stop.value.code == expected, command
    with pytest.raises(SystemExit) as stop:
        export.main([f"--ckpt_path={best}", f"--output={tmp_path / 'model.pt2'}"])
    assert stop.value.code == expected
    with pytest.raises(SystemExit) as stop:
        export.main([f"--ckpt_path={best}", f"--output={tmp_path / 'whole.ckpt'}"])
    assert stop.value.code == f"error: {best} is damaged: {why}"
    assert not (tmp_path / "eval").exists() and not list(tmp_path.glob("model.*")) and not list(tmp_path.glob("whole*"))


def test_the_engines_trainer_refuses_a_damaged_checkpoint_before_loading_it(copied):
    """DurableCheckpointIO.load_checkpoint, Lightning's load path in the engine's Trainer without the CLI."""
    last, previous = copied / "checkpoints" / "last.ckpt", copied / "checkpoints" / "previous.ckpt"
    assert DurableCheckpointIO().load_checkpoint(previous)["global_step"] == 5
    flipped(last, 1000)
    with pytest.raises(ValueError, match=r"last\.ckpt is damaged: its CRC-32 is "):
        DurableCheckpointIO().load_checkpoint(last)


# --- The previous state --------------------------------------------------------------------------------------------


def damage_by(kind: str, path: Path) -> None:
    if kind == "flipped":
        flipped(path, path.stat().st_size // 3, 0x01)
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()


@pytest.mark.parametrize("kind", ["flipped", "truncated", "missing"])
def test_a_damaged_last_ckpt_resumes_from_previous_ckpt_and_ends_as_the_run_that_never_stopped(
    copied, reference, capsys, kind
):
    last, previous = copied / "checkpoints" / "last.ckpt", copied / "checkpoints" / "previous.ckpt"
    damage_by(kind, last)
    step = {"flipped": "(step 8) ", "truncated": "(its step cannot be read) "}
    why = f"{step[kind]}is damaged: {damage(last)}" if last.exists() else "is missing"
    resume(copied, *ARGS)
    notice = f"notice: {last} {why}: resuming from {previous}, the state before it (step 5)"
    assert notice in capsys.readouterr().err.splitlines()
    assert_same_run(reference, copied)  # weights, optimizer, generators, and every logged value
    assert damage(last) is None and torch.load(previous, weights_only=True)["global_step"] == 10


def test_the_first_save_after_going_on_from_previous_ckpt_keeps_it(copied):
    """The damaged last.ckpt is replaced, never kept as previous.ckpt: after the resumed run's one save (step 10),
    previous.ckpt still holds the state it went on from, whole."""
    last, previous = copied / "checkpoints" / "last.ckpt", copied / "checkpoints" / "previous.ckpt"
    flipped(last, last.stat().st_size // 2)
    resume(copied, *ARGS, "--trainer.max_steps=10")
    assert damage(previous) is None and torch.load(previous, weights_only=True)["global_step"] == 5
    assert damage(last) is None and torch.load(last, weights_only=True)["global_step"] == 10


def test_only_the_best_checkpoints_written_after_the_state_a_resume_goes_on_from_are_removed(tmp_path, capsys):
    """Every best checkpoint kept (save_top_k -1: steps 6 and 12), the run directory moved (Lightning's ModelCheckpoint
    then knows none of them) and its last.ckpt (step 12) damaged: the resume goes on from step 10 and removes the one
    of step 12 alone, which it writes again; the one of step 6, whose state was taken before, stays."""
    fit(tmp_path / "first", "--checkpoint.save_top_k=-1")
    run_dir = (tmp_path / "first").rename(tmp_path / "moved")
    best = sorted(p.name for p in (run_dir / "checkpoints").glob("epoch=*.ckpt"))
    assert [name[:8] for name in best] == ["epoch=0-", "epoch=1-"]
    flipped(run_dir / "checkpoints" / "last.ckpt", 4000)
    resume(run_dir, *ARGS, "--checkpoint.save_top_k=-1")
    removed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice: removed ")]
    assert removed == [f"notice: removed {best[1]} from {run_dir / 'checkpoints'}: written by a stopped run after step "
                       "10, where this fit goes on, and unknown to it"]  # fmt: skip
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("epoch=*.ckpt")) == best


def test_with_nothing_good_left_a_resume_stops_in_one_line_and_changes_nothing(copied):
    last, previous = copied / "checkpoints" / "last.ckpt", copied / "checkpoints" / "previous.ckpt"
    flipped(last, last.stat().st_size // 2)  # (in a tensor's record: its step can be read)
    previous.write_bytes(previous.read_bytes()[:100])
    before = {p: p.read_bytes() for p in copied.rglob("*") if p.is_file() and p.name != ".lock"}
    with pytest.raises(SystemExit) as stop:
        fit(copied, "--ckpt_path=last")
    assert stop.value.code == (
        f"error: {last} (step 8) is damaged: {damage(last)}, and {previous} (its step cannot be read) is damaged: "
        f"{damage(previous)}: nothing to resume from; resume from a best checkpoint beside them with --ckpt_path "
        "FILE, or give a new --trainer.default_root_dir"
    )
    assert {p: p.read_bytes() for p in copied.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_keep_previous_false_keeps_last_ckpt_alone(tmp_path):
    run_dir = tmp_path / "run"
    fit(run_dir, "--last_checkpoint.keep_previous=false")
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("epoch="))
    assert names == ["last.ckpt", "last.ckpt.crc32"]
    flipped(run_dir / "checkpoints" / "last.ckpt", 3000)
    with pytest.raises(SystemExit) as stop:
        fit(run_dir, "--ckpt_path=last", "--last_checkpoint.keep_previous=false")
    assert f"and {run_dir / 'checkpoints' / 'previous.ckpt'} is missing: nothing to resume from" in stop.value.code


class Crash(BaseException):
    """The process ends here (a BaseException: no handler of the engine's takes it for a failed write)."""


@pytest.mark.parametrize("at", range(1, 8))
def test_a_crash_at_any_instant_of_a_save_leaves_the_newest_state_or_the_one_before_whole(tmp_path, monkeypatch, at):
    """last.ckpt holds state 1 and previous.ckpt state 0; the save of state 2 ends at its `at`-th rename or link (the
    7th: none, it completes). Afterwards one of the two files matches its digest and holds state 2 or state 1."""
    io_, last, previous = DurableCheckpointIO(), tmp_path / "last.ckpt", tmp_path / "previous.ckpt"
    for state in (0, 1):
        io_.save_checkpoint({"state": state}, last, storage_options={"previous": previous})
    calls, real = [], {"replace": os.replace, "link": os.link}

    def counted(name):
        def call(*args, **kwargs):
            calls.append(name)
            if len(calls) == at:
                raise Crash
            return real[name](*args, **kwargs)

        return call

    monkeypatch.setattr(durable.os, "replace", counted("replace"))
    monkeypatch.setattr(durable.os, "link", counted("link"))
    with contextlib.suppress(Crash):
        io_.save_checkpoint({"state": 2}, last, storage_options={"previous": previous})
    monkeypatch.undo()
    whole = {path.name: torch.load(path)["state"] for path in (last, previous) if path.exists() and not damage(path)}
    assert set(whole.values()) & {1, 2}, whole
    if at == 7:
        assert whole == {"last.ckpt": 2, "previous.ckpt": 1} and calls == ["link", "replace"] * 2 + ["replace"] * 2


# --- The run folder holds what the docs say --------------------------------------------------------------------------


def folder_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_run_killed_after_a_best_checkpoint_newer_than_last_ckpt_ends_with_the_uninterrupted_runs_files(
    tmp_path, tmp_path_factory, capsys
):
    """save_top_k 2, 19-batch epochs, last.ckpt every 5 steps: killed at step 40, after epoch 1's best checkpoint
    (step 38), last.ckpt holding step 35. The resumed run removes that best checkpoint before it writes it again: the
    folder ends with the uninterrupted run's 2 best checkpoints and last.ckpt, named alike (no `-v1`)."""
    args = ["--checkpoint.save_top_k=2"]
    run_dir = assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end", step=40)
    assert folder_names(run_dir) == folder_names(reference_run(tmp_path_factory, args))
    assert len([name for name in folder_names(run_dir) if name.startswith("epoch=") and name.endswith(".ckpt")]) == 2
    notice = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice: removed ")]
    assert len(notice) == 1 and notice[0].startswith("notice: removed epoch=1-val_acc=")
    assert notice[0].endswith(": written by a stopped run after step 35, where this fit goes on, and unknown to it")


@pytest.mark.slow
def test_a_fresh_start_over_a_run_killed_before_its_first_last_ckpt_leaves_its_best_checkpoints_out(
    tmp_path, tmp_path_factory, capsys
):
    """last.ckpt at epoch ends only; killed at epoch 1's start, after epoch 0's best checkpoint, before the write of
    last.ckpt (at the hook after the epoch's end): `fit --ckpt_path last` starts afresh, without the killed run's best
    checkpoint beside its own."""
    from helpers.runs import freeze_config, kill_when_frozen

    args = ["--last_checkpoint.every_n_steps=0", "--checkpoint.save_top_k=2"]
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_epoch_start", step=19), *args)
    kill_when_frozen(process, tmp_path / "frozen")
    assert [name for name in folder_names(run_dir) if name.endswith(".ckpt")] != []
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
    resume_fit(run_dir, *args)
    assert folder_names(run_dir) == folder_names(reference_run(tmp_path_factory, args))
    assert "notice: removed epoch=0-val_acc=" in capsys.readouterr().err
