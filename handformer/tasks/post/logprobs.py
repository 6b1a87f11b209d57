"""Log-probabilities of chosen tokens: what DPO compares between the policy and the reference, and
what GRPO's ratio and KL term are made of.

Shape legend: B rows, T positions, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from handformer.tasks.post.packing import IGNORE


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """(B, T) log p(target) under (B, T, V) logits, in float32; 0 where the target is IGNORE."""
    keep = targets != IGNORE  # (B, T)
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    picked = logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)  # (B, T)
    return picked * keep


def completion_targets(rows: list[tuple[list[int], int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded rows of (ids, prompt length): (x (B, T), targets (B, T) that are the
    completion's tokens and IGNORE elsewhere, attention mask (B, T))."""
    T = max(len(ids) for ids, _ in rows) - 1
    x = torch.full((len(rows), T), pad_id, dtype=torch.long)
    y = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(rows):
        x[i, :len(ids) - 1] = torch.tensor(ids[:-1])
        mask[i, :len(ids) - 1] = 1
        # target t predicts ids[t + 1]: the completion's tokens are ids[n_prompt:]
        y[i, n_prompt - 1:len(ids) - 1] = torch.tensor(ids[n_prompt:])
    return x, y, mask


__all__ = ["completion_targets", "token_logprobs"]
