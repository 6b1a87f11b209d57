"""The one mask convention of handformer: boolean, True = may attend.

Every attention mask is a bool tensor that broadcasts to (B, H, T, S): query position t may look at
key position s where mask[..., t, s] is True. torch.nn's boolean masks mean the opposite
(True = blocked); convert with `~mask` at that boundary only.

Shape legend: B batch, T query length, S key length.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
    if key_length is None:
        key_length = offset + query_length
    q_pos = torch.arange(offset, offset + query_length, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(key_length, device=device)[None, :]  # (1, S)
    if window is None:
        return k_pos <= q_pos  # (T, S)
    return (k_pos <= q_pos) & (k_pos > q_pos - window)  # (T, S)


def has_empty_rows(mask: Tensor) -> bool:
    """Whether some query row of a (..., T, S) mask sees no key at all (left padding: a padding
    query before the first real token). Attention must special-case such rows (softmax over no
    key is 0/0); a model asks once per forward, not every layer."""
    return not bool(mask.any(dim=-1).all())


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of masks that broadcast together; None entries are ignored."""
    result = None
    for m in masks:
        if m is None:
            continue
        result = m if result is None else result & m
    return result
