"""The run-directory contract of the CLI: `--trainer.default_root_dir DIR` holds `DIR/checkpoints/` (last.ckpt and
the best checkpoints), `DIR/config.yaml`, the loggers' files and `DIR/predictions.csv`; `fit --ckpt_path last`
resumes the run in DIR, or starts it when there is nothing to resume yet; a finished fit says where it all is.
"""

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger

from ..report.loggers import RunMLFlowLogger
from ..resume.last_checkpoint import LastCheckpoint
from ..resume.whole_checkpoint import is_checkpoint
from ..training.steps import training_steps


def run_report(trainer: L.Trainer, run_dir: Path) -> str:
    """What a finished fit got and where it is, printed whether a progress bar showed it or not."""
    lines = []
    best = next((callback for callback in trainer.callbacks if isinstance(callback, ModelCheckpoint)), None)
    if best is not None and best.monitor and best.monitor in trainer.callback_metrics:
        final = f"{best.monitor} {float(trainer.callback_metrics[best.monitor]):.4f} at the end"
        if best.best_model_path:
            final += f", best {float(best.best_model_score):.4f}: {best.best_model_path}"
        lines.append(final)
    last = run_dir / "checkpoints" / LastCheckpoint.FILENAME
    if is_checkpoint(last):
        lines.append(f"last state (step {training_steps(trainer)}): {last}; continue it with --ckpt_path last")
    for logger in trainer.loggers:
        lines.append(f"look at the run: {how_to_look_at(logger)}")
    return "\n".join(lines)


def how_to_look_at(logger: Logger) -> str:
    if isinstance(logger, RunMLFlowLogger):
        return f"mlflow ui --backend-store-uri {logger.tracking_uri}  (run {logger.run_id})"
    if isinstance(logger, CSVLogger):
        return f"{Path(logger.log_dir) / 'metrics.csv'}"
    return f"tensorboard --logdir {logger.save_dir}"


def resolve_resume(config) -> None:
    """Turn `--ckpt_path last` into this run's last.ckpt, and keep a fresh fit from overwriting a run."""
    last = Path(config.last_checkpoint.dirpath) / LastCheckpoint.FILENAME
    if config.ckpt_path == "last":
        if is_checkpoint(last):  # a file, or a sharded folder (a link to one)
            config.ckpt_path = str(last)
        else:
            print(f"fit --ckpt_path last: no {last} yet, starting a fresh run")
            config.ckpt_path = None
    elif config.ckpt_path is None and is_checkpoint(last):
        raise SystemExit(
            f"error: {last.parent.parent} already holds a run ({last}): resume it with --ckpt_path last, "
            "or give a new --trainer.default_root_dir"
        )


def configure_loggers(config, resumed_step: int | None) -> None:
    """Put every logger's files in the run directory, and make a fit that starts at `resumed_step` replace what
    earlier processes logged from that step on: what an interrupted run logged after its checkpoint, or, on a fresh
    start (0), everything a run killed before its first checkpoint logged. So no step appears twice (report/loggers.py).
    (With one optimizer the loggers' step is the optimizer step.) `resumed_step` is None for validate, test and
    predict, which add to the run's logs."""
    loggers = config.trainer.logger
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        arguments = getattr(logger, "init_args", None)
        if arguments is None:  # logger: false
            continue
        for name in ("save_dir", "run_dir"):
            if name in arguments:
                arguments[name] = config.trainer.default_root_dir
        if "purge_step" in arguments:
            arguments.purge_step = resumed_step


def checkpoint_dir(root_dir: str) -> str:
    return str(Path(root_dir) / "checkpoints")


def predictions_csv(root_dir: str) -> str:
    return str(Path(root_dir) / "predictions.csv")
