"""The rows of a continuous batch in one KV cache: each row is one sequence, right-aligned, with
padding on its left that the attention mask hides (True = real token).

A row joins after its prompt ran alone (prefill into a one-row cache) and leaves when it is done;
both happen between decoding steps, in `regroup`, which copies the surviving rows and the joining
ones into a fresh cache as wide as the longest row (so padding that no row needs any more is
dropped) with room for every row's remaining tokens. Between regroups each step appends one column.
Positions are counted from the mask inside the model, so a padded row sees the positions it would
see alone.

Shape legend: B rows, S columns (the longest row), C capacity (S + the most tokens a row still
feeds), Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from handformer.nn.kv_cache import KVCache


class PaddedBatch:
    """The KV cache, the padding mask and the real length of every row of a decoding batch."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.cache: KVCache | None = None
        self.lengths: list[int] = []  # real positions held by each row
        self.mask: Tensor | None = None  # (B, S) True = a real position

    @property
    def width(self) -> int:
        return 0 if self.cache is None else self.cache.length

    def regroup(self, keep: Sequence[int], joining: Sequence[KVCache], remaining: Sequence[int]) -> None:
        """Keep rows `keep` (in that order), then append one row per one-row cache in `joining`.
        `remaining[i]`: how many more positions the i-th new row will feed (sets the capacity)."""
        lengths = [self.lengths[i] for i in keep] + [c.length for c in joining]
        if not lengths:
            self.cache, self.lengths, self.mask = None, [], None
            return
        S = max(lengths)
        capacity = S + max(max(remaining), 1)
        cache = KVCache(self.n_layers, capacity)
        index = torch.tensor(list(keep), dtype=torch.long)
        for layer in range(self.n_layers):
            sources = []  # (rows, Hkv, s, Dh) blocks, each right-aligned at column S
            if len(keep):
                sources.append(self._columns(self.cache.keys[layer], self.cache.values[layer], index))
            for c in joining:
                sources.append((c.keys[layer][:, :, :c.length], c.values[layer][:, :, :c.length]))
            cache.keys[layer], cache.values[layer] = _right_aligned(sources, S, capacity)
        cache.length = S
        self.cache, self.lengths = cache, lengths
        device = cache.keys[0].device
        starts = torch.tensor([S - n for n in lengths], device=device)
        self.mask = torch.arange(S, device=device)[None] >= starts[:, None]  # (B, S)

    def _columns(self, keys: Tensor, values: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
        index = index.to(keys.device)
        S = self.width
        return keys[index, :, :S], values[index, :, :S]  # (rows, Hkv, S_old, Dh)

    def grow(self) -> Tensor | None:
        """Add the column the next step writes; returns the mask to give the model, or None when
        no row is padded (the model then builds no mask at all, as for a single sequence)."""
        B = len(self.lengths)
        self.lengths = [n + 1 for n in self.lengths]
        self.mask = torch.cat([self.mask, self.mask.new_ones(B, 1)], dim=1)  # (B, S + 1)
        return self.mask if min(self.lengths) < self.mask.size(1) else None


def _right_aligned(sources: list[tuple[Tensor, Tensor]], S: int, capacity: int) -> tuple[Tensor, Tensor]:
    """Stack blocks of keys/values into (B, Hkv, C, Dh) buffers, each block's last column at S - 1;
    a block wider than S loses its leftmost columns (padding that no row needs any more)."""
    k0 = sources[0][0]
    B = sum(k.size(0) for k, _ in sources)
    keys = k0.new_zeros(B, k0.size(1), capacity, k0.size(3))  # (B, Hkv, C, Dh)
    values = keys.clone()
    row = 0
    for k, v in sources:
        n, width = k.size(0), min(k.size(2), S)
        keys[row:row + n, :, S - width:S] = k[:, :, k.size(2) - width:]
        values[row:row + n, :, S - width:S] = v[:, :, v.size(2) - width:]
        row += n
    return keys, values


__all__ = ["PaddedBatch"]
