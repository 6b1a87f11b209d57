"""Runner of a language model's training step, `lm_train_step(model, x, y, optimizer, lr)`: the
inputs x (B, T) and the targets y (B, T), the same windows of text moved on by one token, and the
learning rate the schedule gives this step.

The probe is data: a tiny handformer Llama (`CausalLM`, float64, its forward returning the logits)
and `torch.optim.AdamW` built at OPT_LR; BATCHES, two (x, y) windows of one token stream, each with
the rate of its step (LRS). The learner's step runs on both; the parameters after each must equal
handformer's step on the same batches from the same start: zero_grad, the cross-entropy of the
logits against y, backward, the gradient clipped (when the learner's step clips, at its norm), the
learning rate set, step. A step that clips runs both steps again with the logits scaled down until
the gradients stay well under its clipping norm, with plain SGD (AdamW's update barely moves with the
loss's scale): at full size the clipping gives a loss of the wrong scale the right update, here the
scale shows.

The named mistakes are flags of handformer's step (MISTAKES): the first set of them that reproduces
the learner's parameters is named (labels that are the inputs: at the line the localizer finds). A
step that takes no learning rate is driven without one and compared with a step at OPT_LR (the
schedule then lives in the learner's loop; noted).

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core.argument_names import (
    ACCUM_NAMES,
    CLIP_NAMES,
    CRITERION_NAMES,
    LR_NAMES,
    OPTIMIZER_LIST_NAMES,
    SCHEDULE_ARGS,
    SCHEDULE_STEP_NAMES,
    X_NAMES,
    Y_NAMES,
)
from handformer.check.core.clipping import argued_norm, clip_norm, clips_after_step
from handformer.check.core.context import (
    Context,
    error_text,
    finish,
    forward_parameters,
    globals_set,
    named,
    names_of,
)
from handformer.check.core.defaults import keyword
from handformer.check.core.discovery import Component, cannot_fill, defaulted_config
from handformer.check.core.keyed_batch import KeyedBatch, keyed_batch
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.objective import not_next_token
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.signatures import (
    LABELS_MOVED,
    accumulated_loader,
    drawn_global,
    drawn_loader,
    iterated_loader,
    kind_of,
    paired_batch,
    schedule_settings,
    token_batch,
)
from handformer.check.core.source import config_reads, functions_called, locate, source_lines, source_text
from handformer.check.core.step_updates import gradient_norm, largest_differences, parameters_of, update
from handformer.check.runners.drawn_windows import Call, check_windows
from handformer.check.runners.localize_train import localize_lm_step
from handformer.check.runners.reward_pair import check_pairwise_step, pairwise_step
from handformer.check.runners.step_model import BATCH, VOCAB, batches, tiny_model
from handformer.check.runners.train_step import (
    ACCUM,
    FLOAT32,
    FLOAT32_NOTE,
    MODEL_NAMES,
    OPTIMIZER_NAMES,
    PROBE_SCALE,
    SCALER_NAMES,
    SCALER_NOTE,
    SCHEDULER_NAMES,
    SCHEDULER_NOTE,
    TOLERANCE,
    UNDER_CLIP,
    clip_note,
    constant_scheduler,
    factor_note,
    grad_scaler,
    rescaled_check,
)

OPT_LR = 0.05  # the optimizer's own rate: what a step that never sets the schedule's rate updates with
LRS = (0.02, 0.004)  # the schedule's rate at steps 1 and 2
TOL = 1e-9
MISTAKES: dict[str, dict[str, bool]] = {  # diagnosis -> the flags of handformer's step that make it
    "train_step_no_zero_grad": {"zero_grad": False},
    "train_step_clip_after_step": {"clip_after": True},
    "train_step_lr_not_set": {"set_lr": False},
    "train_step_loss_not_divided": {"divide": False},
    "train_step_not_clipped": {"clipped": False},
    "train_step_no_shift": {"shift": False},  # the inputs x given to the loss as the labels
}


def mistake_sets(possible: dict[str, bool]) -> Iterator[tuple[tuple[str, ...], dict[str, bool]]]:
    """Each set of MISTAKES (one, then two) of those `possible` does not rule out, with the flags of
    handformer's step that make them all."""
    names = [n for n in MISTAKES if possible.get(n, True)]
    for combo in (c for n in (1, 2) for c in itertools.combinations(names, n)):
        yield combo, {k: v for name in combo for k, v in MISTAKES[name].items()}


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=OPT_LR, betas=(0.9, 0.95), weight_decay=0.1)


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of the run with clipping out of reach: its update is linear in the loss."""
    return torch.optim.SGD(model.parameters(), lr=OPT_LR)


def reference_step(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, lr: float | None,
                   clip: float | None, *, zero_grad: bool = True, clip_after: bool = False,
                   set_lr: bool = True, accum: int = 1, divide: bool = True, clipped: bool = True,
                   shift: bool = True) -> None:
    """handformer's step, with the named mistakes on request: with accum > 1 the batch is split in
    that many micro-batches along the batch, each loss divided by accum (unless `divide` is off);
    `shift` off: the loss scored against the inputs x, not the targets y."""
    if zero_grad:
        opt.zero_grad()
    for x_part, y_part in zip(x.chunk(accum), y.chunk(accum)):
        logits = model(x_part)  # (B / accum, T, V)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), (y_part if shift else x_part).reshape(-1))
        (loss / accum if divide else loss).backward()
    update(model, opt, clip if clipped else None, clip_after, lr if set_lr else None)


def moves_labels(fn: Any, y: str | None) -> bool:
    """Whether the step moves its labels `y` on by one itself (torchtune's recipe: labels[..., 1:]);
    handed the (B, T + 1) windows as x and y, it scores the last position's logits against no label."""
    return bool(y and re.search(rf"\b{y}\s*{LABELS_MOVED.pattern}", source_text(fn)))


class Step:
    """How to call the learner's step: model, x, y, optimizer and the learning rate, by name."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        params = forward_parameters(comp.obj)
        names, required = names_of(params)
        self.model, self.opt = named(names, MODEL_NAMES), named(names, OPTIMIZER_NAMES + OPTIMIZER_LIST_NAMES)
        self.listed = self.opt if str(self.opt).lower() in OPTIMIZER_LIST_NAMES else None  # given [opt]
        self.x, self.y, self.lr = named(names, X_NAMES), named(names, Y_NAMES), named(names, LR_NAMES)
        self.sched, self.scaler = named(names, SCHEDULER_NAMES), named(names, SCALER_NAMES)
        self.settings = schedule_settings(comp.obj)  # what it hands its file's schedule: f(step, **sched)
        self.sched = None if self.sched in self.settings else self.sched  # settings, not a torch scheduler
        self.accum = named(names, ACCUM_NAMES)  # driven with ACCUM micro-batches
        self.clip_arg = named(names, CLIP_NAMES)  # the norm it clips at, handed its clip_norm reading
        self.criterion = named(names, CRITERION_NAMES)  # handed a cross-entropy that ignores -100
        self.shifts = moves_labels(comp.obj, self.y)  # x and y both handed the (B, T + 1) windows
        handed = self._batches(comp)
        self.accum = None if self.accum == self.loader else self.accum  # micro_batches: the list, not a count
        known = {self.model, self.opt, self.x, self.y, self.lr, self.sched, self.scaler, self.accum,
                 self.clip_arg, self.criterion, self.loader, self.pair, self.tokens,
                 self.keyed and self.keyed.name, *self.settings}
        rest = [n for n in required if n not in known]
        self.count = named(rest, SCHEDULE_STEP_NAMES)  # the iteration (nanoGPT's iter_num): 0, then 1
        # or how many steps a loop of them runs (build-nanogpt's train(..., steps): range(steps)): 1 a call
        self.loops = re.search(rf"\brange\(\s*{self.count}\s*\)", source_text(comp.obj))  # (None: no count)
        # a configuration (nanoGPT's cfg): its micro-steps, clipping norm, and whether it sets the rate
        self.config, self.fields = _step_config(comp.obj, rest)
        # what sets the micro-steps: an argument, a field, or a global of its file it reads (grad_accum_steps)
        self.held = named([n for n in comp.obj.__code__.co_names if type(vars(ctx.module).get(n)) is int],
                          ACCUM_NAMES) if handed or self.drawn else None
        self.micro = self.accum or self.fields.get("accum") or self.held or accumulated_loader(comp.obj)
        self.rows = BATCH * ACCUM if self.micro else BATCH  # windows a batch: BATCH a micro-batch
        self.seen: list[float] = []  # the rate the learner's step left in the optimizer, each call
        found = self.model and self.opt and (handed or self.drawn)
        cannot_fill(comp.name, sorted(rest), {self.count, self.config}, found, "model / optimizer / x / y", (
            "a language model's training step takes (model, x, y, optimizer, lr): the inputs, the targets "
            "(the inputs moved on by one token) and the schedule's learning rate",
            "语言模型的训练一步接受 (model, x, y, optimizer, lr)："
            "输入、目标（输入往后移一个 token）和调度给出的学习率"))
        defaults = {p.name: p.default for p in params}  # clip_grad_norm_(..., max_norm): its default
        clip = self._config_clip() if "clip" in self.fields else clip_norm(source_text(comp.obj), defaults)
        self.clip = argued_norm(clip, self.clip_arg, defaults)  # max_grad_norm taken, never used

    @property
    def tol(self) -> float:
        """The largest difference of parameters taken as equal (step_tolerance)."""
        return step_tolerance(self.comp.obj)

    def _batches(self, comp: Component) -> Any:
        """Where x and y come from, each way a step takes them; what hands them (None: drawn by a function
        of its file, or nowhere)."""
        # x and y drawn from it, or iterated over in an epoch (one step's micro-batches): Windows
        self.loader = drawn_loader(comp.obj) or iterated_loader(comp.obj)
        self.pair = paired_batch(comp.obj)  # x and y given as one (x, y) batch
        self.tokens = token_batch(comp.obj)  # x and y cut from one (B, T + 1) tensor of windows
        self.keyed = keyed_batch(comp.obj)  # or from a dict of them ({"input_ids": ..., "labels": ...})
        handed = self.x and self.y or self.loader or self.pair or self.tokens or self.keyed
        self.drawn = None if handed else drawn_global(comp.obj)  # x and y from a function of its file
        self.drawn_calls: list[Call] = []  # the arguments the step called that function with, each call
        return handed

    def _config(self) -> Any:
        """The learner's configuration at its defaults, with ACCUM micro-steps."""
        own = defaulted_config(self.comp.obj, self.config)
        accum = dict(filter(lambda item: item[0], [(self.fields.get("accum"), ACCUM)]))  # its field, if any
        return dataclasses.replace(own(), **accum)

    def _config_clip(self) -> float | None:
        norm = float(getattr(self._config(), self.fields["clip"]))
        return norm or None  # nanoGPT's grad_clip = 0.0 turns clipping off

    def rates(self) -> tuple[float, ...]:
        """The rates handformer's two steps set: those the learner's step wrote (its own schedule), the
        schedule's LRS it was handed, or the optimizer's own."""
        return tuple(self.seen[-2:]) if self.own_rate() else LRS if self.lr else (OPT_LR, OPT_LR)

    def own_rate(self) -> bool:
        """Whether the step sets the learning rate itself (from its iteration and settings): it takes
        none, and the optimizer's rate moved off its own."""
        return not self.lr and bool(set(self.seen) - {OPT_LR})

    def __call__(self, model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, lr: float) -> Any:
        kwargs: dict[str, Any] = {self.model: model, self.opt: [opt] if self.listed else opt}
        parts = self.rows // BATCH  # ACCUM micro-batches, or the one batch
        windows = torch.cat([x, y[:, -1:]], dim=1)  # (B, T + 1)
        pair = (windows.clone, windows.clone) if self.shifts else (x.clone, y.clone)
        given = {self.x: pair[0], self.y: pair[1], self.loader: lambda: Windows(x, y, parts),
                 self.criterion: lambda: nn.CrossEntropyLoss(ignore_index=-100),
                 self.pair: lambda: (x.clone(), y.clone()),
                 self.tokens: lambda: torch.cat([x, y[:, -1:]], dim=1),  # (B, T + 1)
                 self.keyed and self.keyed.name: lambda: self.keyed.filled(torch.cat([x, y[:, -1:]], dim=1)),
                 self.lr: lambda: lr, self.sched: lambda: constant_scheduler(opt), self.scaler: grad_scaler,
                 self.accum: lambda: ACCUM, self.clip_arg: lambda: self.clip,
                 self.count: lambda: max(bool(self.loops), len(self.seen) % 2),
                 self.config: self._config}
        kwargs.update({name: make() for name, make in given.items() if name})
        kwargs.update({name: dict(settings) for name, settings in self.settings.items()})
        stand_in = {self.drawn: Drawn(self, Windows(x, y, parts))} if self.drawn else {}
        stand_in.update(keyword(self.held, ACCUM))
        with globals_set(self.ctx.module, stand_in):
            out = self.ctx.learner.call("forward", self.comp.obj, **kwargs)
        self.seen.append(float(opt.param_groups[0]["lr"]))
        return out


class Drawn:
    """The stand-in for the function of its file a step draws its windows from (get_batch('train')):
    check's windows in turn; the arguments of the step's first call kept (its own function is called
    with them: drawn_windows.check_windows)."""

    def __init__(self, step: Step, windows: Windows) -> None:
        self.step, self.windows = step, windows

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self.step.drawn_calls.append((args, kwargs))
        return self.windows.next_batch()


class Windows:
    """The loader a step draws its (x, y) windows from (build-nanogpt's `train_loader.next_batch()`,
    `next(data_iter)`): the batch of this step, in `parts` micro-batches along the batch, in turn."""

    def __init__(self, x: Tensor, y: Tensor, parts: int) -> None:
        self.parts, self.drawn = list(zip(x.clone().chunk(parts), y.clone().chunk(parts))), 0

    def next_batch(self) -> tuple[Tensor, Tensor]:
        self.drawn += 1
        return self.parts[(self.drawn - 1) % len(self.parts)]

    __next__ = next_batch

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(self.parts)  # an epoch's loop: its micro-batches once

    def __len__(self) -> int:
        return len(self.parts)


def step_tolerance(fn: Any) -> float:
    """float32's precision where the step (or a function of its file it calls: its loss) computes in
    float32 (`logits.float()`, autocast), else float64's."""
    called = "".join(map(source_text, functions_called(fn)))
    return TOLERANCE[bool(FLOAT32.search(source_text(fn) + called))]


def _step_config(fn: Any, candidates: list[str]) -> tuple[str | None, dict[str, str]]:
    """The argument that is the step's configuration (a dataclass of the learner's with defaults), and
    what check reads in it: key -> field ("accum": the micro-steps, "clip": the clipping norm, "lr": a
    setting of the schedule)."""
    for name in candidates:
        config = defaulted_config(fn, name)
        if config is None:
            continue
        fields = [f.name for f in dataclasses.fields(config)]
        found = {"accum": named(fields, ACCUM_NAMES), "clip": named(fields, CLIP_NAMES),
                 "lr": named(sorted(config_reads(fn, name)[1]), SCHEDULE_ARGS["max_lr"])
                 or _schedule_called(fn)}
        return name, dict(filter(lambda item: item[1], found.items()))
    return None, {}


def _run(step: Step, base: nn.Module, make_opt: Any = optimizer, **mistakes: bool) -> list[list[Tensor]]:
    """handformer's two steps (with the mistakes asked for): the parameters after each."""
    model = copy.deepcopy(base)
    opt = make_opt(model)
    out = []
    for (x, y), lr in zip(batches(step.rows), step.rates()):
        reference_step(model, opt, x, y, lr, step.clip, accum=ACCUM if step.micro else 1, **mistakes)
        out.append(parameters_of(model))
    return out


def check_lm_train_step(comp: Component, ctx: Context) -> ComponentResult:
    if pairwise_step(comp):  # a reward model's step on pairs (reward_pair.py)
        return check_pairwise_step(comp, ctx)
    not_next_token(comp)
    res = ctx.result(comp)
    step = Step(comp, ctx)
    base = tiny_model()
    with torch.enable_grad():
        got, right, errs = _drive(step, base)
        res.max_abs_error = max(errs)
        rates = step.rates()
        res.checks.append(Check(text(
            f"AdamW, learning rates {rates[0]:.4g} then {rates[1]:.4g}: the parameters after one and after "
            "two steps equal handformer's step on the same batches",
            f"AdamW，学习率先 {rates[0]:.4g} 后 {rates[1]:.4g}：走完一步、两步之后的参数都与 handformer 的"
            "训练一步在同样 batch 上的结果一致"), max(errs) < step.tol, error_text(max(errs))))
        _notes(res, step)
        res.notes += [FLOAT32_NOTE] * (step.tol > TOL)
        _rate_written(res, comp, step)
        if step.drawn_calls:
            check_windows(res, ctx, getattr(ctx.module, step.drawn), step.drawn_calls[0])
        if max(errs) >= step.tol:
            _search(res, ctx, comp, step, base, got, right, errs)
        if step.clip is not None and not res.findings:  # a loss scale clipping hid, a clipping AdamW hid
            _rescaled(res, ctx, comp, step, base, max(errs) < step.tol, "under")
            _rescaled(res, ctx, comp, step, base, max(errs) < step.tol and not res.findings, "over")
        if max(errs) >= step.tol:
            _localize(res, step, base)
    return finish(res)


def _localize(res: ComponentResult, step: Step, base: nn.Module) -> None:
    """Where the step parts from handformer's (localize_train.py), on a fresh copy of the model."""
    model = copy.deepcopy(base)
    x, y = batches(step.rows)[0]
    note_departure(res, lambda: localize_lm_step(step, model, optimizer(model), x, y, LRS[0]))


def _drive(step: Step, base: nn.Module, make_opt: Any = optimizer,
           ) -> tuple[list[list[Tensor]], list[list[Tensor]], list[float]]:
    """The learner's two steps and handformer's from `base`, each with an optimizer of `make_opt`: the
    parameters after each step, theirs and handformer's, and the largest difference after each."""
    model = copy.deepcopy(base)
    opt = make_opt(model)
    got = []
    for (x, y), lr in zip(batches(step.rows), LRS):
        step(model, opt, x, y, lr)
        got.append(parameters_of(model))
    right = _run(step, base, make_opt)
    return got, right, largest_differences(got, right)


# the gradient norm's factor on the clipping norm and the logits' largest scale: under it, over it
SIDES = {"under": (1 / UNDER_CLIP, PROBE_SCALE), "over": (UNDER_CLIP, float("inf"))}


def _rescaled(res: ComponentResult, ctx: Context, comp: Component, step: Step, base: nn.Module,
              search: bool, side: str) -> None:
    """Both steps again with plain SGD and the logits scaled so that handformer's gradient norm is
    UNDER_CLIP times under the norm the step clips to, or over it (SIDES). Under it, a loss
    k times too large (k <= UNDER_CLIP) is never clipped, and SGD's update is k times handformer's; over
    it, a step that does not clip moves by the whole gradient (AdamW's update barely changes with the
    gradient's scale: the full-size steps hide it). The mistakes that explain a difference are searched
    there when `search` (the full-size steps were equal)."""
    scaled = copy.deepcopy(base)
    scaled.scale = PROBE_SCALE
    x, y = batches(step.rows)[0]
    loss = F.cross_entropy(scaled(x).reshape(-1, VOCAB), y.reshape(-1))
    norm = gradient_norm(loss, list(scaled.parameters()))
    factor, cap = SIDES[side]
    scaled.scale = min(cap, PROBE_SCALE * float(step.clip or 1.0) * factor / max(norm, 1e-12))
    got, right, errs = _drive(step, scaled, sgd)
    res.checks.append(rescaled_check(side, float(step.clip or 1.0), scaled.scale, max(errs), step.tol))
    if max(errs) >= step.tol:
        res.notes += [factor_note(scaled, got[0], right[0])] * (side == "under")
        if search:
            _search(res, ctx, comp, step, scaled, got, right, errs, sgd)


def _notes(res: ComponentResult, step: Step) -> None:
    if step.clip is not None:
        res.notes.append(clip_note(step.clip))
    res.notes += [SCHEDULER_NOTE] * bool(step.sched) + [SCALER_NOTE] * bool(step.scaler)
    if step.listed:
        res.notes.append(text(f"your step takes a list of optimizers ({step.listed}): it was handed a list "
                              "holding the one AdamW of handformer's step",
                              f"你的一步接受一组优化器（{step.listed}）：交给它的列表里只有 handformer "
                              "那一步用的 AdamW"))
    if step.micro:
        rows = step.rows
        said = f"{step.micro}={ACCUM}" if step.micro != step.loader else f"{step.micro}, a list of {ACCUM}"
        res.notes.append(text(f"{said}: each batch of {rows} windows in {ACCUM} micro-batches "
                              "(split along the batch), their gradients accumulated before one update",
                              f"{said}：每个 {rows} 个窗口的 batch 沿 batch 维分成 {ACCUM} 个 "
                              "micro-batch，梯度累加后更新一次"))
    if step.config:
        res.notes.append(config_note(step.config, step._config()))
    if step.keyed:
        res.notes.append(keyed_note(step.keyed))
    if step.own_rate():
        rates = f"{step.seen[0]:.4g}, {step.seen[1]:.4g}"
        source = step.config or step.count
        res.notes.append(text(f"your step sets the learning rate itself from {source}: handformer's "
                              f"step used the rates yours wrote into the optimizer ({rates})",
                              f"你的一步自己根据 {source} 设置学习率：handformer 的一步用你写进"
                              f"优化器的学习率（{rates}）"))
    elif not step.lr:
        res.notes.append(text(f"your step takes no learning rate: compared with steps at the optimizer's "
                              f"{OPT_LR:g} (the schedule must then be set in your loop)",
                              f"你的一步不接收学习率：与按优化器自己的 {OPT_LR:g} 走的步比较"
                              "（学习率调度就得在你的训练循环里设置）"))


def config_note(name: str, config: Any) -> Text:
    """What the step's configuration was handed holding: each setting it reads, at its value."""
    held = ", ".join(f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config))
    return text(f"your step reads its settings from {name}: it was handed {held} (your file's values; "
                f"the micro-batches check's)", f"你的一步从 {name} 读取设置：交给它的是 {held}"
                "（你文件里的值；micro-batch 个数由 check 决定）")


