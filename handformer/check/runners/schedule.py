"""The runner of the learning-rate schedule: the paper's warmup schedule (`rate(step, d_model,
factor, warmup)`, the Annotated Transformer's) and cosine with warmup (`get_lr_cosine_schedule(it,
max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters)`, CS336's; nanoGPT's
`get_lr`), as a function of the step or as a factory of a torch scheduler (`LambdaLR`).

The schedule is read at fixed steps (0, 1, around the warmup, 10 x warmup, the end and past it)
and compared with the reference under each counting convention (steps from 0 or from 1, and the
three warmups of cosine: t / T_w, (t + 1) / T_w, (t + 1) / (T_w + 1)); a convention is reported,
never failed. When no convention matches, the variants with one or two named mistakes are tried
(fingerprints, as for the components): warmup off by one, an exponent's sign flipped, the d_model
factor missing; the cosine counted from step 0, no floor past the end, min_lr left out. Step 0 is
checked on its own: the paper's schedule is never 0 there and never divides by zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import SCHEDULE_ARGS as ARGS
from handformer.check.core.argument_names import SCHEDULE_STEP_NAMES as STEP_NAMES
from handformer.check.core.argument_names import named_each
from handformer.check.core.context import Context, forward_parameters, named, names_of
from handformer.check.core.defaults import then
from handformer.check.core.discovery import Component, DiscoveryError, defaulted_config
from handformer.check.core.localize import Departure
from handformer.check.core.probe import Found, Probe, Subject, localize_step, run_probe
from handformer.check.core.result import DIFFERS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.signatures import schedule_maker
from handformer.check.core.source import (
    config_reads,
    functions_called,
    global_reads,
    locate,
    methods_called,
    source_lines,
    source_text,
    with_called_code,
)
from handformer.check.reference import variants as V
from handformer.check.runners import schedule_onecycle as one_cycle
from handformer.check.runners import schedule_scale as scale
from handformer.check.runners import schedule_timm as timm
from handformer.check.runners import schedule_wsd as W
from handformer.check.runners.localize_schedule import localize_schedule

OPTIMIZER_NAMES = ("optimizer", "opt", "optim")
PAPER = {"d_model": 64, "factor": 2.0, "warmup": 10}
COSINE = {"max_lr": 1.0, "min_lr": 0.1, "warmup": 10, "total": 100}
PAPER_STEPS = (0, 1, 2, 3, 5, 8, 9, 10, 11, 12, 20, 50, 100, 1000)
COSINE_STEPS = (0, 1, 2, 5, 8, 9, 10, 11, 12, 30, 55, 90, 99, 100, 101, 150)
# fairseq's inverse_sqrt: a peak it takes (lr, base_lr, ...) and where its warmup starts (warmup_init_lr)
INVERSE_SQRT = {"max_lr": 2.0, "warmup": 10, "init_lr": 0.2}
# by family: its sizes, the steps it is read at, the sizes it has when it does not take them (Hugging
# Face's get_cosine_schedule_with_warmup decays to 0; minimind's get_lr(current_step, total_steps, lr)
# has no warmup), its name in English and Chinese
FAMILIES = {
    "paper": (PAPER, PAPER_STEPS, {}, "paper's schedule, factor * d_model^-0.5 * min(step^-0.5, step * "
              "warmup^-1.5)", "论文的调度 factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)"),
    "cosine": (COSINE, COSINE_STEPS, {"min_lr": 0.0, "warmup": 0}, "cosine schedule with linear warmup",
               "带线性预热的余弦调度"),
    # a decay to an end or a floor whose code computes no cosine: a straight line (Hugging Face's
    # get_linear_schedule_with_warmup), read at cosine's sizes and steps
    "linear": (COSINE, COSINE_STEPS, {"min_lr": 0.0, "warmup": 0}, "linear schedule with linear warmup",
               "带线性预热的线性衰减调度"),
    # its total the decay's length or the run's, by the setting's name (schedule_wsd.total); a floor it
    # does not take (a ratio it defaults) read at its last step
    "wsd": (W.SIZES, W.STEPS, {}, "warmup-stable-decay schedule (WSD)", "预热-平稳-衰减调度（WSD）"),
    # a warmup and neither d_model nor an end (fairseq's inverse_sqrt, a LambdaLR's multiplier): its peak
    # its own where it takes none (1: a multiplier of the optimizer's rate), its warmup from 0
    "inverse_sqrt": (INVERSE_SQRT, PAPER_STEPS, {"max_lr": 1.0, "init_lr": 0.0},
                     "inverse square root schedule with linear warmup (fairseq's inverse_sqrt)",
                     "带线性预热的平方根倒数调度（fairseq 的 inverse_sqrt）"),
}
PAST_TOTAL = ("cosine", "linear")  # the families defined up to their total (without a floor: no further)
COSINE_CONVENTIONS: dict[str, tuple[int, int, Text]] = {  # (shift of t, of T_w in the warmup's ratio)
    "cs336": (0, 0, text("warmup t / T_w, from 0 at step 0 (CS336)", "预热为 t / T_w，步 0 是 0（CS336）")),
    "handformer": (
        1,
        0,
        text(
            "warmup (t + 1) / T_w, steps counted from 1 (handformer)",
            "预热为 (t + 1) / T_w，步数从 1 开始数（handformer）",
        ),
    ),
    "nanogpt": (1, 1, text("warmup (t + 1) / (T_w + 1) (nanoGPT)", "预热为 (t + 1) / (T_w + 1)（nanoGPT）")),
    "gpt_2": (1, 0, text("warmup (t + 1) / T_w, the decay from step T_w (Karpathy's GPT-2 reproduction)",
                        "预热为 (t + 1) / T_w，从步 T_w 开始衰减（Karpathy 复现 GPT-2 的写法）")),
}
PAPER_FLAGS = (
    "schedule_warmup_off_by_one:early",
    "schedule_warmup_off_by_one:late",
    "schedule_exponent_sign:step",
    "schedule_exponent_sign:warmup",
    "schedule_exponent_sign:d_model",
    "schedule_no_d_model",
)
LINEAR_FLAGS = ("schedule_warmup_off_by_one:early", "schedule_warmup_off_by_one:late")
COSINE_FLAGS = (
    "schedule_warmup_off_by_one:early",
    "schedule_warmup_off_by_one:late",
    "cosine_from_step_zero",
    "cosine_from_step_zero:end",
    "cosine_no_floor",
    "cosine_min_lr_ignored",
)
TOL = 1e-9  # relative: the schedules are floats of python or float32 tensors (relative error ~1e-7)


def paper(
    n: float, d_model: float, factor: float, warmup: float, flags: frozenset[str] = frozenset()
) -> float:
    """factor * d_model^-0.5 * min(n^-0.5, n * warmup^-1.5), n >= 1, with the named mistakes."""
    sign = dict.fromkeys([V.has(flags, "schedule_exponent_sign")], -1.0)  # the exponent flipped: -1
    w = V.warmup_with(warmup, flags)
    step_term = n ** (-0.5 * sign.get("step", 1.0))
    if "ratio" in sign:  # sqrt(n / T_w) for sqrt(T_w / n) after the warmup: n^0.5 * T_w^-1 for n^-0.5
        step_term = n ** 0.5 / w
    warm_term = n * w ** (-1.5 * sign.get("warmup", 1.0))
    scale = 1.0 if "schedule_no_d_model" in flags else d_model ** (-0.5 * sign.get("d_model", 1.0))
    return factor * scale * min(step_term, warm_term)


def inverse_sqrt(n: float, peak: float, warmup: float, init: float,
                 flags: frozenset[str] = frozenset()) -> float:
    """fairseq's inverse_sqrt at update n: a straight line from init to the peak over the warmup, then
    peak * sqrt(warmup / n), with the named mistakes."""
    w = V.warmup_with(warmup, flags)
    return init + n * (peak - init) / w if n < w else peak * math.sqrt(w / n)


def cosine(
    t: float,
    max_lr: float,
    min_lr: float,
    warmup: float,
    total: float,
    convention: str,
    flags: frozenset[str] = frozenset(),
    linear: bool = False,
) -> float:
    """Linear warmup to max_lr, then half a cosine (`linear`: a straight line) down to min_lr at step
    `total`, min_lr after it, counted as `convention` counts (see COSINE_CONVENTIONS), with the named
    mistakes."""
    a, b, _ = COSINE_CONVENTIONS[convention]
    w = V.warmup_with(warmup, flags)
    floor = 0.0 if "cosine_min_lr_ignored" in flags else min_lr
    throughout = convention == "handformer"  # steps counted from 1 in the decay too; the others from 0
    n = t + a if throughout else t
    if (n <= w) if throughout else (t < w):
        return max_lr * (t + a) / (w + b)
    zero = V.has(flags, "cosine_from_step_zero")  # "end": the decay's length kept, total - warmup
    start = w if zero is None else 0
    progress = (n - start) / (total - (w if zero == "end" else start))
    if progress > 1 and "cosine_no_floor" not in flags:
        return min_lr
    left = 1.0 - progress if linear else 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 down to 0
    return floor + (max_lr - floor) * left


class Schedule:
    """The learner's schedule as values at steps: a function of the step, or a factory of a torch
    scheduler (its first argument the optimizer) stepped on an SGD with lr 1. Settings it reads as
    module globals (nanoGPT's `get_lr(it)` reads warmup_iters, lr_decay_iters, learning_rate,
    min_lr) are set to check's values while it runs, then put back (`settings`)."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        params = forward_parameters(comp.obj)
        self.names, self.required = names_of(params)
        lowered = [n.lower() for n in self.names]
        self.factory = bool(lowered) and lowered[0] in OPTIMIZER_NAMES
        # a function of the settings that returns the schedule as a function of the step
        self.maker = schedule_maker(comp.obj)  # the function of the step is what it returns (`at`)
        first = next(iter(self.names), None)
        self.step_name = None if self.factory or self.maker else named(self.names, STEP_NAMES) or first
        settings = [n for n in self.names if n != self.step_name]
        self.args = named_each(settings, ARGS)
        self.globals = _global_settings(comp.obj, self.names)  # key -> the module global it reads
        # a configuration argument (nanoGPT's get_lr(it, cfg) reads cfg.warmup_iters): key -> its field
        self.config, self.fields = _config_settings(comp.obj, settings)  # an argument read as numbers: none
        self.family = _family({k: self.setting(k) for k in ARGS},
                              lowered[int(self.factory):] + list(self.fields.values()), comp.obj)
        unknown = [n for n in self.required if n != self.step_name and n not in self.args.values()
                   and n.lower() not in OPTIMIZER_NAMES and n != self.config]
        if self.family is None or unknown:
            raise _unreadable(comp, unknown)
        sizes, steps, untaken, *_ = FAMILIES[self.family]
        self.sizes = sizes | {key: value for key, value in untaken.items() if not self.reads(key)}
        self.sizes.setdefault("total", W.total(self.setting("total")))
        # a cosine that names no floor decays to 0 at its end and is defined up to it (Hugging Face's
        # get_cosine_schedule_with_warmup climbs back past num_training_steps): past it, read, not graded
        beyond = self.family in PAST_TOTAL and not self.reads("min_lr")
        self.past = tuple(s for s in steps if beyond and s > self.sizes["total"])
        self.steps = tuple(s for s in steps if s not in self.past)
        # what is localized (the function, its call), and the learning rate at a step: a maker's are the
        # function it returns (a factory's, its LambdaLR's lambda: `_stepped`)
        self.traced: tuple[Any, Any] = (comp.obj, self.value)
        self.switched: dict[str, Any] = {}  # a switch of its own set otherwise (`switches`)
        self.at = self.make() if self.maker else (
            lambda step: comp.obj(**{self.step_name: step}, **self.kwargs()))

    def setting(self, key: str) -> str | None:
        """The argument, or else the module global, that gives the setting `key`; None: neither."""
        return self.args[key] or self.fields.get(key) or self.globals.get(key)

    def reads(self, key: str) -> bool:
        """Whether the schedule takes the setting `key` (an argument or a module global it reads)."""
        return bool(self.setting(key))

    @contextlib.contextmanager
    def settings(self) -> Iterator[Text | None]:
        """The module globals the schedule reads, set to check's sizes (the note that says so)."""
        module = sys.modules[self.comp.obj.__module__]  # the learner's file, imported
        wanted = {name: self.sizes[key] for key, name in self.globals.items() if key in self.sizes}
        if not wanted:
            yield None
            return
        saved = {name: vars(module).get(name) for name in wanted}
        vars(module).update(wanted)
        now = ", ".join(f"{n}={v:g}" for n, v in wanted.items())
        were = ", ".join(f"{n}={v!r}" for n, v in saved.items())
        try:
            yield text(f"your module-level settings were set to {now} for this check (they were {were})",
                       f"检查时你在模块顶层的设置被改成了 {now}（原来是 {were}）")
        finally:
            vars(module).update(saved)

    def kwargs(self) -> dict[str, Any]:
        out = {name: self.sizes[key] for key, name in self.args.items() if name and key in self.sizes}
        out.update(self.switched)
        if self.config is not None:
            values = {self.fields[key]: self.sizes[key] for key in self.fields.keys() & self.sizes.keys()}
            out[self.config] = _config_object(self.comp.obj, self.config, values)
        return out

    def value(self, step: int) -> float:
        """The learning rate at one step (a function of the step, or the one it made); their exception
        is theirs."""
        return _as_float(self.ctx, self.comp, self.ctx.learner.call("forward", self.at, step), step)

    def switches(self) -> Iterator[tuple[str, dict[int, Any]]]:
        """Each switch it takes (a setting whose default is a bool), and its values with the switch
        flipped (a run that raises: none)."""
        for p in forward_parameters(self.comp.obj):
            if isinstance(p.default, bool):
                self.switched = {p.name: not p.default}
                with contextlib.suppress(fp.LearnerFailure):
                    yield p.name, self.values()
                self.switched = {}

    def make(self) -> Callable[[int], Any]:
        """The function of the step a maker returns (signatures.py's returns_function: a lambda or a
        function it defines), built with check's settings; what is localized."""
        made = self.ctx.learner.call("__init__", self.comp.obj, **self.kwargs())
        self.traced = (made, made)
        return made

    def values(self) -> dict[int, float | BaseException]:
        """The learning rate at each step; an exception at a step is kept as that step's value (a
        division by zero at step 0 is a finding, not the end of the check)."""
        if self.factory:
            return self.stepped()
        out: dict[int, float | BaseException] = {}
        with self.settings() as note:
            for s in self.steps + self.past:
                try:
                    out[s] = self.value(s)
                except fp.LearnerFailure as failure:
                    if s != 0:
                        raise
                    out[s] = failure
        if note is not None and self.ctx.partial is not None:
            self.ctx.partial.notes.append(note)  # the result in progress says its globals were set
        return out

    def stepped(self, lr: float = 1.0) -> dict[int, float | BaseException]:
        """A factory's scheduler stepped on an SGD of learning rate `lr`: the rate after each step."""
        weight = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([weight], lr=lr)
        raised: list[Exception] = []
        with _first_step_kept(raised):
            sched = self.ctx.learner.call("__init__", self.comp.obj, opt, **self.kwargs())
        # a LambdaLR's lambda on an optimizer of lr 1 is the schedule, a function of the step: localized
        lam = next(filter(inspect.isfunction, getattr(sched, "lr_lambdas", ())), None)
        self.traced = (lam, lam)
        update = getattr(sched, "step_update", None)  # fairseq's: its rate set from the update count
        if not hasattr(sched, "step") and update is None:
            raise self.ctx.learner.fail(
                "__init__",
                f"{self.comp.name}(optimizer, ...) returned "
                f"{type(sched).__name__}, not a scheduler with .step()",
                f"{self.comp.name}(optimizer, ...) 返回了 {type(sched).__name__}，不是带 .step() 的调度器",
            )
        out: dict[int, float | BaseException] = {}
        for s in range(max(self.steps + self.past) + 1):
            _ = update and self.ctx.learner.call("forward", update, s)
            if s in self.steps + self.past:
                out[s] = float(opt.param_groups[0]["lr"])
            opt.step()
            _ = update or self.ctx.learner.call("forward", sched.step)
        path = self.ctx.learner.path  # step 0 raised while the scheduler was built: its value the failure
        out.update((0, fp.LearnerFailure(fp.learner_error(err, path, "__init__"))) for err in raised)
        return out


