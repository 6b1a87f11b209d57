"""A component with a norm of its own around its computation, in either place a sublayer puts it.

Post-norm, residual inside: jadore801120's PositionwiseFeedForward and MultiHeadAttention end with
`x += residual; x = self.layer_norm(x)`, the sublayer of the paper's figure 1 (norm(x + f(x))) written
as one module. It is compared with the reference f wrapped the same way: the residual from the
component's input, and the norm computed by the reference with the component's own norm's gain, bias
and eps (a norm of its own making that departs from LayerNorm or RMSNorm makes the whole depart). The
pre-norm sublayer x + f(norm(x)) is read too.

Pre-norm, residual outside: lucidrains' vit-pytorch's Attention begins with x = self.norm(x) and its
FeedForward is nn.Sequential(nn.LayerNorm(dim), nn.Linear, ...), the Transformer writing x = attn(x) + x.
It is checked as norm then sublayer: the norm must be LayerNorm or RMSNorm on the learner's own
weights, and with the norm taken out the sublayer is compared with handformer's attention or FFN, as
any other. The norm is found by what the module computes, whatever its name.

Both take a norm out the same way (`_taken_out`): replaced by nn.Identity in place, kept out only
where the module's output with it equals what the reference makes of the output without it.

Shape legend: B batch, T length, D width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.result import DEPARTS, ComponentResult, Finding, Text, text
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.core.sublayer import FORMS, norm_departure
from handformer.check.core.weights import Leaf, MappingError, Slot, leaves, norm_weights, of_kind, shapes_text
from handformer.check.reference import variants as V

Run = Callable[[Tensor], Tensor | None]  # the module on an input (B, T, D): its first tensor out
SAID = {"post-norm": "norm(x + f(x))", "pre-norm": "x + f(norm(x))"}
PLACES = {**FORMS, "bare": lambda x, f, n: f(x)}  # "bare": no norm around (every other component)


@dataclass(frozen=True)
class Around:
    """A reading of the inner reference's weights (`inner`) with the norm around it and where it sits
    (`form`: post-norm or pre-norm); `Around(w)`, bare, where the component holds no norm."""

    inner: Any
    norm: V.NormWeights | None = None
    form: str = "bare"

    def apply(self, x: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
        """The sublayer's output from x (B, T, D) and the inner map f: (B, T, D) -> (B, T, D)."""
        return PLACES[self.form](x, f, lambda t: V.norm(self.norm, t))

    def module(self, module: nn.Module) -> Callable[[Tensor], Tensor]:
        """The reference module as a map x -> output, wrapped as this reading's sublayer."""
        return lambda x: self.apply(x, module)

    def notes(self) -> list[Text]:
        """What the report says of the reading: that the residual and norm are inside (none when bare)."""
        said = SAID.get(self.form)
        return [text(f"the residual and the norm are inside it: compared as the sublayer {said} "
                     f"({self.form}), the norm with its own gain, bias and eps",
                     f"残差和归一化在它内部：按子层 {said}（{self.form}）比较，"
                     "归一化用它自己的 gain、bias 和 eps")] * (said is not None)


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


def readings_around(readings: list[tuple[Any, Any]], norms: list[V.NormWeights]) -> list[tuple[Any, Around]]:
    """Each reading of the inner weights as the post-norm sublayer, then as the pre-norm one, around the
    norm; each bare when there is no norm around."""
    places = [(norm, form) for norm in norms for form in ("post-norm", "pre-norm")] or [(None, "bare")]
    return [(key, Around(w, norm, form)) for norm, form in places for key, w in readings]


def _taken_out(module: nn.Module, leaf: Leaf, whole: Callable[[], Tensor | None],
               bare: Callable[[], Tensor | None], same: Callable[[Tensor, Tensor], bool]) -> bool:
    """The norm `leaf` of `module` replaced by the identity in place, kept out where `same(whole(),
    bare())` (whole: the run with the norm, before; bare: with the identity), put back otherwise (their
    exception, or no tensor, included: the check that follows says why); whether it was taken out."""
    *path, last = leaf.name.split(".")
    holder = module.get_submodule(".".join(path))
    try:
        full = whole()
        setattr(holder, last, nn.Identity())
        out = same(full, bare())
    except Exception:  # noqa: BLE001  (theirs on check's input, or None where a tensor was wanted)
        out = False
    if not out:
        setattr(holder, last, leaf.module)
    return out


def norm_taken_out(module: nn.Module, norms: list[V.NormWeights], leaf: Leaf,
                   run: Callable[[], Tensor | None]) -> bool:
    """Whether `module` applies its norm last (jadore801120's attention: `q += residual; q =
    self.layer_norm(q)`): its output equals the reference norm of what it gives with that norm taken
    out (nn.Identity in its place). When it does, the norm is left out, so that what remains, the
    attention plus its query, is checked as an attention; otherwise the norm is put back. A norm it
    computes from its own parameters (the module itself) is not one to take out."""
    def same(full: Tensor, bare: Tensor) -> bool:
        return (full - V.norm(norms[0], bare)).abs().max().item() <= 1e-6 * max(1.0, full.abs().max().item())
    return leaf.module is not module and _taken_out(module, leaf, run, run, same)


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


@torch.no_grad()
def take_out_leading_norm(res: ComponentResult, module: nn.Module, width: int, run: Run) -> bool:
    """Where `module` begins with a norm of `width` and adds no residual (vit-pytorch's), the norm
    replaced by the identity in place (the rest of the check then grades the bare sublayer), a note
    said, and a finding where that norm is neither LayerNorm nor RMSNorm; whether it was taken out."""
    norms = [leaf for leaf in of_kind(leaves(module), "norm") if leaf.weight.shape[-1:] == (width,)]
    if len(norms) != 1 or norms[0].name == "(self)":
        return False
    name, norm = norms[0].name, norms[0].module
    x = torch.randn(2, 6, width, generator=torch.Generator().manual_seed(5)).to(norms[0].weight.dtype)
    if not _taken_out(module, norms[0], lambda: run(x), lambda: run(norm(x)),
                      lambda whole, bare: bare.shape == whole.shape and torch.allclose(bare, whole)):
        return False
    res.notes.append(text(
        f"it normalizes its input first ({name}) and adds no residual (its caller adds it): checked as "
        f"that norm followed by the sublayer, the sublayer compared with {name} taken out",
        f"它先对输入做归一化（{name}），内部不加残差（残差由调用方加）：按“归一化后接子层”检查，"
        f"子层在去掉 {name} 后比较"))
    res.findings += [_norm_finding(norm, wrong) for wrong in [norm_departure(norm, x)] if wrong is not None]
    return True


def _norm_finding(norm: nn.Module, wrong: str) -> Finding:
    """The finding for a norm taken out that is neither LayerNorm nor RMSNorm: `wrong`, the catalogued
    mistake it makes, or DEPARTS (quoted at the norm's call)."""
    lines = source_lines([type(norm)])
    number, code = locate(wrong, lines) if wrong != DEPARTS else first_line([r"(?i)norm\w*\("], lines)
    return Finding(wrong, text(
        "the norm it applies first is neither LayerNorm nor RMSNorm (with its own weight and a usual eps)",
        "它最先做的归一化既不是 LayerNorm 也不是 RMSNorm（用它自己的权重和常用的 eps）"), number, code)
