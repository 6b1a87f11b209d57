"""The grader's shape: no function under handformer/check/ spans more than 40 lines (from its `def`
to its last line, docstring included), and its rooms import one way: reference/ and catalog/ import
neither core/ nor runners/, core/ imports no runner (only the engine, which calls them), and no module
imports another's private names."""

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


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of each `from handformer.check... import ...` in the file, nested ones included."""
    return [(node.module, [a.name for a in node.names]) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("handformer.check")]


FORBIDDEN = {"reference": ("core", "runners"), "catalog": ("core", "runners"), "core": ("runners",)}


def _wrong_way() -> list[str]:
    wrong = []
    for path in sorted(CHECK.rglob("*.py")):
        room, here = path.parent.name, path.relative_to(CHECK).as_posix()
        for module, names in _imports(path):
            parts = module.split(".")  # handformer.check.<room>.<module>
            target = parts[2] if len(parts) > 2 else ""
            if target in FORBIDDEN.get(room, ()) and here != "core/engine.py":
                wrong.append(f"{here} imports {module}")
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if private and parts[-1] != path.stem:
                wrong.append(f"{here} imports private {private} from {module}")
    return wrong


def test_the_grader_rooms_import_one_way():
    wrong = _wrong_way()
    assert not wrong, "imports against the rooms (move the shared helper to core/): " + "; ".join(wrong)


# The kinds written as probes (core/probe.py): each runner is one call of the engine on its Probe row.
PROBE_RUNNERS = {"runners/pieces.py": ("check_ffn", "check_norm", "check_positional_encoding")}


def test_the_kinds_written_as_probes_run_through_the_engine():
    for file, names in PROBE_RUNNERS.items():
        tree = ast.parse((CHECK / file).read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in names:
            body = [s for s in functions[name].body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            assert len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call) \
                and getattr(body[0].value.func, "id", None) == "run_probe", f"{file}:{name} is not a Probe row"
