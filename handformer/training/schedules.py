"""Learning-rate schedules as pure functions of the step (0-based), so resuming needs only the step.

- inverse_sqrt (the paper, section 5.3): lrate = d_model^-0.5 * min(n^-0.5, n * warmup^-1.5) with
  n = step + 1, written here with its peak value `lr` reached at n = warmup:
  lr * min(n / warmup, sqrt(warmup / n)). With lr = (d_model * warmup)^-0.5 it is the paper's formula.
- cosine: linear warmup to `lr`, then half a cosine down to `min_lr` at `total_steps`.
- constant: linear warmup, then `lr`.
- trapezoid (warmup-stable-decay, the modded-nanogpt speedrun's): linear warmup, `lr` held, then a
  straight line down to `min_lr` over the last `cooldown` fraction of the steps. It spends longer
  at the peak than cosine does, and a run can be extended by moving only its cooldown.
"""

from __future__ import annotations

import math

SCHEDULES = ("inverse_sqrt", "cosine", "constant", "trapezoid")


def learning_rate(step: int, schedule: str, lr: float, warmup: int, total_steps: int,
                  min_lr: float = 0.0, cooldown: float = 0.2) -> float:
    n = step + 1  # so the very first step already has lr > 0
    warm = min(1.0, n / warmup) if warmup > 0 else 1.0
    if schedule == "inverse_sqrt":
        return lr * min(warm, math.sqrt(max(warmup, 1) / n))
    if schedule == "constant":
        return lr * warm
    if schedule == "cosine":
        if n <= warmup:
            return lr * warm
        progress = min(1.0, (n - warmup) / max(1, total_steps - warmup))
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    if schedule == "trapezoid":
        decay_steps = max(1, round(cooldown * total_steps))
        left = total_steps - n  # optimizer steps after this one
        if n <= warmup or left >= decay_steps:
            return lr * warm
        return min_lr + (lr - min_lr) * left / decay_steps  # the last step: min_lr
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def paper_learning_rate(step: int, d_model: int, warmup: int) -> float:
    """The closed form of the paper, for reference and tests."""
    n = step + 1
    return d_model ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)