def _first_step_kept(raised: list[Exception]) -> Any:
    """While a torch scheduler is built, the exception of the step 0 it reads as it is built (a
    LambdaLR calls the schedule at step 0) kept in `raised`, not raised, so that the steps after it
    are read."""
    original = torch.optim.lr_scheduler.LRScheduler._initial_step

    def initial_step(self: Any) -> None:
        try:
            original(self)
        except Exception as err:  # the learner's schedule at step 0: the step-0 check reports it
            raised.append(err)

    return mock.patch.object(torch.optim.lr_scheduler.LRScheduler, "_initial_step", initial_step)


def _config_settings(fn: Any, candidates: list[str]) -> tuple[str | None, dict[str, str]]:
    """The argument that holds the schedule's settings as fields (`cfg.warmup_iters`), and key -> the
    field; (None, {}) when no argument does, or when it reads a field check cannot fill (a namespace
    would raise where the learner's own configuration would not)."""
    for name in candidates:
        attrs = config_reads(fn, name)[1]
        fields = dict(filter(lambda item: item[1], ((key, named(sorted(attrs), aliases)) for key, aliases in
                                                    ARGS.items())))
        known = set(fields.values()) | set(getattr(defaulted_config(fn, name), "__dataclass_fields__", ()))
        if fields and attrs <= known:
            return name, fields
    return None, {}


