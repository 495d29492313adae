"""What may change when a run is resumed with `fit --ckpt_path`, and what may not.

A resumed run is exact only with the settings it was saved with. LightningCLI's own answer is to read the model's
hyperparameters from the checkpoint over the command line, so `--model.lr 0.5` on a resume trained on, silently, at
the old rate; a changed `--data.batch_size` was applied, and the loader skipped past the end of the now shorter
epoch. Here:

- Settings that change the math of the run in flight (the model's and the data's, the recipe's lr, weight_decay,
  betas, eps, warmup and decay_steps among them; the seed, accumulation, precision, clipping, the batches per epoch)
  are refused in one line that names the option, the checkpoint's value and the new one. `--allow_change OPTION`
  (repeatable) applies such a change on purpose: the run goes on, no longer exact.
- Settings that may change (the run's length, logging, checkpoint cadence, loader workers, ...) are applied, with a
  one-line notice. A longer run (`trainer.max_epochs`, `trainer.max_steps`) keeps its LR schedule: the schedule ends
  where it was going to end, and the added steps train at its final rate (`model.lr` x `model.min_lr_ratio`); a
  schedule stretched to the new length would jump back up (x70 seen on a 2-epoch run extended to 5).
- The number of processes is checked on its own (checks.check_world_size): it changes only with `--allow_change
  world_size`, keeping the run's global batch (training/batch_layout.py).

The model's and data's settings are compared with the checkpoint's hyperparameters; the trainer's with the run's
`config.yaml` beside its `checkpoints/` folder (a checkpoint from elsewhere has none: only model and data are
compared then).
"""

from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback

from ..errors import UsageError
from ..internals import set_last_lrs
from ..training.recipe import set_schedule_lengths
from ..training.schedulers import WarmupCosineSchedule

# Changing these changes what is computed: refused on a resume unless allowed with --allow_change.
MATH = [
    "seed_everything",
    "trainer.accumulate_grad_batches",
    "trainer.precision",
    "trainer.gradient_clip_val",
    "trainer.gradient_clip_algorithm",
    "trainer.limit_train_batches",
    "trainer.deterministic",
]
# How data is loaded, not which data: these data options may change on a resume (with a notice), and validate, test
# and predict never take them from a checkpoint. A DataModule adds its own with a class attribute `loading_options`.
LOADING_OPTIONS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
RUN_LENGTH = ("trainer.max_epochs", "trainer.max_steps")
NO_LIMIT = (None, -1)  # a run-length option's values that set no limit
# Shown when they change, then applied.
NOTICED = [
    *RUN_LENGTH,
    "trainer.log_every_n_steps",
    "trainer.limit_val_batches",
    "trainer.check_val_every_n_epoch",
    "last_checkpoint.every_n_steps",
]


def loading_options(data) -> set[str]:
    """The options of a DataModule (an instance, a class or a class path) that say how its data is loaded."""
    if isinstance(data, str):
        from ..cli.checks import import_class

        data = import_class(data)
    return {*LOADING_OPTIONS, *getattr(data, "loading_options", ())}


def check_resume_changes(config, checkpoint: dict, ckpt_path: str, allowed: list[str], model, data) -> list[str]:
    """Refuse a math change that was not allowed (SystemExit with one line); print the changes that go ahead, and
    return them.

    The model's and data's settings are read from the built objects, so a value the model took from the data
    (num_classes, vocab_size) or the data found itself (the class names of a folder) is compared as it is used."""
    saved = saved_settings(checkpoint, Path(ckpt_path))
    built = {"model": getattr(model, "hparams", {}), "data": getattr(data, "hparams", {})}
    new = {option: built[option.split(".")[0]].get(option.split(".", 1)[1]) if option.split(".")[0] in built
           else value_at(config, option) for option in saved}  # fmt: skip
    free = {f"data.{name}" for name in loading_options(data)} if data is not None else set()
    changed = {option: (saved[option], new[option]) for option in saved if saved[option] != new[option]}
    math = [option for option in changed if is_math(option) and option not in free]
    refused = [option for option in math if option not in allowed]
    if refused:
        option = refused[0]
        old, value = changed[option]
        raise SystemExit(
            f"error: --{option} is {value!r} but {ckpt_path} was trained with {old!r}: a resumed run goes on exactly "
            f"only with its own settings; drop --{option}, or add --allow_change {option} to change it anyway"
        )
    check_run_length(changed, checkpoint, ckpt_path)
    if changed:
        shown = ", ".join(f"{option} {old!r} -> {value!r}" for option, (old, value) in changed.items())
        note = " (no longer an exact resume)" if math else ""
        lengths = [
            schedule.get("decay_steps") or schedule["total_steps"]
            for schedule in checkpoint.get("lr_schedulers", [])
            if isinstance(schedule, dict) and (schedule.get("decay_steps") or schedule.get("total_steps"))
        ]  # (WarmupCosineSchedule's: where its cosine ends)
        if set(RUN_LENGTH) & changed.keys() and lengths:
            note += f"; the LR schedule keeps its length ({max(lengths)} steps): steps past it train at its final rate"
        shorter = [f"--{option} {old}" for option, (old, value) in changed.items() if is_shorter(option, old, value)]
        if shorter:
            note += f"; the run now ends sooner than it was started to: {' '.join(shorter)} keeps its length"
        print(f"resuming with changed settings: {shown}{note}")
    return list(changed)


