"""Runners for the next chapter, from logits to tokens: temperature, top-k, top-p, the greedy
choice and a sampling step, against handformer's pure filters (`handformer.generation.sampling`).

The filters are compared deterministically: the distribution a temperature gives (its output read
as logits, or as probabilities when it returns them), and the set of tokens a filter keeps. Only
the sampling step is checked by drawing: 20,000 draws on a vocabulary of 8 at fixed seeds, a
chi-square test at a false-alarm rate of 1e-6 (`handformer.check.core.stats`), and when it rejects, the
same test against the distribution of each named mistake.

Shape legend: B rows, V vocabulary.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core import stats
from handformer.check.core.argument_names import (  # noqa: F401
    EPSILON_NAMES,
    ETA_NAMES,
    GENERATOR_NAMES,
    K_NAMES,
    LOGITS_NAMES,
    MIN_P_NAMES,
    P_NAMES,
    PROBS_NAMES,
    TEMPERATURE_NAMES,
    TOP_A_NAMES,
    TYPICAL_NAMES,
    named,
)
from handformer.check.core.context import (
    Context,
    error_text,
    finish,
    forward_names,
    forward_parameters,
    shape_of,
)
from handformer.check.core.discovery import Component, defaulted_config
from handformer.check.core.localize import Departure
from handformer.check.core.localize_kinds import (
    localize_count,
    localize_filter,
    localize_min_p,
    localize_top_p,
    localize_truncation,
    localize_typical,
    note_departure,
)
from handformer.check.core.nucleus import EQUALITY, TOP_P_FLAGS, top_p_keep
from handformer.check.core.own_calls import handed_first
from handformer.check.core.processors import PROCESSOR_NAMES, NoProcessors
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.signatures import leading_tensor, rows_apart, takes_one_row
from handformer.check.core.sizes import is_number
from handformer.check.core.source import locate, source_lines, source_text
from handformer.generation.sampling import apply_temperature, top_k_filter, top_p_filter

V, DRAWS = 8, 20_000
# a sampler of one row, or of (token id, logit) pairs, is called in Python once a draw: fewer draws
PAIR_DRAWS = 5_000

# a first argument of probabilities (Meta's sample_top_p(probs, p)): given softmax(logits)
SAMPLE_ROW = torch.tensor([2.0, 1.2, 0.8, 0.3, 0.0, -0.4, -1.0, -1.6], dtype=torch.float64)  # (V,)


def test_logits(rows: int = 4, seed: int = 0) -> Tensor:
    """(rows, V) logits without ties, spread like a model's."""
    return fp.randn(rows, V, seed=seed) * 2.0


