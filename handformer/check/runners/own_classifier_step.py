"""A training step of a file whose model is a classifier of its own, fed a batch the step reads by key or
field (Hugging Face fine-tuning's `train_step(model, batch, optimizer)` that calls
`model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])` and
backpropagates the loss the model returns).

The probe: the learner's classifier, the one its own check passed, built fresh and handed over in eval
mode with plain SGD and dropout off; two batches whose keys are those the step reads (ids, a padding
mask where a key names a mask, zeros for token types or segments, class ids for the labels). The
parameters after each step must equal handformer's step from the same start: the model in training
mode, zero_grad, the model's own loss on the batch (the one it returns handed the labels, else the
cross-entropy of its logits), backward, the gradients clipped where the step clips, step. Named: the
gradients never zeroed (step 2 adds step 1's), the model never put in training mode.

Shape legend: B batch, T tokens, C classes.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import (
    BATCH_NAMES,
    OPTIMIZER_NAMES,
    STEP_MODEL_NAMES,
    named,
    names_of,
)
from handformer.check.core.context import Context, error_text, finish, forward_names, forward_parameters
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.core.step_updates import largest_difference, parameters_of, update
from handformer.check.runners.classifier_backbone import tensors_of

B, T, REAL, LR, TOL = 2, 6, 4, 0.1, 1e-9
LABEL_WORDS = ("label", "target", "y")


def step_reads(fn: Any) -> tuple[str, str, str, list[str]] | None:
    """(model, optimizer, batch, the keys or fields it reads of the batch) of a step that takes only
    those three (others with defaults); None for any other step."""
    params = forward_parameters(fn)
    names, required = names_of(params)
    roles = [named(names, aliases) for aliases in (STEP_MODEL_NAMES, OPTIMIZER_NAMES, BATCH_NAMES)]
    if None in roles or set(required) - set(roles):
        return None
    batch = re.escape(str(roles[2]))
    source = source_text(fn)
    keys = re.findall(rf"\b{batch}\[[\"'](\w+)[\"']\]", source) or re.findall(rf"\b{batch}\.(\w+)\b", source)
    return (*roles, list(dict.fromkeys(keys))) if keys else None  # type: ignore[return-value]


def batch_values(keys: list[str], rows: int, classes: int, seed: int) -> dict[str, Tensor]:
    """Each key's tensor by what its name says: a padding mask (1 = a real token), token types (zeros),
    the labels (B,), else ids (B, T)."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.ones(B, T, dtype=torch.long)
    keep[1, REAL:] = 0
    ids = torch.randint(1, rows, (B, T), generator=g) * keep
    labels = torch.randint(0, classes, (B,), generator=g)
    out = {}
    for key in keys:
        low = key.lower()
        out[key] = (keep.clone() if "mask" in low else torch.zeros_like(ids) if re.search("type|segment", low)
                    else labels.clone() if low.startswith(LABEL_WORDS) else ids.clone())
    return out


class Fields(dict):
    """A batch that answers its keys as fields too (`batch.input_ids`, as a BatchEncoding or a
    dataclass batch): a step that reads fields is handed what it reads, never check's dict alone."""

    def __init__(self, batch: dict[str, Tensor]) -> None:
        super().__init__(batch)
        self.__dict__.update(batch)


def own_loss(model: nn.Module, batch: dict[str, Tensor], classes: int) -> Tensor:
    """The model's loss on the batch: its forward handed the batch's tensors it names (ids first where it
    names none of them); the scalar it returns, else the cross-entropy of its (B, C) logits."""
    names = forward_names(model)
    labels = next(v for k, v in batch.items() if k.lower().startswith(LABEL_WORDS))
    given = {k: v for k, v in batch.items() if k in names}
    ids = [v for k, v in batch.items() if v.dim() == 2 and "mask" not in k.lower() and k not in given][:1]
    out = model(*ids, **given)
    items = tensors_of(out)
    loss = next((t for t in items if t.dim() == 0), None)
    logits = next((t for t in items if t.dim() == 2 and t.size(-1) == classes), None)
    return loss if loss is not None else F.cross_entropy(logits, labels)


