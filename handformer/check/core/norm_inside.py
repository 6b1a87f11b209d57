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
    if len(norms) != 1 or norms[0].weight is None or norms[0].weight.shape != (width,):
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
