"""Where a learner's computation parts from the reference, when no catalogued mistake explains it.

    steps = trace_steps(lambda: module(x, x, x, None), learner_file)   # (line, name, tensor) in order
    found = first_departure(steps, views, sizes)                        # the first that matches no view
    found.describe("en")   # "line 21: scores = ... -> a constant factor 0.707 = 1/d_k**0.25 of q·kᵀ ..."

The learner's forward runs once under `sys.settrace`: every tensor a line of their file assigns
(or returns) that depends on the input (it has a grad_fn) is one step. The reference's sub-steps
are named views (q, the heads, q·kᵀ, the scores, the weights, ...) in the layouts learners write.
The first step whose shape is a view's but whose values are none of them is where the two part;
its form is named where it is simple: a constant factor (as a power of a size: d_k, d_model, ...),
a sign, a transpose, a shift by one position, a softmax over another axis, an extra or missing term.
A step whose shape is no view's (a fused or flattened layout) is skipped, not judged.

Shape legend: B batch, H heads, T length, Dh head dim, D d_model.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import linecache
import math
import operator
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core.defaults import given
from handformer.check.core.fingerprint import first_tensor, hooked, quietly
from handformer.check.core.kinds import TABLED
from handformer.check.core.result import DEPARTS, ComponentResult, Finding, Text, text
from handformer.check.core.source import (
    first_pattern_matches,
    lines_matching,
    parsed_file,
    pattern_rank,
    source_lines,
)
from handformer.check.reference import variants as V


class Step(NamedTuple):
    """One tensor the learner's code made: its line, the variable (or "return"), its value, and, for
    a step in a helper function of theirs, the line of their outermost code that called it."""

    line: int
    name: str
    value: Tensor
    caller: int | None = None
    given: bool = False  # an argument of their function as it was handed over, not a value it made
    earlier: tuple[Step, ...] = ()  # a tensor built in place: its values after each earlier line
    part: tuple[nn.Module, tuple[Any, ...], dict[str, Any]] | None = None  # a part's output: it, its inputs
    numbers: dict[str, tuple[int, float]] | None = None  # the frame's numbers then: name -> (line, value)


View = tuple[str, Tensor]  # (the reference's sub-step, in words; its value)
Form = tuple[Text, Tensor]  # (a simple form of a difference, in words; the value a step of that form has)


def over_axes(what: str, what_zh: str, op: Callable[[int], Tensor], ndim: int) -> list[Form]:
    """A sub-step the reference takes over the last axis (`op(-1)`: a log-softmax, a cumulative
    sum), taken over each other axis instead: the wrong-axis forms."""
    return [(text(f"{what} over dim={d}; the reference's runs over the last axis, dim=-1",
                  f"{_zh_subject(what_zh)}作用在 dim={d} 上；参考作用在最后一个轴 dim=-1 上"), op(d))
            for d in range(ndim - 1)]


class _Tracer:
    """The steps of one run: see `trace_steps`."""

    def __init__(self, filename: str, code: Any, constants: tuple[torch.dtype, ...], every: bool = False,
                 scalars: bool = False) -> None:
        self.filename, self.code, self.constants = filename, code, constants
        self.every, self.scalars = every, scalars
        self.steps: list[Step] = []
        self.state: dict[int, tuple[dict[str, Any], int]] = {}  # frame -> (its locals, its line)
        self.now = 0  # the line of the traced frame running now: where a module's output is made
        self.last: dict[tuple[int, str], int] = {}  # a constant's latest step: (frame, name) -> index
        self.dropped: set[int] = set()  # a constant's earlier steps: only its final value is judged
        self.built: dict[tuple[int, str], list[Step]] = {}  # a constant's steps so far, in order
        self.numbers: dict[int, dict[str, tuple[int, float]]] = {}  # frame -> name -> (its line, value)
        self.entered: set[int] = set()  # the first line of each function of the file that ran
        self.lists = False  # a list of numbers is a step too (as a float64 tensor)
        self.listed: dict[tuple[int, str], tuple[float, ...]] = {}  # (frame, name) -> the list as last seen

    def local(self, frame: Any, event: str, arg: Any) -> Any:
        seen, before = self.locals(frame), self.state.setdefault(id(frame), ({}, frame.f_lineno))
        numbers = self.numbers.setdefault(id(frame), {})
        for name, value in seen.items():
            if _numbers(value, self.lists) not in (False, (), self.listed.get((id(frame), name))):
                self.listed[id(frame), name] = tuple(value)  # a list of numbers, new or changed
                self.record(frame, before[1], name, torch.tensor(value, dtype=torch.float64), not before[0])
            elif isinstance(value, Tensor) and _changed(before[0].get(name), value):
                self.record(frame, before[1], name, value, not before[0])
            elif type(value) in (int, float) and numbers.get(name, (0, None))[1] != value:
                # a size read from a shape: `d_k = q.size(-1)`; an argument, at the line that handed it
                # (0: handed by check, bound on no line of theirs)
                handed = not before[0] and name in frame.f_code.co_varnames[:frame.f_code.co_argcount]
                numbers[name] = ((before[1], self.caller(frame) or 0)[handed], value)
                self.steps += [Step(before[1], name, _number(value), None, not before[0],
                                    numbers=dict(numbers))] * self.scalars  # a schedule's numbers
        held = {k: _snapshot(v) for k, v in seen.items()}
        self.state[id(frame)], self.now = (held, frame.f_lineno), frame.f_lineno
        if event == "return":  # a later frame may take this one's id: it starts afresh
            self.returned(frame, arg)
            del self.state[id(frame)], self.numbers[id(frame)]
            # back in the traced frame that called it, at the call's line: a part called on a helper's
            # result (`layer(y, pad_hidden(tgt, src))`) is made there, not at the helper's line
            self.now = self.state.get(id(frame.f_back), ({}, self.now))[1]
        return self.local

    def locals(self, frame: Any) -> dict[str, Any]:
        """The frame's locals; with constants, also the tensors `self` keeps as plain attributes
        (`self.encoding[:, 1::2] = ...`, a table written in place) as `self.encoding`."""
        seen = frame.f_locals
        if not self.constants:
            return seen
        kept = {f"self.{attr}": v for attr, v in getattr(seen.get("self"), "__dict__", {}).items()
                if isinstance(v, Tensor) and not v.requires_grad}
        return {**seen, **kept}

    def record(self, frame: Any, line: int, name: str, value: Tensor, given: bool) -> None:
        """One step; `given`: the frame's first event, its arguments as handed over."""
        numbers = {**_attributes(frame), **self.numbers.get(id(frame), {})}
        if self.every or _traced(value) and name not in _arguments(frame, value):
            self.steps.append(Step(line, name, _copy(value), self.caller(frame), given, numbers=numbers))
        elif value.dtype in self.constants:
            key, kept = (id(frame), name), _copy(value)
            # a new value under the name (its shape another), not a write
            if key in self.last and self.steps[self.last[key]].value.shape != kept.shape:
                self.built[key] = []
            else:
                self.dropped.add(self.last.get(key, -1))
            built = self.built.setdefault(key, [])
            self.last[key] = len(self.steps)
            built.append(Step(line, name, kept, self.caller(frame), False, tuple(built), numbers=numbers))
            self.steps.append(built[-1])

    def returned(self, frame: Any, value: Any) -> None:
        """What a frame returns: a tensor, or each tensor of a tuple (`return q, k`), as steps."""
        value = _number(value) if self.scalars and type(value) in (int, float) else value
        listed = _numbers(value, self.lists)
        value = torch.tensor(listed, dtype=torch.float64) if listed else value
        items = [(f"return[{i}]", v) for i, v in enumerate(value)] if isinstance(value, tuple) else [
            ("return", value)]  # a value not a tensor is no step (below)
        numbers = dict(self.numbers.get(id(frame), {}))
        for name, v in items:
            if isinstance(v, Tensor) and (self.every or _traced(v)):
                self.steps.append(Step(frame.f_lineno, name, _copy(v), self.caller(frame), numbers=numbers))

    def caller(self, frame: Any) -> int | None:
        """The line of the outermost frame of the learner's file below this one (the forward that
        called their helper); None when this frame is the outermost."""
        line, outer = None, frame.f_back
        while outer is not None:
            if outer.f_code.co_filename == self.filename:
                line = outer.f_lineno
            outer = outer.f_back
        return line

    def tracer(self, frame: Any, event: str, arg: Any) -> Any:
        here = frame.f_code.co_filename == self.filename
        if here:  # a function of the file that runs, traced or not
            self.entered.add(frame.f_code.co_firstlineno)
        ours = here and (self.code is None or frame.f_code in self.code)
        return self.local if ours else None

    def hook(self, name: str) -> Callable[..., None]:
        """Record a part's output (as `name(...)`) at the line that calls it."""
        def record(module: nn.Module, args: Any, kwargs: dict[str, Any], out: Any) -> None:
            self.part(f"{name}(...)", out, (module, args, kwargs))
        return record

    def pre_hook(self, name: str) -> Callable[..., None]:
        """Record what a part is given (the sum a norm normalizes) at the line that calls it."""
        def record(module: nn.Module, args: Any) -> None:
            self.part(f"the input of {name}", args)
        return record

    def part(self, name: str, value: Any, part: tuple[nn.Module, Any] | None = None) -> None:
        t = first_tensor(value)  # a tensor made from the input; with `every`, any a part makes (a loop's)
        if getattr(t, "grad_fn", None) is not None or self.every and isinstance(t, Tensor):
            self.steps.append(Step(self.now, name, _copy(t), part=part))


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# positions counted in whole numbers too, and a table of complex numbers (Meta's freqs_cis)
NUMBERS = FLOATS + (torch.int32, torch.int64, torch.complex64, torch.complex128)


def trace_steps(run: Callable[[], Any], filename: str, code: Any = None,
                modules: list[tuple[str, nn.Module]] = (), constants: bool | tuple[torch.dtype, ...] = False,
                into: list[Step] | None = None, every: bool = False, scalars: bool = False,
                lists: bool = False) -> list[Step]:
    """Run `run()` once, recording each input-dependent tensor that a line of `filename` assigns
    (only in the frames of `code`, one code object or several, when given), and each output of
    `modules` (their names) at the line that calls it. `constants`: also tensors that do not depend
    on the input (a loss's target distribution built in place; True: floating point, else the dtypes
    given), each at the last line that changed it. `into`: the list the steps go to (they stay
    there when `run` raises). `every`: each tensor the code assigns is a step, each time it does (a
    loop's tokens, which depend on no gradient); `scalars`: the numbers it binds too, as 0-dim steps;
    `lists`: each list of numbers it binds or returns too, as a tensor (the ALiBi paper's get_slopes)."""
    code = (code,) if code is not None and not isinstance(code, (tuple, list, set)) else code
    t = _Tracer(filename, code, FLOATS if constants is True else constants or (), every, scalars)
    t.lists = lists
    t.steps = given(into, t.steps)
    handles = [m.register_forward_pre_hook(t.pre_hook(name)) for name, m in modules]
    handles += [m.register_forward_hook(t.hook(name), with_kwargs=True) for name, m in modules]
    old = sys.gettrace()
    sys.settrace(t.tracer)
    try:
        with hooked(handles), torch.enable_grad():
            run()
    finally:
        sys.settrace(old)
    kept = Steps(s for i, s in enumerate(t.steps) if i not in t.dropped)
    kept.entered = frozenset(t.entered)
    return kept


