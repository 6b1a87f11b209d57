"""The KV cache: keys and values of past positions, kept so each decoding step only computes the
new token's. State is explicit: the cache is an object passed into `forward`, never module state.

A layer's buffer holds the positions in order: position p in column p. Each forward writes its T
new keys and values at the current offset (`length`), and attention sees columns 0..length+T-1.
A sliding-window model's rolling cache is a subclass beside this one (`rolling_kv_cache.py`).

A linear-attention layer (Qwen3.5's gated DeltaNet) keeps no keys: each row's state, a fixed size
however long the row, in `states` (`LayerKVCache.state`). A state cannot forget its last positions,
so such a cache truncates to 0 (start again) or to its own length only.

Shape legend: B batch, Hkv key/value heads, S_max cache capacity, Dh head dim, T new positions.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import Tensor


class KVCache:
    """Preallocated self-attention keys/values for every layer, plus cross-attention keys/values.

    Each layer's buffer of shape (B, Hkv, S_max, Dh) is allocated on first use with the dtype and
    device of the keys it receives. `length` counts the positions stored so far; the model calls
    `advance(T)` after each forward over T new positions, so every layer writes at the same offset.
    """

    window: int | None = None  # a plain cache keeps every position (RollingKVCache: the window)
    global_layers: frozenset[int] = frozenset()

    def __init__(self, n_layers: int, max_length: int) -> None:
        if max_length <= 0:
            raise ValueError(f"KVCache max_length must be positive, got {max_length}")
        self.max_length = self.slots = max_length  # slots: S_max, the positions a buffer holds
        self.length = 0
        self.keys: list[Tensor | None] = [None] * n_layers  # each (B, Hkv, S_max, Dh)
        self.values: list[Tensor | None] = [None] * n_layers
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers  # (B, Hkv, S_src, Dh)
        # a linear-attention layer's state: per row, tensors whose first dim is B (Qwen3.5: conv, recurrent)
        self.states: list[tuple[Tensor, ...] | None] = [None] * n_layers
        self._layers = [LayerKVCache(self, i) for i in range(n_layers)]  # made once, not per step

    def layer(self, i: int) -> LayerKVCache:
        return self._layers[i]

    def layer_slots(self, layer: int) -> int:
        """How many positions `layer`'s buffers hold."""
        return self.slots

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (a chat whose re-rendered prompt differs from
        what the cache holds after that point); the next forward writes from there."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a KV cache of {self.length} positions to {length}")
        if 0 < length < self.length and self.keeps_states:
            raise ValueError(f"cannot truncate a cache of linear-attention states from {self.length} "
                             f"positions to {length}: a state cannot forget positions; truncate to 0 "
                             "and run the kept positions again")
        if length == 0:
            self.states = [None] * len(self.states)  # a linear-attention layer starts again
        self.length = length

    def in_slot_order(self, mask: Tensor | None, n_new: int) -> Tensor | None:
        """`mask` with its key axis in the order the keys come out of the cache: position order."""
        return mask

    @property
    def keeps_states(self) -> bool:
        """Whether it holds linear-attention states (then it truncates to 0 or its length only)."""
        return any(s is not None for s in self.states)


class NoCache:
    """What a forward uses when it is given no KV cache (training, or a whole sequence at once):
    nothing before the new positions, and nothing kept. It stands for the model's cache and for
    each layer's: attention's `cache.update(k, v)` then hands back the new keys and values only."""

    length = 0
    window = None
    memory_kv = None  # no memory keys and values kept from an earlier step

    def layer(self, i: int) -> NoCache:
        return self

    @property
    def memory(self) -> NoCache:
        return self

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k, v  # (B, Hkv, T, Dh): the new positions are all there is

    @property
    def state(self) -> None:
        return None  # a linear-attention layer starts from nothing

    @state.setter
    def state(self, value: tuple[Tensor, ...]) -> None:
        pass  # and keeps nothing

    def advance(self, n: int) -> None:
        pass

    def in_slot_order(self, mask: Tensor | None, n_new: int) -> Tensor | None:
        return mask


