"""How a run's global batch is laid out over its processes, and how a run resumes on another number of processes.

A run's global batch, the samples of one optimizer step, is G = W x b x a: W processes, b samples a batch on each,
a batches accumulated. With the engine's train loader (data/loaders.py, data/sampling.EpochShuffleSampler) step s reads
the global positions [s * G, (s + 1) * G) of its epoch's order whatever W, b and a are, and an epoch is its whole global
batches. So a run stopped on W processes goes on on W' processes (`fit --ckpt_path last --allow_change world_size`)
with the same global batch (`BatchLayout.on`): the same samples at every optimizer step, the same LR schedule and step
counts. What is not the same: floating-point sums in another order (per-device means, the all-reduce, the
accumulation), each process's random draws (re-derived from the seed, the step and the rank), and BatchNorm's batch
statistics, which are per-device ones.

Every checkpoint records the layout it was trained with (`KEY`); a run resumed on the same number of processes goes
on with it, so a run once moved to another W keeps its global batch through later restarts too. Depends on the
engine's errors.py only.
"""

from dataclasses import asdict, dataclass

from ..errors import UsageError

KEY = "batch_layout"  # in a checkpoint: the layout it was trained with, see BatchLayout.state
NO_LAYOUT = "no_batch_layout"  # in a checkpoint without one: why its train loader has none (loaders.why_no_layout)


@dataclass(frozen=True)
class BatchLayout:
    """`world_size` processes, `batch_size` samples a batch on each, `accumulate` batches an optimizer step; `asked`,
    the (batch_size, accumulate) the run's config gives, which differ from the layout's after a move to another W."""

    world_size: int
    batch_size: int
    accumulate: int
    asked: tuple[int, int]

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size * self.accumulate

    def on(self, world_size: int) -> "BatchLayout":
        """The same global batch on `world_size` processes: the batch size kept where it divides the share of each
        process (more accumulation on fewer processes: the same memory per device), else the largest smaller batch
        size that does; a UsageError when the global batch does not split evenly over `world_size`."""
        if world_size == self.world_size:
            return self
        share, rest = divmod(self.global_batch, world_size)
        if rest:
            raise UsageError(
                f"the run's global batch of {self.global_batch} samples ({self.world_size} processes x "
                f"{self.batch_size} x {self.accumulate} accumulated) does not split over {world_size} processes: "
                f"resume it on a number of processes that divides {self.global_batch}"
            )
        batch_size = next(size for size in range(min(self.batch_size, share), 0, -1) if share % size == 0)
        return BatchLayout(world_size, batch_size, share // batch_size, self.asked)

    def state(self) -> dict[str, int]:
        return {**asdict(self), "asked": list(self.asked)}

    @classmethod
    def from_state(cls, state: dict) -> "BatchLayout":
        return cls(state["world_size"], state["batch_size"], state["accumulate"], tuple(state["asked"]))


def saved_layout(checkpoint: dict) -> BatchLayout | None:
    """The layout a checkpoint was trained with; None for a checkpoint from before layouts were recorded."""
    state = checkpoint.get(KEY)
    return BatchLayout.from_state(state) if state else None


def move_progress(checkpoint: dict, saved: BatchLayout, new: BatchLayout) -> tuple[int, int]:
    """Rewrite the checkpoint's training loop state for `new` (called before Lightning restores it), and return the
    epoch and the global position in it to read on from (0: a checkpoint of an epoch's end reads the next one whole).

    Lightning counts batches per process: the batches of this epoch and of the run become the new layout's batches
    for the same optimizer steps. The loader's own state (a position in one process's share) is dropped: the train
    loader reads on from the global position instead (EpochShuffleSampler.resume_at). A checkpoint is written only
    after an optimizer step, so the batches done in the epoch are whole optimizer steps."""
    loop = checkpoint["loops"]["fit_loop"]
    loop["state_dict"].pop("combined_loader", None)
    progress = loop["epoch_loop.batch_progress"]
    steps_in_epoch = progress["current"]["ready"] // saved.accumulate
    for counters, steps in ((progress["current"], steps_in_epoch), (progress["total"], checkpoint["global_step"])):
        ready = counters["ready"]
        for name in counters:  # (completed lags ready by the batch whose end the checkpoint was taken at)
            counters[name] = steps * new.accumulate + counters[name] - ready
    epochs = loop["epoch_progress"]["current"]
    # A checkpoint of an epoch's end (its batches processed, its end hooks run) goes on with the next epoch's start.
    in_progress = epochs["started"] > epochs["processed"]
    return epochs["processed"], steps_in_epoch * saved.global_batch if in_progress else 0
