"""The runner of an encoder-decoder's decoder that takes a KV cache (Whisper's
`TextDecoder.forward(x, xa, kv_cache=None)`): found by what it builds (token embeddings, then a list of
blocks) and what its forward takes (the target ids, the encoder's output, a cache that defaults to
None), whatever its name.

Its decoding with the cache must be its decoding without it: the logits of tokens 5, 6 and 7, fed one
at a time after a prefill of 0..4 through one cache, equal the logits of the whole sequence at those
positions, with the same encoder output. The cache is a dict the forward fills in place (Whisper's,
keyed by its key and value projections), or what it hands back after its logits. Where they part, the
line where the cached path first parts from the whole sequence is quoted.

Shape legend: B batch, T target tokens, S encoder positions, D d_model, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish
from handformer.check.core.defaults import then
from handformer.check.core.discovery import Component, cached_decoder_parts
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import NOT_CHECKED, Check, ComponentResult, LearnerError, text
from handformer.check.runners.localize_cache import cache_departure

SIZES = {"src_vocab": 29, "tgt_vocab": 29, "d_model": 16, "n_heads": 4, "d_ff": 40, "n_layers": 2,
         "max_len": 16, "dropout": 0.0}
B, T, S, PREFILL = 2, 8, 6, 5
TOL = 1e-6


def check_cached_decoder(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp, SIZES)
    embedding = next(m for m in module.modules() if isinstance(m, nn.Embedding))
    cache_arg, memory_args = cached_decoder_parts(comp.obj) or ("", [])
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, embedding.num_embeddings, (B, T), generator=gen)
    memory = {n: torch.randn(B, S, embedding.embedding_dim, generator=gen, dtype=embedding.weight.dtype)
              for n in memory_args}

    def call(ids: Tensor, cache: Any = None) -> Any:
        handed = {cache_arg: cache} if cache is not None else {}
        return ctx.learner.call("forward", module, ids, **memory, **handed)

    with torch.no_grad(), fp.dropout_off():
        whole = fp.first_tensor(call(idx), 3)
        cached = _cached_logits(call, idx)
    if cached is None:
        res.status = NOT_CHECKED
        res.error = LearnerError("mapping", f"{comp.name}.forward neither filled the dict handed as "
                                 f"{cache_arg} nor returned a cache after its logits", "forward")
        return finish(res)
    err = fp.max_error(cached, then(whole, lambda w: w[:, PREFILL:]))
    res.max_abs_error = err
    res.checks.append(Check(text(f"the KV cache: tokens {PREFILL}..{T - 1} fed one at a time after "
                                 f"0..{PREFILL - 1} give the logits of the whole sequence",
                                 f"KV 缓存：先给位置 0..{PREFILL - 1}，再逐个给位置 {PREFILL}..{T - 1}，"
                                 "logits 与整句一次算出的相同"), err < TOL, error_text(err)))
    if err >= TOL:
        note_departure(res, lambda: cache_departure(lambda: call(idx), _runs(call, idx)[0], T, ctx.path))
    return finish(res)


Runs = list[tuple[Callable[[], Any], int, int]]  # each call, with the positions it covers


def _runs(call: Callable[..., Any], idx: Tensor) -> tuple[Runs, list[Any]]:
    """The calls through one cache (a fresh dict): the prefill, then each token alone, with the
    positions each covers; a cache handed back after the logits is handed to the next call. Returns
    them and the list that holds the cache."""
    held: list[Any] = [{}]

    def run(a: int, b: int) -> Any:
        out = call(idx[:, a:b], held[0])
        held[0] = fp.returned_cache(out, held[0])
        return out
    spans = [(0, PREFILL)] + [(t, t + 1) for t in range(PREFILL, T)]
    return [(lambda a=a, b=b: run(a, b), a, b) for a, b in spans], held


def _cached_logits(call: Callable[..., Any], idx: Tensor) -> Tensor | None:
    """The logits (B, T - PREFILL, V) of the tokens after the prefill, fed through the cache; None where
    the prefill neither filled the dict nor handed a cache back."""
    runs, held = _runs(call, idx)
    runs[0][0]()
    if isinstance(held[0], dict) and not held[0]:
        return None
    outs = [fp.first_tensor(run(), 3) for run, _, _ in runs[1:]]
    return None if any(o is None for o in outs) else torch.cat(outs, 1)
