"""Runner for additive attention (Bahdanau's; d2l's `AdditiveAttention(key_size, query_size,
num_hiddens, dropout)`): the score of query i and key j is w_v · tanh(W_q q_i + W_k k_j), a softmax
over the keys each query may see (d2l's valid lengths: the keys at or past a row's length hidden),
then the weighted sum of the values. Compared with that computation on the learner's own weights, with
valid lengths and without, and its gradients.

Shape legend: B batch, T queries, S keys, D width (query, key and hidden sizes), Dv value width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import (
    Context,
    check_determinism,
    error_text,
    finish,
    forward_parameters,
    is_mask_name,
)
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.weights import MappingError, leaves, of_kind, with_shape

B, T, S, DV = 2, 3, 5, 6
LENGTHS = torch.tensor([2, 5])  # (B,): row 0 sees its first 2 keys


def _slots(module: Any, D: int) -> tuple[Tensor, Tensor, Tensor]:
    """(W_q, W_k, w_v): two (D, D) projections, by their names (the one that says k second) or in
    definition order, and the (1, D) one that scores."""
    linears = of_kind(leaves(module), "linear")
    square, score = with_shape(linears, (D, D)), with_shape(linears, (1, D))
    if len(square) != 2 or len(score) != 1:
        shapes = ", ".join(f"{leaf.name} {tuple(leaf.weight.shape)}" for leaf in linears)
        raise MappingError(f"expected W_q and W_k as nn.Linear({D}, {D}) and w_v as nn.Linear({D}, 1), "
                           f"found {shapes}",
                           zh=f"应当有 nn.Linear({D}, {D}) 的 W_q、W_k 和 nn.Linear({D}, 1) 的 w_v，"
                              f"实际找到 {shapes}")
    square.sort(key=lambda leaf: "k" in leaf.name.rpartition(".")[2].lower())  # W_q first
    return square[0].weight, square[1].weight, score[0].weight


def additive(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor | None, w_q: Tensor, w_k: Tensor,
             w_v: Tensor) -> Tensor:
    """The reference: (B, T, D), (B, S, D), (B, S, Dv) -> (B, T, Dv)."""
    features = torch.tanh((q @ w_q.T)[:, :, None] + (k @ w_k.T)[:, None])  # (B, T, S, D)
    scores = (features @ w_v.T)[..., 0]  # (B, T, S)
    if lengths is not None:
        hidden = torch.arange(k.size(1))[None, None] >= lengths[:, None, None]  # (B, 1, S)
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores.softmax(-1) @ v


def check_additive(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp)
    D = next(leaf.weight.size(1) for leaf in leaves(module) if leaf.kind == "linear")
    first, second, w_v = _slots(module, D)
    q, k, v = fp.randn(B, T, D, seed=1), fp.randn(B, S, D, seed=2), fp.randn(B, S, DV, seed=3)
    masked = [p.name for p in forward_parameters(module) if is_mask_name(p.name)]

    def run(lengths: Tensor | None, q: Tensor = q) -> Tensor | None:
        extra = {masked[0]: lengths} if masked else {}
        return fp.first_tensor(ctx.learner.call("forward", module, q, k, v, **extra), 3)

    check_determinism(res, ctx, comp, lambda: run(LENGTHS))
    givens, said = GIVEN[bool(masked)]
    lengths = givens[0]  # the valid lengths it is handed: none where it takes none
    out = run(lengths)  # names that say neither q nor k: the order that matches, as the FFN's gate and up
    w_q, w_k = min([(first, second), (second, first)], key=lambda p: fp.max_error(
        out, additive(q, k, v, lengths, *p, w_v)))
    res.mapping = ["W_q, W_k: nn.Linear(D, D); w_v: nn.Linear(D, 1)"]
    worst = 0.0
    for given in givens:
        want = additive(q, k, v, given, w_q, w_k, w_v)
        worst = max(worst, fp.max_error(run(given), want))
    res.max_abs_error = worst
    res.checks.append(Check(said, worst < 1e-9, error_text(worst)))
    _gradients(res, module, run, (w_q, w_k, w_v), lengths)
    return finish(res)


# by whether the forward takes valid lengths: the lengths it is handed (the first as its gradients are
# checked), and what the comparison says
SAID_ZH = "与 w_v · tanh(W_q q + W_k k)、对可见键做 softmax、再加权值的结果一致"
GIVEN = {True: ([LENGTHS, None], text("matches w_v · tanh(W_q q + W_k k), softmax over the visible keys, on "
                                      "the values (with valid lengths and without)", SAID_ZH)),
         False: ([None], text("matches w_v · tanh(W_q q + W_k k), softmax over the keys, on the values",
                              SAID_ZH))}


@torch.enable_grad()
def _gradients(res: ComponentResult, module: Any, run: Any, weights: tuple[Tensor, ...],
               lengths: Tensor | None) -> None:
    """The input's and the weights' gradients of the learner's output equal the reference's, on the
    valid `lengths` it is handed (None: none)."""
    q = fp.randn(B, T, weights[0].size(1), seed=4).requires_grad_(True)
    out = run(lengths, q)
    if out is None:
        return
    module.zero_grad()
    out.square().sum().backward()
    theirs = [q.grad] + [w.grad for w in weights]
    q2 = q.detach().clone().requires_grad_(True)
    copies = [w.detach().clone().requires_grad_(True) for w in weights]
    ref = additive(q2, fp.randn(B, S, q.size(-1), seed=2), fp.randn(B, S, DV, seed=3), lengths, *copies)
    ref.square().sum().backward()
    mine = [q2.grad] + [c.grad for c in copies]
    err = max(fp.max_error(a, b) if a is not None else 1e9 for a, b in zip(theirs, mine))
    res.checks.append(Check(text("gradients (input and weights) match", "梯度（输入和权重）一致"), err < 1e-9,
                            error_text(err)))
