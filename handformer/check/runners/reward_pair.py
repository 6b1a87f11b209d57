"""A reward model's pairwise loss (InstructGPT's; DeepSpeed-Chat and OpenRLHF write it so):
`compute_loss(model, chosen_ids, rejected_ids)` scores both answers with the model it is handed and
returns -log sigmoid(r_chosen - r_rejected), the mean over the pairs (maybe with the rewards after it).
It takes the model, as a language model's loss does, but its model gives one score a sequence: it is
handed a stand-in reward model (a score a token, summed over the sequence) and compared with the
pairwise loss of the stand-in's scores; the rewards subtracted the wrong way round are named at the
line that takes the log-sigmoid.

Shape legend: B pairs, T tokens.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.catalog.base import DEPARTS
from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import BATCH_NAMES, CLIP_NAMES, OPTIMIZER_NAMES, STEP_MODEL_NAMES
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, LearnerError, text
from handformer.check.core.source import first_line, functions_called, locate, source_lines, with_called_code

B, T, VOCAB = 4, 6, 11
CHOSEN = re.compile(r"chosen|preferred|better|win|pos")
REJECTED = re.compile(r"rejected|dispreferred|worse|los|neg")
SIGMOID_LINE = (r"sigmoid|softplus",)


def pairwise(fn: Any) -> bool:
    """Whether a loss takes a chosen and a rejected input by its parameters' names."""
    names = [p.name.lower() for p in forward_parameters(fn)]
    return any(map(CHOSEN.search, names)) and any(map(REJECTED.search, names))


def pairwise_step(comp: Component) -> bool:
    """Whether a training step's loss is a reward model's pairwise loss (a function of its file it
    calls, read as `pairwise`)."""
    return any(map(pairwise, functions_called(comp.obj)))


def check_pairwise_step(comp: Component, ctx: Context) -> ComponentResult:
    """The step on a stand-in reward model (its scores scaled so that the gradient norm is well over
    a clipping norm of 1), SGD at 0.1, pairs (chosen, rejected): its parameters after the step equal
    the reference step's (the pairwise loss, the gradient clipped where the step clips, SGD)."""
    res = ctx.result(comp)
    model, gen = Scorer(scale=10.0).double(), torch.Generator().manual_seed(2)
    chosen, rejected = torch.randint(0, VOCAB, (2, B, T), generator=gen)
    clip = _clip_norm(comp)
    reference = _reference_step(model, chosen, rejected, clip)
    with torch.enable_grad():
        ctx.learner.call("forward", comp.obj, **_step_arguments(comp, model, chosen, rejected))
    got = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    err = fp.relative_error(got, reference[clip is None])
    clipped, clipped_zh = (said.format(clip) for said in CLIPPED[clip is None])
    res.checks.append(Check(text(f"SGD at 0.1 on a stand-in reward model: the parameters after one step "
                                 f"equal those of the pairwise loss's step{clipped}",
                                 f"在替身奖励模型上用学习率 0.1 的 SGD：走一步之后的参数与成对损失的训练一步"
                                 f"{clipped_zh}的结果一致"),
                            err < fp.REL_TOL, error_text(err)))
    if err >= fp.REL_TOL and clip is not None and fp.relative_error(got, reference[True]) < fp.REL_TOL:
        number, code = locate("train_step_clip_after_step", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("train_step_clip_after_step", text(
            "its parameters are those of the unclipped step", "它的参数是没有裁剪梯度的那一步的结果"),
            number, code))
    return finish(res)


# the norm a step clips at, written in its code: clip_grad_norm_(params, 1.0) or max_norm=1.0
CLIP_CALL = re.compile(r"clip_grad_norm_?\([^,]+,\s*(?:max_norm\s*=\s*)?([\d.]+(?:e-?\d+)?)")


def _clip_norm(comp: Component) -> float | None:
    """The gradient norm the step clips at: its parameter's default (max_grad_norm=1.0), else the number
    its code hands clip_grad_norm_; None where it does not clip. A clip at a norm neither says is a
    cannot_call: its reference step is unknown."""
    said = [p.default for p in forward_parameters(comp.obj) if p.name.lower() in CLIP_NAMES] + [
        float(m) for m in CLIP_CALL.findall(with_called_code(comp.obj))]
    if not said and "clip_grad" in with_called_code(comp.obj):
        raise fp.LearnerFailure(LearnerError(
            "cannot_call", f"{comp.name} clips its gradient at a norm neither its parameters nor its call of "
            "clip_grad_norm_ give as a number", "forward",
            message_zh=f"{comp.name} 裁剪梯度的范数既不是参数默认值，也不是 clip_grad_norm_ 调用里写明的数"))
    return (said + [None])[0]


CLIPPED = {False: (" (the gradient clipped at norm {})", "（梯度按范数 {} 裁剪）"), True: ("", "")}