def _config_object(fn: Any, name: str, values: dict[str, Any]) -> Any:
    """The configuration handed to the schedule: the learner's dataclass at its defaults, or a
    namespace, with check's settings in the fields it reads."""
    own = defaulted_config(fn, name)
    return dataclasses.replace(own(), **values) if own is not None else types.SimpleNamespace(**values)


def _global_settings(fn: Any, arguments: list[str]) -> dict[str, str]:
    """The schedule's settings that `fn` reads as module globals, not arguments: key -> name."""
    reads = global_reads(fn) - set(arguments)
    return {key: name for key, aliases in ARGS.items() for name in sorted(reads) if name.lower() in aliases}


COSINE_CODE = re.compile(r"(?i)\bcos")  # math.cos, torch.cos, CosineAnnealingLR


def _reached_source(fn: Any) -> str:
    """The source of a schedule and of the file's functions it calls (a lambda's helper), and of the
    methods of its class it calls (a Lightning module's lr_at)."""
    return source_text(fn) + "".join(map(source_text, functions_called(fn) + methods_called(fn)))


def _family(settings: dict[str, str | None], rest: list[str], fn: Any) -> str | None:
    """The paper's schedule (it takes d_model, or a factor), WSD (a stable stage), cosine (an end or a
    floor), the inverse square root (a warmup alone, with a peak or none), or None."""
    if settings["stable"]:
        return "wsd"
    if settings["d_model"]:
        return "paper"
    if settings["total"] or settings["min_lr"]:  # a decay: a cosine where its code computes one
        return "cosine" if COSINE_CODE.search(_reached_source(fn)) else "linear"
    if any(n in ARGS["warmup"] for n in rest):  # a warmup, no d_model, no end
        # rate(step, factor, warmup): the d_model factor forgotten; else fairseq's inverse_sqrt
        return "paper" if settings["factor"] else "inverse_sqrt"
    return None


