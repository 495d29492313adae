"""Negative controls of the guarantee kit: on the stand-in task with each cause of an inexact run put in, the kit
goes red, naming the first difference and the cause."""

import pytest
from conftest import STAND_IN, subprocess_env

from template_package.engine.guarantees import GuaranteeKit

pytestmark = pytest.mark.slow


def kit_on(tmp_path, data: str, *args: str) -> GuaranteeKit:
    task = [*STAND_IN, f"--data={data}", *args]
    return GuaranteeKit(tmp_path / "kit", task, env=subprocess_env())


def test_unseeded_randomness_fails_the_repeat_check(tmp_path):
    """The dataset draws its noise from np.random.default_rng() with no seed."""
    with pytest.raises(AssertionError, match=r"two runs with the same settings differ: train/loss at step 0 .*"
                                             r"randomness that no seed reaches"):  # fmt: skip
        kit_on(tmp_path, "stand_in.DrawingStandInData", "--data.draw=unseeded").check_repeatable()


def test_a_generator_the_dataset_holds_fails_the_resume_and_workers_checks(tmp_path):
    """np.random.default_rng(0) kept by the dataset: a resumed run draws its first numbers again, and each loader
    worker draws from its own copy."""
    kit = kit_on(tmp_path, "stand_in.DrawingStandInData", "--data.draw=held")
    resumed = (
        r"a run killed at step 10 and resumed from step 8 differs from the uninterrupted run: train/loss at "
        r"step 8 .*a random generator the dataset or model keeps for itself"
    )
    with pytest.raises(AssertionError, match=resumed):
        kit.check_exact_resume()
    with pytest.raises(AssertionError, match="0 and 2 loader workers train different bits: .*a generator the dataset"):
        kit.check_workers_agree()


def test_a_loader_without_state_fails_the_resume_check_with_the_engines_notice(tmp_path):
    kit = kit_on(tmp_path, "stand_in.UnresumableStandInData", "--data.kind=batch_sampler")
    said = r"differs from the uninterrupted run: .*the engine said: the train loader cannot resume exactly: it draws "
    with pytest.raises(AssertionError, match=said + "batches with a custom batch sampler"):
        kit.check_exact_resume()
