"""Where a mixture of experts parts from the reference (moe_layer.py), when no catalogued mistake
explains it: the learner's forward traced, each of its parts' outputs recorded at the line that calls
it, against the reference's sub-steps in order (the router's logits and softmax, the top-k weights,
renormalized and scaled, each expert's output, the routed sum, each shared expert's gate and output,
the output).

    views = moe_views(x, router, experts, shared, k, normalize, scale)
    found = localize_moe(module, x, [views])   # line 37: out = out + self.shared_gate(h) * self.shared(h)

Two things a mixture writes that the reference does not take in one step are read so:
- a loop over the experts adds into one tensor (`out.index_add_(0, token, ...)`, `y[mask] += ...`):
  its values after each expert but the last are partial sums, so only the last value a line gives a
  name is a step;
- the top-k weights come in any order (`topk(..., sorted=False)`): a step whose last axis is K is
  judged with its rows sorted, as the reference's are.

Shape legend: B batch, T length, D d_model, E experts, K experts a token, N = B * T.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core.fingerprint import hooked, quietly
from handformer.check.core.localize import Departure, Step, View, latest_departure, trace_steps
from handformer.check.core.localize_kinds import method_codes, traced_parts


def moe_views(x: Tensor, router: tuple[Tensor, Tensor | None], experts: list[Any], shared: list[Any], k: int,
              normalize: bool, scale: float) -> list[View]:
    """The reference mixture's sub-steps on x (B, T, D), in order (see moe_layer.mixture)."""
    logits = F.linear(x, *router)  # (B, T, E)
    probs = torch.softmax(logits, dim=-1)  # (B, T, E)
    top, chosen = probs.topk(k, dim=-1)  # (B, T, K), sorted
    weights = (top / top.sum(-1, keepdim=True) if normalize else top) * scale  # (B, T, K)
    outs = torch.stack([expert(x) for expert in experts], dim=-2)  # (B, T, E, D)
    picked = outs.gather(-2, chosen[..., None].expand(*chosen.shape, outs.size(-1)))  # (B, T, K, D)
    routed = (weights[..., None] * picked).sum(-2)  # (B, T, D)
    views = [("the input x", x), ("the router's logits", logits), ("the router's softmax", probs),
             ("the top-k weights", top), ("the top-k weights, renormalized and scaled", weights),
             ("the weights on each expert, 0 where not chosen", _spread(weights, chosen, probs))]
    views += [(f"expert {e}'s output", outs[..., e, :]) for e in range(outs.size(-2))]
    views.append(("the routed experts' weighted sum", routed))
    total = routed
    for s in shared:
        views += _shared_views(s, x)
        total = total + s(x)  # (B, T, D)
        views.append(("the routed sum plus the shared experts'", total))
    return views + [("the output", total)]


def _spread(weights: Tensor, chosen: Tensor, probs: Tensor) -> Tensor:
    """The weights (B, T, K) at the experts chosen, in a row of E; 0 at the others."""
    return torch.zeros_like(probs).scatter(-1, chosen, weights)  # (B, T, E)


def _shared_views(shared: Any, x: Tensor) -> list[View]:
    """A shared expert's output, and where a sigmoid gate of its own scales it (moe_layer.ScaledShared),
    the gate's logits, its sigmoid and the product."""
    out = [("the shared expert's output", shared.expert(x))]  # (B, T, D)
    if shared.gate is None:
        return out
    g = shared.gate(x)  # (B, T, 1)
    return out + [("the shared expert's gate logits", g),
                  ("sigmoid(the shared expert's gate)", torch.sigmoid(g)),
                  ("the shared expert's output times its gate", shared(x))]


def localize_moe(module: nn.Module, x: Tensor, readings: list[list[View]], ks: set[int]) -> Departure | None:
    """Run the learner's mixture on x (B, T, D) traced (its class's methods, its parts' outputs); the
    first step no reading explains, of the last values each line gives a name, the rows of those whose
    last axis is one of the readings' `ks` (fewer than the experts) sorted; where that step is made by
    a part of theirs (a router class: `topk_idx, topk_weight = self.gate(x)`), the step inside it."""
    x = x.detach().requires_grad_()
    return _departure_in(lambda: module(x), module, readings, ks, inspect.getsourcefile(type(module)))


def _departure_in(run: Callable[[], Any], module: nn.Module, readings: list[list[View]], ks: set[int],
                  filename: str, depth: int = 2) -> Departure | None:
    """`localize_moe` on `run()`, a call of `module`, going into the part called at the departing line
    down `depth` parts."""
    code = method_codes(type(module))
    calls: dict[int, tuple[nn.Module, Any, dict[str, Any]]] = {}  # line -> the part called there
    parts = traced_parts(module)
    with hooked([m.register_forward_hook(_called(calls, filename), with_kwargs=True) for _, m in parts]):
        steps = trace_steps(run, filename, code, parts)
    D = readings[0][0][1].size(-1)  # the input x (B, T, D), each reading's first view
    found = latest_departure(_last_values(steps, ks), readings, filename, {"d_model": D})
    part = found and (found.part or calls.get(found.line))
    if not part or not depth:
        return found
    inner = quietly(lambda: _departure_in(lambda: part[0](*part[1], **part[2]), part[0], readings, ks,
                                          filename, depth - 1))
    return inner if inner and inner.line else found


def _called(calls: dict[int, Any], filename: str) -> Callable[..., None]:
    """A hook that keeps each part's call (it, its inputs) under the line of `filename` that made it."""
    def keep(module: nn.Module, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != filename:
            frame = frame.f_back
        calls.update({frame.f_lineno: (module, args, kwargs)} if frame else {})
    return keep


def _last_values(steps: list[Step], ks: set[int]) -> list[Step]:
    """Of the steps one line gives one name (a loop's partial sums), the last; each with its rows
    sorted, largest first, where its last axis is a K of `ks` (the top-k weights in the order it took
    them)."""
    last = {(s.line, s.name, s.caller): i for i, s in enumerate(steps)}
    kept = [s for i, s in enumerate(steps) if last[s.line, s.name, s.caller] == i]
    return [_sorted_rows(s) if s.value.shape[-1:] in [(k,) for k in ks] else s for s in kept]


def _sorted_rows(step: Step) -> Step:
    return step._replace(value=step.value.sort(-1, descending=True)[0])

