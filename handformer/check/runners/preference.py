"""Runners of direct preference optimization's two parts (the DPO paper; eric-mitchell's trainers.py
and TRL write them so): `get_batch_logps(logits, labels, ...)`, each row's log-probability of its
labels, the labels one position on from the logits, those masked (-100) left out; and
`dpo_loss(policy_chosen_logps, policy_rejected_logps, reference_chosen_logps,
reference_rejected_logps, beta)`, -log sigmoid(beta * (the policy's log-ratio of chosen to rejected
less the reference's)), per pair or their mean.

Both are compared with handformer's post-training (handformer.tasks.post: token_logprobs, the DPO
loss of dpo.py) on random inputs; where they differ, the first line whose value is none of the
reference's steps is quoted.

Shape legend: B rows (pairs), T positions, V vocabulary.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map_only

from handformer.check.core.adapters import adapter_hint
from handformer.check.core.argument_names import named
from handformer.check.core.context import (
    Context,
    error_text,
    finish,
    forward_defaults,
    forward_names,
    forward_parameters,
)
from handformer.check.core.discovery import Component
from handformer.check.core.localize import View, first_departure, over_axes, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import NOT_CHECKED, Check, ComponentResult, LearnerError, Text, text
from handformer.tasks.post.logprobs import token_logprobs
from handformer.tasks.post.packing import IGNORE

B, T, V, BETA, TOL = 3, 7, 11, 0.1, 1e-5
CONSTANTS = (torch.float64, torch.int64, torch.bool)  # the labels and their mask are traced too


def _logits_and_labels() -> tuple[Tensor, Tensor]:
    """Random logits (B, T, V) and labels (B, T): a prompt of 2 masked, row 1 padded at its end."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[:, :2] = IGNORE
    labels[1, -2:] = IGNORE
    return logits, labels


def _given(fn: Any, labels: Tensor) -> tuple[Tensor, ...]:
    """What the function is handed besides the logits: the labels with -100 where none counts, or,
    where it requires a third argument (a loss mask, 1 on the tokens that count, as DPO trainers
    build from the response), the labels all real tokens and that mask beside them."""
    third = ([p.name for p in forward_parameters(fn) if p.default is p.empty] + [""] * 3)[2]
    if "mask" not in third.lower():  # none, or an ignore_index, a pad id: no mask
        return (labels,)
    keep = labels != IGNORE
    filled = torch.where(keep, labels, torch.arange(labels.numel()).reshape(labels.shape) % V)
    return filled, keep.long()


MODEL_FIRST = re.compile(r"(?i)model|policy|^(net|lm|m)$")  # a first argument that is the model itself


def _handed(res: ComponentResult, fn: Any) -> Any:
    """What the function is handed first for the logits: the logits, or, where its first argument is a
    model (`sequence_logps(model, ids, mask)`, which calls it on the ids), a stand-in model that returns
    them, noted."""
    model = bool(MODEL_FIRST.search(next(iter(forward_names(fn)), "")))
    res.notes += [text("its first argument is a model: handed a stand-in model whose logits are check's "
                       "(your model is checked on its own)", "它的第一个参数是模型：传入一个替身模型，"
                       "它的 logits 由检查程序给出（你的模型单独检查）")] * model
    return (lambda lg: lambda *args, **kwargs: lg) if model else (lambda lg: lg)


def logps_views(logits: Tensor, labels: Tensor, mask: Tensor | None = None) -> list[View]:
    """The reference's steps: the shifted labels and logits, the mask, the log-softmax, the picked
    log-probabilities, masked, summed (the mask given beside the labels where one is)."""
    shifted, cut = labels[:, 1:], logits[:, :-1]  # (B, T - 1), (B, T - 1, V)
    keep = shifted != IGNORE if mask is None else mask[:, 1:].bool()
    picked = cut.log_softmax(-1).gather(-1, shifted.clamp(min=0)[..., None]).squeeze(-1)  # (B, T - 1)
    return [("the labels from position 1", shifted), ("the logits but the last", cut), ("the mask", keep),
            ("the labels, masked ones 0", shifted.masked_fill(~keep, 0)),
            ("the log-softmax", cut.log_softmax(-1)), ("each label's log-probability", picked),
            ("masked", picked * keep), ("summed", (picked * keep).sum(-1)),
            ("averaged over its labels", (picked * keep).sum(-1) / keep.sum(-1))]


