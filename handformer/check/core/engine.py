"""Run the check of every component of a learner's file (in this process: the sandbox calls this in
a child process). `check_module` streams one `ComponentResult` per component to `emit`."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
import time
import traceback
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.accepted import judged
from handformer.check.core.activations import read_activations
from handformer.check.core.adapters import adapter_hint, cannot_check
from handformer.check.core.adapters import functions as adapter_functions
from handformer.check.core.adapters import load as load_adapters
from handformer.check.core.argument_names import names_of
from handformer.check.core.cache_slices import cache_slice_findings
from handformer.check.core.conventions import nan_only_on_masked_rows
from handformer.check.core.discovery import (
    NAMES,
    Component,
    DiscoveryError,
    defined_here,
    defined_names,
    find_components,
)
from handformer.check.core.grouping import MULTI_QUERY_NOTE, UNGROUPED_NOTE, kv_heads_by_default
from handformer.check.core.kinds import KINDS_BY_NAME
from handformer.check.core.localize import commented_out
from handformer.check.core.neutral_settings import at_neutral
from handformer.check.core.own_calls import forward_defaults_, not_charged, taken_notes
from handformer.check.core.own_demo import demo_runs
from handformer.check.core.own_steps import settle_own_step
from handformer.check.core.own_width import other_width
from handformer.check.core.parent_inputs import parent_not_charged, parent_note
from handformer.check.core.passed_in import passed_in
from handformer.check.core.precision import DTYPE_MISMATCH, float64_kept
from handformer.check.core.result import (
    DEPARTS,
    DIFFERS,
    ERROR,
    FAIL,
    NOT_CHECKED,
    PASS,
    TODO,
    ComponentResult,
    FileResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.seeded import seeded
from handformer.check.core.setup_method import set_by_parent
from handformer.check.core.source import learner_error, reachable, source_lines, source_text
from handformer.check.core.unlocated import place_unlocated
from handformer.check.core.unmapped import settle as settle_unmapped
from handformer.check.core.weights import MappingError
from handformer.check.core.whole_topk import whole_topk
from handformer.check.runners.localize_layers import note_layer_departure
from handformer.time_limit import cpu_limit

if TYPE_CHECKING:
    from handformer.check.core.context import Context

def runner_for(kind: str) -> Callable[[Component, Context], ComponentResult]:
    """The runner of a kind, from the table in handformer.check.core.kinds."""
    module, _, function = KINDS_BY_NAME[kind].runner.partition(":")
    return getattr(importlib.import_module(f"handformer.check.runners.{module}"), function)


def import_runners() -> None:
    """Import every kind's runner module now (the sandbox does, so that no time limit counts them)."""
    for kind in KINDS_BY_NAME.values():
        importlib.import_module(f"handformer.check.runners.{kind.runner.partition(':')[0]}")


def learner_module_name(path: str) -> str:
    """The name the learner's file is imported under: learner_ and its stem, a Python name."""
    return "learner_" + "".join(c if c.isalnum() else "_" for c in Path(path).stem)


def import_learner(path: str) -> types.ModuleType:
    """Import the learner's file as a module of its own (their code runs)."""
    name = learner_module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    importable(Path(path).resolve().parent)  # their file may import its neighbours, as under pytest
    in_package(module, path)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


LEARNER_FOLDERS: set[str] = set()  # the folders learners' files were imported from, in this process


def importable(folder: Path) -> None:
    """The folder first on sys.path, and the neighbours imported from another learner's folder
    forgotten: two folders that each hold a `correct.py` (checked one after the other in one
    process, as the tests do) never hand each other's modules to `from correct import ...`."""
    others = LEARNER_FOLDERS - {str(folder)}
    for name, module in list(sys.modules.items()) if others else ():
        if _folder_of(getattr(module, "__file__", None) or "/") in others:
            del sys.modules[name]
    LEARNER_FOLDERS.add(str(folder))
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))


@functools.cache
def _folder_of(file: str) -> str:
    """The folder of a module's file, remembered: a test process holds thousands of modules, and
    every check asks again of each (Path's parsing was most of an in-process check's import)."""
    return str(Path(file).parent)


def in_package(module: types.ModuleType, path: str) -> None:
    """A file of a package that imports its siblings relatively (`from .ch03 import ...`, as
    LLMs-from-scratch's package does) runs as a module of that package: its __package__ set, the
    folder above the package importable. Any other file is left as it is."""
    source = Path(path).read_text(encoding="utf-8", errors="replace")
    if not re.search(r"^\s*from\s+\.", source, re.M):
        return
    folder, parts = Path(path).resolve().parent, []
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if parts:
        module.__package__ = ".".join(parts)
        importable(folder)


# the top-level statements that are the script's work, not definitions, by their node type: loops,
# `with` blocks, bare calls (an expression that is not a docstring) and `if __name__ == "__main__":`
SCRIPT_WORK: dict[type, Callable[[ast.stmt], bool]] = {
    **dict.fromkeys((ast.For, ast.While, ast.With, ast.AsyncFor, ast.AsyncWith), lambda node: True),
    ast.Expr: lambda node: not isinstance(node.value, ast.Constant),
    ast.If: lambda node: "__name__" in ast.unparse(node.test),
}


