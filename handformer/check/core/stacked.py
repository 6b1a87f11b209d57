"""Linear maps kept in another form, and what a tensor check does not map is, read from its form.

A Parameter (n, out, in) that stacks n projections (modded-nanogpt's qkv_w (3, D, D), a gate and up
(2, F, D)) is the rows of one fused projection (n * out, in): where the module's forward flattens it
on its first axis, or splits it there and hands each part to F.linear (or multiplies from the right,
`x @ W[i]`: stored (in, out)), it is reparametrized so that the module holds that (n * out, in)
matrix and computes exactly what it did. The mapping then reads it as it reads a fused qkv Linear.
A stack its forward routes (experts picked by a router) is a mixture of experts, never read so.

Whatever else is not mapped is named by its form (`described`): a convolution, stacked experts,
stacked projections in a form not read, per-channel vectors; never a family it is not.

Shape legend: n the stacked matrices, D d_model.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from handformer.check.core.defaults import quietly
from handformer.check.core.position_tables import forward_source, read_as

STACKS = {(3, 2), (3, 3), (3, 4)}  # (dimensions, matrices) of the stacks of projections a forward may read
ROUTED = re.compile(r"(?i)topk|top_k|router|expert")  # a stack whose forward picks experts
# how a forward reads a stacked parameter self.<name>: (its pattern, each matrix stored (in, out))
READINGS = ((r"{ref}\s*\.\s*flatten\(\s*(0\s*,\s*1|end_dim\s*=\s*1)\s*\)", False),  # qkv_w.flatten(end_dim=1)
            (r"F\.linear\([^()]*,\s*{ref}\s*\[\s*\d\s*\]", False),  # F.linear(x, self.W[0])
            (r"@\s*{ref}\s*\[\s*\d\s*\](?!\s*\.\s*(T\b|t\(|mT\b))", True))  # x @ self.W[0]


class Stacked(nn.Module):
    """The parametrization of n matrices (out, in) stacked (n, out, in): the module holds them as one
    (n * out, in), the rows of a fused projection; `transposed`: each stored (in, out), as `x @ W[i]`
    reads it (transpose(1, 1) leaves a stack as it is)."""

    def __init__(self, n: int, transposed: bool) -> None:
        super().__init__()
        self.n, self.transposed = n, transposed

    def forward(self, weight: Tensor) -> Tensor:
        return weight.unflatten(0, (self.n, -1)).transpose(1, 1 + self.transposed)  # (n, out, in)

    def right_inverse(self, weight: Tensor) -> Tensor:
        return weight.transpose(1, 1 + self.transposed).flatten(0, 1)  # (n * out, in)


def _forward_source(sub: nn.Module) -> str:
    return quietly(lambda: inspect.getsource(type(sub).forward)) or ""


def reading(sub: nn.Module, name: str, p: Tensor) -> bool | None:
    """How the module's forward reads its 3-D parameter `name` as stacked projections (`READINGS`):
    False where it flattens it on its first axis or hands its parts to F.linear (each (out, in)), True
    where it multiplies its parts from the right (`x @ self.W[i]`: each (in, out)); None for any other
    reading, or two, for any but 2 to 4 matrices, and for a stack its forward routes (experts)."""
    source = _forward_source(sub) if (p.dim(), *p.shape[:1]) in STACKS else ""  # none read for no stack
    ref = rf"self\.{re.escape(name)}\b"
    found = {transposed for pattern, transposed in READINGS if re.search(pattern.format(ref=ref), source)}
    routed = ROUTED.search(f"{source} {name} {type(sub).__name__}")
    return None if routed or len(found) != 1 else found.pop()


def unstack_(module: nn.Module) -> list[str]:
    """Each 3-D parameter of n <= 4 stacked projections its module's forward reads as such
    (`reading`) reparametrized as one (n * out, in) matrix (`Stacked`); their names."""
    found = []
    for label, sub in list(module.named_modules()):
        for name, p in list(sub.named_parameters(recurse=False)):
            transposed = reading(sub, name, p)
            if transposed is not None:
                parametrize.register_parametrization(sub, name, Stacked(p.size(0), transposed), unsafe=True)
                found.append(f"{label}.{name}".lstrip("."))
    return found


def _stack(module: nn.Module, name: str) -> Stacked | None:
    held = dict(getattr(module, "parametrizations", {}).items()).get(name, [None])[0]  # (one a parameter)
    return held if isinstance(held, Stacked) else None


def stacked_names(sub: nn.Module) -> list[str]:
    """The parameters of the module reparametrized by `unstack_`."""
    return [n for n in dict(getattr(sub, "parametrizations", {}).items()) if _stack(sub, n)]


def stacked_part(module: nn.Module, name: str, rows: object) -> str | None:
    """How the report names the rows of a stacked projection a role takes: the matrix of the stack
    (`qkv_w[0]`, `W[1].T` for one stored (in, out)); None for a parameter not stacked, or rows that
    are not a slice of it (the stack's matrices are alike: a role's slice is one of them)."""
    stack = _stack(module, name)
    if stack is None or not isinstance(rows, slice):
        return None
    out = module.parametrizations[name].original.size(0) // stack.n  # the rows of one matrix
    return f"{name}[{rows.start // out}]" + ".T" * stack.transposed


def _convolution(sub: nn.Module, shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    if not isinstance(sub, nn.modules.conv._ConvNd):
        return None
    kind, kernel = type(sub).__name__, "x".join(map(str, sub.kernel_size))
    if sub.groups == sub.in_channels > 1:
        return (f"a depthwise convolution ({kind}, kernel {kernel}: one filter a channel, mixing nearby "
                "positions), which handformer's blocks have not",
                f"逐通道卷积（{kind}，卷积核 {kernel}：每个通道一个滤波器，混合相邻位置），"
                "handformer 的块里没有")
    return (f"a convolution ({kind}, kernel {kernel}), which handformer's blocks have not",
            f"卷积（{kind}，卷积核 {kernel}），handformer 的块里没有")


def _experts(sub: nn.Module, shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    words = f"{type(sub).__name__} {' '.join(shapes)} {_forward_source(sub)}"
    if 3 not in map(len, shapes.values()) or not ROUTED.search(words):
        return None
    return ("experts of a mixture of experts stacked one tensor for all of them and picked by a router "
            "(gpt-oss's MLPBlock), which handformer does not compare",
            "所有专家叠在一个张量里、由路由器挑选的混合专家（gpt-oss 的 MLPBlock），"
            "handformer 不比较这种写法")


def _prepended(sub: nn.Module, shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    """A learned [CLS] vector (1, 1, D) the forward concatenates in front of the tokens (ViT's and a text
    classifier's `torch.cat([cls, x], dim=1)`), read as `position_tables.read_as` reads a table."""
    source = forward_source(sub)
    front = r"cat\(\s*[\[(]\s*({})\b"  # torch.cat([cls, x], ...), torch.cat((cls_tokens, x), ...)
    named = ", ".join(f"{n} {s}" for n, s in shapes.items()
                      if s[:-1] == (1, 1) and re.search(front.format("|".join(read_as(source, n))), source))
    return (f"a learned [CLS] vector ({named}) put in front of the tokens (torch.cat at position 0), as an "
            "encoder classifier's is; a decoder-only model has none: name the class as a classifier "
            "(--component classifier=...)",
            f"放在 token 前面的可学习 [CLS] 向量（{named}，用 torch.cat 放在位置 0），编码器分类模型才有；"
            "decoder-only 模型没有：请把这个类当作分类模型检查（--component classifier=...）"
            ) if named else None


# tensors named by their shapes alone: (which shapes, what they are (en, zh), the tensors put in {})
SHAPED = ((lambda s: len(s) == 3 and 2 <= s[0] <= 4 < s[1],
           "stacked projections ({}: a few matrices in one tensor) in a form check does not read: it reads "
           "one flattened on its first axis, or split there and handed to F.linear or multiplied as x @ W[i]",
           "叠在一起的投影矩阵（{}：几个矩阵放在一个张量里），写法检查程序读不出：它能读的是在第一维上展平的，"
           "或者在第一维上拆开、交给 F.linear 或者写成 x @ W[i] 的"),
          (lambda s: len(s) >= 2 and max(s[:-1]) == 1,
           "per-channel vectors kept with leading axes of one ({}), mixed into the inputs, which "
           "handformer's blocks have not",
           "前几维为 1 的逐通道向量（{}），混进输入里，handformer 的块里没有"))


def _shaped(sub: nn.Module, shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    for fits, en, zh in SHAPED:
        named = ", ".join(f"{n} {s}" for n, s in shapes.items() if fits(s))
        if named:
            return en.format(named), zh.format(named)
    return None


# the forms an unmapped module is recognised by, first match wins: (en, zh) of what it is
FORMS: list[Callable[[nn.Module, dict[str, tuple[int, ...]]], tuple[str, str] | None]] = [
    _convolution, _experts, _prepended, _shaped]


def described(sub: nn.Module, params: dict[str, nn.Parameter]) -> tuple[str, str] | None:
    """What a module of parameters check does not map is, from its form (`FORMS`); its weights'
    dimensions where no form fits and one has more than two; None for matrices and vectors alone."""
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    most = max(map(len, shapes.values()), default=0)
    said = next(filter(None, (form(sub, shapes) for form in FORMS)), None)
    dims = (f"{most}-D weights, which handformer does not compare",
            f"{most} 维权重，handformer 不比较这种写法")
    return said or (dims if most > 2 else None)


@torch.no_grad()
def multiplies(sub: nn.Module, params: dict[str, nn.Parameter]) -> bool:
    """A module of one vector whose forward multiplies its input by it, channel by channel (timm's
    LayerScale: x * self.gamma): a gain, not a norm."""
    gain = next(iter(params.values()))
    x = torch.randn(2, 3, gain.numel(), generator=torch.Generator().manual_seed(4), dtype=gain.dtype)
    out = quietly(lambda: sub(x))
    return len(params) == 1 and getattr(out, "shape", None) == x.shape and bool(torch.allclose(out, x * gain))


def multiplied_whole(sub: nn.Module, name: str) -> bool:
    """A bare vector the module's forward multiplies a sublayer's output by, whole (`self.gamma_1 *
    self.attn(h)`, `self.mlp(h) * self.gamma_2`); nanochat's `self.resid_lambdas[i] * x` is indexed:
    a scalar a layer."""
    ref = rf"self\.{re.escape(name)}\b(?!\s*[\[.(])"
    return bool(re.search(rf"{ref}\s*\*\s*self\.\w+\(|\)\s*\*\s*{ref}", _forward_source(sub)))
