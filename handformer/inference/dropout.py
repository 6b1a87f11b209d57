"""Dropout out of a model that only decodes: every `nn.Dropout` becomes `NoDropout`.

In eval mode dropout already returns its input unchanged, but each `nn.Dropout` of a model trained
with dropout is still a module call at every layer of every decoding step: `nn.Module.__call__`
looks for hooks before it runs `forward`, then the dropout operator runs, a few microseconds each
time, three times a layer. `NoDropout` (handformer.nn.dropout, what a model without dropout is
built with) returns its input from a plain method call. Inference only: the model no longer drops
anything when trained.
"""

from __future__ import annotations

from torch import nn

from handformer.nn.dropout import NoDropout
from handformer.replace import replace_layers


def remove_dropout(model: nn.Module) -> nn.Module:
    """Replace, in place, every nn.Dropout of `model` by NoDropout; returns `model`."""
    dropouts = {name: m for name, m in model.named_modules() if isinstance(m, nn.Dropout)}
    replace_layers(model, dropouts, lambda _: NoDropout())
    return model


__all__ = ["NoDropout", "remove_dropout"]