class Caller:
    """Calls the learner's function with logits first and its options by name (or by position)."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        self.params = forward_parameters(comp.obj)
        self.names = forward_names(comp.obj)
        # llama.cpp's sample_token(logits, params): a settings dataclass whose fields are the options
        self.settings = next((n for n in self.names[1:] if defaulted_config(comp.obj, n)), None)
        fields = dataclasses.fields(defaulted_config(comp.obj, self.settings)) if self.settings else ()
        self.fields = [f.name for f in fields]
        self.probs = bool(self.names) and self.names[0].lower() in PROBS_NAMES  # given softmax(logits)
        # gpt-fast's sample(logits, ...) reads logits[:, -1]: given (B, 1, V), one position per row
        self.positions = _reads(comp.obj, self.names, r":\s*,\s*-1")
        # gpt-fast's sample(logits, ...) of one sequence, logits[0, -1]: each row given as (1, 1, V)
        self.first_row = _reads(comp.obj, self.names, r"0\s*,\s*-1")
        ctx.partial.notes += [FIRST_ROW] * self.first_row
        self.row_shape = ((-1,), (1, 1, -1))[self.first_row]  # a row as it is taken: (V,), or (1, 1, V)
        # the filters it takes with no default (a combined top_k_top_p_filtering(logits, top_k, top_p)),
        # or with a default that filters (top_p_sample(logits, p=0.9)): given their "off" value when a
        # check sets another one
        empty = {p.name for p in self.params if p.default is inspect.Parameter.empty or _filters(p)}
        self.required = {key: name for key, names in OPTIONS.items()
                         for name in [self.find(names)] if name in empty}
        self.fraction = top_k_fraction(comp.obj, self.params)
        self.one_row = called_by_row(comp, ctx)  # llama.cpp's filters of one 1-D vector
        ctx.partial.notes += [ONE_ROW] * self.one_row
        handed = handed_one_row(comp.obj)  # Peter Bloem's sample(output[0, -1, :]): the file hands a row
        ctx.partial.notes += handed_notes(handed) * (not self.one_row)
        self.one_row = self.one_row or bool(handed)
        # a list of logits processors it applies (sample_next_token(logits, processors)): an empty one
        self.processors = [n for n in self.names if n.lower() in PROCESSOR_NAMES]
        self.form: str | None = None  # the form of FORMS it takes, once its first call found it
        self.forms = FORMS[any((self.one_row, self.first_row)):]  # one row first where a batch is not taken

    def find(self, names: tuple[str, ...]) -> str | None:
        return named(self.names[1:] + self.fields, names)

    def _settings_object(self, kwargs: dict[str, Any], vocab: int) -> None:
        """The settings dataclass built from the options that are its fields, every other filter off."""
        off = {"top_k": vocab, **OFF}
        given = {name: off[key] for key, names in OPTIONS.items() for name in self.fields
                 if name.lower() in names}
        given.update({name: kwargs.pop(name) for name in self.fields if name in kwargs})
        kwargs[self.settings] = defaulted_config(self.comp.obj, self.settings)(**given)

    def __call__(self, logits: Tensor, **options: Any) -> Any:
        kwargs = {}
        if "top_k" in options and self.fraction:  # a k handed over as the fraction it stands for
            kwargs[self.fraction.name] = self.fraction.of(options.pop("top_k"), logits.size(-1))
        for key, value in options.items():
            name = self.find({**OPTIONS, "generator": GENERATOR_NAMES}[key])
            if name is not None:
                kwargs[name] = value
            elif key != "generator" and len(self.names) > 1 and not kwargs:
                kwargs[self.names[1]] = value  # their second argument, whatever its name
        off = {"top_k": logits.size(-1), **OFF}
        for key, name in self.required.items():
            kwargs.setdefault(name, off[key])
        kwargs.update({name: NoProcessors() for name in self.processors})
        if self.settings:
            self._settings_object(kwargs, logits.size(-1))
        given = torch.softmax(logits, -1) if self.probs else logits.clone()
        given = given[..., None, :] if self.positions else given  # (B, 1, V)
        if self.form is None:
            return self._first(given, kwargs)
        return self.in_form(self.form, given, kwargs)

    @property
    def draws(self) -> int:
        return {"pairs": PAIR_DRAWS, "row": PAIR_DRAWS}.get(self.form, DRAWS)

    def in_form(self, form: str, given: Tensor, kwargs: dict[str, Any]) -> Any:
        """The function called on `given` in one of FORMS: the batch, one row at a time, or one row at a
        time as (token id, logit) pairs."""
        return {"batch": self.by_batch, "row": self.by_row, "pairs": self.by_pairs}[form](given, kwargs)

    def by_batch(self, given: Tensor, kwargs: dict[str, Any]) -> Any:
        return self.ctx.learner.call("forward", self.comp.obj, given, **kwargs)

    def _first(self, given: Tensor, kwargs: dict[str, Any]) -> Any:
        """The first call, in the first of FORMS the function takes: it runs and returns something
        check reads (not several tensors, not a list of pairs). Where it refuses the batch's form (an
        exception of FORM_ERRORS) or returns what is not read, the others are tried; where it takes
        none, NOT CHECKED (a cannot_call): check guessed the form, the function is not at fault."""
        tried = []
        for form in self.forms:
            try:
                out = self.in_form(form, given, kwargs)
            except fp.LearnerFailure as failure:
                error = failure.error  # refused at the call (an argument missing), or not for its form: as is
                refused = (bool(error.traceback), error.message.startswith(FORM_ERRORS)) == (True, True)
                if form == self.forms[0] and not refused:
                    raise
                tried.append(f"{form}: {error.message}")
                continue
            if _read(out):
                self.form = form
                self.ctx.partial.notes += [PAIRS] * (form == "pairs")
                return out
            tried.append(f"{form}: returned {shape_of(out)}")
        said = {"name": self.comp.name, "tried": "; ".join(tried)}
        raise fp.cannot_call(NO_FORM, NO_FORM_ZH, said)

    def by_pairs(self, given: Tensor, kwargs: dict[str, Any]) -> Any:
        """The function called on each row as a list of (token id, logit) pairs (llama.cpp's candidates):
        a token id it returns as it is, pairs it returns as a row of logits, -inf where a token is gone."""
        def rows() -> Tensor:
            return torch.stack([_from_pairs(self.comp.obj(_pairs(row), **kwargs), row) for row in given])
        return self.ctx.learner.call("forward", rows)

    def by_row(self, given: Tensor, kwargs: dict[str, Any]) -> Any:
        """The function called on each row alone, (V,), its outputs (tensors, or token ids returned as
        ints) stacked. Each row is its own copy: a filter that writes into its row in place
        (`logits[remove] = -inf`) may, where the rows carry a gradient (a localizer's trace)."""
        def rows() -> Tensor:
            return torch.stack([torch.as_tensor(leading_tensor(self.comp.obj(
                row.reshape(self.row_shape).clone(), **kwargs))) for row in given])
        return self.ctx.learner.call("forward", rows)


# the forms a function of logits is tried in, in turn, until one runs and returns what check reads
FORMS = ("batch", "row", "pairs")


def row_by_row(call: Caller, localize: Callable[[slice], Departure | None], rows: int,
               ) -> Callable[[], Departure | None]:
    """A localizer run on the batch's rows `at` (a slice): on the whole batch, or, where the function
    takes one row at a time, on each row alone until one departs (its steps are (V,): no view of the
    batch's (rows, V) is of their shape, and a row that keeps the right tokens shows no departure)."""
    parts = [slice(i, i + 1) for i in range(rows)] if call.form == "row" else [slice(None)]
    return lambda: next((found for found in map(localize, parts) if found is not None), None)
# the exceptions that say an argument was not of the form the code takes
FORM_ERRORS = ("TypeError", "ValueError", "AttributeError", "KeyError", "IndexError")
NO_FORM = ("{name} takes none of the forms check hands a function of logits (a batch (B, V), one row (V,), "
           "a list of (token id, logit) pairs), or returns what check does not read ({tried}): write an "
           "adapter that calls it on logits")
NO_FORM_ZH = ("{name} 不接受 check 给 logits 函数的任何一种形式（一批 (B, V)、一行 (V,)、"
              "(token id, logit) 对的列表），或者返回的东西 check 读不了（{tried}）："
              "请写一个按 logits 调用它的适配函数")
PAIRS = text("it takes one row as a list of (token id, logit) pairs (llama.cpp's candidates): called one "
             "row at a time so, pairs it returns read back as a row of logits (-inf where a token is gone)",
             "它接受一行 (token id, logit) 对的列表（llama.cpp 的 candidates）：逐行这样调用，"
             "返回的对再读回成一行 logits（去掉的 token 为 -inf）")


def _read(out: Any) -> bool:
    """Whether check reads what a function of logits returned: not an empty list, a list of tensors (one a
    row) or of pairs, a tuple of more than two; a list of numbers, a pair (a filter's (filtered,
    indices)), anything else, yes."""
    return READ.get(type(out), _anything)(out)


def _anything(out: Any) -> bool:
    return True


def _numbers(out: Any) -> bool:
    return bool(out) and all(isinstance(v, (int, float)) for v in out)


READ = {list: _numbers, tuple: lambda out: 0 < len(out) < 3}


def _pairs(row: Tensor) -> list[tuple[int, float]]:
    return [(i, float(v)) for i, v in enumerate(row.reshape(-1).tolist())]


def _from_pairs(out: Any, row: Tensor) -> Tensor:
    """What a function of pairs returned, as a tensor: a token id (or one in a tensor) as it is, a list of
    (token id, logit) pairs as the row they leave (-inf elsewhere)."""
    return {list: _from_list}.get(type(out), _as_tensor)(out, row)


def _from_list(out: list[Any], row: Tensor) -> Tensor:
    return (_kept_row, _as_tensor)[_numbers(out)](out, row)  # token ids as they are; pairs, as a row


def _as_tensor(out: Any, row: Tensor) -> Tensor:
    return torch.as_tensor(leading_tensor(out))


def _kept_row(out: list[Any], row: Tensor) -> Tensor:
    """The row of logits a list of (token id, logit) pairs leaves: -inf where a token is gone."""
    kept = torch.full_like(row.reshape(-1), -math.inf)
    logits = torch.tensor([float(logit) for _, logit in out], dtype=kept.dtype)
    kept[[int(token) for token, _ in out]] = logits
    return kept


ONE_ROW = text("it takes one 1-D row of logits (V,) (a batch of rows raises, or mixes its rows where the "
               "file's other filters take one row): called one row at a time",
               "它接受一行一维的 logits (V,)（给一批行会报错；或者各行互相影响，"
               "而文件里其他过滤函数只接受一行）：逐行调用")
FIRST_ROW = text("it samples one sequence's last position of the model's logits (B, T, V), logits[0, -1] "
                 "(gpt-fast's): called on each row as (1, 1, V)",
                 "它只对模型 logits (B, T, V) 的一个序列的最后位置采样，logits[0, -1]（gpt-fast 的写法）："
                 "每行按 (1, 1, V) 调用")


def _reads(fn: Any, names: list[str], index: str) -> bool:
    """Whether the function indexes its first argument so: `logits[<index>]`."""
    first = re.escape(next(iter(names), "logits"))
    return bool(re.search(rf"\b{first}\[\s*{index}\s*\]", source_text(fn)))


def _leading(index: ast.expr) -> ast.expr:
    """The first index of a subscript's slice: `0` of x[0, -1, :], `:` of x[:, -1]."""
    return index.elts[0] if isinstance(index, ast.Tuple) and index.elts else index


def _picks_row(arg: ast.expr) -> bool | None:
    """Whether a call's argument is indexed by an integer first (x[0, -1, :], x[-1]: one row, the
    batch axis gone), True; by a slice first (x[:, -1, :]: the batch kept), False; else None."""
    first = _leading(arg.slice) if isinstance(arg, ast.Subscript) else None
    number = isinstance(first, ast.Constant) or isinstance(first, ast.UnaryOp) and isinstance(
        first.operand, ast.Constant)
    return {True: True}.get(number, False if isinstance(first, ast.Slice) else None)


def handed_one_row(fn: Any) -> tuple[int, str] | None:
    """The line and argument of the file's call that hands the function one row of logits (Peter
    Bloem's `sample(output[0, -1, :], temperature)`), where no call of the file hands it a batch
    (`logits[:, -1, :]`): the form it is written for; None otherwise."""
    args = handed_first(fn)
    picks = [_picks_row(a) for a in args]
    first = next((a for a, row in zip(args, picks) if row), None)
    return None if first is None or False in picks else (first.lineno, ast.unparse(first))


def handed_notes(handed: tuple[int, str] | None) -> list[Text]:
    """The note on a function the file hands one row (none where it does not)."""
    line, arg = handed or (0, "")
    return [text(f"the file hands it one row of logits (V,) (line {line}: {arg}): called one row at a time, "
                 "the form it is written for", f"文件交给它的是一行 logits (V,)（第 {line} 行：{arg}）："
                 "按它写成的形式逐行调用")] * bool(handed)


SAMPLING_KINDS = ("temperature", "top_k", "top_p", "min_p", "sample", "greedy")


def called_by_row(comp: Component, ctx: Context) -> bool:
    """Whether the function is called one row at a time: each row alone runs where a batch raises or
    mixes its rows (rows_apart), and it, or another sampling component of the file, takes one row (a
    batch raises)."""
    filters = {comp.obj, *(ctx.components.get(kind, comp).obj for kind in SAMPLING_KINDS)}
    return rows_apart(comp.obj) and any(map(takes_one_row, filters))


# the filters a sampling function may take, by the names learners give them
OPTIONS = {"top_k": K_NAMES, "top_p": P_NAMES, "temperature": TEMPERATURE_NAMES, "min_p": MIN_P_NAMES,
           "epsilon_cut": EPSILON_NAMES, "eta_cut": ETA_NAMES, "top_a": TOP_A_NAMES, "typical": TYPICAL_NAMES}
# each filter's setting that filters nothing
OFF = {"top_p": 1.0, "temperature": 1.0, "min_p": 0.0, "epsilon_cut": 0.0, "eta_cut": 0.0, "top_a": 0.0,
       "typical": 1.0}


@dataclass(frozen=True)
class Fraction:
    """A top-k written with a fraction of the vocabulary for k: lucidrains' `top_k(logits, thres=0.9)`
    keeps ceil((1 - thres) * V) tokens (the fraction removed); x-transformers' later
    `top_k(logits, frac_num_tokens=0.1)` keeps ceil(frac * V) (the fraction kept)."""

    name: str
    removed: bool

    def of(self, k: int, vocab: int) -> float:
        """The fraction that stands for k tokens of `vocab` (k/V is exact in binary for V = 8)."""
        kept = min(max(k, 0), vocab) / vocab
        return 1.0 - kept if self.removed else kept

    def note(self) -> Text:
        if self.removed:
            return text(f"its `{self.name}` is read as the fraction of the vocabulary removed (it keeps "
                        f"ceil((1 - {self.name}) * V) tokens, lucidrains' convention): k tokens are asked "
                        f"for as {self.name} = 1 - k/V",
                        f"`{self.name}` 按去掉的词表比例来读（保留 ceil((1 - {self.name}) * V) 个 token，"
                        f"lucidrains 的写法）：要保留 k 个 token 时传入 {self.name} = 1 - k/V")
        return text(f"its `{self.name}` is read as the fraction of the vocabulary kept "
                    f"(ceil({self.name} * V) tokens): k tokens are asked for as {self.name} = k/V",
                    f"`{self.name}` 按保留的词表比例来读（保留 ceil({self.name} * V) 个 token）：要保留 k 个 "
                    f"token 时传入 {self.name} = k/V")


def top_k_fraction(fn: Any, params: list[inspect.Parameter]) -> Fraction | None:
    """The parameter a top-k takes for k when it is a fraction: the first after the logits that is no
    other filter's, its default a float strictly between 0 and 1 (a count is an int). Its default says
    which fraction: 0.5 or more the fraction removed (0.9: keep the top tenth), below it the fraction
    kept (0.1), a top-k keeping most of the vocabulary by default being no filter."""
    given = next((p for p in params[1:] if p.name.lower() not in OTHER_FILTERS), None)
    default = getattr(given, "default", None)
    if type(default) is not float or not 0 < default < 1:
        return None
    return Fraction(given.name, default >= 0.5)


OTHER_FILTERS = P_NAMES + TEMPERATURE_NAMES + MIN_P_NAMES + GENERATOR_NAMES


def _filters(p: inspect.Parameter) -> bool:
    """A top-p default below 1 or a top-k default below the vocabulary: the default filters."""
    value = p.default
    if not is_number(value):
        return False
    name = p.name.lower()
    return (name in P_NAMES and 0 < value < 1 or name in K_NAMES and isinstance(value, int) and 0 < value < V
            or name in MIN_P_NAMES and 0 < value)


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "temperature", "top_k", "top_p", "min_p",
                                                         "sample")))
    return Finding(name, observed, number, code, form)


