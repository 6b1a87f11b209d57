"""Runner of a language model's training loop written as one function that builds its own optimizer
(nanoGPT's train.py as `train(model, data)`: `optimizer = configure_optimizers(model, ...)`, then each
iteration sets the rate, draws its micro-batches from a function of its file, backpropagates, clips and
steps). The loop is handed handformer's stand-in model (step_model.py) and a token stream for its data;
the function it draws from hands out the micro-batches of two batches in turn (draws without
gradients or in eval mode, an evaluation's, get the first and move nothing on), and the loop is stopped
at its third optimizer step. At each step the optimizer it built is recorded, with each group's learning rate:
handformer's two steps use the same optimizer (its class and groups) at the same rates from the same
start, so the optimizer, whatever it is, and the schedule are the learner's, and what is compared is
the step. A loop that clips runs again with the logits scaled down until the gradients stay well under
its norm (a loss of the wrong scale shows) and up until they are well over it (a clipping after the
step shows: the optimizer sees the ratio of two steps' factors).

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_pre_hook

from handformer.check.core.argument_names import ACCUM_NAMES, STEP_MODEL_NAMES
from handformer.check.core.carried import carried_note, carry
from handformer.check.core.clipping import clip_norm, clips_after_step
from handformer.check.core.context import (
    Context,
    error_text,
    finish,
    forward_parameters,
    globals_set,
    named,
    names_of,
)
from handformer.check.core.defaults import keyword, then
from handformer.check.core.discovery import Component
from handformer.check.core.fingerprint import LearnerFailure
from handformer.check.core.loop_forms import accumulation_count
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.signatures import drawn_global
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.core.step_updates import gradient_norm, largest_differences, parameters_of
from handformer.check.runners.lm_train_step import mistake_sets, reference_step
from handformer.check.runners.step_model import BATCH, POSITIONS, VOCAB, batches, tiny_model
from handformer.check.runners.train_step import (
    ACCUM,
    FLOAT32,
    FLOAT32_NOTE,
    PROBE_SCALE,
    TOLERANCE,
    UNDER_CLIP,
    clip_note,
    factor_note,
)

# the data a loop is handed: its draws are check's windows anyway (a literal: the fork server computes
# nothing)
STREAM = torch.tensor((list(range(VOCAB)) * 64)[:64])  # 0 .. V-1 over and over


class Stopped(BaseException):
    """Raised at the loop's third optimizer step (a BaseException: its `except Exception` lets it by)."""


class Draws:
    """The stand-in of the function the loop draws its windows from: the micro-batches of check's two
    batches in turn; a draw without gradients or with the model in eval mode (an evaluation's) gets the
    first and moves nothing on."""

    def __init__(self, parts: list[tuple[Tensor, Tensor]], model: nn.Module) -> None:
        self.parts, self.drawn, self.model = parts, 0, model

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        moved = all((torch.is_grad_enabled(), self.model.training))  # a training draw
        self.drawn += moved
        x, y = self.parts[(self.drawn - 1) * moved % len(self.parts)]
        return x.clone(), y.clone()


