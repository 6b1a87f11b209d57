"""A classifier that holds an encoder model of its own and a head on it (Hugging Face's
BertForSequenceClassification: `self.bert`, a dropout and `self.classifier`; DistilBERT's pre-classifier
and classifier; a RoBERTa-style head module). The encoder is a component of the file checked on its
own (the encoder-only model, its layers, its attention); what the classifier adds is graded here from
its own outputs: eval mode is deterministic, the logits are (B, C), the head reads the pooled output the
encoder hands it (its pooler's, or the first token's), a padded row's logits do not move when only its
padded tokens change (the attention_mask reaches the encoder), and, where forward takes labels, the loss
it returns is the cross-entropy of its logits.

Shape legend: B batch, T tokens, D width, C classes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, check_determinism, error_text, forward_names
from handformer.check.core.defaults import keyword
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, source_lines
from handformer.check.core.weights import MappingError
from handformer.check.runners.encoder_model import encoder_ids

B, T, REAL = 2, 6, 4  # row 1 holds REAL tokens, then padding
MASK_NAMES = ("attention_mask", "mask", "attn_mask", "padding_mask")  # 1 = a real token
LABEL_NAMES = ("labels", "label", "targets", "y")


def backbone_parts(module: nn.Module, classes: int) -> tuple[nn.Module, list[nn.Module]]:
    """(the encoder it holds, the head's parts): one child with an embedding inside, the others with
    weights the head, its last a linear to the classes; else a MappingError."""
    kids = [m for m in module.children() if any(True for _ in m.parameters())]
    encoders = [m for m in kids if any(isinstance(e, nn.Embedding) for e in m.modules())]
    head = [m for m in kids if m not in encoders]
    outputs = [lin.out_features for m in head[-1:] for lin in m.modules() if isinstance(lin, nn.Linear)]
    if len(encoders) != 1 or not head or classes not in outputs[-1:]:
        raise MappingError(f"{type(module).__name__} holds no one encoder with a head on it",
                           zh=f"{type(module).__name__} 不是一个编码器加一个分类头")
    return encoders[0], head


class Seen:
    """The encoder's output and the head's input, recorded by hooks while the classifier runs."""

    def __init__(self, encoder: nn.Module, head: list[nn.Module]) -> None:
        self.out: Any = None
        self.read: Tensor | None = None
        self.hooks = [encoder.register_forward_hook(self._output)]
        self.hooks += [h.register_forward_pre_hook(self._input) for h in head]

    def _output(self, _m: nn.Module, _args: Any, out: Any) -> None:
        self.out = out

    def _input(self, _m: nn.Module, args: tuple) -> None:
        if self.read is None and args and isinstance(args[0], Tensor):
            self.read = args[0]

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def pooled_candidates(out: Any, keep: Tensor) -> dict[str, Tensor]:
    """What a head may read of the encoder's output, by what it is: a (B, D) pooled output, the first
    token's states, the states whole (the head pools them: RoBERTa's), their mean over the real tokens
    or over all."""
    pooled, states = fp.first_tensor(out, 2), fp.first_tensor(out, 3)
    found = {"the pooled output": pooled}
    if states is not None:
        weights = keep[..., None].to(states.dtype)  # (B, T, 1)
        found.update({"the first token's states": states[:, 0],
                      "the states whole (the head pools them)": states,
                      "the mean over the real tokens": (states * weights).sum(1) / weights.sum(1),
                      "the mean over the tokens": states.mean(1)})
    return {k: t for k, t in found.items() if t is not None}


@torch.no_grad()
def check_backbone_classifier(res: ComponentResult, ctx: Context, comp: Any, module: nn.Module,
                              classes: int) -> None:
    """The checks of a classifier on an encoder of its own (the module docstring's)."""
    encoder, head = backbone_parts(module, classes)
    res.mapping = [f"{n} -> {'encoder' if m is encoder else 'head'}" for n, m in module.named_children()
                   if m is encoder or m in head]
    ids = encoder_ids(encoder)
    names = forward_names(module)
    mask = next((n for n in MASK_NAMES if n in names), None)
    keep = torch.ones(B, T, dtype=torch.long)
    keep[1, REAL:] = 0

    def run(tokens: Tensor, **extra: Any) -> Any:
        given = keyword(mask, keep)
        return ctx.learner.call("forward", module, tokens, **given, **extra)

    logits = lambda out: next((t for t in tensors_of(out) if t.dim() == 2 and t.size(-1) == classes), None)  # noqa: E731
    check_determinism(res, ctx, comp, lambda: logits(run(ids)), "encoder_model", "encoder_layer", "mha")
    if res.has("dropout_in_eval"):
        return
    _reads_pooled(res, encoder, head, lambda: logits(run(ids)), classes, keep)
    if mask:
        _padding(res, lambda tokens: logits(run(tokens)), ids)
        if not res.checks[-1].ok:
            _mask_dropped(res, module, encoder, lambda: run(ids))
    label = next((n for n in LABEL_NAMES if n in names), None)
    if label:
        _loss(res, lambda y: run(ids, **{label: y}), logits, classes)


def tensors_of(out: Any) -> list[Tensor]:
    """The tensors a model returns: itself, a tuple's or a dict's ({"loss": ..., "logits": ...})."""
    items = [out] if isinstance(out, Tensor) else list(out.values() if isinstance(out, dict) else out) \
        if isinstance(out, (tuple, list, dict)) else []
    return [t for t in items if isinstance(t, Tensor)]


def _reads_pooled(res: ComponentResult, encoder: nn.Module, head: list[nn.Module], run: Any,
                  classes: int, keep: Tensor) -> None:
    """The logits are (B, C); which of the encoder's outputs the head reads, a note (a pooling of
    another kind is no mistake: a head reading a padded position fails the padding check)."""
    seen = Seen(encoder, head)
    try:
        out = run()
    finally:
        seen.close()
    res.checks.append(Check(text(f"logits of shape (B, C) = ({B}, {classes})", f"logits 形状为 (B, C) = "
                                                                                f"({B}, {classes})"),
                            out is not None and tuple(out.shape) == (B, classes)))
    read = seen.read
    reads = [k for k, t in pooled_candidates(seen.out, keep).items()
             if read is not None and t.shape == read.shape and fp.max_error(t, read) < fp.TOL]
    res.notes += [text(f"the head reads the encoder's output: {r}",
                       f"分类头读的是编码器的输出：{READS_ZH[r]}") for r in reads[:1]]


READS_ZH = {"the pooled output": "池化输出", "the first token's states": "第一个 token 的隐藏状态",
            "the states whole (the head pools them)": "整个隐藏状态序列（由分类头自己池化）",
            "the mean over the real tokens": "真实 token 上的平均",
            "the mean over the tokens": "所有 token 上的平均"}


def _padding(res: ComponentResult, run: Any, ids: Tensor) -> None:
    """Other ids in row 1's padded places move none of its logits."""
    other = ids.clone()
    other[1, REAL:] = (ids[1, REAL:] % (int(ids.max()) - 1)) + 1
    err = fp.max_error(run(ids)[1], run(other)[1])
    res.checks.append(Check(PADDING, err < 1e-6, error_text(err)))


PADDING = text("padding invariance: with attention_mask (1 = a real token), changing a row's padded tokens "
               "leaves its logits unchanged",
               "填充不变性：给定 attention_mask（1 = 真实 token），改变某行填充位置的 token，"
               "该行的 logits 不变")


def _mask_dropped(res: ComponentResult, module: nn.Module, encoder: nn.Module, run: Any) -> None:
    """The encoder called with the ids alone (no tensor beside them: the mask handed to forward, or one
    made of it, never reaches it): the line that calls it."""
    handed: list[Any] = []
    hook = encoder.register_forward_pre_hook(lambda _m, args, kw: handed.extend([*args, *kw.values()]),
                                             with_kwargs=True)
    try:
        run()
    finally:
        hook.remove()
    if sum(isinstance(a, Tensor) for a in handed) != 1:
        return
    attr = next(n for n, m in module.named_children() if m is encoder)
    number, code = first_line([rf"\b{attr}\s*\("], source_lines([type(module).forward]))
    res.findings.append(Finding(DEPARTS, text(
        f"the attention_mask handed to forward never reaches self.{attr}: the encoder attends to the padding",
        f"传给 forward 的 attention_mask 没有传到 self.{attr}：编码器会注意到填充"), number, code))


def _loss(res: ComponentResult, run: Any, logits: Any, classes: int) -> None:
    """Handed labels, the loss it returns (a scalar beside the logits) is their cross-entropy."""
    labels = torch.arange(B) % classes
    out = run(labels)
    scores = logits(out)
    loss = next((t for t in tensors_of(out) if t.dim() == 0), None)
    if scores is None or loss is None:
        return
    err = abs(float(loss) - float(F.cross_entropy(scores, labels)))
    res.checks.append(Check(text("handed labels, the loss it returns is the cross-entropy of its logits",
                                 "传入 labels 时，返回的损失是其 logits 的交叉熵"),
                            err < 1e-9, error_text(err)))
