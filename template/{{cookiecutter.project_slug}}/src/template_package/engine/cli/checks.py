"""Up-front checks of what a user gives the CLI, so that a mistake costs one clear line, not a traceback or a run.

Each check names the bad value and what would be valid, and runs before anything in the run directory is touched.
"""

import difflib
import errno
import importlib.util
import pickle
import re
import sys
from pathlib import Path
from typing import get_args

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser

from ..data.streams import saved_stream
from ..errors import UsageError
from ..internals import parser_actions, subcommands_action
from ..resume.digests import DamagedCheckpoint
from ..resume.object_lock import ObjectLock
from ..resume.remote_run import RemoteRun, store_reason
from ..resume.rng import KEY as RNG_STATES
from ..resume.run_lock import RunDirectoryBusy, RunLock, is_global_rank_zero
from ..resume.whole_checkpoint import is_checkpoint, read_for_checks
from ..training.batch_layout import NO_LAYOUT, saved_layout
from ..training.trainer import PRECISION_INPUT

PRECISIONS = ["auto", *(p for p in get_args(get_args(PRECISION_INPUT)[1]) if "transformer" not in p)]


def explain_parse_error(message: str, parser: LightningArgumentParser) -> str:
    """jsonargparse's error as one line, with the valid values or the closest option name."""
    # From the command line: "unrecognized arguments: --model.lrr=1"; from a config file: "... option 'model.lrr'".
    unknown = re.match(r"unrecognized arguments: (--[^\s=]+)", message) or re.search(
        r"accept option '([^']+)'", message
    )
    if unknown:
        name = unknown.group(1)
        prefix = "--" if name.startswith("--") else ""
        subcommands = subcommands_action(parser)
        subparsers = subcommands.choices if subcommands is not None else {}
        options = [option for subparser in subparsers.values() for option in _options_with_classes(subparser)]
        return f"unknown option {name}: {_closest(name, [prefix + option[2:] for option in options])}"
    in_class = re.match(r'Parser key "(model|data)":.*?Problem with given class_path \'([^\']+)\':\s*(.*?)\n\s*- ',
                        message, re.DOTALL)  # fmt: skip
    if in_class:
        return _explain_class_error(*in_class.groups(), from_command_line="NestedArg" in message)
    key = re.match(r'Parser key "([^"]+)"', message)
    given = re.search(r"Given value: (.*)", message) or re.search(r"Got value: (.*)", message)
    if key and key.group(1) == "trainer.precision" and given:
        return f"trainer.precision={given.group(1)!r} is not a precision: use one of {', '.join(PRECISIONS)}"
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _closest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f"did you mean {close[0]}?" if close else "see --help for the valid options"


def _explain_class_error(group: str, class_path: str, problem: str, from_command_line: bool) -> str:
    """An error inside the arguments of the model or data class, e.g. `--model.lrr`, `--model.lr abc`, or a class
    that cannot be imported."""
    prefix = "--" if from_command_line else ""
    unknown = re.match(r"Option '([^']+)' is not accepted", problem)
    if unknown:
        options = [prefix + option[2:] for option in _options(class_options(group, class_path))]
        name = f"{prefix}{group}.{unknown.group(1)}"
        return f"unknown option {name} for {class_path}: {_closest(name, options)}"
    wrong = re.match(r'Parser key "([^"]+)":\s*(.*?)\. Got value: (.*)', problem, re.DOTALL)
    if wrong:
        key, expected, value = wrong.groups()
        expected = re.sub(r"<class '(\w+)'>", r"\1", expected.strip().splitlines()[0]).removeprefix("Expected a ")
        return f"{prefix}{group}.{key}={value.strip()!r} is not valid for {class_path}: expected a {expected}"
    reason = " ".join(line.strip() for line in problem.splitlines() if line.strip())
    return (
        f"--{group} {class_path} cannot be used ({reason}): give a LightningModule/LightningDataModule class as "
        "package.module.Class, importable from the project's src/, the working directory or PYTHONPATH"
    )


def class_options(group: str, class_path: str):
    """A parser holding only the arguments of `class_path`, as `--<group>.<name>` options."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(import_class(class_path), group, fail_untyped=False)
    return parser


def _options_with_classes(parser) -> list[str]:
    """The parser's options and those of the model and data classes its defaults name."""
    defaults = parser.get_defaults()
    classes = [(group, defaults.get(group)) for group in ("model", "data")]
    return [*_options(parser), *(option for group, configured in classes if configured and "class_path" in configured
                                 for option in _options(class_options(group, configured.class_path)))]  # fmt: skip


def import_class(class_path: str) -> type:
    """The class a config or command line names (never one a checkpoint names: see check_checkpoint_class)."""
    import importlib

    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _options(parser) -> list[str]:
    options = [
        option for action in parser_actions(parser) for option in action.option_strings if option.startswith("--")
    ]
    return [option for option in options if not option.endswith(".help")]


