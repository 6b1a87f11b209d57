"""A sublayer that normalizes its own input first and adds no residual, the caller adding it
(lucidrains' vit-pytorch: Attention begins with x = self.norm(x); FeedForward is
nn.Sequential(nn.LayerNorm(dim), nn.Linear, ...); the Transformer writes x = attn(x) + x). It is checked
as norm then sublayer: the norm must be LayerNorm or RMSNorm on the learner's own weights, and with the
norm taken out the sublayer is compared with handformer's attention or FFN, as any other. The norm is
found by what the module computes, whatever its name: the one norm of the model's width whose removal
leaves run(x) equal to the bare module on norm(x).

Shape legend: B batch, T length, D width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from handformer.check.core.result import DEPARTS, ComponentResult, Finding, text
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.core.sublayer import norm_departure
from handformer.check.core.weights import leaves, of_kind

Run = Callable[[Tensor], Tensor | None]  # the module on an input (B, T, D): its first tensor out


@torch.no_grad()
def take_out_leading_norm(res: ComponentResult, module: nn.Module, width: int, run: Run) -> bool:
    """Where `module` begins with a norm of `width` and adds no residual, the norm replaced by the
    identity in place (the rest of the check then grades the bare sublayer), a note said, and a
    finding where that norm is neither LayerNorm nor RMSNorm; whether it was taken out."""
    norms = [leaf for leaf in of_kind(leaves(module), "norm") if leaf.weight.shape[-1:] == (width,)]
    if len(norms) != 1 or norms[0].name == "(self)":
        return False
    name, norm = norms[0].name, norms[0].module
    x = torch.randn(2, 6, width, generator=torch.Generator().manual_seed(5)).to(norms[0].weight.dtype)
    *path, last = name.split(".")
    holder = module.get_submodule(".".join(path))
    try:
        whole = run(x)
        setattr(holder, last, nn.Identity())
        bare = run(norm(x))
    except Exception:  # noqa: BLE001  (the learner's module on check's input: the usual check says why)
        bare = whole = None
    if whole is None or bare is None or bare.shape != whole.shape or not torch.allclose(bare, whole):
        setattr(holder, last, norm)
        return False
    res.notes.append(text(
        f"it normalizes its input first ({name}) and adds no residual (its caller adds it): checked as "
        f"that norm followed by the sublayer, the sublayer compared with {name} taken out",
        f"它先对输入做归一化（{name}），内部不加残差（残差由调用方加）：按“归一化后接子层”检查，"
        f"子层在去掉 {name} 后比较"))
    _norm_finding(res, norm, x)
    return True


def _norm_finding(res: ComponentResult, norm: nn.Module, x: Tensor) -> None:
    """A finding where the norm taken out is neither LayerNorm nor RMSNorm (its own gain, a usual eps)."""
    wrong = norm_departure(norm, x)
    if wrong is None:
        return
    lines = source_lines([type(norm)])
    number, code = locate(wrong, lines) if wrong != DEPARTS else first_line([r"(?i)norm\w*\("], lines)
    res.findings.append(Finding(wrong, text(
        "the norm it applies first is neither LayerNorm nor RMSNorm (with its own weight and a usual eps)",
        "它最先做的归一化既不是 LayerNorm 也不是 RMSNorm（用它自己的权重和常用的 eps）"), number, code))
