"""Token ids a generation loop never emits: it sets their logits to minus infinity by a constant index
(GPT2-Chinese's `next_token_logits[1] = -float('Inf')`, its [UNK]). Read from the loop's code; while
the loop is checked the model's logits at those ids are minus infinity too (`ban`), so the reference
(greedy decoding, the filters' kept tokens) never picks them and the loop's own ban changes nothing.

Shape legend: V vocabulary.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.defaults import quietly
from handformer.check.core.result import Text, text

BANNED: list[int] = []  # the ids of the loop being checked (`banning`)


# a constant index set to minus infinity: `logits[1] = -float('Inf')`, `logits[:, 0] = float('-inf')`,
# `x[..., 2] = -math.inf`, `logits[0] = -1e9` (-1e4 or less)
BAN = re.compile(r"\[(?:[^\]]*,\s*)?(\d+)\]\s*=\s*"  # the index: the last one of the subscript
                 r"(?:-\s*float\(\s*['\"]inf['\"]\s*\)|float\(\s*['\"]-inf['\"]\s*\)"
                 r"|-\s*(?:\w+\.)?inf\b"
                 r"|-\s*\d(?:\.\d+)?e\+?(?:\d\d+|[4-9])\b|-\s*\d{5,}(?:\.\d*)?)"
                 r"\s*(?:#.*)?$", re.I)


def banned_ids(fn: Any) -> list[tuple[int, int]]:
    """(id, line) for each constant index the loop's code sets to minus infinity (BAN), in its file's
    line numbers."""
    lines, first = quietly(lambda: inspect.getsourcelines(fn), Exception, ([], 1))
    return [(int(m[1]), n) for n, m in enumerate(map(BAN.search, lines), first) if m]


def ban(logits: Tensor) -> Tensor:
    """The logits (..., V) with the banned ids (those below V) at minus infinity."""
    ids = [i for i in BANNED if i < logits.size(-1)]
    return logits.index_fill(-1, torch.tensor(ids, dtype=torch.long), -math.inf) if ids else logits


@contextlib.contextmanager
def banning(found: list[tuple[int, int]]) -> Iterator[None]:
    """The ids of `found` banned for the time of the block (the ones banned before, after it)."""
    kept, BANNED[:] = BANNED[:], sorted({i for i, _ in found})
    try:
        yield
    finally:
        BANNED[:] = kept


def banned_note(found: list[tuple[int, int]]) -> list[Text]:
    """The report's note on the ids a loop bans (none where it bans none)."""
    ids, lines = (", ".join(map(str, sorted(set(column)))) for column in zip(*found or [((), ())]))
    return [text(f"it never emits token id {ids} (it sets the logits there to minus infinity, line {lines}): "
                 "the model's logits there were minus infinity too, so the reference never picks it either",
                 f"它从不生成 token id {ids}（第 {lines} 行把那里的 logits 设为负无穷）：模型在那里的 logits "
                 "也设为负无穷，参考实现同样不会选它")] * bool(found)