def is_probabilities(out: Tensor) -> bool:
    """No negative entry: probabilities (normalised or not), not logits (the test logits have
    negative entries, and a temperature or a filter keeps them)."""
    return bool((out.double() >= 0).all())


def as_distribution(out: Any, like: Tensor) -> Tensor | None:
    """The distribution an output stands for: itself when it is probabilities, else its softmax
    (logits); None when it is not a float tensor of the input's shape."""
    if not isinstance(out, Tensor) or out.shape != like.shape or not out.is_floating_point():
        return None
    if is_probabilities(out):
        return out.double() / out.double().sum(-1, keepdim=True)
    return torch.softmax(out.double(), dim=-1)


# --- temperature --------------------------------------------------------------------------------

def check_temperature(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    call = Caller(comp, ctx)
    logits = test_logits()
    worst, named = 0.0, None
    for t in (0.5, 2.0):
        out = call(logits, temperature=t)
        dist = as_distribution(out, logits)
        if dist is None:
            raise ctx.learner.fail("forward", f"{comp.name}(logits, {t}) returned {shape_of(out)} for logits "
                                   f"of shape {tuple(logits.shape)}; expected logits (or probabilities) of "
                                   "that shape",
                                   f"logits 的形状为 {tuple(logits.shape)} 时，{comp.name}(logits, {t}) "
                                   f"返回了 {shape_of(out)}；应当返回同样形状的 logits（或概率）")
        right = torch.softmax(apply_temperature(logits, t), -1)
        err = fp.max_error(dist, right)
        worst = max(worst, err)
        if err >= fp.TOL and named is None:
            for name, q, en, zh in (
                    ("temperature_multiplied", torch.softmax(logits * t, -1), "softmax(logits * t)",
                     "softmax(logits * t)"),
                    ("temperature_after_softmax", torch.softmax(logits, -1), "softmax(logits), as if t = 1",
                     "softmax(logits)，相当于 t = 1")):
                if fp.max_error(dist, q) < fp.TOL:
                    named = name
                    off = fp.max_error(dist, q)
                    res.findings.append(_finding(ctx, comp, name, text(
                        f"with temperature {t:g} your distribution equals {en} (to {off:.1e}); "
                        f"softmax(logits / t) differs by {err:.3g}",
                        f"温度为 {t:g} 时，你的分布等于 {zh}（误差 {off:.1e}）；"
                        f"与 softmax(logits / t) 相差 {err:.3g}")))
                    break
        if t == 0.5 and is_probabilities(out):
            res.notes.append(text("it returns probabilities, not logits: compared as a distribution",
                                  "它返回的是概率而不是 logits：按分布比较"))
    res.max_abs_error = worst
    res.checks.append(Check(text("the distribution equals softmax(logits / t) for t = 0.5 and 2",
                                 "t = 0.5 和 2 时分布等于 softmax(logits / t)"), worst < fp.TOL,
                            error_text(worst)))
    return finish(res)


# --- top-k and top-p ------------------------------------------------------------------------------

def _filtered(ctx: Context, comp: Component, call: Caller, logits: Tensor,
              **setting: float) -> tuple[Any, tuple[Tensor, float | None]]:
    """call(logits, top_k=k) or (logits, top_p=p): its output and the tokens it kept (kept_tokens);
    the learner's failure when the output is not filtered logits of the input's shape."""
    out = call(logits, **setting)
    read = kept_tokens(out, logits)
    if read is None:
        (value,) = setting.values()
        raise ctx.learner.fail("forward", f"{comp.name}(logits, {value}) returned {shape_of(out)}; expected "
                               f"filtered logits of shape {tuple(logits.shape)}",
                               f"{comp.name}(logits, {value}) 返回了 {shape_of(out)}；应当返回形状为 "
                               f"{tuple(logits.shape)} 的过滤后的 logits")
    return out, read


def kept_tokens(out: Any, logits: Tensor) -> tuple[Tensor, float | None] | None:
    """The tokens a filter kept (bool, like logits) and the value it filled the others with (None
    for -inf, or when it returns probabilities); None if the output is not filtered logits."""
    if not isinstance(out, Tensor) or out.shape != logits.shape or not out.is_floating_point():
        return None
    out = out.double()
    if is_probabilities(out):
        return out > 0, None  # renormalized probabilities
    kept = (out - logits).abs() < 1e-9
    removed = out[~kept]
    finite = removed[torch.isfinite(removed)]
    return kept, (float(finite[0]) if finite.numel() else None)


def _fill_finding(res: ComponentResult, ctx: Context, comp: Component, out: Tensor, kept: Tensor,
                  fill: float | None) -> None:
    """filter_fill_finite when the removed tokens keep probability (minGPT's 1e-10 for -1e10)."""
    if fill is None or res.has("filter_fill_finite"):
        return
    mass = float(torch.softmax(out.double(), -1)[~kept].sum(-1).max()) if (~kept).any() else 0.0
    if mass > 1e-9:
        res.findings.append(_finding(ctx, comp, "filter_fill_finite", text(
            f"the removed tokens are filled with {fill:g}: after the softmax they still hold up to "
            f"{mass:.3g} of the probability",
            f"被去掉的 token 填成了 {fill:g}：softmax 之后它们仍占最多 {mass:.3g} 的概率"), f"{fill:g}"))


@dataclass(frozen=True)
class Filter:
    """A filter that keeps some tokens, stated as data (top-p, min-p): the option it is called with and
    the cases (logits, value) it is driven on; which tokens the reference keeps under a set of mistakes
    (`keep`) and the mistakes the search may combine (`universe`), of which `conventions` are no
    finding (`notes` says what it noted of them); what a finding says it saw (`observed`: the flag, the
    tokens kept in each case), the check's words, and the steps after the check (a departure localized,
    more checks), each given (res, ctx, comp, call, the number of tokens kept or dropped wrongly)."""

    option: str
    cases: Callable[[], list[tuple[Tensor, float]]]
    keep: Callable[[Tensor, float, frozenset[str]], Tensor]
    universe: tuple[str, ...]
    conventions: frozenset[str]
    observed: Callable[[str, list[Tensor]], Text]
    notes: Callable[[frozenset[str], list[Tensor]], list[Text]]
    check: Text
    steps: tuple[Callable[[ComponentResult, Context, Component, Caller, list[Tensor], int], None], ...]


def check_filter(kind: Filter, comp: Component, ctx: Context) -> ComponentResult:
    """One engine for the filters `Filter` states: each case called (a finding where it fills with a
    finite value), the fewest mistakes that reproduce the tokens it kept searched for and named, the
    tokens kept wrongly counted against the reference under the conventions found, then its steps."""
    res, call, cases = ctx.result(comp), Caller(comp, ctx), kind.cases()
    kept = _kept_per_case(res, ctx, comp, call, cases, kind.option)

    def compute(flags: frozenset[str]) -> Tensor:
        return torch.cat([kind.keep(logits, value, flags) for logits, value in cases], 0).double()

    mine = torch.cat(kept, 0).double()
    found = (fp.search(mine, compute, kind.universe, None, 2) or (frozenset(),))[0]
    for flag in sorted(found - kind.conventions):
        name, _, form = flag.partition(":")
        res.findings.append(_finding(ctx, comp, name, kind.observed(flag, kept), form))
    res.notes += kind.notes(found & kind.conventions, kept)
    wrong = int((mine != compute(found & kind.conventions)).sum())
    res.checks.append(Check(kind.check, wrong == 0, _wrong_tokens(wrong)))
    res.max_abs_error = float(wrong)
    for step in kind.steps:
        step(res, ctx, comp, call, kept, wrong)
    return finish(res)


def _kept_per_case(res: ComponentResult, ctx: Context, comp: Component, call: Caller,
                   cases: list[tuple[Tensor, float]], option: str) -> list[Tensor]:
    """The tokens the filter keeps in each case (a finding when it fills with a finite value)."""
    kept_all = []
    for logits, p in cases:
        out, read = _filtered(ctx, comp, call, logits, **{option: p})
        _fill_finding(res, ctx, comp, out, *read)
        kept_all.append(read[0])
    return kept_all


# top-k's k as the reference reads it, and off by one either way (top_k_off_by_one's forms): k = 0 keeps none
K_SHIFT = {"": 0, "top_k_off_by_one:k+1": 1, "top_k_off_by_one:k-1": -1}


def top_k_keep(logits: Tensor, k: int, flags: frozenset[str] = frozenset()) -> Tensor:
    """The tokens top-k keeps (bool, like logits): the k most likely, or k + 1, or k - 1 (the flag's)."""
    n = k + K_SHIFT[min(flags & K_SHIFT.keys(), key=list(K_SHIFT).index, default="")]
    return torch.isfinite(top_k_filter(logits, max(n, 1))) & (n > 0)


def _top_k_observed(flag: str, kept: list[Tensor]) -> Text:
    """What an off-by-one top-k keeps with k = 1 (the first case): 2 tokens, or none."""
    n = int(kept[0][0].sum())
    if flag.endswith("k-1"):
        return text("with k = 1 it keeps no token at all", "k = 1 时一个 token 都没有保留")
    return text(f"with k = 1 it keeps {n} tokens, the 2 most likely",
                f"k = 1 时保留了 {n} 个 token，即最可能的 2 个")


def _top_k_after(res: ComponentResult, ctx: Context, comp: Component, call: Caller, kept: list[Tensor],
                 wrong: int) -> None:
    """The k asked for as a fraction, noted; where the count kept departs, the line that binds it; then
    k >= V, ties at the k-th value and a filter given probabilities."""
    logits = test_logits()
    res.notes += [call.fraction.note()] if call.fraction else []
    counts = [(k, int(t[0].sum())) for k, t in zip(TOP_KS, kept)]
    note_departure(res, lambda: localize_count(lambda k: call(logits, top_k=k), comp.obj, counts))
    _large_k(res, ctx, comp, call, logits)
    _ties(res, call, logits)
    _kept_probabilities(res, call, logits)


TOP_KS = (1, 3, 5, 7)
TOP_K = Filter(
    option="top_k",
    cases=lambda: [(test_logits(), k) for k in TOP_KS],
    keep=top_k_keep,
    universe=tuple(K_SHIFT)[1:],
    conventions=frozenset(),
    observed=_top_k_observed,
    notes=lambda conventions, kept: [],
    check=text("keeps the k most likely tokens for k = 1, 3, 5, 7 (ties apart)",
               "k = 1、3、5、7 时保留最可能的 k 个 token（不含并列的情况）"),
    steps=(_top_k_after,),
)


def check_top_k(comp: Component, ctx: Context) -> ComponentResult:
    """The top-k filter, as the TOP_K filter states it."""
    return check_filter(TOP_K, comp, ctx)


def _kept_probabilities(res: ComponentResult, call: Caller, logits: Tensor) -> None:
    """A filter given probabilities keeps each kept token's probability as given, or renormalized
    over its own row (the vocabulary); a sum over another axis (the batch) is neither."""
    out = call(logits, top_k=3)
    if not call.probs or not is_probabilities(out):
        return
    given = torch.where(out > 0, torch.softmax(logits, -1), 0.0)  # (rows, V)
    renormalized = given / given.sum(-1, keepdim=True)  # (rows, V)
    ok = any(torch.allclose(out.double(), g, atol=1e-9) for g in (given, renormalized))
    sums = ", ".join(f"{float(t):.3g}" for t in out.double().sum(-1))
    res.checks.append(Check(text("the kept tokens keep their probabilities, as given or renormalized over "
                                 "each row (k = 3)", "保留的 token 概率不变，或在各自的行内重新归一化"
                                 "（k = 3）"),
                            ok, text(f"the rows sum to {sums}", f"各行之和为 {sums}")))
    if not ok:
        keep = torch.isfinite(top_k_filter(logits, 3))
        note_departure(res, row_by_row(call, lambda at: localize_filter(
            lambda x: call(x, top_k=3), call.comp.obj, logits[at], keep[at]), len(logits)))


def _large_k(res: ComponentResult, ctx: Context, comp: Component, call: Caller, logits: Tensor) -> None:
    """k = V and k > V keep every token (top-k of a vocabulary of 8 with k = 50 is no filter)."""
    ok = True
    for k in (V, V + 42):
        try:
            read = kept_tokens(call(logits, top_k=k), logits)
        except fp.LearnerFailure as failure:
            ok = False
            if not res.has("top_k_exceeds_vocab"):
                res.findings.append(_finding(ctx, comp, "top_k_exceeds_vocab", text(
                    f"with k = {k} > V = {V} your code raised {failure.error.message}",
                    f"k = {k} > V = {V} 时你的代码报错：{failure.error.message}")))
            continue
        ok = ok and read is not None and bool(read[0].all())
    res.checks.append(Check(text(f"k >= V (k = {V}, {V + 42}) keeps every token",
                                 f"k >= V（k = {V}、{V + 42}）时保留全部 token"), ok))


def _ties(res: ComponentResult, call: Caller, logits: Tensor) -> None:
    """Tokens tied at the k-th value: handformer keeps them all (as Hugging Face and nanoGPT do);
    keeping exactly k is another convention, noted."""
    tied = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0, -1.0, -2.0, -3.0]], dtype=torch.float64)
    try:
        read = kept_tokens(call(tied, top_k=2), tied)
    except fp.LearnerFailure:
        return
    if read is not None and int(read[0].sum()) == 2:
        res.notes.append(text("with tokens tied at the k-th value it keeps exactly k (which tied token "
                              "survives is arbitrary); handformer keeps every tied token, as Hugging Face "
                              "and nanoGPT do", "第 k 大的值有并列时它只保留 k 个（保留哪一个是任意的）；"
                              "handformer 保留所有并列的 token，与 Hugging Face 和 nanoGPT 相同"))