def import_definitions(path: str) -> tuple[types.ModuleType, list[str]]:
    """The learner's file run one top-level statement at a time, for a file whose top level cannot
    run as written (a training loop at module level, a data file or package that is not there):
    imports, definitions and assignments run, each on its own, and one that raises is skipped; loops,
    `with` blocks and bare calls (the script's work) are skipped without running. The file itself is
    never edited. Returns the module and the statements skipped, "line N: code (why)"."""
    source = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(source, path)
    module = types.ModuleType(learner_module_name(path))
    module.__file__ = path
    in_package(module, path)
    sys.modules[module.__name__] = module
    importable(Path(path).resolve().parent)
    lines, skipped = source.splitlines(), []
    for node in tree.body:
        first = f"line {node.lineno}: {lines[node.lineno - 1].strip()[:80]}"
        if SCRIPT_WORK.get(type(node), lambda n: False)(node):
            skipped.append(f"{first} (the script's work, not a definition)")
            continue
        code = compile(ast.Module([node], []), path, "exec")
        try:
            exec(code, vars(module))  # noqa: S102  (the learner's own file, as their import would run it)
        except Exception as err:  # a statement that cannot run here: skipped, said so
            skipped.append(f"{first} ({type(err).__name__}: {str(err)[:120]})")
    return module, skipped


def check_component(comp: Component, ctx: Context) -> ComponentResult:
    ctx.partial, ctx.raised = None, None
    ctx.learner.calls = ctx.learner.nan_calls = 0
    begun = time.process_time()
    result = _run_checked(comp, ctx)
    commented_out(result, ctx.path)  # a named mistake beside the one line they commented out
    passed_in(result, ctx.path)  # and the call that passes a value its line reads
    _cache_slices(comp, result)
    result = at_neutral(comp, ctx, result, _run_checked, time.process_time() - begun)  # settings of no place
    if result.status == ERROR and not result.findings:
        _nothing_found(comp, ctx, result, result.error)
    settled = nan_only_on_masked_rows(_module_source(ctx), result.findings, result.notes)
    if settled and result.status == FAIL:
        from handformer.check.core.context import finish

        result.status = settled  # finish keeps it, or FAILs on a failed check
        finish(result)
    # their code raised, at their line, on an input it accepts: it fails (driven by a stand-in, the
    # stand-in's outputs may be what it refuses: still an ERROR)
    if result.status == ERROR and result.error is not None and result.error.kind == "exception" and (
            result.error.traceback and not driven_by_stand_in(result)):
        result.status = FAIL
        _charged_or_not(comp, ctx, result, result.error)
    _named_parts(comp, ctx, result)
    settle_unmapped(result, ctx.unmapped.get(comp.name, []))  # what the reference has no place for
    _probed_only(comp, result)  # found by what it does: only a named mistake fails it
    set_by_parent(comp.obj, result)  # it reads what a parent's setup method assigns: checked through it
    place_unlocated(comp.obj, result)  # a FAIL that quotes no line: the failed check at its definition
    settle_own_step(ctx.path, comp.kind, result, ctx.unmapped.get(comp.name, []), _used(comp, ctx),
                    lambda: inherited(comp, ctx))  # a step of its own: NOT CHECKED
    result.notes += ctx.neutral.get(comp.name, [])  # settings it was checked at the neutral values of
    if result.error is not None and result.findings:  # a finding's line and where it raised: two at most
        result.error.traceback = result.error.traceback[-1:]
    _add_notes(comp, ctx, result)
    ctx.results[comp.name] = result
    return result


PROBED_UNNAMED = ("found by what it does, it computes something other than the reference with no "
                  "mistake of the catalogue reproducing it: it may be a loss of another kind "
                  "(a shift inside, a term of its own), so it is not failed; name its kind with --component",
                  "它是按所做的事找到的，算出的结果和参考实现不同，但目录里没有哪个错误能复现它：它可能是"
                  "另一种损失（内部做了移位，或有自己的一项），所以不判为失败；"
                  "可以用 --component 指明它的类型")


PROBED_LOSSES = ("loss", "chunked_ce")  # a schedule's rates rising then falling say its kind; a number near
# the cross-entropy does not (a shift inside, a term of its own)


def _probed_only(comp: Component, result: ComponentResult) -> None:
    """A component a behavioural probe found (behaviour.py) FAILs only where a catalogued mistake
    reproduces it: a departure with no name may be a kind the probe took it for wrongly."""
    key = (comp.found_by, comp.kind in PROBED_LOSSES, result.status, bool(result.named()))
    if key == ("behaviour", True, FAIL, False):
        result.status, result.findings = NOT_CHECKED, []
        result.error = LearnerError("cannot_call", PROBED_UNNAMED[0], "forward", [], PROBED_UNNAMED[1])


