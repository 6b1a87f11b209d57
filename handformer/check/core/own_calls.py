"""Arguments taken from the learner's own calls. Where check cannot fill an argument of a component by
its name (DbrxBlock(config, block_idx), GLMBlock.forward(..., layer_id), PositionalEmbedding(demb)),
it takes the value the file itself passes where it calls the component, read from the source without
running it, when that value is one of:
- a literal (`heads=2`, `(1, 2)`), or a constant of the file (`N_TOKEN = 50`);
- a loop's index (`for i in range(n)`, `for i, layer in enumerate(self.layers)`): 0, the first layer's;
- an attribute of the config check built and hands the same call (`config.vocab_size`);
- an argument of the caller that check knows as a size (`self.d_model` set from `d_model`: check's width),
  or one the caller's own callers pass, read the same way (a layer number handed down two levels).
Anything else (a tensor built at run time, a call) is not read: the argument stays unfilled, NOT CHECKED.
A component's constructor calls are `Cls(...)`; its forward calls are calls of an attribute that holds
one (`self.attention = SelfAttention(...)`, `self.layers = nn.ModuleList([Block(...) ...])`), directly
or through a loop over it. A forward's arguments are read as plain values only (numbers, strings: no
size, no attribute). Each value taken is noted, with the line of the call it was read from.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from handformer.check.core.defaults import quietly
from handformer.check.core.result import LearnerError, Text, text
from handformer.check.core.source import parsed_file

Keys = Callable[[Any], dict[str, "str | None"]]  # a constructor's arguments -> the size each stands for
Read = "tuple[Any, bool] | None"  # (a value, whether a loop's index), or None: not read
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCALARS = (int, float, str, bool)  # the values a forward is handed from its file's calls
DEPTH = 9  # nested readings followed, at most (a caller's callers' arguments)
SELF_ATTRIBUTE = re.compile(r"self\.(\w+)(?:\[.*\])?")  # self.X, self.X[i]
NO_ARGUMENTS = ast.parse("def f(): pass").body[0].args  # a module's top level takes none


@dataclass(frozen=True)
class Taken:
    """An argument filled with the value the file passes it: its name, the value, the line of the call
    it was read from, and whether it is a loop's index (0: the first layer's)."""

    name: str
    value: Any
    line: int
    loop: bool = False
    said: tuple[str, str] = ("", "")  # (en, zh): the note of a value taken otherwise than from a call


TAKEN: dict[Any, dict[str, Taken]] = {}  # the learner's class or function -> what was taken for it


@dataclass
class Index:
    """What the reading needs of a parsed file, gathered in one walk: each node's function and class
    (by id), the calls by the name called, the calls of `self.X` by X, the values set to `self.X` by
    (function, X), the attributes that hold a call of each name, the names assigned in each function,
    the index names of loops over range / enumerate, the loops over `self.X` and each class's methods."""

    around: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    calls: defaultdict[Any, list[ast.Call]] = field(default_factory=lambda: defaultdict(list))
    attribute_calls: defaultdict[Any, list[ast.Call]] = field(default_factory=lambda: defaultdict(list))
    sets: defaultdict[Any, list[ast.expr]] = field(default_factory=lambda: defaultdict(list))
    holders: defaultdict[Any, set[Any]] = field(default_factory=lambda: defaultdict(set))
    assigned: set[tuple[int, Any]] = field(default_factory=set)
    indices: set[tuple[int, Any]] = field(default_factory=set)
    looped: list[tuple[Any, Any, Any]] = field(default_factory=list)
    methods: dict[tuple[int, str], Any] = field(default_factory=dict)


def _self_attribute(node: ast.AST) -> str | None:
    """`X` of `self.X`, `self.X[i]`; None for anything else."""
    return (SELF_ATTRIBUTE.fullmatch(ast.unparse(node)) or [None, None])[1]


def _note_call(node: ast.Call, index: Index) -> None:
    index.calls[getattr(node.func, "id", "")].append(node)  # a method's call: no name a loop binds
    index.attribute_calls[_self_attribute(node.func)].append(node)


def _note_assign(node: ast.Assign, index: Index) -> None:
    fn = index.around[id(node)][0]
    for target, called in itertools.product(node.targets, ast.walk(node.value)):
        index.holders[getattr(getattr(called, "func", None), "id", None)].add(_self_attribute(target))
        index.sets[(id(fn), _self_attribute(target))] += [node.value] * (called is node.value)
        index.assigned.add((id(fn), getattr(target, "id", None)))