# rows of dyadic probabilities: their cumulative sums are exact in float64 (the equality case)
DYADIC = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.0078125],
                      dtype=torch.float64)


def _top_p_departure(res: ComponentResult, ctx: Context, comp: Component, call: Caller, kept: list[Tensor],
                     wrong: int) -> None:
    """Where a top-p that keeps wrong tokens, no mistake named, first parts from top-p's sub-steps."""
    if wrong and not res.findings:
        logits = test_logits(seed=1)
        note_departure(res, row_by_row(call, lambda at: localize_top_p(
            lambda x: call(x, top_p=0.5), comp.obj, logits[at], 0.5), len(logits)))


def _combined_top_k(res: ComponentResult, ctx: Context, comp: Component, call: Caller, kept: list[Tensor],
                    wrong: int) -> None:
    """A combined filter (top_k_top_p_filtering): its top-k too, top_p off."""
    if call.find(K_NAMES):
        _add_top_k(res, ctx, comp)


TOP_P = Filter(
    option="top_p",
    cases=lambda: [(DYADIC.log()[None], 0.75), (DYADIC.log()[None], 0.6), (DYADIC.log()[None], 0.3),
                   (test_logits(), 0.9), (test_logits(seed=1), 0.5)],  # dyadic rows: (1, V)
    keep=top_p_keep,
    universe=TOP_P_FLAGS,
    conventions=frozenset({EQUALITY}),  # the rule at exact equality: either is a convention (docstring)
    observed=lambda flag, kept: _top_p_observed(flag, kept),
    notes=lambda conventions, kept: [_equality_note(kept)] * bool(conventions),
    check=text("keeps the smallest set of most likely tokens reaching p (5 cases, equality at p = 0.75 "
               "included)", "把 token 按概率从大到小排列，保留累计概率刚好达到 p 的前几个"
               "（5 种情况，含 p = 0.75 时恰好相等）"),
    steps=(lambda res, ctx, comp, call, kept, wrong: _p_one(res, ctx, comp, call), _top_p_departure,
           _combined_top_k),
)


