"""Another library's private names, in one place: each behind a small function that says why no public API serves.

An engine class that overrides another library's private method, or subclasses its private class (re-exported from
here), stays in its module and is listed in `OVERRIDDEN`.

An upgrade of a library that renames or changes one of them fails tests/test_ownership.py, which checks every entry of
`PINNED` and `OVERRIDDEN` against the installed libraries, so that the change shows in one place, by name. Depends on
lightning and torch.
"""

import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass

import lightning as L
from lightning.pytorch.loops.fit_loop import _FitLoop as _FitLoop
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner as _EmptyStateDictLoadPlanner


@dataclass(frozen=True)
class Pinned:
    """A private name this module uses: `module.qualname` exists; with `attribute`, that class (or a base) sets or
    reads `self.<attribute>`; with `parameters`, the callable takes exactly these."""

    module: str
    qualname: str
    why: str
    attribute: str | None = None
    parameters: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Overridden:
    """A private method of another library's class that the engine's class `by` (module.Class under engine/)
    overrides, or a private class it subclasses: `module.qualname` exists; with `parameters`, the method (the class's
    constructor) takes exactly these, and so does the override."""

    module: str
    qualname: str
    by: str
    why: str
    parameters: tuple[str, ...] | None = None


# The arguments of Lightning's `_ResultCollection.log`, which `log_again` passes as a stopped run's self.log did.
RESULT_LOG_PARAMETERS = ("self", "fx", "name", "value", "prog_bar", "logger", "on_step", "on_epoch", "reduce_fx",
                         "enable_graph", "sync_dist", "sync_dist_fn", "sync_dist_group", "add_dataloader_idx",
                         "batch_size", "metric_attribute", "rank_zero_only")  # fmt: skip

OVERRIDDEN = [
    Overridden(
        "lightning.pytorch.cli",
        "LightningCLI._add_subcommands",
        by="cli.main.ProjectCLI",
        parameters=("self", "parser", "kwargs"),
        why="adds the tools to the subcommands --help lists: LightningCLI's `subcommands()` names Trainer methods only",
    ),
    Overridden(
        "lightning.pytorch.cli",
        "LightningCLI._add_instantiators",
        by="cli.main.ProjectCLI",
        parameters=("self",),
        why="the model takes values from the built data: LightningCLI builds both there, with no public hook between",
    ),
    Overridden(
        "lightning.pytorch.cli",
        "LightningCLI._run_subcommand",
        by="cli.main.ProjectCLI",
        parameters=("self", "subcommand"),
        why="builds everything and checks the checkpoint without running: `run=False` parses without subcommands",
    ),
    Overridden(
        "lightning.pytorch.cli",
        "LightningCLI._parse_ckpt_path",
        by="cli.main.ProjectCLI",
        parameters=("self",),
        why="keeps the config's classes over the checkpoint's and compares its hyperparameters: no public switch",
    ),
    Overridden(
        "lightning.pytorch.callbacks",
        "TQDMProgressBar._should_update",
        by="report.progress.TimedProgressBar",
        parameters=("self", "current", "total"),
        why="whether the bar redraws at an evaluation batch, by time: `refresh_rate` counts batches",
    ),
    Overridden(
        "lightning.pytorch.loggers.csv_logs",
        "ExperimentWriter._check_log_dir_exists",
        by="report.loggers._PurgingWriter",
        parameters=("self",),
        why="keeps an existing metrics.csv's rows before purge_step: Lightning's writer deletes the file, no option",
    ),
    Overridden(
        "lightning.pytorch.loops.fit_loop",
        "_FitLoop",
        by="resume.finished_epochs._FitLoopThatKeepsFinishedEpochs",
        why="its `restarting` rule restarts a finished epoch under max_steps: the Trainer takes no fit loop class",
    ),
    Overridden(
        "torch.distributed.checkpoint.default_planner",
        "_EmptyStateDictLoadPlanner",
        by="resume.safe_dcp.SafePlanner",
        parameters=("keys", "args", "kwargs"),
        why="rebuilds the whole state from .metadata, as dcp_to_torch_save does: no public planner does",
    ),
]