def _reference_step(model: nn.Module, chosen: Tensor, rejected: Tensor, clip: float | None,
                    ) -> dict[bool, Tensor]:
    """The parameters after one SGD step of a copy of `model`: {False: clipped at `clip`, True: unclipped}."""
    out = {}
    for unclipped in (False, True):
        twin = copy.deepcopy(model)
        with torch.enable_grad():
            (-F.logsigmoid(twin(chosen) - twin(rejected)).mean()).backward()
        nn.utils.clip_grad_norm_(twin.parameters(), clip if clip and not unclipped else math.inf)
        torch.optim.SGD(twin.parameters(), lr=0.1).step()
        out[unclipped] = torch.cat([p.detach().reshape(-1) for p in twin.parameters()])
    return out


def _step_arguments(comp: Component, model: nn.Module, chosen: Tensor, rejected: Tensor) -> dict[str, Any]:
    """The step's arguments by name: the model, an SGD optimizer, the pair as a batch or apart; the
    rest left to their defaults (a cannot_call for one that has none)."""
    values = {**dict.fromkeys(STEP_MODEL_NAMES, model), **dict.fromkeys(BATCH_NAMES, (chosen, rejected)),
              **dict.fromkeys(OPTIMIZER_NAMES, torch.optim.SGD(model.parameters(), lr=0.1))}
    roles = {p.name: values.get(p.name.lower(), _side(p.name, chosen, rejected))
             for p in forward_parameters(comp.obj)}
    missing = [p.name for p in forward_parameters(comp.obj) if roles[p.name] is None and p.default is p.empty]
    if missing:
        raise fp.LearnerFailure(LearnerError("cannot_call", PAIR_STEP.format(name=comp.name, arg=missing[0]),
                                             "forward", message_zh=PAIR_STEP_ZH.format(name=comp.name,
                                                                                       arg=missing[0])))
    return {name: value for name, value in roles.items() if value is not None}


def _side(name: str, chosen: Tensor, rejected: Tensor) -> Tensor | None:
    """The chosen or the rejected ids for a parameter named for one of them."""
    return chosen if CHOSEN.search(name.lower()) else rejected if REJECTED.search(name.lower()) else None


class Scorer(nn.Module):
    """A stand-in reward model: a score for each token, summed over the sequence and scaled: ids (B, T)
    -> (B,)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.score, self.scale = nn.Embedding(VOCAB, 1), scale
        nn.init.normal_(self.score.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, ids: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return self.score(torch.as_tensor(ids)).sum((1, 2)) * self.scale  # (B,)


def check_pairwise_loss(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    model = Scorer().double()
    gen = torch.Generator().manual_seed(1)
    chosen, rejected = torch.randint(0, VOCAB, (2, B, T), generator=gen)
    args = [model, chosen, rejected][:len(forward_parameters(comp.obj))]
    try:
        out = fp.first_tensor(ctx.learner.call("forward", comp.obj, *args))
    except fp.LearnerFailure as failure:  # it asks of the model what the stand-in does not give
        said = STAND_IN.format(name=comp.name, said=failure.error.message)
        raise fp.LearnerFailure(LearnerError("stand_in", said, "forward")) from None
    with torch.no_grad():
        margin = model(chosen) - model(rejected)  # (B,)
    right, swapped = -F.logsigmoid(margin).mean(), -F.logsigmoid(-margin).mean()
    err = fp.relative_error(out, right)
    res.checks.append(Check(text("with a stand-in reward model, the loss equals -log sigmoid(r_chosen - "
                                 "r_rejected), the mean over the pairs",
                                 "用替身奖励模型时，损失等于 -log sigmoid(r_chosen - r_rejected)，"
                                 "对各对取平均"),
                            err < fp.REL_TOL, error_text(err)))
    if err >= fp.REL_TOL and fp.relative_error(out, swapped) < fp.REL_TOL:
        number, code = first_line(SIGMOID_LINE, source_lines(ctx.objects(comp)))
        res.findings.append(Finding(DEPARTS, text(
            "its loss is -log sigmoid(r_rejected - r_chosen): the rewards subtracted the wrong way round, "
            "so training raises the rejected answer's reward",
            "它的损失是 -log sigmoid(r_rejected - r_chosen)：两个奖励减反了，训练会抬高 rejected 回答的奖励"),
            number, code))
    res.notes.append(PAIR_NOTE)
    return finish(res)


STAND_IN = ("{name} refused check's stand-in reward model (ids (B, T) -> one score a row (B,)): {said}")
PAIR_NOTE = text("a reward model's pairwise loss (it takes a chosen and a rejected input): driven with a "
                 "stand-in reward model; your model is checked on its own",
                 "奖励模型的成对损失（接受 chosen 和 rejected 两个输入）：用替身奖励模型调用；"
                 "你的模型单独检查")
PAIR_STEP = ("cannot fill the argument {arg!r} of {name}: a reward model's step is handed the model, the "
             "optimizer and the pair (chosen, rejected) as a batch or by names that say which")
PAIR_STEP_ZH = ("填不了 {name} 的参数 {arg!r}：奖励模型的训练一步传入模型、优化器，以及成对的"
                "（chosen, rejected），作为一个 batch，或按说明是哪一个的名字分开传")
