"""The command line: `python -m template_package fit|validate|test|predict [--config FILE ...] [--key value ...]`, and
the tools `sweep`, `export` and `grad_norms`.

LightningCLI, in subclass mode, builds the model and DataModule classes that `configs/default.yaml` and any
`--config` presets and flags name (`--model a.b.MyModel`), gives the model the values it takes from the data, builds
the engine's Trainer, and saves the resolved config into the run directory. This module adds what the run-directory
contract needs: `--trainer.default_root_dir DIR` holds `DIR/checkpoints/last.ckpt`, `DIR/config.yaml` and the
TensorBoard events, and `fit --ckpt_path last` resumes that run, or starts it when there is nothing to resume yet.
"""

import ast
import importlib
import inspect
import logging
import os
import sys
import textwrap
import threading
import warnings
from argparse import ArgumentError
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden

from ..errors import MACHINE_FAULTS, UsageError, is_a_users_mistake, one_line, original_error
from ..internals import lightning_instantiator, subcommands_action
from ..report.predictions import PredictionsCSV
from ..resume.changes import ChangedModelSettings, check_resume_changes, loading_options
from ..resume.durable import DurableCheckpointIO, replace_durably
from ..resume.exact_resume import ExactResume
from ..resume.object_lock import ObjectLock
from ..resume.remote_run import MirroredCheckpointIO, RemoteRun, StoreSettings, StoreSync, is_url
from ..resume.run_lock import RunLock, is_global_rank_zero
from ..resume.stop_signals import STOP_SIGNALS
from ..training.monitor import BestCheckpoints, follow_the_monitored_metric
from ..training.steps import log_at_the_checkpoints_step, steps_in
from ..training.trainer import Trainer
from .checks import (
    check_architecture,
    check_checkpoint,
    check_checkpoint_class,
    check_logger_extras,
    check_world_size,
    class_options,
    explain_parse_error,
    names_a_class,
    take_run_dir,
)
from .exit_with_parent import exit_with_parent_if_asked
from .help import TOOL_MODULES, TOOLS, ProjectArgumentParser, program, project_description
from .old_class_paths import updated_config, with_moved_classes
from .own_defaults import default_classes, with_own_defaults
from .run_directory import (
    checkpoint_dir,
    configure_loggers,
    fetched_checkpoint,
    local_path_of,
    point_at,
    predictions_csv,
    resolve_resume,
    run_of_checkpoint,
    run_report,
    work_in_the_store,
)

ENGINE = __package__.rsplit(".", 1)[0]  # this engine, wherever it was copied


def reporting_defaults() -> dict:
    """The engine's loggers and reporting callbacks, for any config (one that names only your classes too): TensorBoard
    in the run directory, one run across resumes (run_directory.configure_loggers), the progress bar redrawn by time
    and the throughput. A config's `trainer.logger` or `trainer.callbacks` replace them; `callbacks+:` adds to them.
    (The Trainer's own defaults, in its signature: training/trainer.py; the seed: build_cli.)"""
    tensorboard = {"save_dir": ".", "name": "", "version": "", "default_hp_metric": False}  # events in the run dir
    return {
        "trainer.logger": [{"class_path": f"{ENGINE}.report.loggers.RunTensorBoardLogger", "init_args": tensorboard}],
        "trainer.callbacks": [
            {"class_path": f"{ENGINE}.report.progress.TimedProgressBar"},
            {"class_path": f"{ENGINE}.report.throughput.Throughput"},
        ],
    }


DEFAULT_CONFIG_VARIABLE = "ENGINE_DEFAULT_CONFIG"  # names another default config file; set but empty: none


def find_default_config() -> Path | None:
    """The config every command starts from: the file the environment variable ENGINE_DEFAULT_CONFIG names (set but
    empty: none, every option from the command), else the project's configs/default.yaml, in the nearest folder above
    this engine that has one (the project root of an editable install, `pip install -e .`), wherever the engine was
    copied. None: every option from the command."""
    named = os.environ.get(DEFAULT_CONFIG_VARIABLE)
    if named is not None:
        if named and not Path(named).is_file():
            raise SystemExit(f"error: {DEFAULT_CONFIG_VARIABLE}={named} is not a file: name a config file, or unset it")
        return Path(named) if named else None
    for folder in Path(__file__).resolve().parents:
        if (folder / "configs" / "default.yaml").is_file():
            return folder / "configs" / "default.yaml"
    return None


