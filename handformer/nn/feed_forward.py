"""The position-wise feed-forward network (section 3.3 of the paper) and its gated variants.

Plain (`FeedForward`):  down_proj(act(up_proj(x)))       act = ReLU (paper), GELU, GELU-tanh (GPT-2),
                                                          ReLU² = relu(x)^2 (Primer; modded-nanogpt),
                                                          xIELU (Apertus: its alphas learned, families/)
Gated (`GatedFeedForward`):  down_proj(act(gate_proj(x)) * up_proj(x))
                        SwiGLU (act = SiLU, Llama), GEGLU (GELU), GEGLU-tanh (tanh-approximated GELU: Gemma)

Both act on every position alone: no token reads another here (that is attention's job).

Shape legend: B batch, T length, D d_model, F hidden width (d_ff).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.config import GATED_ACTIVATIONS, PLAIN_ACTIVATIONS


def xielu(x: Tensor, alpha_p: float | Tensor = 0.8, alpha_n: float | Tensor = 0.8, beta: float | Tensor = 0.5,
          eps: float | Tensor = -1e-6) -> Tensor:
    """xIELU (Huang and Schlag, 2025): alpha_p x^2 + beta x for x > 0, else
    alpha_n (e^min(x, eps) - 1 - x) + beta x: a quadratic positive side (as ReLU^2) and an
    ELU-like negative one, both plus beta x. The defaults are the paper's starting values; Apertus learns
    alpha_p and alpha_n per layer."""
    positive = alpha_p * x * x + beta * x
    negative = (torch.expm1(torch.clamp(x, max=eps)) - x) * alpha_n + beta * x
    return torch.where(x > 0, positive, negative)


ACT = {
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),  # ReLU squared (Primer; the modded-nanogpt speedrun's)
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "xielu": xielu,
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """Two linear layers with an activation between them: (B, T, D) -> (B, T, F) -> (B, T, D).

    A gated activation (swiglu, geglu, geglu_tanh) makes the gated variant: FeedForward(512, 1376,
    "swiglu") is a GatedFeedForward, written out below."""

    def __new__(cls, d_model: int = 0, d_ff: int = 0, activation: str = "relu", bias: bool = True,
                ) -> FeedForward:  # the defaults serve copy and pickle, which call __new__ alone
        gated = cls is FeedForward and activation in GATED_ACTIVATIONS
        return super().__new__(GatedFeedForward if gated else cls)

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True) -> None:
        super().__init__()
        if activation not in PLAIN_ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of "
                             f"{', '.join(PLAIN_ACTIVATIONS + GATED_ACTIVATIONS)}")
        self.activation, self.act = activation, ACT[activation]
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)  # W_1: (B, T, D) -> (B, T, F)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)  # W_2: (B, T, F) -> (B, T, D)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class GatedFeedForward(FeedForward):
    """A gated linear unit (Shazeer 2020): the activated gate multiplies the up projection
    elementwise, then the down projection; three matrices instead of two."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "swiglu", bias: bool = True) -> None:
        nn.Module.__init__(self)
        if activation not in GATED_ACTIVATIONS:
            raise ValueError(f"GatedFeedForward's activation must be one of {', '.join(GATED_ACTIVATIONS)}, "
                             f"got {activation!r}; a plain one is FeedForward(d_model, d_ff, {activation!r})")
        self.activation, self.act = activation, ACT[activation]
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)  # (B, T, D) -> (B, T, F)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)  # (B, T, D) -> (B, T, F)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)  # (B, T, F) -> (B, T, D)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

