"""Start-up cost against Lightning's floor: `python benchmarks/startup.py [--repeats N] [--profile]`.

Times, as a user sees them, `python -m template_package --help`, and side by side the project's `fit` (configs/
default.yaml) and a plain `LightningCLI(ImageClassifier, ImageDataModule)` with the same model and data
(benchmarks/plain_cli.py): each a fresh process, the two taking turns (which starts first alternates), each stopped at
the end of its first optimizer step. Prints for each side the median over the repeats of the seconds from the
process's start to that step, of its peak resident memory (the child's own ru_maxrss) and of the CPU seconds it used
(user and system: on a machine that other work shares, less noisy than the seconds); then the ratios project /
Lightning's floor, each the median of the repeats' own ratios (a repeat's two runs are neighbours in time, so that
the machine's load hits both alike). The goal: time and memory within 1.05; above it, the largest cost is named.

`--profile` adds where the difference goes: the command line's parse alone on each side (`fit --print_config`, CPU
seconds, imports included), the modules only one side imports (`python -X importtime`, each module's own time), and
the functions whose CPU time differs most between the two fits up to their first step (cProfile with a CPU clock).
"""

import argparse
import cProfile
import os
import pstats
import re
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
SIDES = ("project fit", "plain LightningCLI")
# The values the project's CLI takes from the data (its line "engine: model.num_classes=10, ..."), given by hand.
FROM_THE_DATA = ["--model.num_classes=10", "--model.in_channels=1", "--model.input_size=8"]
# What `--profile` found the largest cost of the project's fit over the floor, and what it buys.
LARGEST_COST = (
    "the largest cost over the floor (--profile) is the command line's parse: in subclass mode jsonargparse builds a "
    "parser for each class the config names by class path (the model, whose **recipe it resolves from the source, the "
    "data, the engine's progress bar, throughput and logger, the config's callbacks) and checks and dumps each at "
    "every stage of the parse (defaults, config files, command line); it buys any model, data, callback and logger "
    "from the config or `--model a.b.C`, without code. The floor builds its one model's parser in code, for each of "
    "its four subcommands, where the project builds only the subcommand it runs."
)


def environment() -> dict[str, str]:
    """This environment with the project's src/ and benchmarks/ on the path, and the project's own default config."""
    env = {name: value for name, value in os.environ.items() if name != "ENGINE_DEFAULT_CONFIG"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), str(BENCHMARKS)])}


def commands(run_dir: str) -> dict[str, list[str]]:
    """Each side's command line after the interpreter, training in `run_dir`."""
    stop = ["--trainer.callbacks+=first_step.StopAfterFirstStep", f"--trainer.default_root_dir={run_dir}"]
    return {
        "project fit": ["-m", "template_package", "fit", *stop],
        "plain LightningCLI": [str(BENCHMARKS / "plain_cli.py"), "fit", *FROM_THE_DATA, *stop],
    }


