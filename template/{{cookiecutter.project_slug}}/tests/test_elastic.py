"""A run resumed on another number of processes (`fit --ckpt_path last --allow_change world_size`, batch_layout.py):
the same samples at every optimizer step as the run that never stopped, the same schedule and step counts, and losses
and weights equal up to floating-point summation order. Real processes: 2-process DDP on CPU (gloo) by Lightning's
launcher, SIGKILLed and resumed on 1 process; a 1-process run SIGKILLed and resumed on 2."""

import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from template_package.engine.data.loaders import resumable_loader
from template_package.engine.data.sampling import EpochShuffleSampler
from template_package.engine.resume.durable import DurableCheckpointIO
from template_package.engine.training.batch_layout import BatchLayout

from helpers.cli import cli, extra_config, resume, scalars
from helpers.elastic_task import recorded_steps
from helpers.records import record
from helpers.runs import DDP, finish, kill_when_frozen, start_fit

# The stand-in without BatchNorm, each sample's index in its batch; 2 epochs of 19 global batches of 64 samples
# (1,257 samples: the last 41 of each epoch's order are left out).
TASK = ["--model=helpers.elastic_task.IndexedStandIn", "--data=helpers.elastic_task.IndexedStandInData",
        "--trainer.max_epochs=2", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1",
        "--checkpoint.monitor=null"]  # fmt: skip
ON_2 = [*DDP, "--data.batch_size=32"]  # 2 x 32 x 1
ON_1 = ["--data.batch_size=16", "--trainer.accumulate_grad_batches=4"]  # 1 x 16 x 4
STEPS = 2 * 19
# The runs sum the same gradients in another order (per-device means, gloo's all-reduce, the accumulation): float32
# rounding. Measured after 38 steps: a step's loss differs by at most 5e-7, a weight (up to 0.39) by 6e-8.
TOLERANCE = 1e-5