def _charged_or_not(comp: Component, ctx: Context, result: ComponentResult, error: LearnerError) -> None:
    """A FAIL by exception, nothing found before it, stays only where the inputs it raised on were the
    learner's to accept (accepted.py); else NOT CHECKED, why said before the exception's text."""
    if result.findings:
        return
    why = error
    with contextlib.suppress(Exception):  # a form check cannot read again: the exception stays theirs
        why = judged(ctx.raised, ctx.path, lambda: _run_callers(comp, ctx)) or error
    why = not_charged(comp.obj, why)  # driven only with arguments taken from the file's calls
    why = demo_runs(comp.obj, ctx.module, ctx.path, why)  # its own demo runs it: check's sizes or forms
    why = parent_not_charged(comp.obj, why)  # driven with what its parent passes beside check's own
    if why.kind == "exception":  # theirs: as raised, or where their own call raised
        result.error = why
        return
    why.message_zh = f"{why.message_zh}（原文：{error.message}）"
    why.message = f"{why.message} ({error.message})"
    why.traceback = error.traceback
    result.status, result.error, result.adapter = NOT_CHECKED, why, adapter_hint(comp)


CALLERS_LIMIT = 6.0  # CPU seconds the components around a raising one may run, within its step's limit


class CallersTimeout(BaseException):  # noqa: N818  (not an Exception: their `except Exception` cannot eat it)
    """The components around a raising one ran past CALLERS_LIMIT: the calls recorded so far decide."""


def _run_callers(comp: Component, ctx: Context) -> None:
    """The checks of the file's components whose code calls this one's (a model around a layer), run
    for what their code passes it (accepted.py records it), their results dropped; two at most."""
    calls, root = _called_by(ctx), comp.name.split(".")[0]
    around = [c for c in ctx.found if root in reachable(calls(c.name.split(".")[0]), calls)]
    kept = (ctx.partial, ctx.raised, ctx.hyperparameter_note, ctx.learner.calls, ctx.learner.nan_calls)
    with contextlib.suppress(CallersTimeout), cpu_limit(CALLERS_LIMIT, CallersTimeout):
        for other in around[:2]:
            with contextlib.suppress(Exception, SystemExit), torch.no_grad(), ctx.hyperparameters(other):
                runner_for(other.kind)(other, ctx)
    ctx.partial, ctx.raised, ctx.hyperparameter_note, ctx.learner.calls, ctx.learner.nan_calls = kept


def _cache_slices(comp: Component, result: ComponentResult) -> None:
    """A component that failed or raised, nothing named, whose code writes a pre-allocated KV cache
    elsewhere than from start_pos or reads it to another end (cache_slices.py): that line, a FAIL."""
    if result.status not in (FAIL, ERROR) or any(f.name != DEPARTS for f in result.findings):
        return
    found = cache_slice_findings(comp.obj)
    if found:
        result.findings, result.status = found, FAIL


def _nothing_found(comp: Component, ctx: Context, result: ComponentResult, error: LearnerError) -> None:
    """An ERROR with nothing found (its `error` never None: _run_checked gives every ERROR one): a
    starter's TODO; NOT CHECKED where the error says nothing of the learner's code, unless their forward
    raises on a plain input it accepts (`raises_alone`): then their exception."""
    if not_implemented(comp, error):
        result.status = TODO
    elif (needs_skipped(error, ctx.skipped) or cannot_check(error) or method_on_stand_in(comp, result)
          or guessed_input(comp, error) or float64_refused(error)):
        theirs = None
        if error.kind == "mapping":
            with ctx.hyperparameters(comp):
                theirs = raises_alone(comp, ctx)
        if theirs is not None:  # their forward raises on a plain input it accepts: their exception
            result.error = theirs
        # NOT CHECKED unless their exception is theirs: at another width their layer runs (own_width.py)
        if theirs is None or other_width(comp, ctx, theirs, plain_run):
            result.status, result.adapter = NOT_CHECKED, adapter_hint(comp)


def _module_source(ctx: Context) -> str:
    try:
        return inspect.getsource(ctx.module)
    except (OSError, TypeError):
        return "pad"  # unknown: padding assumed


def _run_checked(comp: Component, ctx: Context) -> ComponentResult:
    """The kind's runner (and, for a layer that fails unexplained, where it departs); what it raises
    as an ERROR result: the learner's exception, a mapping or discovery error, or a grader's bug."""
    try:
        with torch.no_grad(), ctx.hyperparameters(comp):
            result = _grouped_or_not(comp, ctx)
            note_layer_departure(comp, ctx, result)
    except fp.LearnerFailure as failure:
        ctx.raised = failure.__cause__ or failure.__context__  # its frames: the arguments it raised on
        result = ComponentResult(comp.kind, comp.name, ERROR, error=failure.error)
        partial = ctx.partial
        if partial is not None and partial.name == comp.name:
            if partial.named():  # found before it raised
                partial.status, partial.error = ERROR, failure.error
                result = partial
            else:
                result.driven = partial.driven  # what drove it (their model, or a stand-in that refused it)
                result.findings = partial.findings  # where it parted, before it raised
    except (MappingError, DiscoveryError) as err:
        result = ComponentResult(comp.kind, comp.name, ERROR,
                                 error=LearnerError("mapping", str(err), "__init__", message_zh=err.zh))
    except SystemExit as err:  # sys.exit in their code, called where the runner does not wrap the call
        result = ComponentResult(comp.kind, comp.name, ERROR, error=learner_error(err, ctx.path, "check"))
    except Exception as err:  # a bug of the grader's: said so, never shown as the learner's traceback
        result = ComponentResult(comp.kind, comp.name, ERROR, error=internal_error(err, ctx.path))
    return result


