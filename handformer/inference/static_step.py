"""The decoding step with fixed shapes, compiled once by `torch.compile` (Inductor's C++ backend).

An eager decoding step of a small model is ~900 PyTorch operator calls, each with Python and
dispatch around it; compiled, the step is one generated C++ function that fuses the small ones
(norms, activations, RoPE, the mask, softmax) around the matrix products. A compiled graph is only
reused while every tensor keeps its shape, so the step is written with shapes that never change:

- the plain `KVCache`'s buffers at their full capacity C; the new key and value are written at the
  column a (1,) index tensor holds (`nn.kv_cache.IndexedLayerKVCache`, `index_copy_`), and
  attention reads all C columns;
- the mask is computed inside the step from a precomputed column range: `columns <= index`
  (1, 1, 1, C), True for the positions written so far; the position is the same index tensor;
- the columns not written yet are zeroed once per cache (fresh buffers are uninitialized memory,
  and a masked NaN still gives NaN in the weighted sum of values).

The weights are frozen into the compiled code (Inductor's `freezing`): a model whose weights
change afterwards must not reuse its step (`static_step_for` keeps one per model object).

So one compiled function serves every step of every call with the same batch size and capacity;
`generate` rounds the cache capacity up to a multiple of CAPACITY_STEP so calls of different
lengths share it. The masked columns add exact zeros to the softmax: the step computes the eager
step's attention, up to the order of the sums (greedy tokens are the same in the tests).

Eager instead (`eager_reason` says why): a sliding window (a rolling cache: the column is not the
position), a mixture of experts (routing picks rows by value), LongRoPE (its factors depend on the
length), latent attention (its own cache), a padded batch or one whose rows are not all live (the
mask is the engine's), and speculation (several positions a step).
Shape legend: B rows, C cache capacity, V vocabulary.
"""

from __future__ import annotations

import time
import weakref

import torch
from torch import Tensor

from handformer.models.causal_lm import CausalLM
from handformer.nn.kv_cache import IndexedLayerKVCache, KVCache
from handformer.nn.masks import AttentionMask

CAPACITY_STEP = 256  # cache capacities are rounded up to a multiple of this: one compiled step for many calls


def eager_reason(model: CausalLM) -> str | None:
    """Why `model` decodes eagerly even when compiling is asked for, or None when it can compile."""
    cfg = model.cfg
    if cfg.sliding_window is not None:
        return "a sliding window (a rolling cache: a column is not a position)"
    if cfg.moe is not None:
        return "a mixture of experts (routing picks rows by value)"
    if cfg.mla is not None:
        return "latent attention (its own cache)"
    if hasattr(getattr(model, "rotary", None), "factor_set"):
        return "LongRoPE (the factors depend on the length)"
    return None


def _step(model: CausalLM, ids: Tensor, index: Tensor, columns: Tensor,
          keys: list[Tensor], values: list[Tensor]) -> Tensor:
    """One token of every row: ids (B, 1), index (1,) its position and column, columns (C,)
    0..C-1 -> (B, V) logits. The model's forward, written for fixed shapes."""
    positions = index.view(1, 1)  # (1, 1): every row is at the same position (no padding)
    allowed = (columns <= index).view(1, 1, 1, -1)  # (1, 1, 1, C): the columns written so far
    mask = AttentionMask(allowed)
    x = model.dropout(model.embed(ids) + model.positions(positions))  # (B, 1, D)
    rope = model.rotary(positions)
    for i, layer in enumerate(model.layers):
        x, _ = layer(x, mask, rope=rope, cache=IndexedLayerKVCache(keys[i], values[i], index))
    return model.lm_head(model.norm(x))[:, -1]  # (B, V)


class StaticStep:
    """The compiled decoding step of one model. `compile_seconds`: the first call's compile time
    for each (rows, capacity) it has compiled (Inductor also keeps its code on disk, in
    torch's cache directory, for the next process)."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        # freezing: the weights become constants of the compiled code (Inductor packs them for
        # oneDNN itself, and takes a PackedLinear's packed weight as it is)
        self.compiled = torch.compile(_step, dynamic=False)
        self.compile_seconds: dict[tuple[int, int], float] = {}
        self._index = torch.zeros(1, dtype=torch.long)
        self._columns: dict[int, Tensor] = {}
        self._cleared: weakref.WeakSet[KVCache] = weakref.WeakSet()

    @staticmethod
    def usable(cache: KVCache, mask: Tensor | None) -> bool:
        """Whether the step can run on `cache` now: column = position (no window) and no engine
        mask (no padding, every row live)."""
        return mask is None and cache.window is None

    def __call__(self, ids: Tensor, cache: KVCache) -> Tensor:
        """ids (B, 1) -> (B, V) logits; the new position is written at cache.length, which advances."""
        C = cache.slots
        if C not in self._columns:
            self._columns[C] = torch.arange(C, device=ids.device)  # (C,)
        index = self._index.to(ids.device) if self._index.device != ids.device else self._index
        index.fill_(cache.length)
        if cache not in self._cleared:  # empty columns hold whatever memory held: 0 x NaN is NaN
            for buffer in (*cache.keys, *cache.values):
                buffer[:, :, cache.length:].zero_()
            self._cleared.add(cache)
        key = (ids.size(0), C)
        started = time.perf_counter() if key not in self.compile_seconds else None
        from torch._inductor import (
            config as inductor,  # here: Inductor's import takes seconds; eager needs none
        )

        with inductor.patch(freezing=True):  # read when a call compiles
            logits = self.compiled(self.model, ids, index, self._columns[C], cache.keys, cache.values)
        if started is not None:
            self.compile_seconds[key] = time.perf_counter() - started
        cache.advance(1)
        return logits


_STEPS: weakref.WeakKeyDictionary[CausalLM, StaticStep] = weakref.WeakKeyDictionary()


def static_step_for(model: CausalLM) -> StaticStep | None:
    """The model's compiled step (made once per model and kept while the model lives), or None when
    it decodes eagerly (`eager_reason`)."""
    if eager_reason(model) is not None:
        return None
    if model not in _STEPS:
        _STEPS[model] = StaticStep(model)
    return _STEPS[model]


__all__ = ["CAPACITY_STEP", "StaticStep", "eager_reason", "static_step_for"]
