"""The runner of a classifier's training step, `train_step(model, images, labels, optimizer)` (a
ViT tutorial's): the model called on its inputs alone, `model(images)` giving logits (B, C), the loss
the cross-entropy of those logits against the labels (B,). Found by what the step does: besides the
model, the optimizer, a criterion and the labels (by their names) it takes one input, and its code
calls the model on that input alone.

The probe: a tiny classifier (an MLP on the flattened inputs, float64, no dropout) handed over in
eval mode, plain SGD, and two batches of (B, 3, 4, 4) inputs with their labels. The learner's step runs
on both; the parameters after each must equal handformer's step from the same start: zero_grad,
the cross-entropy, backward, the gradients clipped (where the learner's step clips, at its norm),
step. Named: the gradients never zeroed (step 2 adds step 1's), the
model never put in training mode (every call ran in eval mode).

Shape legend: B batch, C classes.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core.argument_names import (
    CRITERION_NAMES,
    OPTIMIZER_NAMES,
    STEP_MODEL_NAMES,
    TGT_NAMES,
    named_each,
)
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.core.step_updates import largest_difference, parameters_of, update

B, C, LR, TOL = 4, 5, 0.5, 1e-9
ROLES = {"model": STEP_MODEL_NAMES, "optimizer": OPTIMIZER_NAMES, "labels": TGT_NAMES,
         "criterion": CRITERION_NAMES}
KNOWN = sum(ROLES.values(), ())


def roles(fn: Any) -> dict[str, str | None] | None:
    """Each role of a classifier's step (model, optimizer, labels, criterion, input) -> its argument's
    name (None: a criterion it does not take); None where the step is no classifier's: it must take a
    model, an optimizer and labels by their names, one more argument without a default, and call the
    model on that argument alone."""
    params = forward_parameters(fn)
    found = named_each([p.name for p in params], ROLES)
    inputs = [p.name for p in params if p.default is p.empty and p.name.lower() not in KNOWN]
    takes = None not in (found["model"], found["optimizer"], found["labels"]) and len(inputs) == 1
    call = rf"\b{found['model']}\(\s*{''.join(inputs)}\s*\)"  # model(images)
    return {**found, "input": inputs[0]} if takes and re.search(call, source_text(fn)) else None


class Recorded(nn.Module):
    """The classifier handed to the learner: (B, 3, 4, 4) inputs -> (B, C) logits; the mode of every
    call is recorded."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(48, 16), nn.Tanh(), nn.Linear(16, C)).double()
        self.calls: list[bool] = []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append(self.training)
        return self.net(x)


def batches() -> list[tuple[Tensor, Tensor]]:
    """Two batches: inputs (B, 3, 4, 4) and labels (B,)."""
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(B, 3, 4, 4, generator=g, dtype=torch.float64),
             torch.randint(0, C, (B,), generator=g)) for _ in range(2)]


def parameters_after(step: Any) -> tuple[Recorded, list[list[Tensor]]]:
    """A fresh classifier in eval mode and SGD, `step(model, optimizer, x, labels)` on each batch: the
    model and its parameters after each step."""
    model = Recorded().eval()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for x, labels in batches():
        step(model, opt, x, labels)
        out.append(parameters_of(model))
    return model, out


def reference(clip: float | None, zero_grad: bool = True) -> Any:
    """handformer's step, the gradients clipped at `clip` where the learner's step clips (`zero_grad`
    False: the gradients never zeroed)."""
    def step(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, labels: Tensor) -> None:
        model.train()
        if zero_grad:
            opt.zero_grad()
        F.cross_entropy(model(x), labels).backward()
        update(model, opt, clip or None)  # a clip of 0 (or none): not clipped
    return step


def largest(a: list[list[Tensor]], b: list[list[Tensor]]) -> float:
    return max(largest_difference(s, t) for s, t in zip(a, b))


COMPARED = text("the parameters after each of 2 steps equal handformer's step's (SGD, the cross-entropy of "
                "model(input) against the labels)",
                "两步中每一步之后的参数与 handformer 的一步相同（SGD，model(input) 对 labels 的交叉熵）")
DRIVEN = text("a classifier's step: driven with a tiny classifier, model(input) -> (B, C) logits",
              "分类器的训练步：用一个很小的分类器驱动，model(input) -> (B, C) logits")
NOT_ZEROED = text("your parameters equal those of a step that never zeroes the gradients: step 2 adds "
                  "step 1's",
                  "你的参数与从不清零梯度的一步结果一致：第 2 步加上了第 1 步的梯度")


def check_classifier_step(comp: Component, ctx: Context, named: dict[str, str | None], clip: float | None,
                          ) -> ComponentResult:
    """The step of `named` roles (`roles`) against handformer's, clipped at `clip` as the learner's."""
    res = ctx.result(comp)

    def learners(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, labels: Tensor) -> Any:
        given = {"model": model, "optimizer": opt, "input": x, "labels": labels,
                 "criterion": nn.CrossEntropyLoss()}
        return ctx.learner.call("forward", comp.obj, **{named[r]: v for r, v in given.items() if named[r]})

    with torch.enable_grad():
        model, got = parameters_after(learners)
        err = res.max_abs_error = largest(got, parameters_after(reference(clip))[1])
        res.checks.append(Check(COMPARED, err < TOL, error_text(err)))
        if err >= TOL and largest(got, parameters_after(reference(clip, zero_grad=False))[1]) < TOL:
            res.findings.append(_finding(comp, "train_step_no_zero_grad", NOT_ZEROED))
    if model.calls and not any(model.calls):
        res.findings.append(_finding(comp, "train_step_eval_mode", text(
            f"the model was handed over in eval mode and your step ran all {len(model.calls)} of its calls "
            "so",
            f"模型交给你时处于 eval 模式，你的一步在全部 {len(model.calls)} 次调用里都这样运行它")))
    res.notes.append(DRIVEN)
    return finish(res)


def _finding(comp: Component, name: str, observed: Any) -> Finding:
    number, code = locate(name, source_lines([comp.obj]))
    return Finding(name, observed, number, code)

