"""The stand-in a training step or a loss of the model is driven with: handformer's one-layer llama-style
model on a 13-token vocabulary, in float64, and two windows of one random token stream. A learner's
step, or their `compute_loss(model, tokens)`, is handed this model, so what it computes can be compared
with handformer's own step on the same weights and batches."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.families import build_causal_lm
from handformer.models.causal_lm import CausalLM

VOCAB, D, LENGTH, BATCH = 13, 8, 6, 2  # a step that accumulates gets ACCUM x BATCH windows
POSITIONS = 16  # the longest context the model runs (its block size: no shorter than a window)


def batches(rows: int = BATCH) -> list[tuple[Tensor, Tensor]]:
    """Two (x (B, T), y (B, T)) windows of one random token stream, y = x moved on by one: B = rows (a
    step that accumulates gets BATCH a micro-batch: a micro-batch's slice of the wrong rows shows)."""
    stream = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(5))
    out = []
    for starts in ((3, 50, 77, 160)[:rows], (101, 140, 20, 120)[:rows]):
        x = torch.stack([stream[s:s + LENGTH] for s in starts])  # (B, T)
        y = torch.stack([stream[s + 1:s + 1 + LENGTH] for s in starts])  # (B, T)
        out.append((x, y))
    return out


class Logits(nn.Module):
    """handformer's model as the learner's step sees it: `model(x)` returns the logits (B, T, V);
    `model(x, y)` (nanoGPT's `logits, loss = model(X, Y)`) returns them with the cross-entropy;
    `model(x, labels=x)` (Hugging Face's labels, the inputs themselves) with the cross-entropy of each
    position against the next token, as a model that shifts its labels computes it."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__()
        self.model = model
        self.scale = 1.0  # the logits' factor: small, the gradients stay under the clipping norm

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        logits = self.model(x).logits * self.scale  # (B, T, V)
        targets = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)
                        and not _mask(a)), None)  # a mask of ones beside the ids (attention_mask) read past
        if targets is None:
            return logits
        if kwargs.get("labels") is x:  # labels=x (the ids handed as both): the model shifts them
            logits, targets = logits[:, :-1], targets[:, 1:]  # (B, T - 1, V), (B, T - 1)
        return logits, F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _mask(t: Tensor) -> bool:
    """A tensor of 0s and 1s that is no float: a mask handed beside the ids, not targets (the windows
    hold all of a 13-token vocabulary)."""
    return not t.is_floating_point() and bool(((t == 0) | (t == 1)).all())


def tiny_model() -> Logits:
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=VOCAB, d_model=D, n_heads=2, n_kv_heads=1, d_ff=16,
                                     n_layers=1, max_positions=POSITIONS)
    return Logits(build_causal_lm(cfg)).double()
