"""What every correct causal language model does, whatever its architecture: properties read with no
reference, run where check could not map the model onto handformer's CausalLM (a depthwise convolution, a
recurrent cell, a sparse selection). A broken property FAILs; held, each is said, and the rest of the
model stays NOT CHECKED.

- causality: changing token t leaves the logits before t unchanged; where it does not, the first of the
  model's modules whose output before t moves (forward hooks, in the order they return) is named, with
  the line of its code that builds or applies its mask;
- its own loss: a model handed targets returns the cross-entropy of its own logits against the next
  tokens (the targets as given, nanoGPT's, or shifted inside, Hugging Face's labels); one that scores
  each position against its own token is train_step_no_shift.

Each is skipped where the source gives a reason it need not hold: a prefix or bidirectional part (a
prefix-LM), a loss with more than the cross-entropy in it (it matches neither form: not compared).

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import Component
from handformer.check.core.leak_steps import leaking_step
from handformer.check.core.localize import Step, statement
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import first_line, functions_called, locate, methods_called, source_lines
from handformer.check.core.unmapped import FREE_FORM
from handformer.check.runners.model_loss import unshifted_finding

Call = Callable[[Tensor, Tensor | None], tuple[Tensor | None, Tensor | None]]  # idx, targets -> logits, loss

AT = 5  # the token changed; positions 0..AT - 1 must not move
# a model allowed to look ahead somewhere: a prefix-LM's bidirectional prefix, a mask made not causal
NOT_CAUSAL = r"\bprefix_?(lm|len|length|mask)\b|bidirectional|\bis_causal\s*=\s*False|\bcausal\s*=\s*False"
# where a module builds or applies its mask, in the order tried
MASK_LINES = (r"\b(tril|triu)\s*\(", r"mask\w*\s*=[^=]", r"masked_fill|\bis_causal\b|\bwhere\s*\(.*mask",
              r"mask")
MASKED = "|".join(MASK_LINES)
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
    """Causality, where the source makes no part of it look ahead (NOT_CAUSAL); a leak FAILs at the first
    module that leaks (leak_finding). Its words where it holds."""
    if re.search(NOT_CAUSAL, code):
        return None
    bumped = idx.clone()
    bumped[:, AT] = (bumped[:, AT] + 1) % (int(idx.max()) + 1)  # another token of the vocabulary
    try:
        first = call(idx, None)[0]
    except Exception:  # noqa: BLE001 - the whole context is check's length, not one the learner's code takes
        return None
    rows = _moved_rows(first, call(bumped, None)[0], idx.shape)
    if rows < 0 or _moved_rows(first, call(idx, None)[0], idx.shape):  # nothing to compare; or a random
        return None  # draw in eval mode moves it all (its determinism check says so)
    said = text(f"changing token {AT} leaves the logits at 0..{AT - 1} unchanged",
                f"改变位置 {AT} 的 token，位置 0..{AT - 1} 的 logits 不变")
    res.checks.append(Check(text(f"causality: {said['en']}", f"因果性：{said['zh']}"), not rows, text(
        f"{rows} of them moved", f"其中 {rows} 个位置变了")))
    res.findings += [leak_finding(module, lambda x: call(x, None)[0], idx, bumped, comp)] * bool(rows)
    return None if rows else said


def _tolerance(values: Tensor) -> float:
    """Rounding, at the values' precision and scale."""
    eps = torch.finfo(torch.promote_types(values.dtype, torch.float32)).eps  # ids: at float32's
    return 1e3 * eps * max(1.0, float(values.abs().max()))


def leak_finding(module: nn.Module, logits: Callable[[Tensor], Any], idx: Tensor, bumped: Tensor,
                 comp: Component) -> Finding:
    """The first of the model's modules whose output before position AT moves when token AT changes, at
    the line of its code that builds or applies its mask (`_leak_line`); named causal_mask_missing where
    an attention leaks at every earlier position and its code has no mask, causal_off_by_one where only
    the one before moves, else the departure there."""
    name, sub, rows, given = first_leak(module, logits, idx, bumped)
    owner, attr = _owner(module, name, sub)
    number, code, named = _leak_line(owner, attr, rows)
    inner = None if attr or named == "causal_mask_missing" else _inner_leak(owner, given, idx.size(1))
    number, code, named = (inner.line, statement(_file(owner), inner.line), None) if inner else (
        number, code, named)
    where = f" first in {name} ({type(sub).__name__})" * bool(name)
    where_zh = f"最先出现在 {name}（{type(sub).__name__}）" * bool(name)
    return Finding(named or DEPARTS, text(
        f"changing token {AT} moves the logits before it: the future leaks{where}, at {rows} of the "
        f"{AT} earlier positions", f"改变位置 {AT} 的 token，它之前的 logits 也变了：未来的信息泄漏了，"
        f"{where_zh}，{AT} 个更早的位置中有 {rows} 个受影响"), number, code, FREE_FORM)


