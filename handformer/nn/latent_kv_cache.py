"""The KV cache of multi-head latent attention (DeepSeek-V2/V3): per layer not the keys and values
of every head, but what they are computed from: each position's compressed latent c (r wide) and
its one RoPE key (Dr wide), shared by every head. Attention expands them again at each step, or
folds the expansion into the query (handformer.families.deepseek: `LatentAttention`).

DeepSeek-V3 keeps r + Dr = 512 + 64 = 576 numbers a position a layer, where its 128 heads' keys and
values would be 128 x (192 + 128) = 40,960: 71 times fewer.

`keys` holds the latents and `values` the RoPE keys, so what the decoders do with a cache (select,
reorder and regroup rows, truncate, copy columns into the prefix cache) moves them as it moves keys
and values; only the widths differ.

Shape legend: B batch, S_max cache capacity, r latent width, Dr RoPE key width.
"""

from __future__ import annotations

from torch import Tensor

from handformer.nn.kv_cache import KVCache


class LatentKVCache(KVCache):
    """Per layer: the latents (B, 1, S_max, r) in `keys`, the RoPE keys (B, 1, S_max, Dr) in `values`;
    each layer's attention stores them with `cache.layer(i).update(latent, rope_key)`."""

    @property
    def latents(self) -> list[Tensor | None]:
        return self.keys

    @property
    def rope_keys(self) -> list[Tensor | None]:
        return self.values


__all__ = ["LatentKVCache"]