class Steps(list):
    """The steps of a run, and the first line of each function of the file that ran in it."""

    entered: frozenset[int] = frozenset()


def _attributes(frame: Any) -> dict[str, tuple[int, float]]:
    """The numbers the frame's `self` keeps (`self.confidence = 1.0` in __init__) as `self.name` ->
    (the one line of the file that assigns it, its value); none assigned on several lines."""
    kept = getattr(frame.f_locals.get("self"), "__dict__", {})
    lines = _assigned(frame.f_code.co_filename)
    return {f"self.{k}": (lines[k], v) for k, v in kept.items() if type(v) in (int, float) and k in lines}


@functools.lru_cache(maxsize=8)
def _assigned(filename: str) -> dict[str, int]:
    """Each attribute `self.name = ...` assigned on exactly one line of the file -> that line."""
    found = [(m[1], n) for n, line in enumerate(linecache.getlines(filename), 1)
             for m in SELF_ASSIGN.finditer(line)]
    counts = Counter(name for name, _ in found)
    return {name: line for name, line in found if counts[name] == 1}


# `self.name = ...`, `self.name: float = ...`: an attribute assigned
SELF_ASSIGN = re.compile(r"^\s*self\.(\w+)\s*(?::[^=]+)?=(?!=)")


def _number(value: float) -> Tensor:
    return torch.tensor(float(value), dtype=torch.float64)


def _arguments(frame: Any, value: Tensor) -> tuple[str, ...]:
    """The frame's arguments, for an input itself (a leaf): its own names are not steps, a name
    bound to it in the body is (`q_embed = q`); none for a value made from the input."""
    return frame.f_code.co_varnames[:frame.f_code.co_argcount * value.is_leaf]


def _traced(value: Tensor) -> bool:
    """A tensor that depends on the input (made from it, or the input itself), not a weight."""
    return value.requires_grad and not isinstance(value, nn.Parameter)


def _copy(value: Tensor) -> Tensor:
    """A step's values, kept apart from a tensor their code goes on writing in place; complex numbers
    (..., n) as their real and imaginary parts (..., n, 2)."""
    value = torch.view_as_real(value.detach().resolve_conj()) if value.is_complex() else value.detach()
    return value.to(torch.float64, copy=True)


def _numbers(value: Any, lists: bool) -> tuple[float, ...] | bool:
    """A list of plain numbers as a tuple, where `lists` says to read them; else False."""
    return lists and type(value) is list and {int, float} >= set(map(type, value)) and tuple(value)


def _snapshot(value: Any) -> Any:
    """What a local is, to see it change: a tensor's identity and how often it was written in place."""
    return (value, _version(value)) if isinstance(value, Tensor) else value


def _version(value: Tensor) -> int | tuple[Any, ...]:
    try:
        return value._version
    except RuntimeError:  # an inference tensor (torch.inference_mode) keeps no count: its values, to
        return tuple(value.flatten().tolist())  # see it written in place (`logits[...] = 0`)


def _changed(before: Any, value: Tensor) -> bool:
    """A new tensor under the name, or the same one written in place (`X[mask] = -1e6`)."""
    return not isinstance(before, tuple) or before[0] is not value or before[1] != _version(value)


def same(t: Tensor, r: Tensor, atol: float = 1e-5) -> bool:
    """Equal values; where the reference is -inf (masked), anything at or below -1e4 (a -1e9 fill)."""
    return t.shape == r.shape and bool(_same_each(t.reshape(-1), r.reshape(1, -1), atol)[0])  # (n,), (1, n)


def factor_name(c: float, sizes: dict[str, float]) -> str:
    """c as a size or its root ("d_k", "1/sqrt(d_model)"), else a small whole number or its inverse
    ("2", "1/2"), else another power of a size ("1/d_k**0.25"), else its value."""
    if c < 0 and factor_name(-c, sizes) != f"{-c:.4g}":
        return "-" + factor_name(-c, sizes)
    return (_power_name(c, sizes, (1.0, 0.5)) or _power_name(c, WHOLE, (1.0,), rel_tol=1e-6)
            or _power_name(c, sizes, (0.25, 2.0)) or f"{c:.4g}")


WHOLE = {str(n): n for n in range(2, 11)}  # the small whole numbers a factor is named by ("2", "1/2")


def _power_name(c: float, sizes: dict[str, float], powers: tuple[float, ...], rel_tol: float = 1e-4,
                ) -> str | None:
    tried = itertools.product(powers, sizes.items(), ((1, "{}"), (-1, "1/{}")))
    return next((form.format({0.5: f"sqrt({name})", 1.0: name}.get(p, f"{name}**{p:g}"))
                 for p, (name, n), (sign, form) in tried
                 if n > 0 and n != 1 and math.isclose(c, n ** (sign * p), rel_tol=rel_tol)), None)


# the reference's intermediate results by name, in Chinese (the names the views above and
# localize_kinds.py give them); code in a name (q·kᵀ, up(x), self.norm1) stays as it is
VIEWS_ZH = [(r"(.+), reshaped to (.+)", lambda m: f"{view_zh(m[1])}（形状改为 {m[2]}）"),
            (r"the target distribution q \(flattened\)", "目标分布 q（展平）"),
            (r"the input of (.+)", r"\1 的输入"), (r"the input ([xX])", r"输入 \1"), (r"the output", "输出"),
            (r"Y, the sublayer's output", "Y（子层的输出）"),
            (r"X \+ Y \(the residual sum\)", "X + Y（残差和）"), (r"the norm of X \+ Y", "X + Y 的归一化"),
            (r"the norm", "归一化"), (r"the (source|target) embedding plus positions", "{}嵌入加上位置编码"),
            (r"the (source|target) embedding \(scaled as chosen\)", "{}嵌入（按选定的方式缩放）"),
            (r"emb\(ids\), the (source|target) embedding unscaled", "emb(ids)（未缩放的{}嵌入）"),
            (r"the positional encoding", "位置编码"),
            (r"the (encoder|decoder)'s final norm", "{}最后的归一化"),
            (r"(encoder|decoder) layer (\d+)'s output", "{}层 {} 的输出"),
            (r"the output (.+)", r"输出 \1"),
            (r"the heads of (\w+), rotated \((\w+) rotary\)", r"旋转后的 \1 的各个头（\2 配对）"),
            (r"the heads of (\w+), repeated for each query head", r"为每个查询头重复后的 \1 的各个头"),
            (r"the heads of (\w+)", r"\1 的各个头"),
            (r"(.+) rotated \((\w+) pairs\)", r"旋转后的 \1（\2 配对）"),
            (r"the scores (.+), before the mask", r"加掩码之前的分数 \1"), (r"the scores (.+)", r"分数 \1"),
            (r"the attention weights", "注意力权重"),
            (r"the masked scores", "屏蔽后的分数"),
            (r"the keep mask \(1 = visible\)", "保留掩码（1 = 可以看）"),
            (r"the positions 0 \.\. L-1", "位置 0 .. L-1"), (r"the angles pos·freq", "角度 pos·freq"),
            (r"the kept probabilities (.+)", r"保留下来的概率 \1"),
            (r"weights·v, heads concatenated", "weights·v（各头拼接后）"),
            (r"up\(x\), the first projection", "up(x)（第一个投影）"),
            (r"the mean of x² over d_model", "x² 在 d_model 上的均值"),
            (r"the mean over d_model", "在 d_model 上的均值"), (r"the variance \(biased\)", "方差（有偏）"),
            (r"the gain times the normalized x", "增益乘以归一化后的 x"),
            (r"the norm (before|after) the (.+)", lambda m: f"{SUBLAYERS_ZH.get(m[2], m[2])}"
             f"{SIDES_ZH[m[1]]}的归一化"),
            (r"the (.+)'s output", lambda m: f"{SUBLAYERS_ZH.get(m[1], m[1])}的输出"),
            (r"x \+ (.+) \(the residual sum\)", lambda m: f"x + {SUBLAYERS_ZH.get(m[1], m[1])}（残差和）"),
            (r"(the value|the reward|delta|the advantage) at token (\d+)",
             lambda m: f"位置 {m[2]} 的{PPO_ZH.get(m[1], m[1])}"),
            (r"the advantages from token (\d+) on", r"从位置 \1 起的优势")]
# PPO's steps (runners/ppo.py), in Chinese
PPO_ZH = {"the value": "价值", "the reward": "奖励", "delta": "delta", "the advantage": "优势",
          "the values": "价值", "the rewards": "奖励", "the next values": "下一步的价值",
          "the TD errors": "TD 误差 delta", "the returns": "回报 A + V",
          "the whitened advantages": "白化后的优势",
          "the log-ratio": "对数比 logprobs - old_logprobs", "the ratio": "比值 ratio",
          "the clipped ratio": "裁剪后的 ratio", "the smaller surrogate": "较小的代理目标",
          "the token losses": "每个 token 的损失", "each row's mean": "每行的均值", "the loss": "损失"}
SIDES_ZH = {"before": "之前", "after": "之后", "source": "源", "target": "目标", "encoder": "编码器",
            "decoder": "解码器"}
SUBLAYERS_ZH = {"self-attention": "自注意力", "cross-attention": "交叉注意力", "FFN": "前馈网络"}


