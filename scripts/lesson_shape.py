"""The shape of the lesson, counted: what tests/test_lesson_shape.py holds to its limits.

    python scripts/lesson_shape.py                 # handformer's lesson files
    python scripts/lesson_shape.py path/to/model.py ...   # any files (nanoGPT's model.py, say)

Lesson files are every module under handformer/nn/ and handformer/models/. A branch is an `if`
statement (each `elif` counts), a conditional expression (`a if c else b`), an `if` inside a
comprehension, or a `match` case; a guard whose whole body is `raise` (an `if` without `else` that
only raises: input validation) is not a branch, and nothing inside it counts. A function's length
runs from its `def` to its last line, without its docstring. The import graph lists, for every
module of the package, the package modules it imports (at the top or inside functions).
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "handformer"
LESSON_DIRS = ("nn", "models")


def is_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and not node.orelse and bool(node.body)
            and all(isinstance(s, ast.Raise) for s in node.body))


def branches(node: ast.AST, skip_functions: bool = False) -> int:
    """Branches in `node`'s subtree (guards excluded); with skip_functions, not inside nested defs."""
    if is_guard(node):
        return 0
    own = {ast.If: 1, ast.IfExp: 1, ast.match_case: 1}.get(type(node), 0)
    if isinstance(node, ast.comprehension):
        own = len(node.ifs)
    children = (c for c in ast.iter_child_nodes(node)
                if not (skip_functions and isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef))))
    return own + sum(branches(c, skip_functions) for c in children)


@dataclass
class Function:
    file: str
    name: str  # Class.method or function
    lines: int  # def .. last line, docstring excluded
    branches: int


def functions(path: Path) -> list[Function]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                first = child.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    lines -= first.end_lineno - first.lineno + 1
                found.append(Function(str(path), prefix + child.name, lines,
                                      branches(child, skip_functions=True)))
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def lesson_files() -> list[Path]:
    return sorted(p for d in LESSON_DIRS for p in (PACKAGE / d).rglob("*.py"))


def file_branches(path: Path) -> int:
    return branches(ast.parse(path.read_text(encoding="utf-8")))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The handformer modules `path` imports, anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from handformer.nn import masks`
    return {m for m in found if m in package_modules() and m != module_name(path)}


@functools.cache
def package_modules() -> frozenset[str]:
    """Every module of the package, by name (listed once: import_graph asks for each file)."""
    return frozenset(module_name(p) for p in PACKAGE.rglob("*.py"))


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (each one an import circle), sorted."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(groups)


def report(paths: list[Path]) -> None:
    total = 0
    for path in paths:
        count, lines = file_branches(path), len(path.read_text(encoding="utf-8").splitlines())
        total += count
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{str(shown):40s} {lines:5d} lines {count:3d} branches")
        for f in functions(path):
            if f.name.endswith("forward") or f.branches:
                print(f"    {f.name:36s} {f.lines:3d} lines {f.branches:2d} branches")
    print(f"{'total':40s} {'':11s} {total:3d} branches")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    given = [Path(a).resolve() for a in sys.argv[1:]]
    for path in given:
        if not path.is_file() or path.suffix != ".py":
            sys.exit(f"error: {path} is not a Python file; give paths of .py files, or none for "
                     "handformer's lesson files")
    try:
        report(given or lesson_files())
    except SyntaxError as err:
        sys.exit(f"error: {err.filename}:{err.lineno}: not valid Python ({err.msg})")
