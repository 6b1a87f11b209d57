"""Whether an exception the learner's code raised under check's driving is theirs to fix.

Check drives a component with inputs of the forms its kind's tutorial uses; a learner's code may take
another (logits [batch, seq, vocab] where check passes [tokens, vocab], a mask [heads, query, key] where
check passes [query, key], a padding mask [batch, key] where check passes [batch, 1, key]). An exception
is charged to the learner only where their code raises on inputs it accepts. The exception's own frames
give the learner's function check called (the entry), its arguments, and the arguments the raising
line reads (the same objects):
- an entry handed one of check's stand-ins (a model or criterion of check's) raised on what the
  stand-in gave: never the learner's;
- a raising line that reads none of the entry's arguments computed the wrong thing from inputs it
  accepts (a transpose that does not fit): the learner's, a FAIL at their line;
- a raising line that reads an argument: the learner's own code that calls the entry (a model of their
  file around a layer) is run, its calls recorded. The same form as theirs, or their own call raising
  at that line too: the learner's. Their own calls of another form that run: check's form, not theirs.
  No call of theirs: the argument's other forms (`alternatives`, data) are tried in turn. Either way
  check's form is not one the code takes: NOT CHECKED, the forms named, never a FAIL.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import re
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.defaults import then
from handformer.check.core.result import LearnerError
from handformer.check.core.source import learner_error


@dataclass
class Entry:
    """The learner's function that check called, with the arguments it was called with; `read`: the
    names of the arguments the raising line reads (the same objects); `line`: that line's number;
    `home`: where the function is looked up (its class, or its module's globals) under `name`."""

    fn: Callable[..., Any]
    args: dict[str, Any]
    read: list[str]
    line: int
    home: Any
    name: str
    path: str


@dataclass
class Call:
    """A call of the entry by the learner's own code: the forms of the read arguments (compared, and
    shown), and what it raised (None: it ran)."""

    forms: dict[str, str]
    shown: list[str]
    raised: LearnerError | None = None


def _ours(err: BaseException | None, path: str) -> list[tuple[types.FrameType, int]]:
    """The traceback's frames in the learner's file, outermost first, with the line each was at."""
    tb, out = getattr(err, "__traceback__", None), []
    while tb is not None:
        out += [(tb.tb_frame, tb.tb_lineno)] * (os.path.abspath(tb.tb_frame.f_code.co_filename) == path)
        tb = tb.tb_next
    return out


def entry_of(err: BaseException | None, path: str) -> Entry | None:
    """The learner's entry function, its arguments and what the raising line reads; None where no
    frame of the learner's file is in the traceback or the entry cannot be called again."""
    ours = _ours(err, os.path.abspath(path))
    if not ours:
        return None
    (outer, _), (inner, line) = ours[0], ours[-1]
    code = outer.f_code
    args = {n: outer.f_locals.get(n) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]}
    owner = args.pop("self", None)
    home = _home(owner, code.co_name, outer.f_globals)
    raw = inspect.getattr_static(home, code.co_name, None)
    if getattr(inspect.unwrap(raw), "__code__", None) is not code:  # not the function that ran
        return None
    names = _names_on(inner.f_code.co_filename, line) & inner.f_locals.keys()
    on_line = {id(inner.f_locals[n]) for n in names if isinstance(inner.f_locals[n], Tensor)}
    plain = int(isinstance(owner, torch.nn.Module))  # a layer's hidden states, a model's ids: not in question
    read = [n for n in list(args)[plain:] if id(args[n]) in on_line]
    return Entry(raw.__get__(owner, type(owner)), args, read, line, home, code.co_name, path)


def _home(owner: Any, name: str, space: dict[str, Any]) -> Any:
    """Where the entry is looked up: the class of the owner's MRO that defines the method `name`, or
    the module of a function's globals."""
    classes = [c for c in type(owner).__mro__ if name in vars(c)]  # none for a function (owner None)
    return (classes + [sys.modules.get(space.get("__name__", ""))])[0]


def _names_on(filename: str, line: int) -> set[str]:
    """The names the source line reads (not an attribute's), its comment left out."""
    return set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", linecache.getline(filename, line).split("#")[0]))


