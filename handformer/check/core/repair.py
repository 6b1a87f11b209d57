"""Where a failing component's mistake is made, found by repairing it: one small edit at a time.

    repaired(result, comp, ctx, rerun)   # a FAIL no catalogued mistake names: its finding quotes the
                                         # one line whose edit makes the component match

A departure (localize.py) is the line where the difference shows, which is not always where it is
made: `update_fn(p, grad, m, lr, wd, beta2, beta1)` shows at the line inside update_fn that reads
`beta1`. Here each site of the component's own lines (and the functions and classes it reads) gets
one edit from a fixed library, `EDITS`: two arguments of a call swapped, a dim moved to its
neighbour, a comparison or a sign flipped, `triu` for `tril`, a slice bound or an index moved by
one, `sqrt(d)` for `d`, `+` for `-`, one term of a sum dropped, two names of a line swapped, an
in-place op made out-of-place, a `.detach()` removed, `log2` for `log`. The edited definition is
compiled at its own lines, put in the learner's module in place of theirs, and the component's check
runs again (on the same inputs and weights, no mistake searched for); the original is put back.
When the edits that make it PASS all sit on one line, the finding quotes that line and the edit. A
repair never changes the status: it only names the line.
"""

from __future__ import annotations

import ast
import copy
import inspect
import linecache
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from handformer.check.core.deadline import TrainerTimeout, deadline
from handformer.check.core.result import DEPARTS, FAIL, PASS, ComponentResult, Finding, text
from handformer.check.core.source import parsed_file

MOST = 60  # candidates tried for one component
SECONDS = 3.0  # CPU seconds spent on one component's repairs
WALL = 8.0  # and at most these seconds of wall clock (a busy machine: the sandbox's step limit is 20 s)
ONE_RUN = 1.0  # seconds one repaired run may take (an edit may make a loop run on)
LATE = 8.0  # seconds into a component's check after which no repair starts

NEIGHBOURS = {-1: (-2,), -2: (-1, -3), -3: (-2,), 0: (1,), 1: (2, 0), 2: (1, 3), 3: (2,)}  # a dim's
BY_ONE = {k: (k - 1, k + 1) for k in range(-4, 5)}  # a diagonal, a slice bound or an index moved by one
# calls whose integer arguments are dimensions (or a diagonal), and keywords that are
DIM_CALLS = {"transpose", "swapaxes", "softmax", "log_softmax", "sum", "mean", "var", "std", "argmax", "max",
             "min", "cat", "stack", "unsqueeze", "squeeze", "chunk", "split", "cumsum", "topk", "sort",
             "amax", "logsumexp", "norm", "gather", "flip", "roll", "size", "cumprod", "diff"}
POSITIONAL = {**dict.fromkeys(DIM_CALLS, NEIGHBOURS), "triu": BY_ONE, "tril": BY_ONE}
KEYWORDS = {"dim": NEIGHBOURS, "axis": NEIGHBOURS, "dims": NEIGHBOURS, "diagonal": BY_ONE, "offset": BY_ONE}
OTHER_OP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
            ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Lt: ast.LtE, ast.LtE: ast.Lt}
# a name or method for its pair; an in-place op for its out-of-place one
OTHER_NAME = {"triu": "tril", "tril": "triu", "log": "log2", "log2": "log",
              **{op + "_": op for op in ("mul", "add", "sub", "div", "addcmul", "addcdiv", "lerp", "clamp",
                                         "sign", "neg", "exp", "sqrt", "pow", "masked_fill", "copy")}}
UNWRAPPED = {"sqrt", "rsqrt", "detach"}  # `sqrt(d)` read as `d`, `x.detach()` as `x`
ENDS = {(None, -1): (1, None), (1, None): (None, -1)}  # `[:-1]` and `[1:]`, each for the other
SEPARATORS = r"([ ,()=])"


@dataclass(frozen=True)
class Edit:
    """One candidate: the top-level statement it edits (its index in the file), the node (its index in
    `ast.walk` of that statement), what takes the node's place, and the line and text said."""

    top: int
    node: int
    new: ast.AST
    line: int
    old_text: str
    new_text: str


def _int(node: ast.AST | None) -> int | None:
    """An integer written as a literal (`2`, `-1`), else None."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return {int: value}.get(type(value))  # not a bool, a float, a string


def set_to(node: ast.AST, **fields: Any) -> ast.AST:
    """A copy of the node with these fields set."""
    new = copy.deepcopy(node)
    for name, value in fields.items():
        setattr(new, name, value)
    return new


def _called(node: ast.Call) -> str:
    return getattr(node.func, "attr", getattr(node.func, "id", ""))


def _swapped_args(node: ast.Call) -> list[ast.AST]:
    """A call's two neighbouring positional arguments in the other order."""
    args = node.args  # the line of the first of the two: a call written over several lines
    return [set_to(node, args=[*args[:i], args[i + 1], args[i], *args[i + 2:]], at=_line(args[i]))
            for i in range(len(args) - 1)]


