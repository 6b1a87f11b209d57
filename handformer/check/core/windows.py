"""A sliding window that an attention's or a block's forward takes with no default (nanochat's
`forward(x, ve, cos_sin, window_size, kv_cache)`, its window flash-attention's (left, right)): handed
one that covers every sequence check drives, so that the attention is causal over the whole
sequence, as a long (full-context) layer of the file is. Its form is the file's: a pair (left, right)
where the file indexes the window or calls it one, else a number."""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import first_line, source_lines, source_text
from handformer.check.reference import variants as V

WIDE = 1 << 12  # more positions than any sequence check drives (its longest, a few dozen)


def window_inputs(fn: Any, params: list[inspect.Parameter]) -> dict[str, Any]:
    """{name: a window over the whole sequence} for each parameter after the first that names a
    window and has no default."""
    names = [p.name for p in params[1:] if p.default is p.empty and "window" in p.name.lower()]
    file = source_text(inspect.getmodule(getattr(fn, "forward", fn)))  # "" where it has no module
    return {n: (WIDE, 0) if re.search(rf"\b{n}\[0\]|\(left,\s*right\)", file) else WIDE for n in names}


def window_note(windows: dict[str, Any]) -> list[Text]:
    """A note for each window handed (none when none was)."""
    return [text(f"{name} has no default: handed {value}, a window wider than every sequence check drives, "
                 "so the attention is causal over the whole sequence (a full-context layer)",
                 f"{name} 没有默认值：传入 {value}，窗口比检查用的每个序列都长，所以注意力在整个序列上"
                 "都是因果的（全上下文的层）") for name, value in windows.items()]


WINDOW_T = 12  # tokens a window is measured on: a window of 12 or more is a full causal mask here


def own_window(run: Callable[[Tensor], Tensor | None], width: int) -> int | None:
    """The sliding window W of the causal mask a layer builds itself (Mistral's, Gemma 2's local
    layers: i - W < j <= i), measured on (1, WINDOW_T, width) inputs as the outputs that changing
    token 0 moves (0..W-1, none after); None where it sees every earlier token or does not run."""
    x = fp.randn(1, WINDOW_T, width, seed=5)
    y = x.clone()
    y[:, 0] += fp.randn(width, seed=6)  # not a constant: a LayerNorm first would take it away
    try:
        with torch.no_grad():
            a, b = run(x), run(y)
        moved = (a - b).abs().amax(-1)[0] > 1e-9  # (T,): the outputs token 0 reaches
    except Exception:  # noqa: BLE001 - their error: the checks run it and report it
        return None
    reach = int(moved.sum())
    return reach if 0 < reach == int(moved.int().cumprod(0).sum()) < WINDOW_T else None


@functools.lru_cache(maxsize=64)
def window_keep(T: int, window: int | None, flags: frozenset[str] = frozenset()) -> Tensor:
    """(T, T) bool, True = may attend: a causal mask (off by one as `flags` say) in its sliding window
    (j > i - W), if any (the same tensor each time: never written to)."""
    band = torch.ones(T, T, dtype=torch.bool).triu(1 - (window or T))
    return V.causal_keep(T, flags) & band


def window_found(res: ComponentResult, module: nn.Module, reach: int) -> None:
    """The note of a sliding window measured, and its check against the window the module's settings
    name (`declared_window`)."""
    declared_window(res, module, reach)
    res.notes.append(text(
        f"its own causal mask is a sliding window: each token sees its last {reach} tokens (changing "
        f"token 0 moves outputs 0..{reach - 1} only); compared with handformer under the same window",
        f"它自己构造的因果掩码是滑动窗口：每个 token 只看到最近的 {reach} 个 token（改变位置 0 的 token，"
        f"只有位置 0..{reach - 1} 的输出变化）；与 handformer 在同样的窗口下比较"))


def declared_window(res: ComponentResult, module: nn.Module, reach: int) -> None:
    """The window a module's own settings name (Mistral's config.sliding_window: an int whose name
    says window, on the module, its submodules or an object they hold: its config) against the keys its
    mask lets a query see: a window off by one fails here, quoting the line that bands the mask."""
    held = [o for sub in module.modules() for o in (sub, *vars(sub).values())]  # gpt-oss's: in its attention
    named = [(n, v) for o in held for n, v in getattr(o, "__dict__", {}).items()
             if "window" in n.lower() and type(v) is int and v > 0]
    if not named:
        return
    name, size = named[0]
    res.checks.append(Check(text(f"each token sees its last {name} = {size} tokens, as its settings say",
                                 f"每个 token 看到最近的 {name} = {size} 个 token，和它的设置一致"),
                            reach == size, text(f"its mask lets each token see its last {reach}",
                                                f"它的掩码让每个 token 看到最近的 {reach} 个")))
    number, code = first_line(WINDOW_LINES, source_lines([sys.modules[type(module).__module__]]))
    res.findings += [Finding(DEPARTS, text(
        f"its mask lets each token see its last {reach} tokens where {name} = {size}: the window is off by "
        f"{reach - size}", f"它的掩码让每个 token 看到最近的 {reach} 个 token，而 {name} = {size}：窗口差了 "
        f"{reach - size}"), number, code)] * (reach != size and number is not None)


# the line that bands the mask: a tril or triu by the window, else a comparison with it
WINDOW_LINES = (r"(tril|triu)\(.*window|window.*(tril|triu)\(", r"window\w*\s*[<>+-]|[<>+-]=?\s*[\w.]*window")