def _note_loop(node: ast.For | ast.comprehension, index: Index) -> None:
    fn = id(index.around[id(node)][0])
    called = getattr(getattr(node.iter, "func", None), "id", None)
    index.indices.add((fn, getattr(LOOP_INDEX.get(called, _nothing)(node.target), "id", None)))
    index.looped += [(fn, getattr(name, "id", None), _self_attribute(over))
                     for name, over in itertools.product(ast.walk(node.target), ast.walk(node.iter))]


def _note_function(node: ast.FunctionDef, index: Index) -> None:
    index.methods[(id(index.around[id(node)][1]), node.name)] = node


def _nothing(*_: Any) -> None:
    return None


# a loop's index: the target of `for i in range(...)`, the first name of `for i, x in enumerate(...)`
LOOP_INDEX = {"range": lambda target: target, "enumerate": lambda target: getattr(target, "elts", [None])[0]}
NOTED = {ast.Call: _note_call, ast.Assign: _note_assign, ast.For: _note_loop, ast.comprehension: _note_loop,
         ast.FunctionDef: _note_function}


@functools.lru_cache(maxsize=8)
def _index(tree: ast.Module) -> Index:
    index = Index()

    def visit(node: ast.AST, fn: Any, cls: Any) -> None:
        for child in ast.iter_child_nodes(node):
            index.around[id(child)] = (fn, cls)  # a function's own node: the function it is in
            NOTED.get(type(child), _nothing)(child, index)
            inner = child if isinstance(child, FUNCTIONS) else fn
            visit(child, inner, child if isinstance(child, ast.ClassDef) else cls)

    visit(tree, None, None)
    return index


def constructor_calls(index: Index, name: str) -> list[ast.Call]:
    """The calls `name(...)` of the file."""
    return index.calls[name]


def instance_calls(index: Index, name: str) -> list[ast.Call]:
    """The calls of modules of class `name` the file makes: `self.X(...)` (or `self.X[i](...)`) where
    it sets `self.X` from a call of it, and `v(...)` in a loop over `self.X` (in the same function)."""
    holders = index.holders[name] - {None}
    looped = [c for fn, v, over in index.looped if over in holders for c in index.calls[v]
              if id(index.around[id(c)][0]) == fn]
    return sorted({*looped, *[c for attr in holders for c in index.attribute_calls[attr]]},
                  key=lambda c: (c.lineno, c.col_offset))


def _bound(call: ast.Call, params: list[str]) -> dict[str, ast.expr]:
    """The call's argument expressions by the parameter they fill (positional ones up to a *args)."""
    plain = itertools.takewhile(lambda a: not isinstance(a, ast.Starred), call.args)
    return {**dict(zip(params, plain)), **{k.arg: k.value for k in call.keywords if k.arg}}


def _params(fn: Any) -> list[str]:
    """A function node's parameters, `self` left out (none at a module's top level)."""
    arguments = getattr(fn, "args", NO_ARGUMENTS)
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return names[names[:1] == ["self"]:]


@dataclass
class File:
    """The learner's module, its parsed source's index, the sizes check builds at (`keys`: which size a
    constructor's argument stands for), and how its expressions are read (`readers`) and a caller's
    callers found (`callers`): a constructor's, or a forward's (plain values only)."""

    module: Any
    index: Index
    sizes: dict[str, Any]
    keys: Keys
    readers: dict[type, Callable[..., Any]]
    callers: dict[str, Callable[[Index, str], list[ast.Call]]]


def _literal(expr: ast.expr, file: File, passed: dict[str, Any], depth: int) -> Read:
    return quietly(lambda: (ast.literal_eval(expr), False),
                   (ValueError, TypeError, SyntaxError, MemoryError, RecursionError))


def _plain_literal(expr: ast.expr, file: File, passed: dict[str, Any], depth: int) -> Read:
    read = _literal(expr, file, passed, depth)
    return read if isinstance(read and read[0], SCALARS) else None


def _name(expr: ast.Name, file: File, passed: dict[str, Any], depth: int) -> Read:
    """A loop's index (0), an argument of the function around (as its callers pass it), or a constant
    of the file that the function does not assign."""
    fn, cls = file.index.around[id(expr)]
    if (id(fn), expr.id) in file.index.indices:
        return 0, True
    if expr.id in _params(fn):
        return _argument(expr.id, fn, cls, file, depth)
    constant = vars(file.module).get(expr.id)
    kept = isinstance(constant, SCALARS) and (id(fn), expr.id) not in file.index.assigned
    return (constant, False) if kept else None