def _dims(node: ast.Call) -> list[ast.AST]:
    """A dimension argument (`x.transpose(1, 2)`'s, `softmax(x, -1)`'s) moved to a neighbour, a
    `triu(x, 1)`'s diagonal by one."""
    moves, args = POSITIONAL.get(_called(node), {}), node.args
    return [set_to(node, args=[*args[:i], ast.Constant(d), *args[i + 1:]])
            for i, a in enumerate(args) for d in moves.get(_int(a), ())]


def _unwrapped(node: ast.Call) -> list[ast.AST]:
    """`sqrt(d)` as `d`, `x.detach()` as `x`."""
    inner = [*node.args, getattr(node.func, "value", None)][:1]
    alone = len(node.args) + len(node.keywords) <= 1
    return inner * ((_called(node) in UNWRAPPED) & alone & (inner != [None]))


def _binop(node: ast.BinOp) -> list[ast.AST]:
    """`+` for `-`, `*` for `/` (and back); one term of a sum dropped; `x ** -p` for `x ** p`."""
    other = OTHER_OP.get(type(node.op), ast.Add)
    terms = [node.left, node.right] * isinstance(node.op, (ast.Add, ast.Sub))
    power = [set_to(node, right=ast.Constant(-getattr(node.right, "value", 0)))] * (
        isinstance(node.op, ast.Pow) & isinstance(getattr(node.right, "value", None), (int, float)))
    return [set_to(node, op=other())] * (type(node.op) in OTHER_OP) + terms + power


def _compare(node: ast.Compare) -> list[ast.AST]:
    """`>=` for `>`, `<=` for `<` (and back)."""
    other = OTHER_OP.get(type(node.ops[0]), ast.Eq)
    return [set_to(node, ops=[other(), *node.ops[1:]])] * (type(node.ops[0]) in OTHER_OP)


def _unsigned(node: ast.UnaryOp) -> list[ast.AST]:
    """A minus removed."""
    return [node.operand] * isinstance(node.op, ast.USub)


def _attribute(node: ast.Attribute) -> list[ast.AST]:
    return [set_to(node, attr=OTHER_NAME.get(node.attr))] * (node.attr in OTHER_NAME)


def _name(node: ast.Name) -> list[ast.AST]:
    return [set_to(node, id=OTHER_NAME.get(node.id))] * (node.id in OTHER_NAME)


def _keyword(node: ast.keyword) -> list[ast.AST]:
    """`dim=-1` as -2, `diagonal=1` as 0 or 2."""
    return [set_to(node, value=ast.Constant(v)) for v in KEYWORDS.get(node.arg, {}).get(_int(node.value), ())]


def _slice(node: ast.Slice) -> list[ast.AST]:
    """`[1:]` for `[:-1]` (and back), and each bound written as a number moved by one."""
    lower, upper = _int(node.lower), _int(node.upper)
    ends = ENDS.get((lower, upper), (None, None))
    moved = [set_to(node, **{field: _constant(v)}) for field, value in (("lower", lower), ("upper", upper))
             for v in BY_ONE.get(value, ())]
    swapped = [set_to(node, lower=_constant(ends[0]), upper=_constant(ends[1]))]
    return swapped * ((lower, upper) in ENDS) + moved


def _constant(value: int | None) -> ast.AST | None:
    """A slice bound: none for 0 and None."""
    return (None, ast.Constant(value))[bool(value)]


def _index(node: ast.Subscript) -> list[ast.AST]:
    """An index written as a number moved by one."""
    return [set_to(node, slice=ast.Constant(v)) for v in BY_ONE.get(_int(node.slice), ())]


def _line_pairs(node: ast.stmt) -> list[ast.AST]:
    """A simple statement with two of the names it reads swapped (`q` and `k`, `gate` and `up`), or
    two of the names it unpacks into (`k, v = kv.chunk(2, -1)` as `v, k = ...`); said at the line of
    the first of the two."""
    value = getattr(node, "value", None) or ast.Pass()
    # whole names alone: not a call's function (`F.silu`), nor the `p` of `p.grad`, `state[...]`
    inner = {id(getattr(n, "func", getattr(n, "value", None))) for n in ast.walk(value)}
    lines = {_readable(n): _line(n) for n in reversed(list(ast.walk(value))) if id(n) not in inner}
    bound = [_readable(e) for t in getattr(node, "targets", ()) for e in getattr(t, "elts", ())]
    return [_Swap(*pair).visit(copy.deepcopy(node)) for pair in _pairs(bound, 1)] + [
        set_to(node, value=_Swap(*pair).visit(copy.deepcopy(value)), at=lines[pair[0]])
        for pair in _pairs(list(lines)[::-1], 3)]


