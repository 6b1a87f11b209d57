"""A departure the code says is its own: NOT CHECKED, naming the step, never FAIL.

Where no catalogued mistake reproduces a component's output, its first departing line (localize.py) or
the line its failed check is placed at (unlocated.py) is read for what the code says it computes there.
A step the reference has no place for is no evidence of a mistake:

- it reads a quantity of the learner's own: a learned parameter no reference weight took (SSMax's
  `self.s`), whatever the form of the difference; or a number the class keeps (DeepNorm's
  `self.alpha = (2 * N) ** 0.25`) where the difference has a simple form other than a constant factor
  (a term scaled; a scale the reference has, kept as a number and set wrong, stays a FAIL);
- its attention weights never go through a softmax (stick-breaking, sigmoid attention);
- in attention, it adds a matrix product with a table a function of the file builds (NEZHA's relative
  positions); in a loss or training step, a term a function of the file computes (unlikelihood);
- it parts with no simple form where a part it uses was not graded for a step of its own (a model of
  DeepNorm blocks), said through that part.

A departure of a simple form on a step the reference has (a factor, sign, transpose, shift, axis, a
missing term) with none of these stays a FAIL, as does a failed reference-free check (causality), and
a catalogued mistake of a part it uses is named instead.
"""

from __future__ import annotations

import ast
import itertools
import linecache
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handformer.check.core.localize import NO_FORM
from handformer.check.core.result import (
    DEPARTS,
    FAIL,
    NOT_CHECKED,
    UNLOCATED,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.source import parsed_file
from handformer.check.core.unmapped import free_failed

# kinds whose reference attends through a softmax: weights computed another way are a step of their own
ATTENDING = frozenset({"sdpa", "mha", "gqa", "causal_attention", "mla", "encoder_layer", "decoder_layer",
                       "block", "transformer", "gpt", "classifier", "encoder_model"})
LOSSES = frozenset({"loss", "lm_train_step", "lm_train_loop", "train_step", "train_epoch", "chunked_ce"})
SOFTMAX = re.compile(r"softmax|scaled_dot_product_attention")
PRODUCTS = ("einsum", "matmul", "bmm")  # the calls that make a matrix product, beside `@`
FACTOR = "times a constant factor"  # a difference that is a scale: the reference has that step
UNREPRODUCED = "no known mistake (or pair of them) reproduces your"  # a FAIL's note, of a difference left
OWN_STEP = "own_step"  # the kind of the NOT CHECKED reason this rule gives
NUMBER = ("a number of its own", "它自己的一个数")
LEARNED = ("a learned parameter no weight of the reference takes", "参考实现没有对应权重的可学习参数")
CALLED_FROM = re.compile(r"in a helper called from line (\d+)")
Said = tuple[str, str, int]  # what the step does (English, Chinese) and the line that does it


@dataclass
class Read:
    """A departure as the rules read it: the file, the kind, a line of it, what the reference lacks."""

    tree: ast.Module
    kind: str
    line: int
    unmapped: str  # what the component holds that no reference weight took, said (unmapped.py)
    plain: bool  # the difference has no simple form
    scaled: bool  # the difference is a constant factor


def settle_own_step(path: str, kind: str, result: ComponentResult, unmapped: list[Text],
                    used: dict[str, ComponentResult], inherited: Callable[[], list[Finding]]) -> None:
    """A FAIL with nothing named whose departing line the code says is a step of its own, or that parts
    with no simple form where a part it uses (`used`: the learner's components it calls) was not graded
    for a step of its own: NOT CHECKED, the reason naming that step and its line. A failed
    reference-free check keeps it a FAIL; so does a catalogued mistake of a part it uses, named instead
    (`inherited`: the parts' findings)."""
    found = next(filter(lambda f: f.name in (DEPARTS, UNLOCATED), result.findings), Finding("", text("", "")))
    if (result.status, bool(result.named()), bool(free_failed(result)), found.line is None) != (
            FAIL, False, False, False):
        return
    said = own_step(path, kind, found, unmapped) or _part_own(found, used)
    if said is None:
        return
    named = list(filter(lambda f: f.name not in (DEPARTS, UNLOCATED), inherited()))
    if named:  # a part's catalogued mistake: its evidence
        result.findings = named
        return
    result.status, result.findings, result.max_abs_error = NOT_CHECKED, [], None
    result.checks = list(filter(operator.attrgetter("ok"), result.checks))
    result.notes = [*itertools.filterfalse(lambda n: n["en"].startswith(UNREPRODUCED), result.notes)]
    result.error = LearnerError(
        OWN_STEP, f"{result.name} {said['en']}: check's reference has no such step, so its difference from "
        "the reference says nothing about whether it is right; not graded", "",
        message_zh=f"{result.name} {said['zh']}：检查程序的参考实现没有这一步，"
        "所以它和参考不同说明不了它对不对；没有评分")


def _plain(found: Finding) -> bool:
    """The departure has no simple form (or no line was singled out: UNLOCATED)."""
    return NO_FORM["en"] in found.observed["en"] or found.name == UNLOCATED


def _part_own(found: Finding, used: dict[str, ComponentResult]) -> Text | None:
    """A departure with no simple form in a component that uses a part not graded for a step of its
    own (a model of DeepNorm blocks): that part, and what it computes, said."""
    parts = [(name, r.error) for name, r in used.items() if getattr(r.error, "kind", "") == OWN_STEP]
    if not parts * _plain(found):
        return None
    name, why = parts[0]
    en, zh = why.message.split(": check's reference")[0], why.message_zh.split("：检查程序")[0]
    return text(f"uses {name}, which is not graded: {en.split(' is not graded: ')[-1]}",
                f"用到了 {name}，它没有评分：{zh.split('没有评分：')[-1]}")


def own_step(path: str, kind: str, found: Finding, unmapped: list[Text]) -> Text | None:
    """What the departing step computes that the reference has not, said, or None: read at the
    departing line, and at the line that called the helper it departs in."""
    lines = [found.line, *map(int, CALLED_FROM.findall(found.observed["en"]))]
    held, observed = " ".join(map(operator.itemgetter("en"), unmapped)), found.observed["en"]
    reads = [Read(parsed_file(path), kind, n, held, _plain(found), FACTOR in observed) for n in lines]
    said = next(filter(None, (rule(read) for read in reads for rule in RULES)), None)
    if said is None:
        return None
    en, zh, at = said
    code = linecache.getline(path, at).strip()
    return text(f"parts from the reference at line {at}: {code}; there it {en}",
                f"在第 {at} 行与参考不同：{code}；这一行{zh}")


def _nodes(tree: ast.AST, kind: type | tuple[type, ...]) -> list[Any]:
    """The nodes of `kind` in a tree."""
    return [n for n in ast.walk(tree) if isinstance(n, kind)]


def _spanning(tree: ast.Module, line: int, kind: type | tuple[type, ...]) -> Any:
    """The innermost node of `kind` whose span holds `line` (an empty module where none does)."""
    around = [n for n in _nodes(tree, kind) if n.lineno <= line <= n.end_lineno]
    return min(around, key=lambda n: n.end_lineno - n.lineno, default=ast.Module([], []))


SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)  # a statement with no body


