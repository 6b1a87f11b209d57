"""A component with its residual and norm inside: jadore801120's PositionwiseFeedForward and
MultiHeadAttention end with `x += residual; x = self.layer_norm(x)`, the sublayer of the paper's
figure 1 (norm(x + f(x)), post-norm) written as one module. It is compared with the reference f
wrapped the same way: the residual from the component's input, and the norm computed by the
reference with the component's own norm's gain, bias and eps (a norm of its own making that departs
from LayerNorm or RMSNorm makes the whole depart). The pre-norm sublayer x + f(norm(x)) is read too.

Shape legend: B batch, T length, D width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from handformer.check.core.result import Text, text
from handformer.check.core.sublayer import FORMS
from handformer.check.core.weights import Leaf, MappingError, Slot, norm_weights, shapes_text
from handformer.check.reference import variants as V


@dataclass(frozen=True)
class Around:
    """The inner reference's weights (`inner`), the norm around it and where it sits (`form`)."""

    inner: Any
    norm: V.NormWeights
    form: str  # "post-norm" | "pre-norm"

    def apply(self, x: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
        """The sublayer's output from x (B, T, D) and the inner map f: (B, T, D) -> (B, T, D)."""
        return FORMS[self.form](x, f, lambda t: V.norm(self.norm, t))

    def note(self) -> Text:
        said = {"post-norm": "norm(x + f(x))", "pre-norm": "x + f(norm(x))"}[self.form]
        return text(f"the residual and the norm are inside it: compared as the sublayer {said} "
                    f"({self.form}), the norm with its own gain, bias and eps",
                    f"残差和归一化在它内部：按子层 {said}（{self.form}）比较，"
                    "归一化用它自己的 gain、bias 和 eps")


def norms_around(name: str, norms: list[Leaf], width: int, what: Text) -> list[V.NormWeights]:
    """The norm a component holds around its computation, as the reference computes it (its own mistakes
    left out: they make the whole depart); [] when it holds none. One norm of the model's width, or a
    MappingError that says why it is not checked (`what`: the reference it would be compared with)."""
    if not norms:
        return []
    if len(norms) != 1 or getattr(norms[0].weight, "shape", None) != (width,):
        raise MappingError(f"{name} has norms inside ({shapes_text(norms)}) that are not one norm of width "
                           f"{width} around it; {what['en']}",
                           zh=f"{name} 内部的归一化（{shapes_text(norms)}）不是包在外面的一个宽度为 {width} "
                              f"的归一化；{what['zh']}")
    return [dataclasses.replace(norm_weights(Slot("norm", norms[0])), flags=frozenset())]


def readings_around(readings: list[tuple[Any, Any]], norms: list[V.NormWeights]) -> list[tuple[Any, Any]]:
    """Each reading of the inner weights as the post-norm sublayer, then as the pre-norm one; the
    readings as they are when there is no norm around."""
    if not norms:
        return readings
    return [(key, Around(w, norms[0], form)) for form in ("post-norm", "pre-norm") for key, w in readings]


def inner(w: Any) -> Any:
    """The inner reference's weights of a reading, around or not."""
    return w.inner if isinstance(w, Around) else w


def wrapped(w: Any, x: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
    """f(x), or the sublayer around f when the reading has a norm around it."""
    return w.apply(x, f) if isinstance(w, Around) else f(x)


def around_module(w: Any, module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The reference module as a map x -> output, wrapped as the reading's sublayer."""
    return lambda x: wrapped(w, x, module)


def norm_taken_out(module: nn.Module, norms: list[V.NormWeights], leaf: Leaf | None,
                   run: Callable[[], Tensor | None]) -> bool:
    """Whether `module` applies its norm last (jadore801120's attention: `q += residual; q =
    self.layer_norm(q)`): its output equals the reference norm of what it gives with that norm taken
    out (nn.Identity in its place). When it does, the norm is left out, so that what remains, the
    attention plus its query, is checked as an attention; otherwise the norm is put back."""
    if leaf.module is module:  # a norm it computes from its own parameters: not one to take out
        return False
    *path, last = leaf.name.split(".")
    holder = module.get_submodule(".".join(path))
    try:
        full = run()
        setattr(holder, last, nn.Identity())
        bare = run()
        error = (full - V.norm(norms[0], bare)).abs().max().item() / max(1.0, full.abs().max().item())
    except Exception:  # noqa: BLE001  (theirs, or no tensor: the check that follows says why)
        error = float("inf")
    if error > 1e-6:
        setattr(holder, last, leaf.module)
    return error <= 1e-6


def less_query(call: Callable[..., Any]) -> Callable[..., Any]:
    """An attention call (xq, xk, xv, mask) whose first (B, T, D) output has its query taken away: the
    residual it adds to its attention."""
    def call_less(xq: Tensor, xk: Tensor, xv: Tensor, mask: Any) -> Any:
        raw = call(xq, xk, xv, mask)
        paired = isinstance(raw, (tuple, list))  # (output, weights), as jadore801120's returns
        out = (raw[0] if paired else raw) - xq  # (B, T, D): seen to be its query's shape when taken out
        return (out, *raw[1:]) if paired else out
    return call_less


def post_norm_note(leaf: Leaf) -> Text:
    return text(f"the residual and the norm are inside it: its output is {leaf.name}(q + attention) "
                f"(post-norm), checked with {leaf.name} taken out and the query q taken away: the attention "
                "is what remains",
                f"残差和归一化在它内部：输出是 {leaf.name}(q + attention)（Post-Norm）；去掉 {leaf.name}、"
                "减去查询 q 以后，剩下的就是注意力，按注意力检查")
