"""Negative controls of the guarantee kit: with each cause of an inexact run put in, the kit goes red, naming the
first difference and a cause that is true. Each of its stops catches something the others miss: the mid-epoch stop any
state the checkpoint lacks, the stop in validation a module changed for validation, the stop after an epoch's end a
state taken before the module's own epoch-end hook (the engine before it saved epoch ends as a Lightning Checkpoint
does, put back here in the kit's child processes by a module that a callback option imports)."""

import importlib.util
import subprocess
import sys

import pytest
import yaml

from template_package.engine.guarantees import GuaranteeKit, KitConfigurationError

from helpers.cli import STAND_IN, subprocess_env
from helpers.warm_start import kit_runner

pytestmark = pytest.mark.slow
GAN = ["--model=null", "--model=helpers.patterns.ManualGAN", "--checkpoint.monitor=null"]


def kit_on(tmp_path, *task: str) -> GuaranteeKit:
    return GuaranteeKit(tmp_path / "kit", [*STAND_IN, *task], env=subprocess_env(), run=kit_runner)


NOT_LOGGED = (
    "checkpoint.monitor='val/f1' is not logged by StandInClassifier, which logs val/acc, val/loss in validation: set "
    "--checkpoint.monitor to a metric it logs with self.log (and --checkpoint.mode min or max), in "
    "configs/default.yaml for good, or null for last.ckpt only"
)
MISTAKES = {  # what the kit is given, and fit's own line for it
    "monitor not logged": (["--checkpoint.monitor=val/f1"], NOT_LOGGED),
    "unknown option": (
        ["--model.dropuot=0.1"],
        "unknown option --model.dropuot for helpers.stand_in.StandInClassifier: did you mean --model.dropout?",
    ),
    "class not importable": (
        ["--data=helpers.stand_in.MissingData"],
        "--data helpers.stand_in.MissingData cannot be used (module 'helpers.stand_in' has no attribute "
        "'MissingData'): give a LightningModule/LightningDataModule class as package.module.Class, importable from "
        "the project's src/, the working directory or PYTHONPATH",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistake_in_what_the_kit_is_given_is_fits_one_line_before_any_training_run(tmp_path, mistake):
    """The options and classes are parsed first (`fit --print_config`), then a fit that trains no batch and validates
    one, the sanity check's, where fit says that the monitored metric is not logged."""
    task, said = MISTAKES[mistake]
    commands = []

    def recorded(args, cwd, env):
        commands.append(args)
        return kit_runner(args, cwd, env)

    kit = GuaranteeKit(tmp_path / "kit", [*STAND_IN, *task], env=subprocess_env(), run=recorded)
    with pytest.raises(KitConfigurationError) as raised:
        kit.check_configuration()
    assert str(raised.value) == said
    tried = ["--trainer.num_sanity_val_steps=1"] if mistake == "monitor not logged" else []
    assert [args[-1] for args in commands] == ["--print_config", *tried]
    assert all("--print_config" in args or "--trainer.limit_train_batches=0" in args for args in commands)
    assert not list((tmp_path / "kit").rglob("*.ckpt"))


def test_the_kits_command_given_a_monitor_the_model_does_not_log_exits_with_fits_one_line(tmp_path):
    """As a user starts it, in new processes: one line, exit 1, and no run of the checks started."""
    folder = tmp_path / "kit"
    kit = subprocess.run([sys.executable, "-m", "template_package", "guarantees", *STAND_IN,
                          "--checkpoint.monitor=val/f1", f"--folder={folder}"],
                         env=subprocess_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert (kit.returncode, kit.stdout, kit.stderr) == (1, "", f"error: {NOT_LOGGED}\n")
    assert sorted(path.name for path in folder.iterdir() if path.is_dir()) == ["configuration"]


def test_unseeded_randomness_fails_the_repeat_check(tmp_path):
    """The dataset draws its noise from np.random.default_rng() with no seed."""
    with pytest.raises(AssertionError, match=r"two runs with the same settings differ: train/\S+ logged at step 1 .*"
                                             r"randomness that no seed reaches"):  # fmt: skip
        kit_on(tmp_path, "--data=helpers.stand_in.DrawingStandInData", "--data.draw=unseeded").check_repeatable()


def test_a_generator_the_dataset_holds_fails_the_resume_and_workers_checks(tmp_path):
    """np.random.default_rng(0) kept by the dataset: a resumed run draws its first numbers again, and each loader
    worker draws from its own copy. Every stop breaks it, so the kit names the mid-epoch one and its cause."""
    kit = kit_on(tmp_path, "--data=helpers.stand_in.DrawingStandInData", "--data.draw=held")
    resumed = (
        r"a run SIGKILLed mid-epoch after a checkpoint \(after 10 training steps\) and resumed differs from the "
        r"uninterrupted run: train/\S+ logged at step 9 .*a random generator the dataset or model keeps for itself"
    )
    with pytest.raises(AssertionError, match=resumed):
        kit.check_exact_resume()
    with pytest.raises(AssertionError, match="0 and 2 loader workers train different bits: .*a generator the dataset"):
        kit.check_workers_agree()


def test_a_loader_without_state_fails_the_resume_check_with_the_engines_notice(tmp_path):
    kit = kit_on(tmp_path, "--data=helpers.stand_in.UnresumableStandInData")
    said = r"differs from the uninterrupted run: .*the engine said: the train loader cannot resume exactly: it reads "
    with pytest.raises(AssertionError, match=said + "an iterable dataset without set_epoch"):
        kit.check_exact_resume()


def test_a_module_that_keeps_state_between_logged_steps_fails_the_resume_check_naming_its_attributes(tmp_path):
    """The kit's runs log every 2 steps, a window that its checkpoints cut: a mean over the window, kept in memory
    only (the module's own loss_sum and losses), starts again at a resume (the recipe's own train/clip_share is kept
    in the checkpoint for this reason); the kit names the metric and the attributes."""
    kit = kit_on(tmp_path, "--model=null", "--model=helpers.patterns.WindowMeanLoss")
    with pytest.raises(
        AssertionError,
        match=r"uninterrupted run: train/window_loss logged at step \d+ .*Likely cause: "
        "the module's attributes loss_sum, losses, changed during training and held by no checkpoint",
    ):
        kit.check_exact_resume()


def test_a_module_that_validates_with_swapped_weights_fails_only_the_stop_in_validation(tmp_path):
    """Swapped in at each validation's start and back at its end: the mid-epoch and epoch-end stops resume it
    exactly, the stop in validation saves it swapped."""
    kit = kit_on(tmp_path, "--model=null", "--model=helpers.patterns.SwapsForValidation")
    stopped = r"a run stopped by SIGTERM during its last validation \(after 12 training steps\) and resumed "
    with pytest.raises(AssertionError, match=stopped + ".*Likely cause: state that validation changes"):
        kit.check_exact_resume()


def controlled(tmp_path, code: str) -> list[str]:
    """The option that runs `code` in each of the kit's runs as it reads its options, before training: a callback of a
    module in the kit's working directory (tmp_path), where `python -m` finds it, which `code` is the start of."""
    (tmp_path / "control.py").write_text(f"{code}\n\nfrom lightning.pytorch import Callback as Control\n")
    return ["--trainer.callbacks+=control.Control"]


EPOCH_END_BEFORE_THE_MODULE = """
from lightning.pytorch.trainer import call
from template_package.engine.resume.exact_resume import ExactResume

module_hook, epoch_end = call._call_lightning_module_hook, ExactResume.on_train_epoch_end

def before_the_module(trainer, hook_name, *args, **kwargs):
    if hook_name == "on_train_epoch_end":
        for callback in trainer.callbacks:
            if isinstance(callback, ExactResume):
                epoch_end(callback, trainer, trainer.lightning_module)
    return module_hook(trainer, hook_name, *args, **kwargs)

call._call_lightning_module_hook = before_the_module
ExactResume.on_train_epoch_end = lambda self, trainer, pl_module: None
"""


def test_an_epoch_end_saved_before_the_modules_hook_fails_only_the_stop_after_an_epoch_end(tmp_path):
    """The GAN steps its two schedules in on_train_epoch_end: saved before that, its epoch-end state misses them,
    which only a run resumed from that checkpoint shows."""
    kit = kit_on(tmp_path, *GAN, *controlled(tmp_path, EPOCH_END_BEFORE_THE_MODULE))
    stopped = r"a run SIGKILLed right after its first epoch's end was saved \(after 7 training steps\) and resumed "
    with pytest.raises(AssertionError, match=stopped + ".*Likely cause: state changed at an epoch's end"):
        kit.check_exact_resume()


VALIDATION_NOT_UNDONE = """
import template_package.engine.resume.exact_resume as exact_resume

exact_resume.dump_checkpoint = lambda trainer: trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
"""


def test_a_checkpoint_taken_in_validation_as_it_is_fails_only_the_stop_in_validation(tmp_path):
    """Without the engine putting back what validation changed, the run resumed from a stop in validation goes on
    with the interrupted validation at its next batch, and logs a validation metric of part of the batches."""
    kit = kit_on(tmp_path, *GAN, *controlled(tmp_path, VALIDATION_NOT_UNDONE))
    stopped = r"a run stopped by SIGTERM during its last validation \(after 12 training steps\) and resumed "
    with pytest.raises(AssertionError, match=stopped + r"differs .*val/d_real logged at step 11 .*Likely cause: state "
                                                       r"that validation changes"):  # fmt: skip
        kit.check_exact_resume()


# A stream (helpers/stream_task.py): HF datasets streaming, made small for the kit by the DataModule's kit_options.
STREAM = ["--model=null", "--model=helpers.stream_task.StreamModel", "--data=null",
          "--data=helpers.stream_task.HFStreamData", "--checkpoint.monitor=val/loss",
          "--checkpoint.mode=min"]  # fmt: skip
needs_datasets = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="datasets is not installed: pip install -e '.[streaming]'"
)


def stream_kit(tmp_path, *task: str) -> GuaranteeKit:
    env = subprocess_env(HF_HOME=str(tmp_path.parent / "huggingface"))  # one for the tests here: one warm server
    task = [*STREAM, f"--data.folder={tmp_path / 'json'}", *task]
    return GuaranteeKit(tmp_path / "kit", task, env=env, run=kit_runner)


@needs_datasets
def test_a_stream_read_as_a_real_run_reads_it_resumes_exactly_and_its_workers_are_not_compared(tmp_path):
    """No 6-batch limit (it would give the loader a length and switch Lightning's read-ahead off): the DataModule's
    kit_options make 6-batch epochs of its own, and max_steps gives the recipe's warmup-cosine schedule a length."""
    kit = stream_kit(tmp_path, "--model=helpers.stream_task.RecipeStreamModel")
    kit.check_exact_resume()
    assert "--trainer.limit_train_batches=6" not in kit.data_settings()
    assert kit.why_workers_not_compared().startswith("the train loader reads a stream: each loader worker builds")


@needs_datasets
def test_a_stream_position_ahead_of_the_weights_fails_the_resume_check_naming_it(tmp_path):
    """The engine's position fix off (helpers.stream_task.PositionAheadOfTheWeights: a checkpoint records one batch more
    than trained, as the loader's own state did): the run resumed mid-epoch skips a batch, and the kit says so."""
    kit = stream_kit(tmp_path, "--trainer.callbacks+=helpers.stream_task.PositionAheadOfTheWeights")
    stopped = r"a run SIGKILLed mid-epoch after a checkpoint \(after 10 training steps\) and resumed differs from the "
    cause = r".*Likely cause: a position of the stream ahead of the weights"
    with pytest.raises(AssertionError, match=stopped + cause):
        kit.check_exact_resume()


def test_a_stream_without_kit_options_is_refused_naming_them(tmp_path):
    task = [*STREAM, "--data=helpers.stream_task.IterableData"]
    kit = GuaranteeKit(tmp_path / "kit", task, env=subprocess_env(), run=kit_runner)
    with pytest.raises(AssertionError, match=r"the train loader reads a stream, and the kit's 6-batch epochs would "
                                             r"give it a length.*class attribute kit_options"):  # fmt: skip
        kit.check_repeatable()


def fine_tuning_task(tmp_path, unfreeze: int = 1) -> list[str]:
    """helpers.finetune_task.FineTuned with Lightning's BackboneFinetuning unfreezing at epoch 1: the kit's stop after
    the first epoch's end comes before the unfreeze, its mid-epoch one after it."""
    from helpers.finetune_task import save_pretrained

    config = tmp_path / "finetuning.yaml"
    callback = {"class_path": "lightning.pytorch.callbacks.BackboneFinetuning",
                "init_args": {"unfreeze_backbone_at_epoch": unfreeze}}  # fmt: skip
    config.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}))
    weights = save_pretrained(tmp_path / "backbone.pt")
    return ["--model=helpers.finetune_task.FineTuned", f"--model.backbone_path={weights}", "-c", str(config)]