def _pairs(names: list[str], apart: int) -> list[tuple[str, str]]:
    """Each two names at most `apart` places apart (those that are one)."""
    names = list(filter(None, names))
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:i + 1 + apart]]


def _readable(node: ast.AST) -> str:
    """A name (`q`) or an attribute of one (`self.k_proj`), as written; "" for anything else."""
    held = isinstance(node, ast.Name) | isinstance(getattr(node, "value", None), ast.Name)
    return ast.unparse(node) if held & isinstance(node, (ast.Name, ast.Attribute)) else ""


class _Swap(ast.NodeTransformer):
    """Every one of two names (read or bound) as the other."""

    def __init__(self, a: str, b: str) -> None:
        self.pair = {a: b, b: a}

    def visit(self, node: ast.AST) -> ast.AST:
        other = self.pair.get(_readable(node))
        return set_to(ast.parse(other, mode="eval").body, ctx=node.ctx) if other else self.generic_visit(node)


# the edits of each kind of node: each gives what may take its place
EDITS: dict[type, tuple[Callable[[Any], list[ast.AST]], ...]] = {
    ast.Call: (_swapped_args, _dims, _unwrapped), ast.BinOp: (_binop,), ast.Compare: (_compare,),
    ast.UnaryOp: (_unsigned,), ast.Attribute: (_attribute,), ast.Name: (_name,), ast.keyword: (_keyword,),
    ast.Slice: (_slice,), ast.Subscript: (_index,),
    **dict.fromkeys((ast.Assign, ast.AugAssign, ast.Return, ast.Expr, ast.AnnAssign), (_line_pairs,))}


def candidates(tree: ast.Module, lines: set[int], first: list[int]) -> list[Edit]:
    """Every edit of a node on one of `lines` that changes its text, those nearest a line of `first`
    first, at most MOST."""
    out = [Edit(top, index, new, getattr(new, "at", _line(node)), _said(node), _said(new))
           for top, stmt in enumerate(tree.body) for index, node in enumerate(ast.walk(stmt))
           if _line(node) in lines for edit in EDITS.get(type(node), ()) for new in edit(node)]
    out = list({(e.line, differing(e.old_text, e.new_text)): e for e in out
                if e.old_text != e.new_text}.values())  # one of each edit said alike on a line
    return sorted(out, key=lambda e: min((abs(e.line - f) for f in first), default=0))[:MOST]


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", getattr(getattr(node, "value", None), "lineno", 0))


def _said(node: ast.AST) -> str:
    """The node as written: a keyword as `dim=1`, a slice as `[1:]`."""
    said = {ast.keyword: lambda: f"{node.arg}={ast.unparse(node.value)}",
            ast.Slice: lambda: ast.unparse(ast.Subscript(ast.Name("x"), node))[1:]}
    return said.get(type(node), lambda: ast.unparse(node))()


def differing(old: str, new: str) -> tuple[str, str]:
    """The two texts cut to where they differ, at separators (a space, a comma, a parenthesis, `=`):
    `beta2, beta1` and `beta1, beta2` of two calls alike but for them; whole where a cut leaves nothing."""
    a, b = re.split(SEPARATORS, old), re.split(SEPARATORS, new)
    head = len(os.path.commonprefix([a, b]))
    tail = len(os.path.commonprefix([a[head:][::-1], b[head:][::-1]]))
    pair = "".join(a[head:len(a) - tail]).strip(" ,"), "".join(b[head:len(b) - tail]).strip(" ,")
    return pair if all(pair) else (old, new)


class _Put(ast.NodeTransformer):
    """One node of a tree replaced."""

    def __init__(self, target: ast.AST, new: ast.AST) -> None:
        self.target, self.new = target, new

    def visit(self, node: ast.AST) -> ast.AST:
        return self.new if node is self.target else self.generic_visit(node)


def edited(tree: ast.Module, edit: Edit) -> ast.Module:
    """The one top-level statement the edit changes, as a module of its own, at its own lines."""
    stmt = copy.deepcopy(tree.body[edit.top])
    target = list(ast.walk(stmt))[edit.node]
    new = ast.copy_location(copy.deepcopy(edit.new), target)  # its own new nodes at the line it replaces
    return ast.fix_missing_locations(ast.Module([_Put(target, new).visit(stmt)], []))


@contextmanager
def put_in(module: Any, code: ast.Module, path: str) -> Iterator[dict[int, Any]]:
    """The edited statement run in the learner's module, the names it binds in place of theirs for
    the block (what it bound: the id of the object it replaces -> the new one), then theirs put back."""
    names = vars(module)
    before = dict(names)
    try:
        exec(compile(code, path, "exec"), names)  # noqa: S102  (their own definition, one edit made)
        yield {id(before.get(k)): v for k, v in names.items()}
    finally:
        names.clear()  # the same dict: their functions' globals
        names.update(before)


