"""Benchmark: branch density, the branches per 1,000 code lines of a folder of Python, for the
grader (`handformer/check/`) against the whole package (`handformer/`, the grader included).

What is counted (AST nodes, each once): every `if` (statement, conditional expression, and each
condition of a comprehension), every loop (`for`, `while`, and each `for` of a comprehension),
`try` (`except*` too), `with`, `match`, and every boolean operator chain (`a and b or c` is two
chains: the `and` and the `or`). A code line is a line that holds a token of code: not blank, not
only a comment, not part of a docstring (the string that opens a module, class or function).

    python benchmarks/branch_density.py                 # handformer/check/ and handformer/
    python benchmarks/branch_density.py FOLDER ...      # any folders
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.TryStar, ast.With,
            ast.AsyncWith, ast.Match, ast.BoolOp)
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
NOT_CODE = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER)


def branches(tree: ast.AST) -> int:
    """The branch nodes of a parsed file, as the module's docstring counts them."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, BRANCHES):
            count += 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)  # its `for` and each of its `if`s
    return count


def code_lines(source: str, tree: ast.AST) -> int:
    """The lines of the source that hold a token of code, docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        first = node.body[0] if isinstance(node, DOCUMENTED) and node.body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def density(folder: Path) -> tuple[int, int, float]:
    """(branches, code lines, branches per 1,000 code lines) of every .py file under folder."""
    total_branches = total_lines = 0
    for path in sorted(folder.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        total_branches += branches(tree)
        total_lines += code_lines(source, tree)
    return total_branches, total_lines, 1000 * total_branches / max(total_lines, 1)


def main(argv: list[str]) -> None:
    folders = [Path(a) for a in argv] or [ROOT / "handformer" / "check", ROOT / "handformer"]
    print(f"{'folder':<28} {'branches':>9} {'code lines':>11} {'per 1,000':>10}")
    for folder in folders:
        b, n, d = density(folder)
        name = folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else str(folder)
        print(f"{name:<28} {b:>9,} {n:>11,} {d:>10.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
