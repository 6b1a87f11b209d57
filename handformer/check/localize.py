"""Where a learner's computation parts from the reference, when no catalogued mistake explains it.

    steps = trace_steps(lambda: module(x, x, x, None), learner_file)   # (line, name, tensor) in order
    found = first_departure(steps, views, sizes)                        # the first that matches no view
    found.describe("en")   # "line 21: scores = ... -> a constant factor 0.707 = 1/d_k**0.25 of q·kᵀ ..."

The learner's forward runs once under `sys.settrace`: every tensor a line of their file assigns
(or returns) that depends on the input (it has a grad_fn) is one step. The reference's sub-steps
are named views (q, the heads, q·kᵀ, the scores, the weights, ...) in the layouts learners write.
The first step whose shape is a view's but whose values are none of them is where the two part;
its form is named where it is simple: a constant factor (as a power of a size: d_k, d_model, ...),
a sign, a transpose, a shift by one position, a softmax over another axis, an extra or missing term.
A step whose shape is no view's (a fused or flattened layout) is skipped, not judged.

Shape legend: B batch, H heads, T length, Dh head dim, D d_model.
"""

from __future__ import annotations

import inspect
import linecache
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check import variants as V
from handformer.check.result import ComponentResult, Text, text

Step = tuple[int, str, Tensor]  # (line in the learner's file, the variable (or "return"), its value)
View = tuple[str, Tensor]  # (the reference's sub-step, in words; its value)
POWERS = (0.5, 1.0, 0.25, 2.0)


def trace_steps(run: Callable[[], Any], filename: str) -> list[Step]:
    """Run `run()` once, recording each input-dependent tensor that a line of `filename` assigns."""
    steps: list[Step] = []

    def local(frame: Any, event: str, arg: Any) -> Any:
        seen = frame.f_locals
        before = state.setdefault(id(frame), ({}, frame.f_lineno))
        for name, value in seen.items():
            if isinstance(value, Tensor) and value.grad_fn is not None and before[0].get(name) is not value:
                steps.append((before[1], name, value.detach()))
        if event == "return" and isinstance(arg, Tensor) and arg.grad_fn is not None:
            steps.append((frame.f_lineno, "return", arg.detach()))
        state[id(frame)] = (dict(seen), frame.f_lineno)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == filename else None

    state: dict[int, tuple[dict[str, Any], int]] = {}
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        with torch.enable_grad():
            run()
    finally:
        sys.settrace(old)
    return steps


def same(t: Tensor, r: Tensor, atol: float = 1e-5) -> bool:
    """Equal values; where the reference is -inf (masked), anything at or below -1e4 (a -1e9 fill)."""
    if t.shape != r.shape:
        return False
    finite = torch.isfinite(r)
    return bool((t[~finite] <= -1e4).all()) and bool(torch.allclose(t[finite], r[finite], atol=atol))


def factor_name(c: float, sizes: dict[str, int]) -> str:
    """c as a power of one size ("1/d_k**0.25", "sqrt(d_model)"), else its value."""
    for p in POWERS:
        for name, n in sizes.items():
            for sign in (1, -1):
                if n > 1 and math.isclose(c, n ** (sign * p), rel_tol=1e-4):
                    base = {0.5: f"sqrt({name})", 1.0: name}.get(p, f"{name}**{p:g}")
                    return base if sign > 0 else f"1/{base}"
    if c < 0 and factor_name(-c, sizes) != f"{-c:.4g}":
        return "-" + factor_name(-c, sizes)
    return f"{c:.4g}"


def _factor(t: Tensor, r: Tensor) -> float | None:
    big = r.abs() > 1e-3
    if t.shape != r.shape or not big.any() or not torch.isfinite(t).all() or not torch.isfinite(r).all():
        return None
    ratio = t[big] / r[big]
    c = float(ratio.median())
    return c if torch.allclose(t, c * r, atol=1e-5, rtol=1e-4) and not math.isclose(c, 1.0) else None


def _shift(t: Tensor, r: Tensor, dim: int, what: str) -> Text | None:
    n = r.size(dim)
    if t.shape != r.shape or n < 2:
        return None
    for d, sign in ((1, "-"), (-1, "+")):
        if same(t.narrow(dim, max(d, 0), n - 1), r.narrow(dim, max(-d, 0), n - 1)):
            return text(f"{what} shifted by one position: position i holds the reference's i {sign} 1",
                        f"{what} 错开了一个位置：位置 i 放的是参考的位置 i {sign} 1")
    return None


def _softmax_axis(t: Tensor, pre: Tensor | None) -> Text | None:
    """Weights that are a softmax of the reference's scores over another axis."""
    if pre is None or t.shape != pre.shape:
        return None
    for dim in range(pre.dim() - 1):
        if same(t, torch.softmax(pre, dim=dim)):
            return text(f"a softmax over dim={dim}; the reference's runs over the keys, dim=-1",
                        f"softmax 作用在 dim={dim} 上；参考作用在键所在的 dim=-1 上")
    return None


def _term(t: Tensor, r: Tensor, what: str, terms: list[View]) -> Text | None:
    """t = r + (a known tensor) or r - (a known tensor): an extra or a missing term."""
    if t.shape != r.shape or not torch.isfinite(t).all():
        return None
    for name, term in terms:
        if same(t - r, term):
            return text(f"{what} plus an extra term equal to {name}", f"{what} 多加了一项，等于 {name}")
        if same(r - t, term):
            return text(f"{what} missing the term {name}", f"{what} 少了一项：{name}")
    return None


