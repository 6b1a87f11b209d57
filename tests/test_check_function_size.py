"""The grader's functions stay small: no function under handformer/check/ spans more than 40 lines
(from its `def` to its last line, docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

CHECK = Path(__file__).resolve().parents[1] / "handformer" / "check"
LIMIT = 40


def _long_functions() -> dict[str, int]:
    found = {}
    for path in sorted(CHECK.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = node.end_lineno - node.lineno + 1
                if span > LIMIT:
                    found[f"{path.relative_to(CHECK).as_posix()}:{node.name}"] = span
    return found


def test_no_function_of_the_grader_is_over_40_lines():
    over = _long_functions()
    assert not over, f"functions over {LIMIT} lines (split them): {over}"