def take_run_dir(root: Path | RemoteRun, mode: str = "on") -> RunLock | ObjectLock | None:
    """Take the run directory for this fit (a folder, or a run in object storage), or stop: another live fit holds
    it, or it cannot be written. `mode` is --run_lock: on, takeover (a lock in object storage, at once) or off. A
    folder's lock is the one the run's ExactResume holds too (shared: resume/run_lock.py)."""
    remote = isinstance(root, RemoteRun)
    shown = root.shown if remote else root
    lock = None if mode == "off" else ObjectLock(root) if remote else RunLock(root, shared=True)
    try:
        if isinstance(lock, ObjectLock):
            lock.acquire(takeover=mode == "takeover")
        elif lock is not None:
            lock.acquire()
    except RunDirectoryBusy as busy:
        raise SystemExit(
            f"error: {shown} is being trained by another fit ({busy.holder}): let it finish or stop it, or give "
            "another --trainer.default_root_dir"
        ) from None
    except Exception as error:
        if not remote and getattr(error, "errno", None) in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            print(f"warning: cannot lock {root} ({error.strerror}): make sure no other fit uses it", file=sys.stderr)
            return None  # (a filesystem without locks)
        if not remote and not isinstance(error, OSError):
            raise
        why = error.strerror if not remote else store_reason(error)
        advice = ", or check the store's address and credentials" if remote else ""
        raise SystemExit(
            f"error: cannot write the run directory {shown} ({why}): give another --trainer.default_root_dir{advice}"
        ) from None
    if not remote:
        check_run_dir_writable(root)
    elif lock is None:  # (a lock proves a store writable)
        check_store_writable(root)
    return lock


def check_run_dir_writable(root: Path) -> None:
    """Fail now, not after an hour of training, when the run directory cannot be written (call it with the run
    directory locked: two processes would race on the probe file)."""
    try:
        (root / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = root / ".write_test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise SystemExit(
            f"error: cannot write the run directory {root} ({error.strerror}): give another --trainer.default_root_dir"
        ) from None


def check_store_writable(remote: RemoteRun) -> None:
    probe = f"{remote.root}/.write_test"
    try:
        remote.call("pipe_file", probe, b"probe")
        remote.call("rm_file", probe)
    except Exception as error:  # noqa: BLE001 - whatever the store answered, in one line
        raise SystemExit(
            f"error: cannot write the run directory {remote.shown} ({store_reason(error)}): give another "
            "--trainer.default_root_dir, or check the store's address and credentials"
        ) from None


def check_checkpoint(ckpt_path: str, weights_only: bool | None) -> dict | None:
    """Refuse a checkpoint that is missing, damaged (its digest: resume/digests.py), unreadable, or needs unpickling
    arbitrary objects, in one line; return it (memory-mapped, so reading it costs little; a sharded one without its
    weights' values) for further checks."""
    if ckpt_path in ("best", "hpc", "registry"):
        return None
    path = Path(ckpt_path)
    if not is_checkpoint(path):
        what = "is not a checkpoint (a folder without .metadata and meta.pt)" if path.is_dir() else "does not exist"
        raise SystemExit(f"error: --ckpt_path {ckpt_path} {what}: give the path of a .ckpt file or sharded folder")
    if path.is_dir() and is_global_rank_zero():
        print(f"notice: --ckpt_path {ckpt_path} is sharded: its meta.pt is checked against its digest, its shard files "
              "only for their sizes (they carry no digest)", file=sys.stderr)  # fmt: skip
    try:  # a sharded folder: its meta.pt, and the shapes of its weights (resume/whole_checkpoint.py)
        checkpoint = read_for_checks(path, weights_only=weights_only is not False)
    except DamagedCheckpoint as damaged:
        why = damaged.reason
        raise SystemExit(f"error: --ckpt_path {ckpt_path} is damaged: {why}: use another checkpoint") from None
    except pickle.UnpicklingError as error:
        if "unsupported global" not in str(error).lower():  # (torch: "Unsupported global", "unsupported GLOBAL")
            raise SystemExit(f"error: --ckpt_path {ckpt_path} is corrupted ({error}): use another checkpoint") from None
        raise SystemExit(
            f"error: --ckpt_path {ckpt_path} holds Python objects that only unpickling can rebuild, and unpickling "
            "runs arbitrary code, so it was refused: if you trust the file, add --weights_only false"
        ) from None
    except (RuntimeError, EOFError, OSError) as error:
        reason = str(error).splitlines()[0]
        message = f"error: --ckpt_path {ckpt_path} is truncated or corrupted ({reason}): use another checkpoint"
        raise SystemExit(message) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise SystemExit(f"error: --ckpt_path {ckpt_path} is not a Lightning checkpoint (no state_dict in it)")
    return checkpoint


# What LightningCLI records in every checkpoint it saves, for `load_from_checkpoint`; never called here.
LIGHTNINGS_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