PINNED = [
    Pinned(
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop",
        attribute="_batches_that_stepped",
        why="the step `self.log` writes at: no public counter of batches whose optimizer stepped",
    ),
    Pinned(
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop._should_accumulate",
        parameters=("self",),
        why="whether this batch ends an accumulation window: no public equivalent",
    ),
    Pinned(
        "lightning.pytorch.trainer.trainer",
        "Trainer",
        attribute="_checkpoint_connector",
        why="the whole trainer state as a dict: `save_checkpoint` writes it to a file and returns nothing",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
        "_CheckpointConnector.dump_checkpoint",
        parameters=("self", "weights_only"),
        why="as above",
    ),
    Pinned(
        "lightning.pytorch.callbacks",
        "WeightAveraging",
        attribute="_average_model",
        why="whether the averaged weights exist yet: no public accessor",
    ),
    Pinned(
        "lightning.pytorch.callbacks",
        "WeightAveraging._swap_models",
        parameters=("self", "pl_module"),
        why="puts the training weights back, as the callback does at a validation's end: no public method",
    ),
    Pinned(
        "torch.amp",
        "GradScaler",
        attribute="_per_optimizer_states",
        why="whether an optimizer's gradients are unscaled yet: GradScaler has no public query",
    ),
    Pinned(
        "torch.optim",
        "AdamW",
        attribute="_step_supports_amp_scaling",
        why="an optimizer that unscales inside its own step (fused): torch's own flag, no public one",
    ),
    Pinned(
        "torch.utils.data",
        "RandomSampler",
        attribute="_num_samples",
        why="whether the user gave num_samples: the public `num_samples` is the dataset's length otherwise",
    ),
    Pinned(
        "lightning.pytorch.callbacks",
        "TQDMProgressBar",
        attribute="_train_progress_bar",
        why="the bars made so far: the public properties raise where a bar is not made yet",
    ),
    Pinned(
        "lightning.pytorch.callbacks",
        "TQDMProgressBar",
        attribute="_val_progress_bar",
        why="as above",
    ),
    Pinned(
        "lightning.pytorch.loops.loop",
        "_Loop.restarting.fset",
        parameters=("self", "restarting"),
        why="sets a loop's `restarting` and its children's without the fit loop's rule: no public setter",
    ),
    Pinned(
        "lightning.pytorch.cli",
        "_InstantiatorFn",
        parameters=("cli", "key"),
        why="builds the model or data recording its arguments as the checkpoint's hyperparameters: not public",
    ),
    Pinned(
        "lightning.pytorch.cli",
        "_InstantiatorFn.__call__",
        parameters=("self", "class_type", "args", "applied_instantiation_links", "kwargs"),
        why="as above",
    ),
    Pinned(
        "jsonargparse",
        "ArgumentParser",
        attribute="_subcommands_action",
        why="the parser's subcommands, to add the tools and read each one's parser: no public accessor",
    ),
    Pinned(
        "argparse",
        "ArgumentParser",
        attribute="_actions",
        why="a parser's arguments, to list its options: argparse has no public accessor",
    ),
    Pinned(
        "torch.distributed.checkpoint.state_dict_loader",
        "_load_state_dict",
        parameters=("state_dict", "storage_reader", "process_group", "coordinator_rank", "no_dist", "planner"),
        why="DCP's load into an empty dict, as dcp_to_torch_save does: the public `load` fills only the keys given",
    ),
    Pinned(
        "torch.distributed.checkpoint._traverse",
        "set_element",
        parameters=("root_dict", "path", "value"),
        why="puts a loaded entry at its nested place, as the default planner's load_bytes does: not public",
    ),
    Pinned(
        "optuna.study",
        "Study",
        attribute="_storage",
        why="the storage's heartbeats, trial states and user attributes by trial id: Study exposes no storage",
    ),
    Pinned(
        "optuna.trial",
        "Trial",
        attribute="_trial_id",
        why="the id the storage knows a trial by (its number is the study's): no public accessor",
    ),
    Pinned(
        "optuna.trial",
        "FrozenTrial",
        attribute="_trial_id",
        why="as above",
    ),
    Pinned(
        "optuna.storages",
        "_CachedStorage._get_stale_trial_ids",
        parameters=("self", "study_id"),
        why="the running trials whose heartbeat stopped: the public `fail_stale_trials` fails them instead",
    ),
    Pinned(
        "datasets",
        "IterableDataset",
        attribute="_distributed",
        why="whether a Hugging Face stream was split by split_dataset_by_node already: datasets has no public query",
    ),
    Pinned(
        "torch.utils.data",
        "DataLoader",
        attribute="_iterator",
        why="the persistent workers' iterator, to end them before an epoch they must see: no public shutdown",
    ),
    Pinned(
        "torch.utils.data.dataloader",
        "_MultiProcessingDataLoaderIter._shutdown_workers",
        parameters=("self",),
        why="as above",
    ),
    Pinned(
        "torchdata.stateful_dataloader.stateful_dataloader",
        "_StatefulMultiProcessingDataLoaderIter._shutdown_workers",
        parameters=("self",),
        why="as above, for torchdata's StatefulDataLoader",
    ),
    Pinned(
        "lightning.pytorch.strategies.launchers",
        "_SubprocessScriptLauncher",
        attribute="procs",
        why="the processes the launcher started, the list its watcher polls: no public way to stop the watcher "
        "(tests/test_sharded.py shows the watcher reads the list the engine empties)",
    ),
    Pinned(
        "lightning.pytorch.strategies",
        "ModelParallelStrategy",
        attribute="_data_parallel_size",
        why="the data-parallel size once the processes are known: the constructor takes a number before the Trainer "
        "says how many there are, and its 'auto' is the number of nodes",
    ),
    Pinned(
        "torch.optim.lr_scheduler",
        "LRScheduler",
        attribute="_last_lr",
        why="what get_last_lr() returns, after an allowed change wrote new rates into a restored schedule's groups: "
        "only its step() writes it",
    ),
    Pinned(
        "lightning.pytorch.trainer.call",
        "_call_callback_hooks",
        parameters=("trainer", "hook_name", "args", "monitoring_callbacks", "kwargs"),
        why="calls each callback's hook unless it is not callable, which `leave_out_empty_batch_hooks` relies on: "
        "Lightning has no public way to say which hooks a callback uses",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
        "_CheckpointConnector._select_ckpt_path",
        parameters=("self", "state_fn", "ckpt_path", "model_provided", "model_connected"),
        why='the ckpt_path a fit was called with while Lightning resolves it (it turns None into "last" when an '
        "OnExceptionCheckpoint is among the callbacks, before any hook runs): no argument or hook carries it",
    ),
    Pinned(
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop",
        attribute="_results",
        why="the sums of the values a training epoch logs with on_epoch=True: no checkpoint holds them, no accessor",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.logger_connector.result",
        "_ResultMetric",
        attribute="cumulated_batch_size",
        why="a logged mean's running sum of batch sizes, beside its `value`, `meta` and `is_tensor`: as above",
    ),
    Pinned(
        "torchmetrics",
        "Metric",
        attribute="_update_count",
        why="a metric's count of updates, which its public update_count reads and only its update writes",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.logger_connector.result",
        "_ResultCollection.log",
        parameters=RESULT_LOG_PARAMETERS,
        why="logs a stopped run's epoch values again as its self.log calls did (their arguments are the result's "
        "`meta`, with `sync.should` and `sync.rank_zero_only`): the module's log needs a hook of the module running",
    ),
]


