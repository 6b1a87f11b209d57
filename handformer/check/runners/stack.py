"""A backbone checked as a stack: a model that returns hidden states (B, T, D), not logits (fairseq's
TransformerEncoder, OPT's OPTDecoder, Hugging Face's GemmaModel, tensor2tensor's encoder), has no
output layer to compare with handformer's CausalLM; its layers are checked on their own. What it adds
to them is checked by hooks on its own layers, whatever their kind (an encoder's or a decoder's): each
layer is handed what the one before returned (or that added to what that one was handed: the residual
written in the loop), and the model returns what the last one returned, through its final norm where it
holds one outside its layers. Its embeddings are not compared. A model of vectors, with no token table
(lucidrains' Transformer(dim, depth, ...)), is checked so too, each ModuleList([attn, ff]) a layer keeps
read as its sublayers.

Shape legend: B batch, T length, D d_model.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import finish
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.layer_map import list_items, outside
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, source_lines, source_text
from handformer.check.core.weights import of_kind

STACK_NOTE = text("it returns hidden states (B, T, d_model), not logits: a backbone, checked as the stack of "
                  "its layers (each layer handed what the one before returned, the last one's output "
                  "returned, through its final norm where it has one); its layers are checked on their own, "
                  "its embeddings are not compared",
                  "它返回隐藏状态 (B, T, d_model)，不是 logits：这是主干网络，按层的堆叠检查（每一层拿到的是"
                  "上一层的输出，返回最后一层的输出，有最终归一化时经过它）；各层单独检查，嵌入不比较")


# what a call that hands or returns no (B, T, D) tensor reads as: a NaN, apart from every output
NOTHING = torch.tensor([[[math.nan]]], dtype=torch.float64)  # (a literal: the fork server computes nothing)


def _tensor(value: Any) -> Tensor:
    """The first (B, T, D) tensor a layer or a model is handed or returns: alone, in a tuple or a dict."""
    return fp.first_tensor([*tree_flatten(value)[0], NOTHING], 3)


def _apart(a: Tensor, b: Tensor) -> float:
    """How far a is from b, either of them read sequence-first (fairseq's (T, B, C) inside its stack)."""
    return min(fp.max_error(a, b), fp.max_error(a.transpose(0, 1), b))


def _after(given: Tensor, returned: Tensor, layer: nn.Module | None = None) -> list[Tensor]:
    """What may follow a layer's call: what it returned, or that added to what it was handed (the
    residual written outside it: lucidrains' `x = attn(x) + x`); only the latter after a `layer`
    with no residual inside."""
    return [given + returned] if layer is not None and _no_residual_inside(layer, given, returned) else [
        returned, given + returned]


@torch.no_grad()
def _no_residual_inside(layer: nn.Module, given: Tensor, returned: Tensor) -> bool:
    """Whether the layer returns the same for twice its input (but for a norm's eps): it begins with a
    norm and adds no residual (lucidrains' Attention, x = self.norm(x) first), so what it returns alone
    is no next input; False where it does not run on its input alone."""
    try:
        twice = _tensor(layer(2 * given))
    except Exception:  # noqa: BLE001  (a layer that needs more than its input: either may follow)
        return False
    scale = max(1.0, returned.abs().max().item())
    return twice.shape == returned.shape and fp.max_error(twice, returned) < 1e-4 * scale


def check_stack(comp: Component, res: ComponentResult, module: nn.Module, run: Any,
                unstacked: DiscoveryError) -> ComponentResult:
    """The stack's two checks (see the module's docstring) from one run of `run()`, which returns the
    model's output; NOT CHECKED, `unstacked` its reason, where it calls fewer than two layers or
    raises on what check hands it."""
    calls: list[tuple[Tensor, Tensor, nn.Module]] = []  # each layer call: what it was handed, returned
    items = [item for _, item in list_items(module, lambda shapes: len(shapes) >= 2)]  # two linear layers
    # a layer kept as a list of its sublayers (lucidrains': ModuleList([attn, ff])): each sublayer called
    layers = [layer for item in items for layer in (item if isinstance(item, nn.ModuleList) else [item])]
    hooks = [layer.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((_tensor((args, kwargs)), _tensor(out), m)),
        with_kwargs=True) for layer in layers]
    try:
        with fp.hooked(hooks):
            out = _tensor(run())
    except fp.LearnerFailure:  # handed check's input alone (its mask left at its default): not theirs
        raise unstacked from None
    if len(calls) < 2:
        raise unstacked
    gaps = [min(_apart(given, after) for after in _after(*before)) for before, (given, *_) in
            zip(calls, calls[1:])]  # how far each layer's input is from what may follow the one before
    handed = max(gaps)
    norms = [leaf.module for leaf in of_kind(outside(module, layers), "norm")]
    finals = [f(last) for last in _after(*calls[-1]) for f in [lambda t: t, *norms]]
    returned = min(_apart(out, final) for final in finals)
    res.checks += [Check(text("each layer is handed what the one before returned (or that plus its input)",
                              "每一层拿到的是上一层的输出（或者它加上上一层的输入）"), handed < 1e-9,
                         text(f"apart by {handed:.3g}", f"相差 {handed:.3g}")),
                   Check(text("it returns the last layer's output (through its final norm)",
                              "返回最后一层的输出（经过最终归一化）"), returned < 1e-9,
                         text(f"apart by {returned:.3g}", f"相差 {returned:.3g}"))]
    res.notes.append(STACK_NOTE)
    if handed >= 1e-9:
        res.findings.append(_unhanded(module, items, calls[gaps.index(handed):]))
    return finish(res)


