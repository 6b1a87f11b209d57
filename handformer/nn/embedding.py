"""Token embedding (section 3.4 of the paper): a lookup table, optionally scaled by sqrt(d_model).

The paper multiplies embeddings by sqrt(d_model) so they are not drowned by the positional
encodings; GPT-2 and Llama do not. Weight tying (the output head reusing this matrix) is done by the
models, which point their head's weight at `embedding.weight`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, scale: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * 0.02)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        x = F.embedding(ids, self.weight)  # (B, T) -> (B, T, D)
        return x * self.scale if self.scale != 1.0 else x