def _inner_leak(owner: nn.Module, given: tuple[list[Any], list[Any]], T: int) -> Step | None:
    """The first line of the owner's own code whose tensor moves before AT (`leaking_step`), where no line
    applying its mask lets the future in: the leak is quoted there, not at the mask, which is right (a
    softmax over the queries' axis, a convolution over positions padded on the right)."""
    return quietly(lambda: leaking_step(lambda args: owner(*args), given, T, AT, _file(owner), MASKED))


def _file(owner: nn.Module) -> str:
    return type(owner).forward.__code__.co_filename


def _owner(module: nn.Module, name: str, sub: nn.Module | None) -> tuple[nn.Module, str]:
    """The learner's module whose code leaks, and the attribute it holds torch's leaking layer by ("" where
    the leaking module is the learner's own; the model where none was found)."""
    if sub is None or type(sub).__module__.startswith("learner_"):
        return sub or module, ""
    path, _, attr = name.rpartition(".")
    return module.get_submodule(path), attr


def _leak_line(owner: nn.Module, attr: str, rows: int) -> tuple[int | None, str | None, str | None]:
    """(line, code, mistake's name or None): where the owner builds torch's leaking layer (`attr`), else
    its code's first mask line (MASK_LINES), else the line its forward returns from."""
    forward = type(owner).forward
    lines = source_lines([forward, *functions_called(forward), *methods_called(forward), type(owner)])
    built = first_line((rf"self\.{attr}\s*=",), source_lines([type(owner)])) if attr else (None, None)
    number, code = built if built[0] else first_line(MASK_LINES, lines)
    attends = first_line((r"softmax|attention|\battn\b",), lines)[0] is not None
    named = {AT: "causal_mask_missing" * (number is None), 1: "causal_off_by_one"}.get(rows * attends) or None
    if named is not None and number is None:
        number, code = locate(named, lines)
    if number is None:
        number, code = first_line((r"^\s*return\b",), source_lines([forward]))
    return number, code, named


def first_leak(module: nn.Module, logits: Callable[[Tensor], Any], idx: Tensor, bumped: Tensor,
               ) -> tuple[str, nn.Module | None, int, tuple[list[Any], list[Any]]]:
    """(name, module, how many positions before AT move, its inputs in both runs) of the first module, in
    the order their forwards return, whose output (B, T, ...) moves before AT though its inputs do not:
    the one whose own code lets a position see a later one; ("", None, AT, ([], [])) where none does."""
    runs = [_outputs(module, logits, x) for x in (idx, bumped)]
    moved = functools.partial(_moved_rows, shape=idx.shape)
    for (name, sub, ins, a), (_, _, ins_b, b) in zip(*runs):
        if moved(a, b) > 0 >= max(map(moved, ins, ins_b), default=0):
            return name, sub, moved(a, b), (ins, ins_b)
    return "", None, AT, ([], [])


def _moved_rows(a: Any, b: Any, shape: torch.Size) -> int:
    """How many of the positions before AT differ between two tensors of the batch's shape (B, T, ...);
    -1 where either is not one, or they are not alike."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.shape[:2] == shape):
        return -1
    before = (a - b).double()[:, :AT]  # (B, AT, ...)
    diff = before.reshape(*before.shape[:2], -1).abs().nan_to_num(float("inf")).amax(dim=(0, 2))  # (AT,)
    return int((diff > _tolerance(a)).sum())


def _outputs(module: nn.Module, logits: Callable[[Tensor], Any], x: Tensor,
             ) -> list[tuple[str, nn.Module, list[Any], Any]]:
    """Each submodule's (name, module, inputs, first output tensor), copied, in the order the forwards
    return."""
    seen: list[tuple[str, nn.Module, list[Any], Any]] = []
    subs = list(module.named_modules())[1:]
    handles = [sub.register_forward_hook(functools.partial(_keep, seen, name)) for name, sub in subs]
    try:
        fp.quietly(lambda: logits(x))
    finally:
        for h in handles:
            h.remove()
    return seen


def _keep(seen: list[tuple[str, nn.Module, list[Any], Any]], name: str, sub: nn.Module, args: Any, out: Any,
          ) -> None:
    seen.append((name, sub, list(map(_copy, args)), _copy(fp.first_tensor(fp.outputs(out)))))


def _copy(value: Any) -> Any:
    """A tensor detached and copied (their code may change it in place after); anything else as it is."""
    return value.detach().clone() if isinstance(value, Tensor) else value


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
    if _moved_rows(logits, logits, targets.shape) < 0 or not _one_number(loss, loss_b):
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
