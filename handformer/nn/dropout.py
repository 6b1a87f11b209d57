"""Dropout (section 5.4 of the paper): during training, each sublayer's output and the sum of the
embeddings and positions are dropped with probability P_drop (0.1 in the base model), before the
residual add. After `model.eval()` dropout returns its input.

Most LLMs train with no dropout at all. `make_dropout(0.0)` gives such a model `NoDropout`, the
identity as a plain call (its `__call__` is its `forward`, as NoNorm's): an `nn.Dropout(0.0)` would
still be a module call, and an operator call, at every layer of every decoding step.
"""

from __future__ import annotations

from torch import Tensor, nn


class NoDropout(nn.Module):
    """Dropout that drops nothing: the input itself, called without `nn.Module`'s hook machinery."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    __call__ = forward  # a plain call: nothing to hook, nothing to dispatch


def make_dropout(p: float) -> nn.Module:
    """nn.Dropout(p); NoDropout when p is 0 (nothing to drop)."""
    return nn.Dropout(p) if p > 0 else NoDropout()