def _unhanded(module: nn.Module, items: list[Any], calls: list[tuple[Tensor, Tensor, nn.Module]]) -> Finding:
    """The finding of a layer (the first of `calls`) whose output the next is not handed: no_residual
    where it adds none inside and the next is handed its output alone (lucidrains' `x = ff(x)` for
    `x = ff(x) + x`), at the line of the loop that calls it; else where the stack calls its layers."""
    (_, returned, layer), (handed, *_) = calls[:2]
    if _apart(handed, returned) >= 1e-9:
        return Finding(DEPARTS, text(
            "a layer is not handed what the one before returned: your stack parts from the reference here",
            "某一层拿到的不是上一层的输出：你的堆叠在这里与参考实现分开"), *_layer_call(module))
    return Finding("no_residual", text(
        "a sublayer's output is handed on alone: the sublayer adds no residual inside, and the loop adds "
        "none around it", "某个子层的输出被直接交给了下一层：子层内部没有残差，循环里也没有把输入加回来"),
        *_sublayer_call(module, items, layer))


def _sublayer_call(module: nn.Module, items: list[Any], layer: nn.Module) -> tuple[int | None, str | None]:
    """The line of the loop that calls this sublayer: a layer kept as a list of its sublayers (`for attn,
    ff in self.layers`) calls it by the loop's name at its place in the list; else the layers' call."""
    place = {id(sub): i for item in items for i, sub in enumerate(item.children())}.get(id(layer))
    forward = type(module).forward
    loop = next(iter(re.findall(r"for\s+\(?([\w\s,]+?)\)?\s+in\s+", source_text(forward))), "")
    name = dict(enumerate(loop.replace(",", " ").split())).get(place)
    return first_line([rf"\b{name}\("], source_lines([forward])) if name else _layer_call(module)


def _layer_call(module: nn.Module) -> tuple[int | None, str | None]:
    """The line of the model's forward that calls its layers (the loop's `layer(x, mask)`)."""
    forward = type(module).forward
    names = re.findall(r"for\s+(?:\w+\s*,\s*)?(\w+)\s+in\s+", source_text(forward))
    return first_line([rf"\b{name}\(" for name in names], source_lines([forward]))
