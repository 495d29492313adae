"""`python -m template_package sweep`: a hyperparameter search with Optuna over any `fit` option, that survives
preemption.

    python -m template_package sweep -c configs/sweep.yaml --sweep.dir runs/sweep1 --sweep.n_trials 20 [fit options]

The search space is the `sweep.space` section of a config file (configs/sweep.yaml); the study lives in
`DIR/study.db` (SQLite, the processes of one machine) or in a PostgreSQL database
(`--sweep.storage postgresql+psycopg://USER@HOST:PORT/DATABASE`), which processes on several machines running the same
command share, each with a `--sweep.dir` of its own: no shared filesystem is needed (shared_study.py says how they
agree). Each trial is an ordinary run directory `DIR/trial-<number>`, trained by a `fit` process of its own (so DDP
works inside a trial), which `validate` and `test` accept like any run, and which dies with the sweep (Linux).

What Optuna alone does not do here:
- Preemption. SIGKILL the sweep at any moment and run the same command again: the trial that was running resumes
  from its own last.ckpt (`fit --ckpt_path last`), and the finished study equals the one an uninterrupted sweep makes.
  A trial belongs to the process that holds `DIR/trial-<n>/.sweep.lock`, and with a database server also records its
  heartbeats: one whose process died is taken over, by a process on another machine too (from the start there,
  unless DIR is shared). SIGTERM, SIGUSR1 and Ctrl-C reach the trial's `fit`, which saves and exits with 143, 138 or
  130; so does the sweep.
- Repeatable trials: TPE draws from a generator seeded with (`sweep.seed`, trial number), not once per process, so
  the same command gives the same trials, after a restart too.
- Parallel sweeps that agree on the count: the same command in several processes splits `n_trials` between them,
  asking for a new trial only under a lock on the study (`DIR/.sweep.lock`, or the database's own). With a database
  server, a process whose work is done waits for the trials still running elsewhere, to finish any whose process dies.
- Pruning that stops cleanly (`ReportToTrial`). optuna-integration's PyTorchLightningPruningCallback raises
  TrialPruned out of `trainer.fit`: the trial ends without its final checkpoint and its process fails like a crash;
  it needs the study object in the training process; and a trial resumed after its pruning decision trains on.

At the end, and with `--sweep.n_trials 0`: a table of the trials, `DIR/best.yaml` (the best trial's config, a preset
for `fit -c DIR/best.yaml`, kept in the study: written wherever the best trial ran), `DIR/history.png` and
`DIR/importances.png`. Needs `pip install -e ".[sweep]"` (Optuna, matplotlib, psycopg).
"""

import contextlib
import ctypes
import inspect
import io
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import lightning as L
import optuna
import yaml
from lightning.pytorch.callbacks import Callback

from .cli_help import program
from .errors import UsageError
from .run_lock import RunLock
from .shared_study import OWNER, Ownership, StudyLock, hidden_password, open_storage, translated_errors, try_acquire

