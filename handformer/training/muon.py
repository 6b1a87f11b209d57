"""Muon for the blocks' matrices, AdamW for everything else: one optimizer, written out.

Muon (Keller Jordan, 2024; the modded-nanogpt speedrun's optimizer) treats a weight matrix as a
matrix, not as a bag of numbers. Each step, for a matrix W with gradient G:

    M  <- mu M + (1 - mu) G                 momentum (an exponential average of the gradients)
    U  <- (1 - mu) G + mu M                 Nesterov: look one step further along it
    O  <- NewtonSchulz(U)                   the nearest "orthogonal" matrix: U = A S B^T -> ~ A B^T
    W  <- W (1 - lr wd) - lr sqrt(max(1, rows / cols)) O

Orthogonalizing sets every singular value of the update to about 1, so directions the gradient
barely moves (small singular values) get as large a step as the dominant ones. The SVD would do
that exactly; five steps of a quintic Newton-Schulz iteration do it cheaply with matrix products:

    X <- U / ||U||_F                        every singular value now <= 1
    repeat 5 times:  A = X X^T;  X <- a X + (b A + c A A) X     (a, b, c) = (3.4445, -4.7750, 2.0315)

The coefficients are tuned to push singular values towards 1 as fast as possible, not to converge
exactly: they end up between about 0.7 and 1.2, which trains as well as the exact answer. The
iteration runs in bf16, as the published optimizer does (`torch.optim.Muon`, which
tests/test_muon.py holds this file equal to), on matrices with rows <= columns (the smaller Gram
matrix); same-shaped matrices go through it together as one batch, which on a CPU turns dozens of
tiny matrix products a step into a few.

Muon is for the hidden matrices only: the embeddings (a lookup, one row a token), the output head
and the norms' gains and biases keep AdamW (`muon_params` picks the matrices of the blocks' linear
layers). Shape legend: R rows, C columns, N matrices of one shape stacked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from handformer.nn.blocks import DecoderLayer, DecoderOnlyBlock, EncoderLayer

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7
BLOCKS = (EncoderLayer, DecoderLayer, DecoderOnlyBlock)


def newton_schulz(update: Tensor, steps: int = NS_STEPS, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """(N, R, C) or (R, C) updates -> the same shape, each orthogonalized (singular values ~1)."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(dtype)
    single = x.dim() == 2
    x = x.unsqueeze(0) if single else x  # (N, R, C)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT  # (N, C, R): rows <= columns, so X X^T is the smaller Gram matrix
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)  # every singular value <= 1
    for _ in range(steps):
        gram = x @ x.mT  # (N, R, R)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A A
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b A + c A A) X
    x = x.mT if tall else x
    return x[0] if single else x


def muon_params(model: nn.Module) -> list[nn.Parameter]:
    """The weights of the linear layers inside the model's blocks (attention and FFN matrices):
    what Muon trains. Embeddings, the head, norms and biases are left to AdamW."""
    found: dict[int, nn.Parameter] = {}
    for block in model.modules():
        if isinstance(block, BLOCKS):
            for module in block.modules():
                if isinstance(module, nn.Linear) and module.weight.requires_grad:
                    found[id(module.weight)] = module.weight
    return list(found.values())


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer with two kinds of parameter groups: `muon=True` groups (2-D matrices) step with
    Muon, the others with AdamW (decoupled weight decay, bias-corrected moments). Each group's `lr`
    is set by the training loop at every step; `lr_ratio` is its peak rate over the loop's."""

    def __init__(self, groups: Iterable[dict], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, momentum: float = 0.95, nesterov: bool = True,
                 ns_dtype: torch.dtype = torch.bfloat16) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "momentum": momentum, "nesterov": nesterov,
                    "weight_decay": 0.0, "muon": False, "lr_ratio": 1.0}
        super().__init__(list(groups), defaults)
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            if group["muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups hold matrices only: put vectors and embeddings in an "
                                 "AdamW group (muon=False)")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["muon"]:
                self._muon_step(group, params)
            else:
                self._adamw_step(group, params)
        return loss

    def _muon_step(self, group: dict, params: list[Tensor]) -> None:
        mu, lr, decay = group["momentum"], group["lr"], group["weight_decay"]
        by_shape: dict[tuple[int, int], list[tuple[Tensor, Tensor]]] = {}
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)  # M <- mu M + (1 - mu) G
            update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
            by_shape.setdefault(tuple(p.shape), []).append((p, update))
        for (rows, cols), pairs in by_shape.items():
            ortho = newton_schulz(torch.stack([u for _, u in pairs]), dtype=self.ns_dtype)  # (N, R, C)
            scale = lr * math.sqrt(max(1.0, rows / cols))  # the same size of step for tall matrices
            for (p, _), o in zip(pairs, ortho):
                p.mul_(1 - lr * decay)
                p.add_(o.to(p.dtype), alpha=-scale)

    def _adamw_step(self, group: dict, params: list[Tensor]) -> None:
        (beta1, beta2), lr, eps, decay = group["betas"], group["lr"], group["eps"], group["weight_decay"]
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = float(state["step"])
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.lerp_(p.grad, 1 - beta1)  # m <- b1 m + (1 - b1) g
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v <- b2 v + (1 - b2) g^2
            p.mul_(1 - lr * decay)
            denom = (v / (1 - beta2 ** t)).sqrt_().add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))
