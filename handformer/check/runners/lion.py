"""The runner of a sign-momentum optimizer written by hand: Lion (Chen et al. 2023, "Symbolic Discovery
of Optimization Algorithms"), told from AdamW by its constructor: betas and no eps (no root to guard).

Its update is standard: c = beta1 * m + (1 - beta1) * g, the weights decayed apart from the gradient
(p *= 1 - lr * weight_decay), p -= lr * sign(c), and only then the momentum m = beta2 * m + (1 - beta2)
* g. Built with SETTINGS, stepped STEPS times on two float64 parameters whose gradients are set
before each step, the parameters after each step are compared with that rule. Where they part, the
step that first parts is run again, traced, and the first line whose value is none of the rule's
sub-steps is quoted.

Shape legend: two parameters, (3, 4) and (4,).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.context import Context, error_text, finish
from handformer.check.core.discovery import Component, with_helpers
from handformer.check.core.localize import View, first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, text

# beta1 and beta2 apart, so a swap shows in the sign; the decay large enough to show where it goes
SETTINGS = {"lr": 0.1, "beta1": 0.8, "beta2": 0.3, "weight_decay": 0.5}
STEPS, TOL = 6, 1e-9


def lion_step(p: Tensor, m: Tensor, g: Tensor, settings: dict[str, float] = SETTINGS) -> list[View]:
    """One parameter's Lion update, each sub-step a view; the last two: the new parameter and momentum."""
    lr, b1, b2, wd = settings.values()
    decayed = p * (1 - lr * wd)
    c = b1 * m + (1 - b1) * g
    new = decayed - lr * c.sign()
    return [("the parameter", p), ("the gradient", g), ("the momentum", m), ("the weights decayed", decayed),
            ("beta1 * m + (1 - beta1) * g", c), ("its sign", c.sign()), ("lr times it", lr * c.sign()),
            ("the weight decay term", lr * wd * p), ("the update with the decay", lr * (c.sign() + wd * p)),
            ("the new parameter", new), ("the new momentum", b2 * m + (1 - b2) * g)]