def is_shorter(option: str, old, new) -> bool:
    """Whether a run-length option now ends the run sooner."""
    return option in RUN_LENGTH and new not in NO_LIMIT and (old in NO_LIMIT or new < old)


def check_run_length(changed: dict, checkpoint: dict, ckpt_path: str) -> None:
    """A resume whose trainer.max_epochs is below the epoch the checkpoint is at stops in one line naming the length
    the run was started with (Lightning's own error would not say what to pass)."""
    old, new = changed.get("trainer.max_epochs", (None, None))
    epoch = checkpoint.get("epoch", 0)
    if new not in NO_LIMIT and epoch > new:
        raise SystemExit(
            f"error: --trainer.max_epochs is {new} but {ckpt_path} is at epoch {epoch}: resume with the run's own "
            f"length, --trainer.max_epochs {old} (or more), or its settings, -c <run directory>/config.yaml"
        )


class ChangedModelSettings(Callback):
    """Applies an allowed change of the model's settings (`--allow_change model.lr`) to the restored optimizer and
    schedule, for any module: Lightning restores them as they were saved, so the new model's optimizer settings would
    be lost. Each parameter group takes the settings the module's configure_optimizers gave it now (its learning
    rate, weight decay, betas, eps, ...); the schedule's base rates follow, and a WarmupCosineSchedule takes the new
    warmup, final ratio and decay_steps too, at its saved length and step. Any other schedule goes on from its
    restored rate, scaled by new / old base rate. The CLI adds it to a fit that resumes with such a change."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Called after configure_optimizers, before Lightning restores the optimizers and schedules.
        self.groups = [[_settings(group) for group in opt.param_groups] for opt in trainer.optimizers]
        self.schedules = [dict(vars(config.scheduler)) for config in trainer.lr_scheduler_configs]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for optimizer, groups in zip(trainer.optimizers, self.groups, strict=True):
            if len(optimizer.param_groups) != len(groups):
                raise UsageError(
                    f"--allow_change cannot apply the model's new settings: its optimizer has {len(groups)} parameter "
                    f"groups and the checkpoint's {len(optimizer.param_groups)}; start a new run instead"
                )
            for group, new in zip(optimizer.param_groups, groups, strict=True):
                old_base = group.get("initial_lr", group["lr"])
                new_base = new.get("initial_lr", new["lr"])
                group.update({key: value for key, value in new.items() if key not in ("lr", "initial_lr")})
                group["lr"] = group["lr"] * new_base / old_base if old_base else new_base
                if "initial_lr" in group:
                    group["initial_lr"] = new_base
        for config, new in zip(trainer.lr_scheduler_configs, self.schedules, strict=True):
            schedule = config.scheduler
            schedule.base_lrs = [group.get("initial_lr", group["lr"]) for group in schedule.optimizer.param_groups]
            if isinstance(schedule, WarmupCosineSchedule):
                apply_schedule_settings(trainer, schedule, new)
            else:
                set_last_lrs(schedule)


def apply_schedule_settings(trainer: L.Trainer, schedule: WarmupCosineSchedule, new: dict) -> None:
    """The new warmup, final ratio and decay_steps, at the schedule's saved step: this step's rate from them."""
    schedule.warmup, schedule.min_lr_ratio, schedule.decay_steps = (
        new["warmup"], new["min_lr_ratio"], new.get("decay_steps"))  # fmt: skip
    try:
        if schedule.horizon is None:  # (decay_steps dropped: the cosine ends at the run's length, known from now)
            set_schedule_lengths(trainer)
        schedule.refresh()
    except ValueError as mistake:
        raise UsageError(str(mistake)) from None


def _settings(group: dict) -> dict:
    return {key: value for key, value in group.items() if key != "params"}


def is_math(option: str) -> bool:
    return option in MATH or option.split(".")[0] in ("model", "data")


def saved_settings(checkpoint: dict, ckpt_path: Path) -> dict:
    """The settings the checkpoint was trained with: its model and data hyperparameters, and from the run's
    config.yaml (when the checkpoint sits in a run directory) the trainer's."""
    saved = {}
    for section, key in (("model", "hyper_parameters"), ("data", "datamodule_hyper_parameters")):
        for name, value in (checkpoint.get(key) or {}).items():
            if not name.startswith("_"):  # Lightning's own entries: the class path, the instantiator
                saved[f"{section}.{name}"] = value
    config_file = ckpt_path.parent.parent / "config.yaml"
    if config_file.is_file():
        config = yaml.safe_load(config_file.read_text())
        for option in MATH + NOTICED:
            if option.split(".")[0] in ("trainer", "seed_everything", "last_checkpoint"):
                saved[option] = value_at(config, option)
    return saved


def value_at(config, option: str):
    """The value of a dotted option in a parsed config (a jsonargparse Namespace) or a loaded config.yaml (a dict)."""
    value = config
    for name in option.split("."):
        value = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
    return value
