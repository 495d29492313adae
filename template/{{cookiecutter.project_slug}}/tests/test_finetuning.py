"""Fine-tuning a pretrained backbone with Lightning's own BackboneFinetuning on the training recipe: the group it adds
joins the schedule and the decay rule, and a run stopped before, during or after the unfreeze and resumed ends
bit-identical to the run that never stopped (resume/trained_state.py puts the trainable flags back)."""

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
import yaml

from template_package.engine.resume import trained_state

from helpers.cli import PROJECT_ROOT, QUICK, cli, resume, scalars
from helpers.finetune_task import save_pretrained
from helpers.runs import (
    assert_same_run,
    freeze_config,
    kill_when_frozen,
    reference_run,
    resume_fit,
    start_fit,
    wait_until_frozen,
)

FINETUNING = "lightning.pytorch.callbacks.BackboneFinetuning"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    return save_pretrained(tmp_path_factory.mktemp("pretrained") / "backbone.pt")


@pytest.fixture(scope="module")
def pretrained_with_batch_norm(tmp_path_factory) -> Path:
    return save_pretrained(tmp_path_factory.mktemp("pretrained") / "backbone.pt", batch_norm=True)


def task(folder: Path, pretrained: Path, *callbacks: dict, batch_norm: bool = False) -> list[str]:
    """The fine-tuning task's options: the model, 4 epochs of 6 batches, the callbacks in a config of their own."""
    text = yaml.safe_dump({"trainer": {"callbacks+": list(callbacks)}})
    config = folder / f"callbacks-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"  # (reference_run's key)
    config.write_text(text)
    return ["--model=helpers.finetune_task.FineTuned", f"--model.backbone_path={pretrained}",
            f"--model.batch_norm={batch_norm}", "--trainer.max_epochs=4", "--trainer.limit_train_batches=6",
            "--last_checkpoint.every_n_steps=3", "-c", str(config)]  # fmt: skip


def finetuning(**init_args) -> dict:
    return {"class_path": FINETUNING, "init_args": {"unfreeze_backbone_at_epoch": 1, **init_args}}


def test_the_group_backbone_finetuning_adds_joins_the_schedule_and_the_decay_rule(tmp_path, pretrained):
    run_dir = tmp_path / "run"
    args = task(tmp_path, pretrained, finetuning(lambda_func="helpers.finetune_task.twice"))
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, *args, "--trainer.max_epochs=3",
        "--trainer.log_every_n_steps=1", "--trainer.enable_checkpointing=true")  # fmt: skip
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    assert [group.get("name") for group in groups] == [None, None, "backbone", "backbone.no_decay"]
    shapes = [checkpoint["state_dict"][name].ndim for name in checkpoint["state_dict"] if "backbone" in name]
    assert len(groups[2]["params"]) == sum(ndim >= 2 for ndim in shapes) and groups[2]["weight_decay"] == 0.05
    assert len(groups[3]["params"]) == sum(ndim < 2 for ndim in shapes) and groups[3]["weight_decay"] == 0.0
    assert groups[1]["weight_decay"] == 0.0  # the head's bias
    pretrained_weights = torch.load(pretrained, weights_only=True)
    assert not torch.equal(checkpoint["state_dict"]["backbone.embed.weight"], pretrained_weights["embed.weight"])
    lrs, backbone = dict(scalars(run_dir)["lr"]), dict(scalars(run_dir)["lr/backbone"])
    assert sorted(backbone) == list(range(6, 18))  # from the unfreeze epoch's first step
    # It joins at a tenth of the head's rate (backbone_initial_ratio_lr) and keeps that ratio through the epoch;
    # each later epoch starts at the callback's rate x 2 (lambda_func), as the callback says, and the schedule
    # goes on from there.
    for step in range(6, 12):
        assert backbone[step] == pytest.approx(0.1 * lrs[step], rel=1e-6)
    assert backbone[12] == pytest.approx(2 * backbone[6], rel=1e-6)
    for step in range(12, 18):
        assert backbone[step] / lrs[step] == pytest.approx(backbone[12] / lrs[12], rel=1e-6)


KILLS = {  # SIGKILLed at these points; last.ckpt then at this step (6 steps an epoch, the unfreeze at epoch 1; the
    # state of an epoch's end is written at the next epoch's start, so the kill comes at its first step)
    "at_the_epoch_end_before_the_unfreeze": ({"hook": "on_train_batch_end", "step": 7}, 6),
    "mid_epoch_after_the_unfreeze": ({"hook": "on_train_batch_end", "step": 10}, 9),
    "at_the_end_of_the_unfreeze_epoch": ({"hook": "on_train_batch_end", "step": 13}, 12),
}


@pytest.mark.slow
@pytest.mark.parametrize("kill", KILLS.values(), ids=KILLS.keys())
def test_a_fine_tuning_run_killed_and_resumed_is_bit_identical(tmp_path, tmp_path_factory, pretrained, kill):
    freeze, saved_step = kill
    args = task(tmp_path_factory.getbasetemp(), pretrained, finetuning())
    reference = reference_run(tmp_path_factory, args)
    run_dir = killed_run(tmp_path, args, freeze, saved_step)
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)


