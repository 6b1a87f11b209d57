"""An attention sublayer: a module of the learner's file that holds its attention and adds a norm and
the residual around it. T5's layer: x + attn(norm(x)) (pre-norm); BERT's attention wrapper:
norm(x + W_O(attn(x))) (post-norm, W_O and the norm in a sibling module). It is checked by what it
adds around its attention: the attention (checked as its own component) is stood in for by a fixed
map f, and the output is compared with the pre-norm and post-norm forms computed with the module's
own norm and output projection, then with the catalogued ways a residual goes wrong.

Shape legend: B batch, T length, D width.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.context import finish
from handformer.check.core.fingerprint import first_tensor
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.reference import variants as V

Map = Callable[[Tensor], Tensor]
Form = Callable[[Tensor, Map, Map], Tensor]  # the output from x, the map g the residual adds, the norm
FORMS: dict[str, Form] = {
    "pre-norm": lambda x, g, n: x + g(n(x)),
    "post-norm": lambda x, g, n: n(x + g(x)),
}
# (the catalogued mistake, its form): what the output equals instead
MISTAKES: dict[tuple[str, str], Form] = {
    ("residual_from_normed", "attn"): lambda x, g, n: n(x) + g(n(x)),
    ("no_residual", "attn"): lambda x, g, n: g(n(x)),
    ("no_residual", "post"): lambda x, g, n: n(g(x)),
}


EPS = (1e-5, 1e-6, 1e-8, 1e-12)  # the usual eps of nn.LayerNorm, Llama's and T5's RMSNorm, BERT's


# what a sublayer's norm may compute, each as (the reference's norm, the catalogued mistake it makes or
# ""), with a gain of one: LayerNorm or RMSNorm, then the catalogued ways an RMSNorm goes wrong
NORM_FORMS = {"layernorm": ("layernorm", ""), "rmsnorm": ("rmsnorm", ""),
              "rmsnorm_sum_squares": ("rmsnorm", "rmsnorm_sum_squares"),
              "rmsnorm_no_sqrt": ("rmsnorm", "rmsnorm_no_sqrt")}
PLAIN_NORMS, NORM_MISTAKES = list(NORM_FORMS)[:2], list(NORM_FORMS)[2:]


def _normed(x: Tensor, kind: str, mistake: str, eps: float) -> Tensor:
    """variants.norm of x with a gain of one and no bias, making `mistake` (when one is named)."""
    weights = V.NormWeights(torch.ones((), dtype=x.dtype), None, eps, kind)
    return V.norm(weights, x, frozenset({mistake} - {""}))


@torch.no_grad()
def norm_departure(norm: nn.Module, x: Tensor) -> str | None:
    """None where the sublayer's norm is LayerNorm or RMSNorm (its own gain and bias, a usual eps); else
    the catalogued RMSNorm mistake it makes, or DEPARTS."""
    gains = [p.double() for p in norm.parameters(recurse=False)]
    weight, bias = (gains + [1.0, 0.0][len(gains):])[:2]
    pure = (norm(x.to(gains[0].dtype)).double() - bias) / weight
    near = {name: any(torch.allclose(_normed(x.double(), *form, eps), pure, atol=1e-4, rtol=1e-4)
                      for eps in EPS) for name, form in NORM_FORMS.items()}
    return None if any(map(near.get, PLAIN_NORMS)) else next(filter(near.get, NORM_MISTAKES), DEPARTS)


@dataclass
class Sublayer:
    """Where the attention sits in the module, and what the module adds around it."""

    attention: str  # the attention's dotted name in the module
    norm: nn.Module
    projection: nn.Module  # W_O outside the attention (BERT's SelfOutput.dense), or the identity


def sublayer_parts(module: nn.Module, computes_attention: Callable[[Any], bool], width: int,
                   ) -> Sublayer | None:
    """The attention sublayer `module` is: one child of the learner's file that computes attention,
    one norm of `width` and at most one nn.Linear(width, width) besides, nothing else; or None."""
    own = type(module).__module__
    inner = [n for n, m in module.named_modules() if n and type(m).__module__ == own
             and computes_attention(type(m))]
    top = (inner + ["\0"])[0]  # "\0": no attention inside
    outside = [m for n, m in module.named_modules() if not (n + ".").startswith(top + ".")]
    norms = [m for m in outside if "norm" in type(m).__name__.lower() and _widths(m) == {width}]
    linears = [m for m in outside if isinstance(m, nn.Linear) and m.weight.shape == (width, width)]
    counted = list(map(module.get_submodule, inner[:1])) + norms + linears
    whole = inner and len(norms) == 1 and len(linears) < 2 and _size(module) == sum(map(_size, counted))
    return Sublayer(inner[0], norms[0], (linears + [nn.Identity()])[0]) if whole else None


def _size(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _widths(m: nn.Module) -> set[int]:
    return {p.shape[-1] for p in m.parameters(recurse=False)}


class StandIn(nn.Module):
    """The attention's place taken by a fixed map of its first input of the model's width: tanh(h A);
    returned first of a pair (an attention that also hands back its weights or bias), or alone."""

    def __init__(self, width: int, paired: bool) -> None:
        super().__init__()
        self.a = torch.randn(width, width, generator=torch.Generator().manual_seed(3)) / width ** 0.5
        self.paired, self.width = paired, width

    def f(self, h: Tensor) -> Tensor:
        return torch.tanh(h @ self.a.to(h.dtype))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        y = self.f(next(a for a in [*args, *kwargs.values()] if isinstance(a, Tensor)))
        return (y, None) if self.paired else y


def run_stood_in(module: nn.Module, parts: Sublayer, x: Tensor) -> tuple[Tensor, Map]:
    """The module's output on x (B, T, D) with its attention stood in for, and the map g the
    residual adds (the stand-in, then W_O where the module holds it outside the attention)."""
    *path, last = parts.attention.split(".")
    holder = module.get_submodule(".".join(path))
    kept = getattr(holder, last)
    try:  # a pair first: a tensor of batch 3 unpacked in two raises
        return _stood_in(module, holder, last, parts, x, True)
    except Exception:  # noqa: BLE001  (its wrapper takes the attention's output alone)
        return _stood_in(module, holder, last, parts, x, False)
    finally:
        setattr(holder, last, kept)


def _stood_in(module: nn.Module, holder: nn.Module, last: str, parts: Sublayer, x: Tensor, paired: bool,
              ) -> tuple[Tensor, Map]:
    stand = StandIn(x.shape[-1], paired)
    setattr(holder, last, stand)
    params = list(inspect.signature(module.forward).parameters.values())[1:]
    required = [None for p in params if p.default is p.empty and p.kind <= p.POSITIONAL_OR_KEYWORD]
    out = first_tensor(module(x, *required))
    if out.shape != x.shape:
        raise ValueError(f"the sublayer's output has shape {tuple(out.shape)}, not its input's")
    return out, lambda h: parts.projection(stand.f(h))


@torch.no_grad()
def sublayer_form(module: nn.Module, parts: Sublayer, x: Tensor) -> tuple[str, str, float]:
    """(the form the output matches, "" or the mistake's form, the largest difference from the
    nearest correct form): "pre-norm" or "post-norm", a catalogued mistake, or "departs"."""
    out, g = run_stood_in(module, parts, x)
    forms = [*FORMS.items(), *MISTAKES.items()]
    diffs = {k: (f(x, g, parts.norm) - out).abs().max().item() for k, f in forms}
    best = min(FORMS, key=diffs.__getitem__)
    scale = 1e-5 * max(1.0, out.abs().max().item())
    if diffs[best] <= scale:
        return best, "", diffs[best]
    mistake = next((k for k in MISTAKES if diffs[k] <= scale), ("departs", ""))
    return mistake[0], mistake[1], diffs[best]


def grade_sublayer(res: ComponentResult, comp: Any, module: nn.Module, parts: Sublayer) -> ComponentResult:
    """The result for an attention sublayer: PASS as pre-norm or post-norm, else a finding (a
    catalogued residual or norm mistake, or where it departs) on a line of the module's own code."""
    width = next(iter(_widths(parts.norm)))
    x = torch.randn(3, 5, width, generator=torch.Generator().manual_seed(2))  # (B, T, D)
    x = x.to(next(module.parameters()).dtype)
    res.mapping = [f"{parts.attention} -> the attention (checked as its own component)", "norm -> norm"] + [
        "W_O -> W_O"] * isinstance(parts.projection, nn.Linear)
    res.notes.append(text(
        f"an attention sublayer: its attention {parts.attention} was stood in for by a fixed map f, and "
        f"what {comp.name} adds around it was compared with x + f(norm(x)) (pre-norm) and norm(x + f(x)) "
        "(post-norm)",
        f"注意力子层：其中的注意力 {parts.attention} 换成一个固定的映射 f，{comp.name} 在它外面做的计算与 "
        "x + f(norm(x))（Pre-Norm）和 norm(x + f(x))（Post-Norm）比较"))
    wrong_norm = norm_departure(parts.norm, x)
    if wrong_norm is not None:
        number, code = _line(wrong_norm, source_lines([type(parts.norm)]))
        res.findings.append(Finding(wrong_norm, text(
            "its norm is neither LayerNorm nor RMSNorm (with its own weight and a usual eps)",
            "它的归一化既不是 LayerNorm 也不是 RMSNorm（用它自己的权重和常用的 eps）"), number, code))
        return finish(res)
    form, variant, diff = sublayer_form(module, parts, x)
    if form in FORMS:
        res.max_abs_error = diff
        res.checks.append(Check(text(
            f"the residual and the norm around the attention: {form} (max abs error {diff:.1e})",
            f"注意力外面的残差和归一化：{form}（最大绝对误差 {diff:.1e}）"), True))
        return finish(res)
    attention = module.get_submodule(parts.attention)
    number, code = _line(form, source_lines([type(m) for m in module.modules() if m is not attention
                                             and type(m).__module__ == type(module).__module__]))
    res.findings.append(Finding(form, text(
        f"with its attention stood in for by a fixed map f, the output is neither x + f(norm(x)) nor "
        f"norm(x + f(x)) (off by {diff:.3g})",
        f"把注意力换成固定映射 f 后，输出既不是 x + f(norm(x))，也不是 norm(x + f(x))（相差 {diff:.3g}）"),
        number, code, variant))
    return finish(res)


def _line(name: str, lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The catalogued mistake's line, or for DEPARTS the first line that adds or calls a norm."""
    return locate(name, lines) if name != DEPARTS else first_line([r"\+", r"(?i)norm\w*\("], lines)
