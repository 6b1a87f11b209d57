"""Settings the reference has no place for, checked at their neutral values.

A component that departs with no catalogued mistake naming it may read settings of its own that check
maps to nothing: a config field (Gemma 2's `config.sliding_window`), a constructor's or a function's
argument with a default (an optimizer's `update_interval=4`, a model's `attn_scale=0.1`). Read from the
code's form: the defaults of the functions and constructors of the learner's file that the component
reaches, and the fields of its config classes that the code reads (`.field`). Each one whose name says
what leaves the computation as the reference's (`NEUTRAL_BY_WORDS`: a window or sink count wide enough that
nothing is cut, an interval of 1, a penalty 0, a scale 1; a flag that turns one on False) is set to
that value as data (its default changed for the run), all of them together, and the component graded
again. Where it passes there, it passes, with a note naming each setting and both values; a catalogued
mistake found there FAILs as ever; where it still departs, it is NOT CHECKED, the reason naming the
settings and the line where it parts (unmapped.settle), never FAIL.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import itertools
import operator
import re
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from handformer.check.core.discovery import ARGUMENTS, FIXED, SWITCHES, size_of
from handformer.check.core.options_object import KNOWN, NEUTRAL
from handformer.check.core.result import FAIL, PASS, ComponentResult, Text, text
from handformer.check.core.score_scale import configured_settings
from handformer.check.core.source import file_objects, function_nodes, reachable, source_text
from handformer.check.core.unmapped import free_failed, settle
from handformer.time_limit import cpu_limit

if TYPE_CHECKING:
    from handformer.check.core.context import Context
    from handformer.check.core.discovery import Component

WIDE = 4096  # a window or sink count wider than any input check gives: nothing is cut
# the words of a setting's name -> the value at which it leaves the reference's computation as it is (the
# first form of the table its words say: a window's layer pattern is an interval, every layer global)
NEUTRAL_BY_WORDS: tuple[tuple[frozenset[str], Any], ...] = (
    (frozenset({"interval", "every", "period", "pattern"}), 1),
    (frozenset({"window", "sink", "sinks", "recent"}), WIDE),  # (not a chunk: it may only tile, as flash's)
    (frozenset({"penalty", "alpha", "coef", "coefficient", "lambda", "smoothing"}), 0),
    (frozenset({"scale", "scaling", "multiplier", "mult", "factor"}), 1),
)
BY_WORD = {word: (rank, value) for rank, (words, value) in enumerate(NEUTRAL_BY_WORDS) for word in words}
# the words of settings check reads itself (a norm's eps, RoPE's base, a soft cap read from the module)
READ_WORDS = frozenset({"eps", "epsilon", "theta", "base", "rope", "softcap", "softcapping", "cap", "norm",
                        "qk"})
MAPPED = frozenset({*itertools.chain.from_iterable(ARGUMENTS.values()), *FIXED, *SWITCHES, *KNOWN, *NEUTRAL})
# a setting's type -> its neutral value of its form: a flag that turns one on (use_sliding_window) False
CAST = {bool: lambda _: False, int: int, float: float}
DUNDERS = {"__init__", "__post_init__", "__repr__", "__eq__", "__hash__"}  # a dataclass's own methods
# CPU seconds of the component's step (20 s) that the first run and the one at neutral values share
STEP_SHARE = 14.0


@dataclasses.dataclass(frozen=True)
class Setting:
    owner: Any  # the function whose default holds it (a constructor, a config class's __init__)
    name: str
    value: Any  # the file's value
    neutral: Any


class TrialsTimeout(BaseException):  # noqa: N818  (not an Exception: their `except Exception` cannot eat it)
    """The run at neutral values ran past what was left of STEP_SHARE: NOT CHECKED, as where it departs."""


def neutral_value(name: str, value: Any) -> Any:
    """The value of a setting of this name that leaves the computation as the reference's, in the type
    of its `value`; `value` itself where check maps the name or its name says no neutral value."""
    words = frozenset(name.lower().split("_"))
    if name.lower() in MAPPED or size_of(name) is not None or words & READ_WORDS or type(value) not in CAST:
        return value
    form = min(map(BY_WORD.__getitem__, words & BY_WORD.keys()), default=None)  # (rank, neutral value)
    return value if form is None else CAST[type(value)](form[1])


def _reached(obj: Any) -> list[Any]:
    """`obj` and the file's classes and functions its code names, and theirs in turn."""
    own = {**file_objects(obj), "": obj}  # "": obj itself, where its file does not name it
    named = dict(zip(own, (set(re.findall(r"\b\w+\b", source_text(v))) & own.keys() for v in own.values())))
    return list(map(own.__getitem__, sorted(reachable([""], named.__getitem__))))


def _attributes_read(objs: list[Any]) -> set[str]:
    """Every attribute name the code of `objs` reads (`config.sliding_window`, `self.k`), each object's
    source parsed alone (a method's is indented)."""
    nodes = itertools.chain.from_iterable(map(function_nodes, objs))
    return set(map(operator.attrgetter("attr"), filter(ast.Attribute.__instancecheck__, nodes)))


def _functions(obj: Any) -> list[Any]:
    """A function itself; a class's own methods (its constructor, a dataclass's generated one)."""
    return list(filter(types.FunctionType.__instancecheck__, [obj, *vars(obj).values()]))


def _holds_only(obj: Any, cls: Any) -> bool:
    """A class of settings: one other than `obj` with no method but dunders (a config dataclass)."""
    methods = set(map(operator.attrgetter("__name__"), _functions(cls))) - DUNDERS
    return cls is not obj and isinstance(cls, type) and not methods