SEED = 42  # seed_everything's default: python, numpy, torch, CUDA and every loader worker


class RunConfigCallback(SaveConfigCallback):
    """Saves the resolved config as DIR/config.yaml once training starts: validate/test/predict leave it alone, and
    a fit that fails during set-up (a bad checkpoint, a warmup longer than the run) does not touch the run. Written
    atomically (a temporary file, fsynced, renamed over it): a resumed run rewrites it, and a resume compares its
    settings with it, so a half-written one would read as changed settings."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pass

    remote: RemoteRun | None = None  # a run directory in object storage: its URL is what the config says

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and not self.already_saved:  # in the run directory, whatever the loggers
            path = Path(trainer.default_root_dir) / self.config_filename
            path.parent.mkdir(parents=True, exist_ok=True)
            written = path.with_name(path.name + ".tmp")
            config = self.config
            if self.remote is not None:
                config = config.clone()
                config.trainer.default_root_dir = self.remote.shown
                config.ckpt_path = config.ckpt_path and self.remote.shown_path(config.ckpt_path)
            self.parser.save(config, written, skip_none=False, overwrite=True, multifile=self.multifile)
            if self.remote is not None:  # (the loggers' save_dir too)
                written.write_text(written.read_text().replace(str(self.remote.local), self.remote.shown))
            replace_durably(written, path)
        self.already_saved = True


class ProjectCLI(LightningCLI):
    """LightningCLI with the run-directory contract and the project's checkpoint callbacks.

    The model and the data are the classes the config names (`model: class_path:`, `data: class_path:`, or
    `--model a.b.MyModel --data a.b.MyData`), never classes a checkpoint names. `fit` holds the run directory's lock
    (resume/run_lock.py) from the moment its options are parsed until it returns.
    """

    def __init__(self, *args, run_subcommand: bool = True, requested: str | None = None, **kwargs) -> None:
        self.run_subcommand = run_subcommand
        self.requested = requested  # the subcommand the command line starts with, if it names one
        self.run_lock: RunLock | ObjectLock | None = None
        self.run_dir: Path | None = None  # fit's, once parsed (a run in object storage: its local folder)
        self.remote: RemoteRun | None = None  # a run directory in object storage
        self.checkpoint: dict | None = None  # --ckpt_path, memory-mapped, once parsed
        self._built_data: L.LightningDataModule | None = None
        try:
            super().__init__(*args, **kwargs)  # parses, builds and runs the subcommand
        except Exception as wrapped:
            error = original_error(wrapped)  # the model's or data's own, when it failed while being built
            if os.environ.get("TRACEBACK") or not is_a_users_mistake(error):
                if error is not wrapped:  # its own traceback, without jsonargparse's wrapper around it
                    raise error from error.__cause__
                raise
            raise SystemExit(f"error: {one_line(error, self.run_dir)}") from None
        finally:
            if self.remote is not None:
                self._finish_uploads(self.remote.settings.stop_timeout)
            if isinstance(self.run_lock, ObjectLock):  # (after a stop signal, within the little time left)
                self.run_lock.release(timeout=2.0 if STOP_SIGNALS.exit_code is not None else None)
            elif self.run_lock is not None:
                self.run_lock.release()

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs) -> None:
        """Lightning's subcommands, and the tools that main runs itself, so that --help lists them all. A command
        that starts with its subcommand gets that one's parser only: each parser reads the signatures of every class
        it can build, the largest part of a start once the imports are done."""
        if self.requested is not None:  # (Lightning builds a parser for each subcommand that subcommands() names)
            self.subcommands = lambda: {self.requested: type(self).subcommands()[self.requested]}
        try:
            super()._add_subcommands(parser, **kwargs)
        finally:
            vars(self).pop("subcommands", None)
        subcommands = subcommands_action(parser)
        for name, description in TOOLS.items():
            subcommands.add_subcommand(name, LightningArgumentParser(description=description), help=description)

    def subcommand_defaults(self, subcommand: str) -> Namespace:
        """The defaults of a subcommand's options, as its parser has them."""
        return subcommands_action(self.parser).choices[subcommand].get_defaults()

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The trainer, the data and the model, the last two by class path. The data comes before the model: the
        classes are built in this order, and the model may take values from the data (`_add_instantiators`)."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.add_lightning_class_args(L.LightningDataModule, "data", subclass_mode=True, required=False)
        parser.add_lightning_class_args(L.LightningModule, "model", subclass_mode=True)

    def _add_instantiators(self) -> None:
        """Lightning's own instantiators (they record each class's arguments and class path as the hyperparameters of
        every checkpoint), with the values the data gives the model: an argument of the model left at None (its
        default, or `null` in a config) is the value of the data's attribute of the same name, such as num_classes,
        in_channels or vocab_size. A value given explicitly wins; a class without the argument gets nothing."""
        build_data, build_model = lightning_instantiator(self, "data"), lightning_instantiator(self, "model")

        def data(class_type, *args, applied_instantiation_links: dict, **kwargs):
            self._built_data = build_data(class_type, *args, applied_instantiation_links=applied_instantiation_links,
                                          **kwargs)  # fmt: skip
            return self._built_data

        def model(class_type, *args, applied_instantiation_links: dict, **kwargs):
            if self._built_data is None and self.config[self.config.subcommand].data is not None:
                raise RuntimeError("the data must be built before the model, which takes values from it")
            given = values_from_data(self._built_data, kwargs, class_type)
            if given and is_global_rank_zero():  # (the hidden contract, said when it happens)
                taken = ", ".join(f"model.{name}={value!r:.40}" for name, value in given.items())
                print(f"engine: {taken} from {type(self._built_data).__name__} (an argument left at None takes the "
                      "data's value)", file=sys.stderr)  # fmt: skip
            links = {**applied_instantiation_links, **{f"model.init_args.{name}": v for name, v in given.items()}}
            return build_model(class_type, *args, applied_instantiation_links=links, **{**kwargs, **given})

        self.parser.add_instantiator(data, L.LightningDataModule, subclasses=True)
        self.parser.add_instantiator(model, L.LightningModule, subclasses=True)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Always present, configured under `checkpoint.*` and `last_checkpoint.*` (both in DIR/checkpoints), and
        # `predictions.*` (DIR/predictions.csv).
        parser.add_lightning_class_args(BestCheckpoints, "checkpoint")
        parser.add_lightning_class_args(ExactResume, "last_checkpoint")
        parser.add_lightning_class_args(PredictionsCSV, "predictions")
        for key in ("checkpoint.dirpath", "last_checkpoint.dirpath"):
            parser.link_arguments("trainer.default_root_dir", key, compute_fn=checkpoint_dir)
        parser.link_arguments("trainer.default_root_dir", "predictions.path", compute_fn=predictions_csv)
        parser.set_defaults(reporting_defaults())
        parser.add_argument(
            "--allow_change", type=str, default="",
            help="options, comma-separated, that may differ from the checkpoint's when fit resumes a run (see "
            "resume/changes.py), e.g. model.lr,data.batch_size: the run goes on with the new values, no longer exactly",
        )  # fmt: skip
        parser.add_argument(
            "--run_lock", type=Literal["on", "off", "takeover"], default="on",
            help="one fit at a time per run directory: on; takeover: take over the lock of a run in object storage "
            "whose machine is gone without waiting for it to expire; off: no lock (a store without conditional writes)",
        )  # fmt: skip
        parser.add_class_arguments(StoreSettings, "store")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse, then check what was given, before LightningCLI reads a checkpoint or builds anything."""
        command = sys.argv[1:] if args is None else args
        try:
            if isinstance(command, list):  # (LightningCLI's own parse_arguments, with the switches made explicit)
                self.config = parser.parse_args(with_own_defaults(command, default_classes(find_default_config())))
            else:
                super().parse_arguments(parser, args)
        except ArgumentError as error:
            raise SystemExit(f"error: {explain_parse_error(str(error), self.parser)}") from None
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand]
        if config.ckpt_path:
            config.ckpt_path = local_path_of(config.ckpt_path)
        if subcommand != "fit" and config.ckpt_path:
            self._in_the_checkpoints_run(config, self.subcommand_defaults(subcommand))
        if str(config.trainer.default_root_dir).startswith("file://"):
            point_at(config, local_path_of(config.trainer.default_root_dir))
        root = str(config.trainer.default_root_dir)
        self.remote = RemoteRun(root, config.store) if is_url(root) else None
        if subcommand == "fit" and is_global_rank_zero():  # one lock and one probe per job, not one per process
            self.run_lock = take_run_dir(self.remote or Path(root), config.run_lock)
        if self.remote is not None:
            work_in_the_store(config, self.remote, fit=subcommand == "fit")
        elif config.ckpt_path:
            config.ckpt_path = fetched_checkpoint(config.ckpt_path)
        if subcommand == "fit":
            self.run_dir = Path(config.trainer.default_root_dir)
            resolve_resume(config, self.shown)
        self.checkpoint = check_checkpoint(config.ckpt_path, config.weights_only) if config.ckpt_path else None
        if self.checkpoint is not None:
            check_checkpoint_class(config.ckpt_path, self.checkpoint, config)
        resumed_step = (steps_in(self.checkpoint) if self.checkpoint else 0) if subcommand == "fit" else None
        check_logger_extras(config.trainer.logger)
        configure_loggers(config, resumed_step, run_name=self.remote.shown if self.remote else None)

    def _run_subcommand(self, subcommand: str) -> None:
        if self.run_subcommand:
            super()._run_subcommand(subcommand)
        else:
            self._check_architecture()

    def shown(self, path: Path | str) -> str:
        """A path of the run as the user named it: the URL for a run directory in object storage."""
        return self.remote.shown_path(path) if self.remote is not None else str(path)

    @staticmethod
    def _in_the_checkpoints_run(config, defaults) -> None:
        """validate, test and predict of a checkpoint in a run directory (`DIR/checkpoints/X.ckpt`, a path or a URL)
        write their logs and predictions.csv into that run, unless --trainer.default_root_dir names another."""
        root = run_of_checkpoint(config.ckpt_path)
        if root is not None and config.trainer.default_root_dir == defaults.trainer.default_root_dir:
            point_at(config, root)

    def before_instantiate_classes(self) -> None:
        follow_the_monitored_metric(self.config[self.subcommand])

    def _parse_ckpt_path(self) -> None:
        """LightningCLI reads the checkpoint's model hyperparameters over the command line, and in subclass mode
        builds the class the checkpoint names. Here the classes are always the config's (checks.check_checkpoint_class
        refused a checkpoint of another class). A fit compares the hyperparameters (resume/changes.py): a changed flag
        is refused or applied, never silently dropped. validate, test and predict take the settings the model and data
        were trained with (the architecture, the class names, the data folder) where the command line and config
        files left the default: `predict --ckpt_path X --data.predict_dir DIR` needs nothing else, and
        `--model.temperature 0.5` still applies. How the data is loaded (batch size, workers) is never taken."""
        subcommand = self.config.get("subcommand")
        if subcommand == "fit" or self.checkpoint is None:
            return
        config, defaults = self.config[subcommand], self.subcommand_defaults(subcommand)
        runtime = {"batch_size", *loading_options(config.data.class_path)} if config.data is not None else set()
        for section, key, skip in (
            ("model", "hyper_parameters", set()),
            ("data", "datamodule_hyper_parameters", runtime),
        ):
            given, default = config[section], defaults.get(section)
            if given is None or not given.get("init_args"):
                continue  # (a class that takes no arguments: nothing to take)
            if default is None or default.class_path != given.class_path:  # another class: its own defaults
                own = class_options(section, given.class_path).get_defaults().get(section) or Namespace()
                default = Namespace(init_args=own)
            for name, value in (self.checkpoint.get(key) or {}).items():
                if name.startswith("_") or name not in given.init_args or name in skip or names_a_class(value):
                    continue  # (an object to build comes from the config, never from a checkpoint)
                if given.init_args[name] == default.init_args.get(name):
                    given.init_args[name] = value

    def _check_architecture(self) -> None:
        """After the model is built: does the checkpoint fit it? One line instead of load_state_dict's page."""
        if self.checkpoint is not None:
            check_architecture(self.config_init[self.subcommand].ckpt_path, self.checkpoint, self.model)

    def _before_evaluation(self) -> None:
        if self.remote is not None:
            say_the_url(self.trainer, self.remote)
            if is_global_rank_zero():  # its logs and predictions go to the store at the end
                self.remote.start_uploads()
        self._check_architecture()
        if self.checkpoint is not None:
            log_at_the_checkpoints_step(self.trainer, self.checkpoint)

    before_validate = before_test = before_predict = _before_evaluation

    def before_fit(self) -> None:
        # The predictions writer only serves predict; in fit it would only cost every training hook a call.
        self.trainer.callbacks[:] = [c for c in self.trainer.callbacks if not isinstance(c, PredictionsCSV)]
        if self.remote is not None:
            self._keep_in_the_store(self.trainer, self.remote)
        for callback in self.trainer.callbacks:
            if isinstance(callback, ExactResume):
                callback.locks = self.config_init["fit"].run_lock != "off"
        if self.checkpoint is not None:  # the classes are built and the trainer knows its world size: nothing ran yet
            config = self.config_init["fit"]
            allowed = config.allow_change.split(",")
            # First the settings (a changed --model.width is named with both values), then the weights that follow.
            changed = check_resume_changes(
                config, self.checkpoint, config.ckpt_path, allowed, self.model, self.datamodule
            )
            if any(option.startswith("model.") for option in changed):
                self.trainer.callbacks.append(ChangedModelSettings())
            moves = check_world_size(config.ckpt_path, self.checkpoint, self.trainer, allowed)
            for callback in self.trainer.callbacks:
                if isinstance(callback, ExactResume):
                    callback.allowed, callback.world_size_may_change = allowed, moves
        self._check_architecture()

    def _keep_in_the_store(self, trainer: L.Trainer, remote: RemoteRun) -> None:
        """A fit whose run directory is in object storage: its checkpoints and logs written locally and uploaded in
        the background by the global rank 0 (resume/remote_run.py); config.yaml names the URL."""
        if isinstance(trainer.strategy, ModelParallelStrategy):
            raise UsageError(
                f"--trainer.default_root_dir {remote.shown}: a sharded checkpoint (configs/fsdp.yaml) cannot be kept "
                "in object storage yet; give a local or shared folder"
            )
        say_the_url(trainer, remote)
        if not is_global_rank_zero():
            return
        if type(trainer.strategy.checkpoint_io) is not DurableCheckpointIO:
            raise UsageError(
                f"--trainer.default_root_dir {remote.shown}: a run in object storage writes its checkpoints with the "
                f"engine's own CheckpointIO, not {type(trainer.strategy.checkpoint_io).__name__}: leave the plugin out"
            )
        uploads = remote.start_uploads()
        lock = self.run_lock if isinstance(self.run_lock, ObjectLock) else None
        trainer.strategy.checkpoint_io = MirroredCheckpointIO(uploads, lock)
        trainer.callbacks.insert(0, StoreSync(uploads))

    def _finish_uploads(self, timeout: float | None) -> None:
        """Upload what is left of a run in object storage (within `timeout`), or say where it is kept."""
        remote, self.remote = self.remote, None
        if not remote.finish(timeout) and remote.uploads.error is None:
            print(f"error: the run's last files did not reach {remote.shown} within {timeout:g} s: they are kept in "
                  f"{remote.local}", file=sys.stderr)  # fmt: skip
        elif remote.uploads is not None and STOP_SIGNALS.exit_code is not None:
            print(f"uploaded to {remote.shown}: continue the run with --ckpt_path last", file=sys.stderr)
        remote.close()

    def after_fit(self) -> None:
        if self.remote is not None and self.remote.uploads is not None:  # the report comes once all is in the store
            remote = self.remote
            if not remote.finish(None):
                raise remote.uploads.error
        if self.trainer.is_global_zero and not self.trainer.fast_dev_run:
            print(run_report(self.trainer, Path(self.config_init["fit"].trainer.default_root_dir), self.shown))


