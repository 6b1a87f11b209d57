"""The KV cache: keys and values of past positions, kept so each decoding step only computes the
new token's. State is explicit: the cache is an object passed into `forward`, never module state.

Shape legend: L layers, B batch, Hkv key/value heads, S_max cache capacity, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated self-attention keys/values for every layer, plus cross-attention keys/values.

    Each layer's buffer of shape (B, Hkv, S_max, Dh) is allocated on first use with the dtype and
    device of the keys it receives. `length` counts the positions stored so far; the model calls
    `advance(T)` after each forward over T new positions, so every layer writes at the same offset.
    """

    def __init__(self, n_layers: int, max_length: int) -> None:
        if max_length <= 0:
            raise ValueError(f"KVCache max_length must be positive, got {max_length}")
        self.max_length = max_length
        self.length = 0
        self.keys: list[Tensor | None] = [None] * n_layers  # each (B, Hkv, S_max, Dh)
        self.values: list[Tensor | None] = [None] * n_layers
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers  # (B, Hkv, S_src, Dh)

    def layer(self, i: int) -> LayerKVCache:
        return LayerKVCache(self, i)

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (a chat whose re-rendered prompt differs from
        what the cache holds after that point); the next forward writes from there."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a KV cache of {self.length} positions to {length}")
        self.length = length

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses)."""
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is not None:
                    store[i] = t.index_select(0, index)
        for i, kv in enumerate(self.cross):
            if kv is not None:
                self.cross[i] = (kv[0].index_select(0, index), kv[1].index_select(0, index))


class LayerKVCache:
    """One layer's view of a `KVCache`, handed to that layer's attention."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache = cache
        self.index = index

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, Hkv, T, Dh) keys/values at the current offset; return all (B, Hkv, S, Dh)."""
        c, i = self.cache, self.index
        start, end = c.length, c.length + k.size(2)
        if end > c.max_length:
            raise ValueError(f"KV cache is full: {end} positions needed, capacity {c.max_length}; "
                             "create the cache with a larger max_length")
        if c.keys[i] is None:
            B, Hkv, _, Dh = k.shape
            c.keys[i] = torch.empty(B, Hkv, c.max_length, Dh, dtype=k.dtype, device=k.device)
            c.values[i] = torch.empty(B, Hkv, c.max_length, Dh, dtype=v.dtype, device=v.device)
        keys, values = c.keys[i], c.values[i]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]  # (B, Hkv, S, Dh)

    @property
    def cross(self) -> tuple[Tensor, Tensor] | None:
        return self.cache.cross[self.index]

    @cross.setter
    def cross(self, kv: tuple[Tensor, Tensor]) -> None:
        self.cache.cross[self.index] = kv
