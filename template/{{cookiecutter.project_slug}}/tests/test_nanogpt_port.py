"""nanoGPT's model and recipe, moved onto the engine with a config file and flags only (helpers/nano_gpt.yaml names
helpers/nano_gpt.py's NanoGPT, which overrides no method of the recipe): every optimizer step's LR is nanoGPT's
`get_lr`, and the optimizer's groups are its `configure_optimizers`'s. The model is made small by flags (the recipe
does not depend on its size); the recipe's settings are the config's."""

import math

import lightning as L
import pytest
import torch

from template_package.engine.training.recipe import TrainingRecipe

from helpers.cli import TESTS, cli
from helpers.nano_gpt import NanoGPT

CONFIG = str(TESTS / "helpers" / "nano_gpt.yaml")
# A small network, cheap batches and validations: flags of the run, none of the recipe's.
SMALL = ["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16", "--data.block_size=8", "--data.batch_size=4",
         "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--trainer.callbacks+=helpers.nano_gpt.RecordLRs"]  # fmt: skip


def get_lr(it: int, learning_rate=1e-3, warmup_iters=100, lr_decay_iters=2000, min_lr=1e-4) -> float:
    """nanoGPT's train.py, as it is, with config/train_shakespeare_char.py's settings as defaults."""
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


def configure_optimizers(model, weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.99)) -> torch.optim.AdamW:
    """nanoGPT's GPT.configure_optimizers on CPU (no fused AdamW), as it is."""
    # start with all of the candidate parameters
    param_dict = {pn: p for pn, p in model.named_parameters()}
    # filter out those that do not require grad
    param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
    # create optim groups. Any parameters that is 2D will be weight decayed, otherwise no.
    # i.e. all weight tensors in matmuls + embeddings decay, all biases and layernorms don't.
    decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
    nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
    optim_groups = [
        {"params": decay_params, "weight_decay": weight_decay},
        {"params": nodecay_params, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


def fit(run_dir, *flags: str):
    """`fit -c helpers/nano_gpt.yaml` with the small network and `flags`: the run's LRs (lrs[step][group]) and the
    LightningCLI."""
    result = cli("fit", "-c", CONFIG, f"--trainer.default_root_dir={run_dir}", *SMALL, *flags, task=[])
    record = next(c for c in result.trainer.callbacks if type(c).__name__ == "RecordLRs")
    return record.lrs, result


@pytest.fixture(scope="module")
def nanogpt_run(tmp_path_factory):
    """The config's whole run: 2001 optimizer steps."""
    return fit(tmp_path_factory.mktemp("nanogpt") / "run")


def test_the_port_overrides_no_method_of_the_recipe():
    hooks = {name for name in vars(NanoGPT) if callable(getattr(L.LightningModule, name, None))}
    assert hooks - {"__init__", "forward", "training_step", "validation_step"} == set()
    assert issubclass(NanoGPT, TrainingRecipe)


def test_the_lr_at_every_step_is_nanogpts_get_lr(nanogpt_run):
    lrs, result = nanogpt_run
    assert result.trainer.global_step == len(lrs) == 2001  # iterations 0 to max_iters, both included
    for it, group_lrs in enumerate(lrs):
        assert group_lrs == [pytest.approx(get_lr(it), rel=1e-7, abs=0)] * 2, it
    assert lrs[100] == [1e-3, 1e-3] and lrs[2000] == [pytest.approx(1e-4, rel=1e-12)] * 2  # the peak, the floor


def test_the_optimizers_groups_are_configure_optimizers(nanogpt_run):
    """The same parameters in the same order in each group, and every AdamW setting the same (the LR: the initial
    one, the schedule's base)."""
    _, result = nanogpt_run
    assert_same_groups(result.trainer.optimizers[0], configure_optimizers(result.model))


def test_with_biases_the_biases_join_the_layernorms_without_decay(tmp_path):
    """GPT-2's biases (`--model.bias true`): every bias and LayerNorm weight undecayed, the matrices and the tied
    embedding (one parameter, in the groups once) decayed."""
    _, result = fit(tmp_path / "run", "--model.bias=true", "--trainer.max_steps=1")
    assert_same_groups(result.trainer.optimizers[0], configure_optimizers(result.model))
    names = {id(p): n for n, p in result.model.named_parameters()}
    decay, no_decay = ({names[id(p)] for p in g["params"]} for g in result.trainer.optimizers[0].param_groups)
    assert {"transformer.h.0.attn.c_attn.bias", "transformer.h.0.ln_1.weight", "transformer.ln_f.bias"} <= no_decay
    assert all(name.endswith(("bias", "weight")) and ("bias" in name or "ln_" in name) for name in no_decay)
    assert "transformer.wte.weight" in decay and "lm_head.weight" not in decay | no_decay  # (tied: named once)


def assert_same_groups(optimizer: torch.optim.Optimizer, reference: torch.optim.AdamW) -> None:
    assert isinstance(optimizer, torch.optim.AdamW)
    assert len(optimizer.param_groups) == len(reference.param_groups) == 2
    for group, expected in zip(optimizer.param_groups, reference.param_groups, strict=True):
        assert [id(p) for p in group["params"]] == [id(p) for p in expected["params"]]
        assert {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")} == {
            k: v for k, v in expected.items() if k not in ("params", "lr")
        }
        assert group["initial_lr"] == expected["lr"] == 1e-3


def test_past_decay_steps_the_rate_stays_at_its_floor(tmp_path):
    """A run longer than its horizon (nanoGPT's `it > lr_decay_iters`): 120 steps of cosine, then 40 at min_lr."""
    lrs, _ = fit(tmp_path / "run", "--model.warmup=20", "--model.decay_steps=120", "--trainer.max_steps=160")
    assert len(lrs) == 160
    for it, group_lrs in enumerate(lrs):
        assert group_lrs == [pytest.approx(get_lr(it, warmup_iters=20, lr_decay_iters=120), rel=1e-7, abs=0)] * 2
    assert lrs[120:] == [[pytest.approx(1e-4, rel=1e-12)] * 2] * 40


def test_a_fractional_warmup_is_a_share_of_the_horizon(tmp_path):
    """warmup 0.05 of decay_steps 2000 is nanoGPT's 100 warmup steps, in a run of 150 steps (a share of the run would
    be 8)."""
    lrs, _ = fit(tmp_path / "run", "--model.warmup=0.05", "--trainer.max_steps=150")
    assert len(lrs) == 150
    for it, group_lrs in enumerate(lrs):
        assert group_lrs == [pytest.approx(get_lr(it), rel=1e-7, abs=0)] * 2, it