def _grouped_or_not(comp: Component, ctx: Context) -> ComponentResult:
    """The kind's runner; where their code raises built with fewer key/value heads than heads and their
    file's configuration gives as many, or one (grouping.py), run again so, the file's attention taken
    so from then on, noted; their first exception where it raises again."""
    ctx.grouped_asked = False
    try:
        result = runner_for(comp.kind)(comp, ctx)
    except fp.LearnerFailure as failure:
        own = kv_heads_by_default(ctx.module)
        if ctx.own_kv or not ctx.grouped_asked or own not in KV_NOTES:
            raise
        ctx.own_kv = own
        try:
            result = runner_for(comp.kind)(comp, ctx)
        except fp.LearnerFailure:
            ctx.own_kv = None
            raise failure from None
    result.notes += [KV_NOTES.get(ctx.own_kv)] * (bool(ctx.own_kv) & ctx.grouped_asked)
    return result


KV_NOTES = {"ungrouped": UNGROUPED_NOTE, "one": MULTI_QUERY_NOTE}  # the file's own key/value heads, noted


def spaced(words: str) -> str:
    """A kind's Chinese name set into a Chinese sentence: a space before one that starts with a Latin
    letter (认作 BPE 编码与解码, 认作 decoder-only 模型), none before Chinese."""
    return " " * words[:1].isascii() + words


def found_note(found_by: str, kind_name: str) -> Text:
    """The note on how a component no name found was found (FOUND_BY), naming its kind."""
    en, zh = FOUND_BY[found_by]
    kind = KINDS_BY_NAME[kind_name]
    return text(en.format(kind.en), zh.format(spaced(kind.zh)))


# how a component that no name found was found: what the report says ({} is the kind)
FOUND_BY = {
    "signature": ("found as a {} by what it does (the arguments it takes and, for a function of logits, "
                  "what a call returns), not by its name",
                  "按它做的事认作{}（看它接受的参数；"
                  "作用于 logits 的函数还看一次调用的返回值），不是按名字"),
    "structure": ("found as a {} by what it builds (token embeddings, then a list of blocks) and what its "
                  "forward takes (one sequence of ids), not by its name",
                  "按它构造的部件（词嵌入和一列块）和 forward 接受的参数"
                  "（一个 id 序列）认作{}，不是按名字"),
    "decoder_structure": ("found as a {} by what it builds (token embeddings, then a list of blocks) and "
                          "what its forward takes (the ids, the encoder's output, a cache that defaults to "
                          "None), not by its name",
                          "按它构造的部件（词嵌入和一列块）和 forward 接受的参数（id、编码器的输出、"
                          "默认为 None 的缓存）认作{}，不是按名字"),
    "memory_structure": ("found as a {} by what it builds (token embeddings, then a list of blocks) and "
                         "what its forward takes (the ids, then the encoder's output), not by its name",
                         "按它构造的部件（词嵌入和一列块）和 forward 接受的参数（id，然后是编码器的输出）"
                         "认作{}，不是按名字"),
    "lightning": ("found as a {} by its methods (training_step and configure_optimizers, a Lightning "
                  "module's), not by its name",
                  "按它的方法（training_step 和 configure_optimizers，Lightning 模块的写法）"
                  "认作{}，不是按名字"),
    "configured": ("found as a {} by what its configure_optimizers builds: its scheduler stepped, and its "
                   "optimizer's rate over its base rate read at each step (the module built with the "
                   "schedule's settings its constructor takes)",
                   "按它的 configure_optimizers 构造的东西认作{}：逐步调用它的调度器，"
                   "每一步读它的优化器的学习率除以基础学习率（模块用构造函数接受的调度设置来构建）"),
    "mask_code": ("found as a {} by what its code computes (named as a mask, it builds a triangle of "
                  "positions, or reads padding), not by its name alone",
                  "按它的代码算的东西认作{}（名字说是掩码，代码构造位置的三角形，或读取填充），"
                  "不只是按名字"),
    "optimizer": ("found as an {} by what it is: a class that updates parameters itself (a "
                  "torch.optim.Optimizer, or step and zero_grad with a square root in its code)",
                  "按它的写法认作{}：一个自己更新参数的类（torch.optim.Optimizer 的子类，或者有 step 和 "
                  "zero_grad、代码里开平方根）"),
    "methods": ("found as a {} by its methods (encode and decode, with train or bpe), not by its name",
                "按它的方法（encode 和 decode，加上 train 或 bpe）认作{}，不是按名字"),
    "wordpiece_code": ("found as a {} by what its code writes (the \"##\" of a piece inside a word) "
                       "and what it takes (a corpus and a size, or a vocabulary) or has (train, encode and "
                       "decode), not by its name",
                       "按它的代码写的东西（词中间片段的 \"##\"）和它接受的参数（语料和大小，或词表）或它的"
                       "方法（train、encode 和 decode）认作 {}，不是按名字"),
    "schedule_class": ("found as a {} by what it is: a class built with the schedule's settings whose "
                       "__call__ takes the step (the TensorFlow tutorial's CustomSchedule), or built on the "
                       "optimizer with a step(epoch) that sets its rate (timm's schedulers: built on an SGD "
                       "of lr 1 and stepped to each step), or wrapping the optimizer and counting its own "
                       "steps (NoamOpt, ScheduledOptim: its step method called step + 1 times)",
                       "按它的写法认作{}：用调度的设置构造、__call__ 接受步数的类（TensorFlow 教程的 "
                       "CustomSchedule），或者用优化器构造、step(epoch) 设置学习率的类（timm 的调度器："
                       "在 lr 为 1 的 SGD 上构造，再 step 到每一步），或者包着优化器、自己数步数的类"
                       "（NoamOpt、ScheduledOptim：把它的 step 方法调用 step + 1 次）"),
    "behaviour": ("found as a {} by what it does, not by its name: called on a probe's inputs (a "
                  "schedule: the rate at each step rises then falls; a loss: logits and targets, or hidden "
                  "states, the head's weight and targets, give a number near the cross-entropy)",
                  "按它做的事认作{}，不是按名字：在探测的输入上调用它（调度：每一步的学习率先升后降；"
                  "损失：logits 和目标，或隐藏状态、输出层的权重和目标，得到接近交叉熵的数）"),
    "call": ("found as a {} by what it is: a logits processor (its __call__ takes the ids and the scores, "
             "its constructor the setting), built with each setting and called on the logits",
             "按它的写法认作{}：一个 logits 处理器（__call__ 接受 ids 和 scores，构造函数接受设置），"
             "用每个设置构造后在 logits 上调用")}