class Loop:
    """How to run the learner's loop, and what it did: the optimizer it built, the rates at each step and
    the parameters after each."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        names, required = names_of(forward_parameters(comp.obj))
        self.model, self.drawn = named(names, STEP_MODEL_NAMES), drawn_global(comp.obj, handed=True)
        self.data = [n for n in required if n != self.model]  # handed the token stream
        ints = [n for n in comp.obj.__code__.co_names if type(vars(ctx.module).get(n)) is int]
        count = accumulation_count(comp.obj)  # range(accum) around its backward: however it is named
        ints_argued = [p.name for p in forward_parameters(comp.obj) if type(p.default) is int]
        # its micro-steps, a global of its file or an argument of the loop's own: set to ACCUM
        self.argued = named(ints_argued, (*ACCUM_NAMES, count.lower()))
        self.held = self.argued or named(ints, (*ACCUM_NAMES, count.lower()))
        self.rows = BATCH * ACCUM if self.held else BATCH
        numbers = {k: v for k, v in vars(ctx.module).items() if type(v) in (int, float)}
        self.clip = clip_norm(source_text(comp.obj), numbers)  # clip_grad_norm_(..., grad_clip): its global
        self.tol = TOLERANCE[bool(FLOAT32.search(source_text(comp.obj)))]  # logits.float(): float32's
        self.opt: Any = None
        self.fresh: dict[str, Any] = {}  # the optimizer's own plain settings before its first step
        self.carried: list[tuple[str, Any]] = []  # what the stand-in was given that the loop reads off it
        self.rates: list[list[float | None]] = []  # None: an optimizer that sets its own (Adafactor's)
        self.after: list[list[Tensor]] = []

    def run(self, model: nn.Module) -> None:
        """The loop on `model` until its third optimizer step (or its end)."""
        self.opt, self.rates, self.after = None, [], []
        cut = self.rows // BATCH  # the micro-batches of a batch
        parts = [p for x, y in batches(self.rows) for p in zip(x.chunk(cut), y.chunk(cut))]

        def seen(opt: torch.optim.Optimizer, *_: Any) -> None:
            self.after += [parameters_of(model)] * bool(self.rates)  # the parameters after the step before
            if len(self.rates) == 2 or self.opt not in (None, opt):
                raise Stopped
            self.fresh = {**_plain_settings(opt), **self.fresh}  # as it was before its first step
            self.opt = opt
            self.rates.append([then(g["lr"], float) for g in opt.param_groups])

        stand_in = {self.drawn: Draws(parts, model), **(keyword(self.held, ACCUM) if not self.argued else {})}
        self.carried = carry(model, self.comp.obj, self.model, {"context": POSITIONS, "vocab": VOCAB})
        hook = register_optimizer_step_pre_hook(seen)
        try:
            with globals_set(self.ctx.module, stand_in):
                self.ctx.learner.call("forward", self.comp.obj, **{self.model: model},
                                      **{n: STREAM.clone() for n in self.data}, **keyword(self.argued, ACCUM))
        except Stopped:
            pass
        except LearnerFailure:  # after its steps (a sample printed with the stand-in): the steps are graded
            if not self.rates:
                raise
        finally:
            hook.remove()
        self.after += [parameters_of(model)] * (len(self.after) < len(self.rates))

    def built(self, model: nn.Module) -> torch.optim.Optimizer:
        """The optimizer the loop built (its class and groups), on `model`'s parameters."""
        index = {id(p): i for i, p in enumerate(self.learner_params)}
        params = list(model.parameters())
        groups = [{**g, "params": [params[index[id(p)]] for p in g["params"]]} for g in self.opt.param_groups]
        cls = type(self.opt)
        try:
            return cls(groups, **self.opt.defaults)
        except TypeError:  # a constructor of its own that takes other settings: the base class's
            opt = cls.__new__(cls)
            torch.optim.Optimizer.__init__(opt, groups, dict(self.opt.defaults))
            vars(opt).update({**self.fresh, **vars(opt)})  # its own counters, where the base class has none
            return opt

    def reference(self, base: nn.Module, **mistakes: bool) -> list[list[Tensor]]:
        """handformer's steps (with the mistakes asked for) with the loop's optimizer at its rates."""
        model = copy.deepcopy(base)
        opt = self.built(model)
        out = []
        for (x, y), rates in zip(batches(self.rows), self.rates):
            for group, rate in zip(opt.param_groups, rates):
                group["lr"] = rate
            reference_step(model, opt, x, y, None, self.clip, accum=ACCUM if self.held else 1, **mistakes)
            out.append(parameters_of(model))
        return out

    def drive(self, base: nn.Module) -> tuple[list[list[Tensor]], list[list[Tensor]], list[float]]:
        model = copy.deepcopy(base)
        self.learner_params = list(model.parameters())
        self.run(model)
        stepped = {id(p) for g in getattr(self.opt, "param_groups", ()) for p in g["params"]}
        if not 0 < len(stepped & set(map(id, self.learner_params))) == len(stepped):  # none, or others
            raise self.ctx.learner.fail("forward", "your loop stepped no optimizer of the model handed to it",
                                        "你的训练循环没有对交给它的模型执行任何一次优化器更新")
        right = self.reference(base)
        return self.after, right, largest_differences(self.after, right)


