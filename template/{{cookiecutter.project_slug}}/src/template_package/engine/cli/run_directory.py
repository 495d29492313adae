"""The run-directory contract of the CLI: `--trainer.default_root_dir DIR` holds `DIR/checkpoints/` (last.ckpt and
the best checkpoints), `DIR/config.yaml`, the loggers' files and `DIR/predictions.csv`; `fit --ckpt_path last`
resumes the run in DIR, or starts it when there is nothing to resume yet; a finished fit says where it all is. DIR
may be a URL of object storage (`s3://bucket/run`): the command then works in a local folder that the store's run is
read into and uploaded from (resume/remote_run.py), and says the URL wherever it names a path.
"""

import atexit
import contextlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger

from ..report.loggers import RunMLFlowLogger
from ..resume.digests import damage
from ..resume.exact_resume import ExactResume, resolve_last
from ..resume.remote_run import CHECKPOINTS, RemoteRun, fetch, is_url
from ..resume.run_lock import is_global_rank_zero
from ..resume.whole_checkpoint import is_checkpoint
from ..training.steps import training_steps


def run_report(trainer: L.Trainer, run_dir: Path, shown: Callable[[Path | str], str] = str) -> str:
    """What a finished fit got and where it is (each path as `shown` names it), printed whether a progress bar showed
    it or not."""
    lines = []
    best = next((callback for callback in trainer.callbacks if isinstance(callback, ModelCheckpoint)), None)
    if best is not None and best.monitor and best.monitor in trainer.callback_metrics:
        final = f"{best.monitor} {float(trainer.callback_metrics[best.monitor]):.4f} at the end"
        if best.best_model_path:
            final += f", best {float(best.best_model_score):.4f}: {shown(best.best_model_path)}"
        lines.append(final)
    last = run_dir / CHECKPOINTS / ExactResume.FILENAME
    if is_checkpoint(last):
        lines.append(f"last state (step {training_steps(trainer)}): {shown(last)}; continue it with --ckpt_path last")
    for logger in trainer.loggers:
        lines.append(f"look at the run: {how_to_look_at(logger, shown)}")
    return "\n".join(lines)


def how_to_look_at(logger: Logger, shown: Callable[[Path | str], str] = str) -> str:
    if isinstance(logger, RunMLFlowLogger):
        return f"mlflow ui --backend-store-uri {logger.tracking_uri}  (run {logger.run_id})"
    if isinstance(logger, CSVLogger):
        return shown(Path(logger.log_dir) / "metrics.csv")
    return f"tensorboard --logdir {shown(logger.save_dir)}"


def resolve_resume(config, shown: Callable[[Path | str], str] = str) -> None:
    """Turn `--ckpt_path last` into this run's last.ckpt, or, when that is damaged, its previous.ckpt, and keep a fresh
    fit from overwriting a run (a smoke run, `fast_dev_run`, writes no checkpoint, log or config: it may run in any run
    directory): ExactResume's rule, before anything is built (the loggers purge from the step of the one chosen)."""
    if config.ckpt_path in ("last", None):
        last = Path(config.last_checkpoint.dirpath) / ExactResume.FILENAME
        smoke, run = bool(config.trainer.fast_dev_run), Path(config.trainer.default_root_dir)
        found = resolve_last(last, config.ckpt_path, smoke, "--ckpt_path last", "a new --trainer.default_root_dir",
                             say=is_global_rank_zero(), shown=shown, run=run)  # fmt: skip
        config.ckpt_path = None if found is None else str(found)


def local_path_of(path: str) -> str:
    """A `file://` URL as the local path it names; any other path or URL as it is."""
    return urlsplit(path).path if str(path).startswith("file://") else path


def point_at(config, root: str) -> None:
    """Put the run directory's paths in a parsed config in `root`: the checkpoints' folder, predictions.csv."""
    config.trainer.default_root_dir = root
    config.checkpoint.dirpath = config.last_checkpoint.dirpath = checkpoint_dir(root)
    config.predictions.path = predictions_csv(root)