def check_top_p(comp: Component, ctx: Context) -> ComponentResult:
    """The top-p filter, as the TOP_P filter states it."""
    return check_filter(TOP_P, comp, ctx)


def _add_top_k(res: ComponentResult, ctx: Context, comp: Component) -> None:
    """A combined filter's top-k, checked with top_p = 1, merged into the top-p result."""
    both = check_top_k(comp, ctx)
    res.checks += both.checks
    res.findings += [f for f in both.findings if f.name not in {g.name for g in res.findings}]
    res.notes += both.notes
    res.notes.append(text("a combined filter: top-p checked with top_k off, top-k with top_p = 1",
                          "组合过滤：检查 top-p 时关掉 top_k，检查 top-k 时 top_p = 1"))
    res.max_abs_error = max(res.max_abs_error, both.max_abs_error or 0.0)


def _top_p_observed(flag: str, kept: list[Tensor]) -> Text:
    counts = [int(k[0].sum()) for k in kept[:3]]
    probs = "probabilities 0.5, 0.25, 0.125, ..."
    probs_zh = "概率为 0.5、0.25、0.125……"
    if flag.startswith("top_p_drops_crossing"):
        return text(f"{probs} with p = 0.6: your filter keeps {counts[1]} token(s); 0.5 alone does not reach "
                    "0.6, so 2 are kept",
                    f"{probs_zh}、p = 0.6 时你的过滤保留了 {counts[1]} 个 token；"
                    "只有 0.5 还不到 0.6，应保留 2 个")
    return text(f"{probs} with p = 0.3: your filter keeps {counts[2]} tokens, every logit is -inf (the "
                "softmax of that row is NaN)",
                f"{probs_zh}、p = 0.3 时你的过滤保留了 {counts[2]} 个 token，"
                "所有 logit 都是 -inf（softmax 为 NaN）")


def _equality_note(kept: list[Tensor]) -> Text:
    """Where the probability ranked above a token equals p exactly, keeping that token too (remove
    where cum > p, shifted right: Hugging Face's classic top_k_top_p_filtering, Meta's sample_top_p)
    is a convention, not a mistake: handformer removes it (>= p)."""
    n = int(kept[0][0].sum())
    return text(f"where the probability ranked above a token equals p exactly (0.5 + 0.25 = 0.75 with "
                f"p = 0.75) your filter keeps that token too ({n} tokens kept): the rule of Hugging Face's "
                "classic top_k_top_p_filtering (cum > p, shifted right), a convention; handformer stops "
                "at p (>= p, 2 kept)",
                f"排在某个 token 前面的概率之和恰好等于 p 时（p = 0.75，0.5 + 0.25 = 0.75），你的过滤也保留了"
                f"这个 token（保留 {n} 个）：这是 Hugging Face 经典的 top_k_top_p_filtering 的规则"
                "（cum > p 再右移一位），属于约定，不算错；handformer 到 p 就停（>= p，保留 2 个）")


def _wrong_tokens(n: int) -> Text:
    return text(f"{n} tokens kept or dropped wrongly", f"{n} 个 token 保留或去掉错了")


# a filter that follows "mass above >= p" in float arithmetic may, at p = 1, drop only tokens whose
# mass is within the cumulative sum's rounding (V x float32's unit roundoff): no probability that matters
ROUNDING = V * 2.0 ** -24


