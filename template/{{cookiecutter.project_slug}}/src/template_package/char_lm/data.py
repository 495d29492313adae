"""The example's LightningDataModule: characters of the text that ships with every Python (the documentation topics
that `help()` shows, ~465,000 characters of English and code), in windows of `block_size` characters.

Batches are dicts, {"x": the window, "y": the same window shifted by one character}. Each training window starts at a
random offset within its block of the text, drawn from torch's generator in `__getitem__`: the engine seeds it for
each sample (engine/data/sampling.py), so a resumed run, or one with other num_workers, draws the same offsets.
"""

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset


def python_docs() -> str:
    """Python's own documentation topics, in a fixed order (they differ between Python versions)."""
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics))


class CharWindows(Dataset):
    """Windows of `block_size` characters of `ids` and their next characters: window i from block i of the text,
    at a random offset within the block when `random_offset`."""

    def __init__(self, ids: torch.Tensor, block_size: int, random_offset: bool) -> None:
        self.ids, self.block_size, self.random_offset = ids, block_size, random_offset

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size - 1  # room for the last window's offset and next character

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        offset = int(torch.randint(self.block_size, ())) if self.random_offset else 0
        start = index * self.block_size + offset
        window = self.ids[start : start + self.block_size + 1]
        return {"x": window[:-1], "y": window[1:]}


class TextDataModule(LightningDataModule):
    """Train/val/test windows of Python's documentation, and prompts to continue for `predict`.

    Args:
        block_size: characters a window holds (the model's context length; the model takes it from here).
        batch_size: windows per batch on each device.
        val_fraction: share of the text, at its end, held out for validation and the same again for testing.
        num_workers: loader processes; 0 reads in the main process (the text sits in memory).
        prompts: the beginnings that `predict` continues.
    """

    loading_options = ("num_workers", "prompts")  # how the data is read, not which: may change on a resume

    def __init__(
        self,
        block_size: int = 64,
        batch_size: int = 32,
        val_fraction: float = 0.05,
        num_workers: int = 0,
        prompts: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.text = python_docs()
        self.vocabulary = "".join(sorted(set(self.text)))  # the model takes it from here (its size and decoding)
        self.block_size = block_size
        self.prompts = prompts or ["The ", "def "]
        self.splits: dict[str, Dataset] = {}

    def encode(self, text: str) -> torch.Tensor:
        index = {char: i for i, char in enumerate(self.vocabulary)}
        return torch.tensor([index[char] for char in text if char in index], dtype=torch.long)

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        ids, held_out = self.encode(self.text), round(self.hparams.val_fraction * len(self.text))
        train, val, test = ids[: -2 * held_out], ids[-2 * held_out : -held_out], ids[-held_out:]
        self.splits = {"train": CharWindows(train, self.block_size, random_offset=True),
                       "val": CharWindows(val, self.block_size, random_offset=False),
                       "test": CharWindows(test, self.block_size, random_offset=False),
                       "predict": [self.encode(prompt) for prompt in self.prompts]}  # fmt: skip

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        workers = self.hparams.num_workers
        return DataLoader(self.splits[split], batch_size=self.hparams.batch_size, shuffle=train, drop_last=train,
                          num_workers=workers, persistent_workers=workers > 0)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["predict"], batch_size=1)  # prompts differ in length: one at a time