def check_sequence_logps(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    logits, labels = _logits_and_labels()
    given, handed = _given(comp.obj, labels), _handed(res, comp.obj)
    call = lambda lg: ctx.learner.call("forward", comp.obj, handed(lg), *(t.clone() for t in given))  # noqa: E731
    out = call(logits.clone())
    total = token_logprobs(logits[:, :-1], labels[:, 1:]).double().sum(-1)  # (B,)
    counts = (labels[:, 1:] != IGNORE).sum(-1)
    readings, means = readings_of(out), total / counts
    if not readings:
        return _unread(res, comp, out)
    # the first reading that is the sum or the mean of each row; where none is, the first
    got = max(readings, key=lambda r: _agrees(r, torch.stack([total, means])))
    mean = _agrees(got, means[None])
    err = min(_largest(got, total), _largest(got, means))
    res.max_abs_error = err
    res.notes += [text("it returns the mean over each row's labels (average_log_prob): compared so",
                       "它返回每行标签的平均值（average_log_prob）：按此比较")] * bool(mean)
    res.notes += [text("it takes a loss mask beside the labels (1 on the tokens that count): handed one",
                       "它在标签之外还接受损失掩码（计入的 token 为 1）：传入了掩码")] * (len(given) - 1)
    res.checks.append(Check(logps_check(mean), err < TOL, error_text(err)))
    if err >= TOL:
        note_departure(res, lambda: _localize(comp, call, logits, logps_views(logits, *given)))
    elif not mean:  # summed by default: a switch to the mean is driven too
        _check_averaged(res, ctx, comp, logits, given, means)
    return finish(res)


# a switch, off by default, to each row's mean over its labels (DPO trainers' average_log_prob, which
# IPO's and SimPO's losses turn on)
AVERAGE_NAMES = ("average_log_prob", "average", "avg", "mean", "length_normalize", "length_normalized")


def _check_averaged(res: ComponentResult, ctx: Context, comp: Component, logits: Tensor,
                    given: tuple[Tensor, ...], means: Tensor) -> None:
    """The function run again with its switch to the mean on, on the same padded labels: each row's
    log-probability must be averaged over the labels that count, not over its length."""
    defaults = forward_defaults(comp.obj)
    switch = named(list(defaults), AVERAGE_NAMES)
    if defaults.get(switch) is not False:  # none, or one on by default (compared as it is)
        return
    call = lambda lg: ctx.learner.call("forward", comp.obj, lg, *(t.clone() for t in given),  # noqa: E731
                                       **{switch: True})
    unread = torch.full_like(means, float("inf"))  # no reading of B numbers: no row agrees
    got = max(readings_of(call(logits.clone())), key=lambda r: _agrees(r, means[None]), default=unread)
    err = _largest(got, means)
    res.checks.append(Check(text(f"{switch}=True: each row's log-probability averaged over its labels (the "
                                 "masked ones left out)", f"{switch}=True：每行的对数概率按它的标签求平均"
                                 "（被屏蔽的标签不算）"), err < TOL, error_text(err)))
    if err >= TOL:
        note_departure(res, lambda: _localize(comp, call, logits, logps_views(logits, *given)))


def readings_of(out: Any) -> list[Tensor]:
    """Each row's log-probability (B,) as the function's result holds it, a tensor or a tuple, list or
    dict of them: each tensor of B numbers (a summed or averaged log-probability), then per-token
    log-probabilities (B, L) summed under the 0/1 mask beside them of their shape (their mean is
    compared too); the rest (the logits, the labels) is left aside."""
    tensors = [t.detach().double() for t in _tensors(out)]
    rows = [t.reshape(-1) for t in tensors if t.squeeze().shape == (B,)]
    return rows + [(t * m).sum(-1) for t in tensors for m in tensors if _tokens_and_mask(t, m)]


def _tokens_and_mask(tokens: Tensor, mask: Tensor) -> bool:
    """Per-token log-probabilities (B, L) and a 0/1 mask of their shape."""
    return tokens.dim() == 2 and tokens.size(0) == B and tokens.shape == mask.shape and _binary(mask) \
        and not _binary(tokens)


def _binary(t: Tensor) -> bool:
    return bool(((t == 0) | (t == 1)).all())


def _tensors(out: Any) -> list[Tensor]:
    """The tensors of a result: itself, or those a tuple, list or dict holds."""
    return [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]


def _agrees(got: Tensor, wants: Tensor) -> bool:
    """Whether `got` (B,) equals one of the rows of `wants` (n, B)."""
    return got.shape == wants.shape[1:] and bool(torch.isclose(got, wants, atol=TOL).all(-1).any())


def _unread(res: ComponentResult, comp: Component, out: Any) -> ComponentResult:
    """NOT CHECKED: a result in which check finds no form of each row's log-probability."""
    shapes = tree_map_only(Tensor, lambda t: tuple(t.shape), out)  # the tensors by their shapes
    res.status, res.max_abs_error, res.adapter = NOT_CHECKED, None, adapter_hint(comp)
    res.error = LearnerError("mapping", f"{comp.name} returned {shapes}: {UNREAD[0]}", "forward",
                             message_zh=f"{comp.name} 返回了 {shapes}：{UNREAD[1]}")
    return res


UNREAD = (f"check reads each row's log-probability as {B} numbers (summed or averaged) or as per-token "
          f"log-probabilities ({B}, {T - 1}) with their mask, and found neither",
          f"check 把每行的 log 概率读作 {B} 个数（求和或平均），或读作每个 token 的 log 概率 ({B}, {T - 1}) "
          "加上它们的掩码，两者都没有找到")


def logps_check(mean: bool) -> Text:
    """The check's line: the rows' log-probabilities summed, or averaged where the function returns the
    mean (`average_log_prob`)."""
    en, zh = (("averaged over its labels", "的平均值") if mean else ("summed", "之和"))
    return text(f"each row's log-probability of its labels (the labels one position on, {IGNORE} or masked "
                f"ones left out) equals handformer's token_logprobs {en}",
                f"每行标签的 log 概率（标签错后一位，去掉 {IGNORE} 或被掩码的）与 handformer 的 "
                f"token_logprobs {zh}一致")


def _largest(got: Tensor, want: Tensor) -> float:
    """The largest difference of two results of as many numbers (inf where the counts differ)."""
    apart = got.numel() != want.numel()
    return float("inf") if apart else (got.reshape(-1) - want.reshape(-1)).abs().max().item()


def _localize(comp: Component, call: Any, given: Tensor, views: list[View]) -> Any:
    filename = inspect.getsourcefile(comp.obj)
    # the logits as the input the steps depend on, so the value returned is a step too
    steps = trace_steps(lambda: call(given.clone().requires_grad_()), filename, None, (), constants=CONSTANTS)
    cut = given[:, :-1]  # the log-softmax over another axis than the vocabulary's: named
    forms = [(form | {"mistake": "softmax_wrong_dim"}, r)
             for form, r in over_axes("the log-softmax", "log-softmax", cut.log_softmax, cut.dim())]
    return first_departure(steps, views, filename, {"B": B, "T": T, "V": V}, ends=views[-2:], forms=forms)


def _logps() -> dict[str, Tensor]:
    """The four (B,) log-probabilities, by role."""
    g = torch.Generator().manual_seed(9)
    return {role: -torch.rand(B, generator=g, dtype=torch.float64) * 20 for role in ROLES}


ROLES = ("policy_chosen", "policy_rejected", "reference_chosen", "reference_rejected")


def _role(name: str) -> str:
    """A parameter's role by its words: ref(erence) or policy, rejected (or lose) or chosen."""
    lowered = name.lower()
    side = ("policy", "reference")["ref" in lowered]
    return f"{side}_{('chosen', 'rejected')['rej' in lowered or 'los' in lowered]}"


def _arguments(fn: Any, logps: dict[str, Tensor]) -> list[Tensor]:
    """The four in the order the function takes them: by their names where those name four roles,
    else the paper's order."""
    names = forward_names(fn)[:4]
    roles = list(map(_role, names))
    order = roles if sorted(roles) == sorted(ROLES) else list(ROLES)
    return [logps[r].clone() for r in order]


def dpo_views(logps: dict[str, Tensor], beta: float) -> list[View]:
    pc, pr, rc, rr = (logps[r] for r in ROLES)
    margin = (pc - pr) - (rc - rr)
    given = [(f"the {role.replace('_', ' ')} log-probabilities", logps[role]) for role in ROLES]
    return given + [("the policy's log-ratio chosen - rejected", pc - pr), ("the reference's", rc - rr),
            ("their difference", margin), ("beta times it", beta * margin),
            ("log sigmoid", F.logsigmoid(beta * margin)), ("the losses", -F.logsigmoid(beta * margin)),
            ("the chosen reward", beta * (pc - rc)), ("the rejected reward", beta * (pr - rr)),
            ("the chosen log-ratio to the reference", pc - rc), ("the rejected one", pr - rr)]


def check_dpo_loss(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    logps = _logps()
    beta = next((p.default for p in forward_parameters(comp.obj) if p.name == "beta"), BETA)
    beta = BETA if beta is inspect.Parameter.empty else float(beta)
    extra = {"beta": beta} if "beta" in forward_names(comp.obj) else {}
    call = lambda *a: ctx.learner.call("forward", comp.obj, *a, **extra)  # noqa: E731
    out = call(*_arguments(comp.obj, logps))
    got = torch.as_tensor((out if isinstance(out, Tensor) else out[0]).detach()).double()
    losses = dpo_views(logps, beta)[9][1]  # (B,) the losses
    want = losses.mean() if got.dim() == 0 else losses
    err = _largest(got, want)
    res.max_abs_error = err
    res.checks.append(Check(text(f"beta={beta:g}: the losses equal -log sigmoid(beta * ((policy chosen - "
                                 "rejected) - (reference chosen - rejected))), handformer's DPO loss",
                                 f"beta={beta:g}：损失与 -log sigmoid(beta * ((policy chosen - rejected) - "
                                 "(reference chosen - rejected)))，即 handformer 的 DPO 损失一致"),
                            err < TOL, error_text(err)))
    if err >= TOL:
        note_departure(res, lambda: _localize_dpo(comp, call, logps, beta))
    return finish(res)


def _localize_dpo(comp: Component, call: Any, logps: dict[str, Tensor], beta: float) -> Any:
    filename = inspect.getsourcefile(comp.obj)
    steps = trace_steps(lambda: call(*_arguments(comp.obj, logps)), filename, None, (), constants=True)
    return first_departure(steps, dpo_views(logps, beta), filename, {"B": B, "beta": beta})
