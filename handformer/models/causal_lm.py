"""The decoder-only language model (GPT-2, Llama and their relatives, chosen by `CausalLMConfig`).

    ids -> token embedding (+ learned/sinusoidal positions) -> N decoder-only blocks (causal
    self-attention with optional RoPE and KV cache, FFN) -> final norm -> lm_head -> logits

With `sliding_window` (Mistral, Phi-3) the causal mask also hides keys more than sliding_window - 1
positions back, and `new_cache` makes a rolling KV cache of that many slots.

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
from handformer.nn.masks import causal_mask, has_empty_rows, key_mask
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
        self.rotary = (RotaryEmbedding(cfg.head_dim, cfg.max_positions, cfg.rope_theta, cfg.rope_scaling)
                       if cfg.position == "rope" else None)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
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
            elif "norm" in name:  # a gain of 1 (stored as its offset from 1 by OffsetRMSNorm)
                nn.init.constant_(p, 0.0 if self.cfg.norm == "rmsnorm_offset" else 1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)

    def new_cache(self, max_length: int | None = None) -> KVCache:
        """A KV cache for up to `max_length` positions (default: max_positions); with a sliding
        window, a rolling one of sliding_window slots that never fills."""
        return KVCache(self.cfg.n_layers, max_length or self.cfg.max_positions, self.cfg.sliding_window)

    def build_mask(self, T: int, offset: int, attention_mask: Tensor | None,
                   cache: KVCache | None, device: torch.device) -> tuple[Tensor | None, bool]:
        """The one mask every layer gets, True = may attend, and whether `is_causal` stands for it.

        Causal (offset by the cache), within the sliding window if any, and hiding padding; its key
        axis follows the order in which the cache hands out keys (a rolling cache's slots).
        """
        S = offset + T
        window = self.cfg.sliding_window
        window_hides = window is not None and S > window  # some query cannot see some earlier key
        if T == 1 and (not window_hides or (cache is not None and cache.window is not None)):
            # One new token sees every key the cache hands out (a rolling cache holds exactly the
            # window): no causal or window mask to build at each decoding step, only padding's.
            if attention_mask is None:
                return None, False
            mask = key_mask(attention_mask)  # (B, 1, 1, S)
        elif attention_mask is not None:
            mask = causal_mask(T, S, offset, device, window=window) & key_mask(attention_mask)  # (B, 1, T, S)
        elif (offset > 0 and T > 1) or window_hides:
            mask = causal_mask(T, S, offset, device, window=window)  # (T, S)
        else:  # everything earlier is visible: is_causal, or one new token after cached ones
            return None, offset == 0  # attention_mask is None here
        key_positions = None if cache is None else cache.key_positions(T)
        if key_positions is not None:
            mask = mask[..., key_positions.to(device)]  # (B, 1, T, S') or (T, S'): S' keys in slot order
        return mask, False

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
        counted = False  # position ids offset..S-1 in every row (no padding to skip)
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, offset:]  # (B, T)
            else:
                position_ids = torch.arange(offset, S, device=input_ids.device)[None]  # (1, T)
                positions_needed, counted = S, True
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

        if cache is not None and cache.window not in (None, self.cfg.sliding_window):
            raise ValueError(f"the KV cache rolls over a window of {cache.window} positions but the "
                             f"model's sliding_window is {self.cfg.sliding_window}; use model.new_cache()")
        mask, is_causal = self.build_mask(T, offset, attention_mask, cache, input_ids.device)
        check_empty_rows = mask is not None and has_empty_rows(mask)  # once here, not in every layer

        x = self.embed(input_ids)  # (B, T, D)
        if self.positions is not None:
            x = x + self.positions(position_ids)
        x = self.dropout(x)
        if self.rotary is None:
            rope = None
        elif counted:  # slices of the tables, not a gather
            rope = self.rotary.span(offset, S)  # (1, 1, T, Dh) each
        else:
            rope = self.rotary(position_ids)  # (B|1, 1, T, Dh) each

        attentions = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, is_causal=is_causal, rope=rope,
                         cache=None if cache is None else cache.layer(i), need_weights=need_weights,
                         check_empty_rows=check_empty_rows)
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
