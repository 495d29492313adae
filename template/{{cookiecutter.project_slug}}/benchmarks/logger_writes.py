"""What a logged step's write to TensorBoard costs: `python benchmarks/logger_writes.py`.

Lightning's TensorBoardLogger (an event per scalar) against the engine's RunTensorBoardLogger (an event per call),
each call of 1, 4 and 8 scalars, taken in turns. The figure is the process's CPU time per call, the writer thread's
serializing and writing included, until the events are flushed to the file.
"""

import argparse
import statistics
import tempfile
import time

import torch
from lightning.pytorch.loggers import TensorBoardLogger

from template_package.engine.report.loggers import RunTensorBoardLogger

LOGGERS = {"Lightning's TensorBoardLogger": TensorBoardLogger, "RunTensorBoardLogger": RunTensorBoardLogger}


def cpu_seconds_per_call(kind: type[TensorBoardLogger], scalars: int, calls: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        logger = kind(folder, name="", version="")
        metrics = {f"train/value{index}": 0.5 + index for index in range(scalars)}
        logger.log_metrics(metrics, step=0)  # (opens the event file)
        logger.experiment.flush()
        start = time.process_time()
        for step in range(1, calls + 1):
            logger.log_metrics(metrics, step=step)
        logger.experiment.flush()
        seconds = time.process_time() - start
        logger.finalize("success")
    return seconds / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    torch.set_num_threads(1)  # (no torch work here: its idle threads would only add noise)
    for scalars in (1, 4, 8):
        times: dict[str, list[float]] = {name: [] for name in LOGGERS}
        for _ in range(options.rounds):
            for name, kind in LOGGERS.items():
                times[name].append(cpu_seconds_per_call(kind, scalars, options.calls))
        medians = {name: statistics.median(seconds) * 1e6 for name, seconds in times.items()}
        ours, lightnings = medians["RunTensorBoardLogger"], medians["Lightning's TensorBoardLogger"]
        print(f"{scalars} scalar(s) a call: " + ", ".join(f"{name} {us:.1f} us" for name, us in medians.items())
              + f", Lightning's / the engine's {lightnings / ours:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
