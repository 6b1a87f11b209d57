"""Normalization: LayerNorm (the paper) and RMSNorm (modern LLMs), both computed in float32 at least.

LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias, statistics over the last dimension.
RMSNorm:   x / sqrt(mean(x^2) + eps) * weight; no centering, no bias.
RMSNorm with a unit offset (Gemma): x / sqrt(mean(x^2) + eps) * (1 + weight); the stored weight is
the gain's offset from 1, initialised to 0, and the whole computation stays in float32.
Computing in float32 keeps the statistics accurate under bf16 autocast; the result is cast back.
A float64 model (a reference compared with another) keeps float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.config import BlockConfig


def wide(x: Tensor) -> Tensor:
    """x in float32, or in float64 where it is float64 already: what the norms compute in."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else wide(self.bias)
        out = F.layer_norm(wide(x), (x.size(-1),), wide(self.weight), bias, self.eps)
        return out.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        x32 = wide(x)
        x32 = x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * x32.type_as(x)


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose gain is 1 + weight (Gemma): a zero weight is the identity gain."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        x32 = wide(x)
        x32 = x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + wide(self.weight))).type_as(x)


class NoNorm(nn.Module):
    """Where a model has no norm (most models' per-head q/k norms; after a post-norm stack)."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    __call__ = forward  # a plain call, without nn.Module's hooks: a norm that is not there costs nothing


NORMS = {
    "layernorm": LayerNorm,
    "rmsnorm": lambda d_model, eps, bias: RMSNorm(d_model, eps),  # no bias to have
    "rmsnorm_offset": lambda d_model, eps, bias: OffsetRMSNorm(d_model, eps),
    "none": lambda d_model, eps, bias: NoNorm(),  # where a model has no norm (q/k norms, mostly)
}


def make_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """The norm a config names (`BlockConfig.norm`)."""
    if kind not in NORMS:
        raise ValueError(f"unknown norm {kind!r}; choose {', '.join(NORMS)}")
    return NORMS[kind](d_model, eps, bias)


def final_norm(cfg: BlockConfig) -> nn.Module:
    """The norm after the last layer of a pre-norm stack (its layers' outputs are not normed; so
    too Gemma's and OLMo 2's, whose residual stream is never normed in place); nothing
    (NoNorm) after a post-norm stack, whose every layer ends with a norm."""
    norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
    return norm if cfg.norm_placement != "post" else NoNorm()
