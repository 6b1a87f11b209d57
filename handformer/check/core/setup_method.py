"""A model whose forward reads state that only a method of its own class makes: gpt-fast's
`Transformer.setup_caches(max_batch_size, max_seq_length)`, which builds the KV caches, the rotary
table and the causal mask that `forward(idx, input_pos)` reads, or any `init_cache`, `allocate_kv`,
`reset_cache` of that form.

The method is found by what it does, not by its name: it assigns `self.<attr>` that forward reads,
and forward on token ids raises until it has run. Its arguments are filled by their names: a batch
size, a sequence length (the longest check drives), a dtype (the model's), a device; one check cannot
fill leaves the model NOT CHECKED, naming the method and the argument. Before each new sequence the
state it changed is put back as built and the method is called again with that sequence's batch size
(gpt-fast's returns early when its caches are already as large, and its caches hold one batch size),
so that a forward never reads a cache another call filled.

Shape legend: B batch, T length.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import ERROR, FAIL, NOT_CHECKED, ComponentResult, LearnerError, Text, text
from handformer.check.core.source import source_text
from handformer.check.core.weights import MappingError

# the words of a setup method's arguments, by role (gpt-fast's max_batch_size, max_seq_length)
ROLES = {"batch": {"batch", "bsz", "bs"}, "dtype": {"dtype"}, "device": {"device"},
         "length": {"seq", "len", "length", "positions", "context", "ctx", "tokens", "size", "block"}}
SETUP_WORDS = re.compile(r"(?i)cache|setup|init|kv")  # a setup method's name, first of several
NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
ASSIGNED = re.compile(r"\bself\.(\w+)\s*(?::[^=\n]*)?=(?!=)")  # self.x = ..., self.x: T = ...
READ = re.compile(r"\bself\.(\w+)")


def setup_name(cls: type) -> str | None:
    """The method of the learner's class (not forward, not a dunder) that assigns a `self.<attr>` its
    forward reads, or an attribute of one of its parts that a part's forward reads (gpt-fast's
    `for b in self.layers: b.attention.kv_cache = KVCache(...)`); the first of several by its words
    (cache, setup, init)."""
    reads = set(READ.findall(source_text(cls.forward)))
    found = filter(lambda n: reads & set(ASSIGNED.findall(source_text(vars(cls)[n])))
                   or parts_set(vars(cls)[n], cls), _methods(cls))
    return next(iter(sorted(found, key=lambda n: not SETUP_WORDS.search(n))), None)


def _methods(cls: type) -> list[str]:
    """The names of a class's own methods, forward and the dunders left out."""
    return [n for n, fn in vars(cls).items() if inspect.isfunction(fn) and n != "forward" and n[:2] != "__"]


# the targets of an assignment (`b.attn.k_cache, b.attn.v_cache = ...`), and one on a part of an object: an
# attribute of an attribute or of an item (`self.layers[i].attention.kv_cache`, `b.attn.k_cache`), not
# `self.x` itself
TARGETS = re.compile(r"^\s*([\w\[\]., ]+?)\s*=(?!=)", re.M)
ON_A_PART = re.compile(r"(?!self\.\w+$)\w+(?:\.\w+|\[\w*\])*\.(\w+)")


def parts_set(method: Any, cls: type) -> set[str]:
    """The attributes `method` assigns on the parts of an object (ON_A_PART) that the forward of another
    class of its file reads as `self.<attr>`: state a parent sets on its parts."""
    targets = [t.strip() for side in TARGETS.findall(source_text(method)) for t in side.split(",")]
    assigned = {m[1] for m in map(ON_A_PART.fullmatch, targets) if m}
    return assigned & set().union(*map(part_reads, _classes_beside(cls)))


def _classes_beside(cls: type) -> list[type]:
    """The other classes with a forward that the file of `cls` defines."""
    module = vars(sys.modules.get(cls.__module__, sys))
    return [c for c in module.values() if isinstance(c, type) and c is not cls
            and c.__module__ == cls.__module__ and inspect.isfunction(vars(c).get("forward"))]


def part_reads(cls: type) -> set[str]:
    """The attributes a class's forward reads as `self.<attr>`."""
    return set(READ.findall(source_text(getattr(cls, "forward", None))))


def parent_setup(cls: Any) -> tuple[str, set[str]] | None:
    """The method (Class.method) of another class of the file that assigns state the forward of `cls`,
    or of a class it builds, reads (TinyLM.setup_caches: `b.attn.k_cache = ...`, read by Attention.forward,
    inside Block), and those attributes; None where no other class's method sets what they read."""
    beside = _classes_beside(cls)
    built = filter(lambda c: f"{c.__name__}(" in source_text(cls), beside)  # Block's Attention(...)
    reads = set().union(*map(part_reads, [cls, *built]))
    found = [(f"{c.__name__}.{n}", parts_set(vars(c)[n], c) & reads) for c in beside for n in _methods(c)]
    return next(filter(lambda pair: pair[1], found), None)