# the names of sub-steps that are numbers of a loop or a schedule, and a loss's, in Chinese
NAMES_ZH = {
    "the loss, the mean cross-entropy": "损失（交叉熵的均值）", "the log-probabilities": "对数概率",
    "the probabilities": "概率", "the per-token losses": "每个 token 的损失",
    "the per-token losses (B, T)": "每个 token 的损失 (B, T)", "the logits model(x)": "logits model(x)",
    "the tokens so far": "到这一步为止的 token",
    "the context, cropped to the block size": "裁剪到 block_size 的上下文",
    "the logits at the last position": "最后一个位置的 logits", "the next token": "下一个 token",
    "the logits at the last position / temperature": "最后一个位置的 logits / temperature",
    "the tokens with the new one appended": "接上新 token 之后的序列",
    "the step t": "步 t", "the step t + 1": "步 t + 1", "the step n": "步 n",
    "the warmup fraction": "预热比例",
    "the warmup's rate": "预热阶段的学习率", "the progress through the decay": "衰减的进度",
    "π × the progress": "π × 进度", "cos(π × the progress)": "cos(π × 进度)",
    "1 + cos(π × the progress)": "1 + cos(π × 进度)",
    "the cosine factor (1 + cos(π × the progress)) / 2": "余弦系数 (1 + cos(π × 进度)) / 2",
    "the cosine factor × (max_lr - min_lr)": "余弦系数 × (max_lr - min_lr)", "the rate": "学习率",
    "the rate / factor": "学习率 / factor",
    "cos, each angle twice in a row": "cos（每个角度连续写两次）",
    "sin, each angle twice in a row": "sin（每个角度连续写两次）",
    "the table: the sines, then the cosines": "旋转表：先是 sin，后是 cos",
    "the positions 0 .. T-1": "位置 0 .. T-1", "a (T, T) square of ones": "(T, T) 的全 1 方阵",
    "the causal mask (1 where key s <= query t)": "因果掩码（键 s <= 查询 t 处为 1）",
    "the future keys (1 where key s > query t)": "未来的键（键 s > 查询 t 处为 1）",
    "the additive causal mask (0 where key s <= query t, -inf after)":
        "加性因果掩码（键 s <= 查询 t 处为 0，之后为 -inf）",
    "the entropy of each row (nats)": "每一行的熵（nat）", "the threshold": "阈值",
    "the tokens removed (1 = removed)": "被去掉的 token（1 = 去掉）", "the tokens kept": "保留的 token",
    "the filtered logits": "过滤后的 logits", "the largest probability of each row": "每一行的最大概率",
    "each surprisal's distance from the entropy": "每个 token 的惊异度与熵的距离",
    "the distances sorted": "排好序的距离", "the probabilities in that order": "按这个顺序排列的概率",
    "their running sum": "它们的累加和"}
NAMES_ZH.update(PPO_ZH)


@functools.lru_cache(maxsize=4096)
def view_zh(name: str) -> str:
    """An intermediate result's name in Chinese; a name that is code, or not known, as it is
    (remembered: a layer's localization names each of its steps for every form it tries)."""
    if name in NAMES_ZH:
        return NAMES_ZH[name]
    for pattern, zh in VIEWS_ZH:
        m = re.fullmatch(pattern, name)
        if m:  # "{}": the groups, a side (source, encoder, ...) in Chinese
            return zh(m) if callable(zh) else m.expand(zh.format(*(SIDES_ZH.get(g, g) for g in m.groups())))
    return name


def _zh_subject(name: str) -> str:
    """The name in Chinese before a Chinese verb: a space after code (`x `), none after Chinese."""
    zh = view_zh(name)
    return zh if zh[-1:] >= "\u3000" else zh + " "  # CJK characters and full-width punctuation


def _shift(t: Tensor, r: Tensor, dim: int, what: str) -> Text | None:
    """Shifted by one along `dim` (the positions), else along the first axis (a table's rows)."""
    for (d, sign), axis in itertools.product(((1, "-"), (-1, "+")), dict.fromkeys((dim, 0))):
        if t.shape != r.shape or r.dim() <= axis or r.size(axis) < 2:  # a few entries' values: no positions
            continue
        n = r.size(axis)
        if same(t.narrow(axis, max(d, 0), n - 1), r.narrow(axis, max(-d, 0), n - 1)):
            return text(f"{what} shifted by one position: position i holds the reference's i {sign} 1",
                        f"{_zh_subject(what)}错开了一个位置：位置 i 放的是参考的位置 i {sign} 1")
    return None


NORMALIZERS = ((
    lambda p, dim: torch.softmax(p.flatten(), 0).view_as(p) if dim is None else torch.softmax(p, dim),
                "a softmax", "softmax"),
               (lambda p, dim: p / p.sum(dim=dim, keepdim=dim is not None),
                "a normalization (divided by the sum)", "归一化（除以和）"))


def _softmax_axis(t: Tensor, pre: Tensor | None) -> Text | None:
    """Weights that are a softmax (or a division by the sum) of the reference's pre-normalized
    values over another axis, or over every entry at once."""
    if pre is None or t.shape != pre.shape:
        return None
    for (norm, how, how_zh), dim in itertools.product(NORMALIZERS, (*range(pre.dim() - 1), None)):
        if same(t, norm(pre, dim)):
            where, where_zh = (f"dim={dim}", f" dim={dim} 上") if dim is not None else ("all entries at once",
                                                                                       "所有元素上（一起）")
            return text(f"{how} over {where}; the reference's runs over the last axis, dim=-1",
                        f"{_zh_subject(how_zh)}作用在{where_zh}；参考作用在最后一个轴 dim=-1 上")
    return None


def _offset(t: Tensor, r: Tensor, what: str) -> Text | None:
    """t = r + c for one constant c (positions counted from 1)."""
    d = t - r
    flat = d.flatten()
    if not flat.numel() or not torch.isfinite(d).all() or d.abs().max() < 1e-5 or not same(d, flat[0] + 0*d):
        return None
    c = float(flat[0])
    return text(f"{what} plus a constant {c:.4g}", f"{_zh_subject(what)}多加了一个常数 {c:.4g}")


def _mask_edge(t: Tensor, r: Tensor, what: str) -> Text | None:
    """Masked values whose mask lets one key more (or fewer) through in some rows: a mask off by one;
    the scores (-inf where hidden) or a 0/1 keep mask (0 where hidden)."""
    binary = bool(((r == 0) | (r == 1)).all() and ((t == 0) | (t == 1)).all())
    hidden_t, hidden_r = (t == 0, r == 0) if binary else (t <= -1e4, ~torch.isfinite(r))
    both = ~hidden_t & ~hidden_r
    if not hidden_r.any() or not same(t[both], r[both]):
        return None
    more, fewer = (hidden_r & ~hidden_t).sum(-1), (hidden_t & ~hidden_r).sum(-1)
    for n, other, word, zh in ((more, fewer, "more", "多"), (fewer, more, "fewer", "少")):
        if n.max() == 1 and not other.any():
            rows = int(n.sum())
            return text(f"{what} with one key {word} visible in {rows} rows (the key at the mask's edge): "
                        "a mask off by one position",
                        f"{_zh_subject(what)}在 {rows} 行里{zh}露了一个键（掩码边上的那个）："
                        "掩码错开了一个位置")
    return None


def _term(t: Tensor, r: Tensor, what: str, terms: list[View], sizes: dict[str, float]) -> Text | None:
    """t = r + c · (a known tensor): an extra term (c = 1), a missing one (c = -1), or a term scaled.
    The terms of t's shape are tested at once (as `same` and `_scaled` test one), the first that fits wins."""
    fitting = [(name, term) for name, term in terms if term.shape == t.shape == r.shape]
    if not fitting or not torch.isfinite(t).all():
        return None
    d = t - r
    stacked = torch.stack([term for _, term in fitting])  # (N, *t.shape)
    extra, missing, factors = _same_each(d, stacked), _same_each(-d, stacked), _factor_each(d, stacked)
    for (name, _), plus, minus, c in zip(fitting, extra.tolist(), missing.tolist(), factors):
        if plus:
            return text(f"{what} plus an extra term equal to {name}",
                        f"{_zh_subject(what)}多了一项：{view_zh(name)}")
        if minus:
            return text(f"{what} missing the term {name}", f"{_zh_subject(what)}少了一项：{view_zh(name)}")
        if c is not None:
            scale = factor_name(1 + c, sizes)
            named = f" = {scale}" if scale != f"{1 + c:.4g}" else ""
            return text(f"{what} plus {c:.4g} × ({name}): that term scaled by {1 + c:.4g}{named}",
                        f"{_zh_subject(what)}多加了 {c:.4g} × ({view_zh(name)})："
                        f"这一项的系数成了 {1 + c:.4g}{named}")
    return None


def _same_each(t: Tensor, rs: Tensor, atol: float = 1e-5) -> Tensor:
    """(N,) bool: `same(t, rs[i])` for each i, in one pass (allclose's test, rtol 1e-5, written out)."""
    t, rs = t.double(), rs.double()
    close = (t - rs).abs() <= atol + (1e-5 * rs).abs()
    return torch.where(torch.isfinite(rs), close, t <= -1e4).flatten(1).all(1)


def _factor_each(t: Tensor, rs: Tensor) -> list[float | None]:
    """The constant factor c with t = c · rs[i] (not 1), for each i, in one pass: the median ratio over the
    reference's big entries (none: NaN, which fits nothing); None where no factor fits."""
    big = rs.abs() > 1e-3
    ratios = torch.where(big, t / rs, math.nan).flatten(1)  # (N, entries)
    ratios = F.pad(ratios, (0, 1), value=math.nan).nanmedian(1).values  # (N,): a NaN more, for empty views
    scaled = ratios.view(-1, *[1] * t.dim()) * rs  # (N, *t.shape)
    fits = torch.isclose(t, scaled, atol=1e-5, rtol=1e-4).flatten(1).all(1)
    fits &= torch.isfinite(rs).flatten(1).all(1) & bool(torch.isfinite(t).all())
    return [c if ok and not math.isclose(c, 1.0) else None for c, ok in zip(ratios.tolist(), fits.tolist())]


def form_of(t: Tensor, views: list[View], sizes: dict[str, float], pre: Tensor | None = None,
            terms: list[View] = (), forms: list[Form] = ()) -> Text | None:
    """The simple form of t against the reference's views of its shape, the first that has one: one
    of the `forms` the caller states (a wrong axis, a norm of another sub-step); then each of
    SIMPLE over every view, the closest first (the view itself, its sign flipped, the view but for
    one slice, its complement); a softmax (or a sum) over another axis (dividing by the sum of
    every entry is a factor too); then a mask's edge, a factor, an offset, a transpose or a shift;
    then a term (against the latest view first: the sub-step nearest to it)."""
    views = [(what, r) for what, r in views if r.shape == t.shape]
    near = sorted(views, key=lambda v: int((~torch.isclose(t, v[1], atol=1e-5)).sum()))  # the closest first
    tests = [lambda: next((form for form, r in forms if same(t, r)), None), lambda: _simple(t, near),
             lambda: _softmax_axis(t, pre)]
    tests += [functools.partial(_against, t, r, what, sizes) for what, r in views]
    tests += [functools.partial(_term, t, r, what, list(terms), sizes) for what, r in reversed(views)]
    return next(filter(None, (test() for test in tests)), None)  # each test run only until one holds