def say_the_url(trainer: L.Trainer, remote: RemoteRun) -> None:
    """The callbacks that save or print a run's paths give the URL of a run in object storage, not its local
    folder."""
    for callback in trainer.callbacks:
        if isinstance(callback, RunConfigCallback):
            callback.remote = remote
        elif isinstance(callback, BestCheckpoints):
            callback.moved = (str(remote.local), remote.shown)
        elif isinstance(callback, ExactResume):
            callback.shown = remote.shown_path(callback.path)


def main(args: list[str] | None = None) -> ProjectCLI:
    """Parse `args` (default: sys.argv) and run the subcommand.

    A mistake in what was given ends with one line (`TRACEBACK=1` shows the traceback too), a bug with its traceback
    (errors.py, ProjectCLI); a stop signal ends the process with 128 + its number (resume/stop_signals.py)."""
    command = sys.argv[1:] if args is None else args  # (LightningCLI warns when given sys.argv as args)
    if command[:1] and command[0] in TOOLS:
        return run_tool(command[0], command[1:])
    exit_with_parent_if_asked()
    quiet_third_party_notices()
    threading.excepthook = _machine_faults_are_reported_once
    STOP_SIGNALS.install()
    try:
        cli = build_cli(args)
    except SystemExit as stop:
        # Lightning's own SIGTERM exception exits 0; a scheduler must see that the run was stopped.
        if not stop.code and STOP_SIGNALS.exit_code is not None:
            raise SystemExit(STOP_SIGNALS.exit_code) from None
        if stop.code is not None and stop.code == STOP_SIGNALS.exit_code:
            leave_process_group()  # every rank stops at the same step (resume.ExactResume)
        raise
    finally:
        exit_code = STOP_SIGNALS.exit_code
        STOP_SIGNALS.uninstall()
    leave_process_group()
    if exit_code is not None:  # a signal after training had ended: its final state is saved
        raise SystemExit(exit_code)
    return cli


