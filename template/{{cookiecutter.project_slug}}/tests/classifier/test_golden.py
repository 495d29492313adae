"""The golden loss curve (tests/golden.py): today's template trains the stored per-step losses, and a checkpoint
written by the release that stored them still resumes, to the same losses. Regenerate on purpose only:
`python tests/golden.py`."""

import json

import pytest
import torch

from helpers.golden import ARGS, CHECKPOINT, CURVE, RELATIVE_TOLERANCE, machine, run


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(CURVE.read_text())


def assert_same_curve(losses: list, expected: list, written_on: dict) -> None:
    steps = [step for step, _ in expected]
    assert [step for step, _ in losses] == steps
    values, expected_values = [v for _, v in losses], [v for _, v in expected]
    if machine() == written_on:  # the same CPU, torch and threads: the same bits
        assert values == expected_values
    else:
        assert values == pytest.approx(expected_values, rel=RELATIVE_TOLERANCE)


def test_the_default_run_trains_the_golden_losses(golden, tmp_path):
    assert golden["args"] == ARGS and len(golden["train/loss"]) == 38
    assert_same_curve([list(pair) for pair in run(tmp_path / "run")], golden["train/loss"], golden["machine"])


def test_a_checkpoint_of_the_release_that_stored_the_curve_resumes_to_its_losses(golden, tmp_path):
    """What `cruft update` must keep: a project updated to a later template resumes its old runs. The fixture is
    the golden run's checkpoint at step 19 (its first epoch's end); resumed, it logs the curve's steps 19 to 37."""
    assert torch.load(CHECKPOINT, weights_only=True)["global_step"] == 19
    losses = run(tmp_path / "run", f"--ckpt_path={CHECKPOINT}")
    assert_same_curve([list(pair) for pair in losses], golden["train/loss"][19:], golden["machine"])
