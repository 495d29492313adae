"""The guarantee kit (engine/guarantees.py) on the model and data that configs/default.yaml names, with their
init_args: yours, once you have put them there. `pytest -m guarantees` runs these alone (a few minutes on 2 CPUs)."""

import pytest
import yaml

from template_package.engine.cli.main import DEFAULT_CONFIG_VARIABLE
from template_package.engine.guarantees import GuaranteeKit, KitConfigurationError

from helpers.cli import PROJECT_ROOT, subprocess_env
from helpers.warm_start import kit_runner

pytestmark = pytest.mark.guarantees


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> GuaranteeKit:
    """The kit, its configuration checked first: a mistake in it (a monitored metric the model does not log, say) is
    fit's one line, before any run of the checks."""
    # Its runs start from the tests' warm server (tests/helpers/warm_start.py); `python -m <package> guarantees` starts
    # them as new processes (tests/test_copy_modules.py runs it so). Without the engine's tests' default config, which
    # conftest.py sets for this process: a fixture of the module is made before conftest takes it away for the test.
    env = {name: value for name, value in subprocess_env().items() if name != DEFAULT_CONFIG_VARIABLE}
    kit = GuaranteeKit(tmp_path_factory.mktemp("guarantees"), env=env, cwd=PROJECT_ROOT, run=kit_runner)
    try:
        kit.check_configuration()
    except KitConfigurationError as mistake:
        said = f"error: {mistake}"
    else:
        return kit
    pytest.fail(said, pytrace=False)  # (outside the except: the line alone, without the exception it handled)


def test_the_kit_checks_the_classes_that_configs_default_yaml_names(kit):
    configured = yaml.safe_load((PROJECT_ROOT / "configs" / "default.yaml").read_text())
    assert [kit.config()[part]["class_path"] for part in ("model", "data")] == [
        configured[part]["class_path"] for part in ("model", "data")
    ]


def test_a_repeat_run_is_identical(kit):
    kit.check_repeatable()


def test_a_run_stopped_three_ways_and_resumed_ends_like_the_uninterrupted_run(kit):
    kit.check_exact_resume()


def test_the_number_of_loader_workers_does_not_change_the_bits(kit):
    skipped = kit.why_workers_not_compared()
    if skipped:
        pytest.skip(skipped)
    kit.check_workers_agree()
