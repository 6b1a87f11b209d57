"""The starting weights of the two models, one scheme each (called once, when a model is built).

- `paper_init` (the encoder-decoder): Xavier-uniform matrices and zero biases, as the Annotated
  Transformer and torch.nn do; embeddings N(0, D^-1/2), so that after the paper's sqrt(D) scale they
  have unit variance (N(0, 0.02) when the embeddings are not scaled).
- `gpt2_init` (the decoder-only model): GPT-2's N(0, 0.02) weights and zero biases, with the two
  projections that write into the residual stream (o_proj, down_proj) scaled by 1/sqrt(2 * layers),
  so that the residual stream's variance does not grow with depth.

Norm gains start at 1 in both (stored as 0 by OffsetRMSNorm, whose gain is 1 + weight). Parameters
are visited in `named_parameters()` order, so a seed gives the same weights every time.
"""

from __future__ import annotations

import math

from torch import nn

from handformer.config import BlockConfig


def _norm_gain(cfg: BlockConfig) -> float:
    return 0.0 if cfg.norm == "rmsnorm_offset" else 1.0


def paper_init(model: nn.Module, cfg: BlockConfig) -> None:
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif "norm" in name:
            nn.init.constant_(p, _norm_gain(cfg))
        elif "embed" in name:
            nn.init.normal_(p, std=cfg.d_model ** -0.5 if cfg.scale_embeddings else 0.02)
        elif p.dim() == 2 and "positions" not in name:
            nn.init.xavier_uniform_(p)


def gpt2_init(model: nn.Module, cfg: BlockConfig, n_layers: int) -> None:
    residual_std = 0.02 / math.sqrt(2 * n_layers)
    for name, p in model.named_parameters():
        if p.is_meta:  # a model built on the meta device for its shapes: no values to draw
            continue
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif "norm" in name:
            nn.init.constant_(p, _norm_gain(cfg))
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            nn.init.normal_(p, std=residual_std)
        else:
            nn.init.normal_(p, std=0.02)
