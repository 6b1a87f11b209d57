"""A sliding window that an attention's or a block's forward takes with no default (nanochat's
`forward(x, ve, cos_sin, window_size, kv_cache)`, its window flash-attention's (left, right)): handed
one that covers every sequence check drives, so that the attention is causal over the whole
sequence, as a long (full-context) layer of the file is. Its form is the file's: a pair (left, right)
where the file indexes the window or calls it one, else a number."""

from __future__ import annotations

import inspect
import re
from typing import Any

from handformer.check.core.result import Text, text
from handformer.check.core.source import source_text

WIDE = 1 << 12  # more positions than any sequence check drives (its longest, a few dozen)


def window_inputs(fn: Any, params: list[inspect.Parameter]) -> dict[str, Any]:
    """{name: a window over the whole sequence} for each parameter after the first that names a
    window and has no default."""
    names = [p.name for p in params[1:] if p.default is p.empty and "window" in p.name.lower()]
    owner = inspect.getmodule(fn.forward if hasattr(fn, "forward") else fn)
    file = source_text(owner) if owner is not None else ""
    return {n: (WIDE, 0) if re.search(rf"\b{n}\[0\]|\(left,\s*right\)", file) else WIDE for n in names}


def window_note(windows: dict[str, Any]) -> list[Text]:
    """A note for each window handed (none when none was)."""
    return [text(f"{name} has no default: handed {value}, a window wider than every sequence check drives, "
                 "so the attention is causal over the whole sequence (a full-context layer)",
                 f"{name} 没有默认值：传入 {value}，窗口比检查用的每个序列都长，所以注意力在整个序列上"
                 "都是因果的（全上下文的层）") for name, value in windows.items()]