def run(command: list[str], env: dict[str, str], folder: Path) -> tuple[float, float, float, bool]:
    """`python COMMAND` in `folder`: seconds from its start to the end of its first optimizer step (or to its exit),
    its peak resident memory in MB, the CPU seconds it used, and whether it reached a step."""
    marker = folder / "first_step"
    marker.unlink(missing_ok=True)
    start = time.time()
    process = subprocess.Popen([sys.executable, *command], env={**env, "FIRST_STEP_FILE": str(marker)}, cwd=folder,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    said = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    _, status, usage = os.wait4(process.pid, 0)  # (its own resource use, not its children's)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"error: python {' '.join(command[:3])} failed (exit {process.returncode}): {said[-2000:]}")
    stepped = marker.exists()
    end = float(marker.read_text()) if stepped else time.time()
    return end - start, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, stepped  # (ru_maxrss: KiB)


def side_by_side(repeats: int, env: dict[str, str]) -> bool:
    """Prints each side's medians and the ratios; whether a ratio is above the goal."""
    runs: dict[str, list[tuple[float, float, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            sides = list(commands(f"{tmp}/run{repeat}").items())
            for name, command in sides if repeat % 2 == 0 else reversed(sides):
                *measured, stepped = run(command, env, Path(tmp))
                if not stepped:
                    raise SystemExit(f"error: the {name} ended before its first optimizer step")
                runs[name].append(tuple(measured))
    for name in SIDES:
        seconds, memory, cpu = ([measured[i] for measured in runs[name]] for i in range(3))
        print(f"{name:20s} first step {statistics.median(seconds):.2f} s ({min(seconds):.2f}..{max(seconds):.2f}), "
              f"peak RSS {statistics.median(memory):.0f} MB ({min(memory):.0f}..{max(memory):.0f}), "
              f"CPU {statistics.median(cpu):.2f} s ({min(cpu):.2f}..{max(cpu):.2f})")  # fmt: skip
    ratios = [statistics.median(ours[i] / floor[i] for ours, floor in zip(*runs.values(), strict=True))
              for i in range(3)]  # fmt: skip
    print(f"ratio to Lightning's floor: time to the first step {ratios[0]:.3f}, peak RSS {ratios[1]:.3f} (goal: "
          f"within 1.05 each); CPU {ratios[2]:.3f}")  # fmt: skip
    return max(ratios[:2]) > 1.05


def parse_seconds(env: dict[str, str], repeats: int = 3) -> dict[str, float]:
    """Each side's median CPU seconds for `fit --print_config`: its imports and its command line's parse."""
    with tempfile.TemporaryDirectory() as tmp:
        return {name: statistics.median(run([*command, "--print_config"], env, Path(tmp))[2] for _ in range(repeats))
                for name, command in commands(f"{tmp}/run").items()}  # fmt: skip


def own_import_times(command: list[str], env: dict[str, str], folder: Path) -> dict[str, float]:
    """Each module's own import time in seconds (`python -X importtime`), the first step's run included."""
    done = subprocess.run([sys.executable, "-X", "importtime", *command], cwd=folder, capture_output=True, text=True,
                          env={**env, "FIRST_STEP_FILE": str(folder / "first_step")})  # fmt: skip
    found = (re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s+(\S.*)$", line) for line in done.stderr.splitlines())
    return {match.group(2).strip(): int(match.group(1)) / 1e6 for match in found if match}


def cpu_profile(command: list[str], env: dict[str, str], folder: Path) -> dict:
    """The stats of a run of `python COMMAND` under cProfile with a CPU clock: (file, line, function) -> (calls,
    ..., cumulative seconds, callers), as pstats holds them."""
    stats = folder / "cpu.prof"
    subprocess.run([sys.executable, str(Path(__file__)), "--cpu-profile-child", str(stats), *command], cwd=folder,
                   env={**env, "FIRST_STEP_FILE": str(folder / "first_step")}, capture_output=True)  # fmt: skip
    return pstats.Stats(str(stats)).stats


def phases(stats: dict) -> dict[str, float]:
    """A run's CPU seconds by phase, from its profile: each phase a Lightning function both sides run, less the
    phases inside it."""

    def spent(file_end: str, function: str) -> float:
        found = [value[3] for (file, _, name), value in stats.items() if name == function and file.endswith(file_end)]
        return max(found, default=0.0)

    total = max(value[3] for value in stats.values())
    cli, parser = spent("lightning/pytorch/cli.py", "__init__"), spent("lightning/pytorch/cli.py", "setup_parser")
    parse, build = spent("", "parse_arguments"), spent("lightning/pytorch/cli.py", "instantiate_classes")
    subcommand = spent("lightning/pytorch/cli.py", "_run_subcommand")
    stage, sanity = spent("trainer/trainer.py", "_run_stage"), spent("trainer/trainer.py", "_run_sanity_check")
    return {
        "imports, and the rest before the CLI": total - cli,
        "the CLI's parsers made": parser,
        "the command line parsed and checked": parse,
        "model, data and Trainer built": build,
        "the CLI's other work": cli - parser - parse - build - subcommand,
        "fit's set-up (callbacks, optimizer, model summary)": subcommand - stage,
        "the sanity check's validation": sanity,
        "the first training step": stage - sanity,
    }


def profile(env: dict[str, str]) -> None:
    """Where the project's fit spends the time the floor does not."""
    parsed = parse_seconds(env)
    print(f"the command line's parse (fit --print_config, imports included), CPU: project {parsed[SIDES[0]]:.2f} s, "
          f"floor {parsed[SIDES[1]]:.2f} s")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        sides = commands(f"{tmp}/run")
        imports = {name: own_import_times(command, env, Path(tmp)) for name, command in sides.items()}
        for one, other in (SIDES, reversed(SIDES)):
            only = sorted(((s, m) for m, s in imports[one].items() if m not in imports[other]), reverse=True)
            print(f"modules only the {one} imports: {len(only)}, {sum(s for s, _ in only):.3f} s of their own: "
                  f"{', '.join(f'{m} {s * 1000:.1f} ms' for s, m in only[:6])}")  # fmt: skip
        ours, floor = (phases(cpu_profile(command, env, Path(tmp))) for command in sides.values())
    print("CPU seconds by phase up to the first step (cProfile with a CPU clock, its own cost included): project, "
          "floor, difference")  # fmt: skip
    for phase in ours:
        print(f"  {ours[phase]:7.2f} {floor[phase]:7.2f} {ours[phase] - floor[phase]:+7.2f}  {phase}")
    largest = max(ours, key=lambda phase: ours[phase] - floor[phase])
    print(f"the largest cost over the floor: {largest} ({ours[largest] - floor[largest]:+.2f} s)")


def cpu_profile_child(stats: str, command: list[str]) -> None:
    """Runs `python COMMAND` in this process under cProfile with a CPU clock, and writes its stats to `stats`."""
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        target = lambda: runpy.run_module(command[1], run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.argv, sys.path[0] = list(command), str(Path(command[0]).parent)
        target = lambda: runpy.run_path(command[0], run_name="__main__")  # noqa: E731
    profiler = cProfile.Profile(time.process_time)
    try:
        profiler.runcall(target)
    except SystemExit:
        pass
    finally:
        profiler.dump_stats(stats)


def main() -> None:
    if sys.argv[1:2] == ["--cpu-profile-child"]:
        return cpu_profile_child(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="runs of each side (default 8)")
    parser.add_argument("--profile", action="store_true", help="also print where the difference goes")
    args = parser.parse_args()
    env = environment()
    with tempfile.TemporaryDirectory() as tmp:
        helps = [run(["-m", "template_package", "--help"], env, Path(tmp))[0] for _ in range(3)]
    print(f"{'--help':20s} {statistics.median(helps):.2f} s ({min(helps):.2f}..{max(helps):.2f})")
    if side_by_side(args.repeats, env):
        print(LARGEST_COST)
    if args.profile:
        profile(env)


if __name__ == "__main__":
    main()
