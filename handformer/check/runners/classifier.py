"""The runner of an encoder-only classifier (BERT's shape): token embeddings with a learned [CLS]
vector in front, learned positions, a norm, the learner's encoder layers, a tanh pooler on [CLS] and
a linear classifier.

The reference is built from the learner's own weights and their own encoder layers (checked on
their own), each layer called with what the model hands it (its mask), so that what is graded here
is the assembly: where [CLS] goes, the positions, what the pooler reads, the padding. A model whose
top-level parts are not these is NOT CHECKED, with the reason.

Shape legend: B batch, S tokens (S + 1 with [CLS]), D width, C classes.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, check_determinism, finish
from handformer.check.core.discovery import Component
from handformer.check.core.localize import Departure, add_departure, same
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.sizes import SIZES
from handformer.check.core.weights import MappingError
from handformer.check.runners.classifier_backbone import check_backbone_classifier

VOCAB, CLASSES, LENGTH = 29, 3, 16
CLASSIFIER_SIZES = {**SIZES, "src_vocab": VOCAB, "n_layers": 2, "max_len": LENGTH, "n_classes": CLASSES}


@dataclass
class ClassifierMap:
    """The learner's top-level parts, by attribute name."""

    tokens: str
    positions: str
    cls: str | None  # None: [CLS] is a token of the input (BERT's own), not a vector put in front
    layers: str
    classifier: str
    pooler: str | None
    norm: str | None

    def describe(self) -> list[str]:
        roles = ("tokens", "positions", "cls", "norm", "layers", "pooler", "classifier")
        return [f"{getattr(self, r)} -> {r}" for r in roles if getattr(self, r)]


ROLES = {nn.Embedding: "embeds", nn.Linear: "linears", nn.ModuleList: "lists"}  # a top-level part, by type


def map_classifier(module: nn.Module) -> ClassifierMap:
    """Embeddings told apart by their rows (the vocabulary), the [CLS] vector a parameter of width D,
    the layers a ModuleList, the linears by their outputs; anything else with weights a norm (one at
    most); other parts: NOT CHECKED."""
    kids = dict(module.named_children())
    by: dict[str, list[str]] = {"embeds": [], "linears": [], "lists": [], "norms": [], "none": []}
    for n, m in kids.items():
        by[ROLES.get(type(m), "norms" if len(list(m.parameters())) else "none")].append(n)
    own = [n for n, p in module.named_parameters(recurse=False) if p.numel() == p.size(-1)]
    tokens = [n for n in by["embeds"] if kids[n].num_embeddings == VOCAB]
    out = [n for n in by["linears"] if kids[n].out_features == CLASSES]
    counts = tuple(map(len, (tokens, by["embeds"], by["lists"], out)))
    if counts != (1, 2, 1, 1) or max(len(own), len(by["norms"])) > 1 or len(by["linears"]) > 2:
        name = type(module).__name__
        raise MappingError(f"{name}'s parts are not a classifier's as handformer reads one: token and "
                           "position embeddings (nn.Embedding), a [CLS] vector (an nn.Parameter), a "
                           "ModuleList of encoder layers, at most one norm, a pooler and a classifier "
                           "(nn.Linear)",
                           zh=f"{name} 的组成不是 handformer 认得的分类模型：词嵌入和可学习的位置编码"
                              "（nn.Embedding）、一个 [CLS] 向量（nn.Parameter）、编码器层的 ModuleList、"
                              "至多一个归一化、池化层和分类层（nn.Linear）")
    positions, pooler = set(by["embeds"]) - set(tokens), set(by["linears"]) - set(out)
    return ClassifierMap(tokens[0], positions.pop(), next(iter(own), None), by["lists"][0], out[0],
                         next(iter(pooler), None), next(iter(by["norms"]), None))