def _self_reads(node: ast.AST) -> set[str]:
    """The attributes of `self` a statement reads (`self.alpha`, `self.s.view(...)`: alpha, s)."""
    return set(re.findall(r"\bself\.(\w+)", ast.unparse(node)))


def _kept(cls: ast.AST) -> dict[str, ast.Assign]:
    """What the class assigns to `self.NAME` in its methods: name -> the assignment."""
    return {ast.unparse(t)[5:]: n for n in _nodes(cls, ast.Assign) for t in n.targets
            if ast.unparse(t).startswith("self.")}


def _reads_own(read: Read) -> Said | None:
    """The statement reads a learned parameter no reference weight took (named among `unmapped`), or,
    where the difference has a simple form that is no constant factor (a term scaled: DeepNorm's
    `self.alpha = (2 * config.n_layer) ** 0.25` on the residual), a number its class computes and keeps.
    A scale the reference has, kept and set wrong, is a constant factor; a difference with no simple form
    is not the number's (Marian's `self.scale = math.sqrt(d_model)` on a line adding a wrong table)."""
    kept = _kept(_spanning(read.tree, read.line, ast.ClassDef))
    reads = sorted(_self_reads(_spanning(read.tree, read.line, SIMPLE)) & kept.keys())
    own = [name for name in reads if _learned(kept[name], name, read.unmapped)
           or _numeric(kept[name]) * (not read.scaled) * (not read.plain)]
    if not own:
        return None
    name = own[0]
    learned = _learned(kept[name], name, read.unmapped)
    what, line, at = (NUMBER, LEARNED)[learned], kept[name].lineno, ast.unparse(kept[name])
    return (f"reads self.{name}, {what[0]} (set at line {line}: {at})",
            f"读取了 self.{name}，{what[1]}（第 {line} 行：{at}）", read.line)