def _p_one(res: ComponentResult, ctx: Context, comp: Component, call: Caller) -> None:
    """p = 1 keeps every token that holds probability: a row with a token of probability 1e-26 (its
    mass above rounds to 1.0: dropping it is rounding, allowed) and a row of dyadic probabilities
    whose least likely token holds 2^-7 (dropping it is a real loss)."""
    tiny = torch.cat([test_logits(1, seed=2)[:, :-1], torch.full((1, 1), -60.0, dtype=torch.float64)], -1)
    logits = torch.cat([tiny, DYADIC.log()[None]], 0)  # (2, V)
    try:
        read = kept_tokens(call(logits, top_p=1.0), logits)
        if read is None:
            ok, detail = False, text("no filtered logits", "没有返回过滤后的 logits")
        else:
            lost = float(torch.softmax(logits, -1).masked_fill(read[0], 0.0).sum(-1).max())
            ok = lost <= ROUNDING
            detail = text(f"{V * 2 - int(read[0].sum())} token(s) removed, up to {lost:.2g} of a row's "
                          f"probability (rounding allows {ROUNDING:.1g})",
                          f"去掉了 {V * 2 - int(read[0].sum())} 个 token，一行最多 {lost:.2g} 的概率"
                          f"（舍入误差允许 {ROUNDING:.1g}）")
    except fp.LearnerFailure as failure:
        ok, detail = False, text(f"raised {failure.error.message}", f"报错：{failure.error.message}")
    res.checks.append(Check(text("p = 1 keeps every token that holds probability",
                                 "p = 1 时保留所有有概率的 token"), ok, detail))


# --- min-p ------------------------------------------------------------------------------------------

def min_p_keep(logits: Tensor, min_p: float, flags: frozenset[str] = frozenset()) -> Tensor:
    """The tokens min-p keeps (bool, like logits): probability >= min_p x the most likely token's
    (Hugging Face's MinPLogitsWarper); min_p_not_scaled: >= min_p x the row's sum (= min_p); top_kept:
    the most likely token kept whatever the rule (Hugging Face's min_tokens_to_keep = 1)."""
    probs = torch.softmax(logits.double(), -1)
    scale = probs.sum(-1, keepdim=True) if "min_p_not_scaled" in flags else probs.amax(-1, keepdim=True)
    top = probs == probs.amax(-1, keepdim=True)
    return (probs >= min_p * scale) | (top & ("top_kept" in flags))


UNSCALED = frozenset({"min_p_not_scaled"})  # the threshold min_p itself (a sampling step's draws fit it)


def _min_p_observed(flag: str, kept: list[Tensor]) -> Text:
    counts = ", ".join(str(int(n)) for n in kept[1].sum(-1))  # the rows of min_p = 0.2
    return text(f"with min_p = 0.2 your filter keeps {counts} tokens of 4 rows: those above 0.2 itself, "
                "not above 0.2 x the most likely token's probability",
                f"min_p = 0.2 时你的过滤在 4 行中分别保留了 {counts} 个 token：保留的是概率高于 0.2 本身的，"
                "而不是高于 0.2 × 最可能 token 的概率的")


def _min_p_departure(res: ComponentResult, ctx: Context, comp: Component, call: Caller, kept: list[Tensor],
                     wrong: int) -> None:
    """Where a min-p that keeps wrong tokens, its threshold not named unscaled, first parts from
    min-p's sub-steps (on the case min_p = 0.2)."""
    if wrong and not res.has("min_p_not_scaled"):
        logits = test_logits()
        note_departure(res, row_by_row(call, lambda at: localize_min_p(
            lambda x: call(x, min_p=0.2), comp.obj, logits[at], 0.2), len(logits)))


MIN_P = Filter(
    option="min_p",
    cases=lambda: [(test_logits(), 0.05), (test_logits(), 0.2), (test_logits(seed=1), 0.5)],
    keep=min_p_keep,
    universe=("min_p_not_scaled", "top_kept"),  # the mistake, with and without a guard of the top token
    conventions=frozenset({"top_kept"}),  # the guard (Hugging Face's min_tokens_to_keep = 1): not noted
    observed=_min_p_observed,
    notes=lambda conventions, kept: [],
    check=text("keeps the tokens whose probability is at least min_p x the most likely token's (min_p = "
               "0.05, 0.2, 0.5)",
               "保留概率不低于 min_p × 最可能 token 概率的 token（min_p = 0.05、0.2、0.5）"),
    steps=(_min_p_departure,),
)


def check_min_p(comp: Component, ctx: Context) -> ComponentResult:
    """The min-p filter, as the MIN_P filter states it."""
    return check_filter(MIN_P, comp, ctx)


# --- the truncation samplers: epsilon, eta (Hewitt et al. 2022, Hugging Face's warpers), top-a ----------

def _entropy(probs: Tensor) -> Tensor:
    """The entropy of each row, in nats (B, 1)."""
    return -(probs * probs.clamp_min(1e-300).log()).sum(-1, keepdim=True)


# the threshold each keeps a token's probability above, of the row's probabilities and its setting
THRESHOLDS = {
    "epsilon_cut": lambda probs, eps: torch.full_like(probs[..., :1], eps),
    "eta_cut": lambda probs, eps: torch.minimum(torch.tensor(eps).double(),
                                                math.sqrt(eps) * torch.exp(-_entropy(probs))),
    "top_a": lambda probs, a: a * probs.amax(-1, keepdim=True) ** 2,
}


def truncation_keep(kind: str) -> Callable[[Tensor, float, frozenset[str]], Tensor]:
    """The tokens the truncation sampler `kind` keeps (bool, like logits): probability >= its threshold;
    top_kept: the most likely token kept whatever the rule (Hugging Face's min_tokens_to_keep = 1)."""
    def keep(logits: Tensor, value: float, flags: frozenset[str] = frozenset()) -> Tensor:
        probs = torch.softmax(logits.double(), -1)
        top = probs == probs.amax(-1, keepdim=True)
        return (probs >= THRESHOLDS[kind](probs, value)) | (top & ("top_kept" in flags))
    return keep


def _truncation(kind: str, option: str, values: tuple[float, float, float], rule: Text) -> Filter:
    """The filter of a truncation sampler, on the test logits at three settings."""
    return Filter(
        option=kind, cases=lambda: [(test_logits(), values[0]), (test_logits(), values[1]),
                                    (test_logits(seed=1), values[2])],
        keep=truncation_keep(kind), universe=("top_kept",), conventions=frozenset({"top_kept"}),
        observed=lambda flag, kept: text("", ""), notes=lambda conventions, kept: [],
        check=text(f"keeps the tokens whose probability is at least {rule['en']} ({option} = "
                   f"{', '.join(map(str, values))})",
                   f"保留概率不低于 {rule['zh']} 的 token（{option} = {'、'.join(map(str, values))}）"),
        steps=(_truncation_departure,))


def _truncation_departure(res: ComponentResult, ctx: Context, comp: Component, call: Caller,
                          kept: list[Tensor], wrong: int) -> None:
    """Where a truncation filter that keeps wrong tokens first parts from its sub-steps (on the
    second case)."""
    if not wrong:
        return
    kind = comp.kind
    logits, value = TRUNCATIONS[kind].cases()[1]
    threshold = THRESHOLDS[kind](torch.softmax(logits.double(), -1), value)
    note_departure(res, lambda: localize_truncation(lambda x: call(x, **{kind: value}), comp.obj, logits,
                                                    threshold, {OPTION_WORDS[kind]: value}))


OPTION_WORDS = {"epsilon_cut": "epsilon", "eta_cut": "epsilon", "top_a": "top_a"}
TRUNCATIONS = {
    "epsilon_cut": _truncation("epsilon_cut", "epsilon", (0.02, 0.1, 0.3), text("epsilon", "epsilon")),
    "eta_cut": _truncation("eta_cut", "epsilon", (0.02, 0.1, 0.3), text(
        "eta = min(epsilon, sqrt(epsilon) x exp(-entropy))", "eta = min(epsilon, sqrt(epsilon) × exp(-熵))")),
    "top_a": _truncation("top_a", "top_a", (0.2, 0.5, 1.0), text(
        "top_a x the most likely token's probability squared", "top_a × 最可能 token 概率的平方")),
}


def check_epsilon_cut(comp: Component, ctx: Context) -> ComponentResult:
    """Epsilon sampling: the tokens of probability at least epsilon."""
    return check_filter(TRUNCATIONS["epsilon_cut"], comp, ctx)


