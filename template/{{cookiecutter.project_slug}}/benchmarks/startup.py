"""Start-up cost: `python benchmarks/startup.py`.

Times, as a user sees them, `python -m template_package --help` and `python -m template_package fit` up to the end
of its first optimizer step, each the median of several fresh processes.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class StopAfterFirstStep(L.Callback):
    """Records when the first optimizer step is done, then ends the run."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        Path(os.environ["FIRST_STEP_FILE"]).write_text(repr(time.time()))
        raise SystemExit(0)


def seconds(args: list[str], env: dict[str, str]) -> float:
    start = time.time()
    subprocess.run([sys.executable, "-m", "template_package", *args], env=env, check=True, capture_output=True)
    return time.time() - start


def main(repeats: int = 3) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), str(Path(__file__).parent)])}
    help_times, first_step_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        env["FIRST_STEP_FILE"] = f"{tmp}/first_step"
        for repeat in range(repeats):
            help_times.append(seconds(["--help"], env))
            start = time.time()
            args = [
                "fit",
                f"--trainer.default_root_dir={tmp}/run{repeat}",
                "--trainer.callbacks+=startup.StopAfterFirstStep",
            ]
            subprocess.run([sys.executable, "-m", "template_package", *args], env=env, capture_output=True)
            first_step_times.append(float(Path(env["FIRST_STEP_FILE"]).read_text()) - start)
    for name, times in (("--help", help_times), ("fit to its first optimizer step", first_step_times)):
        spread = f"{min(times):.2f}..{max(times):.2f}"
        print(f"{name:32s} median {statistics.median(times):.2f} s ({spread})")


if __name__ == "__main__":
    main()