# The hooks Lightning calls on every callback at every batch, whether the callback implements them or not.
BATCH_HOOKS = (
    "on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end",
)  # fmt: skip


def leave_out_empty_batch_hooks(callbacks: list) -> None:
    """Set to None, on each callback, the batch hooks its class leaves as Callback's empty ones. Lightning calls each
    of them at every batch (six a training batch per callback) and skips a hook that is not callable
    (`_call_callback_hooks`): the Trainer's cost of a batch then grows with the hooks the callbacks implement, not with
    the number of callbacks. (A subclass's `super()` call still finds the class's method; only the instance's
    attribute is None.)"""
    for callback in callbacks:
        own = getattr(callback, "__dict__", None)  # (a callback with __slots__ only is left as it is)
        for hook in BATCH_HOOKS if own is not None else ():
            if hook not in own and getattr(type(callback), hook, None) is getattr(L.Callback, hook):
                setattr(callback, hook, None)


def batches_that_stepped(trainer: L.Trainer) -> int:
    """The batches after which an optimizer stepped: the step Lightning's loggers write `self.log`'s values at."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_batches_that_stepped(trainer: L.Trainer, steps: int) -> None:
    """Move Lightning's logging step (an evaluation of a checkpoint logs at the step it was taken)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = steps


def ckpt_path_being_resolved() -> tuple[L.Trainer, object] | None:
    """While Lightning resolves a fit's `ckpt_path` (it reads an OnExceptionCheckpoint's `ckpt_path` for "last", and
    for a fit without one, which it turns into "last"), the trainer and the `ckpt_path` the fit was called with, read
    from the frame of its `_CheckpointConnector._select_ckpt_path` on the call stack; None at any other time."""
    code = _CheckpointConnector._select_ckpt_path.__code__
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return None if frame is None else (frame.f_locals["self"].trainer, frame.f_locals["ckpt_path"])


