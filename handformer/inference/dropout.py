"""Dropout out of a model that only decodes: every `nn.Dropout` becomes `NoDropout`.

In eval mode dropout already returns its input unchanged, but each `nn.Dropout` is still a module
call at every layer of every decoding step: `nn.Module.__call__` looks for hooks before it runs
`forward`, about a microsecond each time, three times a layer. `NoDropout` returns its input from a
plain method call (its `__call__` is its `forward`, so no hooks run on it: it has nothing to
observe). Inference only: the model no longer drops anything when trained.
"""

from __future__ import annotations

from torch import Tensor, nn

from handformer.replace import replace_layers


class NoDropout(nn.Module):
    """Dropout at inference: the input itself, called without `nn.Module`'s hook machinery."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    __call__ = forward  # a plain call: nothing to hook, nothing to dispatch


def remove_dropout(model: nn.Module) -> nn.Module:
    """Replace, in place, every nn.Dropout of `model` by NoDropout; returns `model`."""
    dropouts = {name: m for name, m in model.named_modules() if isinstance(m, nn.Dropout)}
    replace_layers(model, dropouts, lambda _: NoDropout())
    return model


__all__ = ["NoDropout", "remove_dropout"]