def _attribute(expr: ast.Attribute, file: File, passed: dict[str, Any], depth: int) -> Read:
    """`self.X` as the constructor of the class around sets it (once); `config.X` of a config that the
    same call hands on, as check built it."""
    owner = getattr(expr.value, "id", None)
    if owner == "self":
        cls = file.index.around[id(expr)][1]
        sets = file.index.sets[(id(file.index.methods.get((id(cls), "__init__"))), expr.attr)]
        return value_of(sets[0], file, {}, depth) if len(sets) == 1 else None
    value = getattr(passed.get(owner), expr.attr, None)
    return (value, False) if isinstance(value, SCALARS) else None


READERS = {ast.Constant: _literal, ast.Tuple: _literal, ast.List: _literal, ast.Dict: _literal,
           ast.UnaryOp: _literal, ast.Name: _name, ast.Attribute: _attribute}
PLAIN_READERS = {ast.Constant: _plain_literal, ast.UnaryOp: _plain_literal, ast.Name: _name}


def value_of(expr: ast.expr | None, file: File, passed: dict[str, Any], depth: int = 0) -> Read:
    """(value, whether a loop's index) of an argument expression, or None where it is not read."""
    if depth > DEPTH:
        return None
    return file.readers.get(type(expr), _nothing)(expr, file, passed, depth + 1)


def _size(file: File, owner: str, name: str) -> Any:
    """Check's size for the argument `name` of the file's `owner` (a class's constructor, a function),
    None where it stands for none."""
    # None: no such object of the file, or no signature to read
    return quietly(lambda: file.sizes.get(file.keys(vars(file.module)[owner]).get(name)),
                   (KeyError, TypeError, ValueError))


def _argument(name: str, fn: Any, cls: Any, file: File, depth: int) -> Read:
    """The value of the caller's argument `name`: check's size where it stands for one, else what the
    caller's own callers pass it (a constructor's, a forward's, a function's of the file)."""
    owner = (cls or fn).name
    size = _size(file, owner, name)
    if size is not None:
        return size, False
    callers = file.callers.get(fn.name if cls else "", _nothing)(file.index, owner) or []
    read = (value_of(_bound(c, _params(fn)).get(name), file, {}, depth) for c in callers)
    return next(filter(None, read), None)


CALLERS = {"__init__": constructor_calls, "forward": instance_calls, "": constructor_calls}
PLAIN_CALLERS = {"forward": instance_calls, "": constructor_calls}  # a forward's: sizes are not plain values


def _file_of(obj: Any, sizes: dict[str, Any], keys: Keys, forward: bool) -> File:
    module = sys.modules.get(getattr(obj, "__module__", ""), None)
    tree = quietly(lambda: parsed_file(module.__file__), (AttributeError, TypeError, SyntaxError, ValueError),
                   ast.Module([], []))  # an empty module: no source of the learner's to read
    readers, callers = (PLAIN_READERS, PLAIN_CALLERS) if forward else (READERS, CALLERS)
    return File(module, _index(tree), sizes, keys, readers, callers)


def file_arguments(obj: Any, names: list[str], filled: dict[str, Any], sizes: dict[str, Any], keys: Keys,
                   forward: bool = False) -> dict[str, Taken]:
    """What the file's own calls of `obj` (its constructor; its forward where `forward`) pass the
    arguments `names`, where it can be read (see the module's docstring), the first call that gives
    one; `filled`: the arguments check filled at that call (a config handed on with it)."""
    file = _file_of(obj, sizes, keys, forward)
    params = list(inspect.signature(obj.forward if forward else obj).parameters)[int(forward):]
    calls = (instance_calls if forward else constructor_calls)(file.index, obj.__name__)
    reads = [(n, c, value_of(_bound(c, params).get(n), file, _passed(c, params, filled)))
             for c, n in itertools.product(calls, names)]
    return dict(reversed([(n, Taken(n, read[0], c.lineno, read[1])) for n, c, read in reads if read]))


def handed_first(fn: Any) -> list[ast.expr]:
    """The first argument of each of the file's calls of the function `fn` (`sample(output[0, -1, :])`),
    in the order of the file."""
    # (a callable object has no name: no call of it is read, where "" would be every method's call)
    calls = constructor_calls(_file_of(fn, {}, _no_keys, False).index, getattr(fn, "__name__", "<none>"))
    return [c.args[0] for c in calls if c.args and not isinstance(c.args[0], ast.Starred)]


UNREAD = object()  # what a call hands an argument where the value is not read (a tensor, a call)