def _against(t: Tensor, r: Tensor, what: str, sizes: dict[str, float]) -> Text | None:
    """A mask's edge, a factor (or a transpose), an offset or a shift of one view."""
    return (_mask_edge(t, r, what) or _scaled(t, r, what, sizes) or _offset(t, r, what)
            or _shift(t, r, 2 if r.dim() == 4 else 1, what))


def _one_slice(t: Tensor, r: Tensor) -> dict[str, int] | None:
    """t is r but at one index of one axis (a row left out of a fix, `remove[0]` for `remove[..., 0]`),
    an axis of at least 2: where its code writes the wrong slice; None when it is not."""
    off = ~torch.isclose(t, r, atol=1e-5) & (torch.isfinite(r) | torch.isfinite(t))  # (...)
    places = [{"dim": d, "index": int(i)} for d in range(t.dim()) for i in off.nonzero()[:, d].unique()
              if t.size(d) > 1 and off.select(d, int(i)).sum() == off.sum()]
    return places[0] if places and 0 < off.sum() < off.numel() else None


# each test over every view (the closest first), in this order: its form when it holds; a sign
# first (-q·kᵀ/sqrt(d_k) is a factor -1/sqrt(d_k) of q·kᵀ too)
SIMPLE = ((same, "it is {what}: the steps after it are left out", "它就是 {zh}：之后的步骤被漏掉了"),
          (lambda t, r: same(t, -r), "{what} with its sign flipped", "{zh} 的符号反了"),
          (_one_slice, "{what}, except at index {index} of dim={dim}: it differs there alone",
           "{zh}，只有 dim={dim} 的下标 {index} 处不同"),
          (lambda t, r: r.min() >= 0 and r.max() <= 1 and same(t, 1 - r), "{what}, inverted (1 - it)",
           "{zh} 取反了（1 - 它）"))


def _simple(t: Tensor, views: list[View], tests: tuple[Any, ...] = SIMPLE) -> Text | None:
    for (test, en, zh), (what, r) in itertools.product(tests, views):
        found = test(t, r)
        if found:  # True, or the fields of the form (the slice)
            fields = {"what": what, "zh": view_zh(what), **(found if isinstance(found, dict) else {})}
            return text(en.format(**fields), zh.format(**fields))
    return None


def _written(t: Tensor, views: list[View]) -> Text | None:
    """A line of a tensor built in place that writes one value where the reference has another one
    (the smoothing where the confidence goes): both values, not a coincidence of them (1 - 0.9)."""
    theirs, ours = t.unique(), [(what, r.unique()) for what, r in views if r.shape == t.shape]
    what, r = next(((w, r) for w, r in ours if r.numel() == 1), (None, None))
    return what and theirs.numel() == 1 and text(
        f"the line writes {float(theirs):.4g} where {what} has {float(r):.4g}",
        f"这一行写入的是 {float(theirs):.4g}，{view_zh(what)} 在这些位置是 {float(r):.4g}") or None


def _slice_form(t: Tensor, views: list[View]) -> Text | None:
    """A tensor built in place that is the closest view but for one slice: the slice its wrong line wrote."""
    near = sorted([v for v in views if v[1].shape == t.shape],
                  key=lambda v: int((~torch.isclose(t, v[1], atol=1e-5)).sum()))
    return _simple(t, near[:1], SIMPLE[2:3])


def _scaled(t: Tensor, r: Tensor, what: str, sizes: dict[str, float]) -> Text | None:
    c = _factor_each(t.reshape(-1), r.reshape(1, -1))[0]  # (n,), (1, n): its caller gives a view of t's shape
    if c is not None:
        name = factor_name(c, sizes)
        named = f" = {name}" if name != f"{c:.4g}" else ""
        return text(f"{what} times a constant factor {c:.4g}{named}",
                    f"{view_zh(what)} 乘了一个常数因子 {c:.4g}{named}")
    if r.dim() >= 2 and same(t, r.transpose(-2, -1)):
        return text(f"{what} transposed (its last two axes swapped)",
                    f"{view_zh(what)} 被转置了（最后两个轴互换）")
    return None


# the difference of a departure that has no simple form (own_steps.py reads it off a finding)
NO_FORM = text("no simple form (not a factor, sign, transpose, shift, axis or term)",
               "没有简单的形式（不是常数因子、符号、转置、错位、轴或多余的项）")


@dataclass
class Departure:
    line: int
    name: str
    code: str
    form: Text | None
    called_from: tuple[int, str] | None = None  # (line, code) of their code that called the helper
    source: tuple[int, str, str] | None = None  # (line, name, code): where a size the line uses was read
    part: tuple[nn.Module, tuple[Any, ...], dict[str, Any]] | None = None  # as its step's: see Step
    ran: frozenset[tuple[int, int]] = frozenset()  # the spans of the classes and functions its run entered
    misread: bool = False  # the size `source` names holds another size: its line is the one quoted
    shared: bool = False  # a helper right in another call: the line calling it (`called_from`) is quoted

    def describe(self) -> Text:
        at = f"line {self.line}: {self.code}"
        at_zh = f"第 {self.line} 行的 `{view_zh(self.name)}`：{self.code}"
        if self.called_from:
            line, code = self.called_from
            at += f" (in a helper called from line {line}: {code})"
            at_zh += f"（在第 {line} 行调用的函数里：{code}）"
        if self.source:
            line, name, code = self.source
            how = "set" if name.startswith("self.") else "read"
            at += f" (its `{name}` was {how} at line {line}: {code})"
            at_zh += f"（其中的 `{name}` 来自第 {line} 行：{code}）"
        form = self.form or NO_FORM
        return text(f"the first step that parts from the reference is `{self.name}` at {at}; the difference: "
                    f"{form['en']}", f"第一个与参考不同的中间结果是{at_zh}；差别：{form['zh']}")

    def quoted(self) -> tuple[int, str]:
        """The learner's line to quote: this one (the helper's caller is in the text), or the line that
        bound a number wrong (`d_k = q.size(-2)`, `scale = 1.0 / d`), the line using it being right as
        written, or the line calling a helper that is right in another call."""
        return ((self.source[0], self.source[2]) if self.misread else
                self.called_from if self.shared else (self.line, self.code))

    def finding(self) -> Finding:
        """The report's finding, at the line `quoted` names: named as the catalogued mistake its form
        is, where the form names one (its "mistake" key), else DEPARTS."""
        form = self.form or {}
        return Finding(form.get("mistake", DEPARTS), self.describe(), *self.quoted(), form.get("variant", ""))


def first_departure(steps: list[Step], views: list[View], filename: str, sizes: dict[str, float],
                    pre: Tensor | None = None, terms: list[View] = (), ends: list[View] = (),
                    forms: list[Form] = ()) -> Departure | None:
    """The first step whose shape is one of the views' and whose values are none of them; a value
    the code returns judged against `ends` (the results) alone, when given: returning an earlier
    sub-step (q unrotated) is a departure, its line the step that made that value."""
    found = _departure_at(steps, views, ends)
    if found is None:
        return None
    step = _origin(steps, found) if ends else steps[found]
    departure = _wrong_operand(steps[:found], step, views, filename) or _departure(
        step, views, filename, sizes, pre, terms, forms)
    # a helper's argument that departs as it is handed over (`masked_mean(torch.min(a, b), mask)`): the
    # calling line made it, the helper never ran a line on it
    handed = step.given and departure.called_from is not None
    return traced(replace(departure, shared=handed), steps, filename, views)


def _wrong_operand(before: list[Step], step: Step, views: list[View], filename: str) -> Departure | None:
    """A departing sum `x = x + shortcut` one of whose operands, a name bound on an earlier line, holds
    a sub-step of the reference where another was meant (Raschka's `shortcut = x` saved after
    `x = self.norm1(x)`: the normed input, not the input): the line that bound it, with the form, and
    the sum quoted after it (HF's `hidden_states = hidden_states + ff` after the norm: the sum is the
    line written wrong)."""
    added = _added_names(filename, step.line)
    latest = {s.name: s for s in before if s.name in added}  # each operand's latest binding
    latest = {name: s for name, s in latest.items() if not s.given}  # an argument was bound by no line
    for op in latest.values():  # the first view each holds and wants is all the sum's form names
        holds = [*itertools.islice((what for what, r in views if same(op.value, r)), 1)]
        wants = [*itertools.islice((what for what, r in views if r.shape == op.value.shape
                                    and _sums_to_a_view(step.value - op.value + r, views)), 1)]
        for held, meant in zip(holds, set(wants) - set(holds)):
            form = text(f"`{op.name}` holds {held} where the sum wants {meant}",
                        f"`{op.name}` 存的是{view_zh(held)}，这里的和需要的是{view_zh(meant)}")
            form.update(dict.fromkeys(("mistake",) * _normed_residual(held, meant), "residual_from_normed"))
            both = f"{statement(filename, op.line)} / line {step.line}: {statement(filename, step.line)}"
            return Departure(op.line, op.name, both, form)
    return None


def _sums_to_a_view(total: Tensor, views: list[View]) -> bool:
    """The sum, with one operand in the place of another, is one of the views."""
    return any(same(total, whole) for _, whole in views)


def _normed_residual(held: str, meant: str) -> bool:
    """Whether an operand of a residual sum holds a sublayer's norm where the stream it normed was meant
    (the input x, or x after a sublayer): residual_from_normed, in any placement (GPT-J's parallel
    block adds `hidden_states` after it was normed)."""
    return held.startswith("the norm before") and meant.startswith(("the input x", "x + "))


def _added_names(filename: str, line: int) -> set[str]:
    """The names a statement starting at `line` adds (`x = x + shortcut`: x, shortcut; Phi's `return
    attn + ffn + hidden_states`: all three)."""
    tree = parsed_file(filename)
    sums = [n.value for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.Return)) and n.lineno == line]
    return {t.id for s in sums for t in _summed(s) if isinstance(t, ast.Name)}


def _summed(node: Any) -> list[Any]:
    """The terms of a sum (`a + b + c`: a, b, c); the node alone where it is no sum."""
    if isinstance(getattr(node, "op", None), ast.Add):  # a BinOp's (an expression has no AugAssign)
        return _summed(node.left) + _summed(node.right)
    return [node]


