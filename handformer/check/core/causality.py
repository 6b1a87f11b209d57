"""Causality of a causal language model, one check for every runner that has one (runners/gpt.py on a
model it maps, runners/lm_properties.py on one it cannot): changing token AT leaves the logits before it
unchanged. Run at the whole context where the model takes it (a leak through a summary of 16 keys shows
only past them), else at the ids given; skipped where the model's eval mode is not deterministic (a
random draw moves the logits of the same ids: its determinism check says so). A leak FAILs at the first
of the model's modules whose output before AT moves though its inputs do not (forward hooks, in the
order they return), at the line of its code that builds or applies its mask: causal_mask_missing where
an attention leaks at every earlier position and its code has no mask, causal_off_by_one where only the
one before moves. The leak is added only where no catalogued mistake is named already and at a line not
quoted yet.

Shape legend: B batch, T length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import Component
from handformer.check.core.leak_steps import leaking_step
from handformer.check.core.localize import Step, statement
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import first_line, functions_called, locate, methods_called, source_lines
from handformer.check.core.unmapped import FREE_FORM

AT = 5  # the token changed; positions 0..AT - 1 must not move
# where a module builds or applies its mask, in the order tried
MASK_LINES = (r"\b(tril|triu)\s*\(", r"mask\w*\s*=[^=]", r"masked_fill|\bis_causal\b|\bwhere\s*\(.*mask",
              r"mask")
MASKED = "|".join(MASK_LINES)
SAID = text(f"changing token {AT} leaves logits 0..{AT - 1} unchanged",
            f"改变位置 {AT} 的 token，不影响位置 0..{AT - 1} 的 logits")


def check_causality(res: ComponentResult, comp: Component, module: nn.Module, logits: Callable[[Tensor], Any],
                    ids: tuple[Tensor, ...], vocab: int) -> Text | None:
    """The check on `module` (its logits (B, T, V) of ids by `logits`), at the first of `ids` (the whole
    context, then shorter) it runs on, token AT changed to the next of `vocab`; its words where it holds
    (None where it leaks or was not run)."""
    idx, first = _first_run(logits, ids)
    if first is None:
        return None
    bumped = idx.clone()
    bumped[:, AT] = (bumped[:, AT] + 1) % vocab
    second = logits(bumped)
    rows = moved_rows(first, second, idx.shape)
    if rows < 0 or moved_rows(first, logits(idx), idx.shape):  # nothing to compare; or a random draw in
        return None  # eval mode moves it all (its determinism check says so)
    largest = float((first - second)[:, :AT].abs().nan_to_num(float("inf")).max())
    res.checks.append(Check(text(f"causality: {SAID['en']}", f"因果性：{SAID['zh']}"), not rows, text(
        f"moved by {largest:.3g} at {rows} of them", f"其中 {rows} 个位置变了，最多变化 {largest:.3g}")))
    if rows:
        leak = leak_finding(module, logits, idx, bumped, comp)
        res.findings += [leak] * (not res.named() and leak.line not in {f.line for f in res.findings})
    return None if rows else SAID


def _first_run(logits: Callable[[Tensor], Any], ids: tuple[Tensor, ...]) -> tuple[Tensor, Any]:
    """The first of the ids the model runs on, with its logits; (the last, None) where it runs on none (the
    length is check's choice, not one the learner's code takes)."""
    for idx in ids:
        try:
            return idx, logits(idx)
        except Exception:  # noqa: BLE001 - check's length, not the learner's: a shorter one is tried
            continue
    return ids[-1], None


def _tolerance(values: Tensor) -> float:
    """Rounding, at the values' precision and scale, and no less than 1e-9 (float64's sums in another
    order)."""
    eps = torch.finfo(torch.promote_types(values.dtype, torch.float32)).eps  # ids: at float32's
    return max(1e3 * eps * max(1.0, float(values.abs().max())), 1e-9)


def leak_finding(module: nn.Module, logits: Callable[[Tensor], Any], idx: Tensor, bumped: Tensor,
                 comp: Component) -> Finding:
    """The first of the model's modules whose output before position AT moves when token AT changes, at
    the line of its code that builds or applies its mask (`_leak_line`); named causal_mask_missing where
    an attention leaks at every earlier position and its code has no mask, causal_off_by_one where only
    the one before moves, else the departure there."""
    name, sub, rows, given, T = first_leak(module, logits, idx, bumped)
    owner, attr = _owner(module, name, sub)
    number, code, named = _leak_line(owner, attr, rows)
    inner = None if attr or named == "causal_mask_missing" else _inner_leak(
        owner, *_whole_length(module, logits, idx, bumped, sub, given, T))
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


def _whole_length(module: nn.Module, logits: Callable[[Tensor], Any], idx: Tensor, bumped: Tensor,
                  sub: nn.Module | None, given: tuple[list[Any], list[Any]], T: int,
                  ) -> tuple[tuple[list[Any], list[Any]], int]:
    """The leaking module's inputs at the whole length of idx where it leaks there too (its own code is
    read at the context's length: a width of the model one past a shorter length would pass for a
    padding), else those found one token short."""
    whole = _first_leak(module, logits, idx, bumped)
    return (whole[3], whole[4]) if whole[1] is sub and sub is not None else (given, T)


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


Leak = tuple[str, nn.Module | None, int, tuple[list[Any], list[Any]], int]


def first_leak(module: nn.Module, logits: Callable[[Tensor], Any], idx: Tensor, bumped: Tensor) -> Leak:
    """(name, module, how many positions before AT move, its inputs in both runs, the length run) of the
    first module, in the order their forwards return, whose output (B, T, ...) moves before AT though its
    inputs do not: the one whose own code lets a position see a later one; ("", None, AT, ([], []), T)
    where none does. Run one token short of idx first: a
    length that is no width of the model, so that a tensor laid out (B, C, T) (a convolution's) is read
    along T even where C equals the whole context."""
    found = _first_leak(module, logits, idx[:, :-1], bumped[:, :-1])
    return found if found[1] is not None else _first_leak(module, logits, idx, bumped)


def _first_leak(module: nn.Module, logits: Callable[[Tensor], Any], idx: Tensor, bumped: Tensor) -> Leak:
    runs = [_outputs(module, logits, x) for x in (idx, bumped)]
    moved = functools.partial(moved_rows, shape=idx.shape)
    for (name, sub, ins, a), (_, _, ins_b, b) in zip(*runs):
        if moved(a, b) > 0 >= max(map(moved, ins, ins_b), default=0):
            return name, sub, moved(a, b), (ins, ins_b), idx.size(1)
    return "", None, AT, ([], []), idx.size(1)


def moved_rows(a: Any, b: Any, shape: torch.Size) -> int:
    """How many of the positions before AT differ between two tensors of the batch's (B, T, ...), or laid
    out (B, C, T) (a 1-D convolution's); -1 where either is neither, or they are not alike."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dim() > 1
            and a.size(0) == shape[0] and shape[1] in (a.size(1), a.size(-1) if a.dim() == 3 else -1)):
        return -1  # (B, H, T, T) scores are no layout of positions: row T - 1 of them sees every key
    along = 1 if a.size(1) == shape[1] else -1  # the axis of the positions
    before = (a - b).double().movedim(along, 1)[:, :AT]  # (B, AT, ...)
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