def _unreadable(comp: Component, unknown: list[str]) -> DiscoveryError:
    what, what_zh = ((f"cannot fill the argument {unknown[0]!r}", f"填不了参数 {unknown[0]!r}") if unknown
                     else ("cannot tell which schedule it is", "看不出是哪种调度"))
    return DiscoveryError(
        f"{comp.name}: {what}; name the arguments as the paper's rate(step, d_model, factor, "
        "warmup) or cosine's get_lr_cosine_schedule(it, max_learning_rate, min_learning_rate, "
        "warmup_iters, cosine_cycle_iters) do (or their common aliases: model_size, "
        "warmup_steps, max_lr, min_lr, total_steps, ...)",
        zh=f"{comp.name}：{what_zh}；"
           "请像论文的 rate(step, d_model, factor, warmup) 或余弦调度的 get_lr_cosine_schedule(it, "
           "max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters) "
           "那样给参数起名（或用常见的别名：model_size、warmup_steps、max_lr、min_lr、total_steps "
           "等）")


def _as_float(ctx: Context, comp: Component, out: Any, step: int) -> float:
    try:
        return float(out)
    except (TypeError, ValueError, RuntimeError):
        raise ctx.learner.fail(
            "forward", f"{comp.name} returned {type(out).__name__} at step {step}, not a number",
            f"{comp.name} 在 step {step} 返回了 {type(out).__name__}，不是一个数"
        ) from None


def _close(a: float, b: float) -> bool:
    return math.isfinite(a) and abs(a - b) <= fp.REL_TOL * max(abs(b), 1e-12) + TOL


def _matches(got: dict[int, float], ref: Callable[[int], float], steps: tuple[int, ...]) -> float:
    """The largest relative difference over `steps` (inf if a value is not finite)."""
    worst = 0.0
    for s in steps:
        want = ref(s)
        if not math.isfinite(got[s]):
            return math.inf
        worst = max(worst, abs(got[s] - want) / max(abs(want), 1e-12))
    return worst


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "schedule")))
    return Finding(name, observed, number, code, form)


Convention = Callable[[int, frozenset[str]], float]


def check_schedule(comp: Component, ctx: Context) -> ComponentResult:
    """The learning-rate schedule, as the SCHEDULE probe states it (NO_WARMUP: a cosine that takes
    no warmup)."""
    sched = Schedule(comp, ctx)
    cycle = one_cycle.takes_one_cycle(comp.obj)
    if cycle and sched.step_name and all(map(sched.args.get, ("total", "max_lr"))):
        names = cycle | {k: sched.args[k] for k in ("total", "max_lr")}
        return one_cycle.check_one_cycle(comp, ctx, sched.step_name, names, _reached_source(comp.obj))
    return run_probe(NO_WARMUP if sched.family == "cosine" and not sched.reads("warmup") else SCHEDULE,
                     comp, ctx)