def killed_run(tmp_path: Path, args: list[str], step: int = 12, every: int = 5, saved: int = 10) -> tuple[Path, Path]:
    """A run frozen after optimizer step `step` and SIGKILLed, with last.ckpt every `every` steps (0: at epoch ends),
    its last.ckpt then at step `saved`; its directory and records."""
    config, records = record(tmp_path, "killed")
    frozen = {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end", "step": step}
    freeze = {"class_path": "helpers.kill_points.FreezeAt", "init_args": frozen}
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, *TASK, *args, "-c", config, "-c", extra_config(tmp_path / "freeze.yaml", [freeze]),
                        f"--last_checkpoint.every_n_steps={every}")  # fmt: skip
    kill_when_frozen(process, tmp_path / "frozen")
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == saved
    return run_dir, records


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict[int, dict], dict, list]:
    """The 2-process run that never stopped: its records, final checkpoint and logged train/loss."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    config, records = record(folder, "records")
    finish(start_fit(folder / "run", *TASK, *ON_2, "-c", config))
    checkpoint = torch.load(folder / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    return recorded_steps(records), checkpoint, scalars(folder / "run")["train/loss"]


def assert_same_steps(reference: tuple[dict[int, dict], dict, list], steps: dict[int, dict], run_dir: Path) -> None:
    """The same samples at every optimizer step, losses (recorded, and logged: the global batch's) and weights
    within TOLERANCE, the same schedule."""
    ref_steps, ref_checkpoint, ref_logged = reference
    assert sorted(steps) == sorted(ref_steps) == list(range(1, STEPS + 1))
    for step, ref in ref_steps.items():
        assert steps[step]["indices"] == ref["indices"], f"step {step} read other samples"
        assert steps[step]["loss"] == pytest.approx(ref["loss"], abs=TOLERANCE), f"step {step}"
    logged = scalars(run_dir)["train/loss"]
    assert [step for step, _ in logged] == [step for step, _ in ref_logged] == list(range(STEPS))
    for (step, loss), (_, ref_loss) in zip(logged, ref_logged, strict=True):
        assert loss == pytest.approx(ref_loss, abs=TOLERANCE), f"logged train/loss at step {step}"
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == ref_checkpoint["global_step"] == STEPS
    for name, weight in ref_checkpoint["state_dict"].items():
        difference = (checkpoint["state_dict"][name] - weight).abs().max().item()
        assert difference < TOLERANCE, f"{name} differs by {difference}"
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == ref_checkpoint["lr_schedulers"][0]["last_epoch"]
    assert checkpoint["lr_schedulers"][0]["_last_lr"] == pytest.approx(ref_checkpoint["lr_schedulers"][0]["_last_lr"])


@pytest.mark.slow
def test_two_processes_killed_and_resumed_on_one_read_the_uninterrupted_runs_samples(
    tmp_path, uninterrupted, monkeypatch
):
    run_dir, killed = killed_run(tmp_path, ON_2)
    control = tmp_path / "control"
    shutil.copytree(run_dir, control)
    config, resumed = record(tmp_path, "resumed")
    # Stopped again at step 20 (max_steps) and restarted on the same 1 process: it keeps the moved layout.
    resume(run_dir, *TASK, "--data.batch_size=32", "-c", config, "--allow_change=world_size", "--trainer.max_steps=20")
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 20
    assert checkpoint["batch_layout"]["world_size"] == 1 and checkpoint["batch_layout"]["accumulate"] == 2  # 1x32x2
    config, restarted = record(tmp_path, "restarted")
    resume(run_dir, *TASK, "--data.batch_size=32", "-c", config)
    assert_same_steps(uninterrupted, recorded_steps(killed, resumed, restarted), run_dir)

    # Negative control: the resumed epoch read from its start, not from the global position where the run stopped.
    monkeypatch.setattr(EpochShuffleSampler, "resume_at", lambda self, epoch, position: None)
    config, repeated = record(tmp_path, "repeated")
    resume(control, *TASK, "--data.batch_size=32", "-c", config, "--allow_change=world_size")
    steps = recorded_steps(killed, repeated)
    assert steps[11]["indices"] == uninterrupted[0][1]["indices"]  # step 11 read step 1's samples again
    with pytest.raises(AssertionError, match="step 11 read other samples"):
        assert_same_steps(uninterrupted, steps, control)


@pytest.mark.slow
def test_a_run_moved_from_an_epoch_end_checkpoint_trains_every_remaining_epoch(tmp_path, uninterrupted):
    """2 processes with last.ckpt at epoch ends only, SIGKILLed in the first batch of epoch 1 (its last.ckpt: epoch 0's
    end, step 19), resumed on 1: epoch 1 is trained whole, as the run that never stopped trained it."""
    run_dir, killed = killed_run(tmp_path, ON_2, step=20, every=0, saved=19)
    config, resumed = record(tmp_path, "resumed")
    resume(run_dir, *TASK, "--data.batch_size=32", "-c", config, "--allow_change=world_size")
    assert_same_steps(uninterrupted, recorded_steps(killed, resumed), run_dir)


@pytest.mark.slow
def test_one_process_killed_and_resumed_on_two_read_the_uninterrupted_runs_samples(tmp_path, uninterrupted):
    run_dir, killed = killed_run(tmp_path, ON_1)
    config, resumed = record(tmp_path, "resumed")
    finish(start_fit(run_dir, *TASK, *ON_1, *DDP, "-c", config, "--ckpt_path=last", "--allow_change=world_size"))
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["batch_layout"]["world_size"] == 2 and checkpoint["batch_layout"]["accumulate"] == 2  # 2x16x2
    assert_same_steps(uninterrupted, recorded_steps(killed, resumed), run_dir)


def test_each_optimizer_step_reads_the_same_global_positions_whatever_the_layout():
    """Step s reads positions [s * G, (s + 1) * G) of the epoch's order, on any (processes, batch, accumulation)."""
    whole = EpochShuffleSampler(1257, seed=3, global_batch=64)
    whole.set_epoch(1)
    order = list(whole)
    assert len(order) == 19 * 64
    for world_size, batch_size, accumulate in [(1, 64, 1), (2, 32, 1), (1, 16, 4), (4, 8, 2), (8, 8, 1)]:
        ranks = [EpochShuffleSampler(1257, 3, batch_size, world_size, r, global_batch=64) for r in range(world_size)]
        for sampler in ranks:
            sampler.set_epoch(1)
        batches = [list(sampler) for sampler in ranks]
        assert all(len(b) == 19 * accumulate for b in batches)
        for step in range(19):
            window = [i for b in batches for batch in b[step * accumulate : (step + 1) * accumulate] for i in batch]
            assert sorted(window) == sorted(order[step * 64 : (step + 1) * 64]), (world_size, batch_size, step)
        # Resumed at step 7 on this layout: the steps after it, nothing before.
        for sampler in ranks:
            sampler.resume_at(1, 7 * 64)
        rest = [list(sampler) for sampler in ranks]
        assert [r for r in rest] == [b[7 * accumulate :] for b in batches]


def test_the_global_batch_is_kept_on_another_number_of_processes():
    layout = BatchLayout(2, 32, 1, asked=(32, 1))
    assert layout.on(1) == BatchLayout(1, 32, 2, (32, 1))  # the batch size kept: the same memory per device
    assert layout.on(4) == BatchLayout(4, 16, 1, (32, 1))
    assert layout.on(8).global_batch == layout.on(64).global_batch == 64
    assert BatchLayout(1, 48, 1, (48, 1)).on(2) == BatchLayout(2, 24, 1, (48, 1))
    with pytest.raises(Exception, match="global batch of 64 samples .* does not split over 3 processes"):
        layout.on(3)


class Draws(Dataset):
    """A random number drawn for each sample in __getitem__, as a random augmentation does."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int):
        return index, torch.rand(())


def test_each_sample_draws_the_same_random_numbers_on_any_number_of_processes():
    def draws(world_size: int, batch_size: int) -> dict[int, float]:
        got = {}
        for rank in range(world_size):
            loader = resumable_loader(DataLoader(Draws(), batch_size=batch_size, shuffle=True, drop_last=True), seed=5,
                                      epoch=2, num_replicas=world_size, rank=rank, global_batch=40)  # fmt: skip
            for indices, values in loader:
                got.update(zip(indices.tolist(), values.tolist(), strict=True))
        return got

    one, two = draws(1, 40), draws(2, 10)
    assert len(one) == 200 and one == two


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("short") / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false")  # fmt: skip
    return run_dir


def saved_by_two(run_dir: Path, layout: dict | None) -> None:
    """Make the run's last.ckpt one that 2 processes saved, with `layout` (None: none recorded)."""
    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["rng_states"] = {name: rows.repeat(2, *[1] * (rows.dim() - 1))
                                for name, rows in checkpoint["rng_states"].items()}  # fmt: skip
    if layout is None:
        del checkpoint["batch_layout"]
    else:
        checkpoint["batch_layout"] = layout
    DurableCheckpointIO().save_checkpoint(checkpoint, path)  # (with its digest, as a run writes it)


LAYOUT = {"world_size": 2, "batch_size": 32, "accumulate": 1, "asked": [32, 1]}


@pytest.mark.parametrize(
    "layout, devices, args, says",
    [
        (
            LAYOUT,
            1,
            [],
            " (trainer.num_nodes x trainer.devices): resume it on 2, or add --allow_change world_size to "
            "go on with the same global batch (README: Resuming on another number of processes)",
        ),
        (
            None,
            1,
            ["--allow_change=world_size"],
            ", and its train loader cannot go on on another number of processes: it "
            "records no batch layout (written by an older version): resume it on 2",
        ),
        (
            {**LAYOUT, "batch_size": 25},
            3,
            ["--allow_change=world_size"],
            ": the run's global batch of 50 samples (2 "
            "processes x 25 x 1 accumulated) does not split over 3 processes: resume it on a number of processes that "
            "divides 50",
        ),
        (
            LAYOUT,
            1,
            ["--allow_change=world_size,trainer.limit_train_batches", "--trainer.limit_train_batches=5"],
            ", and trainer.limit_train_batches=5 counts each process's batches: leave it out to go on on another "
            "number of processes",
        ),
    ],
    ids=["not_asked", "no_layout", "no_even_split", "limited_batches"],
)
def test_a_resume_on_another_number_of_processes_that_cannot_go_on_costs_one_line(
    short_run, tmp_path, layout, devices, args, says
):
    run_dir = tmp_path / "run"
    shutil.copytree(short_run, run_dir)
    saved_by_two(run_dir, layout)
    files = lambda: {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}  # noqa: E731
    before = files()
    on = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", f"--trainer.devices={devices}"] if devices > 1 else []
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", "--trainer.max_epochs=1",
            "--trainer.limit_val_batches=1", *on, *args)  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    saved = f"error: --ckpt_path {last} was saved by 2 processes"
    assert str(stop.value.code) == f"{saved} and this run has {devices}{says}"
    assert files() == before


