"""The position-wise feed-forward network (section 3.3 of the paper) and its gated variants.

Plain:  down_proj(act(up_proj(x)))                       act = ReLU (paper), GELU, GELU-tanh (GPT-2)
Gated:  down_proj(act(gate_proj(x)) * up_proj(x))         SwiGLU (act = SiLU, Llama), GEGLU (GELU),
                                                          GEGLU-tanh (GELU, tanh approximation: Gemma)

Shape legend: B batch, T length, D d_model, F hidden width (d_ff).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from handformer.config import ACTIVATIONS, GATED_ACTIVATIONS

_ACT = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        self.activation = activation
        self.act = _ACT[activation]
        self.gated = activation in GATED_ACTIVATIONS
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)  # (B, T, D) -> (B, T, F)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias) if self.gated else None
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)  # (B, T, F) -> (B, T, D)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_proj is not None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.act(self.up_proj(x)))