def lion(start: Tensor, grads: Tensor, settings: dict[str, float],
         ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """The parameters after each step, (STEPS, N), and each step's (parameters, momenta) before it,
    all parameters as one vector (Lion's update is elementwise)."""
    p, m, out, states = start, torch.zeros_like(start), [], []
    for g in grads:
        states.append((p, m))
        *_, (_, p), (_, m) = lion_step(p, m, g, settings)
        out.append(p)
    return torch.stack(out), states


LION_NAMES = {"lr", "learning_rate", "betas", "beta1", "beta2", "b1", "b2", "weight_decay", "wd"}


def takes_lion(cls: Any) -> bool:
    """A sign-momentum optimizer: its constructor takes betas and no other setting (no eps: no root to
    guard; switches aside), its code takes a sign (an optimizer with betas that updates otherwise is no
    Lion: NOT CHECKED, not compared)."""
    params = list(inspect.signature(cls).parameters.values())[1:]  # after the parameters
    names = {p.name.lower() for p in params}
    # a setting of its own besides Lion's (Sophia's rho and its Hessian): another rule; switches are kept
    own = [p for p in params if p.kind in SETTING_KINDS and type(p.default) not in (bool, type(None))
           and p.name.lower() not in LION_NAMES]
    signs = re.search(r"\bsign_?\(", with_helpers(cls)) is not None
    return signs and bool(names & {"betas", "beta1", "b1"}) and not own


SETTING_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
ALIASES = {"lr": "learning_rate", "beta1": "b1", "beta2": "b2", "weight_decay": "wd"}


def taken(cls: Any) -> dict[str, float]:
    """SETTINGS, with no weight decay where the constructor takes none."""
    names = {n.lower() for n in inspect.signature(cls).parameters}
    return SETTINGS | {"weight_decay": SETTINGS["weight_decay"] * bool(names & {"weight_decay", "wd"})}


def settings_arguments(cls: Any) -> dict[str, Any]:
    """SETTINGS under the constructor's names (betas as a pair where it takes them)."""
    names = {n.lower(): n for n in inspect.signature(cls).parameters}
    names = {key: names[alias] for key, alias in ALIASES.items() if alias in names} | names
    out = {names[k]: v for k, v in taken(cls).items() if k in names}
    betas = {names["betas"]: (SETTINGS["beta1"], SETTINGS["beta2"])} if "betas" in names else {}
    return out | betas


def check_lion(comp: Component, ctx: Context, build: Any) -> ComponentResult:
    """The learner's optimizer (`build(params)` makes it) against Lion's rule, step by step."""
    res = ctx.result(comp)
    start, grads = _data()
    got = _stepped(ctx, build, start, grads, STEPS, (), [])
    settings = taken(comp.obj)
    want, states = lion(start, grads, settings)
    err = float((got - want).abs().max().nan_to_num(float("inf")))
    res.max_abs_error = err
    shown = ", ".join(f"{k} {v:g}" for k, v in settings.items())
    res.checks.append(Check(
        text(f"the parameters after each of {STEPS} steps equal Lion's: the weights decayed, then "
             f"lr * sign(beta1 * m + (1 - beta1) * g), then m = beta2 * m + (1 - beta2) * g ({shown})",
             f"{STEPS} 步中每一步之后的参数都等于 Lion 的：先衰减权重，再减 lr * sign(beta1 * m + "
             f"(1 - beta1) * g)，最后 m = beta2 * m + (1 - beta2) * g（{shown}）"),
        err < TOL, error_text(err)))
    if err >= TOL:
        at = int(((got - want).abs() > TOL).any(-1).float().argmax())  # the first step that parts
        note_departure(res, lambda: _localize(comp, ctx, build, (start, grads), at, (states, settings)))
    return finish(res)


SHAPES = ((3, 4), (4,))  # the two parameters, as one vector of 16 numbers in the reference


def _data() -> tuple[Tensor, Tensor]:
    """The parameters (16,) and their gradients at each step (STEPS, 16) (seeded, float64)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(16, generator=gen, dtype=torch.float64), torch.randn(STEPS, 16, generator=gen,
                                                                             dtype=torch.float64)


def _shaped(flat: Tensor) -> list[Tensor]:
    """One vector of 16 as the two parameters, (3, 4) and (4,)."""
    return [part.reshape(shape) for part, shape in zip(flat.split([12, 4]), SHAPES)]


def _stepped(ctx: Context, build: Any, start: Tensor, grads: Tensor, steps: int,
             traced: tuple[int, ...], into: list[Any]) -> Tensor:
    """The learner's optimizer built on the two parameters of `start`, stepped `steps` times, the steps
    numbered in `traced` (from 0) traced into `into`. The parameters after each step, (steps, 16)."""
    params = list(map(nn.Parameter, _shaped(start.clone())))
    opt, out = build(params), []
    filename = inspect.getsourcefile(type(opt))
    for n, flat in enumerate(grads[:steps]):
        for p, g in zip(params, _shaped(flat.clone())):
            p.grad = g
        # every write, in place too (`exp_avg.mul_(beta2)`): an optimizer's state changes so
        steps_of = trace_steps if n in traced else _untraced
        into.extend(steps_of(lambda: ctx.learner.call("forward", opt.step), filename, None, (),
                                     constants=True, every=True))
        out.append(torch.cat([p.detach().flatten() for p in params]))
    return torch.stack(out)


def _untraced(run: Any, *args: Any, **kwargs: Any) -> list[Any]:
    run()
    return []


def _localize(comp: Component, ctx: Context, build: Any, data: tuple[Tensor, Tensor], at: int,
              held: tuple[list[tuple[Tensor, Tensor]], dict[str, float]]) -> Any:
    """The step that first parts (`at`) and the one before it (where a momentum written wrong is
    written) traced: the first line whose value is none of Lion's sub-steps from the parameters and
    momenta the rule holds before each."""
    (start, grads), steps = data, []
    traced = tuple(range(max(at - 1, 0), at + 1))
    _stepped(ctx, build, start, grads, at + 1, traced, steps)
    states, settings = held
    flat = [v for n in traced for v in lion_step(*states[n], grads[n], settings)]
    views = [(what, part) for what, v in flat for part in _shaped(v)]  # each parameter's
    return first_departure(steps, views, inspect.getsourcefile(comp.obj), {"lr": SETTINGS["lr"]})