class Recorder:
    """What the learner's model hands its parts: each layer's arguments after the first, the
    pooler's input, the layers' input."""

    def __init__(self, module: nn.Module, m: ClassifierMap) -> None:
        self.seen: dict[str, Any] = {}
        layers = getattr(module, m.layers)
        self.hooks = [layers[0].register_forward_pre_hook(self._keep("first"), with_kwargs=True)]
        self.hooks += [layer.register_forward_pre_hook(self._keep(f"layer{i}"), with_kwargs=True)
                       for i, layer in enumerate(layers)]
        self.hooks += [getattr(module, m.pooler or m.classifier).register_forward_pre_hook(
            self._keep("pooled"), with_kwargs=True)]

    def _keep(self, key: str) -> Any:
        def record(part: nn.Module, args: tuple, kwargs: dict) -> None:
            self.seen[key] = (args, kwargs)
        return record

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def reference(module: nn.Module, m: ClassifierMap, ids: Tensor, seen: dict[str, Any],
              shift: int = 0, pool: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(the layers' input, the pooler's input, the logits) from the learner's weights and layers, each
    layer given what the model handed it; `shift` the first position, `pool` the position pooled."""
    part = lambda name: getattr(module, name)  # noqa: E731
    x = part(m.tokens)(ids)  # (B, S, D)
    front = [part(m.cls).reshape(1, 1, -1).expand(x.size(0), 1, -1)] if m.cls else []  # (B, 1, D)
    x = torch.cat(front + [x], 1)  # (B, S + 1, D) with a [CLS] vector
    x = x + part(m.positions)(torch.arange(shift, x.size(1) + shift))
    first = part(m.norm)(x) if m.norm else x
    x = first
    for i, layer in enumerate(part(m.layers)):
        args, kwargs = seen[f"layer{i}"]
        out = layer(x, *args[1:], **kwargs)
        x = out[0] if isinstance(out, tuple) else out
    pooled = torch.tanh(part(m.pooler)(x[:, pool])) if m.pooler else x[:, pool]  # (B, D)
    return first, x[:, pool], part(m.classifier)(pooled)


def check_classifier(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    torch.manual_seed(0)
    # as built, not scrambled: a [CLS] vector is no leaf of handformer's weight map
    module = ctx.build(comp, CLASSIFIER_SIZES, checked=False)
    try:
        m = map_classifier(module)
    except MappingError as not_flat:
        return _on_backbone(res, ctx, comp, module, not_flat)
    res.mapping = m.describe()
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    run = lambda x: ctx.learner.call("forward", module, x)  # noqa: E731
    check_determinism(res, ctx, comp, lambda: run(ids), "encoder_layer", "mha", "ffn")
    with fp.dropout_off():
        rec = Recorder(module, m)
        out = run(ids)
        rec.close()
        want = reference(module, m, ids, rec.seen)
        err = fp.max_error(out, want[2]) if getattr(out, "shape", None) == want[2].shape else float("inf")
        res.max_abs_error = err
        res.checks.append(Check(text("matches the classifier built from your weights and layers ([CLS] "
                                     f"first, positions 0..S, the pooler on [CLS]): logits (2, {CLASSES})",
                                     "与用你的权重和层搭出的分类模型一致（[CLS] 在最前，位置 0..S，"
                                     f"池化读 [CLS]）：logits (2, {CLASSES})"), err < fp.TOL))
        if err >= fp.TOL:
            _localize(res, module, m, ids, rec.seen)
        _padding(res, run, ids)
    return finish(res)


def _on_backbone(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module,
                 not_flat: MappingError) -> ComponentResult:
    """A classifier on an encoder model of its own (classifier_backbone.py); else NOT CHECKED with
    why its parts are not a classifier's."""
    try:
        check_backbone_classifier(res, ctx, comp, module, CLASSES)
    except MappingError:
        raise not_flat from None
    return finish(res)


def _padding(res: ComponentResult, run: Any, ids: Tensor) -> None:
    """Pads after the tokens (id 0) change no logit: [CLS] sees the real tokens only."""
    padded = torch.cat([ids, torch.zeros(ids.size(0), 3, dtype=ids.dtype)], 1)  # (B, S + 3)
    moved = fp.max_error(run(padded), run(ids))
    res.checks.append(Check(text("padding invariance: 3 pads after the tokens change no logit",
                                 "填充不变性：在 token 后面加 3 个填充，logits 不变"), moved < fp.TOL,
                            text(f"logits moved by {moved:.3g}", f"logits 变了 {moved:.3g}")))


# where the model departs: (the stage compared, the reference's keyword that explains it, its values,
# the part whose call the line holds, the form in English and Chinese)
STAGES = (("first", "shift", (1, -1), "positions", "the positions start at {v}, not 0",
           "位置从 {v} 开始，而不是 0"),
          ("pooled", "pool", (-1, 1), "pooler", "the pooler reads position {v}, not [CLS] at 0",
           "池化读的是位置 {v}，而不是位置 0 的 [CLS]"))


def _localize(res: ComponentResult, module: nn.Module, m: ClassifierMap, ids: Tensor, seen: dict) -> None:
    """The first stage whose input departs (the layers' input, the pooler's), with its form and line."""
    got = {"first": seen["first"][0][0], "pooled": seen["pooled"][0][0]}
    right = dict(zip(("first", "pooled"), reference(module, m, ids, seen)[:2]))
    for stage, key, values, part, en, zh in STAGES:
        if same(got[stage], right[stage]):
            continue
        v = next((v for v in values if same(got[stage], reference(module, m, ids, seen, **{key: v})[
            ("first", "pooled").index(stage)])), None)
        line, code = _line_of(module, getattr(m, part) or m.classifier)
        form = None if v is None else text(en.format(v=v), zh.format(v=v))
        add_departure(res, Departure(line, f"the input of {part}", code, form))
        return


def _line_of(module: nn.Module, part: str) -> tuple[int, str]:
    """The line of forward that calls self.<part>(...), or the line that binds its argument when
    that is a name (pos = torch.arange(...))."""
    lines, start = inspect.getsourcelines(type(module).forward)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
             and c.func.attr == part]
    arg = calls[0].args[0] if calls and calls[0].args else None
    binds = [a for a in ast.walk(tree) if isinstance(arg, ast.Name) and isinstance(a, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == arg.id for t in a.targets)]
    node = (binds or calls or [tree.body[0]])[-1 if binds else 0]
    return start + node.lineno - 1, lines[node.lineno - 1].strip()