def _add_notes(comp: Component, ctx: Context, result: ComponentResult) -> None:
    """The notes every kind shares: module-level sizes set, found by signature, a mistake inherited
    from a component it uses, NaN outputs."""
    if ctx.hyperparameter_note is not None:
        result.notes.append(ctx.hyperparameter_note)
    result.notes += taken_notes(comp.obj)  # the arguments taken from the file's own calls
    result.notes += parent_note(comp.obj)  # the arguments its parent model hands it
    if comp.found_by in FOUND_BY:
        result.notes.append(found_note(comp.found_by, comp.kind))
    if not result.named() and result.status in (FAIL, ERROR) and (
            result.error is None or result.error.kind == "exception"):
        parts = inherited(comp, ctx)  # a part's own check quotes its line: nearer than where this one departs
        result.findings = parts or result.findings
    if result.status in (PASS, DIFFERS):
        _names_tell(comp, ctx, result)
    if result.status in (FAIL, ERROR) and ctx.learner.nan_calls and not result.has(
            "nan_on_masked_rows"):
        n, m = ctx.learner.nan_calls, ctx.learner.calls
        result.notes.append(text(
            f"your output had a NaN in {n} of {m} calls (0 / 0, inf - inf, the log or square root of a "
            "negative number, or a softmax of a row that is all -inf?)",
            f"你的输出在 {m} 次调用中有 {n} 次出现 NaN（0 / 0、inf - inf、对负数取 log 或开方，"
            "还是对全为 -inf 的一行做了 softmax？）"))


SMOKED = ("mha", "gqa", "causal_attention", "ffn", "layernorm", "rmsnorm", "block", "encoder_layer")


@torch.no_grad()
def raises_alone(comp: Component, ctx: Context) -> LearnerError | None:
    """For a component whose weights could not be mapped: its exception when, built at check's sizes,
    its own forward raises on a plain (2, 5, d_model) input (q = k = v, no mask): then the learner's
    code fails on an input it accepts (an nn.Linear with its sizes swapped), which is theirs to fix;
    None when it runs (or cannot be built or called), and the component stays NOT CHECKED."""
    from handformer.check.core.context import SIZES, D
    from handformer.check.core.discovery import build
    from handformer.check.runners.attention import caller

    if comp.kind not in SMOKED or not inspect.isclass(comp.obj):
        return None
    try:
        module = build(comp.obj, SIZES, ctx.parts(SIZES))
    except Exception:  # noqa: BLE001  (cannot be built: nothing to say about it)
        return None
    module = module.float()  # in one dtype: gpt-oss builds its layers in bfloat16, its norms in float32
    if caller(module).mask_name in _required(module):  # a mask it requires, in a form check does not know
        return None
    run = plain_run(comp, module)
    errors = [_raised(lambda x=x: run(x), ctx.path) for x in _plain_inputs(D)]
    return errors[0] if all(errors) else None  # one layout it takes runs: its own is not an error