def values_built_with(cls: Any, name: str) -> list[Any]:
    """What each of the file's constructor calls of `cls` hands its argument `name`: the value read
    (see the module's docstring), its default where the call hands it nothing, UNREAD where the value is
    not read; its default alone where the file never builds it."""
    file = _file_of(cls, {}, _no_keys, False)
    params = list(inspect.signature(cls).parameters)
    default = inspect.signature(cls).parameters[name].default
    bound = [_bound(c, params).get(name) for c in constructor_calls(file.index, cls.__name__)]
    read = [value_of(expr, file, {}) if expr is not None else (default, False) for expr in bound]
    return [r[0] if r else UNREAD for r in read] or [default]


def _passed(call: ast.Call, params: list[str], filled: dict[str, Any]) -> dict[str, Any]:
    """The names the call hands on to arguments check filled (`config` -> the config check built)."""
    bound = _bound(call, params)
    return {getattr(bound.get(p), "id", None): value for p, value in filled.items()}


def record(obj: Any, taken: dict[str, Taken]) -> dict[str, Any]:
    """The values taken, by name; each kept for the report's note on `obj`."""
    TAKEN.setdefault(obj, {}).update(taken)
    return {n: t.value for n, t in taken.items()}


def forward_defaults_(objects: Iterable[Any]) -> None:
    """Each module class among the learner's `objects` whose forward requires an argument that the
    file's own calls pass as a plain value (a loop's index, a literal, a constant of the file: ChatGLM's
    `layer(h, ..., layer_id=i)`) takes that value as the argument's default: its signature says so
    (check drives it as a forward without that argument) and a call that leaves it out gets it; the
    learner's own calls, which pass it, run as written."""
    for cls in [c for c in objects if "forward" in vars(c)]:
        _defaulted_(cls)


# a forward's argument that its callers must pass: positional or by keyword, without a default
REQUIRED = {(inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
            (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty)}


def _no_keys(_: Any) -> dict[str, str | None]:
    return {}  # a forward's arguments stand for no size


def _defaulted_(cls: type) -> None:
    forward = cls.forward
    signature = inspect.signature(forward)
    required = [p.name for p in list(signature.parameters.values())[1:] if (p.kind, p.default) in REQUIRED]
    values = record(cls, file_arguments(cls, required, {}, {}, _no_keys, True))
    try:
        shown = signature.replace(parameters=[p.replace(default=values.get(p.name, p.default))
                                              for p in signature.parameters.values()])
    except ValueError:  # a required argument after it: left as written
        values = {}
    if not values:
        TAKEN.pop(cls, None)
        return

    @functools.wraps(forward)
    def defaulted(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = shown.bind(*args, **kwargs)
        except TypeError:  # a call that does not fit: as their forward answers it
            return forward(*args, **kwargs)
        bound.apply_defaults()
        return forward(*bound.args, **bound.kwargs)

    defaulted.__signature__ = shown  # type: ignore[attr-defined]
    cls.forward = defaulted  # type: ignore[attr-defined]


def taken_notes(obj: Any) -> list[Text]:
    """The report's note of each argument taken from the file's calls of `obj`."""
    return [text(*(t.said if t.said[0] else (
        f"{t.name} = {t.value!r} taken from the file's own call at line {t.line}" + LOOP[0] * t.loop,
        f"{t.name} = {t.value!r} 取自文件自己在第 {t.line} 行的调用" + LOOP[1] * t.loop)))
            for t in TAKEN.get(obj, {}).values()]


LOOP = (" (a loop's index: layer 0)", "（循环的下标：取层 0）")


def not_charged(obj: Any, error: LearnerError) -> LearnerError:
    """An exception of `obj`'s code under check's driving, where check built or drove it only with
    arguments taken from the file's calls: a reason it is NOT CHECKED (the other inputs are check's own
    choice, and the file's calls hand it others: a position tensor, a 1-D sequence); any other error
    as it is."""
    taken = TAKEN.get(obj, {}).values()
    if error.kind != "exception" or not taken:
        return error
    said = ", ".join(f"{t.name} = {t.value!r} (line {t.line})" for t in taken)
    said_zh = "，".join(f"{t.name} = {t.value!r}（第 {t.line} 行）" for t in taken)
    return LearnerError("cannot_call", RAISED[0].format(said), error.where, [], RAISED[1].format(said_zh))


RAISED = ("check could drive it only with arguments taken from your file's own calls ({}), and it raised on "
          "the other inputs, which check chose: they may not be of the form your calls hand it",
          "检查程序只能用取自你文件自己调用的参数（{}）来驱动它，它在检查程序自己选的其他输入上出错："
          "这些输入可能不是你的调用给它的形式")
