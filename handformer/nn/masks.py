"""The one mask convention of handformer: boolean, True = may attend.

Every attention mask is a bool tensor that broadcasts to (B, H, T, S): query position t may look at
key position s where mask[..., t, s] is True. The tutorials' 0/1 masks mean the same (1 = may
attend, `scores.masked_fill(mask == 0, -1e9)`) and are accepted as they are. torch.nn's boolean
masks mean the opposite (True = blocked); convert with `~mask` at that boundary only.

A model builds one `AttentionMask` per forward and hands it to every layer: the boolean mask, and
what it takes to apply it fast (whether the causal triangle stands for it, which query rows see
no key). A layer or attention called on its own with a plain tensor (or nothing) builds its own.

Shape legend: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from handformer.nn.kv_cache import NO_CACHE, KVCache, NoCache


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, 1, 1, S) mask that hides padding keys from every query."""
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def key_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) 1/True for real tokens, 0/False for padding -> (B, 1, 1, S) bool mask."""
    return attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(query_length: int, key_length: int | None = None, offset: int = 0,
                device: torch.device | str | None = None, window: int | None = None) -> Tensor:
    """(T, S) mask where query t (at absolute position offset + t) sees keys 0..offset + t.

    `offset` is the number of positions already in a KV cache; with offset 0 and T == S this is the
    lower-triangular "subsequent mask" of the paper. `window` (sliding-window attention, Mistral)
    keeps only the last `window` of those keys: offset + t - window < s <= offset + t, a band.
    """
    key_length = key_length or offset + query_length
    q_pos = torch.arange(offset, offset + query_length, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(key_length, device=device)[None, :]  # (1, S)
    mask = k_pos <= q_pos  # (T, S): the past and the present
    if window is not None:
        mask &= k_pos > q_pos - window  # (T, S): no further back than the window
    return mask


def document_mask(document_ids: Tensor) -> Tensor:
    """(B, T) document ids of the positions of packed sequences -> (B, 1, T, T) mask that keeps
    attention inside each document (combine it with the causal mask by &)."""
    return (document_ids[:, :, None] == document_ids[:, None, :])[:, None]  # (B, 1, T, T)


def packed_mask(document_ids: Tensor, window: int | None = None) -> AttentionMask:
    """(B, T) document ids of several sequences packed into each row -> the self-attention mask of
    a decoder-only model over them: causal (within the sliding window, if any) and inside each
    document, (B, 1, T, T). Every query sees at least itself, so no row is empty."""
    T = document_ids.size(1)
    causal = causal_mask(T, device=document_ids.device, window=window)  # (T, T)
    return AttentionMask(causal & document_mask(document_ids))  # (B, 1, T, T)


def has_empty_rows(mask: Tensor) -> bool:
    """Whether some query row of a (..., T, S) mask sees no key at all (left padding: a padding
    query before the first real token). Softmax over no key is 0/0, so attention must handle
    such rows; a model asks once per forward, not every layer."""
    return not bool(mask.any(dim=-1).all())


@dataclass(frozen=True)
class AttentionMask:
    """The attention mask of one forward pass, built once and given to every layer.

    allowed: bool, broadcasts to (B, H, T, S), True = may attend; None hides nothing (or, with
        `is_causal`, stands for the causal triangle).
    is_causal: the mask is the causal triangle over T == S positions, not built: the fused kernel
        applies it itself. Never true with a KV cache holding earlier positions.
    visible_rows: (B|1, H|1, T, 1), False for the query rows that see no key. `allowed` lets such
        rows see every key (finite softmax, finite gradients) and attention zeroes their output
        (`zero_empty_rows`). None when every row sees a key.
    sliding: the mask of the sliding-window layers, for a model that has both kinds of layer (one
        mask per kind); None = the layers all use this one.
    """

    allowed: Tensor | None = None
    is_causal: bool = False
    visible_rows: Tensor | None = None
    sliding: AttentionMask | None = None

    def __post_init__(self) -> None:
        if self.is_causal and self.allowed is not None:
            raise ValueError("is_causal=True stands for the causal mask, so `allowed` must be None; "
                             "combine the masks into one with & instead")

    def dense(self, T: int, S: int, device: torch.device) -> Tensor | None:
        """The bool mask as a tensor (the causal triangle built if it stands for it), or None."""
        return causal_mask(T, S, device=device) if self.is_causal else self.allowed

    def zero_empty_rows(self, x: Tensor) -> Tensor:
        """(..., T, *) outputs or weights with the rows of queries that see no key set to zero."""
        return x if self.visible_rows is None else x * self.visible_rows

    def of_layer(self, sliding: bool) -> AttentionMask:
        """The mask of a layer: the sliding-window one for a sliding layer of a model that mixes
        the two kinds (Gemma 2/3), else this one."""
        return self.sliding if sliding and self.sliding is not None else self


def as_attention_mask(mask: AttentionMask | Tensor | None) -> AttentionMask:
    """An AttentionMask as it is; a bool tensor (True = may attend) or a 0/1 integer tensor (1 =
    may attend, as the tutorials' `masked_fill(mask == 0, -1e9)`) as one, with its query rows that
    see no key found once; None hides nothing."""
    if isinstance(mask, AttentionMask) or mask is None:
        return mask or AttentionMask()
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(f"an attention mask must be bool (True = may attend) or 0/1 integers (1 = may "
                        f"attend), got {mask.dtype}; an additive float mask (0 / -inf) is not accepted: "
                        "pass `mask == 0` of it")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise TypeError("an integer attention mask must hold 0 and 1 only (1 = may attend); got other "
                        "values: pass a bool mask (True = may attend) or `mask != 0`")
    allowed = mask.bool()
    if not has_empty_rows(allowed):
        return AttentionMask(allowed)
    visible = allowed.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    return AttentionMask(allowed | ~visible, visible_rows=visible)


def mixed_mask(T: int, offset: int, attention_mask: Tensor | None, window: int,
               cache: KVCache | NoCache, device: torch.device) -> AttentionMask:
    """The masks of a model whose layers mix sliding-window and global attention (Gemma 2/3): the
    global layers' mask, carrying the sliding layers' as its `sliding` kind. Only the sliding layers
    roll their cache, so only their mask follows the cache's slots."""
    sliding = decoder_mask(T, offset, attention_mask, window, cache, device)
    full = decoder_mask(T, offset, attention_mask, None, NO_CACHE, device)  # never rolls
    return dataclasses.replace(full, sliding=sliding)


def decoder_mask(T: int, offset: int, attention_mask: Tensor | None, window: int | None,
                 cache: KVCache | NoCache, device: torch.device) -> AttentionMask:
    """A decoder-only model's self-attention mask for T new positions after `offset` cached ones:
    causal, within the sliding window if any, hiding padding (attention_mask, (B, offset + T)).

    The cases, cheapest first:
    - one new token (a decoding step) sees every key the cache hands out (a rolling window cache
      holds exactly the window): only padding is hidden, when there is any;
    - nothing cached, no padding, no window in reach: `is_causal`, the kernel builds the triangle;
    - otherwise the causal mask offset by the cache, banded by the window, & padding.
    With a rolling cache the key axis follows the order of the cache's slots.
    """
    S = offset + T
    window_hides = window is not None and S > window  # some query cannot see some earlier key
    padding = None if attention_mask is None else key_mask(attention_mask)  # (B, 1, 1, S)
    if T == 1 and (cache.window is not None or not window_hides):  # a rolling cache holds the window
        mask = padding
    elif padding is None and offset == 0 and not window_hides:
        return AttentionMask(is_causal=True)
    else:
        causal = causal_mask(T, S, offset, device, window=window)  # (T, S)
        mask = causal if padding is None else causal & padding  # (T, S), or (B, 1, T, S) with padding
    return as_attention_mask(cache.in_slot_order(mask, T))


def target_mask(tgt_ids: Tensor, pad_id: int, cache: KVCache | None = None) -> Tensor | None:
    """The decoder's self-attention mask over the targets (the tutorial's tgt_mask): subsequent
    (causal) & target padding, (B, 1, T, T). While decoding with a KV cache the ids are the new
    positions only, after the cached ones: one new token sees them all (no mask), several see the
    causal mask offset by the cache."""
    T = tgt_ids.size(1)
    if cache is None:  # teacher forcing: the whole target at once
        return causal_mask(T, device=tgt_ids.device) & padding_mask(tgt_ids, pad_id)  # (B, 1, T, T)
    return None if T == 1 else causal_mask(T, offset=cache.length, device=tgt_ids.device)  # (T, S)