PACKAGE = __name__.rsplit(".", 1)[0]
DISTRIBUTIONS = ("float", "int", "categorical")
RUNNING, FINISHED = optuna.trial.TrialState.RUNNING, (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


@dataclass
class SweepSettings:
    """The `sweep.*` options: a `sweep:` section in a config file, or `--sweep.<name> value`."""

    dir: str = "runs/sweep"  # DIR/trial-<number> run directories, study.db, best.yaml
    n_trials: int = 20  # trials in the whole study, whichever process runs them
    storage: str | None = None  # default sqlite:///DIR/study.db; postgresql+psycopg://USER@HOST:PORT/DB for machines
    heartbeat: int = 60  # seconds between a trial's signs of life in a database server; silent 2x as long: taken over
    seed: int = 0  # the sampler's seed: the same command gives the same trials
    metric: str | None = None  # what a trial is worth, its best value over its validations; None: checkpoint.monitor
    direction: str | None = None  # maximize or minimize; None: from checkpoint.mode
    pruning: bool = True  # stop a trial worse than the median of the earlier trials at the same epoch
    space: dict = field(default_factory=dict)  # fit option: {type: float|int|categorical, low, high, log, choices}

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{Path(self.dir) / 'study.db'}"


class SweepError(UsageError):
    """A mistake in what the sweep was given; its message is the one line the user sees."""


def main(argv: list[str]) -> None:
    """`python -m <package> sweep ...`."""
    if {"-h", "--help"} & set(argv):
        print(usage())
        return
    try:
        settings, fit_args = parse(argv)
        follow_the_checkpoint(settings, fit_config(settings, fit_args))
        lock = StudyLock(settings.storage_url, Path(settings.dir))
        study = open_study(settings, lock)
        Sweep(settings, fit_args, study, lock).run()
    except UsageError as error:  # a SweepError, or a StudyStorageError
        raise SystemExit(f"error: {error}") from None
    print(results(study, settings))


# --- What was asked -----------------------------------------------------------------------------------------------


def parse(argv: list[str]) -> tuple[SweepSettings, list[str]]:
    """Split the command line into the sweep's settings and the options that every trial's `fit` gets.

    A `-c FILE` with a `sweep:` section gives the sweep its settings and the rest of the file to every trial; other
    `-c` files and options go to every trial's `fit` unchanged."""
    values, fit_args, rest_of_files = {}, [], []
    args = iter(argv)
    for arg in args:
        name, _, value = arg.partition("=")
        if name in ("-c", "--config"):
            path = value or next(args, "")
            config = read_config(path)
            if "sweep" in config:
                values.update(config.pop("sweep") or {})
                rest_of_files.append(config)
            else:
                fit_args += ["-c", path]
        elif name.startswith("--sweep."):
            values[name.removeprefix("--sweep.")] = yaml.safe_load(value or next(args, ""))
        else:
            fit_args.append(arg)
    known = [f.name for f in fields(SweepSettings)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise SweepError(f"unknown option sweep.{unknown[0]}: use one of {', '.join(known)}")
    settings = SweepSettings(**values)
    check_settings(settings)
    for number, config in enumerate(c for c in rest_of_files if c):  # fit options written beside the sweep's
        path = Path(settings.dir) / f"fit-options-{number}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        fit_args = ["-c", str(path), *fit_args]
    return settings, fit_args


def read_config(path: str) -> dict:
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as error:
        raise SweepError(f"cannot read the config file {path} ({error.strerror})") from None
    return config if isinstance(config, dict) else {}


def check_settings(settings: SweepSettings) -> None:
    if not isinstance(settings.n_trials, int) or settings.n_trials < 0:
        raise SweepError(f"sweep.n_trials={settings.n_trials!r} must be a whole number >= 0 (0 shows the results)")
    if not isinstance(settings.heartbeat, int) or isinstance(settings.heartbeat, bool) or settings.heartbeat < 1:
        raise SweepError(f"sweep.heartbeat={settings.heartbeat!r} must be a whole number of seconds >= 1")
    if settings.direction not in ("maximize", "minimize", None):
        raise SweepError(f"sweep.direction={settings.direction!r}: use maximize or minimize")
    if not isinstance(settings.space, dict):
        raise SweepError("sweep.space must map fit options to distributions, see configs/sweep.yaml")
    for option, spec in settings.space.items():
        check_distribution(option, spec)


def check_distribution(option: str, spec) -> None:
    where = f"sweep.space.{option}"
    if not isinstance(spec, dict) or spec.get("type") not in DISTRIBUTIONS:
        raise SweepError(f"{where} needs a type: one of {', '.join(DISTRIBUTIONS)}")
    if spec["type"] == "categorical":
        if not isinstance(spec.get("choices"), list) or not spec["choices"]:
            raise SweepError(f"{where} has no choices: give a non-empty list")
        return
    low, high = spec.get("low"), spec.get("high")
    if not all(isinstance(bound, int | float) and not isinstance(bound, bool) for bound in (low, high)):
        raise SweepError(f"{where} needs numbers low and high, not low={low!r} high={high!r}")
    if low > high:
        raise SweepError(f"{where}: low={low} is above high={high}")
    if spec.get("log") and low <= 0:
        raise SweepError(f"{where}: a log scale needs low > 0, not {low}")


def usage() -> str:
    """`sweep --help`: the sweep's own options, then how the rest of the command line reaches the trials."""
    lines = [f"usage: {program()} sweep [-c FILE] [--sweep.<option> VALUE] [fit options]", "", __doc__.split("\n\n")[0]]
    lines += ["", "sweep options (a `sweep:` section of a -c file, or --sweep.<option> VALUE; later ones win):"]
    comments = {}
    for line in inspect.getsource(SweepSettings).splitlines():
        name, _, comment = line.strip().partition(" #")
        if ":" in name and comment:
            comments[name.split(":")[0]] = comment.strip()
    for setting in fields(SweepSettings):
        default = setting.default if setting.default is not MISSING else setting.default_factory()
        lines.append(f"  --sweep.{setting.name:<10} {comments.get(setting.name, '')} (default: {default})")
    lines += ["", "Every other option goes to every trial's fit (see fit --help); the search space names fit options."]
    return "\n".join(lines)


def fit_config(settings: SweepSettings, fit_args: list[str]) -> dict:
    """A trial's fit config, parsed once before any trial exists: an unknown option in the search space or a bad fit
    option costs one line now, not a failed trial in the study."""
    from .cli import main as cli

    sample = [f"--{option}={first_value(spec)}" for option, spec in settings.space.items()]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # the sweep's own argv is no fit's
        try:
            cli(["fit", *fit_args, *sample, "--print_config"])
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise SweepError(f"in a trial's fit options: {str(stop.code).removeprefix('error: ')}") from None
    return yaml.safe_load(printed.getvalue())


def follow_the_checkpoint(settings: SweepSettings, config: dict) -> None:
    """A metric or direction left at None: the fit config's checkpoint.monitor and checkpoint.mode."""
    checkpoint = config.get("checkpoint") or {}
    settings.metric = settings.metric or checkpoint.get("monitor")
    if settings.direction is None:
        settings.direction = {"min": "minimize", "max": "maximize"}.get(checkpoint.get("mode"), "maximize")
    if not settings.metric:
        raise SweepError("the sweep needs a metric: set checkpoint.monitor (configs/default.yaml) or sweep.metric")


def first_value(spec: dict):
    return spec["choices"][0] if spec["type"] == "categorical" else spec["low"]


def open_study(settings: SweepSettings, lock: StudyLock) -> optuna.Study:
    """Create the study or load it; one line when its database cannot be opened or its settings changed."""
    Path(settings.dir).mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        # Under the study's lock: two sweeps creating one study (its tables) at once collide.
        with lock.held(), translated_errors(settings.storage_url):
            study = optuna.create_study(
                storage=open_storage(settings.storage_url, settings.heartbeat), study_name="sweep",
                direction=settings.direction, load_if_exists=True, sampler=TrialSeededTPESampler(settings.seed),
                pruner=pruner(settings.pruning),
            )  # fmt: skip
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever fails to open a database is reported in one line
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise SweepError(f"cannot open the study storage {hidden_password(settings.storage_url)} ({reason})") from None
    asked = {"space": settings.space, "metric": settings.metric, "direction": settings.direction}
    saved = study.user_attrs.get("sweep")
    if saved is None:
        study.set_user_attr("sweep", asked)
    elif saved != asked:
        changed = next(key for key in asked if asked[key] != saved.get(key))
        elsewhere = "another --sweep.dir" if settings.storage is None else "another database in --sweep.storage"
        raise SweepError(
            f"the study in {hidden_password(settings.storage_url)} was made with another {changed}, "
            f"{saved.get(changed)!r}: give {elsewhere}, or the settings it was made with"
        )
    return study


def pruner(pruning: bool) -> optuna.pruners.BasePruner:
    # From the third finished trial on, from the second validation on (the first says little).
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1) if pruning else optuna.pruners.NopPruner()


class TrialSeededTPESampler(optuna.samplers.BaseSampler):
    """TPE whose random draws for trial n come from a generator seeded with (seed, n). A TPESampler seeded once per
    process draws other parameters after a restart than the uninterrupted sweep drew; this one draws the same, since
    TPE reads everything else from the study's history."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._tpe = optuna.samplers.TPESampler(seed=seed)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._tpe = optuna.samplers.TPESampler(seed=self.seed * 1_000_003 + trial.number)
        self._tpe.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return self._tpe.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._tpe.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._tpe.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._tpe.after_trial(study, trial, state, values)


# --- Running the trials -------------------------------------------------------------------------------------------


class Sweep:
    """Runs trials until the study has `n_trials`, taking over those whose process was lost first."""

    STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, settings: SweepSettings, fit_args: list[str], study: optuna.Study, lock: StudyLock) -> None:
        self.settings, self.fit_args, self.study, self.lock = settings, fit_args, study, lock
        self.dir = Path(settings.dir)
        self.ownership = Ownership(study, self.dir)
        self.fit: subprocess.Popen | None = None
        self.stopped_by: int | None = None

    def run(self) -> None:
        previous = {signum: signal.signal(signum, self._stop) for signum in self.STOP_SIGNALS}
        try:
            while (claimed := self._next_trial()) is not None:
                trial, claim = claimed
                try:
                    self._run(trial)
                finally:
                    claim.release()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _stop(self, signum: int, frame) -> None:
        """Pass a stop signal to the trial's fit, which saves and exits; the sweep then exits with its code."""
        self.stopped_by = signum
        if self.fit is None or self.fit.poll() is not None:
            raise SystemExit(128 + signum)
        self.fit.send_signal(signum)

    def _next_trial(self) -> tuple[optuna.Trial, RunLock] | None:
        """A running trial that lost its process, else a new trial while the study has fewer than n_trials; with the
        trial's lock held and, with a database server, its first heartbeat recorded. Under the study's lock, so that
        parallel sweeps agree on the count. With a server, the trials left running elsewhere are watched until they
        end: any whose process dies is taken over."""
        waiting_for = None
        while True:
            with self.lock.held():
                running, stale = self.study.get_trials(deepcopy=False, states=(RUNNING,)), self.ownership.stale_trials()
                for trial in running:
                    claim = RunLock(self.dir / f"trial-{trial.number}", ".sweep.lock")
                    if self.ownership.may_take_over(trial, stale) and try_acquire(claim):
                        # Its process may have finished it and let go of it since the list was read: read it again.
                        if self.study._storage.get_trial(trial._trial_id).state == RUNNING:
                            self.ownership.claim(trial._trial_id)
                            return optuna.Trial(self.study, trial._trial_id), claim
                        claim.release()
                if len(self.study.get_trials(deepcopy=False)) < self.settings.n_trials:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", "Heartbeat of storage")  # heartbeats are ours, not optimize's
                        trial = self.study.ask()
                    self.ownership.claim(trial._trial_id)
                    claim = RunLock(self.dir / f"trial-{trial.number}", ".sweep.lock")
                    claim.acquire()
                    return trial, claim
            if not (self.ownership.heartbeat and running):
                return None
            if waiting_for != (numbers := [trial.number for trial in running]):
                waiting_for = numbers
                print(f"waiting for trial(s) {', '.join(map(str, numbers))}, running elsewhere (taken over if lost)")
            time.sleep(self.ownership.heartbeat)

    def _run(self, trial: optuna.Trial) -> None:
        """Train the trial with `fit --ckpt_path last` in its run directory, then tell the study what it got."""
        params = {option: suggest(trial, option, spec) for option, spec in self.settings.space.items()}
        run_dir = self.dir / f"trial-{trial.number}"
        report = {"class_path": f"{PACKAGE}.sweep.ReportToTrial",
                  "init_args": {"storage": self.settings.storage_url, "trial_number": trial.number,
                                "metric": self.settings.metric, "pruning": self.settings.pruning}}  # fmt: skip
        report_config = run_dir / "sweep_trial.yaml"
        report_config.write_text(yaml.safe_dump({"trainer": {"callbacks+": [report]}}))
        command = [sys.executable, "-m", PACKAGE, "fit", *self.fit_args, "-c", str(report_config),
                   f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last",
                   *(f"--{option}={value}" for option, value in params.items())]  # fmt: skip
        started = time.monotonic()
        with (run_dir / "fit.log").open("a") as log:
            self.fit = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_us())
            with self.ownership.beating(trial._trial_id):  # a thread: started after the fork, for preexec_fn's sake
                code = self.fit.wait()
            self.fit = None
        if self.stopped_by is not None or code in (130, 138, 143):
            raise SystemExit(128 + self.stopped_by if self.stopped_by else code)  # saved: the next sweep resumes it
        attrs = self.study._storage.get_trial_user_attrs(trial._trial_id)
        shown = " ".join(f"{option}={format_value(value)}" for option, value in params.items())
        if self.study._storage.get_trial(trial._trial_id).state != RUNNING:  # a heartbeat came too late
            print(f"trial {trial.number} ({shown}) was finished meanwhile by another process, whose result stands")
            return
        if (run_dir / "config.yaml").is_file():  # for best.yaml, written wherever the results are shown
            trial.set_user_attr("config", (run_dir / "config.yaml").read_text())
        if code != 0 or "value" not in attrs:
            self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            mistake = last_line(run_dir / "fit.log")
            if mistake.startswith("error: "):  # a mistake in what every trial gets: stop, not run the next trial
                raise SweepError(f"trial {trial.number}: {mistake.removeprefix('error: ')}")
            print(f"trial {trial.number} ({shown}) failed: see {run_dir / 'fit.log'}")
        elif attrs["pruned"]:
            self.study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
            print(f"trial {trial.number} ({shown}) pruned at {self.settings.metric} {attrs['value']:.4f}")
        else:
            self.study.tell(trial.number, attrs["value"])
            seconds = time.monotonic() - started
            print(f"trial {trial.number} ({shown}): {self.settings.metric} {attrs['value']:.4f} in {seconds:.0f} s")