NO_CACHE = NoCache()


def as_cache(cache: Any) -> Any:
    """The cache a forward was given (a model's KVCache, or one layer's view of it), or NO_CACHE
    for None."""
    return NO_CACHE if cache is None else cache


class LayerKVCache:
    """One layer's self-attention view of a `KVCache`, handed to that layer's attention."""

    memory_kv = None  # self-attention's keys and values change with every step (see MemoryKVCache)

    def __init__(self, cache: KVCache, index: int) -> None:
        # weak: the cache holds its views, and a strong reference back would be a cycle, which
        # keeps a dropped cache's tensors alive until Python's cycle collector happens to run
        self.cache = weakref.ref(cache)  # self.cache() is the cache
        self.index = index
        self.memory = MemoryKVCache(cache, index)  # the same layer's cross-attention, if it has one

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, Hkv, T, Dh) keys/values at the current offset; return the keys/values that
        attention sees, (B, Hkv, S, Dh): every position so far."""
        c, i = self.cache(), self.index
        start, end = c.length, c.length + k.size(2)
        if end > c.layer_slots(i):
            raise ValueError(f"KV cache is full: {end} positions needed, capacity {c.max_length}; "
                             "create the cache with a larger max_length")
        keys, values = self.buffers(k, v)
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]  # (B, Hkv, S, Dh)

    @property
    def state(self) -> tuple[Tensor, ...] | None:
        """A linear-attention layer's state after the cached positions (None before the first)."""
        return self.cache().states[self.index]

    @state.setter
    def state(self, value: tuple[Tensor, ...]) -> None:
        self.cache().states[self.index] = value

    def buffers(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """This layer's (B, Hkv, S_max, Dh) buffers, allocated at the first update like `k`, `v`."""
        c, i = self.cache(), self.index
        if c.keys[i] is None:  # each its own heads and width (a latent cache's differ)
            c.keys[i] = k.new_empty(k.size(0), k.size(1), c.layer_slots(i), k.size(3))  # (B, Hkv, S_max, Dh)
            c.values[i] = v.new_empty(v.size(0), v.size(1), c.layer_slots(i), v.size(3))
        return c.keys[i], c.values[i]


class IndexedLayerKVCache:
    """One layer's view of a plain `KVCache` for a step whose shapes never change (a compiled step,
    inference/static_step.py): the new keys and values are written at the column an index tensor
    holds, and every slot is handed back. The columns not written yet are hidden by the step's
    mask, so the result is the same attention as `LayerKVCache.update`'s over columns 0..length."""

    memory_kv = None

    def __init__(self, keys: Tensor, values: Tensor, index: Tensor) -> None:
        self.keys, self.values = keys, values  # (B, Hkv, S_max, Dh), the cache's own buffers
        self.index = index  # (T,) long: the columns the T new positions go to

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.keys.index_copy_(2, self.index, k)  # (B, Hkv, T, Dh) into column index
        self.values.index_copy_(2, self.index, v)
        return self.keys, self.values  # (B, Hkv, S_max, Dh)


class MemoryKVCache:
    """One decoder layer's cross-attention view of a `KVCache`: the keys and values projected from
    the encoder output, the same at every decoding step, so computed at the first one and kept."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache = weakref.ref(cache)  # weak, as LayerKVCache's
        self.index = index

    @property
    def memory_kv(self) -> tuple[Tensor, Tensor] | None:
        """The kept (B, Hkv, S, Dh) keys and values, None before the first step."""
        return self.cache().cross[self.index]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keep the memory's keys and values (the first step computes them); returns them."""
        self.cache().cross[self.index] = (k, v)
        return k, v


LayerCache = LayerKVCache | MemoryKVCache | NoCache  # what one attention layer is handed
