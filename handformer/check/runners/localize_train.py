"""Where a training step that FAILs parts from handformer's, when no catalogued mistake explains it:
the labels its loss is given. The step runs once more, traced (the token tensors it makes kept), with
the criterion handed to it wrapped so that the labels it receives are seen; labels that are not
`tgt[:, 1:]` (each position's next token) depart at the line that made them, and their form is named
(the decoder's input, the target not moved on, a shift). Kept apart from train_step.py so that the
step's runner imports the localization one way.

Shape legend: B batch, T target length.
"""

from __future__ import annotations

import copy
import inspect
import linecache
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.localize import Departure, form_of, same, trace_steps
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
    """Run the learner's step (train_step.Step) once on (src, tgt), traced, on a copy of the model
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
    steps = trace_steps(lambda: ours(model, opt, src, tgt), filename, constants=(torch.int64,))
    right = tgt[:, 1:].double()  # (B, T-1)
    labels = handed[0].double().reshape(-1) if step.criterion and handed else right.reshape(-1)
    made_at = [s for s in steps if same(s.value.reshape(-1), labels)]  # same(): the sizes first
    if same(labels, right.reshape(-1)) or not made_at:
        return None
    at = [s for s in made_at if s.line == made_at[0].line][-1]  # `tgt_in, tgt_out = ...`: the last name
    forms = [(text(en, zh), wrong(tgt).double()) for wrong, en, zh in WRONG_LABELS]
    form = form_of(at.value, [("the labels tgt[:, 1:]", right)], {}, forms=forms)
    return Departure(at.line, at.name, linecache.getline(filename, at.line).strip(), form)
