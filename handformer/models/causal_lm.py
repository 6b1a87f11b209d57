"""The decoder-only language model (GPT-2 and Llama style, chosen by `CausalLMConfig`).

    ids -> token embedding (+ learned/sinusoidal positions) -> N decoder-only blocks (causal
    self-attention with optional RoPE and KV cache, FFN) -> final norm -> lm_head -> logits

Shape legend: B batch, T new positions, S all positions (cache + new), D d_model, H heads, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from handformer.config import CausalLMConfig
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.inputs import check_length, check_mask, check_token_ids
from handformer.nn.kv_cache import KVCache
from handformer.nn.masks import causal_mask, key_mask
from handformer.nn.norms import make_norm
from handformer.nn.positions import RotaryEmbedding, make_positions


@dataclass
class CausalLMOutput:
    logits: Tensor  # (B, T, V)
    attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, T, S)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) padding mask -> (B, S) position ids counting real tokens only (left padding safe)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class CausalLM(nn.Module):
    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.scale_embeddings)
        self.positions = make_positions(cfg)
        self.rotary = (RotaryEmbedding(cfg.head_dim, cfg.max_positions, cfg.rope_theta)
                       if cfg.position == "rope" else None)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(DecoderOnlyBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = (make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
                     if cfg.norm_placement == "pre" else None)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (B, T, D) -> (B, T, V)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """GPT-2's init: N(0, 0.02) weights, zero biases, and the projections that write into the
        residual stream (o_proj, down_proj) scaled by 1/sqrt(2 * n_layers)."""
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "norm" in name:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)

    def new_cache(self, max_length: int | None = None) -> KVCache:
        return KVCache(self.cfg.n_layers, max_length or self.cfg.max_positions)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False, last_only: bool = False) -> CausalLMOutput:
        """input_ids: (B, T) new tokens. attention_mask: (B, S) 1 = real token, 0 = padding, over
        the cached and new positions. position_ids: (B, T); by default counted from the mask (so
        left padding works) or from the cache length. cache: a `KVCache` to read and extend.
        last_only: logits (B, 1, V) for the last position only, all generation needs (the output
        head over a whole prompt costs T x D x V multiply-adds for nothing).
        """
        check_token_ids(input_ids, self.cfg.vocab_size)
        B, T = input_ids.shape
        offset = 0 if cache is None else cache.length
        S = offset + T
        if attention_mask is not None:
            attention_mask = check_mask(attention_mask, (B, S), "attention_mask")
        positions_needed = None  # 1 + the largest position id, when known without reading them
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, offset:]  # (B, T)
            else:
                position_ids = torch.arange(offset, S, device=input_ids.device)[None]  # (1, T)
                positions_needed = S
        elif position_ids.shape not in ((B, T), (1, T)):
            raise ValueError(f"position_ids must have shape ({B}, {T}) or (1, {T}), "
                             f"got {tuple(position_ids.shape)}")
        elif position_ids.is_floating_point() or position_ids.dtype == torch.bool:
            raise TypeError(f"position_ids must hold integer positions, got dtype {position_ids.dtype}")
        elif int(position_ids.min()) < 0:
            raise ValueError(f"position_ids must be >= 0, got {int(position_ids.min())}")
        if positions_needed is None and not torch.compiler.is_compiling():  # reading values: a
            positions_needed = int(position_ids.max()) + 1  # graph break under torch.compile
        if positions_needed is not None:
            check_length(positions_needed, self.cfg.max_positions)

        # One mask for every layer: causal (offset by the cache) and padding, True = may attend.
        is_causal = attention_mask is None and offset == 0
        mask = None
        if attention_mask is not None:
            mask = causal_mask(T, S, offset, input_ids.device) & key_mask(attention_mask)  # (B, 1, T, S)
        elif offset > 0 and T > 1:
            mask = causal_mask(T, S, offset, input_ids.device)  # (T, S)

        x = self.embed(input_ids)  # (B, T, D)
        if self.positions is not None:
            x = x + self.positions(position_ids)
        x = self.dropout(x)
        rope = self.rotary(position_ids) if self.rotary is not None else None

        attentions = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, is_causal=is_causal, rope=rope,
                         cache=None if cache is None else cache.layer(i), need_weights=need_weights)
            attentions.append(w)
        if cache is not None:
            cache.advance(T)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        if self.norm is not None:
            x = self.norm(x)
        return CausalLMOutput(self.lm_head(x), tuple(attentions) if need_weights else None)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
