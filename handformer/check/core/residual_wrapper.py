"""A block whose residual is added outside it: the learner's file builds it inside a wrapper of its own
that adds the wrapped module's input back (lucidrains' PaLM: Residual(ParallelTransformerBlock(...)),
Residual.forward(x) = fn(x) + x). Such a block is checked as the file uses it, wrapped; the wrapper is
found by what it does, whatever its name.

Shape legend: B batch, T length, D width.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.result import Text, text
from handformer.check.core.source import source_text


class _Zero(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def residual_wrapper(cls: Any) -> Any:
    """The class of the learner's file that `cls` is built inside (`Residual(Block(`) and that adds
    its input back, fn(x) + x; None where there is none."""
    module = sys.modules.get(cls.__module__)
    names = re.findall(rf"\b(\w+)\(\s*{re.escape(cls.__name__)}\(", source_text(module))
    return next(filter(_adds_input, map(vars(module).get, names)), None)


def _adds_input(wrapper: Any) -> bool:
    """Whether wrapper(fn)(x) is fn(x) + x: x around a module of zeros, 2x around the identity."""
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))  # (B, T, D)
    try:
        outs = wrapper(_Zero())(x), wrapper(nn.Identity())(x)
        return bool(torch.allclose(torch.stack(outs), torch.stack([x, 2 * x])))
    except Exception:  # noqa: BLE001  (no wrapper of this form: a function, another class, a call that fails)
        return False


def wrapped_note(wrapper: type, name: str) -> Text:
    return text(f"checked as your file uses it, inside {wrapper.__name__}, which adds its input back "
                f"({wrapper.__name__}({name}(...))(x) = {name}(x) + x): the residual is the wrapper's",
                f"按你的文件的用法检查：放在 {wrapper.__name__} 里，它把输入加回去"
                f"（{wrapper.__name__}({name}(...))(x) = {name}(x) + x）：残差连接在外层")
