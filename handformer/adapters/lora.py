"""LoRA: low-rank adapters on the linear layers of a trained model (Hu et al., 2021, "LoRA: Low-Rank
Adaptation of Large Language Models", equations 3 and 4).

    h = x W^T + b + (dropout(x) A^T B^T) * alpha / r

W (O, I) and b are the base layer's weights and stay frozen; only A (r, I) and B (O, r) train.
A starts Kaiming-uniform (as nn.Linear initializes its weight) and B at zero, so before the first
update the adapted model computes exactly what the base model computes. After training the
adapters fold into one plain weight, W + B A * alpha / r ("merging"), and the model is an ordinary
one again.

Shape legend: N any leading dims (batch, length), I in features, O out features, r rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.config import dataclass_from_dict
from handformer.replace import replace_layers

ALL_LINEAR = "all-linear"  # every linear layer of the blocks, not the output head (as peft)


@dataclass
class LoRAConfig:
    rank: int = 8  # r: the inner width of the adapters (B A has rank <= r)
    alpha: float = 16.0  # the adapters' output is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapters' input (the base path sees x unchanged)
    # linear layers to adapt, by name (q_proj, k_proj, v_proj, o_proj, up_proj, gate_proj,
    # down_proj, or a longer suffix such as "self_attn.q_proj"), or "all-linear"
    targets: list[str] | str = field(default_factory=lambda: ["q_proj", "v_proj"])

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            raise ValueError(f"[train.lora] {name}={getattr(self, name)!r} is invalid: {fix}")

        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank <= 0:
            fail("rank", "it must be a positive integer (typical: 4 to 64)")
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or self.alpha <= 0:
            fail("alpha", "it must be a number > 0 (the adapters are scaled by alpha / rank)")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            fail("dropout", "it must be in [0, 1)")
        if isinstance(self.targets, str):
            if self.targets != ALL_LINEAR:
                fail("targets", f'give a list of layer names such as ["q_proj", "v_proj"], or "{ALL_LINEAR}"')
        elif (not isinstance(self.targets, list) or not self.targets
              or not all(isinstance(t, str) and t for t in self.targets)):
            fail("targets", f'give a non-empty list of layer names such as ["q_proj", "v_proj"], or '
                 f'"{ALL_LINEAR}"')

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoRAConfig:
        return dataclass_from_dict(cls, data, "train.lora")


class LoRALinear(nn.Module):
    """A linear layer plus a trainable low-rank update: x W^T + b + (dropout(x) A^T B^T) * scale.

    It takes over the base layer's `weight` and `bias` under the same names, so the base weights
    load and save as before; the adapters add `lora_A` and `lora_B`."""

    frozen_base = True  # a checkpoint of the model holds the adapters only (training/checkpoint.py)

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight  # (O, I), frozen by add_lora
        self.bias = base.bias  # (O,) or None
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        kind = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **kind))  # (r, I)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **kind))  # (O, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's init of a (r, I) weight
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, I) -> (N, O). The scale multiplies the (N, r) product, the smallest tensor on
        the path, and the sum is in place (the base's backward does not need its output)."""
        out = F.linear(x, self.weight, self.bias)  # (N, O): the frozen layer
        down = F.linear(self.dropout(x), self.lora_A) * self.scale  # (N, r)
        return out.add_(F.linear(down, self.lora_B))  # (N, O)

    def merged_weight(self) -> Tensor:
        """W + B A * alpha / r: one (O, I) weight computing the same function (without dropout)."""
        return self.weight + (self.lora_B @ self.lora_A) * self.scale  # (O, r) @ (r, I) -> (O, I)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, rank={self.rank}, alpha={self.alpha}"


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every linear layer inside the model's blocks (`model.layers`), by full name. The output
    head and embeddings are outside the blocks, so "all-linear" never adapts them (as peft)."""
    return {f"layers.{name}": m for name, m in model.layers.named_modules() if isinstance(m, nn.Linear)}


def select_targets(model: nn.Module, cfg: LoRAConfig) -> dict[str, nn.Linear]:
    """The linear layers `cfg.targets` names. A name matches a layer whose full name is it or ends
    with "." + it. A target that matches nothing, or a rank above a layer's, is a ValueError."""
    linears = block_linears(model)
    if cfg.targets == ALL_LINEAR:
        chosen = linears
    else:
        chosen = {}
        for target in cfg.targets:
            found = {n: m for n, m in linears.items() if n == target or n.endswith("." + target)}
            if not found:
                names = sorted({n.rsplit(".", 1)[-1] for n in linears})
                raise ValueError(f"[train.lora] targets: {target!r} matches no linear layer of the "
                                 f"model's blocks; their layers are named {', '.join(names)} (or use "
                                 f'targets = "{ALL_LINEAR}")')
            chosen.update(found)
    for name, layer in chosen.items():
        if cfg.rank > min(layer.in_features, layer.out_features):
            raise ValueError(f"[train.lora] rank={cfg.rank} is invalid: it is larger than layer {name} "
                             f"({layer.in_features} -> {layer.out_features}); the rank can be at most "
                             f"{min(layer.in_features, layer.out_features)}")
    return chosen


def add_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Freeze every weight of `model` and put a LoRALinear in place of each target layer, in place.
    Returns the adapted layers' names. Only the adapters have requires_grad afterwards."""
    targets = select_targets(model, cfg)
    for p in model.parameters():
        p.requires_grad_(False)
    return replace_layers(model, targets, lambda layer: LoRALinear(layer, cfg.rank, cfg.alpha, cfg.dropout))


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer (W <- W + B A * alpha / r), in place: the model is a plain
    one again, all of its weights trainable. Returns `model`."""
    def plain(layer: LoRALinear) -> nn.Linear:
        linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                           device=layer.weight.device, dtype=layer.weight.dtype)
        linear.weight.copy_(layer.merged_weight())
        if layer.bias is not None:
            linear.bias.copy_(layer.bias)
        return linear

    replace_layers(model, {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}, plain)
    for p in model.parameters():
        p.requires_grad_(True)
    return model
