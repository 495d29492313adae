"""Engine classes that moved since the first release, found under their old class paths with one warning each: a
config of a project updated with cruft, or a run's saved config.yaml, that names one keeps working.

The paths are relative to the engine package, so the table holds wherever the engine was copied. A config file that
names an old path is read through a copy with the new one (the file itself is left as it is); a command-line value is
replaced. Depends on nothing but the standard library.
"""

import atexit
import re
import sys
import tempfile
from pathlib import Path

ENGINE = __package__.rsplit(".", 1)[0]
# Old -> new, relative to the engine: every class a config can name (callbacks, loggers, plugins, a sweep's trial).
MOVED = {
    "callbacks.TimedProgressBar": "report.progress.TimedProgressBar",
    "callbacks.ConfusionMatrixImage": "report.confusion.ConfusionMatrixImage",
    "callbacks.Throughput": "report.throughput.Throughput",
    "callbacks.PredictionsCSV": "report.predictions.PredictionsCSV",
    "loggers.RunCSVLogger": "report.loggers.RunCSVLogger",
    "loggers.RunMLFlowLogger": "report.loggers.RunMLFlowLogger",
    "monitor.EarlyStopping": "training.monitor.EarlyStopping",
    "monitor.BestCheckpoints": "training.monitor.BestCheckpoints",
    "resume.LastCheckpoint": "resume.exact_resume.ExactResume",
    "resume.last_checkpoint.LastCheckpoint": "resume.exact_resume.ExactResume",
    "resume.ResumableRNGState": "resume.exact_resume.ExactResume",
    "resume.rng.ResumableRNGState": "resume.exact_resume.ExactResume",
    "resume.trained_state.TrainedState": "resume.exact_resume.ExactResume",
    "loaders.ResumableLoaders": "resume.exact_resume.ExactResume",
    "data.loaders.ResumableLoaders": "resume.exact_resume.ExactResume",
    "durable.DurableCheckpointIO": "resume.durable.DurableCheckpointIO",
    "grad_norms.GradNormRecorder": "cli.grad_norms.GradNormRecorder",
    "sweep.ReportToTrial": "sweep.report.ReportToTrial",
    "sweep_report.ReportToTrial": "sweep.report.ReportToTrial",
}
OLD = re.compile(r"\b" + re.escape(ENGINE) + r"\.(" + "|".join(map(re.escape, MOVED)) + r")\b")
CONFIG_FLAGS = ("-c", "--config")


def with_moved_classes(args: list[str], where: str = "the command line") -> list[str]:
    """`args` with each old class path replaced, and each config file that names one read through a copy that names
    the new ones; one warning for each old path, naming where it was."""
    found, config_next = [], False
    for arg in args:
        flag, equals, value = arg.partition("=")
        if config_next:
            found.append(updated_config(arg))
        elif flag in CONFIG_FLAGS and equals:
            found.append(f"{flag}={updated_config(value)}")
        else:
            found.append(replaced(arg, where))
        config_next = arg in CONFIG_FLAGS
    return found


def updated_config(path: str) -> str:
    """The path of a config file to read in place of `path`: a copy naming the new class paths, or `path` itself."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return path  # (the parser names a file it cannot read)
    new = replaced(text, path)
    if new == text:
        return path
    copy = tempfile.NamedTemporaryFile("w", suffix=Path(path).suffix, prefix="config-", delete=False)  # noqa: SIM115
    with copy:
        copy.write(new)
    atexit.register(Path(copy.name).unlink, missing_ok=True)  # (the parser has read it long before)
    return copy.name


def replaced(text: str, where: str) -> str:
    for old in sorted(set(OLD.findall(text))):
        print(f"warning: {where} names {ENGINE}.{old}, which moved to {ENGINE}.{MOVED[old]}: read as the new one; "
              "update it (CHANGELOG.md)", file=sys.stderr)  # fmt: skip
    return OLD.sub(lambda match: f"{ENGINE}.{MOVED[match.group(1)]}", text)
