"""A sliding-window model's KV cache: a rolling buffer that never fills.

With sliding-window attention (Mistral: each position sees only the last `window` positions, itself
included) a layer needs the last W keys only, so its buffer has W slots: position p is stored in
slot p % W, over the position that has just left the window, and its memory does not grow with the
generated length. Attention does not care in which order the keys come (softmax is over a set), only
that the mask follows the same order: `RollingKVCache.in_slot_order` puts a mask's key axis in the
order of the slots. A model that mixes sliding and global layers (Gemma 2/3) rolls the sliding
layers' buffers only: the global layers' hold every position (`global_layers`).

Shape legend: B batch, Hkv key/value heads, W window (slots), Dh head dim, T new positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from handformer.nn.kv_cache import KVCache, LayerKVCache


class RollingKVCache(KVCache):
    """A `KVCache` whose sliding layers roll over `window` slots.

    window: the model's attention window. When it is at most `max_length`, the sliding layers'
    buffers have `window` slots and roll; otherwise (or None) they hold `max_length` positions, as
    a plain cache's. global_layers: the layers that attend to every position; their buffers hold
    `max_length` positions and never roll.
    """

    def __init__(self, n_layers: int, max_length: int, window: int | None,
                 global_layers: tuple[int, ...] | list[int] | frozenset[int] = ()) -> None:
        super().__init__(n_layers, max_length)
        if window is not None and window <= 0:
            raise ValueError(f"KVCache window must be positive or None, got {window}")
        self.window = window if window is not None and window <= max_length else None  # rolling
        self.slots = self.window or max_length  # S_max of the sliding layers
        self.global_layers = frozenset(global_layers)
        self._layers = [RollingLayerKVCache(self, i) for i in range(n_layers)]

    def layer_slots(self, layer: int) -> int:
        """How many positions `layer`'s buffers hold: max_length for a global layer."""
        return self.max_length if layer in self.global_layers else self.slots

    def rolls(self, n_new: int, layer: int | None = None) -> bool:
        """Whether appending `n_new` positions overwrites a slot (the keys then come out of order)
        of the sliding layers, or of `layer` (never a global one)."""
        rolling = self.window is not None and layer not in self.global_layers
        return rolling and self.length + n_new > self.window

    def key_positions(self, n_new: int) -> Tensor:
        """The absolute position of each key that attention gets when `n_new` positions are
        appended to a rolling cache, in the order `RollingLayerKVCache.update` returns them."""
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


class RollingLayerKVCache(LayerKVCache):
    """One layer's view of a `RollingKVCache`: a sliding layer whose window is full rolls."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """As `LayerKVCache.update`; once the window is full, the keys/values come back in slot
        order, (B, Hkv, S', Dh) with S' as `RollingKVCache.key_positions` says."""
        c = self.cache()
        if not c.rolls(k.size(2), self.index):
            return super().update(k, v)
        keys, values = self.buffers(k, v)
        return roll_in(keys, values, k, v, c.length)


def roll_in(keys: Tensor, values: Tensor, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """Write T new keys/values for positions start.. into rolling buffers (B, Hkv, W, Dh) at slot
    position % W, and return what attention sees, in `RollingKVCache.key_positions` order.

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

