"""The encoder-decoder Transformer of "Attention Is All You Need" (figure 1 of the paper).

    src ids -> embed * sqrt(D) + positions -> N encoder layers -> memory
    tgt ids -> embed * sqrt(D) + positions -> N decoder layers (masked self-attn, cross-attn over
               memory, FFN) -> generator (Linear to the target vocabulary; softmax in the loss)

Shape legend: B batch, S source length, T target length, D d_model, H heads, V target vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from handformer.config import Seq2SeqConfig
from handformer.initialization import paper_init
from handformer.nn.blocks import DecoderLayer, EncoderLayer, collect
from handformer.nn.dropout import make_dropout
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.inputs import check_length, check_token_ids
from handformer.nn.kv_cache import KVCache, as_cache
from handformer.nn.masks import AttentionMask, as_attention_mask, padding_mask, target_mask
from handformer.nn.norms import final_norm
from handformer.nn.positions import make_positions


@dataclass
class Seq2SeqOutput:
    logits: Tensor  # (B, T, V)
    encoder_attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, S, S)
    decoder_attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, T, T)
    cross_attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, T, S)


class Encoder(nn.Module):
    """A stack of encoder layers over embedded inputs; pre-norm stacks end with a final norm."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.norm = final_norm(cfg)  # after the last layer of a pre-norm stack

    def forward(self, x: Tensor, mask: AttentionMask | Tensor | None = None, need_weights: bool = False,
                ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """x: (B, S, D) embedded sources, mask: their padding mask -> ((B, S, D), weights or None)."""
        mask = as_attention_mask(mask)  # once for every layer
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights=need_weights)  # (B, S, D)
            weights.append(w)
        return self.norm(x), collect(weights, need_weights)


class Decoder(nn.Module):
    """A stack of decoder layers over embedded targets and the encoder's memory."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = final_norm(cfg)  # after the last layer of a pre-norm stack

    def forward(self, x: Tensor, memory: Tensor, memory_mask: AttentionMask | Tensor | None = None,
                self_mask: AttentionMask | Tensor | None = None, *, cache: KVCache | None = None,
                need_weights: bool = False,
                ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        """x: (B, T, D) embedded targets, memory: (B, S, D); the masks in the tutorial's order,
        source padding then causal + target padding -> ((B, T, D), self weights, cross weights)."""
        memory_mask, self_mask = as_attention_mask(memory_mask), as_attention_mask(self_mask)
        cache = as_cache(cache)
        self_ws, cross_ws = [], []
        for i, layer in enumerate(self.layers):
            x, sw, cw = layer(x, memory, memory_mask, self_mask, cache=cache.layer(i),
                              need_weights=need_weights)  # (B, T, D)
            self_ws.append(sw)
            cross_ws.append(cw)
        return self.norm(x), collect(self_ws, need_weights), collect(cross_ws, need_weights)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.scale_embeddings)
        self.tgt_embed = (self.src_embed if cfg.share_embeddings else
                          TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.scale_embeddings))
        self.positions = make_positions(cfg)
        self.dropout = make_dropout(cfg.dropout)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)  # (B, T, D) -> (B, T, V)
        paper_init(self, cfg)  # Xavier, as the Annotated Transformer (handformer/initialization.py)
        if cfg.tie_output:
            self.generator.weight = self.tgt_embed.weight

    def _embed(self, embed: TokenEmbedding, ids: Tensor, offset: int = 0) -> Tensor:
        """(B, T) ids -> (B, T, D): embedding (scaled by sqrt(D)) + positional encoding, dropout."""
        T = ids.size(1)
        check_length(offset + T, self.cfg.max_positions)
        position_ids = torch.arange(offset, offset + T, device=ids.device)[None]  # (1, T)
        return self.dropout(embed(ids) + self.positions(position_ids))  # (B, T, D)

    def encode(self, src_ids: Tensor, need_weights: bool = False,
               ) -> tuple[Tensor, Tensor, tuple[Tensor, ...] | None]:
        """(B, S) source ids -> (memory (B, S, D), source mask (B, 1, 1, S), weights or None)."""
        check_token_ids(src_ids, self.cfg.src_vocab_size, "src_ids")
        src_mask = padding_mask(src_ids, self.cfg.pad_id)  # (B, 1, 1, S)
        memory, weights = self.encoder(self._embed(self.src_embed, src_ids), src_mask, need_weights)
        return memory, src_mask, weights

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor,
               cache: KVCache | None = None, need_weights: bool = False,
               ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        """(B, T) target ids -> (hidden (B, T, D), self weights, cross weights).

        Without a cache: the whole target at once, with a causal + padding mask (teacher forcing).
        With a cache: tgt_ids are the new positions only; earlier ones come from the cache.
        """
        check_token_ids(tgt_ids, self.cfg.tgt_vocab_size, "tgt_ids")
        tgt_mask = target_mask(tgt_ids, self.cfg.pad_id, cache)  # subsequent (causal) & padding
        cache = as_cache(cache)  # NO_CACHE for None: no earlier positions, nothing kept
        x = self._embed(self.tgt_embed, tgt_ids, cache.length)  # (B, T, D)
        h, self_w, cross_w = self.decoder(x, memory, src_mask, tgt_mask, cache=cache,
                                          need_weights=need_weights)
        cache.advance(tgt_ids.size(1))
        return h, self_w, cross_w

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, need_weights: bool = False,
                logits_at: Tensor | None = None) -> Seq2SeqOutput:
        """(B, S) source ids, (B, T) target ids (starting with BOS) -> logits (B, T, V).

        logits_at: optional (B, T) bool; logits are then computed only where it is True and
        returned as (N, V), N = logits_at.sum(), in row-major order. Training passes the
        positions whose target is not padding: the generator and the softmax over the
        vocabulary skip the padded rows.
        """
        memory, src_mask, enc_w = self.encode(src_ids, need_weights)
        h, self_w, cross_w = self.decode(tgt_ids, memory, src_mask, need_weights=need_weights)
        if logits_at is not None:
            if logits_at.shape != tgt_ids.shape or logits_at.dtype != torch.bool:
                raise ValueError(f"logits_at must be a bool tensor shaped like tgt_ids "
                                 f"{tuple(tgt_ids.shape)}, got {logits_at.dtype} "
                                 f"{tuple(logits_at.shape)}")
            h = h[logits_at]  # (B, T, D) -> (N, D)
        return Seq2SeqOutput(self.generator(h), enc_w, self_w, cross_w)

    def new_cache(self, max_length: int) -> KVCache:
        return KVCache(self.cfg.n_decoder_layers, max_length)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["Seq2SeqTransformer", "Seq2SeqOutput", "Encoder", "Decoder"]