@pytest.mark.slow
def test_a_base_finetuning_of_a_users_own_killed_after_its_unfreeze_resumes_bit_identical(
    tmp_path, tmp_path_factory, pretrained
):
    args = task(tmp_path_factory.getbasetemp(), pretrained, {"class_path": "helpers.finetune_task.EncoderFinetuning"})
    reference = reference_run(tmp_path_factory, args)
    run_dir = killed_run(tmp_path, args, *KILLS["mid_epoch_after_the_unfreeze"])
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)
    groups = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]
    assert [group.get("name") for group in groups["param_groups"]][-2:] == ["backbone", "backbone.no_decay"]


@pytest.mark.slow
def test_without_train_bn_and_without_the_put_back_a_resumed_run_differs(
    tmp_path, tmp_path_factory, pretrained_with_batch_norm, monkeypatch
):
    """train_bn=False: BaseFinetuning switches the BatchNorm's running statistics off while frozen, on when
    unfrozen. Exact once put back; without the put back (the negative control) the backbone stays frozen."""
    args = task(tmp_path_factory.getbasetemp(), pretrained_with_batch_norm, finetuning(train_bn=False), batch_norm=True)
    reference = reference_run(tmp_path_factory, args)
    freeze, saved_step = KILLS["mid_epoch_after_the_unfreeze"]
    run_dir = killed_run(tmp_path, args, freeze, saved_step)
    control = tmp_path / "control"
    shutil.copytree(run_dir, control)
    killed = torch.load(control / "checkpoints" / "last.ckpt", weights_only=True)
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)

    monkeypatch.setattr(trained_state, "put_back", lambda module, saved: None)
    resume_fit(control, *args)
    ref, got = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True) for d in (reference, control))
    name = "backbone.embed.weight"
    assert torch.equal(got["state_dict"][name], killed["state_dict"][name])  # frozen for the rest of the run
    assert not torch.equal(ref["state_dict"][name], got["state_dict"][name])


@pytest.mark.slow
def test_a_fine_tuning_run_stopped_by_sigterm_after_the_unfreeze_resumes_bit_identical(
    tmp_path, tmp_path_factory, pretrained
):
    args = task(tmp_path_factory.getbasetemp(), pretrained, finetuning())
    reference = reference_run(tmp_path_factory, args)
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=8), *args)
    wait_until_frozen(process, tmp_path / "frozen")
    os.killpg(process.pid, signal.SIGTERM)
    os.killpg(process.pid, signal.SIGCONT)
    process.communicate(timeout=120)
    assert process.returncode == 143
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)


def killed_run(tmp_path: Path, args: list[str], freeze: dict, saved_step: int) -> Path:
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, **freeze), *args)
    kill_when_frozen(process, tmp_path / "frozen")
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == saved_step
    return run_dir


def test_a_hook_that_changes_an_lr_on_a_restart_stops_the_resumed_run_in_one_line(tmp_path, pretrained):
    run_dir = tmp_path / "run"
    args = task(tmp_path, pretrained, {"class_path": "helpers.finetune_task.DoubleLrOnRestart"})
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, *args, "--trainer.max_epochs=1")
    with pytest.raises(SystemExit) as stop:
        resume(run_dir, *QUICK, *args)
    assert str(stop.value.code).startswith(
        "error: the resumed run is not set up as the checkpoint was: optimizer 0's param group 0 has lr "
    ), stop.value.code


def test_lr_scale_trains_a_submodule_at_its_own_rate_through_the_schedule(tmp_path, pretrained):
    run_dir = tmp_path / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, *task(tmp_path, pretrained),
        '--model.lr_scale={"backbone": 0.1}', "--trainer.log_every_n_steps=1")  # fmt: skip
    groups = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]["param_groups"]
    assert [group.get("name") for group in groups] == [None, None, "backbone", "backbone.no_decay"]
    logged = scalars(run_dir)
    lrs, backbone = dict(logged["lr"]), dict(logged["lr/backbone"])
    assert sorted(backbone) == sorted(lrs) == list(range(24))
    for step, lr in lrs.items():
        assert backbone[step] == pytest.approx(0.1 * lr, rel=1e-6)


def test_lr_scale_and_backbone_finetunings_ratio_together_are_refused_in_one_line(tmp_path, pretrained):
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={tmp_path / 'run'}", *QUICK, *task(tmp_path, pretrained, finetuning()),
            '--model.lr_scale={"backbone": 0.1}')  # fmt: skip
    assert str(stop.value.code) == (
        "error: model.lr_scale sets the backbone's LR and so does BackboneFinetuning's backbone_initial_ratio_lr: "
        "keep one (drop 'backbone' from model.lr_scale, or the callback)"
    )


@pytest.mark.slow
def test_backbone_finetuning_under_sharded_training_is_refused_in_one_line(tmp_path, pretrained):
    fsdp = ["-c", str(PROJECT_ROOT / "configs" / "fsdp.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=2",
            "--trainer.precision=32-true"]  # fmt: skip
    process = start_fit(tmp_path / "run", *task(tmp_path, pretrained, finetuning()), *fsdp)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1
    assert err.strip().splitlines()[-1] == (
        "error: BackboneFinetuning does not work under sharded training (configs/fsdp.yaml): Lightning's "
        "BaseFinetuning finds the optimizer's parameters by identity, which sharding replaces; fine-tune with DDP "
        "(--trainer.strategy ddp)"
    )
