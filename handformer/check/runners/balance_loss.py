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

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import Text, text
from handformer.config import MoEConfig
from handformer.training.moe_loss import RouterLogits, load_balancing_loss

Batch = tuple[Tensor, Tensor]  # ids, targets (B, T) each
Observed = tuple[float, tuple[float, float]]  # the loss less the cross-entropy; the term of each form


def balance_term(moe: MoEConfig | None, hf: Any, loss_of: Callable[[Tensor, Tensor], Any],
                 batches: list[Batch], shift: bool = False) -> tuple[float, list[Text]]:
    """The term the learner's loss adds to the cross-entropy of handformer's logits on batches[0]
    (with `shift`, position t scored against label t + 1: Hugging Face's labels), and a note; (0, none)
    where it adds none of these forms (or the model has no mixture of experts, or gives no loss)."""
    seen = fp.quietly(lambda: [_observed(moe, hf, loss_of, ids, targets, shift) for ids, targets in batches])
    held = [(seen[0][0], [_note(c, form)]) for form, c in enumerate(_coefficients(seen))
            if _holds(seen, form, c)]
    return [*held, (0.0, [])][0]


def _coefficients(seen: list[Observed] | None) -> list[float]:
    """c of each form, read on the first batch: its extra over its term (none without a reading)."""
    extra, terms = (seen or [(0.0, ())])[0]
    return [extra / term for term in terms]


def _holds(seen: list[Observed], form: int, c: float) -> bool:
    """Whether c > 0 makes every batch's extra c times its term of this form."""
    return c > 0 and all(abs(extra - c * terms[form]) < 1e-6 for extra, terms in seen)


def _observed(moe: MoEConfig, hf: Any, loss_of: Callable[[Tensor, Tensor], Any], ids: Tensor,
              targets: Tensor, shift: bool) -> Observed:
    """(the learner's loss less the cross-entropy of handformer's logits, (the balancing term summed
    over the layers, pooled over them)) on one batch; raises where its forward gives no loss."""
    with torch.no_grad(), RouterLogits(hf) as routers:
        logits = hf(ids).logits  # (B, T, V)
    loss = float(loss_of(ids, targets))  # (None, or more than one number: raises)
    logits, targets = (logits[:, :-1], targets[:, 1:]) if shift else (logits, targets)
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    layers = [r.float() for r in routers.logits]  # (N, E) each (handformer's counts are float32)
    per_layer = sum(float(load_balancing_loss([r], moe.n_experts, moe.top_k)) for r in layers)
    pooled = float(load_balancing_loss(layers, moe.n_experts, moe.top_k))
    return loss - float(ce), (per_layer, pooled)


def _note(c: float, form: int) -> Text:
    forms = (("summed over the layers", "各层相加"), ("over all layers' tokens", "所有层的 token 一起算"))
    en, zh = forms[form]
    return text(f"your loss adds {c:.4g} times the load-balancing loss (Switch's E * sum f_e * P_e, {en}, "
                "a factor of its counts included) to the cross-entropy: compared so",
                f"你的 loss 在交叉熵上加了 {c:.4g} 倍的负载均衡损失（Switch 的 E * sum f_e * P_e，{zh}，"
                "计数方式的常数因子已计入）：按此比较")
