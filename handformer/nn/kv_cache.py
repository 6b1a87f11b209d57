"""The KV cache: keys and values of past positions, kept so each decoding step only computes the
new token's. State is explicit: the cache is an object passed into `forward`, never module state.

With sliding-window attention (Mistral: each position sees only the last `window` positions, itself
included) the cache is a rolling buffer of `window` slots: position p is stored in slot p % window,
over the position that left the window, so its memory does not grow with the generated length.
Attention does not care in which order the keys come (softmax is over a set), only that the mask
follows the same order: `KVCache.in_slot_order` puts a mask's key axis in the order of the slots.
A model that mixes sliding and global layers (Gemma 2/3) rolls the sliding layers' buffers only:
the global layers' hold every position (`global_layers`).

Shape legend: L layers, B batch, Hkv key/value heads, S_max cache capacity (slots), Dh head dim,
T new positions, W window.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor


class KVCache:
    """Preallocated self-attention keys/values for every layer, plus cross-attention keys/values.

    Each layer's buffer of shape (B, Hkv, S_max, Dh) is allocated on first use with the dtype and
    device of the keys it receives. `length` counts the positions stored so far; the model calls
    `advance(T)` after each forward over T new positions, so every layer writes at the same offset.

    window: the attention window of a sliding-window model. When it is at most `max_length`, the
    buffers have `window` slots and roll (they never fill up); otherwise they hold `max_length`
    positions, as without a window. global_layers: the layers of such a model that attend to
    every position; their buffers hold `max_length` positions and never roll.
    """

    def __init__(self, n_layers: int, max_length: int, window: int | None = None,
                 global_layers: tuple[int, ...] | list[int] = ()) -> None:
        if max_length <= 0:
            raise ValueError(f"KVCache max_length must be positive, got {max_length}")
        if window is not None and window <= 0:
            raise ValueError(f"KVCache window must be positive or None, got {window}")
        self.max_length = max_length
        self.window = window if window is not None and window <= max_length else None  # rolling
        self.slots = self.window or max_length  # S_max of the sliding layers
        self.global_layers = frozenset(global_layers)
        self.length = 0
        self.keys: list[Tensor | None] = [None] * n_layers  # each (B, Hkv, S_max, Dh)
        self.values: list[Tensor | None] = [None] * n_layers
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers  # (B, Hkv, S_src, Dh)
        self._layers = [LayerKVCache(self, i) for i in range(n_layers)]  # made once, not per step

    def layer(self, i: int) -> LayerKVCache:
        return self._layers[i]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (a chat whose re-rendered prompt differs from
        what the cache holds after that point); the next forward writes from there."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a KV cache of {self.length} positions to {length}")
        self.length = length

    # --- the rolling window --------------------------------------------------------------------
    def rolls(self, n_new: int, layer: int | None = None) -> bool:
        """Whether appending `n_new` positions overwrites a slot (the keys then come out of order)
        of the sliding layers, or of `layer` (never a global one)."""
        rolling = self.window is not None and layer not in self.global_layers
        return rolling and self.length + n_new > self.window

    def layer_slots(self, layer: int) -> int:
        """How many positions `layer`'s buffers hold: max_length for a global layer."""
        return self.max_length if layer in self.global_layers else self.slots

    def key_positions(self, n_new: int) -> Tensor:
        """The absolute position of each key that attention gets when `n_new` positions are
        appended to a rolling cache, in the order `LayerKVCache.update` returns them."""
        if n_new == 1:  # written in place, over the position that has just left the window
            return self._held_positions(self.length + 1)
        # Several new positions: their earlier queries still need the slots they overwrite, so
        # attention sees the buffer as it was, then the new keys.
        return torch.cat([self._held_positions(self.length), torch.arange(self.length, self.length + n_new)])

    def _held_positions(self, end: int) -> Tensor:
        """The position each slot holds once positions 0..end-1 were written, (min(end, W),)."""
        slot = torch.arange(min(end, self.slots))
        return (end - 1) - (end - 1 - slot) % self.slots  # the latest position < end in each slot

    def in_slot_order(self, mask: Tensor | None, n_new: int) -> Tensor | None:
        """`mask` (..., T, S) over absolute key positions, with its key axis in the order the keys
        come out of the cache: unchanged unless appending `n_new` positions rolls the window."""
        if mask is None or not self.rolls(n_new):
            return mask
        return mask[..., self.key_positions(n_new).to(mask.device)]  # (..., T, S'): slot order


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
        attention sees, (B, Hkv, S, Dh): every position so far (a rolling cache's in slot order)."""
        c, i = self.cache(), self.index
        start, T = c.length, k.size(2)
        end = start + T
        slots = c.layer_slots(i)
        if end > slots and (c.window is None or i in c.global_layers):
            raise ValueError(f"KV cache is full: {end} positions needed, capacity {c.max_length}; "
                             "create the cache with a larger max_length")
        if c.keys[i] is None:
            B, Hkv, _, Dh = k.shape
            c.keys[i] = torch.empty(B, Hkv, slots, Dh, dtype=k.dtype, device=k.device)
            c.values[i] = torch.empty(B, Hkv, slots, Dh, dtype=v.dtype, device=v.device)
        if c.rolls(T, i):
            return roll_in(c.keys[i], c.values[i], k, v, start)
        c.keys[i][:, :, start:end] = k
        c.values[i][:, :, start:end] = v
        return c.keys[i][:, :, :end], c.values[i][:, :, :end]  # (B, Hkv, S, Dh)


def roll_in(keys: Tensor, values: Tensor, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """Write T new keys/values for positions start.. into rolling buffers (B, Hkv, W, Dh) at slot
    position % W, and return what attention sees, in `KVCache.key_positions` order.

    One new token overwrites, in place, the slot whose position has just left the window, and
    attention sees the whole buffer. Several new tokens: the earlier of them still need the old
    slots, so attention sees the buffer as it was followed by the new keys, (B, Hkv, held + T, Dh).
    """
    W, T = keys.size(2), k.size(2)
    if T == 1:
        keys[:, :, start % W] = k[:, :, 0]
        values[:, :, start % W] = v[:, :, 0]
        return keys, values  # (B, Hkv, W, Dh)
    held = min(start, W)
    seen_k = torch.cat([keys[:, :, :held], k], dim=2)  # (B, Hkv, held + T, Dh)
    seen_v = torch.cat([values[:, :, :held], v], dim=2)
    kept = min(T, W)  # the last W new positions stay
    slots = torch.arange(start + T - kept, start + T, device=k.device) % W
    keys[:, :, slots] = k[:, :, T - kept:]
    values[:, :, slots] = v[:, :, T - kept:]
    return seen_k, seen_v


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