def leave_process_group() -> None:
    """Destroy the process group of a multi-process run that ended on every rank. Left to the interpreter's exit,
    gloo's threads are torn down after Python's and the process can abort (SIGABRT, "terminate called without an
    active exception", pytorch/pytorch#190489). Not after an error:
    the other ranks may be inside a collective, and destroying would hang (pytorch/torchtitan#1342)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run_tool(name: str, args: list[str]) -> None:
    """`python -m <package> sweep|export|grad_norms`: see sweep/search.py, cli/export.py and cli/grad_norms.py
    (imported only here: Optuna and ONNX are extras)."""
    extras = {"optuna": "sweep", "matplotlib": "sweep", "onnx": "onnx", "onnxscript": "onnx", "onnxruntime": "onnx"}
    try:
        tool = importlib.import_module(f"{ENGINE}.{TOOL_MODULES[name]}")
    except ModuleNotFoundError as missing:
        if missing.name not in extras:
            raise
        raise SystemExit(f'error: {name} needs {missing.name}: pip install -e ".[{extras[missing.name]}]"') from None
    tool.main(args)


def quiet_third_party_notices() -> None:
    """Hide what our dependencies print on every run that a user can do nothing about, and only that: Lightning's
    advertisement for its cloud logger, two deprecation warnings of calls inside torchdata and Lightning, the warning
    that the checkpoint folder is not empty (a resumed run's own), with configs/ema.yaml a warning about sharded
    models (this project's configure_model shards nothing), and on a machine with SLURM's srun, the warning that it is
    not used (every command run outside a job; a job's own run is started by srun, scripts/slurm.sbatch)."""
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    warnings.filterwarnings("ignore", message="You're using the WeightAveraging callback with a model that overrides")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning)
    # A run directory is never overwritten (fit refuses; --ckpt_path last resumes it): the warning is always about
    # the run's own checkpoints.
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message="The `srun` command is available on your system but is not used")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_not_the_litlogger_tip)


