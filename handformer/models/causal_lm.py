"""The decoder-only language model (GPT-2, Llama and their relatives, chosen by `CausalLMConfig`).

    ids -> token embedding (+ learned/sinusoidal positions) -> N decoder-only blocks (causal
    self-attention with optional RoPE and KV cache, FFN) -> final norm -> lm_head -> logits

With `sliding_window` (Mistral, Phi-3) the causal mask also hides keys more than sliding_window - 1
positions back, and `new_cache` makes a rolling KV cache of that many slots; with `global_layers`
too (Gemma 2/3) those layers see every position, and only the others slide.

`CausalLM(cfg)` is the lesson's model. A few families differ by more than a setting (Gemma's norms
around each sublayer, OLMo 2's, soft-capping, layers without RoPE): `handformer.families.
build_causal_lm(cfg)` builds this model and puts their variants in place, and everything that
builds a model from a config calls it.

Shape legend: B batch, T new positions, S all positions (cache + new), D d_model, H heads, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from handformer.config import CausalLMConfig
from handformer.initialization import gpt2_init
from handformer.nn.blocks import DecoderOnlyBlock, collect
from handformer.nn.dropout import make_dropout
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.inputs import (
    check_caller_mask,
    check_length,
    check_mask,
    check_position_ids,
    check_positions_fit,
    check_token_ids,
)
from handformer.nn.kv_cache import KVCache, NoCache, as_cache
from handformer.nn.latent_kv_cache import LatentKVCache
from handformer.nn.masks import AttentionMask, decoder_mask, mixed_mask
from handformer.nn.norms import final_norm
from handformer.nn.positions import make_positions, make_rotary
from handformer.nn.rolling_kv_cache import RollingKVCache


@dataclass
class CausalLMOutput:
    logits: Tensor  # (B, T, V)
    attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, T, S)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) padding mask -> (B, S) position ids counting real tokens only (left padding safe)."""
    return (attention_mask.bool().long().cumsum(-1) - 1).clamp(min=0)


class CausalLM(nn.Module):
    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.scale_embeddings)
        self.positions = make_positions(cfg)  # added to the embeddings (GPT-2); nothing for RoPE
        self.rotary = make_rotary(cfg)  # rotates queries and keys in attention (Llama); or nothing
        self.dropout = make_dropout(cfg.dropout)
        self.layers = nn.ModuleList(DecoderOnlyBlock(cfg, cfg.layer_slides(i)) for i in range(cfg.n_layers))
        self.norm = final_norm(cfg)  # after the last block of a pre-norm stack
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (B, T, D) -> (B, T, V)
        gpt2_init(self, cfg, cfg.n_layers)  # GPT-2's (handformer/initialization.py)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def new_cache(self, max_length: int | None = None) -> KVCache:
        """A KV cache for up to `max_length` positions (default: max_positions); with a sliding
        window, a rolling one of sliding_window slots that never fills (global layers: full)."""
        cfg, max_length = self.cfg, max_length or self.cfg.max_positions
        if cfg.mla is not None:  # latent attention caches its latents (DeepSeek-V3)
            return LatentKVCache(cfg.n_layers, max_length)
        if cfg.sliding_window is None:
            return KVCache(cfg.n_layers, max_length)
        return RollingKVCache(cfg.n_layers, max_length, cfg.sliding_window, cfg.global_layers)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | AttentionMask | None = None,
                position_ids: Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False, logits_to_keep: int = 0) -> CausalLMOutput:
        """input_ids: (B, T) new tokens. attention_mask: (B, S) 1 = real token, 0 = padding, over
        the cached and new positions; or a mask object the caller built (documents packed in a row:
        `nn.masks.packed_mask`), with position_ids. position_ids: (B, T); by default counted from
        the mask (so left padding works) or from the cache length. cache: a `KVCache` to read and extend.
        logits_to_keep: logits for the last that many positions only (1: all that generation
        needs); 0 = every position.
        """
        cache = as_cache(cache)  # NO_CACHE for None: no earlier positions, nothing kept
        position_ids, mask = self.prepare_inputs(input_ids, attention_mask, position_ids, cache)
        x = self.dropout(self.embed(input_ids) + self.positions(position_ids))  # (B, T, D)
        rope = self.rotary(position_ids)  # (cos, sin), (B|1, 1, T, Dh) each; None without RoPE

        attentions = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, rope=rope, cache=cache.layer(i), need_weights=need_weights)  # (B, T, D)
            attentions.append(w)
        cache.advance(input_ids.size(1))
        x = self.norm(x[:, -logits_to_keep:])  # (B, T, D), or (B, logits_to_keep, D)
        return CausalLMOutput(self.lm_head(x), collect(attentions, need_weights))  # logits (B, T, V)

    def prepare_inputs(self, input_ids: Tensor, attention_mask: Tensor | AttentionMask | None,
                       position_ids: Tensor | None, cache: KVCache | NoCache) -> tuple[Tensor, AttentionMask]:
        """The inputs checked, then what every layer needs: the position of each new token
        (B|1, T), after the cache's, and the one attention mask."""
        check_token_ids(input_ids, self.cfg.vocab_size)
        B, T = input_ids.shape
        offset = cache.length
        if isinstance(attention_mask, AttentionMask):  # the caller's own: documents packed in a row
            check_caller_mask(position_ids, offset)
            return self.position_ids(input_ids, None, position_ids, offset), attention_mask
        check_mask(attention_mask, (B, offset + T), "attention_mask")
        position_ids = self.position_ids(input_ids, attention_mask, position_ids, offset)
        if cache is not None and cache.window not in (None, self.cfg.sliding_window):
            raise ValueError(f"the KV cache rolls over a window of {cache.window} positions but the "
                             f"model's sliding_window is {self.cfg.sliding_window}; use model.new_cache()")
        if cache.window is not None and cache.global_layers != set(self.cfg.global_layers):
            raise ValueError(f"the KV cache keeps layers {sorted(cache.global_layers)} global but the "
                             f"model's global_layers are {self.cfg.global_layers}; use model.new_cache()")
        mask = self.build_mask(T, offset, attention_mask, cache, input_ids.device)
        return position_ids, mask

    def position_ids(self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None,
                     offset: int) -> Tensor:
        """The position of each new token, (B|1, T): as given; else counted over the real tokens of
        the mask (left padding: a row's first real token is position 0); else offset..offset+T-1."""
        B, T = input_ids.shape
        if position_ids is None and attention_mask is None:
            check_length(offset + T, self.cfg.max_positions)
            return torch.arange(offset, offset + T, device=input_ids.device)[None]  # (1, T)
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask)[:, offset:]  # (B, T)
        else:
            check_position_ids(position_ids, B, T)
        check_positions_fit(position_ids, self.cfg.max_positions)
        return position_ids

    def build_mask(self, T: int, offset: int, attention_mask: Tensor | None, cache: KVCache | NoCache,
                   device: torch.device) -> AttentionMask:
        """The one mask every layer gets: causal (offset by the cache), within the sliding window if
        any, hiding padding (`handformer.nn.masks.decoder_mask` has the cases); for a model that
        mixes sliding and global layers, both kinds in one (`mixed_mask`)."""
        if self.cfg.mixes_windows:
            return mixed_mask(T, offset, attention_mask, self.cfg.sliding_window, cache, device)
        return decoder_mask(T, offset, attention_mask, self.cfg.sliding_window, cache, device)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
