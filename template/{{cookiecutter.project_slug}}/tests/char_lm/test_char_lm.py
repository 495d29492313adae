"""The example task: a character-level transformer language model on Python's documentation. It learns, it is causal,
its batches are dicts, it predicts text, and it gets the engine's guarantees (also `pytest -m guarantees`)."""

import csv

import torch

from template_package.char_lm.data import TextDataModule
from template_package.char_lm.model import CharTransformer

from helpers.char_lm_task import CHAR_LM
from helpers.cli import cli, scalars

# A short run: 2 epochs of 20 batches, validated on 4 batches, every step logged.
SHORT = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=20", "--trainer.limit_val_batches=4",
         "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1"]  # fmt: skip


def test_windows_are_dict_batches_of_the_next_characters():
    data = TextDataModule(block_size=16, batch_size=4)
    data.setup("fit")
    batch = next(iter(data.val_dataloader()))
    assert batch["x"].shape == batch["y"].shape == (4, 16) and batch["x"].dtype == torch.long
    assert torch.equal(batch["x"][0, 1:], batch["y"][0, :-1])  # y is x shifted by one character
    assert data.vocabulary == "".join(sorted(set(data.text))) and len(data.vocabulary) > 80


def test_a_prediction_depends_on_earlier_characters_only():
    model = CharTransformer(vocabulary="abcdef", block_size=8).eval()
    ids = torch.randint(6, (1, 8), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 6
    with torch.no_grad():
        before, after = model(ids), model(changed)
    assert torch.equal(before[0, :5], after[0, :5]) and not torch.equal(before[0, 5:], after[0, 5:])


def test_it_learns_logs_perplexity_and_continues_prompts(run_dir):
    cli("fit", *CHAR_LM, f"--trainer.default_root_dir={run_dir}", *SHORT, task=[])
    logged = scalars(run_dir)
    losses = [value for _, value in logged["train/loss"]]
    assert losses[-1] < 0.8 * losses[0]  # from about log(103) = 4.6
    val_loss, perplexity = logged["val/loss"][-1][1], logged["val/perplexity"][-1][1]
    assert abs(perplexity - torch.tensor(val_loss).exp().item()) < 0.05 * perplexity
    assert list((run_dir / "checkpoints").glob("epoch=1-val_loss=*.ckpt"))  # the best by val/loss
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    cli("predict", *CHAR_LM, f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={checkpoint}",
        "--data.prompts=[Python, 'x = ']", "--model.sample_chars=30", task=[])  # fmt: skip
    rows = list(csv.DictReader((run_dir / "predictions.csv").open()))
    assert [row["prediction"][: len(prompt)] for row, prompt in zip(rows, ["Python", "x = "], strict=True)] == [
        "Python", "x = "]  # fmt: skip
    assert all(len(row["prediction"]) == len(prompt) + 30 for row, prompt in zip(rows, ["Python", "x = "], strict=True))