def settings_read(obj: Any) -> list[Setting]:
    """The settings `obj`'s computation reads that check maps to nothing, at a value that is not
    neutral: each default of the functions and constructors it reaches, of a class of settings only
    the fields their code reads."""
    reached = _reached(obj)
    settings_class = functools.partial(_holds_only, obj)
    read = _attributes_read(list(itertools.filterfalse(settings_class, reached)))
    found = {}
    # a graded function's own arguments are its runner's inputs, filled by their role (GAE's lam): not these
    owners = [o for o in reached if not (o is obj and isinstance(obj, types.FunctionType))]
    for owner, fn in ((o, f) for o in owners for f in _functions(o)):
        for p in inspect.signature(fn).parameters.values():
            setting = Setting(inspect.unwrap(fn), p.name, p.default, neutral_value(p.name, p.default))
            if setting.neutral != p.default and (p.name in read or not settings_class(owner)):
                found.setdefault(p.name, setting)
    return list(found.values())


def _set_default(fn: Any, name: str, value: Any) -> None:
    params = inspect.signature(fn).parameters.values()
    if name in (fn.__kwdefaults__ or {}):
        fn.__kwdefaults__ = {**fn.__kwdefaults__, name: value}
        return
    positional = [p.name for p in params if p.default is not p.empty and p.kind is not p.KEYWORD_ONLY]
    defaults = list(fn.__defaults__)
    defaults[positional.index(name)] = value
    fn.__defaults__ = tuple(defaults)


@contextlib.contextmanager
def set_neutral(settings: list[Setting]) -> Iterator[None]:
    """Each setting's default its neutral value, for the time of the block."""
    owners = set(map(operator.attrgetter("owner"), settings))
    kept = [(fn, fn.__defaults__, fn.__kwdefaults__) for fn in owners]
    try:
        for s in settings:
            _set_default(s.owner, s.name, s.neutral)
        yield
    finally:
        for fn, defaults, kwdefaults in kept:
            fn.__defaults__, fn.__kwdefaults__ = defaults, kwdefaults


def _note(settings: list[Setting]) -> Text:
    en, zh = ("; ".join(f"{s.name} = {s.neutral!r}{words.format(s.value)}" for s in settings)
              for words in (" (your value {!r} not checked)", "（你的取值 {!r} 没有检查）"))
    return text(f"checked with {en}: settings handformer's reference has no place for, at their neutral "
                "values", f"检查时取 {zh}：handformer 的参考实现没有对应的设置，取它们的中性值")


def _reason(settings: list[Setting]) -> Text:
    at = ", ".join(f"{s.name} = {s.value!r}" for s in settings)
    return text(f"it reads settings the reference has no place for ({at}) and departs at their neutral "
                "values too", f"它读取参考实现没有对应的设置（{at}），取中性值时也不同")


def _stem(word: str) -> str:
    return re.sub("(ing|ed|s)$", "", word)  # sinks and sink, smoothing and smoothed: one word


def _said(words: set[str], setting: Setting) -> bool:
    """Whether a report of these words names the setting, or a setting of its form (a window it measured,
    a multiplier it read): one check maps already."""
    own = set(map(_stem, setting.name.lower().split("_"))) & set(map(_stem, BY_WORD))
    return bool({setting.name, *own} & words)


def _own_windows(obj: Any) -> set[str]:
    """The window arguments of the component's own constructor (Longformer's attention_window): its
    attention's runner measures the window it is built with."""
    with contextlib.suppress(TypeError, ValueError):
        return set(filter(re.compile("window").search, inspect.signature(obj).parameters))
    return set()


def _configured(comp: Component, ctx: Context, read: list[Setting]) -> set[str]:
    """The settings check reads as configured factors of the module's layers (score_scale.py): none
    where it reads none, or where the module cannot be built."""
    with contextlib.suppress(Exception):
        built = ctx.build(comp, checked=False) if read else nn.Module()
        return set(itertools.chain.from_iterable(map(configured_settings, built.modules())))
    return set()


def at_neutral(comp: Component, ctx: Context, result: ComponentResult,
               run: Callable[[Component, Context], ComponentResult], spent: float) -> ComponentResult:
    """A FAIL with nothing named, of a component that reads settings check maps to nothing (none its
    report names, nor one of its form: `_said`): graded again with all of them at their neutral values
    (`run` the kind's runner, in what is left of STEP_SHARE after the `spent` seconds of the first run);
    PASS there with the note, a catalogued mistake there FAILs, else NOT CHECKED naming them. Any other
    result as it is."""
    unnamed = (result.status, bool(result.named())) == (FAIL, False) and not free_failed(result)
    said = repr((result.notes, result.checks, result.convention)).lower()  # what check read, and says so
    read = settings_read(comp.obj) if unnamed else []
    words = {*map(_stem, re.findall("[a-z]+", said)), *_configured(comp, ctx, read), *_own_windows(comp.obj)}
    settings = list(itertools.filterfalse(functools.partial(_said, words), read))
    if not settings:
        return result
    ctx.partial, ctx.raised = None, None
    with contextlib.suppress(TrialsTimeout), cpu_limit(max(STEP_SHARE - spent, 0.1), TrialsTimeout), (
            set_neutral(settings)):
        again = run(comp, ctx)
        again.notes += [_note(settings)] * (again.status == PASS)
        if again.status == PASS or again.named():
            return again
    settle(result, [_reason(settings)])
    return result
