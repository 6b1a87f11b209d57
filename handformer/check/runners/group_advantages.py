"""Runner of GRPO's group-normalised advantages, `compute_advantages(rewards, group_size, eps)`: the
rewards of G completions of each prompt, one after another, each less its group's mean and over its
group's standard deviation (unbiased, torch's default, or not), (r - mean) / (std + eps). Not GAE: it
takes no values, no gamma, no lambda.

Handed six rewards in two groups of three (the group size by its parameter's name: group_size,
num_generations, ...), and eps 1e-6 where it takes one; one that writes its eps inside is compared at
each of EPSILONS, the one that fits. A function that computes no deviation at all (Dr. GRPO's mean only)
is compared with the rewards less their group's mean, noted. Where it differs, the first line whose
value is none of the reference's steps is quoted.

Shape legend: N rewards (groups x G), G completions a group.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.context import Context, error_text, finish
from handformer.check.core.discovery import Component
from handformer.check.core.localize import first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.source import code_text
from handformer.check.runners.ppo import apart, arguments_by_role, called_by_role, settings_notes, tensors_of

G, EPS, TOL = 3, 1e-6, 1e-9
EPSILONS = (1e-4, 1e-5, 1e-6, 1e-8, 0.0)  # the eps a function that takes none may write inside
REWARDS = (1.0, 0.0, 0.75, 2.0, -1.0, 0.25)  # two groups of G: no mean equals a deviation
ROLES = {"eps": "eps", "group": "group|num_gen|n_gen|generations|^g$|^n$|samples", "rewards": "reward|score"}
DEVIATION = re.compile(r"\bstd\b|\.std\(|\bvar\b|\.var\(")  # a deviation it computes


def views(rewards: Tensor, eps: float, unbiased: bool) -> list[tuple[str, Tensor]]:
    """The reference's steps, each group a row (N / G, G), and flat."""
    grouped = rewards.view(-1, G)  # (N / G, G)
    mean, std = grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True, unbiased=unbiased)
    centred = grouped - mean
    adv = centred / (std + eps)
    each = lambda x: x.expand_as(grouped).reshape(-1)  # noqa: E731  (N,): a group's, at each of its rewards
    return [("the groups", grouped), ("each group's mean", mean), ("each group's deviation", std),
            ("each reward's group mean", each(mean)), ("each reward's group deviation", each(std)),
            ("the rewards less their group's mean", centred), ("the advantages", adv),
            ("the advantages (flat)", adv.reshape(-1))]


def check_group_advantages(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    given: dict[str, Any] = {"rewards": rewards, "group": G, "eps": EPS}
    roles = arguments_by_role(comp, ROLES, given, ("rewards", "group"))
    call = called_by_role(ctx, comp, roles, given)
    res.notes += settings_notes(comp, roles, ROLES, given)
    got = tensors_of(call())[0].reshape(-1)
    epsilons = (EPS,) if "eps" in roles.values() else EPSILONS
    forms = {(name, eps): ref for eps in epsilons
             for name, ref in _forms(rewards, eps, bool(DEVIATION.search(code_text(comp.obj)))).items()}
    errors = {key: apart(got, ref) for key, ref in forms.items()}
    (form, eps) = min(errors, key=errors.get)
    res.max_abs_error = err = errors[form, eps]
    res.notes.append(text(f"compared as {form}, eps {eps:g}", f"按{FORMS_ZH[form]}比较，eps {eps:g}"))
    res.checks.append(Check(text(
        f"two groups of {G} rewards: each reward less its group's mean, over the group's deviation plus eps",
        f"两组、每组 {G} 个奖励：每个奖励减去本组均值，再除以本组标准差加 eps"), err < TOL, error_text(err)))
    if err >= TOL:
        steps = views(rewards, eps, form != "the deviation biased")
        note_departure(res, lambda: _localize(comp, call, rewards, steps))
    return finish(res)


def _localize(comp: Component, call: Any, rewards: Tensor, steps: list[tuple[str, Tensor]]) -> Any:
    """The first line whose value is none of the reference's steps; what it returns judged against the
    advantages alone (a return of the centred rewards departs there)."""
    filename = inspect.getsourcefile(comp.obj)
    traced = trace_steps(lambda: call(rewards=rewards.clone().requires_grad_()), filename)
    return first_departure(traced, steps, filename, {"G": G}, ends=steps[-2:])


FORMS_ZH = {"the deviation unbiased": "无偏标准差", "the deviation biased": "有偏标准差",
            "the mean only (no deviation computed)": "只减均值（没有算标准差）"}


def _forms(rewards: Tensor, eps: float, deviation: bool) -> dict[str, Tensor]:
    """The reference's advantages (N,) in each form its code may be written in, at this eps."""
    kinds = ((True, "unbiased"), (False, "biased"))
    out = {f"the deviation {word}": views(rewards, eps, u)[-1][1] for u, word in kinds}
    if not deviation:  # Dr. GRPO: centred only
        out["the mean only (no deviation computed)"] = views(rewards, eps, True)[5][1].reshape(-1)
    return out

