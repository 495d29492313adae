import math

import pytest
import torch

from template_package.engine.training.schedulers import (
    WarmupCosineSchedule,
    resolve_warmup_steps,
    warmup_cosine_factor,
)


def lrs_over_run(total_steps: int, warmup: float, peak: float = 1e-2, min_lr_ratio: float = 0.1) -> list[float]:
    """The LR used by each optimizer step 0..total_steps, then the LR after the last step."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    schedule = WarmupCosineSchedule(optimizer, warmup, total_steps, min_lr_ratio)
    lrs = []
    for _ in range(total_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return [*lrs, optimizer.param_groups[0]["lr"]]


@pytest.mark.parametrize("total_steps, warmup, warmup_steps", [(100, 0.1, 10), (100, 25, 25), (7, 0.3, 2), (50, 0, 0)])
def test_schedule_matches_formula_at_start_peak_and_end(total_steps, warmup, warmup_steps):
    peak, min_ratio = 1e-2, 0.1
    lrs = lrs_over_run(total_steps, warmup, peak, min_ratio)
    assert lrs[0] == pytest.approx(peak / (warmup_steps + 1) if warmup_steps else peak)
    assert lrs[warmup_steps] == pytest.approx(peak)  # the peak, right at the end of warmup
    assert lrs[-1] == pytest.approx(peak * min_ratio)  # the minimum once the run is over
    rising, falling = lrs[: warmup_steps + 1], lrs[warmup_steps:]
    assert all(a < b for a, b in zip(rising[:-1], rising[1:], strict=True))
    assert all(a >= b for a, b in zip(falling[:-1], falling[1:], strict=True))
    mid = warmup_steps + (total_steps - warmup_steps) // 2
    progress = (mid - warmup_steps) / (total_steps - warmup_steps)
    assert lrs[mid] == pytest.approx(peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))))


def test_total_steps_given_later_sets_the_current_lr():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = WarmupCosineSchedule(optimizer, warmup=0.5)
    assert optimizer.param_groups[0]["lr"] == 0.0  # unknown length: no update at a wrong rate
    schedule.set_total_steps(10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1 / 6)
    assert schedule.get_last_lr() == [pytest.approx(1 / 6)]


def test_factor_stays_at_minimum_after_the_end():
    assert warmup_cosine_factor(500, 10, 100, 0.05) == 0.05


@pytest.mark.parametrize(
    "warmup, total, message",
    [(100, 100, "not shorter than the whole run of 100"), (2.5, 100, "neither a fraction"), (-1, 10, "negative")],
)
def test_bad_warmup_is_refused_with_the_value(warmup, total, message):
    with pytest.raises(ValueError, match=message):
        resolve_warmup_steps(warmup, total)


def test_a_horizon_of_its_own_needs_no_run_length_and_ends_the_cosine_there():
    """decay_steps: the cosine ends there and the rate stays at its floor after it; a fractional warmup is a share of
    it (0.1 of 20: 2 steps); the run's length, given later or not at all, changes nothing."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = WarmupCosineSchedule(optimizer, warmup=0.1, min_lr_ratio=0.1, decay_steps=20)
    lrs = []
    for step in range(30):
        if step == 5:
            schedule.set_total_steps(10)
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs == [warmup_cosine_factor(step, 2, 20, 0.1) for step in range(30)]
    assert lrs[:3] == [1 / 3, 2 / 3, 1.0] and lrs[20:] == [0.1] * 10


@pytest.mark.parametrize(
    "warmup, decay_steps, message",
    [(20, 20, "not shorter than decay_steps=20, where the cosine ends: lower model.warmup or raise model.decay_steps"),
     (0.1, 0, "decay_steps=0 is not a number of optimizer steps >= 1")],
)  # fmt: skip
def test_a_horizon_no_longer_than_the_warmup_is_refused_with_the_value(warmup, decay_steps, message):
    with pytest.raises(ValueError, match=message):
        WarmupCosineSchedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), warmup,
                             decay_steps=decay_steps)  # fmt: skip


def test_get_last_lr_is_the_rate_that_trains_a_written_one_too():
    """An LR written between steps is the one the next step trains with: get_last_lr() says so before that step, and
    the schedule goes on from it (x the factor's change)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = WarmupCosineSchedule(optimizer, warmup=0, total_steps=10)
    optimizer.step()
    schedule.step()
    assert schedule.get_last_lr() == [warmup_cosine_factor(1, 0, 10, 0.0)]
    optimizer.param_groups[0]["lr"] = 0.5
    assert schedule.get_last_lr() == [0.5]
    optimizer.step()
    schedule.step()
    expected = 0.5 / warmup_cosine_factor(1, 0, 10, 0.0) * warmup_cosine_factor(2, 0, 10, 0.0)
    assert schedule.get_last_lr() == [pytest.approx(expected, rel=1e-12)]
