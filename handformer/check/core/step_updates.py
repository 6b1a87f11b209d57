"""What the training-step runners share (runners/train_step.py, classifier_step.py, lm_train_step.py,
adam_step.py): the parameters read after a step, the largest difference between two such reads, and
the end of a reference step (clip, learning rate, update)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from handformer.check.core.clipping import ValueClip


def parameters_of(model: nn.Module) -> list[Tensor]:
    """A copy of the model's parameters, in its order (what a step left them)."""
    return [p.detach().clone() for p in model.parameters()]


def gradient_norm(loss: Tensor, params: list[Tensor]) -> float:
    """The norm of the gradient of `loss` over all of `params` (those it does not reach left out)."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(torch.stack([g.norm() for g in grads if g is not None]).norm())


def largest_difference(a: list[Tensor], b: list[Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def largest_differences(got: list[list[Tensor]], right: list[list[Tensor]]) -> list[float]:
    """The largest difference of each pair of parameter lists (one a step)."""
    return [largest_difference(g, r) for g, r in zip(got, right)]


def update(model: nn.Module, opt: torch.optim.Optimizer, clip: float | None, clip_after: bool = False,
           lr: float | None = None) -> None:
    """The end of a reference step: the gradients clipped at `clip` (after `opt.step()` when
    `clip_after`: the named mistake; each element at it where it is a ValueClip), the learning rate set
    when given, the update."""
    if clip is not None and not clip_after:
        _clip(model, clip)
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    opt.step()
    if clip is not None and clip_after:  # clips the gradients already used (kept, without zero_grad)
        _clip(model, clip)


def _clip(model: nn.Module, clip: float) -> None:
    if isinstance(clip, ValueClip):
        nn.utils.clip_grad_value_(model.parameters(), clip)
    else:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
