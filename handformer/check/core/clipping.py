"""How a training step clips its gradients, read from its code (comments and docstrings are no code: a
docstring that says "no clip_grad_norm_ needed" clips nothing): the call of a clipping function
(torch's clip_grad_norm_ or clip_grad_value_, CS336's gradient_clipping, a helper of the file's own),
the number it clips at, whether it clips by value, and whether it comes after the optimizer's step."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

CLIPPING = re.compile(r"clip\w*grad|grad\w*clip")
# the keywords of a clipping call that are not the number it clips at
NOT_THE_NUMBER = ("parameters", "params", "norm_type", "error_if_nonfinite", "foreach")
# an optimizer's step: optimizer.step() (opt, self.optimizer, ...), or a loss scaler's scaler.step(optimizer)
OPTIMIZER_STEP = re.compile(r"\bopt\w*\.step\(|\.step\(\s*opt\w*\s*\)")


class ValueClip(float):
    """The number a step clips each gradient element at (clip_grad_value_), where a plain float is the
    norm it clips the whole gradient to."""


def _calls(source: str) -> list[ast.Call]:
    """The calls in the code (a function's source, dedented), in the order written; none where it does
    not parse."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    return sorted(filter(lambda node: isinstance(node, ast.Call), ast.walk(tree)), key=_at)


def _at(call: ast.Call) -> tuple[int, int]:
    return call.lineno, call.col_offset


def _name(call: ast.Call) -> str:
    """The called function's name: clip_grad_norm_ of torch.nn.utils.clip_grad_norm_(...)."""
    return getattr(call.func, "attr", None) or getattr(call.func, "id", "")


def clip_calls(source: str) -> list[ast.Call]:
    """The calls of a clipping function in the code, in the order written."""
    return [call for call in _calls(source) if CLIPPING.search(_name(call))]


def _number(value: Any, otherwise: float) -> float:
    """value as a float where it is a number (no bool), else `otherwise`."""
    return float(value) if type(value) in (int, float) else otherwise


def clip_norm(source: str, defaults: dict[str, Any]) -> float | None:
    """The number a training step's code clips its gradients at (clip_grad_norm_(params, 1.0), CS336's
    gradient_clipping(params, 1.0): 1.0; clip_grad_norm_(params, max_norm) with the step's
    `max_norm=0.5`: its default, from `defaults`; a number it reads elsewhere (cfg.grad_clip), or none
    written: 1.0), a ValueClip where it clips each element (clip_grad_value_), None when it clips none.
    What it clips at is the call's second argument, or its keyword that is not the parameters."""
    calls = clip_calls(source)
    if not calls:
        return None
    keywords = [k.value for k in calls[0].keywords if k.arg not in NOT_THE_NUMBER]
    node = (calls[0].args[1:2] or keywords or [None])[0]
    value = getattr(node, "value", defaults.get(getattr(node, "id", None)))  # a constant's, or a default's
    return (ValueClip if "value" in _name(calls[0]) else float)(_number(value, 1.0))


def argued_norm(clip: float | None, argument: str | None, defaults: dict[str, Any]) -> float | None:
    """The norm a step clips at, where its code calls no clipping function but it takes a clipping argument
    (max_grad_norm=1.0, or one without a default: 1.0 handed): the argument says it clips, so it is
    compared with a step that does (train_step_not_clipped where it never did). An argument that is None
    or 0 by default says clipping is off unless asked for: none."""
    if clip is not None or argument is None:
        return clip
    default = defaults.get(argument, inspect.Parameter.empty)
    return _number(1.0 if default is inspect.Parameter.empty else default, 0.0) or None


def clips_after_step(source: str) -> bool:
    """Whether a step's code clips the gradients after the optimizer's step (in the order written; a
    loss scaler's `scaler.step(optimizer)` is the optimizer's)."""
    clips = clip_calls(source)
    steps = [call for call in _calls(source) if OPTIMIZER_STEP.search(ast.unparse(call))]
    return bool(clips and steps and _at(clips[0]) > _at(steps[0]))