@pytest.mark.slow
def test_a_plain_module_with_clipping_acting_moved_from_two_processes_to_one_ends_as_its_two_process_run(
    tmp_path, capsys
):
    """A plain LightningModule (AdamW, Lightning's clipping by norm at 1.0, acting on most steps), killed on 2
    processes and resumed on 1: its weights within TOLERANCE of the 2-process run that never stopped, as with
    clipping off (a clip of a partial gradient or of each micro-batch would differ by far more)."""
    plain = [*TASK, "--model=helpers.elastic_task.PlainIndexed"]
    reference = tmp_path / "reference"
    process = start_fit(reference, *plain, *ON_2)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    clipped = int(out.split("clipped steps: ")[1].split()[0])
    assert clipped > STEPS // 2, clipped  # clipping acts on most steps
    run_dir, _ = killed_run(tmp_path, plain + ON_2)
    capsys.readouterr()
    resume(run_dir, *plain, "--data.batch_size=32", "--allow_change=world_size")
    assert "notice: this run moved" not in capsys.readouterr().err  # no draws, no BatchNorm: nothing to say
    ref, got = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True) for d in (reference, run_dir))
    assert got["global_step"] == ref["global_step"] == STEPS and got["batch_layout"]["world_size"] == 1
    for name, weight in ref["state_dict"].items():
        difference = (got["state_dict"][name] - weight).abs().max().item()
        assert difference < TOLERANCE, f"{name} differs by {difference}"


