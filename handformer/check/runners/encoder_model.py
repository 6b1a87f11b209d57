"""An encoder-only model that is not a classifier (Hugging Face's BertModel: embeddings, an encoder,
a pooler; forward(input_ids, attention_mask, token_type_ids) returning the sequence output and the
pooled one). Its attention, FFN and norms are checked as components of their own where their classes
are found; the model is checked for what its assembly must keep, from its own outputs: eval mode is
deterministic (an embedding dropout called as F.dropout without training=self.training is not), and
with an attention_mask (Hugging Face's: 1 = a real token, 0 = padding) the real tokens' outputs do
not change when the padded tokens do (a mask built the wrong way round hides the real tokens).

Shape legend: B batch, T tokens, D width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, check_determinism, error_text, finish, forward_names
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines

B, T, REAL = 2, 6, 4  # row 1 holds REAL tokens, then padding
MASK_NAME = "attention_mask"  # Hugging Face's name, whose convention is 1 = a real token


def _ids(module: nn.Module) -> Tensor:
    """(B, T) ids its first embedding (the word embeddings, built first as Hugging Face's are) can
    look up."""
    rows = next(m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding))
    return torch.randint(1, rows, (B, T), generator=torch.Generator().manual_seed(3))


def check_encoder_model(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp)
    ids = _ids(module)
    mask_name = MASK_NAME if MASK_NAME in forward_names(module) else None
    keep = torch.ones(B, T, dtype=torch.long)
    keep[1, REAL:] = 0

    def run(tokens: Tensor, mask: Tensor = keep) -> Tensor | None:
        kwargs: dict[str, Any] = {mask_name: mask} if mask_name else {}
        return fp.first_tensor(ctx.learner.call("forward", module, tokens, **kwargs), 3)

    with torch.no_grad():
        check_determinism(res, ctx, comp, lambda: run(ids), "encoder_layer", "mha")
        if mask_name and not res.has("dropout_in_eval"):  # a model that draws noise: no padding to read
            _padding(res, ctx, comp, run, ids, keep)
    return finish(res)


def _padding(res: ComponentResult, ctx: Context, comp: Component, run: Any, ids: Tensor, keep: Tensor,
             ) -> None:
    """The real tokens' outputs with other ids in the padded places; mask_inverted where they move,
    and do not once the mask handed is the other way round (it hides what the model was told is real)."""
    other = ids.clone()
    other[1, REAL:] = (ids[1, REAL:] % (int(ids.max()) - 1)) + 1  # other ids, in the table's range
    err, inverted = (fp.max_error(run(ids, m)[1, :REAL], run(other, m)[1, :REAL]) for m in (keep, 1 - keep))
    res.checks.append(Check(text("padding invariance: with attention_mask (1 = a real token), changing the "
                                 "padded tokens changes no real token's output",
                                 "padding 不变性：给定 attention_mask（1 = 真实 token），改变 padding 位置的 "
                                 "token 不改变任何真实 token 的输出"), err < 1e-6, error_text(err)))
    if err >= 1e-6 and inverted < 1e-6:
        number, code = locate("mask_inverted", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("mask_inverted", text(
            f"the real tokens' outputs move by {err:.3g} when only the padded tokens change, and by "
            f"{inverted:.1e} with the mask handed the other way round: the mask is read inverted",
            f"只改变 padding 位置的 token，真实 token 的输出就变了 {err:.3g}；把掩码反过来传入时只变 "
            f"{inverted:.1e}：掩码被反着用了"), number, code))
