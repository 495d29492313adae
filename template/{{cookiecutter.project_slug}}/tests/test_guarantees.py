"""The guarantee kit (engine/guarantees.py) on the model and data that configs/default.yaml names, with their
init_args: yours, once you have put them there. `pytest -m guarantees` runs these alone (a few minutes on 2 CPUs)."""

import pytest

from template_package.engine.guarantees import GuaranteeKit

from helpers.cli import PROJECT_ROOT, subprocess_env
from helpers.warm_start import kit_runner

pytestmark = pytest.mark.guarantees


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> GuaranteeKit:
    # Its runs start from the tests' warm server (tests/helpers/warm_start.py); `python -m <package> guarantees` starts
    # them as new processes (tests/test_copy_modules.py runs it so).
    return GuaranteeKit(tmp_path_factory.mktemp("guarantees"), env=subprocess_env(), cwd=PROJECT_ROOT, run=kit_runner)


def test_a_repeat_run_is_identical(kit):
    kit.check_repeatable()


def test_a_run_stopped_three_ways_and_resumed_ends_like_the_uninterrupted_run(kit):
    kit.check_exact_resume()


def test_the_number_of_loader_workers_does_not_change_the_bits(kit):
    skipped = kit.why_workers_not_compared()
    if skipped:
        pytest.skip(skipped)
    kit.check_workers_agree()