NUMERIC = re.compile(r"\*\*|math\.")  # a power, a root or a log
ARITHMETIC = re.compile(r"math\.\w+|float|int")  # the only calls a number's expression makes


def _numeric(assigned: ast.Assign) -> bool:
    """A float the class computes from sizes or a config (a power, a root, a log), calling nothing but
    math's functions: DeepNorm's `self.alpha = (2 * config.n_layer) ** 0.25`. A literal kept as it is
    (`self.confidence = 1.0`, label smoothing's written wrong) is a value the reference has, set wrong."""
    code, read = ast.unparse(assigned.value), _names(assigned.value) - {"math", "float", "int"}
    calls = re.findall(r"([\w.]+)\(", code)
    return bool(NUMERIC.search(code)) & bool(read) & all(map(ARITHMETIC.fullmatch, calls))


def _learned(assigned: ast.Assign, name: str, unmapped: str) -> bool:
    """An `nn.Parameter` the component holds that no reference weight took (`unmapped` names it)."""
    parameter = re.match(r"(?:[\w.]+\.)?Parameter\(", ast.unparse(assigned.value))
    return bool(parameter) & bool(re.search(rf"(?<![\w])(?:\w+\.)*{name} \(", unmapped))


def _calls(node: ast.AST) -> set[str]:
    """The names a node calls, their last part (`torch.einsum`: einsum)."""
    return {ast.unparse(c.func).split(".")[-1] for c in _nodes(node, ast.Call)}


def _products(node: ast.AST) -> int:
    """How many matrix products the code makes (`q @ k.T`, einsum, matmul, bmm): attention makes two."""
    code = ast.unparse(node)
    return code.count(" @ ") + len(re.findall(rf"\b(?:{'|'.join(PRODUCTS)})\(", code))


def _no_softmax(read: Read) -> Said | None:
    """A class of attention (two matrix products) whose code holds no softmax: its weights are its own
    (stick-breaking's, sigmoid attention's)."""
    around = _spanning(read.tree, read.line, ast.ClassDef)
    attends = read.plain * (read.kind in ATTENDING) * (_products(around) >= 2)
    if not attends or SOFTMAX.search(ast.unparse(around)):
        return None
    return (f"computes attention weights that never go through a softmax ({around.name})",
            f"算出的注意力权重没有经过 softmax（{around.name}）", read.line)


def _own_term(read: Read) -> Said | None:
    """The statement is a sum one of whose terms a function of the file computes (it calls one, or
    reads a name bound by a call to one): in a class of attention, a matrix product with a table of its
    own (NEZHA's relative positions: `q @ k.T + einsum(q, rel)`); in a loss, a term beside the
    cross-entropy (`mle + alpha * unlikelihood_loss(logits, y)`)."""
    fn = _spanning(read.tree, read.line, ast.FunctionDef)
    made = {n.name for n in read.tree.body if isinstance(n, ast.FunctionDef)} - {getattr(fn, "name", "")}
    bound = {ast.unparse(t) for n in _nodes(fn, ast.Assign) if _calls(n.value) & made for t in n.targets}
    terms = _summed(getattr(_spanning(read.tree, read.line, SIMPLE), "value", None))
    loss = read.kind in LOSSES
    attends = _products(_spanning(read.tree, read.line, ast.ClassDef)) >= 2  # q·kᵀ and the weights' sum
    own = [t for t in terms if (len(_calls(t) & made) + len(_names(t) & bound)) * (loss + _products(t))]
    if not read.plain * (loss + attends) * len(own) * (len(terms) > len(own)):
        return None
    en, zh = (ATTENTION_TERM, LOSS_TERM)[loss]
    return en.format(ast.unparse(own[0])), zh.format(ast.unparse(own[0])), read.line


ATTENTION_TERM = ("adds a term of its own: {}", "加了自己的一项：{}")
LOSS_TERM = ("adds a term of its own to the cross-entropy: {}", "在交叉熵上加了自己的一项：{}")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in _nodes(node, ast.Name)}


def _summed(node: ast.AST | None) -> list[ast.AST]:
    """The terms of a sum (`a + b * c`: a, b * c); the node alone where it is no sum; none for None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _summed(node.left) + _summed(node.right)
    return [node] * (node is not None)


RULES = (_reads_own, _no_softmax, _own_term)