def dies_with_us():
    """A `preexec_fn` that has the kernel SIGKILL the child when this process dies (Linux's PR_SET_PDEATHSIG): a sweep
    killed for good leaves no `fit` behind that trains its trial and reports to the study while another process takes
    the trial over. None elsewhere. (PR_SET_PDEATHSIG follows the thread that forks: the sweep's main thread.)"""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def set_death_signal() -> None:
        prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep died between the fork and now
            os._exit(1)

    return set_death_signal


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def suggest(trial: optuna.Trial, option: str, spec: dict):
    if spec["type"] == "categorical":
        return trial.suggest_categorical(option, spec["choices"])
    suggest_number = trial.suggest_float if spec["type"] == "float" else trial.suggest_int
    return suggest_number(option, spec["low"], spec["high"], log=bool(spec.get("log", False)))


def format_value(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ReportToTrial(Callback):
    """Reports a trial's metric after each validation, prunes it, and records what it got; in the trial's `fit`.

    Rank 0 reports to the study (its storage) and asks the pruner; every rank stops together after the epoch, as a
    pruned trial's training ends normally: `last.ckpt` is written, the process exits 0. A trial resumed after the
    decision stops at once. The trial's value, its best metric over the validations, goes to its user attributes,
    where the sweep reads it.
    """

    def __init__(self, storage: str, trial_number: int, metric: str = "val/acc", pruning: bool = True) -> None:
        self.storage, self.trial_number, self.metric, self.pruning = storage, trial_number, metric, pruning
        self._trial: optuna.Trial | None = None
        self._pruned = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = optuna.load_study(study_name="sweep", storage=self.storage, pruner=pruner(self.pruning))
            self._trial = optuna.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(
                study._study_id, self.trial_number))  # fmt: skip

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_pruned(trainer)  # a trial resumed after its pruning decision

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logged = [name for name in trainer.callback_metrics if name not in ("epoch", "step")]
        if self.metric not in trainer.callback_metrics and logged:
            raise UsageError(
                f"sweep.metric={self.metric!r} is not logged by {type(pl_module).__name__}, which logs "
                f"{', '.join(sorted(logged))} in validation: set --sweep.metric (or checkpoint.monitor) to one of them"
            )
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        if self._trial is not None:
            self._trial.report(float(trainer.callback_metrics[self.metric]), step=trainer.current_epoch)
        self._stop_if_pruned(trainer)

    def _stop_if_pruned(self, trainer: L.Trainer) -> None:
        prune = self._trial is not None and bool(self._trial.should_prune())
        self._pruned = trainer.strategy.broadcast(prune, src=0)  # rank 0 decides, every rank stops
        if self._pruned:
            trainer.should_stop = True

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._trial is None:
            return
        values = self._trial.storage.get_trial(self._trial._trial_id).intermediate_values.values()
        if values:
            best = max(values) if self._trial.study.direction == optuna.study.StudyDirection.MAXIMIZE else min(values)
            self._trial.set_user_attr("value", best)
            self._trial.set_user_attr("pruned", self._pruned)


# --- Results --------------------------------------------------------------------------------------------------------


def results(study: optuna.Study, settings: SweepSettings) -> str:
    """The table of trials; writes DIR/best.yaml and the pictures."""
    folder = Path(settings.dir)
    trials = study.get_trials(deepcopy=False)
    options = list(settings.space)
    rows = [["trial", *options, settings.metric, "state", "run directory"]]
    for trial in trials:
        value = trial.value if trial.value is not None else trial.user_attrs.get("value")
        rows.append([str(trial.number), *(format_value(trial.params[o]) if o in trial.params else "" for o in options),
                     f"{value:.4f}" if value is not None else "", trial.state.name.lower(),
                     where_it_ran(trial, folder)])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    if any(trial.state == optuna.trial.TrialState.COMPLETE for trial in trials):
        best = study.best_trial
        write_best_preset(folder, best)
        lines.append(f"best: trial {best.number}, {settings.metric} {best.value:.4f}; "
                     f"train it again with: fit -c {folder / 'best.yaml'}")  # fmt: skip
        lines += draw(study, folder)
    return "\n".join(lines)


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
    header = f"# The best trial of the sweep in {folder}: trial {best.number}, value {best.value}.\n"
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