def traced(found: Departure, steps: list[Step], filename: str, views: list[View] = ()) -> Departure:
    """The departure with the spans of the top-level classes and functions of `filename` that its
    run went through (see `Steps`): a named finding quoted outside all of them is misplaced."""
    entered = getattr(steps, "entered", frozenset())
    return replace(_shared(found, steps, filename, views), ran=frozenset(
        span for span in _top_level(filename) if any(span[0] <= n <= span[1] for n in entered)))


def _shared(found: Departure, steps: list[Step], filename: str, views: list[View]) -> Departure:
    """A departure in a helper whose line gave the reference's value in another call (one norm class
    for q and for k): the helper is right, the line that calls it is quoted (`k = self.q_norm(k)`)."""
    right = {steps[i].line for i in _right_calls(steps, Matches(layouts(views, steps)))}
    return replace(found, shared=found.shared or bool(found.called_from) and found.line in right)


@functools.lru_cache(maxsize=8)
def _top_level(filename: str) -> tuple[tuple[int, int], ...]:
    """The (first, last) lines of each class and function defined at the top of the file."""
    tree = parsed_file(filename)
    defined = (ast.ClassDef, ast.FunctionDef)
    return tuple((n.lineno, n.end_lineno) for n in tree.body if isinstance(n, defined))


def _departure_at(steps: list[Step], views: list[View], ends: list[View] = ()) -> int | None:
    views = layouts(views, steps)
    shapes = {r.shape for _, r in views}
    matches = {id(views): Matches(views), id(ends): Matches(ends)}  # `same` with each view, at once
    right, reductions = _right_calls(steps, matches[id(views)]), Reductions(views)
    return next((i for i, step in enumerate(steps) if not _input(step) and i not in right and (
        step.value.shape in shapes and not matches[id(_judged_by(step, views, ends))](step.value)
        or step.value.shape not in shapes and _reduced(step.value, views, reductions))), None)


class Matches:
    """Whether a value is `same` as one of the views: the views of each shape stacked once (on the
    first value of that shape) with what `_same_each` computes of them alone (each entry's tolerance,
    where it is finite), then compared with it all at once, as `same` compares one."""

    def __init__(self, views: list[View]) -> None:
        self.views, self.stacks = views, {}

    def __call__(self, t: Tensor) -> bool:
        if t.shape not in self.stacks:
            of_shape = [r.double().reshape(-1) for _, r in self.views if r.shape == t.shape]
            rs = torch.stack(of_shape) if of_shape else None  # (N, n): flat, as `same`
            self.stacks[t.shape] = rs if rs is None else (rs, 1e-5 + (1e-5 * rs).abs(), torch.isfinite(rs))
        if self.stacks[t.shape] is None:
            return False
        rs, tolerance, finite = self.stacks[t.shape]
        t = t.reshape(-1).double()  # _same_each's test, its terms of the views computed once
        return bool(torch.where(finite, (t - rs).abs() <= tolerance, t <= -1e4).all(1).any())


def _right_calls(steps: list[Step], matches: Matches) -> set[int]:
    """The steps of each call of a helper of theirs (the steps under one calling line up to the value
    it returns) that returns one of the views (`matches`): its own sub-steps (an RMSNorm's x·rsqrt
    before the gain, in a helper of its own as Gemma's `_norm`) are not judged."""
    right: set[int] = set()
    for _, group in itertools.groupby(range(len(steps)), lambda i: steps[i].caller):
        run = list(group)
        last = max((j for j, i in enumerate(run) if _returns_a_view(steps[i], matches)), default=-1)
        right.update(run[:last + 1])
    return right


def _returns_a_view(step: Step, matches: Matches) -> bool:
    return step.caller is not None and step.name == "return" and matches(step.value)


REDUCTIONS = (("the mean", "均值", torch.mean), ("the sum", "和", torch.sum),
              ("the maximum", "最大值", torch.amax))


def _reduced(t: Tensor, views: list[View], reductions: Reductions | None = None) -> Text | None:
    """t is a mean, a sum or a maximum of a view over an axis other than the last, or over all its
    entries (the reference reduces over d_model or the keys, dim=-1): a reduction over the wrong axis,
    its shape none of the views'. The first of `Reductions.tried` that t equals, in their order; an
    error met before it (a mean of a whole-number view) is raised, as computing it in turn would."""
    tried, table = (reductions or Reductions(views)).tried(t.shape)
    hits = [*_same_each(t.reshape(-1), table).tolist(), False]  # row -1: a reduction of another shape
    for (what, how, how_zh, where, where_zh), error, row in tried:
        if error is not None:
            raise error
        if hits[row]:
            return text(f"{how} of {what} over {where}; the reference reduces over dim=-1",
                        f"{view_zh(what)} 的{how_zh}是在{where_zh}求的；参考在最后一个轴 dim=-1 上求")
    return None


# (the words of each reduction tried, the error computing it raised, its row or -1), the rows
Tried = tuple[list[tuple[tuple[str, ...], Exception | None, int]], Tensor]


class Reductions:
    """The reductions `_reduced` tries for a value of each shape, computed once for all the steps judged
    against the same views (a function's steps are many, its reference's views few), in this order:
    each view, each of REDUCTIONS, keepdim or not, each axis whose reduction has that shape (every axis
    of an empty or a whole-number view, where a reduction may raise). `tried(shape)`: ((words, the
    error computing it raised, its row in the table or -1), ...) and the table, a row of float64 for
    each reduction of that shape."""

    def __init__(self, views: list[View]) -> None:
        self.views, self.by_shape = views, {}

    def tried(self, shape: torch.Size) -> Tried:
        if shape not in self.by_shape:
            self.by_shape[shape] = self._tried(shape)
        return self.by_shape[shape]

    def _tried(self, shape: torch.Size) -> Tried:
        tried, rows = [], [torch.empty(0, shape.numel(), dtype=torch.float64)]
        for (what, r), (how, how_zh, op), keep in itertools.product(self.views, REDUCTIONS, (True, False)):
            every, by_shape = _axes(r.shape, keep)
            for dim, where, where_zh, _ in by_shape.get(shape, []) if r.is_floating_point() and r.numel() \
                    else every:
                row, error = _reduction(op, r, dim, keep, shape)
                tried.append(((what, how, how_zh, where, where_zh), error, len(rows) - 1 if row else -1))
                rows += row
        return tried, torch.cat(rows)


def _reduction(op: Callable[..., Tensor], r: Tensor, dim: Any, keep: bool, shape: torch.Size,
               ) -> tuple[list[Tensor], Exception | None]:
    """([op(r, dim, keepdim) as a row of float64] where it has `shape`, else []; None), or ([], the error
    it raised)."""
    try:
        value = op(r, dim=dim, keepdim=keep)
    except Exception as err:  # noqa: BLE001 - raised by `_reduced` in its turn, as the loop did
        return [], err
    return [value.double().flatten().unsqueeze(0)][:value.shape == shape], None


Axis = tuple[Any, str, str, torch.Size]  # (dim, the axis said in English and in Chinese, the shape it gives)


@functools.lru_cache(maxsize=256)
def _axes(shape: torch.Size, keep: bool) -> tuple[list[Axis], dict[torch.Size, list[Axis]]]:
    """The axes `_reduced` reduces a view of this shape over (each but the last, then all its entries
    at once), in that order, and the same by the shape the reduction gives (keepdim `keep`)."""
    n = len(shape)
    every = [(d, f"dim={d}", f" dim={d} 上", torch.Size(shape[:d] + (1,) * keep + shape[d + 1:]))
             for d in range(n - 1)]
    every.append((tuple(range(n)), "all entries at once", "所有元素上", torch.Size((1,) * (n * keep))))
    by_shape: dict[torch.Size, list[Axis]] = {}
    for axis in every:
        by_shape.setdefault(axis[3], []).append(axis)
    return every, by_shape


def _input(step: Step) -> bool:
    """The checked function's own argument as it was handed over: what check gave it, not its step."""
    return step.given and step.caller is None


def _judged_by(step: Step, views: list[View], ends: list[View]) -> list[View]:
    """The results (`ends`) for a value the function itself returns (not a helper of theirs), when
    given; else every view."""
    return ends if ends and step.name.startswith("return") and step.caller is None else views


def _origin(steps: list[Step], i: int) -> Step:
    """The first step that made step i's value: where a result is an earlier sub-step left as it
    was (q never rotated), the line that leaves out what follows."""
    return next(s for s in steps[:i + 1] if not s.given and same(s.value, steps[i].value))


def _departure(step: Step, views: list[View], filename: str, sizes: dict[str, float],
               pre: Tensor | None, terms: list[View], forms: list[Form] = (), wider: list[View] = (),
               ) -> Departure:
    """The departure at `step`; whether a part was handed a wrong input, by `wider` views too (every
    reading's)."""
    whole = layouts(views, [step])
    written, views = next(iter(_wrong_writes(step, whole)), (step, views))
    views = layouts(views, [written])
    called = written.caller and (written.caller, linecache.getline(filename, written.caller).strip())
    form = (written is not step and (_slice_form(step.value, whole) or _written(written.value, views))
            or form_of(written.value, views, sizes, pre, terms, forms) or _reduced(written.value, views))
    line = _inside(written, filename, views, [*views, *wider]) or written.line
    source = _size_source(written, statement(filename, line), form, sizes, filename)
    return Departure(line, written.name, statement(filename, line), form,
                     None if source else called or None, source, part=written.part,
                     misread=bool(source) and _misread_source(written, source, sizes, form))


def _misread_source(step: Step, source: tuple[int, str, str], sizes: dict[str, float],
                    form: Text | None) -> bool:
    """Whether the number `source` names was bound wrong on its own line (see `_misread`, `_bound_root`)."""
    value = step.numbers[source[1]][1]
    return _misread(value, source[1], sizes, form) or _bound_root(value, form, sizes, source[2])


# the names a size is read under (a head's width: d_k, head_dim, ...), as the localizer's sizes name it
SIZE_NAMES = {**dict.fromkeys(("d_k", "head_dim", "d_head", "head_size", "dim_head", "hs"), "d_k"),
              "d_model": "d_model", "n_heads": "n_heads", "num_heads": "n_heads"}


def _misread(value: float, name: str, sizes: dict[str, float], form: Text | None) -> bool:
    """Whether a number (`name`, its value) a departing line uses was bound wrong on its own line: read
    under the name of another size (`d_k = q.size(-2)`: d_k holding the length T), or it is the whole
    difference (see `_holds_factor`): then that line is the mistake."""
    size = SIZE_NAMES.get(name.removeprefix("self."), "")
    return size in sizes and value != sizes[size] or _holds_factor(value, form, sizes)


