"""The runner of a loss that takes the model and a batch of tokens (a training loop's helper,
`compute_loss(model, tokens)`: it calls the model itself). It is handed check's stand-in language model
(the training step's: handformer's model, `model(x)` the logits (B, T, V), `model(x, y)` the logits
and the cross-entropy) and a (B, T + 1) window of a token stream, or the window's inputs and targets
(B, T) each where it takes two; its number is compared with the cross-entropy of each next token, the
mean over them. A loss that scores each position against its own token is `train_step_no_shift`.

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, call_parameters, error_text, finish
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.runners.reward_pair import check_pairwise_loss, pairwise
from handformer.check.runners.step_model import VOCAB, batches, tiny_model

# where a loss of the model slices its labels off the tokens (tokens[:, 1:]), else where it calls it
SHIFT_LINES = (r"\[\s*:\s*,\s*(:\s*-1|1\s*:)\s*\]|\[\s*\.\.\.\s*,\s*(:\s*-1|1\s*:)\s*\]",)
EQUALS = text("the loss equals the cross-entropy of each next token (the mean) on check's stand-in model",
              "在 check 的替身模型上，损失等于预测下一个 token 的交叉熵（取平均）")


def cross_entropy(model: Any, x: Tensor, y: Tensor) -> Tensor:
    """The mean cross-entropy of the model's logits of x (B, T) against the targets y (B, T)."""
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def check_model_loss(comp: Component, ctx: Context) -> ComponentResult:
    if pairwise(comp.obj):  # a reward model's loss: its model gives a score a sequence, not logits
        return check_pairwise_loss(comp, ctx)
    res = ctx.result(comp)
    model = tiny_model()
    x, y = batches()[0]  # (B, T) each, y is x moved on by one
    with torch.no_grad():
        right, unshifted = cross_entropy(model, x, y), cross_entropy(model, x, x)  # unshifted: its own token
    label, out = _driven(ctx, comp, model, x, y, right)
    err = fp.relative_error(out, right)
    res.max_abs_error = float((out - right).abs())
    res.checks.append(Check(EQUALS, err < fp.REL_TOL, error_text(err)))
    if err >= fp.REL_TOL and fp.relative_error(out, unshifted) < fp.REL_TOL:
        res.findings.append(unshifted_finding(comp))
    res.notes.append(text(f"driven as {comp.name}(model, {label}) with check's stand-in language model: "
                          "your model is checked on its own",
                          f"用 check 的替身语言模型调用 {comp.name}(model, {label})：你的模型单独检查"))
    return finish(res)


def _driven(ctx: Context, comp: Component, model: Any, x: Tensor, y: Tensor, right: Tensor,
            ) -> tuple[str, Tensor]:
    """(how it was called, the number it returned): handed x and y where it requires two arguments
    after the model; else a (B, T + 1) window of tokens, or the pair (x, y) as one batch, the first
    that returns the right number (else the first that returns one)."""
    tokens = torch.cat([x, y[:, -1:]], dim=1)  # (B, T + 1)
    required = [p for p in call_parameters(comp.obj)[1:] if p.default is p.empty]
    forms = {"x, y": (x, y)} if len(required) > 1 else {"tokens": (tokens,), "(x, y)": ((x, y),)}
    got: list[tuple[str, Tensor]] = []
    failure: fp.LearnerFailure | None = None
    for label, given in forms.items():
        try:
            out = fp.first_tensor(ctx.learner.call("forward", comp.obj, model, *given), 0)
        except fp.LearnerFailure as err:
            failure = failure or err
            continue
        got += [(label, out.detach())] * (out is not None)
        if got and fp.relative_error(got[-1][1], right) < fp.REL_TOL:
            return got[-1]
    if not got:  # their first exception; else none of its forms returns a number
        raise failure or DiscoveryError(f"{comp.name}(model, tokens) returns no number: not compared",
                                        zh=f"{comp.name}(model, tokens) 没有返回一个数：无法比较")
    return got[0]


# a cross-entropy's targets: the name its second argument starts with (its first one nested at most twice:
# `F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))` hands `targets`)
LOSS_TARGET = re.compile(r"\b(?:cross_entropy|nll_loss)\s*\((?:[^,()]|\((?:[^()]|\([^()]*\))*\))*,\s*(\w+)")


def unshifted_finding(comp: Component) -> Finding:
    """train_step_no_shift, on the line that slices the labels off the tokens (the slice bound to a name
    the loss takes as its targets first; else the first slice, else the model's call)."""
    lines = source_lines([comp.obj])
    targets = "|".join(set(LOSS_TARGET.findall("\n".join(map(operator.itemgetter(1), lines)))))
    bound = rf"^\s*(?:{targets})\s*=(?!=).*(?:{SHIFT_LINES[0]})"  # the targets' own slice, tried first
    number, code = first_line((bound, *SHIFT_LINES), lines)
    if number is None:
        number, code = locate("train_step_no_shift", lines)
    return Finding("train_step_no_shift", text(
        "your loss equals the cross-entropy of each position against its own token, not the next one",
        "你的损失等于每个位置对它自己那个 token 的交叉熵，而不是对下一个 token 的"), number, code)