def _build(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's schedule read at the family's steps (a failure at step 0 kept as that step's
    value, NaN in the values); its readings the family's counting conventions."""
    sched = Schedule(comp, ctx)
    got = sched.values()
    if sched.family == "linear" and not _straight(got, sched.sizes):
        raise _unknown_decay(comp)
    conventions, labels, flags = _conventions(sched, got)

    def run(steps: tuple[int, ...]) -> Tensor:
        return torch.tensor([v if isinstance(v, float) else math.nan for v in map(got.get, steps)],
                            dtype=torch.float64)

    return Subject(run, list(conventions.items()), sched, {"got": got, "labels": labels, "flags": flags})


def _straight(got: dict[int, Any], sizes: dict[str, float]) -> bool:
    """Whether the values past the warmup's end and before the last step (numbers: only step 0 may
    have raised) lie on one line; a NaN is on none."""
    steps = torch.tensor(sorted(got), dtype=torch.float64)
    steps = steps[(steps > sizes["warmup"]) & (steps < sizes["total"])]  # (S,)
    values = torch.tensor([got[int(s)] for s in steps], dtype=torch.float64)  # (S,)
    slopes = torch.diff(values) / torch.diff(steps)
    return bool(torch.allclose(slopes, slopes[:1].expand_as(slopes), rtol=1e-6, atol=1e-12))


def _unknown_decay(comp: Component) -> DiscoveryError:
    return DiscoveryError(
        f"{comp.name}: its decay is neither half a cosine (its code computes no cos) nor a straight line "
        "(a stable stage, an exponential or an inverse square root decay): handformer has no reference "
        "for it",
        zh=f"{comp.name}：它的衰减既不是半个余弦（代码里没有 cos），也不是直线（有平稳阶段、指数衰减"
           "或平方根倒数衰减）：handformer 没有它的参考实现")


def _reference(right: Convention, steps: tuple[int, ...], flags: frozenset[str]) -> Tensor:
    """The values after step 0 (step 0 is checked on its own) under a convention, with mistakes."""
    return torch.tensor([right(s, flags) for s in steps if s > 0], dtype=torch.float64)


def _right(subject: Subject, found: Found) -> tuple[str, Convention]:
    """The convention the search found, else the one closest to the values without mistakes."""
    if found.matched is not None:
        return found.key, found.weights
    return min(subject.readings,
               key=lambda r: fp.relative_error(found.out, _reference(r[1], found.x, frozenset())))


def _compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """The step that says the convention, compares the values after step 0 with the right schedule's
    and names the mistakes the search found (or says none does)."""
    sched, values = subject.module, _floats(subject.facts["got"])
    if sched.factory:
        res.notes.append(_factory_note(comp))
    conv, right = _right(subject, found)
    res.convention = subject.facts["labels"][conv]
    later = tuple(s for s in found.x if s > 0)
    _compare_values(res, sched, values, right, later)
    _report_mistakes(res, ctx, comp, found, values, right, later)


def _at_zero(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """The step that checks step 0 on its own and shows the values at the family's landmarks."""
    sched, got = subject.module, subject.facts["got"]
    right = _right(subject, found)[1]
    _step_zero(res, ctx, comp, sched, got[0], right)  # step 0 is read in every family
    sizes = sched.sizes
    marks = ((0, sizes["warmup"], 10 * sizes["warmup"]) if sched.family in ("paper", "inverse_sqrt")
             else (0, sizes["warmup"], sizes["total"], max(sched.steps)))
    res.notes.append(_values_note(_floats(got), right, tuple(dict.fromkeys(marks))))


def _floats(got: dict[int, Any]) -> dict[int, float]:
    return {s: v for s, v in got.items() if isinstance(v, float)}


# past the end of a cosine that names no floor: the note, by whether it climbs back as Hugging Face's
# get_cosine_schedule_with_warmup does (its cosine goes on past num_training_steps)
PAST_END = {
    True: text("past the last step {total} the cosine climbs back ({en}), as Hugging Face's "
               "get_cosine_schedule_with_warmup does: outside the schedule's range (it names no floor), not "
               "graded; CS336 and nanoGPT hold min_lr there",
               "最后一步 {total} 之后余弦又升了回去（{zh}），"
               "与 Hugging Face 的 get_cosine_schedule_with_warmup 相同："
               "超出调度的范围（它没有下限），不评分；CS336 和 nanoGPT 在那里保持 min_lr"),
    False: text("past the last step {total} (not graded: the schedule names no floor, the run ends there): "
                "{en}",
                "最后一步 {total} 之后（不评分：调度没有下限，训练在那里结束）：{zh}"),
}


def _past_end(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """Past the end of a cosine that names no floor: the values shown, not graded; DIFFERS (a
    convention) where the cosine climbs back as Hugging Face's does."""
    sched, got = subject.module, _floats(subject.facts["got"])
    if not sched.past:
        return
    right = _right(subject, found)[1]
    shown = {s: got.get(s, math.nan) for s in sched.past}
    hf = sched.family == "cosine" and all(_close(v, right(s, frozenset({"cosine_no_floor"})))
                                          for s, v in shown.items())
    res.status = DIFFERS if hf else res.status
    en = "; ".join(f"step {s}: {v:.4g}" for s, v in shown.items())
    zh = "；".join(f"步 {s}：{v:.4g}" for s, v in shown.items())
    note = PAST_END[hf]
    res.notes.append(text(note["en"].format(total=sched.sizes["total"], en=en),
                          note["zh"].format(total=sched.sizes["total"], zh=zh)))

SCHEDULE = Probe(
    build=_build,                           # the function (or scheduler factory) read at each step
    inputs=lambda s: s.module.steps,
    shape=lambda ctx, comp, s, x, out: None,  # a number at each step: _as_float refuses anything else
    observe=lambda out: out[1:],            # the steps after 0 (the families' steps start at 0)
    reference=_reference,
    universe=lambda s: s.facts["flags"],
    steps=(_compared, _at_zero, _past_end, scale.check_scale,
           localize_step(lambda s, found: _localize(s, found), place=False)),
    error=fp.relative_error, tol=fp.REL_TOL, deterministic=False,
)


def _localize(subject: Subject, found: Found) -> Departure | None:
    """Where a schedule of plain numbers parts from the convention right the longest, from step 0
    (localize_schedule.py); a scheduler factory is not localized."""
    sched, got = subject.module, _floats(subject.facts["got"])
    steps = torch.tensor(sorted(got), dtype=torch.float64)  # (S,)
    values = torch.tensor([got[int(s)] for s in steps], dtype=torch.float64)  # (S,)
    conv, right = max(subject.readings, key=lambda r: _agreeing(values, _rates(r[1], steps)))
    traced = sched.traced
    with sched.settings():
        return then(traced[0], lambda fn: localize_schedule(
            traced[1], fn, _sub_steps(sched, conv, right), values, _rates(right, steps), steps,
            _named_sizes(sched)))


def _rates(right: Convention, steps: Tensor) -> Tensor:
    return torch.tensor([right(int(s), frozenset()) for s in steps], dtype=torch.float64)  # (S,)


def _agreeing(values: Tensor, rates: Tensor) -> int:
    """How many steps, from the first, the values are the convention's."""
    off = ~torch.isclose(values, rates, rtol=1e-6, atol=1e-12)
    return int((off.cumsum(0) == 0).sum())


def _named_sizes(sched: Schedule) -> dict[str, float]:
    """The sizes a factor may be: the warmup, the end, π, the peak, d_model."""
    names = {"warmup": "T_w", "total": "T", "max_lr": "max_lr", "min_lr": "min_lr", "d_model": "d_model"}
    return {"π": math.pi} | {name: float(sched.sizes.get(k, 1.0)) for k, name in names.items()}  # 1: unnamed


def _sub_steps(sched: Schedule, conv: str, right: Convention) -> Callable[[Tensor], list[tuple[str, Tensor]]]:
    """The reference's sub-steps at the steps (S,), by name, under the convention `conv`, in order."""
    return lambda s: SUB_STEPS[sched.family](s, sched, conv, right)


def _cosine_steps(s: Tensor, sched: Schedule, conv: str, right: Convention) -> list[tuple[str, Tensor]]:
    """A cosine's (or a linear decay's) sub-steps at the steps s (S,)."""
    z, (a, b, _) = sched.sizes, COSINE_CONVENTIONS.get(conv, (0, 0, None))
    w, total, hi, lo = z["warmup"], z["total"], z["max_lr"], z["min_lr"]
    p = (s + a * (conv == "handformer") - w) / (total - w)  # (S,) the progress through the decay
    c = torch.cos(math.pi * p)
    return [("the step t", s), ("the step t + 1", s + 1), ("the warmup fraction", (s + a) / (w + b)),
            ("the warmup's rate", hi * (s + a) / (w + b)), ("the progress through the decay", p),
            ("π × the progress", math.pi * p), ("cos(π × the progress)", c),
            ("1 + cos(π × the progress)", 1 + c),
            ("the cosine factor (1 + cos(π × the progress)) / 2", (1 + c) / 2),
            ("the cosine factor × (max_lr - min_lr)", (1 + c) / 2 * (hi - lo)),
            ("the rate", _rates(right, s))]


def _paper_steps(s: Tensor, sched: Schedule, conv: str, right: Convention) -> list[tuple[str, Tensor]]:
    """The paper's sub-steps at the steps s (S,), n the step counted from 1."""
    z, factor = sched.sizes, sched.args["factor"]
    n = (s + (conv == "from_0")).clamp(min=1)
    terms = (n ** -0.5, n * z["warmup"] ** -1.5)
    least, rate = torch.minimum(*terms), _rates(right, s)
    return [("the step t", s), ("the step n", n), ("n^-0.5", terms[0]), ("n × warmup^-1.5", terms[1]),
            ("min(n^-0.5, n × warmup^-1.5)", least),
            ("d_model^-0.5 × min(...)", z["d_model"] ** -0.5 * least),
            ("the rate / factor", rate / (z["factor"] if factor else 1.0)), ("the rate", rate)]


def _inverse_sqrt_steps(s: Tensor, sched: Schedule, conv: str, right: Convention) -> list[tuple[str, Tensor]]:
    """fairseq's sub-steps at the steps s (S,), n the update counted from 1."""
    n, w = (s + conv.endswith("from_0")).clamp(min=1), sched.sizes["warmup"]
    terms = (n ** -0.5, n * w ** -1.5)
    least = torch.minimum(*terms)
    return [("the step t", s), ("the step n", n), ("n^-0.5", terms[0]), ("n × warmup^-1.5", terms[1]),
            ("min(n^-0.5, n × warmup^-1.5)", least), ("n / warmup", n / w),
            ("sqrt(warmup / n)", (w / n).sqrt()),
            ("min(n / warmup, sqrt(warmup / n))", least * w ** 0.5), ("the rate", _rates(right, s))]


# each family's sub-steps at the steps (S,) (localize_schedule.py), under a convention
SUB_STEPS: dict[str, Callable[[Tensor, Schedule, str, Convention], list[tuple[str, Tensor]]]] = {
    "wsd": lambda s, sched, conv, right: W.sub_steps(s, _rates(right, s)),
    "paper": _paper_steps, "inverse_sqrt": _inverse_sqrt_steps,
    "cosine": _cosine_steps, "linear": _cosine_steps}


def _factory_note(comp: Component) -> Text:
    return text(
        f"{comp.name}(optimizer, ...) returns a scheduler: it was stepped on an SGD "
        "with lr 1, and the learning rate read after each step",
        f"{comp.name}(optimizer, ...) 返回一个调度器：在 lr 为 1 的 SGD 上逐步调用，"
        "每步之后读出学习率",
    )


def _conventions(sched: Schedule, got: dict[int, Any],
                 ) -> tuple[dict[str, Convention], dict[str, Text], tuple[str, ...]]:
    """The family's counting conventions (as references taking the step and a set of mistakes),
    their labels, and the mistakes that can be named."""
    return CONVENTIONS_OF[sched.family](sched, got)


def _wsd_conventions(sched: Schedule, got: dict[int, Any],
                     ) -> tuple[dict[str, Convention], dict[str, Text], tuple[str, ...]]:
    """WSD's variants to its floor (where it takes none, its value at the last step)."""
    floor = sched.sizes["min_lr"] if sched.reads("min_lr") else got[max(sched.steps)]
    counted = W.COUNTED.search(with_called_code(sched.comp.obj))  # it counts the step from 1: (step + 1)
    return (*W.conventions(floor, got, (0, 1, 2)[:1 + 2 * bool(counted)]), W.FLAGS)



PAPER_LABELS = {
    "from_1": text("steps counted from 1 (the paper, the Annotated Transformer)",
                   "步数从 1 开始数（论文，Annotated Transformer）"),
    "from_0": text("steps counted from 0: lr(step) = rate(step + 1) (handformer)",
                   "步数从 0 开始数：lr(step) = rate(step + 1)（handformer）"),
}


def _paper_conventions(sched: Schedule, got: dict[int, Any],
                       ) -> tuple[dict[str, Convention], dict[str, Text], tuple[str, ...]]:
    """The paper's schedule, its steps counted from 1 or from 0."""
    sizes = sched.sizes
    factor = sizes["factor"] if sched.args["factor"] else 1.0
    conventions: dict[str, Convention] = {
        "from_1": lambda s, f: paper(max(s, 1), sizes["d_model"], factor, sizes["warmup"], f),
        "from_0": lambda s, f: paper(s + 1, sizes["d_model"], factor, sizes["warmup"], f),
    }
    return conventions, PAPER_LABELS, PAPER_FLAGS


INVERSE_SQRT_LABELS = {
    "peak:from_1": text("the peak lr at the end of the warmup, lr * min(n / T_w, sqrt(T_w / n)) (fairseq); "
                        "steps counted from 1", "预热结束时达到峰值 lr：lr * min(n / T_w, sqrt(T_w / n))"
                        "（fairseq）；步数从 1 开始数"),
    "peak:from_0": text("the peak lr at the end of the warmup, lr * min(n / T_w, sqrt(T_w / n)) (fairseq); "
                        "steps counted from 0: n = step + 1", "预热结束时达到峰值 lr：lr * min(n / T_w, "
                        "sqrt(T_w / n))（fairseq）；步数从 0 开始数：n = step + 1"),
    "paper:from_1": text("lr times the paper's shape, lr * min(n^-0.5, n * T_w^-1.5) (the peak "
                         "lr / sqrt(T_w)); steps counted from 1",
                         "lr 乘论文的形状：lr * min(n^-0.5, n * T_w^-1.5)（峰值是 lr / sqrt(T_w)）；"
                         "步数从 1 开始数"),
    "paper:from_0": text("lr times the paper's shape, lr * min(n^-0.5, n * T_w^-1.5) (the peak "
                         "lr / sqrt(T_w)); steps counted from 0: n = step + 1",
                         "lr 乘论文的形状：lr * min(n^-0.5, n * T_w^-1.5)（峰值是 lr / sqrt(T_w)）；"
                         "步数从 0 开始数：n = step + 1"),
    "init": text("warmup from warmup_init_lr to lr in a straight line, then lr * sqrt(T_w / n) (fairseq's "
                 "warmup_init_lr)", "预热从 warmup_init_lr 直线升到 lr，之后是 lr * sqrt(T_w / n)"
                 "（fairseq 的 warmup_init_lr）"),
}
INVERSE_SQRT_FLAGS = ("schedule_warmup_off_by_one:early", "schedule_warmup_off_by_one:late",
                      "schedule_exponent_sign:step", "schedule_exponent_sign:warmup",
                      "schedule_exponent_sign:ratio")


def _inverse_sqrt_conventions(sched: Schedule, got: dict[int, Any],
                              ) -> tuple[dict[str, Convention], dict[str, Text], tuple[str, ...]]:
    """fairseq's inverse_sqrt: from its warmup_init_lr where it takes one; else its peak lr at the
    warmup's end, or lr times the paper's shape (d_model^-0.5 replaced by lr), counted from 1 or 0."""
    peak, w, init = (sched.sizes[k] for k in ("max_lr", "warmup", "init_lr"))
    if sched.reads("init_lr"):
        return ({"init": lambda s, f: inverse_sqrt(s, peak, w, init, f)},
                {"init": INVERSE_SQRT_LABELS["init"]}, LINEAR_FLAGS)
    scale = {"peak": peak * math.sqrt(w), "paper": peak}
    conventions: dict[str, Convention] = {
        f"{form}:from_{k}": lambda s, f, c=c, k=k: paper(max(s, 1) if k else s + 1, 1.0, c, w, f)
        for form, c in scale.items() for k in (1, 0)}
    return conventions, {key: INVERSE_SQRT_LABELS[key] for key in conventions}, INVERSE_SQRT_FLAGS


def _decay_conventions(sched: Schedule, got: dict[int, Any],
                       ) -> tuple[dict[str, Convention], dict[str, Text], tuple[str, ...]]:
    """_conventions of a cosine or linear decay: COSINE_CONVENTIONS, and timm's two countings where
    a switch of the schedule turns one into the other."""
    sizes, linear = sched.sizes, sched.family == "linear"
    conventions: dict[str, Convention] = {
        c: (
            lambda s, f, c=c: cosine(
                s, sizes["max_lr"], sizes["min_lr"], sizes["warmup"], sizes["total"], c, f, linear
            )
        )
        for c in COSINE_CONVENTIONS
    }
    labels = {c: v[2] for c, v in COSINE_CONVENTIONS.items()}
    if not linear and _timm_switch(sched, got):
        conventions |= {f"timm:{p}": lambda s, f, p=p: timm.timm_cosine(s, sizes, p, f)
                        for p in (False, True)}
        labels |= {f"timm:{p}": timm.LABELS[p] for p in (False, True)}
    return conventions, labels, LINEAR_FLAGS if linear else COSINE_FLAGS


# each family's counting conventions, their labels and the mistakes that can be named
CONVENTIONS_OF = {"wsd": _wsd_conventions, "paper": _paper_conventions,
                  "inverse_sqrt": _inverse_sqrt_conventions, "cosine": _decay_conventions,
                  "linear": _decay_conventions}


def _timm_switch(sched: Schedule, got: dict[int, Any]) -> bool:
    """Whether a switch of the schedule turns one of timm's countings into the other (warmup_prefix),
    with the same mistake or none: then both are its documented options."""
    ours = timm.countings(got, sched.sizes, COSINE_FLAGS)
    return bool(ours) and any((not prefix, flags) in timm.countings(flipped, sched.sizes, COSINE_FLAGS)
                              for _, flipped in sched.switches() for prefix, flags in ours)


def _compare_values(
    res: ComponentResult, sched: Schedule, values: dict[int, float], right: Convention, later: tuple[int, ...]
) -> None:
    """The check that the values after step 0 equal the right schedule's."""
    worst = _matches(values, lambda s: right(s, frozenset()), later)
    res.max_abs_error = (
        max(abs(values[s] - right(s, frozenset())) for s in later) if math.isfinite(worst) else math.inf
    )
    shown = ", ".join(f"{s}" for s in later)
    res.checks.append(
        Check(
            text(
                f"the learning rate at steps {shown} equals the {FAMILIES[sched.family][3]}",
                f"步 {shown} 的学习率等于{FAMILIES[sched.family][4]}",
            ),
            worst < fp.REL_TOL,
            text(f"largest relative difference {worst:.2e}", f"最大相对误差 {worst:.2e}"),
        )
    )


def _report_mistakes(res: ComponentResult, ctx: Context, comp: Component, found: Found,
                     values: dict[int, float], right: Convention, later: tuple[int, ...]) -> None:
    """A finding for each named mistake that reproduces the schedule, or a note that none does."""
    for flag in sorted(found.flags):
        name, _, form = flag.partition(":")
        res.findings.append(
            _finding(ctx, comp, name, _observed(name, form, values, right, found.flags, later), form))
    if found.matched is None:
        res.notes.append(text("no known mistake (or pair of them) reproduces your schedule; see the values "
                              "below", "没有任何已知错误（或两个错误的组合）能复现你的调度；请看下面的数值"))


def _build_no_warmup(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """A cosine without warmup (minimind's get_lr(current_step, total_steps, lr)): half a cosine
    from step 0 down to the floor at the last step. A floor the schedule does not take as a setting
    is its own constant (minimind's lr / 10): read at the last step and named. Its readings the
    peaks: lr, or lr above that floor (minimind's first form, lr / 10 + lr * (1 + cos) / 2: lr is
    the amplitude), named too."""
    sched = Schedule(comp, ctx)
    got = sched.values()
    failure = next((v for v in got.values() if isinstance(v, fp.LearnerFailure)), None)
    if failure is not None:
        raise failure  # their exception at a step they accept
    lr, total, own = sched.sizes["max_lr"], sched.sizes["total"], not sched.reads("min_lr")
    floor = got[total] if own else sched.sizes["min_lr"]
    peaks = (lr, lr + floor) if own and floor > 0 else (lr,)

    def run(steps: tuple[int, ...]) -> Tensor:
        return torch.tensor([got[s] for s in steps], dtype=torch.float64)

    return Subject(run, [(peak, (peak, floor, total)) for peak in peaks], sched, {"got": got, "own": own})


def _no_warmup_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                        found: Found) -> None:
    """The step that compares the steps up to the last with half a cosine from the peak found (else
    the closest); past the last step the values are shown, not compared: such a schedule is called
    for its run's steps only."""
    sched, got, inside = subject.module, subject.facts["got"], found.x
    lr, total = sched.sizes["max_lr"], sched.sizes["total"]
    closest = min((w for _, w in subject.readings), key=lambda w: _matches(got, _half_cosine(*w), inside))
    peak, floor, _ = closest if found.matched is None else found.weights
    right = _half_cosine(peak, floor, total)
    worst = _matches(got, right, inside)
    res.max_abs_error = max(abs(got[s] - right(s)) for s in inside) if math.isfinite(worst) else math.inf
    shown = ", ".join(map(str, inside))
    res.checks.append(Check(
        text(f"the learning rate at steps {shown} is half a cosine from {peak:g} down to {floor:g} at "
             f"step {total} (lr = {lr:g}, total_steps = {total})",
             f"步 {shown} 的学习率是半个余弦：从 {peak:g} 降到步 {total} 的 {floor:g}"
             f"（lr = {lr:g}，total_steps = {total}）"),
        worst < fp.REL_TOL, text(f"largest relative difference {worst:.2e}", f"最大相对误差 {worst:.2e}")))
    if worst < fp.REL_TOL:
        res.convention = _no_warmup_convention(peak / lr, floor / lr, subject.facts["own"])
        res.status = DIFFERS if peak != lr else res.status
    else:
        res.notes.append(NOT_HALF_A_COSINE)
    res.notes.append(_no_warmup_values(got, total, [s for s in sched.steps + sched.past if s > total]))


NOT_HALF_A_COSINE = text("it is not half a cosine from lr at step 0 down to its value at the last step; "
                         "see the values below",
                         "它不是从步 0 的 lr 降到最后一步的值的半个余弦；请看下面的数值")
NO_WARMUP = Probe(
    build=_build_no_warmup,                 # the function read at each step; the peaks it may mean
    inputs=lambda s: tuple(t for t in s.module.steps if t <= s.module.sizes["total"]),
    shape=lambda ctx, comp, s, x, out: None,
    reference=lambda w, steps, flags: torch.tensor([_half_cosine(*w)(t) for t in steps], dtype=torch.float64),
    universe=lambda s: (),                  # no named mistakes: the form is compared, not searched
    steps=(_no_warmup_compared,),
    error=fp.relative_error, tol=fp.REL_TOL, deterministic=False,
)


def _half_cosine(peak: float, floor: float, total: float) -> Callable[[int], float]:
    return lambda s: floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * s / total))


def _no_warmup_convention(peak: float, floor: float, own: bool) -> Text:
    """peak and floor as multiples of lr."""
    en = f"no warmup: half a cosine from {peak:g} x lr at step 0 to {floor:g} x lr at the last step"
    zh = f"没有预热：半个余弦，从步 0 的 {peak:g} × lr 降到最后一步的 {floor:g} × lr"
    if own and floor > 0:
        en, zh = en + " (the floor is a constant of your own)", zh + "（下限是你自己定的常数）"
    if peak != 1:
        en += f"; lr is the amplitude above the floor, so the peak is {peak:g} x lr, not lr"
        zh += f"；lr 是下限之上的幅度，所以峰值是 {peak:g} × lr，不是 lr"
    return text(en, zh)


def _no_warmup_values(got: dict[int, Any], total: int, past: list[int]) -> Text:
    steps = (0, total, *past)
    return text("values: " + "; ".join(f"step {s}: {got[s]:.4g}" for s in steps)
                + " (past the last step not compared: the run ends there)",
                "数值：" + "；".join(f"步 {s}：{got[s]:.4g}" for s in steps)
                + "（最后一步之后不比较：训练在那里结束）")


def _step_zero(
    res: ComponentResult,
    ctx: Context,
    comp: Component,
    sched: Schedule,
    zero: Any,
    right: Convention,
) -> None:
    """Step 0: the paper's schedule must give rate(1) there (never 0, never a division by zero);
    cosine's CS336 warmup is 0 by its definition (a note)."""
    if isinstance(zero, fp.LearnerFailure):
        observed = text(f"at step 0 it raised {zero.error.message}", f"步 0 抛出了 {zero.error.message}")
        res.findings.append(_finding(ctx, comp, "schedule_step_zero", observed, "division"))
        return
    want = right(0, frozenset())
    # fairseq's warmup starts at its warmup_init_lr, 0 by default: a 0 at step 0 is its first update's
    if _close(zero, want) or (zero == 0.0 and sched.family == "inverse_sqrt"):
        if sched.family != "paper" and zero == 0.0:
            res.notes.append(_zero_at_start_note())
        return
    if sched.family == "paper" and (zero == 0.0 or not math.isfinite(zero)):
        form = "zero" if zero == 0.0 else "division"
        observed = text(
            f"at step 0 it gives {zero:g}; rate(1) = {want:.4g} is expected",
            f"步 0 得到 {zero:g}；应为 rate(1) = {want:.4g}",
        )
        res.findings.append(_finding(ctx, comp, "schedule_step_zero", observed, form))
        return
    res.checks.append(
        Check(
            text("the learning rate at step 0", "步 0 的学习率"),
            False,
            text(f"{zero:.4g}, expected {want:.4g}", f"{zero:.4g}，应为 {want:.4g}"),
        )
    )


def _zero_at_start_note() -> Text:
    return text(
        "the learning rate is 0 at step 0, so the first step does not move the weights "
        "(CS336's definition; (t + 1) / T_w starts above 0)",
        "步 0 的学习率为 0，第一次更新不会改变权重"
        "（CS336 就这样定义；(t + 1) / T_w 从大于 0 开始）",
    )


def _observed(
    name: str,
    form: str,
    values: dict[int, float],
    right: Callable[[int, frozenset[str]], float],
    flags: frozenset[str],
    steps: tuple[int, ...],
) -> Text:
    off = {s: abs(values[s] - right(s, frozenset())) for s in steps}
    where = max(off, key=lambda s: off[s])
    peak = max(steps, key=lambda s: values[s])
    return text(
        f"your schedule equals the one with this mistake at every step checked (relative "
        f"difference < 1e-5); it differs from the right one by up to {off[where]:.3g} (at step "
        f"{where}); its peak is at step {peak}",
        f"你的调度在检查的每一步都与带这个错误的调度一致（相对误差 < 1e-5）；与正确的调度最多相差 "
        f"{off[where]:.3g}（步 {where}）；峰值在步 {peak}",
    )


def _values_note(
    values: dict[int, float], right: Callable[[int, frozenset[str]], float], steps: tuple[int, ...]
) -> Text:
    shown = [(s, "-" if values.get(s) is None else f"{values[s]:.4g}", right(s, frozenset())) for s in steps]
    en = "; ".join(f"step {s}: {v} (expected {w:.4g})" for s, v, w in shown)
    zh = "；".join(f"步 {s}：{v}（应为 {w:.4g}）" for s, v, w in shown)
    return text(f"values: {en}", f"数值：{zh}")
