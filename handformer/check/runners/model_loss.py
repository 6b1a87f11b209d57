"""The runner of a loss that takes the model and a batch of tokens (a training loop's helper,
`compute_loss(model, tokens)`: it calls the model itself). It is handed check's stand-in language model
(the training step's: handformer's model, `model(x)` the logits (B, T, V), `model(x, y)` the logits
and the cross-entropy) and a (B, T + 1) window of a token stream, or the window's inputs and targets
(B, T) each where it takes two; its number is compared with the cross-entropy of each next token, the
mean over them. A loss that scores each position against its own token is `train_step_no_shift`.

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import ast
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


LOSSES = ("cross_entropy", "nll_loss")
BINDS = re.compile(r"\s*(\w+)\s*=(?!=)")  # a line binding one name


def _loss_targets(lines: list[tuple[int, str]]) -> set[str]:
    """The names handed to a cross-entropy as its targets, one line a call (`F.cross_entropy(logits.view(-1,
    V), targets.view(-1))`: targets): where inputs and targets are sliced alike, the targets' slice is the
    one to move on."""
    names: set[str] = set()
    for _, code in lines:
        try:
            calls = [n for n in ast.walk(ast.parse(code.strip())) if isinstance(n, ast.Call)]
        except SyntaxError:  # a part of a statement
            continue
        handed = [c.args[1] for c in calls if len(c.args) > 1 and ast.unparse(c.func).endswith(LOSSES)]
        names |= {n.id for arg in handed for n in ast.walk(arg) if isinstance(n, ast.Name)}
    return names


def unshifted_finding(comp: Component) -> Finding:
    """train_step_no_shift, on the line that slices the labels off the tokens (the slice bound to a name
    the loss takes as its targets first; else the first slice, else the model's call)."""
    lines = source_lines([comp.obj])
    targets = _loss_targets(lines)
    bound = [(n, c) for n, c in lines if (name := BINDS.match(c)) and name[1] in targets]
    number, code = first_line(SHIFT_LINES, bound)  # the slice the loss is handed as its targets
    number, code = (number, code) if number is not None else first_line(SHIFT_LINES, lines)
    if number is None:
        number, code = locate("train_step_no_shift", lines)
    return Finding("train_step_no_shift", text(
        "your loss equals the cross-entropy of each position against its own token, not the next one",
        "你的损失等于每个位置对它自己那个 token 的交叉熵，而不是对下一个 token 的"), number, code)
