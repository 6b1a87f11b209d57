"""What every correct causal language model does, whatever its architecture: properties read with no
reference, run where check could not map the model onto handformer's CausalLM (a depthwise convolution, a
recurrent cell, a sparse selection). A broken property FAILs; held, each is said, and the rest of the
model stays NOT CHECKED.

- causality (core/causality.py, the check the mapped model's runner makes too): changing token t leaves
  the logits before t unchanged; where it does not, the first of the model's modules whose output before
  t moves (forward hooks, in the order they return) is named, with the line of its code that builds or
  applies its mask;
- its own loss: a model handed targets returns the cross-entropy of its own logits against the next
  tokens (the targets as given, nanoGPT's, or shifted inside, Hugging Face's labels); one that scores
  each position against its own token is train_step_no_shift.

Each is skipped where the source gives a reason it need not hold: a prefix or bidirectional part (a
prefix-LM), a loss with more than the cross-entropy in it (it matches neither form: not compared).

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.causality import check_causality, moved_rows
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import first_line, source_lines
from handformer.check.core.unmapped import FREE_FORM
from handformer.check.runners.model_loss import unshifted_finding

Call = Callable[[Tensor, Tensor | None], tuple[Tensor | None, Tensor | None]]  # idx, targets -> logits, loss

# a model allowed to look ahead somewhere: a prefix-LM's bidirectional prefix, a mask made not causal
NOT_CAUSAL = r"\bprefix_?(lm|len|length|mask)\b|bidirectional|\bis_causal\s*=\s*False|\bcausal\s*=\s*False"
# its own code calls the model with its inputs as its targets: model(x, x), lm(ids, labels=ids)
SAME_AS_TARGETS = re.compile(r"\b\w*model\w*\s*\(\s*(\w+)\s*,\s*(?:\w+\s*=\s*)?\1\s*[,)]"
                             r"|\(\s*(\w+)\s*,\s*(?:targets?|labels)\s*=\s*\2\s*[,)]")


def free_properties(res: ComponentResult, comp: Component, module: nn.Module, call: Call,
                    batch: tuple[Tensor, Tensor, Tensor], file: str) -> None:
    """The properties every causal language model has, on one the reference could not take: `batch` the
    ids of its whole context (causality), and ids and targets (its loss); `file` the source of the
    learner's file. A finding where one breaks (the result FAILs); a note of those that held."""
    long, idx, targets = batch
    held = list(filter(None, (_causal(res, comp, module, call, long, _code(file)),
                              own_loss(res, comp, call, idx, targets, file))))
    en, zh = "; ".join(map(operator.itemgetter("en"), held)), "；".join(map(operator.itemgetter("zh"), held))
    res.notes += [text(f"checked with no reference, properties every causal language model has: {en}",
                       f"不用参考实现，检查了每个因果语言模型都有的性质：{zh}")] * bool(held)


def _causal(res: ComponentResult, comp: Component, module: nn.Module, call: Call, idx: Tensor, code: str,
            ) -> Text | None:
    """Causality (core/causality.py) at the whole context `idx`, where the source makes no part of the
    model look ahead (NOT_CAUSAL); its words where it holds."""
    if re.search(NOT_CAUSAL, code):
        return None
    return check_causality(res, comp, module, lambda x: call(x, None)[0], (idx,), int(idx.max()) + 1)


def _code(file: str) -> str:
    """The file's source with its comments left out: what a comment says sets nothing."""
    return re.sub(r"#[^\n]*", "", file)


def own_loss(res: ComponentResult, comp: Component, call: Call, idx: Tensor, targets: Tensor, file: str,
             ) -> Text | None:
    """The loss the model returns against the cross-entropy of its own logits, of the targets as given or
    shifted inside: compared as the change between two sets of targets, so that a term of its own that the
    targets do not move (a router's balance loss) drops out. Of each position's own token is
    train_step_no_shift, and so is the targets as given where the file trains the model with its inputs as
    its targets (it must shift them itself): WRONG. Its words where it holds."""
    other = targets.roll(1, 0).flip(1)  # (B, T): other targets for the same ids
    (logits, loss), (_, loss_b) = call(idx, targets), call(idx, other)
    if moved_rows(logits, logits, targets.shape) < 0 or not _one_number(loss, loss_b):
        return None
    moved = loss.detach() - loss_b.detach()
    form = next(filter(lambda f: fp.relative_error(moved, _ce(logits, targets, f) - _ce(logits, other, f))
                       < fp.REL_TOL, FORMS), None)
    if form is None:  # another loss, or a term the targets move: not compared
        return None
    wrong, (en, zh) = bool(WRONG[form](_code(file))), WORDS[form]
    said = text("its loss is the cross-entropy of its own logits against the next tokens",
                "它的损失是它自己的 logits 对下一个 token 的交叉熵")
    res.checks.append(Check(said, not wrong, text(f"it moves as the cross-entropy of {en}",
                                                  f"它的变化等于{zh}算出的交叉熵的变化")))
    said_so = "train_step_no_shift" in map(operator.attrgetter("name"), res.findings)  # by the reference
    res.findings += [_unshifted(comp)] * (wrong > said_so)
    return None if wrong else said


# the logits' and the targets' positions each form compares: (logits, targets)
FORMS = {"as given": (slice(None), slice(None)), "shifted": (slice(None, -1), slice(1, None)),
         "own": (slice(None, -1), slice(None, -1))}


def _trains_on_inputs(code: str) -> bool:
    """Whether the file trains the model with its inputs as its targets: a call `model(x, x)` followed
    within a few lines by a `backward()` (a demo that prints such a loss, or its shape, trains nothing)."""
    after = (code[m.end():].split("\n")[:8] for m in SAME_AS_TARGETS.finditer(code))
    return any(".backward(" in "\n".join(lines) for lines in after)


# whether a loss of the form is wrong, given the file's code: its own token always; the targets as given
# where the file trains the model with its inputs as its targets
WRONG: dict[str, Callable[[str], Any]] = {"own": lambda code: True, "as given": _trains_on_inputs,
                                          "shifted": lambda code: False}


def _ce(logits: Tensor, targets: Tensor, form: str) -> Tensor:
    """The mean cross-entropy of the logits (B, T, V) at the positions the form keeps against the targets."""
    cut = FORMS[form]
    return F.cross_entropy(logits[:, cut[0]].flatten(0, 1), targets[:, cut[1]].reshape(-1))


def _one_number(*losses: Any) -> bool:
    return all(isinstance(x, Tensor) and x.numel() == 1 for x in losses)


def _unshifted(comp: Component) -> Finding:
    """train_step_no_shift at the line that slices the labels or logits for the shift, else the line that
    hands the targets to the loss, else the loss's line (FREE_FORM: no setting explains it)."""
    found = unshifted_finding(comp)
    lines = source_lines([getattr(comp.obj, "forward", comp.obj)])
    number, code = (found.line, found.code) if found.line else first_line(LOSS_LINES, lines)
    return replace(found, line=number, code=code, form=FREE_FORM)


# where a loss reads its targets: handed to it reshaped, else the loss's call
LOSS_LINES = (r"\b(targets?|labels|y)\s*\.\s*(reshape|view|flatten)\s*\(",
              r"\bcross_entropy\s*\(|\bnll_loss\s*\(")
WORDS = {"as given": ("the targets as given", "按给定位置的目标"),
         "shifted": ("the targets one position on", "按错开一位的目标"),
         "own": ("each position's own token", "以每个位置自己的 token 为目标")}
