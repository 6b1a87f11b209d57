"""Where a training step that FAILs parts from handformer's, when no catalogued mistake explains it:
the labels its loss is given. The step runs once more, traced (the token tensors it makes kept), with
the criterion handed to it wrapped so that the labels it receives are seen; labels that are not
`tgt[:, 1:]` (each position's next token) depart at the line that made them, and their form is named
(the decoder's input, the target not moved on, a shift). Kept apart from train_step.py so that the
step's runner imports the localization one way.

A language model's step (`lm_train_step(model, x, y, optimizer, lr)`) computes its loss itself: it
runs once more, traced, and the first tensor it makes that is none of the loss's sub-steps on the
same weights (the logits, the log-probabilities, the per-token losses, their mean) departs, with its
form (a sum where the mean is meant: a factor B·T; the probabilities handed where the logits are).

Shape legend: B batch, T target length, V vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import linecache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core.localize import Departure, Form, View, first_departure, form_of, same, trace_steps
from handformer.check.core.result import text

# the labels a step may give its loss in place of tgt[:, 1:], in words, as a function of tgt (B, T)
WRONG_LABELS = (
    (lambda tgt: tgt[:, :-1], "the labels are the decoder's input tgt[:, :-1]: each position is scored on "
     "its own token, not the next one", "标签就是解码器的输入 tgt[:, :-1]：每个位置对的是自己的 token，"
     "不是下一个"),
    (lambda tgt: tgt, "the labels are the whole target tgt, not moved on by one",
     "标签是整个目标 tgt，没有错开一位"))


def localize_train_step(step: Any, model: torch.nn.Module, src: Tensor, tgt: Tensor,
                        lr: float) -> Departure | None:
    """Run the learner's step (train_step.Step), or its epoch over that one batch, once on (src, tgt),
    laid out as the step reads them, traced, on a copy of the model
    (`model`, fresh for this run) with SGD at `lr`, its criterion wrapped: the line that made the
    labels the loss received, when they are not tgt[:, 1:]; None when they are (or it takes no
    criterion: the labels are then out of sight)."""
    handed: list[Tensor] = []

    def criterion(*args: Any, **kwargs: Any) -> Any:
        handed.append(args[1])
        return made(*args, **kwargs)

    made, ours = step.make_criterion(), copy.copy(step)
    ours.make_criterion = lambda: criterion
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    filename = inspect.getsourcefile(step.comp.obj)
    def run() -> Any:
        return ours.run_epoch(model, opt, [(src, tgt)]) if step.epoch else ours(model, opt, src, tgt)

    steps = trace_steps(run, filename, constants=(torch.int64,))
    right = step.laid(tgt[:, 1:]).double()  # (B, T-1), or (T-1, B) for a sequence-first step
    labels = handed[0].double().reshape(-1) if step.criterion and handed else right.reshape(-1)
    made_at = [s for s in steps if same(s.value.reshape(-1), labels)]  # same(): the sizes first
    if same(labels, right.reshape(-1)) or not made_at:
        return None
    sliced = [s for s in made_at if "[" in linecache.getline(filename, s.line)] or made_at
    at = sliced[-1]  # the latest slice of the target: the labels, made after a decoder input alike
    forms = [(text(en, zh), step.laid(wrong(tgt)).double()) for wrong, en, zh in WRONG_LABELS]
    form = form_of(at.value, [("the labels tgt[:, 1:]", right)], {}, forms=forms)
    return Departure(at.line, at.name, linecache.getline(filename, at.line).strip(), form)


def lm_loss_views(logits: Tensor, y: Tensor) -> tuple[list[View], list[Form]]:
    """A language model's loss on its logits (B, T, V) and targets y (B, T), as sub-steps; and the
    forms of a loss that departs: the cross-entropy of the probabilities (a softmax applied twice)."""
    B, T, V = logits.shape
    flat, labels = logits.reshape(B * T, V), y.reshape(B * T)  # (B·T, V), (B·T,)
    per_token = F.cross_entropy(flat, labels, reduction="none")  # (B·T,)
    views = [("the logits model(x)", logits), ("the log-probabilities", flat.log_softmax(-1)),
             ("the probabilities", flat.softmax(-1)), ("the per-token losses", per_token),
             ("the per-token losses (B, T)", per_token.view(B, T)),
             ("the loss, the mean cross-entropy", per_token.mean())]
    twice = F.cross_entropy(flat.softmax(-1), labels)
    return views, [(text("the cross-entropy of the probabilities softmax(logits): F.cross_entropy takes the "
                         "logits and applies the softmax itself, so it is applied twice",
                         "对概率 softmax(logits) 求了交叉熵：F.cross_entropy 接收 logits，自己会做 softmax，"
                         "于是 softmax 做了两次"), twice)]


def localize_lm_step(step: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor,
                     lr: float) -> Departure | None:
    """Run the learner's language-model step (lm_train_step.Step) once on (x, y), traced, on `model`
    (fresh for this run): the first tensor it makes that is none of the loss's sub-steps (see
    `lm_loss_views`) on the weights it starts from."""
    with torch.no_grad():
        logits = model(x)  # (B, T, V): before the step moves the weights
    views, forms = lm_loss_views(logits.double(), y)
    filename = inspect.getsourcefile(step.comp.obj)
    probe = copy.deepcopy(model)  # the labels' run: the token tensors it makes kept (as float64)
    tokens = trace_steps(lambda: step(probe, torch.optim.SGD(probe.parameters(), lr=lr), x, y, lr), filename,
                         constants=(torch.int64,))
    # no y handed: it cuts its own (but for the ids and labels of Hugging Face's batch: the model is fed them)
    labels = unshifted_labels(tokens, x, y, filename, cut=not (step.y or step.labelled))
    if labels is not None:
        return labels
    with torch.enable_grad():
        steps = trace_steps(lambda: step(model, opt, x, y, lr), filename)
    B, T = y.shape
    return first_departure(steps, views, filename, {"B·T": B * T, "T": T, "B": B}, forms=forms)


def unshifted_labels(steps: list[Any], x: Tensor, y: Tensor, filename: str, cut: bool) -> Departure | None:
    """Of the steps of a run that kept the token tensors, the line that made a language model's labels
    from the inputs: none of the tensors is the targets y (or a micro-batch's rows of them), and a
    second name holds the inputs x (a step that cuts x and y from one tensor of windows names x once
    itself): its first step is quoted."""
    made = [s for s in steps if not s.given]
    inputs = [s for s in made if _rows_of(s.value, x)]
    named = [s.name for s in inputs]
    names = list(dict.fromkeys(named))
    if len(names) <= cut or any(_rows_of(s.value, y) for s in made):
        return None
    at = inputs[named.index(names[cut])]
    form = text("the labels are the inputs x: each position is scored on its own token, not the next one",
                "标签就是输入 x：每个位置对的是自己的 token，不是下一个") | {"mistake": "train_step_no_shift"}
    return Departure(at.line, at.name, linecache.getline(filename, at.line).strip(), form)


def _rows_of(t: Tensor, full: Tensor) -> bool:
    """Whether t holds a run of whole rows of `full` (B, T), as they are or flattened (a micro-batch's)."""
    rows = full.split(max(t.numel() // full.size(-1), 1))  # runs of as many rows as t holds (or unequal)
    return any(torch.equal(t.reshape(-1), run.reshape(-1).to(t.dtype)) for run in rows)