def epoch_sums(trainer: L.Trainer) -> dict[str, dict]:
    """What this training epoch has logged with on_epoch=True, by Lightning's key for each (`<hook>.<name>`): the
    arguments of its `self.log` call (`log`), and for a tensor Lightning's running sum, `value`, and for a mean
    `cumulated_batch_size`. Lightning keeps them in the epoch loop's result collection, which no checkpoint holds and
    no public accessor reads."""
    sums = {}
    for key, result in trainer.fit_loop.epoch_loop._results.items():
        meta = result.meta
        if not meta.on_epoch or result.has_reset:
            continue
        log = {"fx": meta.fx, "name": meta.name, "prog_bar": meta.prog_bar, "logger": meta.logger,
               "on_step": meta.on_step, "reduce_fx": meta.reduce_fx.__name__, "enable_graph": meta.enable_graph,
               "add_dataloader_idx": meta.add_dataloader_idx, "metric_attribute": meta.metric_attribute,
               "sync_dist": meta.sync.should, "rank_zero_only": meta.sync.rank_zero_only}  # fmt: skip
        sums[key] = {"log": log}
        if result.is_tensor:
            sums[key]["value"] = result.value
            if meta.is_mean_reduction:
                sums[key]["cumulated_batch_size"] = result.cumulated_batch_size
    return sums


def add_to_epoch_sums(trainer: L.Trainer, saved: dict[str, dict]) -> list[str]:
    """Add `saved` sums (epoch_sums of a run that stopped) to the keys this process has logged since, each once: its
    sum then holds one batch's value, so adding the saved sum to it keeps the order of Lightning's own additions (a
    max or min is taken instead); a logged Metric's states are its own. The keys found."""
    results, found = trainer.fit_loop.epoch_loop._results, []
    for key, values in saved.items():
        result = results.get(key)
        if result is None or result.has_reset:
            continue
        found.append(key)
        if not result.is_tensor:
            continue
        value = values["value"].to(result.value.device)
        if result.meta.is_max_reduction or result.meta.is_min_reduction:
            result.value = result.meta.reduce_fx(value, result.value)
        else:
            result.value = value + result.value
        if "cumulated_batch_size" in values:
            result.cumulated_batch_size = values["cumulated_batch_size"].to(value.device) + result.cumulated_batch_size
    return found


