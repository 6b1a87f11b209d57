"""Token embedding (section 3.4 of the paper): a lookup table, optionally scaled by sqrt(d_model).

The paper multiplies embeddings by sqrt(d_model) so they are not drowned by the positional
encodings; GPT-2 and Llama do not; Gemma does (with RoPE). The factor is rounded to the
embeddings' dtype before the multiply, as Gemma does (sqrt(3072) = 55.43 becomes 55.5 in bfloat16);
in float32 that is the plain product. Weight tying (the output head reusing this matrix) is done by the
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
        # A buffer, so it has the weights' dtype: rounded as the embeddings are (bf16: 55.5, not 55.43).
        self.register_buffer("scale", torch.tensor(math.sqrt(d_model) if scale else 1.0), persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight) * self.scale  # (B, T) -> (B, T, D)
