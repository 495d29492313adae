"""The results of a sweep, shown at its end and by `sweep --sweep.n_trials 0`: the table of its trials,
`DIR/best.yaml` (a preset for `fit -c`), and pictures of the history and the parameter importances. Depends on
Optuna, and on matplotlib for the pictures.
"""

import socket
import warnings
from pathlib import Path

import optuna
import yaml

from .shared_study import OWNER


def results(study: optuna.Study, settings) -> str:
    """The table of trials; writes DIR/best.yaml and the pictures."""
    folder = Path(settings.dir)
    trials = study.get_trials(deepcopy=False)
    options = list(settings.space)
    rows = [["trial", *options, settings.metric, "state", "run directory"]]
    for trial in trials:
        rows.append([str(trial.number), *(format_value(trial.params[o]) if o in trial.params else "" for o in options),
                     worth(trial), trial.state.name.lower(), where_it_ran(trial, folder)])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    if any(trial.state == optuna.trial.TrialState.COMPLETE for trial in trials):
        best = study.best_trial
        write_best_preset(folder, best)
        lines.append(f"best: trial {best.number}, {settings.metric} {worth(best)}; "
                     f"train it again with: fit -c {folder / 'best.yaml'}")  # fmt: skip
        lines += draw(study, folder)
    return "\n".join(lines)


def worth(trial: optuna.trial.FrozenTrial) -> str:
    """The trial's value; with folds, their mean and spread: `0.8123 ± 0.0150 over 3 folds`."""
    value = trial.value if trial.value is not None else trial.user_attrs.get("value")
    if value is None:
        return ""
    folds = trial.user_attrs.get("fold_values")
    return f"{value:.4f} ± {trial.user_attrs['spread']:.4f} over {len(folds)} folds" if folds else f"{value:.4f}"


def where_it_ran(trial: optuna.trial.FrozenTrial, folder: Path) -> str:
    """The trial's run directory: in the DIR of the process that trained it last (with a database server, it may be
    another's), on the host named when that is not this one."""
    host, _, owner_dir = trial.system_attrs.get(OWNER, "").partition(" ")
    if not owner_dir:
        return str(folder / f"trial-{trial.number}")
    run_dir = str(Path(owner_dir) / f"trial-{trial.number}")
    return run_dir if host == socket.gethostname() else f"{host}:{run_dir}"


def write_best_preset(folder: Path, best: optuna.trial.FrozenTrial) -> None:
    """The best trial's own config.yaml (kept in the study, its run directory may be on another machine), without
    what belongs to its run directory: a preset for `fit -c`."""
    saved = best.user_attrs.get("config") or (folder / f"trial-{best.number}" / "config.yaml").read_text()
    config = yaml.safe_load(saved)
    config.pop("ckpt_path", None)
    trainer = config.setdefault("trainer", {})
    trainer.pop("default_root_dir", None)
    trainer["callbacks"] = [c for c in trainer.get("callbacks") or [] if not c["class_path"].endswith("ReportToTrial")]
    for option in ("folds", "fold"):  # a fold's config: the preset trains on the data's own split
        ((config.get("data") or {}).get("init_args") or {}).pop(option, None)
    spread = f" ({worth(best)})" if "fold_values" in best.user_attrs else ""
    header = f"# The best trial of the sweep in {folder}: trial {best.number}, value {best.value}{spread}.\n"
    (folder / "best.yaml").write_text(header + yaml.safe_dump(config, sort_keys=False))


def draw(study: optuna.Study, folder: Path) -> list[str]:
    """The optimisation history and the parameter importances as PNG files (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    drawn = []
    for name, plot in (("history", plots.plot_optimization_history), ("importances", plots.plot_param_importances)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since Optuna 2.2
                axes = plot(study)
        except (ValueError, RuntimeError) as error:  # importances need 2 finished trials and 2 parameters
            drawn.append(f"no {name}.png: {str(error).splitlines()[0]}")
            continue
        axes.figure.savefig(folder / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(axes.figure)
        drawn.append(f"{name}: {folder / f'{name}.png'}")
    return drawn


def format_value(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