def run_of_checkpoint(ckpt_path: str) -> str | None:
    """The run directory a checkpoint sits in, DIR of `DIR/checkpoints/X.ckpt`, a path or a URL; None elsewhere."""
    if is_url(ckpt_path):
        parts = ckpt_path.rstrip("/").rsplit("/", 2)
        return parts[0] if len(parts) == 3 and parts[1] == CHECKPOINTS else None
    checkpoints = Path(ckpt_path).parent
    return str(checkpoints.parent) if checkpoints.name == CHECKPOINTS else None


def work_in_the_store(config, remote: RemoteRun, fit: bool) -> None:
    """Read what the command needs of the run in the store into its local folder, and point the config there: the
    loggers' files and config.yaml, and the checkpoint named (for a fit without one, last.ckpt, and previous.ckpt when
    last.ckpt is missing or damaged: resolve_resume decides whether it resumes or refuses to start over it)."""
    remote.fetch_run()
    if fit and config.ckpt_path in ("last", None):
        last = remote.fetch(f"{CHECKPOINTS}/{ExactResume.FILENAME}")
        if last is None or damage(last) is not None:
            remote.fetch(f"{CHECKPOINTS}/{ExactResume.PREVIOUS}")
    elif is_url(config.ckpt_path):
        inside = config.ckpt_path.startswith(remote.url + "/")
        local = remote.fetch(config.ckpt_path[len(remote.url) + 1 :]) if inside else None
        config.ckpt_path = str(local or fetch(config.ckpt_path, remote.local / ".fetched"))
    point_at(config, str(remote.local))


def temporary_folder() -> Path:
    """A new folder, removed when the process exits."""
    folder = Path(tempfile.mkdtemp(prefix="checkpoint-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def fetched_checkpoint(ckpt_path: str) -> str:
    """A checkpoint named by URL, for a run directory on this machine: read into a temporary folder."""
    return str(fetch(ckpt_path, temporary_folder())) if is_url(ckpt_path) else ckpt_path


def fetched_with_its_config(url: str) -> str:
    """A checkpoint named by URL read into a temporary folder, as `checkpoints/X.ckpt` beside its run's config.yaml
    when it sits in a run directory; its local path."""
    folder, run = temporary_folder(), run_of_checkpoint(url)
    if run is not None:
        with contextlib.suppress(SystemExit):  # (a run without config.yaml: the default config builds the model)
            fetch(f"{run}/config.yaml", folder)
    return str(fetch(url, folder / CHECKPOINTS))


def configure_loggers(config, resumed_step: int | None, run_name: str | None = None) -> None:
    """Put every logger's files in the run directory, and make a fit that starts at `resumed_step` replace what
    earlier processes logged from that step on: what an interrupted run logged after its checkpoint, or, on a fresh
    start (0), everything a run killed before its first checkpoint logged. So no step appears twice (report/loggers.py).
    (With one optimizer the loggers' step is the optimizer step.) `resumed_step` is None for validate, test and
    predict, which add to the run's logs. `run_name`: how a logger names the run (MLflow's tag), when it is not the
    folder the files go to (a run in object storage: its URL)."""
    loggers = config.trainer.logger
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        arguments = getattr(logger, "init_args", None)
        if arguments is None:  # logger: false
            continue
        if "save_dir" in arguments:
            arguments.save_dir = config.trainer.default_root_dir
        if "run_dir" in arguments:
            arguments.run_dir = run_name or config.trainer.default_root_dir
        if "purge_step" in arguments:
            arguments.purge_step = resumed_step


def checkpoint_dir(root_dir: str) -> str:
    return str(Path(root_dir) / "checkpoints")


def predictions_csv(root_dir: str) -> str:
    return str(Path(root_dir) / "predictions.csv")