def check_eta_cut(comp: Component, ctx: Context) -> ComponentResult:
    """Eta sampling: the tokens of probability at least min(epsilon, sqrt(epsilon) exp(-entropy))."""
    return check_filter(TRUNCATIONS["eta_cut"], comp, ctx)


def check_top_a(comp: Component, ctx: Context) -> ComponentResult:
    """Top-a: the tokens of probability at least top_a x the largest probability squared."""
    return check_filter(TRUNCATIONS["top_a"], comp, ctx)


# --- locally typical sampling (Meister et al., 2022; Hugging Face's TypicalLogitsWarper) ---------------

def typical_keep(logits: Tensor, mass: float, flags: frozenset[str] = frozenset()) -> Tensor:
    """The tokens typical sampling keeps (bool, like logits): ranked by how far their surprisal is from
    the row's entropy, nearest first, the fewest whose probability reaches `mass`, ties with the last
    one kept (Hugging Face's `sorted_scores > sorted_scores[last_ind]` removed). The first token always
    stays, so "top_kept" (min_tokens_to_keep = 1) changes nothing."""
    distance = typical_distance(logits)  # (rows, V)
    ranked, order = distance.sort(-1)
    mass_so_far = torch.softmax(logits.double(), -1).gather(-1, order).cumsum(-1)
    last = (mass_so_far < mass).sum(-1, keepdim=True).clamp(max=logits.size(-1) - 1)  # (rows, 1)
    return distance <= ranked.gather(-1, last)


def typical_distance(logits: Tensor) -> Tensor:
    """|-log p - H| of each token: its surprisal's distance from the row's entropy H (nats)."""
    logp = torch.log_softmax(logits.double(), -1)
    return (-logp - _entropy(logp.exp())).abs()


def _typical_departure(res: ComponentResult, ctx: Context, comp: Component, call: Caller, kept: list[Tensor],
                       wrong: int) -> None:
    """Where a typical filter that keeps wrong tokens first parts from its sub-steps (on the second
    case)."""
    if wrong:
        logits, mass = TYPICAL.cases()[1]
        note_departure(res, lambda: localize_typical(lambda x: call(x, typical=mass), comp.obj, logits, mass))


TYPICAL = Filter(
    option="typical",
    cases=lambda: [(test_logits(), 0.5), (test_logits(), 0.9), (test_logits(seed=1), 0.2)],
    keep=typical_keep, universe=("top_kept",), conventions=frozenset({"top_kept"}),
    observed=lambda flag, kept: text("", ""), notes=lambda conventions, kept: [],
    check=text("keeps the tokens whose surprisal is nearest the entropy until their probability reaches "
               "the mass (mass = 0.5, 0.9, 0.2)",
               "按惊异度与熵的距离从近到远保留 token，直到概率和达到 mass（mass = 0.5、0.9、0.2）"),
    steps=(_typical_departure,))


def check_typical(comp: Component, ctx: Context) -> ComponentResult:
    """Locally typical sampling, as the TYPICAL filter states it."""
    return check_filter(TYPICAL, comp, ctx)


# --- greedy ---------------------------------------------------------------------------------------

def as_tokens(out: Any, rows: int) -> Tensor | None:
    """Token ids as a (rows,) long tensor from a tensor (rows,), (rows, 1), a list, or an int; of a
    tuple, its first (gpt-fast's sample returns (idx_next, probs))."""
    out = leading_tensor(out)
    if isinstance(out, int) and rows == 1:
        return torch.tensor([out])
    if fp.token_list(out):
        out = torch.tensor(out)
    if isinstance(out, Tensor) and not out.is_floating_point() and out.numel() == rows:
        return out.reshape(rows).long()
    return None