# the factor a form names: "... times a constant factor 0.25 = 1/d_k" (in its English text)
FACTOR_SAID = re.compile(r"times a constant factor (-?\d+(?:\.\d+)?(?:e-?\d+)?)")


def _holds_factor(value: float, form: Text | None, sizes: dict[str, float]) -> bool:
    """A fraction, not a whole number (a count of heads, a size), that is the constant factor c the form
    names, times 1 or the reference's own scale on the view it names (1/sqrt(d_k) on the scores), as a
    scale is (`scale = 1.0 / d` used as `q = q * scale`, the scale wanting 1/sqrt(d)): the difference
    is that number, so the line that bound it is the one written wrong."""
    c = abs(float(next(iter(FACTOR_SAID.findall(str(form))), "nan")))
    return value != round(value) and _power_name(abs(value) / c, sizes, (0.0, 0.5)) is not None  # n**0: 1


# a number bound as a root: `self.norm_factor = math.sqrt(projection_size)`, `scale = d ** 0.5`
ROOT = re.compile(r"sqrt\(|\*\*\s*\(?\s*0?\.5\b")


def _bound_root(value: float, form: Text | None, sizes: dict[str, float], code: str) -> bool:
    """A divisor bound as a root on its own line that is the whole difference: times the form's factor
    c it is 1 (the factor read against q·kᵀ unscaled) or the reference's divisor, the root of a size
    (read against the scaled scores): `self.norm_factor = math.sqrt(H * Dh)` used as `scores /
    self.norm_factor`, the scores wanting sqrt(Dh), took the root of the wrong size there. A whole
    number (a count, a size) is one only where its line takes a root."""
    c = abs(float(next(iter(FACTOR_SAID.findall(str(form))), "nan")))
    return bool(ROOT.search(code)) and _power_name(abs(value) * c, sizes, (0.0, 0.5)) is not None