def log_again(trainer: L.Trainer, module: L.LightningModule, saved: dict[str, dict]) -> None:
    """Log `saved` (epoch_sums of a run that stopped, which this process has not logged since) into this training
    epoch's results as the stopped run had, with its sums (a Metric: the module's, by attribute), so that the epoch's
    end logs and resets them as Lightning would have: a run resumed after an epoch's last batch logs no batch before
    that epoch ends."""
    results = trainer.fit_loop.epoch_loop._results
    for key, entry in saved.items():
        log = dict(entry["log"])
        value = entry["value"] if "value" in entry else module.get_submodule(log["metric_attribute"])
        results.log(log.pop("fx"), log.pop("name"), value, sync_dist_fn=trainer.strategy.reduce, batch_size=1, **log)
        if "value" in entry:
            results[key].value = entry["value"].to(results[key].value.device)
        if "cumulated_batch_size" in entry:
            results[key].cumulated_batch_size = entry["cumulated_batch_size"].to(results[key].value.device)


def set_update_count(metric, count: int) -> None:
    """Give a torchmetrics Metric whose states were put back the count of updates they hold, which its compute reads
    (it warns when there were none)."""
    metric._update_count = count


def metrics_lightning_logs(trainer: L.Trainer) -> list:
    """The torchmetrics Metrics the training epoch logged (`self.log(name, metric)`), which Lightning resets at the
    epoch's end."""
    results = trainer.fit_loop.epoch_loop._results
    return [result.value for result in results.values() if not result.is_tensor]


def set_last_lrs(schedule) -> None:
    """Make a torch LR schedule's get_last_lr() report the rates its optimizer's groups hold now, written there by
    hand between two of its steps."""
    schedule._last_lr = [group["lr"] for group in schedule.optimizer.param_groups]


def full_checkpoint(trainer: L.Trainer) -> dict:
    """The trainer's whole state, the dict `trainer.save_checkpoint` would write."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


def swap_in_training_weights(callback, module: L.LightningModule) -> None:
    """During a validation, put the training weights back into `module` (a WeightAveraging swapped the averaged in)."""
    if callback._average_model is not None:
        callback._swap_models(module)


def set_data_parallel_size(strategy, size: int) -> None:
    """Make a ModelParallelStrategy's data-parallel dimension `size` processes, before its `setup_environment` builds
    the device mesh (which then keeps it): its constructor's `data_parallel_size` is fixed before the Trainer says how
    many processes there are."""
    strategy._data_parallel_size = size


def unscales_in_its_step(optimizer) -> bool:
    """Whether the optimizer unscales gradients inside its own step (fused AdamW), so GradScaler leaves them scaled."""
    return getattr(optimizer, "_step_supports_amp_scaling", False)


def unscaled_yet(scaler, optimizer) -> bool:
    """Whether GradScaler has unscaled this optimizer's gradients in this step."""
    from torch.amp.grad_scaler import OptState

    return scaler._per_optimizer_states[id(optimizer)]["stage"] is not OptState.READY


def num_samples_given(sampler) -> bool:
    """Whether a RandomSampler was given a number of samples of its own."""
    return sampler._num_samples is not None


def accumulating(trainer: L.Trainer) -> bool:
    """Whether the current batch is inside an accumulation window (its optimizer does not step after it)."""
    return trainer.fit_loop.epoch_loop._should_accumulate()


def bars_made(progress_bar) -> list:
    """The training and validation bars a TQDMProgressBar has made so far: its public properties raise until then."""
    return [bar for bar in (progress_bar._train_progress_bar, progress_bar._val_progress_bar) if bar is not None]


