"""Negative controls: each piece of the exact-resume machinery, switched off, makes its kill-and-resume comparison
fail. Proof that the resume tests can fail, and that each piece is needed."""

import pytest
import torch

from helpers.runs import (
    KILL_POINTS,
    assert_same_run,
    freeze_config,
    kill_when_frozen,
    log_steps_against_last_ckpt,
    reference_run,
    resume_fit,
    start_fit,
    weights_with_workers,
)

pytestmark = pytest.mark.slow


def killed_then_resumed_without(tmp_path, monkeypatch, args: list[str], mechanism: str, **kill_point):
    """Kill a run at `kill_point`, resume it in this process with `mechanism` switched off; returns its run directory.

    rng_restore: ExactResume does not restore the random states; loader_state: the loader does not restore its
    position; sampler_epoch: the engine's train loader starts at epoch 0's order, whatever the epoch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from template_package.engine.data import loaders
    from template_package.engine.resume.rng import RandomStates

    run_dir = tmp_path / "run"
    kill_when_frozen(start_fit(run_dir, "-c", freeze_config(tmp_path, **kill_point), *args), tmp_path / "frozen")
    if mechanism == "rng_restore":
        monkeypatch.setattr(RandomStates, "restore", lambda self, trainer, pl_module: None)
    elif mechanism == "loader_state":
        monkeypatch.setattr(StatefulDataLoader, "load_state_dict", lambda self, state_dict: None)
    else:
        rebuild = loaders.resumable_loader
        monkeypatch.setattr(loaders, "resumable_loader",
                            lambda loader, seed, epoch, *a, **kw: rebuild(loader, seed, 0, *a, **kw))  # fmt: skip
    resume_fit(run_dir, *args)
    return run_dir


@pytest.mark.parametrize(
    "mechanism, args, kill_point",
    [("rng_restore", ["--model.dropout=0.2"], "mid_epoch"),
     ("loader_state", [], "mid_epoch"),
     ("sampler_epoch", [], "mid_second_epoch")],
    ids=["rng_restore", "loader_state", "sampler_epoch"],
)  # fmt: skip
def test_without_it_a_resumed_run_is_not_exact(tmp_path, tmp_path_factory, monkeypatch, mechanism, args, kill_point):
    reference = reference_run(tmp_path_factory, args)
    run_dir = killed_then_resumed_without(tmp_path, monkeypatch, args, mechanism, **KILL_POINTS[kill_point])
    with pytest.raises(AssertionError):
        assert_same_run(reference, run_dir)


def test_without_it_a_checkpoint_goes_live_before_its_steps_are_logged(run_dir, monkeypatch):
    """ExactResume writes a state at the hook after it was taken, once Lightning has logged the step before it:
    written at once instead, last.ckpt holds step S while step S-1 is not yet logged."""

    from template_package.engine.resume.exact_resume import ExactResume

    stage = ExactResume._stage

    def stage_and_write_at_once(self, trainer):
        stage(self, trainer)
        self._write_staged(trainer)
        self._wait_for_write()

    monkeypatch.setattr(ExactResume, "_stage", stage_and_write_at_once)
    seen = log_steps_against_last_ckpt(run_dir, monkeypatch)
    assert any(step < saved for step, saved in seen)


def test_without_it_random_draws_depend_on_the_number_of_workers(tmp_path, monkeypatch):
    """SeededSamples seeds each sample's draws (the stand-in's noise) from (seed, epoch, index); drawn from each
    worker's own generator instead, 0 and 2 workers train different bits (tests/test_loaders.py: the same bits)."""

    from template_package.engine.data.sampling import SeededSamples

    monkeypatch.setattr(SeededSamples, "_read", lambda self, key: self.dataset[key[1]])  # (unseeded)
    weights = weights_with_workers(tmp_path, (0, 2))
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