def test_a_fine_tuning_run_with_backbone_finetuning_passes_the_resume_check(tmp_path):
    kit = kit_on(tmp_path, *fine_tuning_task(tmp_path))
    kit.check_exact_resume()
    assert kit.uncovered() == []


def test_an_unfreeze_the_kits_runs_do_not_reach_is_said(tmp_path):
    assert kit_on(tmp_path, *fine_tuning_task(tmp_path, unfreeze=3)).uncovered() == [
        "BackboneFinetuning unfreezes at epoch 3: the kit's 2-epoch runs stop before and after epoch 1's start; give "
        "it unfreeze_backbone_at_epoch 1 (-c a preset) to check the unfreeze"
    ]


FROZEN_AGAIN = """
import template_package.engine.resume.trained_state as trained_state

trained_state.put_back = lambda module, saved: None
"""


def test_a_backbone_left_frozen_on_resume_fails_the_resume_check_naming_the_frozen_parameters(tmp_path):
    """The negative control: without the engine's put back, the resumed run's backbone stays frozen."""
    kit = kit_on(tmp_path, *fine_tuning_task(tmp_path), *controlled(tmp_path, FROZEN_AGAIN))
    stopped = r"a run SIGKILLed mid-epoch after a checkpoint \(after 10 training steps\) and resumed differs"
    with pytest.raises(AssertionError, match=stopped + ".*Likely cause: parameters frozen in one run and trainable"):
        kit.check_exact_resume()


def test_a_users_weighted_sampler_passes_the_resume_and_workers_checks(tmp_path):
    kit = kit_on(tmp_path, "--data=helpers.sampled_data.WeightedData")
    kit.check_exact_resume()
    kit.check_workers_agree()


needs_webdataset = pytest.mark.skipif(
    importlib.util.find_spec("webdataset") is None, reason="webdataset is not installed: pip install -e '.[streaming]'"
)


@needs_webdataset
def test_a_seeded_webdataset_stream_passes_the_resume_check(tmp_path):
    task = ["--data=null", "--data=helpers.webdataset_task.WebDatasetData", f"--data.folder={tmp_path / 'tars'}"]
    GuaranteeKit(tmp_path / "kit", [*STREAM, *task], env=subprocess_env(), run=kit_runner).check_exact_resume()
