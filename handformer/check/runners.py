"""Run the check of every component of a learner's file (in this process: the sandbox calls this in
a child process). `check_module` streams one `ComponentResult` per component to `emit`."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from handformer.check import fingerprint as fp
from handformer.check.discovery import (
    NAMES,
    Component,
    DiscoveryError,
    defined_names,
    find_components,
    own_objects,
)
from handformer.check.kinds import KINDS_BY_NAME
from handformer.check.result import (
    ERROR,
    FAIL,
    TODO,
    ComponentResult,
    FileResult,
    Finding,
    LearnerError,
    text,
)
from handformer.check.source import learner_error, source_lines
from handformer.check.weights import MappingError

if TYPE_CHECKING:
    from handformer.check.context import Context

def runner_for(kind: str) -> Callable[[Component, Context], ComponentResult]:
    """The runner of a kind, from the table in handformer.check.kinds."""
    module, _, function = KINDS_BY_NAME[kind].runner.partition(":")
    return getattr(importlib.import_module(f"handformer.check.{module}"), function)


def import_learner(path: str) -> types.ModuleType:
    """Import the learner's file as a module of its own (their code runs)."""
    name = "learner_" + "".join(c if c.isalnum() else "_" for c in Path(path).stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # their file may import its neighbours, as under pytest
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def check_component(comp: Component, ctx: Context) -> ComponentResult:
    ctx.partial = None
    ctx.learner.calls = ctx.learner.nan_calls = 0
    try:
        with torch.no_grad():
            result = runner_for(comp.kind)(comp, ctx)
    except fp.LearnerFailure as failure:
        result = ComponentResult(comp.kind, comp.name, ERROR, error=failure.error)
        partial = ctx.partial
        if partial is not None and partial.name == comp.name and partial.findings:  # found before it raised
            partial.status, partial.error = ERROR, failure.error
            result = partial
    except (MappingError, DiscoveryError) as err:
        result = ComponentResult(comp.kind, comp.name, ERROR,
                                 error=LearnerError("mapping", str(err), "__init__"))
    except SystemExit as err:  # sys.exit in their code, called where the runner does not wrap the call
        result = ComponentResult(comp.kind, comp.name, ERROR, error=learner_error(err, ctx.path, "check"))
    except Exception as err:  # a bug of the grader's: said so, never shown as the learner's traceback
        result = ComponentResult(comp.kind, comp.name, ERROR, error=internal_error(err, ctx.path))
    if result.status == ERROR and not result.findings and not_implemented(comp, result.error):
        result.status = TODO
    if not result.findings and result.status in (FAIL, ERROR) and (
            result.error is None or result.error.kind == "exception"):
        result.findings += inherited(comp, ctx)
    if result.status in (FAIL, ERROR) and ctx.learner.nan_calls and not any(
            f.name == "nan_on_masked_rows" for f in result.findings):
        n, m = ctx.learner.nan_calls, ctx.learner.calls
        result.notes.append(text(
            f"your output had a NaN in {n} of {m} calls (0 / 0, inf - inf, the log or square root of a "
            "negative number, or a softmax of a row that is all -inf?)",
            f"你的输出在 {m} 次调用中有 {n} 次出现 NaN（0 / 0、inf - inf、对负数取 log 或开方，"
            "还是对全为 -inf 的一行做了 softmax？）"))
    ctx.results[comp.name] = result
    return result


def not_implemented(comp: Component, error: LearnerError | None) -> bool:
    """A component that is still a starter's TODO: it raised NotImplementedError, or its own code
    raises one and it failed before getting there (a class whose `__init__` builds no layers yet)."""
    if error is None:
        return False
    if error.kind == "not_implemented":
        return True
    try:
        lines = source_lines([comp.obj])
    except Exception:  # no source (a builtin, a lambda): not a starter
        return False
    todo = [(n, t.strip()) for n, t in lines if re.match(r"\s*raise NotImplementedError\b", t)]
    if error.kind not in ("mapping", "exception") or not todo:
        return False
    error.kind = "not_implemented"
    error.message = (f"not implemented yet: line {todo[0][0]} still raises NotImplementedError "
                     f"({error.message})")
    return True


def inherited(comp: Component, ctx: Context) -> list[Finding]:
    """The mistakes of the learner's other components that this one uses (its source calls them,
    directly or through their other functions), for a component that fails with none of its own: a
    block whose FFN has no down projection, a generate loop whose sampling step is wrong."""
    own = {n: o for n, o in own_objects(ctx.module).items() if "." not in n}
    sources = {}
    for name, obj in own.items():
        try:
            sources[name] = inspect.getsource(obj)
        except (OSError, TypeError):
            sources[name] = ""
    reached, todo = set(), [comp.name.split(".")[0]]
    while todo:
        name = todo.pop()
        for other in own:
            calls = re.search(rf"\b{re.escape(other)}\s*\(", sources.get(name, ""))
            if other not in reached and other != name and calls:
                reached.add(other)
                todo.append(other)
    out = []
    for name in sorted(reached):
        for f in ctx.results.get(name, ComponentResult("", "")).findings:
            if f.name not in {g.name for g in out}:
                out.append(Finding(f.name, text(
                    f"{comp.name} uses {name}, which has this mistake (its own check names it: "
                    f"{f.observed['en']})",
                    f"{comp.name} 用到了 {name}，它有这个错误（它自己的检查给出了诊断：{f.observed['zh']}）"),
                    f.line, f.code, f.form))
    return out


def internal_error(err: Exception, path: str) -> LearnerError:
    """An exception of handformer's own code while checking: the report says it is handformer's bug,
    with the learner's line it was running, if any (tests require that this never happens)."""
    theirs = learner_error(err, path, "check").traceback
    return LearnerError("internal", f"handformer could not check this component: {type(err).__name__}: "
                        f"{str(err).splitlines()[0][:300] if str(err) else ''} (a bug in handformer's "
                        "grader, not in your code; please report it with your file)", "check", theirs)


def check_file(path: str, overrides: dict[str, str] | None = None, only: list[str] | None = None,
               convention: str | None = None,
               emit: Callable[[ComponentResult], None] | None = None,
               started: Callable[[str, str], None] | None = None, skip: list[str] | None = None,
               ) -> FileResult:
    """Import the learner's file and check each component it defines. `started(step, kind)` is told
    each step before it runs: "import", then each component's name and the kind it is checked as."""
    from handformer.check.context import Context

    result = FileResult(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if started:
        started("import", "")
    try:
        module = import_learner(path)
    except BaseException as err:  # their module body: anything it raises is reported
        if isinstance(err, KeyboardInterrupt):
            raise
        result.error = learner_error(err, path, "import")
        return result
    try:
        components = find_components(module, overrides, only)
        everything = find_components(module, overrides)  # a layer may be built from their attention
    except DiscoveryError as err:  # --component names something the file does not define
        result.error = LearnerError("discovery", str(err), "discovery")
        return result
    todo = [c for c in components if c.name not in (skip or [])]
    if not components:
        names = ", ".join(defined_names(module)) or "nothing"
        result.error = LearnerError(
            "nothing_found", f"found no component to check; the file defines: {names}. handformer "
            f"looks for names such as {', '.join(n for ns in NAMES.values() for n in ns[:2])}; point "
            "a kind at your name with --component mha=MyAttention", "discovery")
        return result
    ctx = Context(path, module, {c.kind: c for c in reversed(everything)}, convention)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread costs more than it saves
    try:
        for comp in todo:
            if started:
                started(comp.name, comp.kind)
            res = check_component(comp, ctx)
            result.components.append(res)
            if emit:
                emit(res)
    finally:
        torch.set_num_threads(threads)
    return result
