"""Learning-rate schedules as pure functions of the step (0-based), so resuming needs only the step.

- inverse_sqrt (the paper, section 5.3): lrate = d_model^-0.5 * min(n^-0.5, n * warmup^-1.5) with
  n = step + 1, written here with its peak value `lr` reached at n = warmup:
  lr * min(n / warmup, sqrt(warmup / n)). With lr = (d_model * warmup)^-0.5 it is the paper's formula.
- cosine: linear warmup to `lr`, then half a cosine down to `min_lr` at `total_steps`.
- constant: linear warmup, then `lr`.
"""

from __future__ import annotations

import math

SCHEDULES = ("inverse_sqrt", "cosine", "constant")


def learning_rate(step: int, schedule: str, lr: float, warmup: int, total_steps: int,
                  min_lr: float = 0.0) -> float:
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
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def paper_learning_rate(step: int, d_model: int, warmup: int) -> float:
    """The closed form of the paper, for reference and tests."""
    n = step + 1
    return d_model ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)