def plain_run(comp: Component, module: nn.Module) -> Callable[[torch.Tensor], Any]:
    """How a layer is called on one plain input: an attention as q = k = v with no mask; any other part
    on its input alone."""
    from handformer.check.runners.attention import caller

    c = caller(module)
    return (lambda x: c.call(x, x, x, None)) if comp.kind in ("mha", "gqa", "causal_attention") else module


def _plain_inputs(d: int) -> list[torch.Tensor]:
    """(2, 5, d), then one sequence (5, d): gpt-oss's layers read (T, D) alone, no batch."""
    x = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(0))
    return [x, x[0]]


def _raised(run: Callable[[], Any], path: str) -> LearnerError | None:
    """The learner's exception (at a line of theirs) where `run` raises; None where it runs."""
    try:
        run()
    except AssertionError:  # an assert of theirs on the sizes check chose (gpt-oss's YaRN): no mistake
        return None
    except Exception as err:  # noqa: BLE001
        error = learner_error(err, path, "forward")
        return error if error.kind == "exception" and error.traceback else None
    return None


def _required(module: nn.Module) -> set[str]:
    """The names of the arguments its forward requires (no default)."""
    return set(names_of(list(inspect.signature(module.forward).parameters.values()))[1])


def method_on_stand_in(comp: Component, result: ComponentResult) -> bool:
    """A class's own method (minimind's `MiniMindForCausalLM.generate`) driven with a stand-in
    as its model raised: it may read attributes only its own class has (an ERROR: its error is set); so
    a loop that unpacks what a stand-in's method returns into the values its own model's gives
    (`memory, src_pad = model.encode(src)`)."""
    error = result.error
    unpacks = "values to unpack" in error.message
    if ("." not in comp.name and not unpacks) or error.kind != "exception" or not driven_by_stand_in(result):
        return False
    error.kind = "stand_in"
    return True


# how a component found by what it does, not by a name its kind tables hold, may be found (FOUND_BY)
GUESSED = ("signature", "mask_code", "methods", "memory_structure")
# the exceptions that say an argument was not of the form the code takes (a tensor where it reads an
# int, a tuple where it reads a dict), not a computation that went wrong
FORM_ERRORS = ("TypeError", "ValueError", "AttributeError", "KeyError")


def guessed_input(comp: Component, error: LearnerError) -> bool:
    """A component whose kind check guessed from what it does (GUESSED) and whose code refused the form
    of check's input (FORM_ERRORS: T5's span-noise mask `random_spans_noise_mask(length)` handed a
    tensor, a loop reading dict batches handed tuples): the guess of what it is, or of how it is called,
    may be check's mistake, never a failure of theirs (a cannot_call, said so)."""
    guessed = comp.found_by in GUESSED and error.kind == "exception" and error.message.startswith(FORM_ERRORS)
    return guessed and _cannot_call(error, GUESSED_WHY, GUESSED_WHY_ZH)


GUESSED_WHY = ("check guessed its kind from what it does, and its code refused the form of check's input: "
               "it may be no such component, or be called otherwise")
GUESSED_WHY_ZH = ("检查程序是按它做的事猜出它的类型的，它的代码不接受检查程序给的输入的形式，"
                  "也许它不是这一类组件，或者不是这样调用的")


def float64_refused(error: LearnerError) -> bool:
    """Their code raised a dtype mismatch in check's float64 run: a tensor it makes in a float32 it names
    (a cache's preallocated scales) meets check's float64 ones; in the float32 their code is written for,
    none is raised: check's doing, a cannot_call that says so."""
    mismatch = error.kind == "exception" and DTYPE_MISMATCH.search(error.message) is not None
    return mismatch and _cannot_call(error, FLOAT64_WHY, FLOAT64_WHY_ZH)


FLOAT64_WHY = ("check runs your code in float64, and a tensor your code makes in a float32 it names met "
               "check's float64 ones; in float32 it would run: write an adapter, or make the tensor in the "
               "dtype of its input")
FLOAT64_WHY_ZH = ("检查程序用 float64 运行你的代码，你的代码里写明 float32 的张量"
                  "遇到了检查程序的 float64 张量；在 float32 下它能运行：写一个 adapter，"
                  "或者让这个张量用输入的 dtype")


def _cannot_call(error: LearnerError, en: str, zh: str) -> bool:
    """The error made check's: a cannot_call that says why (`en`, `zh`) before the exception's text."""
    error.kind, error.message_zh = "cannot_call", f"{zh}（原文：{error.message}）"
    error.message = f"{en} ({error.message})"
    return True


def driven_by_stand_in(result: ComponentResult) -> bool:
    """Whether the component was driven with a stand-in of check's (a loop handed a model of check's)."""
    return result.driven is not None and result.driven["en"].startswith("a stand-in")


