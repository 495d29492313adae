"""What keeping the run directory in object storage costs training: `python benchmarks/object_storage.py [--steps N]
[--every N] [--repeats N]`.

Trains the example (its default config, TensorBoard and CSV logging on) for `--steps` optimizer steps with last.ckpt
every `--every` steps, in a local run directory and in `s3://` on a local S3 API server (moto's) reached through a TCP
proxy slowed to a bandwidth at which one checkpoint upload takes 1.5 times the interval between two saves, so that
uploads are always behind training. The fits run in this process, alternating, local then store, `--repeats` times:
each store fit is compared with the local fit right before it, since fits a minute apart differ on a shared machine.
Prints each fit's seconds per step, from its first training step to the end of training, every save and log upload
included, by the wall clock and by the training thread's CPU time (once training has ended the proxy lets the rest of
the uploads through at full speed: what is left to upload then is not a step's time), the bandwidth, and `ratio <x>`:
the median of store/local over the pairs, with its spread (the goal: <= 1.02). Needs the s3 extra and moto's server
(pip install -e ".[s3]" "moto[server]").
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


class StepClock(Callback):
    """Times training from its first step to its end (wall, and this thread's CPU time); then `at_the_end()`."""

    measured: list = []  # (wall seconds, CPU seconds, steps) of each fit, in order
    at_the_end = staticmethod(lambda: None)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if not hasattr(self, "start"):
            self.start = (time.perf_counter(), time.thread_time())

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        wall, cpu = time.perf_counter() - self.start[0], time.thread_time() - self.start[1]
        StepClock.measured.append((wall, cpu, trainer.global_step))
        StepClock.at_the_end()


def seconds_per_step(run_dir: str, args, folder: Path) -> tuple[float, float]:
    """Seconds per step of a fit in `run_dir`: by the wall clock, and by the training thread's CPU time."""
    from template_package.engine.cli.main import main

    config = folder / "extra.yaml"
    csv = {"class_path": "template_package.engine.report.loggers.RunCSVLogger"}
    config.write_text(json.dumps({"trainer": {"logger+": [csv], "callbacks+": ["object_storage.StepClock"]}}))
    main(["fit", f"--trainer.default_root_dir={run_dir}", "--trainer.max_epochs=-1",
          f"--trainer.max_steps={args.steps}", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", f"--last_checkpoint.every_n_steps={args.every}",
          "-c", str(config)])  # fmt: skip
    wall, cpu, steps = clock().measured[-1]
    return wall / steps, cpu / steps


def clock() -> type:
    """StepClock as the runs import it, by its module's name (this file runs as __main__)."""
    import object_storage

    return object_storage.StepClock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Short fits, many of them: fits a minute apart differ by 10% on a shared machine, so each store fit is compared
    # with the local fit right before it; saves every 50 steps keep the uploads behind training all the time.
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="last_checkpoint.every_n_steps")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    sys.argv = sys.argv[:1]
    import s3fs

    from helpers.object_store import S3Server, TcpProxy, client_env

    server, folder = S3Server(), Path(tempfile.mkdtemp(prefix="object-storage-"))
    proxy = TcpProxy(server.port)
    os.environ.update(client_env(server.endpoint))
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("bench")
    os.environ.update(client_env(proxy.endpoint))
    os.chdir(folder)
    try:
        step, _ = seconds_per_step(str(folder / "warm"), args, folder)  # (first imports, caches, the data)
        size = (folder / "warm" / "checkpoints" / "last.ckpt").stat().st_size
        bandwidth = size / (1.5 * args.every * step)
        print(f"last.ckpt {size / 1e6:.2f} MB every {args.every} steps of {step * 1e3:.1f} ms: proxy at "
              f"{bandwidth / 1e3:.1f} kB/s, an upload takes {size / bandwidth:.1f} s, the saves are "
              f"{args.every * step:.1f} s apart", flush=True)  # fmt: skip
        clock().at_the_end = staticmethod(lambda: setattr(proxy, "rate", None))
        ratios = {"wall": [], "cpu": []}
        for repeat in range(args.repeats):
            local = seconds_per_step(str(folder / f"local-{repeat}"), args, folder)
            proxy.rate = bandwidth
            store = seconds_per_step(f"s3://bench/run-{repeat}", args, folder)
            for kind, here, there in zip(ratios, local, store, strict=True):
                ratios[kind].append(there / here)
            print(f"repeat {repeat}: local {local[0] * 1e3:.2f} ms/step, store {store[0] * 1e3:.2f} ms/step (wall); "
                  f"the training thread's CPU {local[1] * 1e3:.2f} and {store[1] * 1e3:.2f}", flush=True)  # fmt: skip
        for kind, values in ratios.items():
            print(f"ratio {statistics.median(values):.3f} (store/local seconds per step, {kind} clock; spread "
                  f"{min(values):.3f}-{max(values):.3f}; goal <= 1.02)")  # fmt: skip
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()