def repaired(res: ComponentResult, comp: Any, ctx: Any, rerun: Callable[[Any], str], spent: float = 0.0,
             ) -> None:
    """A FAIL that no catalogued mistake names (a departure, or no finding at all), its learner's
    code not raising: where the edits that make it PASS (`rerun(component)` its status) all sit on one
    line, its finding quotes that line and says the edit (module doc). None when its check has already
    taken `spent` >= LATE seconds (a slow machine: the step's time limit is kept)."""
    named = any(f.name != DEPARTS for f in res.findings)
    if res.status != FAIL or res.error is not None or spent >= LATE or named:
        return
    said = " ".join(f.observed["en"] for f in res.findings)
    first = [int(n) for n in re.findall(r"line (\d+)", said)]  # the lines the departure names
    matched = _matching(candidates(parsed_file(ctx.path), _spans(comp, ctx), first), comp, ctx, rerun)
    lines = _made_at({e.line for e in matched}, res.findings[0].line if res.findings else None,
                     lambda: _run_order(comp, ctx, rerun))
    matched = [e for e in matched if e.line in lines]
    if len(lines) != 1:
        return
    edit, code = matched[0], linecache.getline(ctx.path, matched[0].line)
    old, new = differing(edit.old_text, edit.new_text)
    said = text(f"line {edit.line}: with `{new}` in place of `{old}` it matches the reference",
                f"第 {edit.line} 行：把 `{old}` 换成 `{new}`，结果就与参考一致")
    shown = [f.observed for f in res.findings[:1]]  # where the difference shows, and its form
    res.findings = [Finding(DEPARTS, text("; ".join([said["en"]] + [o["en"] for o in shown]),
                                          "；".join([said["zh"]] + [o["zh"] for o in shown])),
                            edit.line, code.strip())]


def _made_at(lines: set[int], shows: int | None, order: Callable[[], dict[int, int]]) -> set[int]:
    """Of the lines whose edit makes it match, where the difference is made: where several do and the
    departure (`shows`, where the difference shows) is one, those that run after it are dropped (an
    edit there undoes it downstream: `attend(k, q, ...)` for a q and a k swapped above), then the
    departure itself, when an earlier line is left (`self.scale = d ** 0.5` read by `* scale`)."""
    if len(lines) < 2 or shows not in lines:
        return lines
    ran = order()  # none where it cannot be had: nothing is kept
    before = {n for n in lines if ran.get(n, math.inf) <= ran.get(shows, -1)}
    return before - {shows} or before


def _run_order(comp: Any, ctx: Any, rerun: Callable[[Any], str]) -> dict[int, int]:
    """Each line of their file the component's check runs -> when it first runs (0, 1, ...)."""
    order: dict[int, int] = {}

    def local(frame: Any, event: str, arg: Any) -> Any:
        order.setdefault(frame.f_lineno, len(order))
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == ctx.path else None

    old = sys.gettrace()
    sys.settrace(calls)
    try:
        with deadline(2 * ONE_RUN):  # traced, it runs slower
            rerun(comp)
    except (Exception, SystemExit, TrainerTimeout):  # noqa: BLE001  (it ran past its time: no order)
        return {}
    finally:
        sys.settrace(old)
    return order


def _matching(edits: list[Edit], comp: Any, ctx: Any, rerun: Callable[[Any], str]) -> list[Edit]:
    """The edits whose component PASSes; none where SECONDS of CPU (or WALL) are spent before all
    are tried."""
    cpu, wall, out, tree = time.process_time() + SECONDS, time.monotonic() + WALL, [], parsed_file(ctx.path)
    for edit in edits:
        if max(time.process_time() - cpu, time.monotonic() - wall) > 0:
            return []  # not all tried: one that matches may be a line that undoes it downstream
        try:
            with put_in(ctx.module, edited(tree, edit), ctx.path) as bound, deadline(ONE_RUN):
                out += [edit] * (rerun(replace(comp, obj=bound.get(id(comp.obj), comp.obj))) == PASS)
        except (Exception, SystemExit, TrainerTimeout):  # noqa: BLE001, S112  (an edit that cannot run)
            continue
    return out


def _spans(comp: Any, ctx: Any) -> set[int]:
    """The lines of the component and of the file's functions and classes it reads."""
    objs, lines = ctx.objects(comp), set()
    for obj in list(objs)[:getattr(objs, "near", 1)]:
        try:
            body, first = inspect.getsourcelines(obj)
        except (OSError, TypeError):
            continue
        lines.update(range(first, first + len(body)))
    return lines
