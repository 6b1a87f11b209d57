"""A mixture-of-experts model's loss with the load-balancing term added (Switch Transformer's,
E * sum_e f_e * P_e; handformer.training.moe_loss): the cross-entropy plus c times that term, c the
model's own coefficient (0.01, aux_loss_coef), the term summed over the layers or taken over their
pooled tokens, f_e counted as a share of the top-k choices or of the tokens (a factor c absorbs).

One batch cannot tell a coefficient from a mistake (any difference divides into some c), so c is read
on one batch and must hold on a second.

Shape legend: B batch, T length, N tokens of a layer, E experts, k experts per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core.result import Text, text
from handformer.config import MoEConfig
from handformer.training.moe_loss import RouterLogits, load_balancing_loss

Batch = tuple[Tensor, Tensor]  # ids, targets (B, T) each


def balance_term(moe: MoEConfig | None, hf: Any, loss_of: Callable[[Tensor, Tensor], Any],
                 batches: list[Batch]) -> tuple[float, Text] | None:
    """The term the learner's loss adds to the cross-entropy of handformer's logits on batches[0],
    and a note; None where it adds none of these forms (or the model has no mixture of experts)."""
    if moe is None:
        return None
    seen = [_observed(moe, hf, loss_of, ids, targets) for ids, targets in batches]
    if any(s is None for s in seen):
        return None
    for form in range(2):  # summed over the layers, pooled
        c = seen[0][0] / seen[0][1][form]  # type: ignore[index]
        held = all(abs(extra - c * terms[form]) < 1e-6 for extra, terms in seen)  # type: ignore[misc]
        if c > 0 and held:
            return seen[0][0], _note(c, form)  # type: ignore[index]
    return None


def _observed(moe: MoEConfig, hf: Any, loss_of: Callable[[Tensor, Tensor], Any], ids: Tensor,
              targets: Tensor) -> tuple[float, tuple[float, float]] | None:
    """(the learner's loss less the cross-entropy of handformer's logits, (the balancing term summed
    over the layers, pooled over them)) on one batch; None where its forward gives no loss."""
    with torch.no_grad(), RouterLogits(hf) as routers:
        logits = hf(ids).logits  # (B, T, V)
    loss = loss_of(ids, targets)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        return None
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    layers = [r.float() for r in routers.logits]  # (N, E) each (handformer's counts are float32)
    per_layer = sum(float(load_balancing_loss([r], moe.n_experts, moe.top_k)) for r in layers)
    pooled = float(load_balancing_loss(layers, moe.n_experts, moe.top_k))
    return float(loss) - float(ce), (per_layer, pooled)


def _note(c: float, form: int) -> Text:
    forms = (("summed over the layers", "各层相加"), ("over all layers' tokens", "所有层的 token 一起算"))
    en, zh = forms[form]
    return text(f"your loss adds {c:.4g} times the load-balancing loss (Switch's E * sum f_e * P_e, {en}, "
                "a factor of its counts included) to the cross-entropy: compared so",
                f"你的 loss 在交叉熵上加了 {c:.4g} 倍的负载均衡损失（Switch 的 E * sum f_e * P_e，{zh}，"
                "计数方式的常数因子已计入）：按此比较")
