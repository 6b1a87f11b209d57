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
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.weights import MappingError

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


def pooled_candidates(out: Any) -> list[Tensor]:
    """What a head may read of the encoder's output: a (B, D) pooled output, the first token's states."""
    pooled, states = fp.first_tensor(out, 2), fp.first_tensor(out, 3)
    return [t for t in (pooled, None if states is None else states[:, 0]) if t is not None]


def check_backbone_classifier(res: ComponentResult, ctx: Context, comp: Any, module: nn.Module,
                              classes: int) -> None:
    """The checks of a classifier on an encoder of its own (the module docstring's)."""
    encoder, head = backbone_parts(module, classes)
    res.mapping = [f"{n} -> {'encoder' if m is encoder else 'head'}" for n, m in module.named_children()
                   if m is encoder or m in head]
    rows = next(m.num_embeddings for m in encoder.modules() if isinstance(m, nn.Embedding))
    ids = torch.randint(1, rows, (B, T), generator=torch.Generator().manual_seed(3))
    names = forward_names(module)
    mask = next((n for n in MASK_NAMES if n in names), None)
    keep = torch.ones(B, T, dtype=torch.long)
    keep[1, REAL:] = 0

    def run(tokens: Tensor, **extra: Any) -> Any:
        given = {mask: keep} if mask else {}
        return ctx.learner.call("forward", module, tokens, **given, **extra)

    logits = lambda out: next((t for t in _tensors(out) if t.dim() == 2 and t.size(-1) == classes), None)  # noqa: E731
    with torch.no_grad():
        check_determinism(res, ctx, comp, lambda: logits(run(ids)), "encoder_model", "encoder_layer", "mha")
        if res.has("dropout_in_eval"):
            return
        _reads_pooled(res, encoder, head, lambda: logits(run(ids)), classes)
        if mask:
            _padding(res, lambda tokens: logits(run(tokens)), ids)
        label = next((n for n in LABEL_NAMES if n in names), None)
        if label:
            _loss(res, lambda y: run(ids, **{label: y}), logits, classes)


def _tensors(out: Any) -> list[Tensor]:
    items = [out] if isinstance(out, Tensor) else list(out) if isinstance(out, (tuple, list)) else []
    return [t for t in items if isinstance(t, Tensor)]


def _reads_pooled(res: ComponentResult, encoder: nn.Module, head: list[nn.Module], run: Any,
                  classes: int) -> None:
    """The logits are (B, C) and the head's input is what the encoder pooled."""
    seen = Seen(encoder, head)
    try:
        out = run()
    finally:
        seen.close()
    res.checks.append(Check(text(f"logits of shape (B, C) = ({B}, {classes})", f"logits 形状为 (B, C) = "
                                                                                f"({B}, {classes})"),
                            out is not None and tuple(out.shape) == (B, classes)))
    reads = seen.read is not None and any(t.shape == seen.read.shape and fp.max_error(t, seen.read) < fp.TOL
                                          for t in pooled_candidates(seen.out))
    res.checks.append(Check(text("the head reads the encoder's pooled output (its pooler's, or the first "
                                 "token's states)", "分类头读的是编码器的池化输出（pooler 的，或第一个 token "
                                 "的隐藏状态）"), reads))


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


def _loss(res: ComponentResult, run: Any, logits: Any, classes: int) -> None:
    """Handed labels, the loss it returns (a scalar beside the logits) is their cross-entropy."""
    labels = torch.arange(B) % classes
    out = run(labels)
    scores = logits(out)
    loss = next((t for t in _tensors(out) if t.dim() == 0), None)
    if scores is None or loss is None:
        return
    err = abs(float(loss) - float(F.cross_entropy(scores, labels)))
    res.checks.append(Check(text("handed labels, the loss it returns is the cross-entropy of its logits",
                                 "传入 labels 时，返回的损失是其 logits 的交叉熵"),
                            err < 1e-9, error_text(err)))