def keyed_note(keyed: KeyedBatch) -> Text:
    """What a step's dict or tuple batch was handed holding."""
    form = "a tuple" if keyed.unpacked else "a dict"
    keys = ", ".join(keyed.keys)
    return text(f"your step reads its batch as {keys}: it was handed {form} of them, the windows (B, T + 1) "
                "under each, ones under a mask", f"你的一步把 batch 读成 {keys}：交给它的是由它们组成的 "
                f"{'tuple' if keyed.unpacked else 'dict'}，每一项都是 (B, T + 1) 的窗口，mask 是全 1")


def _schedule_called(fn: Any) -> str | None:
    """The schedule of the learner's file that the step calls (its rate_at(step, cfg)), or None."""
    schedules = filter(lambda f: kind_of(f) == "schedule", functions_called(fn))
    return getattr(next(schedules, None), "__name__", None)


def _rate_written(res: ComponentResult, comp: Component, step: Step) -> None:
    """A step that reads its schedule's settings but leaves the optimizer at its own rate never wrote
    the scheduled rate into the param groups: train_step_lr_not_set."""
    if "lr" not in step.fields or step.own_rate():
        return
    number, code = locate("train_step_lr_not_set", source_lines([comp.obj]))
    res.findings.append(Finding("train_step_lr_not_set", text(
        f"your step reads its schedule ({step.fields['lr']}) but the optimizer's "
        f"learning rate stayed at its own {OPT_LR:g} after each step",
        f"你的一步读了调度（{step.fields['lr']}），但每一步之后优化器的学习率"
        f"都还是它自己的 {OPT_LR:g}"), number, code))


