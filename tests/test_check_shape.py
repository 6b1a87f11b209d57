"""The grader's shape: no function under handformer/check/ spans more than 40 lines (from its `def`
to its last line, docstring included), and its rooms import one way: reference/ and catalog/ import
neither core/ nor runners/, core/ imports no runner (only the engine, which calls them), and no module
imports another's private names; and check/ gets no denser in branches (benchmarks/branch_density.py
counts them): the goal is the package's density, held here by a ratchet until check/ reaches it."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from branch_density import branches, code_lines  # noqa: E402

CHECK = ROOT / "handformer" / "check"
LIMIT = 40
# check/'s branches per 1,000 code lines may not pass this figure: the ratchet, lowered as check/ gets
# simpler, down to the package's (not counted here: parsing the whole package takes 3 s a run).
# `python3 benchmarks/branch_density.py` prints both. The probes for fused q/k/v layouts, mixtures of
# experts, self-training tokenizers and padded batches brought about 300 per 1,000 in their own code;
# decisions stated as tables, null objects and one home per repeated walk took it back down a part of
# the way; the kinds of the 2025-26 families (latent attention, sinks, sandwich norms), hand-written
# AdamW and the localizer's rules for wrong operands and idle statements brought it up again; the
# sampling filters stated as data (top-k, top-p, min-p: one Filter row each, one engine) and the
# flags' rules as tables (top-p's keep rule, BPE's tie rule) took it to 264.7; each schedule family's
# conventions and sub-steps as rows, one helper for a call's roles and for a check's failure detail, beam
# search's steering shared by its runners, and BPE's argument roles as a table took it to 262.6; the
# optimizer's search as one next, the norms' flags, handformer's norms, a causal mask's observations and
# an additive attention's inputs as tables, and the BPE trainer's tests that were never true gone took
# it to 261.1; the kinds for Lightning modules, speculative sampling, cached decoders and ALiBi slopes,
# and components built from the arguments a host of the file hands them, brought it up to 263.1: the
# issue's target, the package's density (about 258), is not met; a WordPiece kind written at about 248
# took it to 262.6; the runners for a classifier on its own encoder, a step that reads its batch by
# key, a model built with its own pad id, Lion, a one-cycle schedule, the truncation samplers, left
# padding and the guessed interfaces brought it up to 263.51, held at 263.6 (the target is not met); one
# helper for a forward's defaults, the alias lookups through argument_names.named, one set of every
# kind's names, one reading of a rotary table's frequencies and the classifier's ids drawn by the
# encoder model's helper took it to 262.36, held at 262.4 (the target is still not met); training
# steps read by key and by their batch's unpacking, group advantages, a loop's prompt forms, learned
# terms, stacked projections and gains, M-RoPE sections, square-only cores, beam settings and the
# Unigram tokenizer brought it up to 264.4; a loop's settings one a prompt and its count read by its form,
# SentencePiece's scored merges and a training loop's micro-steps read by the range around its backward took
# it to 265.2; a found function's kind, a constructor's arguments as tables of rules, and one helper for a
# commented-out statement, a float mask's dtype and two tensors apart, beside masks read in a helper,
# callables filled and layers driven through their parent, left it at 264.15; learned position tables, the
# reference-free properties of a causal LM, a mask helper's use, a settings argument and the penalty probe
# written flat left it at 264.05, held at 264.1 (the target, the package's 259.5, is still not met).
DENSITY_RATCHET = 264.1


@functools.cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    source = path.read_text(encoding="utf-8")
    return source, ast.parse(source)


def _long_functions() -> dict[str, int]:
    found = {}
    for path in sorted(CHECK.rglob("*.py")):
        for node in ast.walk(_parsed(path)[1]):
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
    return [(node.module, [a.name for a in node.names]) for node in ast.walk(_parsed(path)[1])
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


# The kinds written as probes: each runner is one call of its engine on its row (core/probe.py's
# run_probe on a Probe; the sampling filters' check_filter on a Filter).
PROBE_RUNNERS = {"runners/pieces.py": ("run_probe", ("check_ffn", "check_norm", "check_positional_encoding")),
                 "runners/sampling.py": ("check_filter", ("check_top_k", "check_top_p", "check_min_p"))}


def test_the_kinds_written_as_probes_run_through_the_engine():
    for file, (engine, names) in PROBE_RUNNERS.items():
        tree = ast.parse((CHECK / file).read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in names:
            body = [s for s in functions[name].body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            assert len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call) \
                and getattr(body[0].value.func, "id", None) == engine, f"{file}:{name} is not a row of {engine}"


def _density(folder: Path) -> tuple[int, int]:
    """(branches, code lines) of every .py file under folder."""
    counts = [(branches(tree), code_lines(source, tree)) for source, tree in map(_parsed, folder.rglob("*.py"))]
    return sum(b for b, _ in counts), sum(n for _, n in counts)


def test_the_grader_gets_no_denser_in_branches():
    b, n = _density(CHECK)
    assert 1000 * b / n <= DENSITY_RATCHET, (
        f"handformer/check has {b} branches in {n} code lines, {1000 * b / n:.1f} per 1,000, over the "
        f"ratchet {DENSITY_RATCHET}: simplify (tables, one helper for a repeated pattern, inputs "
        "normalised early; python3 benchmarks/branch_density.py)")


def test_a_component_named_as_its_kind_is_not_named_twice():
    from handformer.check.core.report import format_component
    from handformer.check.core.result import ComponentResult

    assert format_component(ComponentResult("rmsnorm", "RMSNorm"), "zh")[0].startswith("RMSNorm：")
    assert format_component(ComponentResult("rmsnorm", "RMSNorm"), "en")[0].startswith("RMSNorm: ")
    assert format_component(ComponentResult("rmsnorm", "MyNorm"), "en")[0].startswith("MyNorm (RMSNorm): ")