def _not_the_litlogger_tip(record: logging.LogRecord) -> bool:
    return "litlogger" not in record.getMessage()


def _machine_faults_are_reported_once(args: threading.ExceptHookArgs) -> None:
    """A full disk met by a helper thread first (TensorBoard's writer) reaches the main thread at its next write,
    which reports it in one line: the thread's own traceback would only bury that line."""
    if not (isinstance(args.exc_value, OSError) and args.exc_value.errno in MACHINE_FAULTS):
        threading.__excepthook__(args)


def build_cli(args: list[str] | None, run_subcommand: bool = True) -> ProjectCLI:
    """The CLI without main's error handling; with `run_subcommand=False` it parses, checks the checkpoint and builds
    the classes, and runs nothing (export builds the model this way)."""
    # allow_abbrev off: argparse would take a mistyped --trainer.max_epoch for --trainer.max_epochs, silently.
    found = find_default_config()
    default_config = [updated_config(str(found))] if found else []  # (classes that moved)
    defaults = {"default_config_files": default_config, "exit_on_error": False, "allow_abbrev": False}
    command = sys.argv[1:] if args is None else list(args)
    if (moved := with_moved_classes(command)) != command:
        args = moved
    # The project's description (a search of the installed distributions) only when help is shown.
    shows_help = {"-h", "--help"} & set(command)  # (moved class paths change neither the switches nor the subcommand)
    description = project_description(__package__) if shows_help else None
    top = {"prog": program(), "description": description, "exit_on_error": False, "allow_abbrev": False}
    evaluations = ("fit", "validate", "test", "predict")
    return ProjectCLI(
        None,  # the model and data classes: the ones the config names (subclass mode)
        None,
        trainer_class=Trainer,
        save_config_callback=RunConfigCallback,
        save_config_kwargs={"overwrite": True},  # a resumed run rewrites its own config
        parser_class=ProjectArgumentParser,
        parser_kwargs={**top, **dict.fromkeys(evaluations, defaults)},
        args=args,
        auto_configure_optimizers=False,
        seed_everything_default=SEED,
        run_subcommand=run_subcommand,
        requested=command[0] if command and command[0] in evaluations else None,
    )