def _plain_settings(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The numbers, strings and flags an optimizer of the learner's keeps on itself (`self.steps = 0` of
    a constructor check cannot call with the groups): what a copy built without it starts from."""
    return {k: v for k, v in vars(opt).items() if type(v) in (int, float, bool, str)}


def check_lm_train_loop(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    loop, base = Loop(comp, ctx), tiny_model()
    with torch.enable_grad():
        got, right, errs = loop.drive(base)
        res.max_abs_error = max(errs)
        name = type(loop.opt).__name__
        res.checks.append(Check(text(
            f"your loop's own {name} at the rates it set: the parameters after each of its steps "
            f"({len(got)}) equal handformer's steps on the same batches",
            f"你的循环自己的 {name}，用它设置的学习率：它的每一步（{len(got)} 步）之后的参数都与 "
            "handformer 的训练一步在同样 batch 上的结果一致"), max(errs) < loop.tol, error_text(max(errs))))
        _notes(res, loop, name)
        if max(errs) >= loop.tol:
            _search(res, comp, loop, base, got)
        for side in ("under", "over") * (loop.clip is not None):
            if not res.findings:
                _rescaled(res, comp, loop, base, side)
    return finish(res)


# by side: the gradient norm's factor on the clipping norm, the logits' largest scale, what the run shows
SIDES = {"under": (1 / UNDER_CLIP, PROBE_SCALE, "under", "小于", "the loss is not scaled",
                   "损失没有被放大或缩小"),
         "over": (UNDER_CLIP, float("inf"), "over", "大于", "the gradient is clipped before the step",
                  "梯度在更新之前被裁剪了")}


def _rescaled(res: ComponentResult, comp: Component, loop: Loop, base: Any, side: str) -> None:
    """The loop again with the logits scaled so that handformer's gradient norm is UNDER_CLIP times under
    (or over) the loop's clipping norm: under it a loss k times too large is never clipped, over it every
    step is, with a factor of its own (its optimizer sees the ratio of two steps' factors): both show."""
    scaled = copy.deepcopy(base)
    scaled.scale = PROBE_SCALE
    x, y = batches(loop.rows)[0]
    loss = F.cross_entropy(scaled(x).reshape(-1, VOCAB), y.reshape(-1))
    norm = gradient_norm(loss, list(scaled.parameters()))
    factor, cap, en, zh, says, says_zh = SIDES[side]
    scaled.scale = min(cap, PROBE_SCALE * float(loop.clip) * factor / max(norm, 1e-12))
    got, right, errs = loop.drive(scaled)
    res.max_abs_error = max(res.max_abs_error or 0.0, max(errs))
    res.checks.append(Check(text(
        f"with the gradients {en} the clipping norm {loop.clip:g} (the logits scaled by {scaled.scale:.1e}), "
        f"the parameters still equal handformer's: {says}",
        f"梯度{zh}裁剪范数 {loop.clip:g} 时（logits 乘以 {scaled.scale:.1e}），参数仍与 handformer 的一致："
        f"{says_zh}"), max(errs) < loop.tol, error_text(max(errs))))
    if max(errs) >= loop.tol:
        res.notes += [factor_note(scaled, got[0], right[0])] * (side == "under")
        _search(res, comp, loop, scaled, got)


def _search(res: ComponentResult, comp: Component, loop: Loop, base: Any, got: list[list[Tensor]]) -> None:
    """The first set of the step's MISTAKES (one, then two) whose steps reproduce the loop's parameters."""
    after, clips = clips_after_step(source_text(comp.obj)), loop.clip is not None
    possible = {"train_step_clip_after_step": clips & after, "train_step_lr_not_set": False,
                "train_step_loss_not_divided": bool(loop.held), "train_step_not_clipped": clips & (not after)}
    for combo, flags in mistake_sets(possible):
        theirs = loop.reference(base, **flags)
        off = max(largest_differences(got, theirs))
        if off >= loop.tol:
            continue
        for name in combo:
            quoted = name != "train_step_no_shift"  # the labels' line: none the patterns find
            number, code = locate(name, source_lines([comp.obj])) if quoted else (None, None)
            res.findings.append(Finding(name, text(
                f"your parameters equal those of a step with this mistake (max abs difference {off:.1e})",
                f"你的参数与带这个错误的一步结果一致（最大绝对误差 {off:.1e}）"), number, code))
        return


def _notes(res: ComponentResult, loop: Loop, name: str) -> None:
    rates = "; ".join(", ".join("None" if r is None else f"{r:.4g}" for r in step) for step in loop.rates)
    res.notes.append(text(
        f"your loop builds its own optimizer ({name}) and sets its rates; it was stopped after two of them, "
        f"and handformer's steps used the same optimizer at the rates yours set (by step, by group: {rates})",
        f"你的循环自己构建优化器（{name}）并设置学习率；跑完两次更新后被停下，handformer 的每一步用同样的"
        f"优化器和你设置的学习率（按步、按参数组：{rates}）"))
    res.notes += [FLOAT32_NOTE] * (loop.tol > min(TOLERANCE.values())) + carried_note(loop.carried)
    if loop.clip is not None:
        res.notes.append(clip_note(loop.clip))
    if loop.held:
        res.notes.append(text(f"{loop.held}={ACCUM}: each batch of {loop.rows} windows in {ACCUM} "
                              "micro-batches drawn in turn, their gradients accumulated before one update",
                              f"{loop.held}={ACCUM}：每个 {loop.rows} 个窗口的 batch 分成 {ACCUM} 个 "
                              "micro-batch 依次取出，梯度累加后更新一次"))
