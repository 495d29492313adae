import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from template_package.model import ImageClassifier, weight_decay_groups


def test_biases_and_norm_weights_do_not_decay():
    model = ImageClassifier()
    decay, no_decay = weight_decay_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and p.ndim >= 2 for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"net.head.bias", "net.features.1.weight"}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("max_epochs, max_steps, accumulate", [(3, -1, 1), (3, -1, 3), (50, 5, 2)])
def test_schedule_counts_optimizer_steps_and_ends_at_min_lr(max_epochs, max_steps, accumulate):
    """10 batches per epoch: with accumulation 3 an epoch is ceil(10 / 3) = 4 optimizer steps (last window partial)."""
    data = TensorDataset(torch.rand(40, 1, 8, 8), torch.randint(0, 10, (40,)))
    model = ImageClassifier(lr=1e-2, warmup=0.25, min_lr_ratio=0.1)
    trainer = L.Trainer(
        max_epochs=max_epochs, max_steps=max_steps, accumulate_grad_batches=accumulate,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, DataLoader(data, batch_size=4))
    expected = max_steps if max_steps > 0 else math.ceil(10 / accumulate) * max_epochs
    schedule = model.lr_schedulers()
    assert trainer.global_step == expected
    assert schedule.total_steps == expected and schedule.last_epoch == expected
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3)


def test_predict_step_returns_class_probabilities():
    model = ImageClassifier().eval()
    probs = model.predict_step((torch.rand(5, 1, 8, 8), torch.zeros(5)), 0)
    assert probs.shape == (5, 10)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))
