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

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.catalog.base import DEPARTS
from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, LearnerError, text
from handformer.check.core.source import first_line, functions_called, source_lines

B, T, VOCAB = 4, 6, 11
CHOSEN = re.compile(r"chosen|preferred|better|win|pos")
REJECTED = re.compile(r"rejected|dispreferred|worse|los|neg")
SIGMOID_LINE = (r"sigmoid|softplus",)


def pairwise(fn: Any) -> bool:
    """Whether a loss takes a chosen and a rejected input by its parameters' names."""
    names = [p.name.lower() for p in forward_parameters(fn)]
    return any(map(CHOSEN.search, names)) and any(map(REJECTED.search, names))


def refuse_pairwise_step(comp: Component) -> None:
    """NOT CHECKED (a cannot_call) for a training step whose loss is a reward model's pairwise loss (a
    function of its file it calls, read as `pairwise`): check's step drives a language model, and the
    step's model gives one score a sequence; its loss is checked on its own."""
    losses = sorted(filter(pairwise, functions_called(comp.obj)), key=lambda f: "loss" not in f.__name__)
    said = {"name": comp.name, "loss": losses[0].__name__} if losses else None
    if said:
        raise fp.LearnerFailure(LearnerError("cannot_call", PAIR_STEP.format(**said), "forward",
                                             message_zh=PAIR_STEP_ZH.format(**said)))


class Scorer(nn.Module):
    """A stand-in reward model: a score for each token, summed over the sequence: ids (B, T) -> (B,)."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Embedding(VOCAB, 1)
        nn.init.normal_(self.score.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, ids: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return self.score(torch.as_tensor(ids)).sum((1, 2))  # (B,)


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
PAIR_STEP = ("{name} trains a reward model on pairs: its loss {loss} takes a chosen and a rejected input, "
             "and check's training step drives a language model on a token stream, so it is not driven; "
             "{loss} is checked on its own")
PAIR_STEP_ZH = ("{name} 在成对数据上训练奖励模型：它的损失 {loss} 接受 chosen 和 rejected 两个输入，"
                "而 check 的训练一步驱动的是在 token 流上的语言模型，所以不调用它；{loss} 单独检查")