def set_by_parent(obj: Any, result: ComponentResult) -> None:
    """A component that fails, raises or is not checked with no mistake named, whose forward (or a
    part's) reads state only a parent's setup method assigns (parent_setup): NOT CHECKED naming that
    method; the parent is checked after calling it. Its exception is kept in the message."""
    found = result.status in UNSETTLED and not result.named() and parent_setup(obj)
    if not found:
        return
    said = ", ".join(f"self.{a}" for a in sorted(found[1]))
    error = result.error or LearnerError("exception", "")
    result.status, result.findings, result.adapter, result.checks = NOT_CHECKED, [], "", []
    result.error = LearnerError(
        "cannot_call", f"{result.name} (its forward or a part's) reads {said}, which only {found[0]}(...) "
        f"assigns (a parent's setup of its parts): it is checked through the model, after that call "
        f"({error.message})", "forward", error.traceback,
        f"{result.name}（它或它的子模块的 forward）读取 {said}，而只有 {found[0]}(...) 给它赋值（父模块为"
        f"子模块做的准备）：它通过模型检查，先调用这个方法（原文：{error.message}）")


UNSETTLED = (FAIL, ERROR, NOT_CHECKED)  # the statuses a parent's state may explain


def _role(p: inspect.Parameter) -> str | None:
    """The role of a setup method's argument by its name's words: batch, length, dtype, device."""
    words = set(p.name.lower().split("_"))
    return next(filter(lambda role: words & ROLES[role], ROLES), None)


def _unfillable(p: inspect.Parameter) -> bool:
    return _role(p) is None and p.default is p.empty


class Setup:
    """The learner's setup method, called before each new sequence with its batch size."""

    def __init__(self, module: nn.Module, name: str, length: int, call: Callable[..., Any]) -> None:
        self.module, self.name, self.length, self.call = module, name, length, call
        method = getattr(module, name)
        self.params = [p for p in inspect.signature(method).parameters.values() if p.kind in NAMED]
        unfilled = next(filter(_unfillable, self.params), None)
        if unfilled:
            raise MappingError(*_unfilled(type(module).__name__, name, unfilled.name))
        self.pristine, self.modules = _entries(module), dict(module.named_modules())
        self._run(2, length)
        after = _entries(module)  # what the method changed: put back as built before each call
        self.made = {key for key, value in self.pristine.items() if after.get(key, GONE) is not value}

    def arguments(self, B: int, T: int) -> dict[str, Any]:
        dtype = next(self.module.parameters()).dtype
        values = {"batch": B, "length": max(T, self.length), "dtype": dtype, "device": torch.device("cpu")}
        return {p.name: values[_role(p)] for p in self.params if _role(p)}

    def __call__(self, B: int, T: int) -> None:
        """The state as built, then the method called with batch B and length max(T, the block size)."""
        for path, store, key in self.made:
            STORES[store](self.modules[path])[key] = self.pristine[path, store, key]
        self._run(B, T)

    def _run(self, B: int, T: int) -> None:
        """The method called with batch B and length T, untraced (its lines are no step of the forward
        a localization traces), torch's default dtype the model's own: a cache it makes with
        torch.zeros(shape) and no dtype holds what the model computes in (check's float64 included)."""
        tracer, dtype = sys.gettrace(), torch.get_default_dtype()
        sys.settrace(None)
        torch.set_default_dtype(next(self.module.parameters()).dtype)
        try:
            self.call(getattr(self.module, self.name), **self.arguments(B, T))
        finally:
            sys.settrace(tracer)
            torch.set_default_dtype(dtype)

    def note(self) -> Text:
        said = ", ".join(self.arguments(2, self.length))
        return text(f"forward reads what {self.name}({said}) makes first (KV caches, tables): check calls it "
                    "before each new sequence with that sequence's batch size and the block size, and hands "
                    "forward the positions (0..T-1) where it takes them",
                    f"forward 读取 {self.name}({said}) 先建好的东西（KV 缓存、表）：检查程序在每个新序列之前"
                    "用这个序列的 batch 大小和 block size 调用它，forward 接受位置参数时传入位置 0..T-1")


GONE = object()  # no value after the method ran: a key it removed
# where a module keeps what a setup method makes: attributes, buffers, submodules
STORES: dict[str, Callable[[nn.Module], dict[str, Any]]] = {
    "": vars, "_buffers": lambda m: m._buffers, "_modules": lambda m: m._modules}


def _entries(module: nn.Module) -> dict[tuple[str, str, str], Any]:
    """(module path, store, key) -> value of every attribute, buffer and submodule a module holds."""
    return {(path, store, k): v for path, m in module.named_modules() for store in STORES
            for k, v in STORES[store](m).items()}


def _unfilled(model: str, name: str, argument: str) -> tuple[str, str]:
    return (f"{model}.forward reads what {name}(...) makes first (KV caches, tables), and check cannot fill "
            f"its argument {argument!r}: it fills a batch size, a sequence length, a dtype and a device by "
            f"their names; give {argument!r} a default, and check calls {name} with it",
            f"{model}.forward 读取 {name}(...) 先建好的东西（KV 缓存、表），而检查程序填不了它的参数 "
            f"{argument!r}：它只按名字填 batch 大小、序列长度、dtype 和 device；"
            f"请给 {argument!r} 一个默认值，检查程序就用它调用 {name}")


def setup_of(module: nn.Module, length: int, call: Callable[..., Any]) -> Setup | None:
    """The setup method its forward needs, called once (batch 2) through `call` (the learner's sandbox):
    None where forward runs on token ids (2, 7) without one, or where its class has none."""
    ids = torch.randint(0, 9, (2, 7), generator=torch.Generator().manual_seed(3))
    name = setup_name(type(module)) if fp.quietly(lambda: module(ids)) is None else None
    return name and Setup(module, name, length, call)
