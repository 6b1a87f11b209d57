"""Whether a block's forward is written in sequence where it computes in parallel.

A parallel block (GPT-J's, GPT-NeoX's, Falcon's, Phi's) feeds both sublayers the block's input:
x + attn(norm_1(x)) + ffn(norm_2(x)). A sequential block feeds the FFN the attention's residual sum.
Written `h = x + self.attn(self.attn_norm(x))` then `out = h + self.ffn(self.ffn_norm(x))`, the code adds
the FFN to the residual sum h, as a sequential block does, but hands the FFN the block's input x: it
computes a parallel block, and the line that calls the FFN is where it parts from the sequence it
writes. A parallel block as its authors write it forms no residual sum before its second sublayer.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from torch import nn

from handformer.check.core.result import DEPARTS, Finding, text


def sequence_findings(module: nn.Module) -> list[Finding]:
    """A block found parallel whose forward is written in sequence (sequence_broken): the line that
    hands its second sublayer the block's input, as where it parts from the sequence; none otherwise."""
    found = sequence_broken(type(module).forward)
    if found is None:
        return []
    return [Finding(DEPARTS, text(
        "the sublayer called at this line reads the block's input, not the residual sum made before it, "
        "and its output is added to that sum as a sequential block's is: the block computes x + "
        "attn(norm(x)) + ffn(norm(x)), a parallel block, where its code is written in sequence",
        "这一行调用的子层读的是 Block 的输入，而不是前面算好的残差和，"
        "它的输出却像顺序 Block 那样加到这个和上：Block 算的是并行的 x + attn(norm(x)) + ffn(norm(x))，"
        "而代码是按顺序写的"), *found)]


def sequence_broken(forward: Any) -> tuple[int, str] | None:
    """(line, code) of the first call of one of the module's parts that, after a residual sum was made
    (the input plus a part's output), still reads the input (or a part's output on it), where what it
    computes is then added to that sum by its name; None where there is none, or no source. Each name
    the forward binds holds a kind (_kind)."""
    try:
        lines, start = inspect.getsourcelines(forward)
    except (OSError, TypeError):
        return None
    fn = ast.parse(textwrap.dedent("".join(lines))).body[0]
    held: dict[str, str | int] = {arg.arg: INPUT for arg in fn.args.args[1:2]}  # x, hidden_states
    for node in fn.body:
        terms = _terms(getattr(node, "value", None) or ast.Constant(None))
        kinds = [_kind(t, held, start + node.lineno - 1) for t in terms]
        stale = [k for k in kinds if type(k) is int and k]  # parts' outputs on the input after a sum
        if SUM in [held.get(getattr(t, "id", ""), 0) for t in terms] and stale:  # h + ...: a sum by its name
            return min(stale), lines[min(stale) - start].strip()
        for target in getattr(node, "targets", [])[:1]:  # a residual sum: the input and a part's output
            summed = SUM in kinds or INPUT in kinds and len(kinds) > 1
            held[getattr(target, "id", "")] = SUM if summed else kinds[0]
    return None


INPUT, SUM, BEFORE = "input", "sum", "before"


def _kind(term: ast.expr, held: dict[str, str | int], line: int) -> str | int:
    """SUM where the term reads a residual sum; the line of the first call of a part that read the
    input after a sum was made (the term reads it, or is it); BEFORE for a part's output on the input
    before any sum (the first sublayer's); INPUT for the input itself; 0 for anything else."""
    kinds = {held[n] for n in _names(term) & held.keys()}
    stale = [k for k in kinds if type(k) is int and k]
    on_input = _calls_self(term) and bool(kinds & {INPUT, BEFORE})
    after = (BEFORE, line)[SUM in held.values()]  # a sum made already: this call is where it departs
    return SUM if SUM in kinds else min(stale, default=after if on_input else KEPT.get(frozenset(kinds), 0))


KEPT = {frozenset({INPUT}): INPUT, frozenset({BEFORE}): BEFORE}  # a term that only passes its kind on


def _terms(node: ast.expr) -> list[ast.expr]:
    """The operands of a chain of additions: a + b + c -> [a, b, c]."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _names(node: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _calls_self(node: ast.expr) -> bool:
    """Whether the term calls one of the module's own parts (`self.mlp(...)`, `self.ffn.forward(...)`)."""
    return any(isinstance(n, ast.Call) and "self" in _names(n.func) for n in ast.walk(node))
