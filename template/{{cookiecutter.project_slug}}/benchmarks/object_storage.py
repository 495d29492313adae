"""What keeping the run directory in object storage costs training: `python benchmarks/object_storage.py [--steps N]
[--every N] [--repeats N]`.

Trains the example (its default config, TensorBoard and CSV logging on) for `--steps` optimizer steps with last.ckpt
every `--every` steps (default: the engine's own cadence), in a local run directory and in `s3://` on a local S3 API
server (moto's) reached through a TCP proxy slowed to a bandwidth at which one checkpoint upload takes 1.5 times the
interval between two saves, so that uploads are always behind training. Runs alternate, local then store, `--repeats`
times; prints each run's seconds per step (from the first training step to the end of training, every save and log
upload included), the bandwidth, and `ratio <x>`: the median of store/local over the pairs, with its spread (the
goal: <= 1.02). Needs the s3 extra and moto's server (pip install -e ".[s3]" "moto[server]").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


class StepClock(Callback):
    """Writes the seconds from the first training step to the end of training, and the steps, to `path`."""

    def __init__(self, path: str) -> None:
        self.path, self.start = path, None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        Path(self.path).write_text(json.dumps({"seconds": time.perf_counter() - self.start,
                                               "steps": trainer.global_step}))  # fmt: skip


def seconds_per_step(run_dir: str, args, env: dict, folder: Path) -> float:
    clock, config = folder / f"clock-{time.monotonic_ns()}.json", folder / "extra.yaml"
    csv = {"class_path": "template_package.engine.report.loggers.RunCSVLogger"}
    timing = {"class_path": "object_storage.StepClock", "init_args": {"path": str(clock)}}
    config.write_text(json.dumps({"trainer": {"logger+": [csv], "callbacks+": [timing]}}))  # (JSON is YAML)
    command = [sys.executable, "-m", "template_package", "fit", f"--trainer.default_root_dir={run_dir}",
               "--trainer.max_epochs=-1", f"--trainer.max_steps={args.steps}", "--trainer.enable_progress_bar=false",
               f"--last_checkpoint.every_n_steps={args.every}", "-c", str(config)]  # fmt: skip
    subprocess.run(command, cwd=folder, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    measured = json.loads(clock.read_text())
    return measured["seconds"] / measured["steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--every", type=int, default=1000, help="last_checkpoint.every_n_steps")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import s3fs
    from helpers.object_store import S3Server, TcpProxy, client_env

    server, folder = S3Server(), Path(tempfile.mkdtemp(prefix="object-storage-"))
    proxy = TcpProxy(server.port)
    paths = [str(ROOT / "src"), str(ROOT / "benchmarks"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, **client_env(proxy.endpoint), "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    os.environ.update(client_env(server.endpoint))
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("bench")
    try:
        warm = seconds_per_step(str(folder / "warm"), args, env, folder)  # (first imports, caches, the data)
        size = (folder / "warm" / "checkpoints" / "last.ckpt").stat().st_size
        proxy.rate = size / (1.5 * args.every * warm)
        print(f"last.ckpt {size / 1e6:.2f} MB every {args.every} steps of {warm * 1e3:.1f} ms: proxy at "
              f"{proxy.rate / 1e3:.1f} kB/s, an upload takes {size / proxy.rate:.1f} s, the saves are "
              f"{args.every * warm:.1f} s apart")  # fmt: skip
        local, store = [], []
        for repeat in range(args.repeats):
            local.append(seconds_per_step(str(folder / f"local-{repeat}"), args, env, folder))
            store.append(seconds_per_step(f"s3://bench/run-{repeat}", args, env, folder))
            print(f"repeat {repeat}: local {local[-1] * 1e3:.2f} ms/step, store {store[-1] * 1e3:.2f} ms/step")
        ratios = [there / here for there, here in zip(store, local, strict=True)]
        print(f"ratio {statistics.median(ratios):.3f} (store/local seconds per step; spread "
              f"{min(ratios):.3f}-{max(ratios):.3f}; goal <= 1.02)")  # fmt: skip
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()