def needs_skipped(error: LearnerError, skipped: list[str]) -> bool:
    """An exception that a top-level statement that was not run explains: a NameError of a name it
    defines (Karpathy's stoi, built from the data file; gemma_pytorch's `tokenizer`, whose import needs
    sentencepiece), that statement named where its code names the name."""
    if not skipped or not error.message.startswith("NameError"):
        return False
    name = re.escape((error.message.split("'") + ["", ""])[1])  # NameError: name 'stoi' is not defined
    said = [s for s in skipped if re.search(rf"\b{name}\b", s.split(" (")[0])]  # its code names it
    error.kind = "cannot_call"
    en, zh = (said + ["see the skipped statements"])[0], (said + ["见没有运行的顶层语句"])[0]
    error.message_zh = f"{error.message}（这个名字由一条没有运行的顶层语句定义：{zh}）"
    error.message += f" (defined by a top-level statement that was not run: {en})"
    return True


def not_implemented(comp: Component, error: LearnerError) -> bool:
    """A component that is still a starter's TODO: it raised NotImplementedError, or its own code
    raises one and it failed before getting there (a class whose `__init__` builds no layers yet)."""
    if error.kind == "not_implemented":
        return True
    try:
        lines = source_lines([comp.obj])
    except Exception:  # no source (a builtin, a lambda): not a starter
        return False
    todo = [n for n, t in lines if re.match(r"\s*raise NotImplementedError\b", t) and n in _unguarded(lines)]
    if error.kind not in ("mapping", "exception") or not todo:
        return False
    error.kind = "not_implemented"
    error.message = (f"not implemented yet: line {todo[0]} still raises NotImplementedError "
                     f"({error.message})")
    return True


def _unguarded(lines: list[tuple[int, str]]) -> set[int]:
    """The lines of `lines` (numbered as in their file) that a function's body holds as its own
    statements, under no `if`: a starter's `raise NotImplementedError` is one; litgpt's under
    `if self.config.shared_attention_norm:` guards a setting it does not support (all of them where
    the code cannot be read)."""
    try:
        tree = ast.parse(textwrap.dedent("".join(t + "\n" for _, t in lines)))
    except SyntaxError:
        return {n for n, _ in lines}
    first = lines[0][0] - 1
    return {first + s.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for s in f.body}


def _names_tell(comp: Component, ctx: Context, result: ComponentResult) -> None:
    """A layer or model that passes fails when a part it uses has a mistake only names tell (a GPT-2
    MLP computing ReLU): its outputs match the convention the part's code computes, and cannot show it."""
    from handformer.check.runners.pieces import DECODER_ONLY, ENCODER_DECODER, NAMES_TELL

    if comp.kind not in DECODER_ONLY | ENCODER_DECODER:  # a loop driving the model computes no FFN itself
        return
    told = [f for f in inherited(comp, ctx) if f.name in NAMES_TELL]
    if told:
        result.findings += told
        result.status = FAIL


def _named_parts(comp: Component, ctx: Context, result: ComponentResult) -> None:
    """An unnamed FAIL of a component that holds what the reference has no place for (a forget gate, a
    router): the catalogued mistakes of the parts it uses are its evidence, named before `settle` makes
    an unnamed departure NOT CHECKED (FoX's block whose SwiGLU gates the wrong branch)."""
    if ctx.unmapped.get(comp.name) and result.status == FAIL and not result.named():
        result.findings = [f for f in inherited(comp, ctx) if f.name != DEPARTS] or result.findings


HAS = {DEPARTS: ("parts from the reference", "与参考不同")}  # what a part's finding says of it, if no mistake


def _called_by(ctx: Context) -> Callable[[str], set[str]]:
    """The file's other objects that the source of the object of a name calls."""
    own = defined_here(ctx.module)
    sources = {name: source_text(obj) for name, obj in own.items()}

    def called(name: str) -> set[str]:
        return {o for o in own if o != name and re.search(rf"\b{re.escape(o)}\s*\(", sources.get(name, ""))}
    return called


def _used(comp: Component, ctx: Context) -> dict[str, ComponentResult]:
    """The results of the learner's components this one uses (its source calls them, directly or
    through their other functions), checked before it."""
    called = _called_by(ctx)
    reached = reachable(called(comp.name.split(".")[0]), called)
    return {name: ctx.results[name] for name in sorted(reached & ctx.results.keys())}


def inherited(comp: Component, ctx: Context) -> list[Finding]:
    """The mistakes of the learner's other components that this one uses (its source calls them,
    directly or through their other functions), for a component that fails with none of its own: a
    block whose FFN has no down projection, a generate loop whose sampling step is wrong."""
    called = _called_by(ctx)
    reached = reachable(called(comp.name.split(".")[0]), called)
    out = []
    for name in sorted(reached):
        for f in ctx.results.get(name, ComponentResult("", "")).findings:
            if f.name not in {g.name for g in out}:
                has, has_zh = HAS.get(f.name, ("has this mistake", "有这个错误"))
                out.append(Finding(f.name, text(
                    f"{comp.name} uses {name}, which {has} (its own check says: {f.observed['en']})",
                    f"{comp.name} 用到了 {name}，它{has_zh}（它自己的检查给出了诊断：{f.observed['zh']}）"),
                    f.line, f.code, f.form))
    return out