def stand_in_argument(entry: Entry) -> str | None:
    """The name of an argument of the entry that is one of check's own objects (a stand-in model or
    criterion), else None."""
    return next((n for n, v in entry.args.items() if type(v).__module__.startswith("handformer.")), None)


def form_of(value: Any) -> str:
    """A value's form, as compared: a tensor's rank and dtype, else its type."""
    if isinstance(value, Tensor):
        return f"rank {value.dim()} {str(value.dtype).removeprefix('torch.').rstrip('0123456789')}"
    return type(value).__name__


def shown(value: Any) -> str:
    """A value as the report shows it: a tensor's shape and dtype, else its type."""
    return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}" if isinstance(
        value, Tensor) else type(value).__name__


@contextlib.contextmanager
def recording(entry: Entry) -> Iterator[list[Call]]:
    """The calls of the entry while the block runs (the learner's own code calling it), each with the
    forms of the arguments the raising line reads; the entry put back after."""
    original = inspect.getattr_static(entry.home, entry.name)
    signature, calls = inspect.signature(original), []

    @functools.wraps(original)
    def recorder(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        values = [bound.arguments.get(n) for n in entry.read]
        call = Call({n: form_of(v) for n, v in zip(entry.read, values)},
                    [f"{n} {shown(v)}" for n, v in zip(entry.read, values)])
        calls.append(call)
        try:
            return original(*args, **kwargs)
        except Exception as err:
            call.raised = learner_error(err, entry.path, "forward")
            raise
    setattr(entry.home, entry.name, recorder)
    try:
        yield calls
    finally:
        setattr(entry.home, entry.name, original)


Said = tuple[str, str]  # a description in English and in Chinese


def _mask_forms(m: Tensor) -> list[tuple[Said, Tensor]]:
    """A mask in each documented polarity: True = keep, True = masked, additive 0 / -inf (kept where
    it holds its largest value: True, 1, or an additive mask's 0)."""
    keep = m == m.max()
    additive = torch.zeros(keep.shape, dtype=torch.get_default_dtype())
    return [((", bool, True = keep", "，bool，True 表示可以看"), keep),
            ((", bool, True = masked", "，bool，True 表示屏蔽"), ~keep),
            ((", additive, 0 = keep, -inf = masked", "，加性，0 表示可以看，-inf 表示屏蔽"),
             additive.masked_fill(~keep, float("-inf")))]


def _layouts(t: Tensor) -> list[tuple[Said, Tensor]]:
    """A tensor in each layout a kind documents: as given, a leading dimension added, and as
    [batch, rest], [batch, 1, rest] and [batch, 1, 1, rest] (a mask's [batch, key] layouts)."""
    flat = t.reshape((*t.shape[:1], -1))  # [batch, everything else]
    return [(("as given", "原样"), t), (("with a leading dimension", "前面加一维"), t[None]),
            (("as [batch, rest]", "改成 [batch, rest]"), flat),
            (("as [batch, 1, rest]", "改成 [batch, 1, rest]"), flat.unsqueeze(-2)),
            (("as [batch, 1, 1, rest]", "改成 [batch, 1, 1, rest]"), flat[..., None, None, :])]


def alternatives(entry: Entry) -> list[tuple[Said, dict[str, Any]]]:
    """The entry's arguments in their other forms, each described: every tensor argument with a
    leading dimension ([tokens, vocab] logits as [1, tokens, vocab]); then each read argument in each
    layout, and a mask (its name says mask or pad) left out (None) and in each polarity too."""
    tensors = {n: v[None] for n, v in entry.args.items() if isinstance(v, Tensor)}
    out = [(LEADING, {**entry.args, **tensors})]
    for name in entry.read:
        value, mask = entry.args[name], re.search("mask|pad", name, re.I) is not None
        out += [((f"{name} None", f"{name} 为 None"), {**entry.args, name: None})] * mask
        polarities = _mask_forms(value) if mask else [(("", ""), value)]
        out += [((f"{name} {where[0]}{how[0]}", f"{name} {where[1]}{how[1]}"), {**entry.args, name: shaped})
                for how, form in polarities for where, shaped in _layouts(form)]
    return out


def runs(fn: Callable[..., Any], args: dict[str, Any]) -> bool:
    """Whether the entry runs on these arguments (any exception: it does not)."""
    try:
        with torch.no_grad():
            fn(**args)
    except Exception:  # noqa: BLE001  (their code on a form tried: raising is the answer)
        return False
    return True


def judged(err: BaseException | None, path: str, callers: Callable[[], Any]) -> LearnerError | None:
    """Whose the exception of the learner's code under check's driving is (module docstring): None
    where it is theirs as raised; an exception of theirs where their own call raised (theirs, at the
    line of that call); a cannot_call saying why it is not theirs. `callers` runs the learner's own
    code that calls the entry (the components of their file around it)."""
    entry = entry_of(err, path)
    if entry is None:
        return None
    stand_in = stand_in_argument(entry)
    if stand_in is not None:
        return _why(STAND_IN, _both(stand_in), _both(shown(entry.args[stand_in])))
    if not entry.read:
        return None
    with recording(entry) as calls:
        callers()
    given = "; ".join(f"{n} {shown(entry.args[n])}" for n in entry.read)
    return _by_callers(entry, calls, given) if calls else _by_forms(entry, given)


def _by_callers(entry: Entry, calls: list[Call], given: str) -> LearnerError | None:
    """Their own calls decide: one that raised, of a form none of their calls ran with, is theirs (its
    error; a call of a form that runs elsewhere raised on what check drove their caller with); one of
    check's form makes check's exception theirs; else their calls, of another form, run: check's form
    is not theirs."""
    ours, ran = {n: form_of(entry.args[n]) for n in entry.read}, [c.forms for c in calls if c.raised is None]
    theirs = [c for c in calls if c.forms not in ran]  # each raised: no call of its form ran
    if theirs:
        error = theirs[0].raised
        error.message += OWN_CALL.format("; ".join(theirs[0].shown))
        return error
    return None if ours in ran else _why(CALLERS, _both(entry.line), _both(given),
                                                                 _both("; ".join(calls[0].shown)))


def _by_forms(entry: Entry, given: str) -> LearnerError | None:
    """No call of theirs: the other forms tried in turn; the first that runs named. Where none runs,
    their code raises on every form of its inputs, the kind's own among them: the exception is theirs."""
    tried = alternatives(entry)
    taken = next((how for how, args in tried if runs(entry.fn, args)), None)
    return then(taken, lambda how: _why(TAKES, _both(entry.line), _both(given), how))


OWN_CALL = " (raised where your own code calls it, with {})"  # (an exception's message is not translated)
STAND_IN = ("your code raised on what check's stand-in {} ({}) gave it, not on an input of yours: "
            "the stand-in is check's, and its outputs may not be of the form your code takes",
            "你的代码是在检查程序的替身 {}（{}）给出的东西上出错的，不是在你自己的输入上："
            "替身是检查程序的，它的输出可能不是你的代码接受的形式")
CALLERS = ("line {} raised on an argument check gave in a form of its choosing ({}); your own code calls "
           "it with {} and runs: check drives it in a form your code does not take",
           "第 {} 行出错时读取的参数是检查程序按自己选的形式给的（{}）；你自己的代码调用它时给的是 {}，"
           "并且能运行：检查程序给的形式不是你的代码接受的形式")
TAKES = ("line {} raised on an argument check gave in a form of its choosing ({}); your code runs with "
         "{}: check drives it in a form your code does not take",
         "第 {} 行出错时读取的参数是检查程序按自己选的形式给的（{}）；换成{}，你的代码能运行："
         "检查程序给的形式不是你的代码接受的形式")
LEADING = ("every tensor argument with a leading (batch) dimension", "每个张量参数前面加一维（batch）")


def _both(value: Any) -> Said:
    """A value said the same in both languages."""
    return str(value), str(value)


def _why(texts: Said, *values: Said) -> LearnerError:
    """The reason, a cannot_call error of the learner's forward, in both languages."""
    en, zh = texts
    return LearnerError("cannot_call", en.format(*(v[0] for v in values)), "forward", [],
                        zh.format(*(v[1] for v in values)))
