"""The windows a language model's training step draws from a function of its own file, taking none
(`xb, yb = get_batch('train')` in the Chinese walkthroughs of Karpathy's lecture): the step is driven
with check's windows in its place (lm_train_step.Drawn), and the learner's own function is called
once as the step called it, on its own data. Its targets must be its inputs moved on by one token
(`y[:, :-1] == x[:, 1:]`); targets that are the inputs themselves are train_step_no_shift, at the line
of the function that made them.

Shape legend: B batch, T length.
"""

from __future__ import annotations

import inspect
import linecache
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context
from handformer.check.core.localize import trace_steps
from handformer.check.core.result import Check, ComponentResult, Finding, text

Call = tuple[tuple[Any, ...], dict[str, Any]]  # the arguments the step called the function with


def drawn(ctx: Context, fn: Any, args: Call) -> Any:
    """The learner's function called as the step called it, its random draws seeded (the same windows
    each time: the traced call makes those of the checked one)."""
    state = torch.get_rng_state()
    torch.manual_seed(0)
    try:
        return ctx.learner.call("forward", fn, *args[0], **args[1])
    finally:
        torch.set_rng_state(state)


def own_windows(ctx: Context, fn: Any, args: Call) -> tuple[Tensor, Tensor, Tensor] | None:
    """The (x, y) windows the learner's function returns for the call the step made, and where y is
    not x moved on by one token, (B, T - 1); None where it raises (nanoGPT's reads its data from
    files) or returns no two (B, T) tensors that can be compared so."""
    try:
        x, y = (t.cpu() for t in drawn(ctx, fn, args))
        return x, y, y[:, :-1] != x[:, 1:]  # (B, T - 1)
    except (fp.LearnerFailure, TypeError, ValueError, AttributeError, IndexError, RuntimeError):
        return None


def check_windows(res: ComponentResult, ctx: Context, fn: Any, args: Call) -> None:
    """The check that the windows the step's own function draws are shifted by one token, and the
    finding where they are not (the inputs given as the targets: at the line that made them)."""
    drawn_here = own_windows(ctx, fn, args)
    if drawn_here is None:
        return
    x, y, differ = drawn_here
    ok = not bool(differ.any())
    name = fn.__name__
    res.checks.append(Check(text(f"the windows your {name} draws: the targets y are the inputs x moved on by "
                                 "one token (y[:, :-1] == x[:, 1:])",
                                 f"你的 {name} 取出的窗口：目标 y 是输入 x 往后移一个 token"
                                 "（y[:, :-1] == x[:, 1:]）"), ok, text(
        f"{int(differ.sum())} of {differ.numel()} positions differ",
        f"{differ.numel()} 个位置里有 {int(differ.sum())} 个不同")))
    if not ok and torch.equal(x, y):
        number, code = _made_at(ctx, fn, args, y)
        res.findings.append(Finding("train_step_no_shift", text(
            f"your {name} returns targets equal to its inputs: each position is scored on its own token, "
            "not the next one", f"你的 {name} 返回的目标与输入相同：每个位置对的是自己的 token，"
            "不是下一个"), number, code))


def _made_at(ctx: Context, fn: Any, args: Call, y: Tensor) -> tuple[int | None, str | None]:
    """The line of the learner's function that made the targets equal to the inputs: of the tensors it
    assigns that hold them, the first under a second name (the first name is the inputs'), traced on
    the same seeded call."""
    filename = inspect.getsourcefile(fn)
    try:
        steps = trace_steps(lambda: drawn(ctx, fn, args), filename, constants=(torch.int64,))
    except fp.LearnerFailure:
        return None, None
    held = [s for s in steps if torch.equal(s.value.cpu().to(y.dtype), y)]  # the inputs, then the targets
    named = [s.name for s in held]
    names = list(dict.fromkeys(named))
    if len(names) < 2:
        return None, None
    at = held[named.index(names[1])]
    return at.line, linecache.getline(filename, at.line).strip()
