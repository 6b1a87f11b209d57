"""How much memory a computation holds at its peak, measured on CPU by counting tensors.

PyTorch reports peak memory on GPUs only. `peak_tensor_bytes` watches every operator a function
runs (a TorchDispatchMode): each new storage an operator returns is counted while it is alive, and
the largest total is the peak. Inputs that existed before the call are not counted; views share
their base's storage and are counted once.

`attention_memory` uses it on handformer's attention function, where the tutorials' claim lives:
the explicit formula builds the (T, S) score matrix, O(n^2) in the sequence length, while the fused
kernel works through it in tiles and keeps only O(n).

Shape legend: B batch, H heads, T queries, S keys, Dh head dim.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from handformer.nn.attention import scaled_dot_product_attention


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages operators create while their tensors are alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.storages: set[int] = set()  # data pointers of storages being counted

    def _freed(self, ptr: int, nbytes: int) -> None:
        self.storages.discard(ptr)
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr()
                  for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in self.storages or ptr in inputs:  # a view or an in-place result
                continue
            self.storages.add(ptr)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._freed, ptr, nbytes)
        return out


def peak_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Run `fn()` and return the most bytes of tensors it created that were alive at one time."""
    counter = _LiveBytes()
    with counter:
        result = fn()
    del result
    return counter.peak


def attention_memory(lengths: Sequence[int], head_dim: int = 64, need_weights: bool = True,
                     ) -> list[int]:
    """Peak bytes of one self-attention call (batch 1, one head) at each sequence length.

    need_weights=True takes the explicit path (scores and weights materialised, O(n^2));
    False takes PyTorch's fused kernel."""
    peaks = []
    for n in lengths:
        x = torch.randn(1, 1, n, head_dim)  # (B, H, T, Dh): queries, keys and values alike
        peaks.append(peak_tensor_bytes(
            lambda x=x: scaled_dot_product_attention(x, x, x, need_weights=need_weights)))
    return peaks