def _steps(step: Any, base: nn.Module, keys: list[str], rows: int, classes: int) -> tuple[nn.Module, list]:
    """A copy of `base` in eval mode, SGD, `step(model, opt, batch)` on two batches: the model (its calls'
    modes in `model.modes`) and the parameters after each step."""
    model = copy.deepcopy(base).eval()
    model.modes = []  # type: ignore[assignment]
    model.register_forward_pre_hook(lambda m, _args: m.modes.append(m.training))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    with fp.dropout_off():
        for seed in (1, 2):
            torch.manual_seed(seed)  # a dropout dropout_off cannot reach (torch's fused attention): the same
            step(model, opt, batch_values(keys, rows, classes, seed))
            out.append(parameters_of(model))
    return model, out


def reference(classes: int, clip: float | None, zero_grad: bool = True) -> Any:
    def step(model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, Tensor]) -> None:
        model.train()
        if zero_grad:
            opt.zero_grad()
        own_loss(model, batch, classes).backward()
        update(model, opt, clip)
    return step


def check_own_classifier_step(comp: Component, ctx: Context, reads: tuple, base: nn.Module, classes: int,
                              clip: float | None) -> ComponentResult:
    """The step of `reads` (`step_reads`) on the learner's classifier `base`, against handformer's."""
    res = ctx.result(comp)
    model_arg, opt_arg, batch_arg, keys = reads
    rows = next(m.num_embeddings for m in base.modules() if isinstance(m, nn.Embedding))

    def learners(model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, Tensor]) -> Any:
        fields = Fields(batch)  # read by key or by field, as Hugging Face's BatchEncoding is
        return ctx.learner.call("forward", comp.obj, **{model_arg: model, opt_arg: opt, batch_arg: fields})

    with torch.enable_grad():
        model, got = _steps(learners, base, keys, rows, classes)
        right = _steps(reference(classes, clip), base, keys, rows, classes)[1]
        err = res.max_abs_error = max(largest_difference(g, r) for g, r in zip(got, right))
        res.checks.append(Check(COMPARED, err < TOL, error_text(err)))
        if err >= TOL:
            kept = _steps(reference(classes, clip, zero_grad=False), base, keys, rows, classes)[1]
            if max(largest_difference(g, r) for g, r in zip(got, kept)) < TOL:
                res.findings.append(_finding(comp, "train_step_no_zero_grad", NOT_ZEROED))
    if model.modes and not any(model.modes):
        res.findings.append(_finding(comp, "train_step_eval_mode", text(
            "the model was handed over in eval mode and your step ran every call so",
            "模型交给你时处于 eval 模式，你的一步每次调用都这样运行它")))
    name, read = type(base).__name__, ", ".join(keys)
    res.notes.append(text(f"driven with your own {name} (checked on its own) and batches with the keys your "
                          f"step reads ({read})",
                          f"用你自己的 {name}（它另有自己的检查）驱动，batch 带着你的一步读的键（{read}）"))
    return finish(res)


COMPARED = text("the parameters after each of 2 steps equal handformer's step's (SGD, the model's own loss "
                "on the same batch)",
                "两步中每一步之后的参数与 handformer 的一步相同（SGD，"
                "模型在同一 batch 上自己的损失）")
NOT_ZEROED = text("your parameters equal those of a step that never zeroes the gradients: step 2 adds "
                  "step 1's",
                  "你的参数与从不清零梯度的一步结果一致：第 2 步加上了第 1 步的梯度")


def _finding(comp: Component, name: str, observed: Any) -> Finding:
    number, code = locate(name, source_lines([comp.obj]))
    return Finding(name, observed, number, code)