def _search(res: ComponentResult, ctx: Context, comp: Component, step: Step, base: nn.Module,
            got: list[list[Tensor]], right: list[list[Tensor]], errs: list[float], make_opt: Any = optimizer,
            ) -> None:
    """The first set of MISTAKES (one, then two) whose steps reproduce the learner's parameters."""
    after = clips_after_step(source_text(comp.obj))  # which of the two a step that clips nothing is
    possible = {"train_step_clip_after_step": step.clip is not None and after,
                "train_step_lr_not_set": bool(step.lr), "train_step_loss_not_divided": bool(step.micro),
                "train_step_not_clipped": step.clip is not None and not after}
    for combo, flags in mistake_sets(possible):
        theirs = _run(step, base, make_opt, **flags)
        off = max(largest_differences(got, theirs))
        if off >= step.tol:
            continue
        lines = source_lines([comp.obj])
        for name in combo:  # the labels' line is the localizer's (the patterns find the model's call)
            number, code = locate(name, lines) if name != "train_step_no_shift" else (None, None)
            res.findings.append(Finding(name, text(
                f"your parameters equal those of a step with this mistake (max abs difference {off:.1e}); "
                f"after step 1 they differ from handformer's by {errs[0]:.3g}, after step 2 by {errs[1]:.3g}",
                f"你的参数与带这个错误的一步结果一致（最大绝对误差 {off:.1e}）；与 handformer 的相比，"
                f"一步之后相差 {errs[0]:.3g}，两步之后相差 {errs[1]:.3g}"), number, code))
        return
    res.notes.append(text("no known mistake (or pair of them) reproduces your parameters; see the checks",
                          "没有任何已知错误（或两个错误的组合）能复现你的参数；请看检查项"))