def names_a_class(value) -> bool:
    """Whether a hyperparameter's value describes an object to build (a class_path anywhere in it)."""
    if isinstance(value, dict):
        return "class_path" in value or any(names_a_class(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(names_a_class(v) for v in value)
    return False


def check_checkpoint_class(ckpt_path: str, checkpoint: dict, config) -> None:
    """Refuse a checkpoint of another model or data class than the ones this command builds, in one line naming
    both. The checkpoint's class is only compared, as text: never imported, so a checkpoint cannot choose the code
    that runs. Class paths compare below the package name, which a generated project renames; a checkpoint that
    records no class (saved by an older release) is not refused here (its weights are still checked)."""
    for section, key in (("model", "hyper_parameters"), ("data", "datamodule_hyper_parameters")):
        hparams = checkpoint.get(key) or {}
        instantiator = hparams.get("_instantiator")
        if instantiator is not None and instantiator != LIGHTNINGS_INSTANTIATOR:
            raise SystemExit(
                f"error: --ckpt_path {ckpt_path} names {instantiator!s:.200} to build its {section}, which no command "
                "here runs: it was not written by this project's fit; use a checkpoint that was"
            )
        saved, built = hparams.get("_class_path"), config[section]
        if saved is None or built is None:
            continue
        if not isinstance(saved, str) or saved.partition(".")[2] != built.class_path.partition(".")[2]:
            raise SystemExit(
                f"error: --ckpt_path {ckpt_path} holds a {section} of class {saved!s:.200}, and this command builds "
                f"{built.class_path}: give the run's own config (-c <run dir>/config.yaml) or --{section} with its "
                "class, or a checkpoint of this class"
            )


def check_architecture(ckpt_path: str, checkpoint: dict, model: L.LightningModule) -> None:
    """Name the weights that do not fit this model, instead of Lightning's page-long load_state_dict error."""
    saved = checkpoint["state_dict"]
    expected = model.state_dict()
    problems = [f"missing {k}" for k in expected if k not in saved]
    problems += [f"unexpected {k}" for k in saved if k not in expected]
    problems += [
        f"{k} is {tuple(saved[k].shape)} in the checkpoint, {tuple(v.shape)} here"
        for k, v in expected.items()
        if k in saved and saved[k].shape != v.shape
    ]
    if problems:
        raise SystemExit(
            f"error: --ckpt_path {ckpt_path} is for another architecture ({'; '.join(problems[:3])}"
            f"{f' and {len(problems) - 3} more' if len(problems) > 3 else ''}): "
            "check the model's options and the data it takes its sizes from, or load partial weights with "
            "strict=False (see README)"
        )


def check_world_size(ckpt_path: str, checkpoint: dict, trainer: L.Trainer, allowed: list[str]) -> bool:
    """Whether the run goes on on another number of processes; a SystemExit with one line when it may not.

    Each rank's random state and data position, and the batches of every optimizer step follow from the world size.
    With `--allow_change world_size` the run goes on with the same global batch on the new number of processes
    (training/batch_layout.py), which the checkpoint's recorded layout makes possible; otherwise it must not change."""
    rng_states = checkpoint.get(RNG_STATES)  # one row per rank
    saved = len(rng_states["torch"]) if rng_states else None
    world_size = trainer.world_size
    if saved is None or saved == world_size:
        return False
    where = f"--ckpt_path {ckpt_path} was saved by {saved} processes and this run has {world_size}"
    if saved_stream(checkpoint) is not None:
        raise SystemExit(
            f"error: {where}, and its train loader reads a stream, of which each process reads its own part: on "
            f"another number of processes it would train other samples; resume it on {saved}"
        )
    if "world_size" not in allowed:
        raise SystemExit(
            f"error: {where} (trainer.num_nodes x trainer.devices): resume it on {saved}, or add --allow_change "
            "world_size to go on with the same global batch (README: Resuming on another number of processes)"
        )
    layout = saved_layout(checkpoint)
    if layout is None:
        why = checkpoint.get(NO_LAYOUT, "it records no batch layout (written by an older version)")
        raise SystemExit(f"error: {where}, and its train loader cannot go on on another number of processes: {why}: "
                         f"resume it on {saved}")  # fmt: skip
    if trainer.limit_train_batches != 1.0:
        raise SystemExit(
            f"error: {where}, and trainer.limit_train_batches={trainer.limit_train_batches} counts each process's "
            "batches: leave it out to go on on another number of processes"
        )
    try:
        layout.on(world_size)
    except UsageError as mistake:
        raise SystemExit(f"error: {where}: {mistake}") from None
    return True


# Loggers that need an optional dependency, and the extra that brings it.
LOGGER_EXTRAS = {"RunMLFlowLogger": ("mlflow", "mlflow")}


def check_logger_extras(loggers) -> None:
    """A preset whose logger needs an extra that is not installed costs one line naming the pip install (jsonargparse
    would bury the logger's own message in a page about Union types)."""
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        name = str(getattr(logger, "class_path", "")).rsplit(".", 1)[-1]
        if name in LOGGER_EXTRAS and importlib.util.find_spec(LOGGER_EXTRAS[name][0]) is None:
            module, extra = LOGGER_EXTRAS[name]
            raise SystemExit(f'error: {name} needs {module}, which is not installed: pip install -e ".[{extra}]"')