def internal_error(err: Exception, path: str) -> LearnerError:
    """An exception of handformer's own code while checking: a NOT CHECKED in plain words, with the
    adapter to write; check's own exception (and the learner's line it was running, if any) kept as the
    error's detail, which --json carries and --debug shows (tests require that this never happens)."""
    theirs = learner_error(err, path, "check").traceback
    frames = traceback.extract_tb(err.__traceback__)[::-1]
    # the grader's line that raised (in torch's code: the grader's line that called it)
    here = max(frames, key=lambda f: Path(f.filename).is_relative_to(PACKAGE))
    at = f" at {Path(here.filename).name}:{here.lineno}"
    detail = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}{at}"
    return LearnerError("internal", INTERNAL_EN, "check", theirs, INTERNAL_ZH, detail)


PACKAGE = Path(__file__).resolve().parents[2]  # handformer/: where the grader's own frames are

INTERNAL_EN = ("check could not drive this component: one of check's own steps does not read the way your "
               "code arranges its tensors (this says nothing against your code); the adapter below builds it "
               "as check's inputs expect (--debug shows check's own error)")
INTERNAL_ZH = ("检查程序驱动不了这个组件：检查程序自己的某个步骤读不懂你的代码排列张量的方式"
               "（这不说明你的代码有错）；下面的适配函数按检查程序的输入构建它"
               "（加 --debug 可以看到检查程序自己的错误）")


def _ignored(*told: Any) -> None:
    """A callback that does nothing with what it is told."""


def check_file(path: str, overrides: dict[str, str] | None = None, only: list[str] | None = None,
               convention: str | None = None, emit: Callable[[ComponentResult], None] = _ignored,
               started: Callable[[str, str], None] = _ignored, skip: Sequence[str] = (),
               adapters: str | None = None, definitions_only: bool = False) -> FileResult:
    """Import the learner's file and check each component it defines. `started(step, kind)` is told
    each step before it runs: "import", then each component's name and the kind it is checked as."""
    from handformer.check.core.context import Context

    result = FileResult(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    started("import", "")
    with seeded():  # each step from the same random state, whatever ran before it (core/seeded.py)
        module = _import(path, result, definitions_only)
        found = module and _discover(module, result, adapters, path, overrides, only)
    if not found:
        return result
    components, everything = found
    todo = [c for c in components if c.name not in skip]
    ctx = Context(path, module, {c.kind: c for c in reversed(everything)}, convention)
    ctx.skipped, ctx.found = result.skipped, everything
    read_activations(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread costs more than it saves
    try:
        with float64_kept(), whole_topk():  # their float32 casts keep check's float64
            for comp in todo:
                started(comp.name, comp.kind)
                with seeded():
                    res = check_component(comp, ctx)
                result.components.append(res)
                emit(res)
    finally:
        torch.set_num_threads(threads)
    return result


def _import(path: str, result: FileResult, definitions_only: bool) -> types.ModuleType | None:
    """The learner's module (its definitions alone when its top level raises); None, with the error
    in result, when it cannot be had."""
    try:
        if definitions_only:
            module, result.skipped = import_definitions(path)
        else:
            module = import_learner(path)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # their module body: anything it raises is reported
        error = learner_error(err, path, "import")
        if definitions_only or isinstance(err, (SyntaxError, SystemExit)) or error.kind != "exception":
            result.error = error
            return None
        module, result.skipped = import_definitions(path)  # their definitions, without the top level
    return module


def _discover(module: types.ModuleType, result: FileResult, adapters: str | None, path: str,
              overrides: dict[str, str] | None, only: list[str] | None,
              ) -> tuple[list[Component], list[Component]] | None:
    """The components to check and every component (a layer may be built from theirs); None, with
    the error in result, when there is none or --component names what the file lacks."""
    try:
        forward_defaults_(defined_here(module).values())  # a layer number, as the file's own calls pass it
        found = adapter_functions(load_adapters(adapters, path), module)
        components = find_components(module, overrides, only, found)
        # every component is what `only` finds when it names no kind: found once
        everything = components if only is None else find_components(module, overrides, None, found)
    except DiscoveryError as err:  # --component names something the file does not define
        result.error = LearnerError("discovery", str(err), "discovery",
                                    message_zh=f"--component 有误：{err.zh or err}")
        return None
    if not components:
        names = ", ".join(defined_names(module)) or "nothing"
        examples = ", ".join(ns[0] for ns in NAMES.values() if ns)
        result.error = LearnerError(
            "nothing_found", f"found no component to check; the file defines: {names}. handformer finds "
            f"components by name, one example a kind: {examples}", "discovery",
            message_zh=f"没有找到可检查的组件；文件里定义了：{names}。"
            f"handformer 按名字找组件，每类一个例子：{examples}")
        return None
    return components, everything