@pytest.mark.slow
def test_a_move_with_dropout_and_batch_norm_says_so_in_its_notices(tmp_path, capsys):
    """The stand-in with BatchNorm and dropout moved from 2 processes to 1: the first resumed step draws dropout's
    random numbers, and BatchNorm's statistics are per device; each is said once before the run goes on."""
    task = [
        *TASK,
        "--model=helpers.stand_in.StandInClassifier",
        "--model.dropout=0.1",
        "--data=helpers.stand_in.StandInData",
    ]
    run_dir = tmp_path / "run"
    frozen = {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end", "step": 7}
    freeze = {"class_path": "helpers.kill_points.FreezeAt", "init_args": frozen}
    process = start_fit(run_dir, *task, *ON_2, "-c", extra_config(tmp_path / "freeze.yaml", [freeze]),
                        "--last_checkpoint.every_n_steps=5")  # fmt: skip
    kill_when_frozen(process, tmp_path / "frozen")
    capsys.readouterr()
    resume(run_dir, *task, "--data.batch_size=32", "--allow_change=world_size", "--trainer.max_steps=8")
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice: this run moved")]
    assert notices == [
        "notice: this run moved from 2 to 1 processes and goes on inexactly: the model's BatchNorm layers (net.1, "
        "net.4) compute their statistics per device and per batch, which another layout changes, so from here it "
        "differs from the run that never moved",
        "notice: this run moved from 2 to 1 processes and goes on inexactly: its first step drew random numbers from "
        "torch's generators (dropout, say), and each process draws its own, so from here it differs from the run that "
        "never moved",
    ]
