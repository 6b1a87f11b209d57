"""Random mutations of the correct learner files, for the test that the grader never breaks
(tests/test_check_robust.py): swap two arguments of a call (a `transpose`, a `masked_fill`, a
`matmul`, ...), delete a statement (it becomes `pass`), change a `dim`, drop a `return`'s value.

Every mutation site of a file is numbered in a fixed order (`ast.walk`), so a mutant is named by its
file and site and can be rebuilt; `sample` draws sites with a seeded random generator.
"""

from __future__ import annotations

import ast
import functools
import random
from dataclasses import dataclass
from pathlib import Path

OTHER_DIM = {-1: -2, -2: -1, 0: 1, 1: 2, 2: 1, 3: 2, -3: -1, -4: -1}
# calls whose integer arguments are dimensions (x.transpose(1, 2), F.softmax(x, -1), x.sum(-1), ...)
DIM_FUNCTIONS = {"transpose", "softmax", "log_softmax", "sum", "mean", "var", "std", "argmax", "max", "min",
                 "cat", "stack", "unsqueeze", "squeeze", "chunk", "split", "cumsum", "topk", "sort", "permute",
                 "flatten", "repeat_interleave", "amax", "norm", "size"}


@dataclass(frozen=True)
class Mutant:
    path: Path  # the correct file it mutates
    site: int
    kind: str  # swap | dim | return | delete
    what: str  # "line 42: swap the first two arguments of transpose"

    def source(self) -> str:
        """The mutated file (rebuilt from the site: the mutation is applied to a fresh parse)."""
        tree = ast.parse(self.path.read_text())
        node, kind = _sites(tree)[self.site]
        return ast.unparse(ast.fix_missing_locations(_Apply(node, kind).visit(tree)))


def _sites(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """(node, kind of mutation) for every place a mutation applies, in a fixed order."""
    out: list[tuple[ast.AST, str]] = []
    in_function = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(fn) if n is not fn)
    for node in ast.walk(tree):
        if id(node) not in in_function:
            continue
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            out.append((node, "swap"))
        if isinstance(node, ast.keyword) and node.arg == "dim" and _dim_value(node.value) is not None:
            out.append((node, "dim"))
        if isinstance(node, ast.Call) and _name(node) in DIM_FUNCTIONS:
            out += [(node, f"dim:{i}") for i, arg in enumerate(node.args) if _dim_value(arg) is not None]
        if isinstance(node, ast.Return) and node.value is not None:
            out.append((node, "return"))
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Return)):
            out.append((node, "delete"))
    return out


def _dim_value(node: ast.AST) -> int | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and -4 <= value <= 3 else None


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "a call"


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, kind: str) -> None:
        self.target, self.kind = target, kind

    def visit(self, node: ast.AST) -> ast.AST | None:
        if node is not self.target:
            return super().visit(node)
        if self.kind == "swap":
            node.args[0], node.args[1] = node.args[1], node.args[0]
        elif self.kind == "dim":
            node.value = ast.Constant(OTHER_DIM.get(_dim_value(node.value), -1))
        elif self.kind.startswith("dim:"):
            i = int(self.kind[4:])
            node.args[i] = ast.Constant(OTHER_DIM.get(_dim_value(node.args[i]), -1))
        elif self.kind == "return":
            return ast.Expr(node.value)
        elif self.kind == "delete":
            return ast.Pass()
        return node


@functools.cache
def mutants(path: Path) -> tuple[Mutant, ...]:
    """Every mutant of one file (swapping two equal arguments makes none)."""
    out = []
    for site, (node, kind) in enumerate(_sites(ast.parse(path.read_text()))):
        if kind == "swap" and ast.dump(node.args[0]) == ast.dump(node.args[1]):
            continue
        line = getattr(node, "lineno", 0) or getattr(getattr(node, "value", None), "lineno", 0)
        what = {"swap": f"swap the first two arguments of {_name(node)}" if isinstance(node, ast.Call) else "",
                "dim": "change a dim", "return": "drop the value of a return", "delete": "delete a statement"}.get(
            kind, f"change a dim of {_name(node)}" if isinstance(node, ast.Call) else "")
        out.append(Mutant(path, site, kind.split(":")[0], f"line {line}: {what}"))
    return tuple(out)


def sample(paths: list[Path], count: int, seed: int = 0) -> list[Mutant]:
    """`count` mutants drawn from the files' mutants with a seeded generator, spread over the files."""
    rng = random.Random(seed)
    per_file = [list(mutants(p)) for p in paths]
    out: list[Mutant] = []
    while len(out) < count and any(per_file):
        for pool in per_file:
            if pool and len(out) < count:
                out.append(pool.pop(rng.randrange(len(pool))))
    return out
