"""A model that scores whole sequences: forward(input_ids, attention_mask) -> one number a sequence,
(B,) or (B, 1) (a reward model: InstructGPT's, TRL's RewardTrainer's, a decoder backbone with a value
head read at the last real token). handformer has no reference for its score, so what is checked is
what every such model must do whatever it pools: the same score for a sequence whether it is padded
on the right (its padding hidden by the mask) or not; then NOT CHECKED, the score not compared. A
model that fails that FAILs.

Shape legend: B batch, T tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters, is_mask_name
from handformer.check.core.discovery import Component
from handformer.check.core.result import NOT_CHECKED, Check, ComponentResult, LearnerError, text

REAL, T = 5, 8  # the padded sequence's real tokens, then padding (id 0) to T


def scores(module: nn.Module, ctx: Context, ids: Tensor, mask: Tensor) -> Tensor | None:
    """Its scores (B,) for ids (B, t) and a mask (B, t) of 1 = real token; None where it gives none."""
    out = fp.quietly(lambda: fp.first_tensor(ctx.learner.call("forward", module, ids, mask)),
                     fp.LearnerFailure)
    if out is None or not out.is_floating_point() or out.shape not in ((ids.size(0),), (ids.size(0), 1)):
        return None
    return out.detach().reshape(-1)


def check_scores(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module,
                 vocab: int) -> ComponentResult | None:
    """The check of a model whose forward requires an attention mask after the ids and returns a score
    a sequence; None for any other model (the language model's check goes on)."""
    params = forward_parameters(module)
    if len(params) < 2 or not is_mask_name(params[1].name) or params[1].default is not params[1].empty:
        return None
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (2, T), generator=g)
    mask = torch.ones(2, T, dtype=torch.long)
    ids[1, REAL:], mask[1, REAL:] = 0, 0  # right padding
    padded = scores(module, ctx, ids, mask)
    alone = scores(module, ctx, ids[1:, :REAL], mask[1:, :REAL])
    if padded is None or alone is None:
        return None
    err = fp.max_error(padded[1:], alone)
    res.max_abs_error = err
    said = text(f"a sequence of {REAL} tokens padded on the right to {T} (the padding masked) scores as it "
                "does unpadded", f"{REAL} 个 token 的序列在右边填充到 {T} 个（填充被掩码屏蔽），"
                "得分与不填充时相同")
    res.checks.append(Check(said, err < 1e-5, error_text(err)))
    if err < 1e-5:
        res.status = NOT_CHECKED
        res.error = LearnerError("cannot_call", f"{comp.name} returns one score a sequence (a reward "
                                 "model?): handformer has no reference for it, so its scores were checked "
                                 "for padding only, not compared", "forward",
                                 message_zh=f"{comp.name} 每个序列返回一个分数（奖励模型？）：handformer "
                                 "没有它的参照实现，所以只检查了填充，没有比较分数")
    return finish(res)