def check_greedy(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    first = next(iter(forward_parameters(comp.obj)), None)
    if first is not None and first.name in ("model", "net", "m", "lm"):
        from handformer.check.runners.generate_own import check_generate

        return check_generate(comp, ctx)
    logits = test_logits(5)
    out = ctx.learner.call("forward", comp.obj, logits.clone())
    tokens = as_tokens(out, logits.size(0))
    if tokens is None and isinstance(out, Tensor) and torch.equal(out.reshape(-1).long(), logits.argmax(0)):
        given, got = tuple(logits.shape), tuple(out.shape)
        res.findings.append(_finding(ctx, comp, "argmax_wrong_dim", text(
            f"for logits of shape {given} it returned {got}: the argmax over the rows (dim 0), one per "
            "vocabulary entry", f"logits 形状为 {given} 时它返回了 {got}：沿行（dim 0）取的 argmax，"
            "每个词表位置一个")))
        res.checks.append(Check(text("picks the most likely token of each row", "每一行选最可能的 token"),
                                False))
        return finish(res)
    if tokens is None:
        raise ctx.learner.fail("forward", f"{comp.name}(logits) returned {shape_of(out)} for logits of shape "
                               f"{tuple(logits.shape)}; expected one token id per row",
                               f"logits 的形状为 {tuple(logits.shape)} 时，{comp.name}(logits) 返回了 "
                               f"{shape_of(out)}；应当每行返回一个 token id")
    wrong = int((tokens != logits.argmax(-1)).sum())
    res.max_abs_error = float(wrong)
    res.checks.append(Check(text(f"picks the most likely token of each of {logits.size(0)} rows",
                                 f"{logits.size(0)} 行中每一行都选了最可能的 token"), wrong == 0,
                            text(f"{wrong} rows differ", f"{wrong} 行不同")))
    return finish(res)


# --- the sampling step ------------------------------------------------------------------------------

def _draw(ctx: Context, call: Caller, options: dict[str, Any], seed: int) -> Tensor:
    """call.draws token ids sampled from SAMPLE_ROW with these options: one call on that many identical
    rows, or (when it takes one row at a time) that many calls; seeded torch's RNG (and a generator if
    asked). The form it takes is found first, on two rows (a pairs form draws fewer: PAIR_DRAWS)."""
    call(SAMPLE_ROW.expand(2, V).contiguous(), **_seeded(call, options, seed))  # its form, found on two rows
    torch.manual_seed(seed)
    options = _seeded(call, options, seed)
    batch = SAMPLE_ROW.expand(call.draws, V).contiguous()
    raw = call(batch, **options)
    tokens = as_tokens(raw, call.draws)
    if tokens is not None:
        return tokens
    _filtered_logits(call, raw, batch)
    if as_tokens(raw, 1) is None:  # not a step written for one row at a time either
        raise ctx.learner.fail("forward", f"{call.comp.name} returned {shape_of(raw)} for logits of shape "
                               f"{tuple(batch.shape)}; expected one token id per row",
                               f"logits 的形状为 {tuple(batch.shape)} 时，{call.comp.name} 返回了 "
                               f"{shape_of(raw)}；应当每行返回一个 token id")
    one = SAMPLE_ROW[None]
    draws = [as_tokens(call(one, **options), 1) for _ in range(call.draws)]
    if any(d is None for d in draws):
        raise ctx.learner.fail("forward", f"{call.comp.name} returned no token id for logits of shape "
                               f"(1, {V})",
                               f"logits 的形状为 (1, {V}) 时，{call.comp.name} 没有返回 token id")
    return torch.cat(draws)


def _seeded(call: Caller, options: dict[str, Any], seed: int) -> dict[str, Any]:
    """The options, with a generator at `seed` where the function takes one."""
    seeded = [("generator", torch.Generator().manual_seed(seed))] * bool(call.find(GENERATOR_NAMES))
    return {**options, **dict(seeded)}


def _filtered_logits(call: Caller, raw: Any, batch: Tensor) -> None:
    """NOT CHECKED (a cannot_call) where a function read as a sampling step returns logits of the shape
    it was handed, not token ids: a filter (its name said sample), whose output is no draw."""
    out = leading_tensor(raw)
    if isinstance(out, Tensor) and out.is_floating_point() and out.shape == batch.shape:
        said = {"name": call.comp.name}
        raise fp.cannot_call(FILTER, FILTER_ZH, said)


FILTER = ("{name} returns logits of the shape it is handed, not a token id a row: a filter, not the sampling "
          "step its name says; check it as a filter (name it top_k_... or write an adapter)")
FILTER_ZH = ("{name} 返回与输入形状相同的 logits，而不是每行一个 token id："
             "它是过滤函数，不是名字所说的采样步骤；"
             "请把它当作过滤函数检查（命名为 top_k_... 或写一个适配函数）")


PLAIN = text("plain", "不加过滤")


def _settings(call: Caller) -> list[tuple[Text, dict[str, Any], Tensor, list[tuple[str, Tensor]]]]:
    """(label, options, the distribution they should give, the named mistakes' distributions)."""
    row = SAMPLE_ROW
    softmax = torch.softmax(row, -1)
    out = [(PLAIN, {"temperature": 1.0} if call.find(TEMPERATURE_NAMES) else {}, softmax,
            [("sampling_softmax_wrong_dim", torch.full((V,), 1.0 / V, dtype=torch.float64))])]
    if call.find(TEMPERATURE_NAMES):
        out.append((text("temperature 0.5", "温度 0.5"), {"temperature": 0.5}, torch.softmax(row / 0.5, -1),
                    [("temperature_multiplied", torch.softmax(row * 0.5, -1)),
                     ("temperature_after_softmax", softmax),
                     ("temperature_twice", torch.softmax(row / 0.25, -1))]))
    if call.find(K_NAMES):
        kept = torch.isfinite(top_k_filter(row, 3))
        out.append((text("top_k 3", "top_k 3"), {"top_k": 3}, _masked(row, kept),
                    [("filter_fill_finite", torch.softmax(torch.where(kept, row, 1e-10), -1)),
                     ("top_k_off_by_one", torch.softmax(top_k_filter(row, 4), -1)),
                     ("top_k_off_by_one", torch.softmax(top_k_filter(row, 2), -1))]))  # the k-th dropped
    if call.find(P_NAMES):
        kept = torch.isfinite(top_p_filter(row, 0.8))
        crossing = top_p_keep(row, 0.8, frozenset({"top_p_drops_crossing:le"}))
        out.append((text("top_p 0.8", "top_p 0.8"), {"top_p": 0.8}, _masked(row, kept),
                    [("top_p_drops_crossing", _masked(row, crossing)),
                     ("filter_fill_finite", torch.softmax(torch.where(kept, row, 1e-10), -1))]))
    if call.find(MIN_P_NAMES):
        out.append((text("min_p 0.1", "min_p 0.1"), {"min_p": 0.1}, _masked(row, min_p_keep(row, 0.1)),
                    [("min_p_not_scaled", _masked(row, min_p_keep(row, 0.1, UNSCALED)))]))
    return out


def _masked(row: Tensor, keep: Tensor) -> Tensor:
    return torch.softmax(row.masked_fill(~keep, -math.inf), -1)


def check_sample(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    call = Caller(comp, ctx)
    if call.processors:
        names = ", ".join(call.processors)
        res.notes.append(text(f"its `{names}` is handed an empty list of processors: drawn from "
                              "softmax(logits)",
                              f"它的 `{names}` 传入空的处理器列表：从 softmax(logits) 采样"))
    if call.find(K_NAMES):  # deterministic first: top_k = 1 is the argmax of every row
        res.checks.append(_top_k_one(call))
    for i, (label, options, right, mistakes) in enumerate(_settings(call)):
        try:
            tokens = _draw(ctx, call, options, seed=1000 + i)
        except fp.LearnerFailure as failure:
            if res.findings:  # a named mistake breaks it here too: one more failed check
                res.checks.append(Check(text(f"draws with {label['en']}", f"{label['zh']} 时采样"), False,
                                        text(failure.error.message, failure.error.message)))
                continue
            if "probability tensor contains" in failure.error.message:
                _from_logits(res, ctx, comp, call, failure)
                return finish(res)
            raise
        counts = torch.bincount(tokens.clamp(0, V), minlength=V + 1)[:V].double()
        test = stats.chi_square(counts, right)
        res.checks.append(Check(text(f"{call.draws:,} draws ({label['en']}) follow handformer's distribution "
                                     f"(chi-square p = {test.p_value:.2g}, df {test.df}; rejected below "
                                     "1e-6)",
                                     f"{call.draws:,} 次采样（{label['zh']}）服从 handformer 的分布"
                                     f"（卡方检验 p = {test.p_value:.2g}，自由度 {test.df}；"
                                     "低于 1e-6 即拒绝）"),
                                not test.rejected, _outside(test)))
        if test.rejected:
            _name_mistake(res, ctx, comp, label, counts, test, mistakes)
    return finish(res)


def _top_k_one(call: Caller) -> Check:
    """top_k = 1 picks the argmax of every row (an exception is the check's detail: the draws say
    why, when it is a named mistake)."""
    logits = test_logits(5)
    try:
        tokens, detail = as_tokens(call(logits, top_k=1), 5), None
    except fp.LearnerFailure as failure:
        tokens, detail = None, text(f"raised {failure.error.message}", f"报错：{failure.error.message}")
    ok = tokens is not None and torch.equal(tokens, logits.argmax(-1))
    return Check(text("top_k = 1 picks the argmax of each of 5 rows", "top_k = 1 时 5 行都选 argmax"),
                 ok, detail)


def _name_mistake(res: ComponentResult, ctx: Context, comp: Component, label: Text, counts: Tensor,
                  test: stats.ChiSquare, mistakes: list[tuple[str, Tensor]]) -> None:
    """A finding for the first named mistake whose distribution the draws fit (not one already found)."""
    for name, q in mistakes:
        fit = stats.chi_square(counts, q)
        if not fit.rejected and not res.has(name):
            en, zh = label["en"], label["zh"]
            res.findings.append(_finding(ctx, comp, name, text(
                f"{int(counts.sum()):,} draws ({en}) fit the distribution of this mistake (chi-square p = "
                f"{fit.p_value:.2g}) and not handformer's (p = {test.p_value:.2g})",
                f"{int(counts.sum()):,} 次采样（{zh}）符合这个错误的分布（卡方检验 p = {fit.p_value:.2g}），"
                f"不符合 handformer 的分布（p = {test.p_value:.2g}）")))
            return


def _outside(test: stats.ChiSquare) -> Text | None:
    if test.outside:
        return text(f"{test.outside} draws of tokens the filter removes",
                    f"有 {test.outside} 次抽到了被过滤掉的 token")
    return text(f"statistic {test.stat:.1f}", f"统计量 {test.stat:.1f}")


def _from_logits(res: ComponentResult, ctx: Context, comp: Component, call: Caller,
                 failure: fp.LearnerFailure) -> None:
    """sampling_from_logits: torch.multinomial refused negative logits; on positive ones (logits + 3)
    the draws follow the logits themselves, normalised."""
    shifted = SAMPLE_ROW + 3.0
    torch.manual_seed(7)
    raw = call(shifted.expand(call.draws, V).contiguous())
    tokens = as_tokens(raw, call.draws)
    detail = detail_zh = ""
    if tokens is not None:
        counts = torch.bincount(tokens.clamp(0, V), minlength=V + 1)[:V].double()
        fit = stats.chi_square(counts, shifted / shifted.sum())
        detail = (f"; on logits + 3 (all positive) the {call.draws:,} draws follow logits / logits.sum() "
                  f"(chi-square p = {fit.p_value:.2g})")
        detail_zh = f"；logits + 3（全为正）时 {call.draws:,} 次采样服从 logits / logits.sum()"
    res.findings.append(_finding(ctx, comp, "sampling_from_logits", text(
        f"torch.multinomial refused the logits ({failure.error.message}){detail}",
        f"torch.multinomial 拒绝了 logits（{failure.error.message}）{detail_zh}")))
    res.checks.append(Check(text("samples from probabilities (softmax of the logits)",
                                 "从概率（logits 的 softmax）采样"), False))
