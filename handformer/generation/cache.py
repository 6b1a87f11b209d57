"""The KV cache as the decoders use it: a `KVCache` (handformer.nn.kv_cache, the lesson's) whose rows
can be selected and reordered, written only through these methods.

Beam search keeps, at every step, the hypotheses that survive: row r of the next step continues
row index[r] of this one, so the cached keys and values of every layer follow the same index.

Shape legend: B batch rows, Hkv key/value heads, S_max cache capacity (slots), Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from handformer.nn.kv_cache import KVCache


class DecodingCache(KVCache):
    """A KVCache with `reorder`; it keeps the buffers each reorder replaced, so that the next one
    writes into them and a decoding step allocates nothing."""

    def __init__(self, n_layers: int, max_length: int, window: int | None = None) -> None:
        super().__init__(n_layers, max_length, window)
        self._spare: dict[str, list[Tensor | None]] = {"keys": [None] * n_layers, "values": [None] * n_layers}

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


__all__ = ["DecodingCache"]
