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

import re
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, check_determinism, error_text, finish, forward_names
from handformer.check.core.defaults import keyword
from handformer.check.core.discovery import Component
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.sizes import SIZES
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.reference.diagnoses import CATALOG

B, T, REAL = 2, 6, 4  # row 1 holds REAL tokens, then padding
# a vocabulary, depth and length for a constructor (or config) that takes them (RobertaModel(vocab_size, ...))
ENCODER_SIZES = {**SIZES, "src_vocab": 29, "n_layers": 2, "max_len": 16}
MASK_NAME = "attention_mask"  # Hugging Face's name, whose convention is 1 = a real token


def encoder_ids(module: nn.Module) -> Tensor:
    """(B, T) ids its first embedding (the word embeddings, built first as Hugging Face's are) can
    look up."""
    rows = next(m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding))
    return torch.randint(1, rows, (B, T), generator=torch.Generator().manual_seed(3))


def check_encoder_model(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp, ENCODER_SIZES)
    ids = encoder_ids(module)
    mask_name = MASK_NAME if MASK_NAME in forward_names(module) else None
    keep = torch.ones(B, T, dtype=torch.long)
    keep[1, REAL:] = 0

    def call(tokens: Tensor, mask: Tensor = keep) -> Any:
        kwargs: dict[str, Any] = keyword(mask_name, mask)
        return ctx.learner.call("forward", module, tokens, **kwargs)

    def run(tokens: Tensor, mask: Tensor = keep) -> Tensor | None:
        return fp.first_tensor(call(tokens, mask), 3)

    with torch.no_grad():
        check_determinism(res, ctx, comp, lambda: run(ids), "encoder_layer", "mha")
        if mask_name and not res.has("dropout_in_eval"):  # a model that draws noise: no padding to read
            _padding(res, ctx, comp, run, ids, keep)
            if all(c.ok for c in res.checks):  # (a mask read inverted moves the pooled output too)
                _pooled_padding(res, lambda tokens: fp.first_tensor(call(tokens), 2), ids,
                                source_lines([getattr(comp.obj, "forward", comp.obj)]))
        if all(c.ok for c in res.checks):  # a mask read inverted hides every token handed as real
            with fp.dropout_off():
                _order(res, ctx, comp, lambda tokens: run(tokens, torch.ones_like(keep)), ids)
    return finish(res)


def _order(res: ComponentResult, ctx: Context, comp: Component, run: Any, ids: Tensor) -> None:
    """pe_missing where swapping two tokens only swaps their outputs (the model sees a bag of tokens:
    no position reaches it) while its code makes positions (a name with pos in it): built, never
    added. A model that makes none is left alone (no reference says it must)."""
    order = [2, 1, 0, *range(3, T)]  # tokens 0 and 2 swapped
    mine, theirs = run(ids), run(ids[:, order])
    moved = fp.quietly(lambda: fp.max_error(mine[:, order], theirs))  # None: no outputs to compare
    lines = source_lines(ctx.objects(comp))
    code = "".join(c.split("#")[0] for _, c in lines)
    if moved is None or moved >= 1e-6 or not re.search(r"(?i)pos", code):
        return
    number, code = locate("pe_missing", lines)
    res.findings.append(Finding("pe_missing", text(
        "swapping tokens 0 and 2 only swaps their outputs: no position reaches the model (a bag of tokens), "
        "though its code makes positions",
        "交换位置 0 和位置 2 的 token，输出只是跟着交换：模型里没有任何位置信息（词袋），"
        "可它的代码算了位置"), number, code))


def _other_padding(ids: Tensor) -> Tensor:
    """The ids with other ids, in the table's range, in row 1's padded places."""
    other = ids.clone()
    other[1, REAL:] = (ids[1, REAL:] % (int(ids.max()) - 1)) + 1
    return other


def _pooled_padding(res: ComponentResult, pooled: Any, ids: Tensor, lines: list[tuple[int, str]]) -> None:
    """The pooled output (B, D) it returns beside the sequence's (BertModel's pooler on [CLS]), where it
    returns one: the padded row's does not move when only its padded tokens change; where it does, the
    line of its forward that computes it."""
    mine = pooled(ids)
    if mine is None:
        return
    err = fp.max_error(mine[1:2], pooled(_other_padding(ids))[1:2])
    res.checks.append(Check(text("padding invariance of the pooled output: changing a row's padded tokens "
                                 "leaves its pooled output unchanged (a pooler reads a real token: BERT's "
                                 "first, [CLS])", "池化输出的填充不变性：改变某行填充位置的 token，该行的池化"
                                 "输出不变（池化读的是真实 token：BERT 读第一个，[CLS]）"),
                            err < 1e-6, error_text(err)))
    if err >= 1e-6:
        res.findings.append(Finding(DEPARTS, text(
            f"the padded row's pooled output moves by {err:.3g} when only its padded tokens change: the "
            "pooler reads a padded position (the last one?), not the first token",
            f"只改变填充位置的 token，该行的池化输出就变了 {err:.3g}：池化读的是填充位置（最后一个？），"
            "而不是第一个 token"), *first_line([r"\bpool\w*\s*=", "pool"], lines)))


def _padding(res: ComponentResult, ctx: Context, comp: Component, run: Any, ids: Tensor, keep: Tensor,
             ) -> None:
    """The real tokens' outputs with other ids in the padded places; mask_inverted where they move,
    and do not once the mask handed is the other way round (it hides what the model was told is real)."""
    other = _other_padding(ids)
    err, inverted = (fp.max_error(run(ids, m)[1, :REAL], run(other, m)[1, :REAL]) for m in (keep, 1 - keep))
    res.checks.append(Check(text("padding invariance: with attention_mask (1 = a real token), changing the "
                                 "padded tokens changes no real token's output",
                                 "填充不变性：给定 attention_mask（1 = 真实 token），改变填充位置的 "
                                 "token 不改变任何真实 token 的输出"), err < 1e-6, error_text(err)))
    if err >= 1e-6 and inverted >= 1e-6:
        _mask_unread(res, ctx, comp, run, ids, keep)
    if err >= 1e-6 and inverted < 1e-6:
        number, code = locate("mask_inverted", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("mask_inverted", text(
            f"the real tokens' outputs move by {err:.3g} when only the padded tokens change, and by "
            f"{inverted:.1e} with the mask handed the other way round: the mask is read inverted",
            f"只改变填充位置的 token，真实 token 的输出就变了 {err:.3g}；把掩码反过来传入时只变 "
            f"{inverted:.1e}：掩码被反着用了"), number, code))


QUERY_AXIS = CATALOG["mask_hides_queries"].patterns[:4]  # the mask's padding laid on the query axis


def _mask_unread(res: ComponentResult, ctx: Context, comp: Component, run: Any, ids: Tensor, keep: Tensor,
                 ) -> None:
    """mask_hides_queries where the mask moves no real token's output (handed all ones instead, they
    stay) and the model's code lays it on the query axis (mask[:, None, :, None]): a padded query row
    gets the same score added to every key, which the softmax takes away."""
    unread = fp.max_error(run(ids, keep)[1, :REAL], run(ids, torch.ones_like(keep))[1, :REAL]) < 1e-9
    number, code = first_line(QUERY_AXIS, source_lines(ctx.objects(comp)))
    if unread and number is not None:
        res.findings.append(Finding("mask_hides_queries", text(
            "the padding mask moves no real token's output (all ones gives the same), and it is laid on the "
            "query axis: every padded key stays visible",
            "填充掩码不改变任何真实 token 的输出（全 1 的掩码结果一样），而且它加在查询的维度上："
            "每个填充键仍然可见"), number, code))
