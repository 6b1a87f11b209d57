"""The KV cache: keys and values of past positions, kept so each decoding step only computes the
new token's. State is explicit: the cache is an object passed into `forward`, never module state.

With sliding-window attention (Mistral: each position sees only the last `window` positions, itself
included) the cache is a rolling buffer of `window` slots: position p is stored in slot p % window,
over the position that left the window, so its memory does not grow with the generated length.
Attention does not care in which order the keys come (softmax is over a set), only that the mask
follows the same order: `KVCache.key_positions` says which position each returned key holds.

Shape legend: L layers, B batch, Hkv key/value heads, S_max cache capacity (slots), Dh head dim,
T new positions, W window.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated self-attention keys/values for every layer, plus cross-attention keys/values.

    Each layer's buffer of shape (B, Hkv, S_max, Dh) is allocated on first use with the dtype and
    device of the keys it receives. `length` counts the positions stored so far; the model calls
    `advance(T)` after each forward over T new positions, so every layer writes at the same offset.

    window: the attention window of a sliding-window model. When it is at most `max_length`, the
    buffers have `window` slots and roll (they never fill up); otherwise they hold `max_length`
    positions, as without a window.
    """

    def __init__(self, n_layers: int, max_length: int, window: int | None = None) -> None:
        if max_length <= 0:
            raise ValueError(f"KVCache max_length must be positive, got {max_length}")
        if window is not None and window <= 0:
            raise ValueError(f"KVCache window must be positive or None, got {window}")
        self.max_length = max_length
        self.window = window if window is not None and window <= max_length else None  # rolling
        self.slots = self.window or max_length  # S_max
        self.length = 0
        self.keys: list[Tensor | None] = [None] * n_layers  # each (B, Hkv, S_max, Dh)
        self.values: list[Tensor | None] = [None] * n_layers
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers  # (B, Hkv, S_src, Dh)
        self._layers = [LayerKVCache(self, i) for i in range(n_layers)]  # made once, not per step
        # The buffers that `reorder` last replaced, reused by the next one (no allocation per step).
        self._spare: dict[str, list[Tensor | None]] = {"keys": [None] * n_layers, "values": [None] * n_layers}

    def rolls(self, n_new: int) -> bool:
        """Whether appending `n_new` positions overwrites a slot (the keys then come out of order)."""
        return self.window is not None and self.length + n_new > self.window

    def _slot_positions(self, end: int) -> Tensor:
        """The position held by each slot once positions 0..end-1 were written, (min(end, W),)."""
        if end <= self.slots:
            return torch.arange(end)
        last = end - 1
        return last - (last - torch.arange(self.slots)) % self.slots  # the latest p < end in each slot

    def key_positions(self, n_new: int) -> Tensor | None:
        """The absolute position of each key that attention gets when `n_new` positions are
        appended, in order; None when they are simply 0 .. length + n_new - 1."""
        if not self.rolls(n_new):
            return None
        if n_new == 1:  # written in place: the slot it overwrites has just left the window
            return self._slot_positions(self.length + 1)
        # Several new positions: earlier queries among them still need the slots they overwrite,
        # so attention sees the buffer as it was, then the new keys.
        return torch.cat([self._slot_positions(self.length),
                          torch.arange(self.length, self.length + n_new)])

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

    def reorder(self, index: Tensor, cross: bool | Tensor = True, capacity: int | None = None) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses): row r becomes row
        index[r]. cross=False leaves the cross-attention keys/values alone, for a caller whose
        selected rows all share them (the beams of one source sentence); a tensor selects the
        cross-attention rows by that index instead (beam search dropping finished sentences).

        Only the filled slots are copied (a step early in a long cache copies a few positions, not
        S_max), into the buffers that the previous reorder replaced: a step allocates nothing (and
        views of the cache taken before a reorder go stale). capacity: the new buffers hold that many
        positions instead (at least those filled; not for a rolling window cache): a beam search
        grows its cache as its hypotheses lengthen rather than allocating the longest output."""
        filled = min(self.length, self.slots)
        if capacity is not None and capacity != self.slots:
            if self.window is not None or capacity < filled:
                raise ValueError(f"cannot resize a KV cache of {filled} positions to capacity {capacity}"
                                 + (" (a rolling window cache)" if self.window is not None else ""))
            self.max_length = self.slots = capacity
        n = index.numel()
        for store, spares in ((self.keys, self._spare["keys"]), (self.values, self._spare["values"])):
            for i, t in enumerate(store):
                if t is None:
                    continue
                _, Hkv, _, Dh = t.shape
                spare = spares[i]
                if spare is not None and spare.shape[0] >= n and spare.shape[1:] == (Hkv, self.slots, Dh):
                    moved = spare[:n]  # (B', Hkv, slots, Dh)
                else:
                    moved = t.new_empty((n, Hkv, self.slots, Dh))  # (B', Hkv, slots, Dh)
                torch.index_select(t[:, :, :filled], 0, index, out=moved[:, :, :filled])
                store[i], spares[i] = moved, t
        if cross is False:
            return
        cross_index = index if cross is True else cross
        for i, kv in enumerate(self.cross):
            if kv is not None:
                self.cross[i] = (kv[0].index_select(0, cross_index), kv[1].index_select(0, cross_index))


class LayerKVCache:
    """One layer's view of a `KVCache`, handed to that layer's attention."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache = cache
        self.index = index

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, Hkv, T, Dh) keys/values at the current offset; return the keys/values that
        attention sees, (B, Hkv, S, Dh), in the order of `KVCache.key_positions(T)`."""
        c, i = self.cache, self.index
        start, T = c.length, k.size(2)
        end = start + T
        if end > c.slots and c.window is None:
            raise ValueError(f"KV cache is full: {end} positions needed, capacity {c.max_length}; "
                             "create the cache with a larger max_length")
        if c.keys[i] is None:
            B, Hkv, _, Dh = k.shape
            c.keys[i] = torch.empty(B, Hkv, c.slots, Dh, dtype=k.dtype, device=k.device)
            c.values[i] = torch.empty(B, Hkv, c.slots, Dh, dtype=v.dtype, device=v.device)
        keys, values = c.keys[i], c.values[i]
        if not c.rolls(T):
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
            return keys[:, :, :end], values[:, :, :end]  # (B, Hkv, S, Dh)
        if T == 1:
            keys[:, :, start % c.slots] = k[:, :, 0]
            values[:, :, start % c.slots] = v[:, :, 0]
            return keys, values  # (B, Hkv, W, Dh)
        held = min(start, c.slots)
        seen_k = torch.cat([keys[:, :, :held], k], dim=2)  # (B, Hkv, held + T, Dh)
        seen_v = torch.cat([values[:, :, :held], v], dim=2)
        kept = min(T, c.slots)  # the last W new positions stay
        slots = torch.arange(end - kept, end, device=k.device) % c.slots
        keys[:, :, slots] = k[:, :, T - kept:]
        values[:, :, slots] = v[:, :, T - kept:]
        return seen_k, seen_v

    @property
    def cross(self) -> tuple[Tensor, Tensor] | None:
        return self.cache.cross[self.index]

    @cross.setter
    def cross(self, kv: tuple[Tensor, Tensor]) -> None:
        self.cache.cross[self.index] = kv