def set_restarting(loop, restarting: bool) -> None:
    """Set a loop's `restarting` (and its children's) as Lightning's base loop does, without the fit loop's rule: only
    the base loop's own (private) property does that."""
    _Loop.restarting.fset(loop, restarting)


def lightning_instantiator(cli, key: str):
    """LightningCLI's builder of the model or data (`key`), recording its class and arguments as the checkpoints'
    hyperparameters: LightningCLI does not export it."""
    from lightning.pytorch.cli import _InstantiatorFn

    return _InstantiatorFn(cli=cli, key=key)


def subcommands_action(parser):
    """The parser's subcommands action (`add_subcommand`; `choices`: each subcommand's parser), None without any:
    jsonargparse keeps it on no public attribute."""
    return getattr(parser, "_subcommands_action", None)


def parser_actions(parser) -> list:
    """The arguments a parser holds, as argparse actions: argparse lists them on no public attribute."""
    return parser._actions


def load_whole_state(state: dict, reader, planner=None) -> None:
    """DCP's load of a whole checkpoint into the empty `state`, in this process alone (by default with the planner
    that rebuilds every entry): the public `load` fills only the keys `state` has."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    planner = _EmptyStateDictLoadPlanner() if planner is None else planner
    _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)


def set_nested(root: dict, path, value) -> None:
    """Put `value` into the nested `root` along DCP's object path, as DCP's default planner does with a private
    helper."""
    from torch.distributed.checkpoint._traverse import set_element

    set_element(root, path, value)


def study_storage(study):
    """The storage an Optuna study reads and writes through: Study exposes none."""
    return study._storage


def trial_id_of(trial) -> int:
    """The id the study's storage knows an Optuna trial (a Trial or a FrozenTrial) by: Optuna shows only its number."""
    return trial._trial_id


def stale_trial_ids(storage, study_id: int) -> list[int]:
    """The study's running trials whose heartbeats stopped: Optuna's public `fail_stale_trials` fails them instead."""
    return storage._get_stale_trial_ids(study_id)


def split_by_node(dataset) -> bool:
    """Whether a Hugging Face stream was split by `split_dataset_by_node` already: datasets has no public query."""
    return dataset._distributed is not None


def end_persistent_workers(loader) -> None:
    """End a loader's persistent workers, so that its next iterator starts new ones: DataLoader has no public
    shutdown, and persistent workers keep what they were given at their start (a stream's epoch)."""
    iterator = getattr(loader, "_iterator", None)  # (a loader class of a library's own may have none)
    if iterator is None:
        return
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


class _ShownRunning:
    """A rank the launcher started, as its watcher reads it inside `ranks_shown_running`: running. Signals and waits
    reach the process."""

    returncode = None

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.pid = process, process.pid

    def poll(self) -> None:
        return None

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)


@contextlib.contextmanager
def ranks_shown_running(launcher):
    """Inside the block, Lightning's launcher watcher reads the ranks it started as running: a rank that stops there
    (one killed during a save) is this process's to report, with its own line and status, where the watcher, polling
    on its own, would now and then SIGKILL it first. The launcher has no public way to pause its watcher."""
    started = list(launcher.procs) if launcher is not None else []
    if started:
        launcher.procs[:] = [_ShownRunning(process) for process in started]  # (the watcher holds this list)
    try:
        yield
    finally:
        if started and launcher.procs:  # (emptied by stop_watching_ranks when the block failed)
            launcher.procs[:] = started


def stop_watching_ranks(launcher, timeout: float = 5.0) -> None:
    """Reap the processes Lightning's launcher started, which this one has killed, and empty the list its watcher
    thread reads: the watcher SIGKILLs this process when one of them ends non-zero, which would cut off its own error
    line and exit status. The launcher has no public way to stop its watcher. (A process blocked in a hung filesystem
    ends only when its call returns: it is not waited for past `timeout`.)"""
    deadline = time.monotonic() + timeout
    for process in launcher.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    launcher.procs.clear()
