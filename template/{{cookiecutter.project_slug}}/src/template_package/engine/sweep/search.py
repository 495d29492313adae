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
  unless DIR is shared). A stop signal (resume/stop_signals.py) reaches the trial's `fit`, which saves and exits with
  the signal's code; so does the sweep.
- Repeatable trials: TPE draws from a generator seeded with (`sweep.seed`, trial number), not once per process, so
  the same command gives the same trials, after a restart too.
- Parallel sweeps that agree on the count: the same command in several processes splits `n_trials` between them,
  asking for a new trial only under a lock on the study (`DIR/.sweep.lock`, or the database's own). With a database
  server, a process whose work is done waits for the trials still running elsewhere, to finish any whose process dies.
- K-fold cross-validation (`--sweep.folds K`, for a DataModule with `folds` and `fold` arguments, engine/data/folds.py):
  a trial's value is the mean of its K folds' values, each fold a run directory `DIR/trial-<n>/fold-<i>` trained by
  `fit --ckpt_path last --data.folds K --data.fold i` (a killed sweep resumes the fold it was in; finished folds are
  not trained again); the table and best.yaml give the mean and the spread (standard deviation, numpy's: over the K
  values). Fold f reports its epoch e to the pruner at step f * max_epochs + e: Optuna keeps the first value reported
  at a step, so the folds need steps of their own, and the median pruner compares each fold's epoch with the same
  fold's epoch of the other trials (folds differ in difficulty); a trial may thus be pruned in any fold.
- Pruning that stops cleanly (`ReportToTrial`, report.py). optuna-integration's
  PyTorchLightningPruningCallback raises TrialPruned out of `trainer.fit`: the trial ends without its final checkpoint
  and its process fails like a crash; it needs the study object in the training process; and a trial resumed after
  its pruning decision trains on.

At the end, and with `--sweep.n_trials 0` (results.py): a table of the trials, `DIR/best.yaml` (the best trial's
config, a preset for `fit -c DIR/best.yaml`; each trial's config is kept in the study, so that any process of the
study writes it, wherever the best trial ran), `DIR/history.png` and `DIR/importances.png`. Needs
`pip install -e ".[sweep]"` (Optuna, matplotlib, psycopg).
"""

import contextlib
import inspect
import io
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import optuna
import yaml

from ..cli.exit_with_parent import EXIT_WITH_PARENT
from ..cli.help import program
from ..errors import UsageError
from ..internals import study_storage, trial_id_of
from ..resume import stop_signals
from ..resume.remote_run import is_url, redacted
from ..resume.run_lock import RunLock
from .report import ReportToTrial, pruner
from .results import format_value, results
from .shared_study import Ownership, StudyLock, hidden_password, open_storage, translated_errors, try_acquire

DISTRIBUTIONS = ("float", "int", "categorical")
RUNNING, FINISHED = optuna.trial.TrialState.RUNNING, (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


@dataclass
class SweepSettings:
    """The `sweep.*` options: a `sweep:` section in a config file, or `--sweep.<name> value`."""

    dir: str = "runs/sweep"  # DIR/trial-<number> run directories, study.db, best.yaml
    n_trials: int = 20  # trials in the whole study, whichever process runs them
    storage: str | None = None  # default sqlite:///DIR/study.db; postgresql+psycopg://USER@HOST:PORT/DB for machines
    heartbeat: int = 60  # seconds between a trial's heartbeats in a database server; silent twice as long: taken over
    seed: int = 0  # the sampler's seed: the same command gives the same trials
    metric: str | None = None  # what a trial is worth, its best value over its validations; None: checkpoint.monitor
    direction: str | None = None  # maximize or minimize; None: from checkpoint.mode
    pruning: bool = True  # stop a trial worse than the median of the earlier trials at the same epoch
    folds: int = 1  # K > 1: a trial's value is its mean over K folds, DIR/trial-<n>/fold-<i> (--data.folds K)
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
        config = fit_config(settings, fit_args)
        follow_the_checkpoint(settings, config)
        stride = epochs_per_fold(settings, config)
        lock = StudyLock(settings.storage_url, Path(settings.dir))
        study = open_study(settings, lock)
        Sweep(settings, fit_args, study, lock, stride).run()
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
    if is_url(settings.dir):
        where = "its SQLite study cannot live in object storage, and " if settings.storage is None else ""
        raise SweepError(
            f"sweep.dir={redacted(settings.dir)}: {where}a sweep's trials are kept in a local or shared folder: give "
            "one (a trial's fit can still be resumed on another machine from its folder, copied)"
        )
    if not isinstance(settings.n_trials, int) or settings.n_trials < 0:
        raise SweepError(f"sweep.n_trials={settings.n_trials!r} must be a whole number >= 0 (0 shows the results)")
    if not isinstance(settings.folds, int) or isinstance(settings.folds, bool) or settings.folds < 1:
        raise SweepError(f"sweep.folds={settings.folds!r} must be a whole number >= 1 (1: no cross-validation)")
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
    from ..cli.main import main as cli

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


def epochs_per_fold(settings: SweepSettings, config: dict) -> int:
    """The steps between two folds' reports to the pruner: trainer.max_epochs (a million when it is not fixed). With
    folds, the data must take them: one line naming its class, and what to add, otherwise."""
    if settings.folds == 1:
        return 0
    data = config.get("data") or {}
    if not {"folds", "fold"} <= set(data.get("init_args") or {}):
        raise SweepError(
            f"sweep.folds={settings.folds}: {data.get('class_path', 'the DataModule')} takes no folds: give its "
            "__init__ the arguments folds: int = 1 and fold: int = 0 and split its training data with "
            "engine.folds.fold_indices (as classifier/data.py does)"
        )
    epochs = (config.get("trainer") or {}).get("max_epochs")
    return epochs if isinstance(epochs, int) and epochs > 0 and "trainer.max_epochs" not in settings.space else 10**6


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
    if settings.folds > 1:  # (studies without folds were made before there were folds)
        asked["folds"] = settings.folds
    saved = study.user_attrs.get("sweep")
    if saved is None:
        study.set_user_attr("sweep", asked)
    elif saved != asked:
        changed = next(key for key in {**saved, **asked} if asked.get(key) != saved.get(key))
        elsewhere = "another --sweep.dir" if settings.storage is None else "another database in --sweep.storage"
        raise SweepError(
            f"the study in {hidden_password(settings.storage_url)} was made with another {changed}, "
            f"{saved.get(changed)!r}: give {elsewhere}, or the settings it was made with"
        )
    return study


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

    def __init__(
        self, settings: SweepSettings, fit_args: list[str], study: optuna.Study, lock: StudyLock, stride: int = 0
    ) -> None:
        self.settings, self.fit_args, self.study, self.lock = settings, fit_args, study, lock
        self.stride = stride  # the steps between two folds' reports to the pruner
        self.dir = Path(settings.dir)
        self.ownership = Ownership(study, self.dir)
        self.storage = study_storage(study)
        self.fit: subprocess.Popen | None = None  # the running trial's fit
        self.stopped_by: int | None = None

    def run(self) -> None:
        previous = {signum: signal.signal(signum, self._stop) for signum in stop_signals.SIGNALS}
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
            raise SystemExit(stop_signals.exit_code(signum))
        with contextlib.suppress(ProcessLookupError):  # (it may end this moment: the sweep then exits with its code)
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
                        if self.storage.get_trial(trial_id_of(trial)).state == RUNNING:
                            self.ownership.claim(trial_id_of(trial))
                            resumes = any((self.dir / f"trial-{trial.number}").rglob("last.ckpt"))  # (folds too)
                            print(f"trial {trial.number} lost its process: taken over, "
                                  f"{'from its last.ckpt' if resumes else 'from the start'}", flush=True)  # fmt: skip
                            return optuna.Trial(self.study, trial_id_of(trial)), claim
                        claim.release()
                if len(self.study.get_trials(deepcopy=False)) < self.settings.n_trials:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", "Heartbeat of storage")  # heartbeats are ours, not optimize's
                        trial = self.study.ask()
                    self.ownership.claim(trial_id_of(trial))
                    claim = RunLock(self.dir / f"trial-{trial.number}", ".sweep.lock")
                    claim.acquire()
                    return trial, claim
            if not (self.ownership.heartbeat and running):
                return None
            if waiting_for != (numbers := [trial.number for trial in running]):
                waiting_for = numbers
                print(f"waiting for trial(s) {', '.join(map(str, numbers))}, running elsewhere (taken over if lost)",
                      flush=True)  # fmt: skip
            time.sleep(min(self.ownership.heartbeat, 5))

    def _run(self, trial: optuna.Trial) -> None:
        """Train the trial (each of its folds) with `fit --ckpt_path last` in its run directory, then tell the study
        what it got."""
        params = {option: suggest(trial, option, spec) for option, spec in self.settings.space.items()}
        shown = " ".join(f"{option}={format_value(value)}" for option, value in params.items())
        started, trial_dir = time.monotonic(), self.dir / f"trial-{trial.number}"
        folds = [None] if self.settings.folds == 1 else list(range(self.settings.folds))
        results = []
        for fold in folds:
            run_dir = trial_dir if fold is None else trial_dir / f"fold-{fold}"
            key = "value" if fold is None else f"fold-{fold}"
            attrs = self.storage.get_trial_user_attrs(trial_id_of(trial))
            if fold is not None and key in attrs:  # trained before the sweep that ran this trial was killed
                results.append(attrs[key])
                continue
            code = self._fit(trial, params, run_dir, fold)
            attrs = self.storage.get_trial_user_attrs(trial_id_of(trial))
            if self.storage.get_trial(trial_id_of(trial)).state != RUNNING:  # a heartbeat came too late
                print(f"trial {trial.number} ({shown}) was finished meanwhile by another process, whose result stands")
                return
            if "config" not in attrs and (run_dir / "config.yaml").is_file():  # for best.yaml, written wherever
                trial.set_user_attr("config", (run_dir / "config.yaml").read_text())  # the results are shown
            if code != 0 or key not in attrs:
                self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                mistake = last_line(run_dir / "fit.log")
                if mistake.startswith("error: "):  # a mistake in what every trial gets: stop, not run the next trial
                    raise SweepError(f"trial {trial.number}: {mistake.removeprefix('error: ')}")
                print(f"trial {trial.number} ({shown}) failed: see {run_dir / 'fit.log'}")
                return
            results.append(attrs[key] if fold is not None else {"value": attrs["value"], "pruned": attrs["pruned"]})
            if results[-1]["pruned"]:
                break
        value = self._summarize(trial, [result["value"] for result in results])
        if results[-1]["pruned"]:
            self.study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
            print(f"trial {trial.number} ({shown}) pruned at {self.settings.metric} {value:.4f}")
        else:
            self.study.tell(trial.number, value)
            seconds = time.monotonic() - started
            print(f"trial {trial.number} ({shown}): {self.settings.metric} {value:.4f} in {seconds:.0f} s")

    def _summarize(self, trial: optuna.Trial, values: list[float]) -> float:
        """The trial's value: its only one, or the mean over its folds, whose values and spread go to its user
        attributes (numpy's standard deviation, of the K values)."""
        if self.settings.folds == 1:
            return values[0]
        mean, spread = statistics.fmean(values), statistics.pstdev(values)
        trial.set_user_attr("fold_values", values)
        trial.set_user_attr("value", mean)
        trial.set_user_attr("spread", spread)
        return mean

    def _fit(self, trial: optuna.Trial, params: dict, run_dir: Path, fold: int | None) -> int:
        """Run a trial's (fold's) `fit` process in `run_dir`, recording the trial's heartbeats while it runs; its exit
        code. A stop signal ends the sweep once the fit has saved: the next sweep resumes it."""
        report = {"class_path": f"{ReportToTrial.__module__}.ReportToTrial",
                  "init_args": {"storage": self.settings.storage_url, "trial_number": trial.number,
                                "metric": self.settings.metric, "pruning": self.settings.pruning,
                                "fold": fold, "epochs_per_fold": self.stride}}  # fmt: skip
        run_dir.mkdir(parents=True, exist_ok=True)
        report_config = run_dir / "sweep_trial.yaml"
        report_config.write_text(yaml.safe_dump({"trainer": {"callbacks+": [report]}}))
        folds = [] if fold is None else [f"--data.folds={self.settings.folds}", f"--data.fold={fold}"]
        options = [f"--{option}={value}" for option, value in params.items()]
        command = ["fit", *self.fit_args, "-c", str(report_config), f"--trainer.default_root_dir={run_dir}",
                   "--ckpt_path=last", *folds, *options]  # fmt: skip
        with self.ownership.beating(trial_id_of(trial)), (run_dir / "fit.log").open("a") as log:
            self.fit = start_trial(command, log)
            code = self.fit.wait()
        self.fit = None
        stopped = {stop_signals.exit_code(signum) for signum in stop_signals.SIGNALS}
        if self.stopped_by is not None or code in stopped:  # saved: the next sweep resumes it
            raise SystemExit(stop_signals.exit_code(self.stopped_by) if self.stopped_by else code)
        return code


def start_trial(command: list[str], log) -> subprocess.Popen:
    """`python -m <engine> COMMAND`, a trial's fit, as a run of yours starts, its output in `log`. It leads a session
    of its own (a kill reaches its loader workers and DDP ranks), and it ends when the sweep does (EXIT_WITH_PARENT,
    cli/main.py): a sweep killed for good leaves no fit that trains its trial while another sweep takes it over."""
    engine = __package__.rpartition(".")[0]
    env = {**os.environ, EXIT_WITH_PARENT: "1"}
    return subprocess.Popen([sys.executable, "-m", engine, *command], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def suggest(trial: optuna.Trial, option: str, spec: dict):
    if spec["type"] == "categorical":
        return trial.suggest_categorical(option, spec["choices"])
    suggest_number = trial.suggest_float if spec["type"] == "float" else trial.suggest_int
    return suggest_number(option, spec["low"], spec["high"], log=bool(spec.get("log", False)))
