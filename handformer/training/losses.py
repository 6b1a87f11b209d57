"""Losses: cross-entropy with label smoothing (the paper, section 5.4), ignoring padding.

Returned as a sum over real tokens; the training loop divides by the number of real tokens in the
whole optimizer step, so every token weighs the same whatever the batch and accumulation sizes.

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor


@dataclass
class Loss:
    """What a loss function may return instead of a bare sum: the summed loss to train on, and
    parts of it to log beside train_loss (each summed over the batch's real tokens too, so the loop
    logs it per token). A mixture of experts logs its load-balancing loss so."""

    total: Tensor  # the summed loss, backpropagated
    parts: dict[str, Tensor] = field(default_factory=dict)  # name -> summed value, logged only


def loss_total(loss: Tensor | Loss) -> Tensor:
    """The summed loss of what a loss function returned."""
    return loss.total if isinstance(loss, Loss) else loss


def token_cross_entropy(logits: Tensor, targets: Tensor, pad_id: int | None,
                        label_smoothing: float = 0.0) -> Tensor:
    """Sum over non-pad positions of CE between (..., V) logits and (...) targets, e.g.
    (B, T, V) and (B, T), or (N, V) and (N,) when the caller already dropped the padding.

    With smoothing eps the target distribution is (1 - eps) on the right token plus eps spread
    uniformly over the vocabulary; pad targets contribute nothing (and get zero gradient).
    """
    V = logits.size(-1)
    return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1),  # (B*T, V), (B*T,)
                           ignore_index=-100 if pad_id is None else pad_id,
                           label_smoothing=label_smoothing, reduction="sum")