def values_from_data(data: L.LightningDataModule | None, arguments: dict, model_class: type | None = None) -> dict:
    """The model's arguments left at None that the data has a value for, under the same name. A data attribute that
    is still None (a DataModule that sets it in setup(), which runs later) stops the run in one line: the model would
    be built with None. A model that builds its layers in configure_model (after setup) takes it from the data there."""
    if data is None:
        return {}
    base = set(vars(L.LightningDataModule()))  # (Lightning's own attributes: trainer, hparams, ...)
    values = {name: getattr(data, name, None) for name, value in arguments.items() if value is None}
    declared = (set(vars(data)) - base) | set_in_setup(type(data))
    late = [name for name, value in values.items() if value is None and name in declared]
    builds_later = model_class is not None and is_overridden("configure_model", model_class, L.LightningModule)
    if late and not builds_later:
        name, data_class = late[0], type(data).__name__
        raise UsageError(
            f"model.{name} is left to the data, but {data_class}.{name} is still None when the model is built (a "
            f"value set in setup(), which runs later): set self.{name} in {data_class}.__init__, give "
            f"--model.{name}, or build the layers that need it in the model's configure_model(), which Lightning "
            f"calls after setup()"
        )
    return {name: value for name, value in values.items() if value is not None and not name.startswith("_")}


def set_in_setup(data_class: type) -> set[str]:
    """The attributes a DataModule's own setup() assigns (`self.num_classes = ...`), read from its source: a value
    set there and nowhere before is not there yet when the model is built."""
    if not is_overridden("setup", data_class, L.LightningDataModule):
        return set()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(data_class.setup)))
    except (OSError, TypeError, SyntaxError):  # (no source: a compiled or generated class)
        return set()
    targets = [t for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign)
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]  # fmt: skip
    return {
        t.attr
        for t in targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
