"""The runner of a language model's training step that writes AdamW's update inside itself (the "AdamW
by hand" tutorials' `train_step(model, x, y, state, step, lr, betas, eps, weight_decay)`): no optimizer
is handed, the step updates the parameters with the moments it keeps in a state of its own.

The step is handed the tiny model and windows of lm_train_step.py, the update count 1 then 2 (or 0
then 1: counted from 0, a convention), its settings at optimizer.py's SETTINGS where it takes them by
name, and its state as the file's function of the model alone builds it (`init_adam_state(model)`).
The parameters after each step are compared with handformer's step: the cross-entropy of the logits
against y, backward, then AdamW's update (optimizer.py's adamw_update) under each of its conventions,
the named mistakes and their pairs tried when none matches.

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core.argument_names import SCHEDULE_STEP_NAMES, STEP_MODEL_NAMES, X_NAMES, Y_NAMES
from handformer.check.core.context import Context, finish, forward_parameters, named, names_of
from handformer.check.core.discovery import Component, DiscoveryError, own_objects
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.step_updates import largest_differences, parameters_of
from handformer.check.runners.optimizer import (
    CONVENTIONS,
    TRIED,
    adamw_finding,
    adamw_update,
    settings_arguments,
    settings_taken,
)
from handformer.check.runners.step_model import VOCAB, batches, tiny_model

TOL = 1e-9
COUNTINGS = {1: text("the update count handed from 1", "更新次数从 1 开始传"),
             0: text("the update count handed from 0 (your step adds 1)",
                     "更新次数从 0 开始传（你的一步自己加 1）")}


class AdamStep:
    """How to call the learner's step: the model, x, y, the update count, its settings and its state."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        names, required = names_of(forward_parameters(comp.obj))
        self.model, self.x, self.y = (named(names, n) for n in (STEP_MODEL_NAMES, X_NAMES, Y_NAMES))
        self.count = named(names, SCHEDULE_STEP_NAMES + ("t", "timestep", "num_updates"))
        self.settings = settings_arguments(comp.obj)  # lr, betas, eps, weight_decay under their names
        rest = sorted(set(required) - {self.model, self.x, self.y, self.count, *self.settings})
        self.state, self.maker = (rest + [None])[0], _state_maker(comp.obj)
        if len(rest) > (self.maker is not None) or None in (self.model, self.x, self.y):
            raise DiscoveryError(
                f"{comp.name}: a step that writes AdamW's update itself is driven as (model, x, y, state, "
                "step, lr, betas, eps, weight_decay), its state built by a function of the file that takes "
                f"the model alone; it cannot fill {', '.join(rest) or 'the model, x or y'}",
                zh=f"{comp.name}：自己写 AdamW 更新的一步按 (model, x, y, state, step, lr, betas, eps, "
                   "weight_decay) 调用，state 由文件里只接受模型的函数构造；它填不了"
                   f"{'、'.join(rest) or 'model、x 或 y'}")

    def run(self, base: nn.Module, first: int) -> list[list[Tensor]]:
        """Its two steps on a copy of `base`, the count from `first`: the parameters after each."""
        model = copy.deepcopy(base)
        state = self.ctx.learner.call("__init__", self.maker or _no_state, model)
        kwargs: dict[Any, Any] = {self.model: model, **self.settings, self.state: state}
        out = []
        for n, (x, y) in enumerate(batches(), first):
            kwargs.update({self.x: x.clone(), self.y: y.clone(), self.count: n})
            kwargs.pop(None, None)  # no count, or no state, taken
            self.ctx.learner.call("forward", self.comp.obj, **kwargs)
            out.append(parameters_of(model))
        return out


def _no_state(model: nn.Module) -> None:
    """What a step that keeps no state in an argument is handed there (nothing: the key is dropped)."""


def _state_maker(fn: Any) -> Any:
    """The file's function that builds the step's state from the model alone (`init_adam_state(model)`)."""
    own = own_objects(sys.modules[fn.__module__])
    makers = (f for name, f in own.items() if "state" in name.lower() and inspect.isfunction(f)
              and len(names_of(forward_parameters(f))[1]) == 1)
    return next(makers, None)


def reference(base: nn.Module, convention: tuple[bool, bool], flags: frozenset[str],
              settings: dict[str, float]) -> list[list[Tensor]]:
    """handformer's two steps: the cross-entropy of the logits against y, backward, AdamW's update."""
    model = copy.deepcopy(base)
    params = list(model.parameters())
    moments: list[tuple[Any, Any]] = [(0.0, 0.0)] * len(params)
    out = []
    for t, (x, y) in enumerate(batches(), 1):
        with torch.enable_grad():
            grads = torch.autograd.grad(F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)), params)
        for i, (p, g) in enumerate(zip(params, grads)):
            new, moments[i] = adamw_update(p.detach(), g, moments[i], t, convention, flags, settings)
            p.data.copy_(new)
        out.append(parameters_of(model))
    return out


def check_adam_step(comp: Component, ctx: Context) -> ComponentResult:
    """The step's parameters against handformer's under each counting, convention and set of mistakes."""
    res = ComponentResult(comp.kind, comp.name)
    step, base = AdamStep(comp, ctx), tiny_model()
    settings = settings_taken(comp.obj)  # no weight decay taken: Adam
    with torch.enable_grad():
        runs = {first: step.run(base, first) for first in (1, 0)[:1 + bool(step.count)]}
    readings = itertools.product(TRIED, CONVENTIONS, runs)
    found = next((r for r in readings if _error(runs[r[2]], reference(base, r[1], r[0], settings)) < TOL),
                 None)
    flags, conv, first = found or (frozenset(), (False, False), 1)
    res.max_abs_error = _error(runs[first], reference(base, conv, frozenset(), settings))
    res.checks.append(Check(text("the parameters after one and after two steps equal handformer's step with "
                                 "AdamW's update",
                                 "走完一步、两步之后的参数都等于 handformer 用 AdamW 更新的一步"),
                            res.max_abs_error < TOL, text(f"largest difference {res.max_abs_error:.3g}",
                                                          f"最大误差 {res.max_abs_error:.3g}")))
    res.convention = CONVENTIONS[conv]
    res.notes += [COUNTINGS[first]] * bool(step.count)
    res.findings += [adamw_finding(ctx, comp, flag, res.max_abs_error, 2) for flag in sorted(flags)]
    return finish(res)


def _error(got: list[list[Tensor]], right: list[list[Tensor]]) -> float:
    """The largest difference after either step (NaN: none matches, inf)."""
    errs = torch.tensor(largest_differences(got, right))
    return float(errs.nan_to_num(math.inf).max())
