"""The project's training recipe written as a plain PyTorch loop, without Lightning.

The parity test (tests/test_parity.py) checks that the Trainer computes exactly this, and benchmarks/overhead.py
measures what the Trainer costs on top of it. Written independently of model.py and schedulers.py on purpose.
"""

import math
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup from 1/(warmup+1) to 1, then cosine down to min_lr_ratio at total_steps."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(net: nn.Module, loader: Iterable, *, epochs: int, **recipe) -> list[float]:
    """Train `net` in place for `epochs` epochs and return the loss of the last batch of every optimizer step."""
    return [loss for epoch_losses in train_epochs(net, loader, epochs=epochs, **recipe) for loss in epoch_losses]


def train_epochs(
    net: nn.Module,
    loader: Iterable,
    *,
    epochs: int,
    accumulate: int = 1,
    lr: float = 3e-3,
    weight_decay: float = 0.05,
    warmup: float = 0.1,
    min_lr_ratio: float = 0.01,
    clip_norm: float | None = 1.0,
    precision: str = "32-true",
    device: str = "cpu",
    memory_format: torch.memory_format = torch.contiguous_format,
    ema: dict[str, torch.Tensor] | None = None,
    ema_decay: float = 0.99,
    grad_norms: list[float] | None = None,
) -> Iterator[list[float]]:
    """Train `net` in place, one epoch per iteration, yielding the epoch's losses, the mean over each optimizer step's
    accumulation window. (benchmarks/overhead.py runs the epochs one at a time, alternating with the Trainer's.)

    `memory_format=torch.channels_last` lays out weights and images as NHWC. `grad_norms` (a list) gets every optimizer
    step's total gradient norm before clipping, computed by hand. With `ema` (an empty dict), it is filled
    with an exponential moving average of every parameter and buffer: a copy after the first optimizer step, then
    ema = decay * ema + (1 - decay) * value after each one."""
    net.to(device, memory_format=memory_format).train()
    decay = [p for p in net.parameters() if p.ndim >= 2]  # weight matrices and conv kernels
    no_decay = [p for p in net.parameters() if p.ndim < 2]  # biases and norm scales/shifts
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    # An epoch is whole accumulation windows: the batches after the last whole one are left out, as the engine's
    # loader does (its epochs are whole global batches, engine/training/batch_layout.py).
    batches = len(loader) // accumulate * accumulate
    total_steps = epochs * batches // accumulate
    warmup_steps = round(warmup * total_steps) if warmup < 1 else int(warmup)
    autocast_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    # fp16 gradients underflow without loss scaling; bf16 has float32's range and needs none.
    scaler = torch.amp.GradScaler(device, enabled=precision == "16-mixed")
    step = 0
    for epoch in range(epochs):
        losses = []
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        window = 0
        for i, (x, y) in enumerate(loader):
            if i == batches:
                break
            x, y = x.to(device, non_blocking=True, memory_format=memory_format), y.to(device, non_blocking=True)
            with torch.autocast(device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = F.cross_entropy(net(x), y)
            # Summed over the window, loss / accumulate gives the mean gradient of a full window, as in Lightning.
            scaler.scale(loss / accumulate).backward()
            window = window + loss.detach() / accumulate  # the window's mean loss so far
            if (i + 1) % accumulate != 0:
                continue  # inside an accumulation window
            for group in optimizer.param_groups:
                group["lr"] = lr * lr_factor(step, warmup_steps, total_steps, min_lr_ratio)
            if clip_norm is not None or grad_norms is not None:
                scaler.unscale_(optimizer)  # clip and measure the true gradients, not the loss-scaled ones
            if grad_norms is not None:  # by hand, in float64
                grads = [p.grad.double() for p in decay + no_decay if p.grad is not None]
                grad_norms.append(math.sqrt(sum(float((g * g).sum()) for g in grads)))
            if clip_norm is not None:
                # One global norm over every parameter, summed in the optimizer's order like Lightning does.
                torch.nn.utils.clip_grad_norm_(decay + no_decay, clip_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if ema is not None:
                update_ema(ema, net, ema_decay)
            losses.append(window.item())
            window = 0
            step += 1
        yield losses


@torch.no_grad()
def update_ema(ema: dict[str, torch.Tensor], net: nn.Module, decay: float) -> None:
    for name, value in [*net.named_parameters(), *net.named_buffers()]:
        if name not in ema:
            ema[name] = value.detach().clone()
        elif value.is_floating_point():
            ema[name].mul_(decay).add_(value.detach(), alpha=1 - decay)
        else:  # BatchNorm's step counter: averaged as a number, kept an integer
            ema[name].copy_((decay * ema[name] + (1 - decay) * value).to(value.dtype))