def _size_source(step: Step, code: str, form: Text | None, sizes: dict[str, float], filename: str,
                 ) -> tuple[int, str, str] | None:
    """A number the departing line uses whose value is a size the form names, bound on another line
    (`d_k = query.size(-2)`: 5 = T where the scale wants d_k): (that line, the name, its code); the
    number that is the whole difference (`_holds_factor`) first."""
    said = (form or {"en": ""})["en"]
    named = {sizes[k] for k in sizes.keys() & set(re.findall(r"[A-Za-z_]\w*", said))}
    written = set(map(float, re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?", said)))  # `writes 1`
    used = set(re.findall(r"self\.\w+|[A-Za-z_]\w*", code))
    def whole(line: int, value: float) -> bool:  # the number is the whole difference
        return _holds_factor(value, form, sizes) or _bound_root(value, form, sizes,
                                                                 statement(filename, line, False))
    bound = sorted((not whole(line, value), line, name) for name, (line, value) in
                   (step.numbers or {}).items() if name in used and line not in (0, step.line) and (
                       value in named or whole(line, value) or name.startswith("self.")
                       and any(math.isclose(value, n, rel_tol=1e-3) for n in written)))
    return next(((line, name, statement(filename, line, False)) for _, line, name in bound), None)


def _inside(step: Step, filename: str, views: list[View], wider: list[View]) -> int | None:
    """For a part's output (a module of their own file, its forward not traced: a GELU of theirs in
    an nn.Sequential), the line of its forward that returns it; None for any other step, for a part
    check grades on its own (a LayerNorm of theirs applied where it should not be), and for a part
    handed the wrong input (see `fed_wrong`)."""
    module, args, kwargs = step.part or (None, (), {})
    forward = getattr(type(module), "forward", None)
    code = getattr(forward, "__code__", None)
    if graded(module) or code is None or inspect.getsourcefile(forward) != filename or fed_wrong(
            step.part, views, wider):
        return None
    steps = trace_steps(lambda: module(*args, **kwargs), filename, code)
    return next((s.line for s in reversed(steps) if s.name == "return"), None)


def fed_wrong(part: tuple[nn.Module, tuple[Any, ...], dict[str, Any]], views: list[View], wider: list[View],
              ) -> bool:
    """A part that gives one of the reference's values (`wider`) when handed one of them (`views`) in
    place of its first input (`self.mlp(residual)` where the reference's MLP reads the norm): the part
    is right, what the line calling it hands it is not, so that line is the one to quote."""
    module, args, kwargs = part
    given = first_tensor(args[:1])  # their first input (None: not a tensor, and nothing is tried)
    outs = [quietly(lambda r=r: first_tensor(module(r.to(given.dtype), *args[1:], **kwargs)).double())
            for _, r in views if r.shape == getattr(given, "shape", None)]  # None where it raises
    matches = Matches(wider)  # the wider views of each shape stacked once, for every output
    return any(quietly(lambda out=out: out.dim() > 0 and matches(out)) for out in outs)  # never a number


def graded(module: nn.Module) -> bool:
    """A part check grades on its own, by its name (its report says whether it departs)."""
    return type(module).__name__ in TABLED


def statement(filename: str, line: int, whole: bool = True) -> str:
    """The code at `line`; the statement's second line too when it spans two lines and `whole`
    (a constant on the continuation line of `return 0.5 * x * (1 + torch.tanh(`)."""
    code, end = linecache.getline(filename, line).strip(), _spans(filename).get(line, line)
    two = whole and end == line + 1
    second = [f"line {line + 1}: {linecache.getline(filename, line + 1).strip()}"] * two
    return " / ".join([code] + second)


@functools.lru_cache(maxsize=8)
def _spans(filename: str) -> dict[int, int]:
    """Each statement's first line -> its last line (a file check imported: it parses)."""
    tree = parsed_file(filename)
    return {n.lineno: n.end_lineno for n in ast.walk(tree) if isinstance(n, ast.stmt)}


def layouts(views: list[View], steps: list[Step]) -> list[View]:
    """The views, and each in the shapes of the steps given that merge its adjacent axes (d2l's heads (B·H, T,
    Dh), a mask's rows (B·T, S)): the same values in a flattened layout; a (B, T, D) view also
    sequence-first, (T, B, D), where a step has that shape (PyTorch's nn.Transformer tutorial); a view
    of one sequence, (T, D) or (1, T, D), for each of a step's (B, T, D) (positions looked up per row)."""
    views = [(what, r.double()) for what, r in views]  # as the steps are kept
    shapes = {s.value.shape for s in steps}
    return views + [(f"{what}, reshaped to {tuple(shape)}", r.reshape(shape)) for what, r in views
                    for shape in shapes if _merges(r.shape, shape)] + [
        (f"{what}, sequence-first (T, B, D)", r.transpose(0, 1)) for what, r in views
        if r.dim() == 3 and r.size(0) != r.size(1) and r.transpose(0, 1).shape in shapes] + [
        (f"{what}, for each sequence", r.squeeze(0).expand(shape)) for what, r in views for shape in shapes
        if len(shape) <= 3 and r.squeeze(0).shape == shape[1:] != ()]  # (1, T, D) too; never a number (a
    # loss) spread over a row, nor a (B, H, T, Dh) view spread over a stack of q, k, v (3, B, H, T, Dh)


def _merges(big: torch.Size, small: torch.Size) -> bool:
    """small is big with runs of adjacent axes merged: every product of its leading axes is one of big's."""
    def prefixes(shape: torch.Size) -> set[int]:
        return set(itertools.accumulate(shape, operator.mul))
    return len(small) < len(big) and math.prod(small) == math.prod(big) and prefixes(small) <= prefixes(big)


def _unpermuted(t: Tensor, views: list[View]) -> Text | None:
    """t is a view's values reshaped as they lie in memory, where the reference moves axes first
    (a permute or transpose left out before a reshape): its shape is then no view's."""
    n = t.numel()
    as_laid = functools.cache(lambda i: same(views[i][1].reshape(t.shape), t))  # each view compared once
    for (i, (what, s)), (result, r) in itertools.product(enumerate(views), views):
        if not (s.numel() == r.numel() == n and s.dim() > r.dim() and t.shape not in (s.shape, r.shape)
                and as_laid(i)):
            continue
        if _permuted(s, r):
            shape, ref = tuple(t.shape), tuple(r.shape)
            return text(f"{what} reshaped to {shape} as it lies in memory; the reference moves its axes "
                        f"before the reshape ({result} is {ref}): a transpose or permute left out",
                        f"{_zh_subject(what)}按内存顺序直接改成了形状 {shape}；参考在改形状之前先换轴"
                        f"（{_zh_subject(result)}的形状是 {ref}）：漏了 transpose 或 permute")
    return None


def _permuted(s: Tensor, r: Tensor) -> bool:
    """r is s with its axes moved (in an order other than s's own), then reshaped."""
    orders = list(itertools.permutations(range(s.dim())))[1:]
    return any(same(s.permute(p).reshape(r.shape), r) for p in orders)


def misshapen_departure(steps: list[Step], views: list[View], filename: str) -> Departure | None:
    """For code that raised: the last step that is a view's values in a layout the reference never
    has (a reshape without its permute), at its own line."""
    for i in reversed(range(len(steps))):
        form = _unpermuted(steps[i].value, views)
        if form is not None:
            step = _origin(steps, i)  # the line that made it, not one that passed it on
            return Departure(step.line, step.name, linecache.getline(filename, step.line).strip(), form)
    return None


def _wrong_writes(step: Step, views: list[View]) -> list[tuple[Step, list[View]]]:
    """For a tensor built in place over several lines (a target distribution: fill, scatter, zero the
    padding), each line whose values that last to the end are not the reference's (the view of its
    shape it agrees with most): that line's step and the views, on those values alone."""
    r = max((r for _, r in views if r.shape == step.value.shape),
            key=lambda r: int(torch.isclose(step.value, r).sum()), default=step.value)
    out = []
    for before, now in zip((None, *step.earlier), step.earlier and (*step.earlier, step)):
        wrong = (now.value != getattr(before, "value", torch.nan)) & (step.value == now.value)
        wrong &= ~torch.isclose(now.value, r, atol=1e-3)  # a float32 table at positions in the thousands
        out += [(now._replace(value=now.value[wrong]), [(what, t[wrong]) for what, t in views
                                                        if t.shape == wrong.shape])] * bool(wrong.any())
    return out


def latest_departure(steps: list[Step], readings: list[list[View]], filename: str, sizes: dict[str, float],
                     terms: list[View] = (), forms: list[Form] = (), ends: bool = False) -> Departure | None:
    """Where the learner's steps part from the reference read the way that explains most of them
    (which weights are the gate, which activation, pre- or post-norm): the latest first departure of
    the readings; None when one reading explains every step. `ends`: what their function returns is
    judged against each reading's last view alone (a layer that returns its FFN's output departs at
    the line that left the residual out)."""
    last = [views[-1:] if ends else [] for views in readings]
    at = [_departure_at(steps, views, end) for views, end in zip(readings, last)]
    if not steps or not readings or None in at:
        return None
    i = min((j for j in range(len(at)) if at[j] == max(at)),
            key=lambda j: _fewest_wrong(steps[at[j]], readings[j]))
    step = _origin(steps, at[i]) if last[i] else steps[at[i]]
    found = _wrong_operand(steps[:at[i]], step, readings[i], filename) or _departure(
        step, readings[i], filename, sizes, None, list(terms) + readings[i], forms, sum(readings, []))
    return traced(found, steps, filename, readings[i])


def _fewest_wrong(step: Step, views: list[View]) -> tuple[int, int]:
    """How a reading ranks on a tensor built in place: the fewer lines it leaves wrong the better; of
    two that leave one line each wrong, the one whose wrong line writes more entries (a fill of the
    wrong value), since a line that writes a slice just as a convention has it (the pad column zeroed)
    was written for that convention."""
    wrong = _wrong_writes(step, views)
    return len(wrong), -sum(int(s.value.numel()) for s, _ in wrong)


def attention_views(w: V.MHAWeights, x: Tensor, keep: Tensor | None) -> tuple[list[View], Tensor]:
    """The reference multi-head attention's sub-steps on x (B, T, D), in forward order, in the
    layouts learners write them (with the rotary and grouped-head steps when it has them); and its
    scores before the softmax."""
    B, T, D = x.shape
    q, k, v = (V.linear(x, p) for p in (w.q, w.k, w.v))  # (B, T, D)
    n_kv = w.n_kv_heads or w.n_heads
    qh = V.split_heads(q, w.n_heads, frozenset())  # (B, H, T, Dh)
    kh, vh = (V.split_heads(t, n_kv, frozenset()) for t in (k, v))  # (B, Hkv, T, Dh)
    views = [("the input x", x), ("q", q), ("k", k), ("v", v), ("the heads of q", qh),
             ("the heads of k", kh), ("the heads of v", vh)]  # x: a comprehension's `for lin, x in ...`
    qh, kh, views = _positioned(w, qh, kh, views)
    kh, vh, views = _repeated(w, kh, vh, views)
    raw = qh @ kh.transpose(-2, -1)  # (B, H, T, T)
    scale = (w.scale or 1 / math.sqrt(qh.size(-1))) if w.rope not in V.UNSCALED else 1.0
    scores = raw * scale
    views += [("q, scaled by 1/sqrt(d_k)", q * scale), ("the heads of q, scaled by 1/sqrt(d_k)", qh * scale)]
    scores, views = _biased(w, scores, views)
    if w.softcap is not None:  # Gemma 2's: the scores soft-capped before the mask
        views.append(("the scores before their soft cap", scores))
        scores = w.softcap * torch.tanh(scores / w.softcap)
    if keep is not None:  # the scaled scores before the mask is added (Meta's `scores + mask`) are a step too
        views.append(("the scores q·kᵀ/sqrt(d_k), before the mask", scores))
        scores = scores.masked_fill(~keep, float("-inf"))
    weights, views = _sunk(w, scores, views)
    heads = weights @ vh  # (B, H, T, Dh)
    concat = heads.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
    out = V.linear(concat, w.o) if w.o is not None else concat
    views += [("q·kᵀ", raw), ("the scores q·kᵀ/sqrt(d_k)", scores), ("the attention weights", weights),
              ("weights·v", heads), ("weights·v, heads concatenated", concat), ("the output", out)]
    headed = [view for view in views if view[1].dim() == 4 and view[1].shape[-2:] != (T, T)]
    views += [(f"{name} (B, T, H, Dh)", t.transpose(1, 2)) for name, t in headed]
    return views, scores


def _sunk(w: V.MHAWeights, scores: Tensor, views: list[View]) -> tuple[Tensor, list[View]]:
    """The weights (B, H, T, S): a softmax of the scores, or, with gpt-oss's sinks, of the scores with
    each head's sink logit joined as one more column, that column dropped after; its views."""
    if w.sinks is None:
        return torch.softmax(scores, dim=-1), views
    sink = w.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, T, 1)
    joined = torch.cat([scores, sink], dim=-1)  # (B, H, T, S + 1)
    full = torch.softmax(joined, dim=-1)
    return full[..., :-1], views + [("the scores with each head's sink logit joined", joined),
                                    ("the attention weights with the sink's column", full)]


def _biased(w: V.MHAWeights, scores: Tensor, views: list[View]) -> tuple[Tensor, list[View]]:
    """The scores (B, H, T, S) with the positional term the reference adds (ALiBi's, T5's), and the
    views of that term and of the sum; as they were when it adds none."""
    B, _, T, S = scores.shape
    bias = V.score_bias(w, T, S)
    if bias is None:
        return scores, views
    named = f"the {w.rope} positional term on the scores"  # ALiBi's one row a head, as BLOOM's (B * H, 1, S)
    return scores + bias, views + [("the scores q·kᵀ/sqrt(d_k), before their positional term", scores),
                                   (named, bias), (f"{named}, each sequence's", bias.expand(B, -1, -1, -1)),
                                   (f"{named}, one sequence's", bias[0]),  # (H, T|1, S)
                                   (f"{named}, (T, S, H) as a table lookup gives it",
                                    bias[0].permute(1, 2, 0)),
                                   ("the scores with their positional term", scores + bias)]


def _positioned(w: V.MHAWeights, qh: Tensor, kh: Tensor, views: list[View],
                ) -> tuple[Tensor, Tensor, list[View]]:
    """Queries and keys (B, H, T, Dh) normed per head and rotated by their positions, as the
    reference does; the views of those steps (rotate_half's for the half-split layout): none when it
    does neither."""
    normed = V.qk_positions(replace(w, rope=None), qh, kh, 0, frozenset())  # QK-norm alone
    if w.qk_norm is not None:
        views = views + [("the heads of q, normed (QK-norm)", normed[0]),
                         ("the heads of k, normed (QK-norm)", normed[1])]
    if w.rope in ROTATION_HELPERS:
        helper = ROTATION_HELPERS[w.rope]
        views = views + [(f"{helper.__name__}({name})", helper(t)) for name, t in zip("qk", normed)]
    qr, kr = V.qk_positions(w, qh, kh, 0, frozenset())
    if V.is_rotary(w.rope):
        views = views + [(f"the heads of q, rotated ({w.rope} rotary)", qr),
                         (f"the heads of k, rotated ({w.rope} rotary)", kr)]
    return qr, kr, views


def rotate_half(t: Tensor) -> Tensor:
    """(..., Dh) -> (-the second half, the first half): the half-split rotation's helper."""
    half = t.size(-1) // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


def rotate_every_two(t: Tensor) -> Tensor:
    """(..., Dh) -> (-x1, x0, -x3, x2, ...): the interleaved rotation's helper (GPT-J's)."""
    return torch.stack((-t[..., 1::2], t[..., ::2]), -1).flatten(-2)  # (..., Dh)


# a rotary layout -> the helper whose output the learner's code makes on the way (rotate_half(q))
ROTATION_HELPERS = {"half": rotate_half, "interleaved": rotate_every_two}


def _repeated(w: V.MHAWeights, kh: Tensor, vh: Tensor, views: list[View],
              ) -> tuple[Tensor, Tensor, list[View]]:
    """Keys and values (B, Hkv, T, Dh) repeated to every query head (B, H, T, Dh), and their views."""
    if not w.n_kv_heads or w.n_kv_heads == w.n_heads:
        return kh, vh, views
    n_rep = w.n_heads // w.n_kv_heads
    kr, vr = V.repeat_kv(kh, n_rep), V.repeat_kv(vh, n_rep)  # (B, H, T, Dh)
    return kr, vr, views + [("the heads of k, repeated for each query head", kr),
                            ("the heads of v, repeated for each query head", vr)]


Run = tuple[Callable[..., Any], str | None]  # the learner's attention called one way; a rotary layout


def _attention_input(w: V.MHAWeights, causal_inside: bool) -> tuple[Tensor, Tensor | None, dict[str, float]]:
    """The localizer's self-attention input x (B, T, D), the causal keep when causal inside, and the sizes."""
    from handformer.check.core.fingerprint import randn

    B, T, D = 2, 5, w.q[0].size(1)
    x = randn(B, T, D, seed=41).requires_grad_()
    keep = V.causal_keep(T)[None, None] if causal_inside else None
    return x, keep, {"d_k": D // w.n_heads, "d_model": D, "n_heads": w.n_heads, "T": T}


def localize_attention(runs: list[Run], w: V.MHAWeights, filename: str, causal_inside: bool,
                       ) -> Departure | None:
    """Run the learner's attention (self-attention on one input, causal if it is causal inside)
    traced, each way in `runs` (a mask convention) read with its rotary layout, and find where it
    parts from the reference in the run and reading that explain the most steps."""
    x, keep, sizes = _attention_input(w, causal_inside)
    read = []
    for call, rope in runs:
        try:
            steps = trace_steps(lambda call=call: call(x, x, x, None), filename)
        except Exception:  # noqa: BLE001 - their code refuses this way of calling it: not a reading
            continue
        views, scores = attention_views(replace(w, rope=rope), x.detach(), keep)
        read.append((_departure_at(steps, views), steps, views, scores))
    if not read or any(at is None for at, *_ in read):
        return None  # one reading explains every step
    at, steps, views, scores = max(read, key=lambda r: r[0])
    axes = [(form | {"mistake": "softmax_wrong_dim"}, r)  # the weights' softmax over another axis: named
            for form, r in over_axes("a softmax", "softmax", lambda d: scores.softmax(d), scores.dim())]
    found = _mislabeled(steps[:at], views, filename) or _departure(steps[at], views, filename, sizes, scores,
                                                                  [("the input x", x.detach())], axes)
    return traced(found, steps, filename, views)


# the names learners give queries, keys and values (q, xq, query, queries, query_states, q_heads), by role
ROLE_NAMES = re.compile(r"(?P<q>x?q|quer(y|ies)(_\w+)?|q_\w+)|(?P<k>x?k|keys?(_\w+)?|k_\w+)|"
                        r"(?P<v>x?v|values?(_\w+)?|v_\w+)")
# a view of q, k or v ("q", "the heads of k (B, T, H, Dh)") and its role; any other view, no role (None)
ROLE_VIEW = re.compile(r"(?:the heads of )?([qkv])(?:, .*| \(.*)?|.*")


def _mislabeled(steps: list[Step], views: list[View], filename: str) -> Departure | None:
    """The first step named as queries, keys or values (`query`, `k`) that holds another of them (an
    unpacking in the wrong order: `key, query, value = qkv.split(...)`): the line where the roles were
    swapped, before the scores that show it (transposed); a value handed to a helper is not one its
    code made. None when every such step holds its own."""
    roles = [(ROLE_VIEW.fullmatch(what), r) for what, r in layouts(views, steps)]
    for step in steps:
        named = ROLE_NAMES.fullmatch(step.name)
        held = {m[1] for m, r in roles if same(step.value, r)} - {None}
        if named and not step.given and held and named.lastgroup not in held and not _iterated(
                filename, step.line, step.name):
            said, other = named.lastgroup, min(held)
            return Departure(step.line, step.name, statement(filename, step.line), text(
                f"it holds {other}, where its name says {said}: the roles of q, k and v swapped",
                f"它存的是 {other}，名字却说是 {said}：q、k、v 的角色弄反了"))
    return None


LOOPS = (ast.For, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _iterated(filename: str, line: int, name: str) -> bool:
    """Whether `name` is the variable of a loop or comprehension on `line` (`[k.transpose(1, 2) for k in
    [q, k, v]]`): it takes each value in turn, so its name is no role."""
    loops = [n for n in ast.walk(parsed_file(filename))
             if isinstance(n, LOOPS) and n.lineno <= line <= n.end_lineno]
    targets = [n.target for n in loops if isinstance(n, ast.For)] + [g.target for n in loops
                                                                     for g in getattr(n, "generators", ())]
    return any(isinstance(t, ast.Name) and t.id == name for target in targets for t in ast.walk(target))


def note_raised_attention(res: ComponentResult, comp: Any, runs: list[Run], w: V.MHAWeights,
                          causal_inside: bool) -> None:
    """Attention whose code raises (a shape error further on): a note at the line that made the
    shape the reference never has, a view's values reshaped without its permute (see `_unpermuted`)."""
    filename = inspect.getsourcefile(comp.obj)
    x, keep, _ = _attention_input(w, causal_inside)
    views = attention_views(w, x.detach(), keep)[0]
    for call, _rope in runs:
        steps: list[Step] = []  # it raises: the steps up to there are what is judged
        quietly(lambda call=call, steps=steps: trace_steps(lambda: call(x, x, x, None), filename, into=steps))
        found = misshapen_departure(steps, views, filename)
        if found is not None:
            return add_departure(res, found)


def place_findings(res: ComponentResult, localize: Callable[[], Any], lines: list[tuple[int, str]] = (),
                   ) -> None:
    """A catalogued finding whose line is unsure is placed where the learner's computation first
    parts from the correct reference: its patterns match no line, or several of the learner's lines
    (the sin line and the cos line of a table), or only a diagnosis' guess found it (a pattern after
    its first: `norm`, `embed|emb`), and the departing line is one a pattern as telling finds (of two
    `norm(` lines, the one that departs), or the finding's line cannot be the mistake (see
    `misplaced`, `deeper`): the line they wrote wrong, not one that looks alike."""
    unsure = [f for f in res.named() if f.line is None or _one_of_several(f, lines)
              or not first_pattern_matches(f.name, f.code or "", f.form)]
    found = quietly(localize) if unsure else None  # the run only where a line is unsure
    if found is None:
        return
    line, code = found.quoted()
    for finding in unsure:  # the departing line, where a pattern as telling as the finding's finds it
        told = pattern_rank(finding.name, code.split(" / line ")[0]) <= pattern_rank(finding.name, str(
            finding.code)) < math.inf  # a pattern as telling as the one that found its line finds it too
        moved = finding.line != line  # the same line kept as the finding quotes it (with its second line)
        used = found.misread and finding.line == found.line  # `/ self.norm_factor` right, its binding wrong
        if moved and (finding.line is None or told or used
                      or misplaced(finding, found) or deeper(finding, found)):
            finding.line, finding.code = line, code


def commented_out(res: ComponentResult, filename: str) -> None:
    """A named finding a few lines below a statement the learner commented out (`# loss = loss /
    grad_accum_steps` above `loss.backward()`), one that binds a name the finding's line or the line
    above it reads: that line is quoted, the step they turned off; or in a function with a statement
    that changes nothing (`==` for `=`, `scores = scores`, a product left unused, see `_idle`): that
    line, the step that does nothing."""
    for finding in res.named():
        found = finding.line and (_turned_off(filename, finding.line) or _no_effect(filename, finding.line))
        if found:
            finding.line, finding.code = found


def _no_effect(filename: str, line: int) -> tuple[int, str] | None:
    """A statement in the function around `line` that does nothing (`true_dist[:, self.padding_idx] ==
    0`, an assignment with `==` for `=`; see `_idle`), the nearest: (its line, its text)."""
    around = [f for f in _idle_statements(parsed_file(filename)) if f[0] <= line <= f[1]]
    idle = max(around, key=lambda f: f[0], default=(0, 0, ()))[2]
    return min(((n, linecache.getline(filename, n).strip()) for n in idle), key=lambda nc: abs(nc[0] - line),
               default=None)


@functools.lru_cache(maxsize=8)
def _idle_statements(tree: ast.Module) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """(first line, last line, the lines of its statements that do nothing) of each function of a parsed
    file: walked once a file, not once a finding (a check of a file with many findings asks often)."""
    return tuple((f.lineno, f.end_lineno or f.lineno, tuple(n.lineno for n in ast.walk(f) if _idle(n)))
                 for f in ast.walk(tree) if isinstance(f, ast.FunctionDef))


def _idle(node: ast.AST) -> bool:
    """A statement that changes nothing: a comparison or an arithmetic result left unused
    (`x == 0`, `x * normalizer`), or a name assigned to itself (`scores = scores`, a step taken out)."""
    kinds = (type(node), type(getattr(node, "value", None)))
    return kinds in IDLE or isinstance(node, ast.Assign) and bool(SELF_ASSIGNED.fullmatch(ast.unparse(node)))


IDLE = {(ast.Expr, ast.Compare), (ast.Expr, ast.BinOp)}  # a statement of a comparison, of arithmetic
SELF_ASSIGNED = re.compile(r"([\w.]+) = \1")  # `scores = scores`, as ast.unparse writes it


TURNED_OFF_WITHIN = 15  # lines above a finding's: a buffer's fill in __init__ above the forward that uses it


def _turned_off(filename: str, line: int) -> tuple[int, str] | None:
    """The last commented-out statement in the lines above `line`, when it binds a name that line or
    the one above reads, and every name it reads is one the file's code uses (`# S = QK^T / sqrt(d_k)`
    is a formula, not code): (its line, its text)."""
    start = max(line - TURNED_OFF_WITHIN, 1)
    text = "".join(linecache.getlines(filename)[start - 1:line])
    n, name, right = max([(start + text.count("\n", 0, m.start()), m[1], m[2])
                          for m in COMMENTED.finditer(text)], default=(0, "", ""))
    read = set(re.findall(r"\w+", linecache.getline(filename, line - 1) + linecache.getline(filename, line)))
    used = set(re.findall(r"\w+", "".join(code.split("#")[0] for code in linecache.getlines(filename))))
    turned_off = name in read and set(NAME.findall(right)) <= used and _parses(right)
    return (n, linecache.getline(filename, n).strip()) if turned_off else None


def _parses(expression: str) -> bool:
    """Whether a commented-out right-hand side is Python (`1 / 10000^(2i/d_model)，用 exp 计算` is prose)."""
    try:
        ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return False
    return True


# a comment line that is an assignment: `# loss = loss / n`, `# self.table[0] = 0` (the name bound: loss,
# table; then what it assigns, up to a comment of its own), not a comment of words
COMMENTED = re.compile(r"^[ \t]*#\s*(?:self\.)?(\w+)(?:\[[^\]\n]*\])?\s*(?:[-+*/]|//)?=(?!=)"
                       r"([^\n#]*?[\w)\]])\s*(?:#[^\n]*)?$", re.MULTILINE)
NAME = re.compile(r"[A-Za-z_]\w*")


def _one_of_several(finding: Finding, lines: list[tuple[int, str]]) -> bool:
    """The finding's line is one of several the diagnosis' patterns match in `lines` (the sin line and
    the cos line of a table); a line found outside them (a helper function of the file) is kept."""
    matching = lines_matching(finding.name, lines)
    return finding.line in matching and len(matching) > 1


def deeper(finding: Finding, found: Departure) -> bool:
    """A finding found by a guess alone (a pattern after its first) on a line that calls what the line
    calling the helper where the run parts calls (a loop's `model(` for the prompt and for each new
    token): the helper's line is the one to quote."""
    code = finding.code or ""
    _, calling = found.called_from or (None, "")
    return bool(set(CALLS.findall(code)) & set(CALLS.findall(calling))) and not first_pattern_matches(
        finding.name, code)


CALLS = re.compile(r"(\w+)\(")  # the names a line calls


def misplaced(finding: Finding, found: Departure) -> bool:
    """A finding's line that cannot be the mistake: outside every class and function the run that
    departs went through (a missing residual's pattern `norm` that finds `normal_(` in the model's
    init, for a block)."""
    return bool(found.ran) and not any(a <= finding.line <= b for a, b in found.ran)


# a finding that observes the output beside the difference (a row whose keys are all masked gives NaN),
# not one that explains it: where it is the only one, the departure is still looked for
OBSERVED = ("nan_on_masked_rows",)


def explained(res: ComponentResult) -> bool:
    """Whether a catalogued mistake explains the output (its line is then placed, no departure added)."""
    return any(f.name not in OBSERVED for f in res.named())


def add_departure(res: ComponentResult, found: Departure) -> None:
    """The departure as the result's one finding of its kind (a line in the learner's code)."""
    res.findings.append(found.finding())


def note_attention_departure(res: ComponentResult, comp: Any, runs: list[Run], w: V.MHAWeights,
                             causal_inside: bool) -> None:
    """A FAIL that no catalogued mistake explains gets a note: where the learner's attention first
    parts from the reference (see `localize_attention`), its line, and the form of the difference."""
    if res.max_abs_error is None or res.max_abs_error < 1e-5:
        return
    filename = inspect.getsourcefile(comp.obj)
    def localize() -> Departure | None:
        return filename and localize_attention(runs, w, filename, causal_inside)
    if explained(res):  # named: placed at the departing line when their patterns found none or several
        return place_findings(res, localize, source_lines([comp.obj]))
    found = localize()
    if found:
        add_departure(res, found)
