"""The KV cache as the decoders use it: a `KVCache` (handformer.nn.kv_cache, the lesson's) whose rows
can be selected, reordered and regrouped, written only through these methods.

- Beam search keeps, at every step, the hypotheses that survive: row r of the next step continues
  row index[r] of this one, so the cached keys and values of every layer follow the same index
  (`reorder`).
- The decoding engine (engine.py) keeps a batch of rows in one cache, each row right-aligned with
  padding on its left that the attention mask hides: a row's last position is at column S - 1 for
  every row. Rows join and leave between steps: `regroup` builds the next batch's cache from the
  rows that stay and the rows that join (blocks of other caches), as wide as the longest row, so
  padding no row needs any more is dropped.
- A sliding-window model's cache rolls (handformer.nn.rolling_kv_cache, `window`): column c is kept in slot
  c % W, only the last W columns are held, and a regrouped cache rolls too, so its memory stays W
  slots however long the rows grow. A model that mixes sliding and global layers (Gemma 2/3, Qwen's
  layer_types) rolls its sliding layers only: a global layer holds every column (`layer_slots`).
- A linear-attention layer (Qwen3.5) holds no columns but a state per row (`KVCache.states`): a
  reorder or regroup selects the rows' states as it selects their keys; the columns that
  right-aligning adds or drops are padding the state never saw.

Shape legend: B batch rows, Hkv key/value heads, S columns (the longest row), C capacity,
W window slots, Dh head dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from handformer.nn.kv_cache import KVCache
from handformer.nn.rolling_kv_cache import RollingKVCache


class DecodingCache(RollingKVCache):
    """A KVCache (rolling when given a window) with `reorder` and `regroup`; it keeps the buffers
    each reorder replaced, so that the next one writes into them and a beam-search step allocates
    nothing."""

    def __init__(self, n_layers: int, max_length: int, window: int | None = None,
                 global_layers: tuple[int, ...] | list[int] | frozenset[int] = ()) -> None:
        super().__init__(n_layers, max_length, window, global_layers)
        self._spare: dict[str, list[Tensor | None]] = {"keys": [None] * n_layers, "values": [None] * n_layers}

    @property
    def rows(self) -> int:
        """Batch rows held (0 before the first forward)."""
        return held_rows(self)

    def columns(self, layer: int) -> tuple[Tensor, Tensor]:
        """The keys and values a layer holds, oldest column first: (B, Hkv, min(length, slots), Dh).
        A rolling cache that has wrapped holds its last W columns in slot order; they come back
        in column order."""
        keys, values = self.keys[layer], self.values[layer]
        slots = self.layer_slots(layer)  # a global layer's: every column
        held = min(self.length, slots)
        if self.length <= slots:
            return keys[:, :, :held], values[:, :, :held]
        oldest = self.length % slots  # the slot of column length - W
        return keys.roll(-oldest, dims=2), values.roll(-oldest, dims=2)

    @classmethod
    def regroup(cls, blocks: Sequence[tuple[KVCache, Tensor]], width: int, capacity: int,
                window: int | None = None) -> DecodingCache:
        """A new cache of `width` columns (each row right-aligned at column width - 1) and room for
        `capacity` in all, whose rows are the selected rows of `blocks`: (cache, row index) pairs,
        each cache's rows right-aligned at its own length. A block longer than `width` loses its
        leftmost columns (padding no row needs any more). With a window no larger than the
        capacity, the new cache rolls over W slots and holds only the last W columns."""
        first = next(c for c, _ in blocks if held_rows(c))
        out = cls(len(first.keys), capacity, window, first.global_layers)
        for layer in range(len(first.keys)):
            if first.states[layer] is not None:  # a linear-attention layer: each row's state
                out.states[layer] = states_of(blocks, layer)
                continue
            k0, v0, slots = first.keys[layer], first.values[layer], out.layer_slots(layer)
            held = min(width, slots)  # columns width - held .. width - 1 are kept
            B = sum(index.numel() for _, index in blocks)
            keys = k0.new_zeros(B, k0.size(1), slots, k0.size(3))  # (B, Hkv, C or W, Dh)
            values = v0.new_zeros(B, v0.size(1), slots, v0.size(3))  # a latent cache's: its own width
            row = 0
            for cache, index in blocks:
                k, v = (t.index_select(0, index.to(t.device)) for t in columns_of(cache, layer))
                n = min(k.size(2), held)  # this block's columns that the new cache keeps
                at = torch.arange(width - n, width, device=k.device) % slots
                keys[row:row + index.numel(), :, at] = k[:, :, k.size(2) - n:]
                values[row:row + index.numel(), :, at] = v[:, :, v.size(2) - n:]
                row += index.numel()
            out.keys[layer], out.values[layer] = keys, values
        out.length = width
        return out

    @classmethod
    def from_columns(cls, keys: Sequence[Tensor], values: Sequence[Tensor], capacity: int,
                     window: int | None = None) -> DecodingCache:
        """A one-row cache of `capacity` positions holding columns 0..n-1: per layer (Hkv, n, Dh)
        keys and values (n at most the window, so column c sits in slot c)."""
        out = cls(len(keys), capacity, window)
        n = keys[0].size(1)
        if n > out.slots:
            raise ValueError(f"{n} columns do not fit in a cache of {out.slots} slots")
        for layer, (k, v) in enumerate(zip(keys, values)):
            out.keys[layer] = k.new_zeros(1, k.size(0), out.slots, k.size(2))  # (1, Hkv, slots, Dh)
            out.values[layer] = v.new_zeros(1, v.size(0), out.slots, v.size(2))
            out.keys[layer][0, :, :n] = k
            out.values[layer][0, :, :n] = v
        out.length = n
        return out

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
                slots = self.layer_slots(i)  # a global layer of a rolling cache holds every column
                filled = min(self.length, slots)
                spare = spares[i]
                if spare is not None and spare.shape[0] >= n and spare.shape[1:] == (Hkv, slots, Dh):
                    moved = spare[:n]  # (B', Hkv, slots, Dh)
                else:
                    moved = t.new_empty((n, Hkv, slots, Dh))  # (B', Hkv, slots, Dh)
                torch.index_select(t[:, :, :filled], 0, index, out=moved[:, :, :filled])
                store[i], spares[i] = moved, t
        self.states = [None if state is None else tuple(s.index_select(0, index) for s in state)
                       for state in self.states]
        if cross is False:
            return
        cross_index = index if cross is True else cross
        for i, kv in enumerate(self.cross):
            if kv is not None:
                self.cross[i] = (kv[0].index_select(0, cross_index), kv[1].index_select(0, cross_index))


def states_of(blocks: Sequence[tuple[KVCache, Tensor]], layer: int) -> tuple[Tensor, ...]:
    """A linear-attention layer's state of the selected rows of `blocks`, block after block."""
    chosen = [tuple(s.index_select(0, index.to(s.device)) for s in cache.states[layer])
              for cache, index in blocks]
    return tuple(torch.cat(parts) for parts in zip(*chosen))  # each (B, ...)


def held_rows(cache: KVCache) -> int:
    """The batch rows a cache holds (0 before the first forward): its first layer's keys', or
    states' (a linear-attention layer's)."""
    for held in (*cache.keys, *(s[0] for s in cache.states if s is not None)):
        if held is not None:
            return held.size(0)
    return 0


def columns_of(cache: KVCache, layer: int) -> tuple[Tensor, Tensor]:
    """`DecodingCache.columns` for any KVCache (a prefill's cache is a plain one)."""
    return DecodingCache.columns(cache, layer)  # type: ignore[arg-type]


__all__ = ["DecodingCache", "columns_of", "held_rows"]
