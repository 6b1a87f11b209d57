"""Norms for decoding: the lesson's RMSNorm, LayerNorm and Gemma's offset RMSNorm as plain calls.

A decoding step calls two norms a layer and one at the end. Each is a module call
(`nn.Module.__call__` looks for hooks before it runs `forward`), and the lesson's norms compute in
float32 and cast the result back with `type_as`, an operator call even when the input is float32
already and the cast does nothing. `plain_norms(model)` puts in place of each `RMSNorm`,
`LayerNorm` and `OffsetRMSNorm` its decoding twin, which holds the same weights and computes the
same numbers (tests/test_inference_norms.py), called as a plain method, and skips the cast of a
float32 input (`cast_back`).
Inference only, as fusion is: hooks registered on a norm no longer run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.nn.norms import LayerNorm, OffsetRMSNorm, RMSNorm
from handformer.replace import replace_layers


def cast_back(out: Tensor, x: Tensor) -> Tensor:
    """A norm's float32 result in its input's dtype: itself for a float32 input (no operator call)."""
    return out if x.dtype == torch.float32 else out.type_as(x)


class DecodingRMSNorm(nn.Module):
    """`RMSNorm` for decoding: x / sqrt(mean(x^2) + eps) * weight, on the norm's own weight."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.eps, self.weight = norm.eps, norm.weight

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * cast_back(x32, x)

    __call__ = forward  # a plain call: no hooks


class DecodingLayerNorm(nn.Module):
    """`LayerNorm` for decoding: (x - mean) / sqrt(var + eps) * weight + bias, on the norm's own
    weight and bias."""

    def __init__(self, norm: LayerNorm) -> None:
        super().__init__()
        self.eps, self.weight, self.bias = norm.eps, norm.weight, norm.bias

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype == torch.float32:  # nothing to cast
            return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), (x.size(-1),), self.weight.float(), bias, self.eps).type_as(x)

    __call__ = forward  # a plain call: no hooks


class DecodingOffsetRMSNorm(nn.Module):
    """`OffsetRMSNorm` (Gemma) for decoding: x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32,
    on the norm's own weight."""

    def __init__(self, norm: OffsetRMSNorm) -> None:
        super().__init__()
        self.eps, self.weight = norm.eps, norm.weight

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)
        return cast_back(x32 * (1.0 + self.weight.float()), x)

    __call__ = forward  # a plain call: no hooks


TWINS = {RMSNorm: DecodingRMSNorm, LayerNorm: DecodingLayerNorm, OffsetRMSNorm: DecodingOffsetRMSNorm}


def plain_norms(model: nn.Module) -> nn.Module:
    """Replace, in place, every RMSNorm, LayerNorm and OffsetRMSNorm of `model` by its decoding twin;
    returns `model`."""
    norms = {name: m for name, m in model.named_modules() if type(m) in TWINS}
    replace_layers(model, norms, lambda norm: TWINS[type(norm)](norm))
    return model


__all__ = ["DecodingLayerNorm", "DecodingOffsetRMSNorm", "DecodingRMSNorm", "plain_norms"]