def form_of(t: Tensor, views: list[View], sizes: dict[str, int], pre: Tensor | None = None,
            terms: list[View] = ()) -> Text | None:
    """The simple form of t against the reference's views of its shape, the first that has one."""
    for what, r in views:  # a sign first: -q·kᵀ/sqrt(d_k) is a factor -1/sqrt(d_k) of q·kᵀ too
        if r.shape == t.shape and same(t, -r):
            return text(f"{what} with its sign flipped", f"{what} 的符号反了")
    for what, r in views:
        if r.shape != t.shape:
            continue
        c = _factor(t, r)
        if c is not None:
            name = factor_name(c, sizes)
            return text(f"{what} times a constant factor {c:.4g} = {name}",
                        f"{what} 乘了一个常数因子 {c:.4g} = {name}")
        if r.dim() >= 2 and same(t, r.transpose(-2, -1)):
            return text(f"{what} transposed (its last two axes swapped)",
                        f"{what} 被转置了（最后两个轴互换）")
        found = _shift(t, r, 2 if r.dim() == 4 else 1, what) or _term(t, r, what, list(terms))
        if found:
            return found
    return _softmax_axis(t, pre)


@dataclass
class Departure:
    line: int
    name: str
    code: str
    form: Text | None

    def describe(self) -> Text:
        at = f"line {self.line}: {self.code}"
        form = self.form or text("no simple form (not a factor, sign, transpose, shift, axis or term)",
                                 "没有简单的形式（不是常数因子、符号、转置、错位、轴或多余的项）")
        return text(f"no known mistake reproduces it; the first step that parts from the reference is "
                    f"`{self.name}` at {at}; the difference: {form['en']}",
                    f"没有任何已知错误能复现它；第一个与参考不同的中间结果是第 {self.line} 行的 "
                    f"`{self.name}`：{self.code}；差别：{form['zh']}")


def first_departure(steps: list[Step], views: list[View], filename: str, sizes: dict[str, int],
                    pre: Tensor | None = None, terms: list[View] = ()) -> Departure | None:
    """The first step whose shape is one of the views' and whose values are none of them."""
    shapes = {r.shape for _, r in views}
    for line, name, t in steps:
        if t.shape not in shapes or any(same(t, r) for _, r in views):
            continue
        code = linecache.getline(filename, line).strip()
        return Departure(line, name, code, form_of(t, views, sizes, pre, terms))
    return None


def attention_views(w: V.MHAWeights, x: Tensor, keep: Tensor | None) -> tuple[list[View], Tensor]:
    """The reference multi-head attention's sub-steps on x (B, T, D), in forward order, in the
    layouts learners write them; and its scores before the softmax."""
    B, T, D = x.shape
    q, k, v = (V.linear(x, p) for p in (w.q, w.k, w.v))  # (B, T, D)
    qh, kh, vh = (V.split_heads(t, w.n_heads, frozenset()) for t in (q, k, v))  # (B, H, T, Dh)
    raw = qh @ kh.transpose(-2, -1)  # (B, H, T, T)
    scores = raw / math.sqrt(qh.size(-1))
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    heads = weights @ vh  # (B, H, T, Dh)
    concat = heads.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
    out = V.linear(concat, w.o) if w.o is not None else concat
    views = [("q", q), ("k", k), ("v", v), ("the heads of q", qh), ("the heads of k", kh),
             ("the heads of v", vh), ("q·kᵀ", raw), ("the scores q·kᵀ/sqrt(d_k)", scores),
             ("the attention weights", weights), ("weights·v", heads),
             ("weights·v, heads concatenated", concat), ("the output", out)]
    views += [(f"{name} (B, T, H, Dh)", t.transpose(1, 2)) for name, t in views[3:6] + views[9:10]]
    return views, scores


def localize_attention(call: Callable[..., Any], w: V.MHAWeights, filename: str,
                       causal_inside: bool) -> Departure | None:
    """Run the learner's attention (self-attention on one input, causal if it is causal inside)
    traced, and find where it parts from the reference."""
    from handformer.check.fingerprint import randn

    B, T, D = 2, 5, w.q[0].size(1)
    x = randn(B, T, D, seed=41).requires_grad_()
    keep = V.causal_keep(T)[None, None] if causal_inside else None
    views, scores = attention_views(w, x.detach(), keep)
    steps = trace_steps(lambda: call(x, x, x, None), filename)
    sizes = {"d_k": D // w.n_heads, "d_model": D, "n_heads": w.n_heads, "T": T}
    return first_departure(steps, views, filename, sizes, scores, [("the input x", x.detach())])


def note_attention_departure(res: ComponentResult, comp: Any, call: Callable[..., Any], w: V.MHAWeights,
                             causal_inside: bool) -> None:
    """A FAIL that no catalogued mistake explains gets a note: where the learner's attention first
    parts from the reference, its line, and the form of the difference."""
    if res.findings or res.max_abs_error is None or res.max_abs_error < 1e-5 or w.rope or w.n_kv_heads:
        return
    filename = inspect.getsourcefile(comp.obj)
    found = filename and localize_attention(call, w, filename, causal_inside)
    if found:
        res.notes.append(found.describe())
