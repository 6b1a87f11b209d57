"""Token ids a generation loop never emits: it sets their logits to minus infinity by a constant index
(GPT2-Chinese's `next_token_logits[1] = -float('Inf')`, its [UNK]). Read from the loop's code; while
the loop is checked the model's logits at those ids are minus infinity too (`ban`), so the reference
(greedy decoding, the filters' kept tokens) never picks them and the loop's own ban changes nothing.

Shape legend: V vocabulary.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import math
import textwrap
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.defaults import quietly
from handformer.check.core.result import Text, text

BANNED: list[int] = []  # the ids of the loop being checked (`banning`)
HUGE = 1e4  # a constant this negative is minus infinity to a softmax: -1e9, -1e10, -float('inf')


def _minus_infinity(node: ast.AST) -> bool:
    """-float('inf'), float('-inf'), -math.inf, -torch.inf, -1e9."""
    text_of = ast.unparse(node).replace(" ", "").lower()
    if text_of in ("float('-inf')", 'float("-inf")'):
        return True
    inner = node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) else None
    if inner is None:
        return False
    value = inner.value if isinstance(inner, ast.Constant) else None
    return ast.unparse(inner).replace(" ", "").lower().endswith(("inf')", 'inf")', ".inf")) or (
        isinstance(value, (int, float)) and value >= HUGE)


def banned_ids(fn: Any) -> list[tuple[int, int]]:
    """(id, line) for each constant index the loop's code sets to minus infinity (`logits[1] = -inf`,
    `logits[:, 0] = float('-inf')`), in its file's line numbers."""
    lines, first = quietly(lambda: inspect.getsourcelines(fn), (OSError, TypeError), ([], 1))
    tree = quietly(lambda: ast.parse(textwrap.dedent("".join(lines))), (SyntaxError, ValueError), None)
    found = []
    for node in ast.walk(tree or ast.Module(body=[], type_ignores=[])):
        if not (isinstance(node, ast.Assign) and _minus_infinity(node.value)):
            continue
        for target in filter(ast.Subscript.__instancecheck__, node.targets):
            index = target.slice.elts[-1] if isinstance(target.slice, ast.Tuple) else target.slice
            if isinstance(index, ast.Constant) and type(index.value) is int and index.value >= 0:
                found.append((index.value, first + node.lineno - 1))
    return found


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
    ids = ", ".join(str(i) for i in sorted({i for i, _ in found}))
    lines = ", ".join(str(n) for n in sorted({n for _, n in found}))
    return [text(f"it never emits token id {ids} (it sets the logits there to minus infinity, line {lines}): "
                 "the model's logits there were minus infinity too, so the reference never picks it either",
                 f"它从不生成 token id {ids}（第 {lines} 行把那里的 logits 设为负无穷）：模型在那里的 logits "
                 "也设为负无穷，参考实现同样不会选它")] * bool(found)
