"""A backbone checked as a stack: a model that returns hidden states (B, T, D), not logits (fairseq's
TransformerEncoder, OPT's OPTDecoder, Hugging Face's GemmaModel, tensor2tensor's encoder), has no
output layer to compare with handformer's CausalLM; its layers are checked on their own. What it adds
to them is checked by hooks on its own layers, whatever their kind (an encoder's or a decoder's): each
layer is handed what the one before returned, and the model returns what the last one returned,
through its final norm where it holds one outside its layers. Its embeddings are not compared.

Shape legend: B batch, T length, D d_model.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import finish
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.layer_map import list_items, outside
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.weights import of_kind

STACK_NOTE = text("it returns hidden states (B, T, d_model), not logits: a backbone, checked as the stack of "
                  "its layers (each layer handed what the one before returned, the last one's output "
                  "returned, through its final norm where it has one); its layers are checked on their own, "
                  "its embeddings are not compared",
                  "它返回隐藏状态 (B, T, d_model)，不是 logits：这是主干网络，按层的堆叠检查（每一层拿到的是"
                  "上一层的输出，返回最后一层的输出，有最终归一化时经过它）；各层单独检查，嵌入不比较")


def _tensor(value: Any) -> Tensor | None:
    """The (B, T, D) tensor a layer or a model returns: alone, first in a tuple, or in a dict."""
    return fp.first_tensor(list(value.values()) if isinstance(value, dict) else value, 3)


def _apart(a: Tensor | None, b: Tensor | None) -> float:
    """How far a is from b, either of them read sequence-first (fairseq's (T, B, C) inside its stack)."""
    if a is None or b is None:
        return float("inf")
    return min(fp.max_error(a, b), fp.max_error(a.transpose(0, 1), b))


def check_stack(comp: Component, res: ComponentResult, module: nn.Module, run: Any) -> ComponentResult:
    """The stack's two checks (see the module's docstring) from one run of `run()`, which returns the
    model's output; NOT CHECKED, as a backbone, where it calls fewer than two layers."""
    calls: list[tuple[Tensor | None, Tensor | None]] = []  # each layer call: what it was handed, returned
    layers = [child for _, child in list_items(module, lambda shapes: len(shapes) >= 2)]  # linear layers
    hooks = [layer.register_forward_hook(
        lambda _, args, kwargs, out: calls.append((_tensor([*args, *kwargs.values()]), _tensor(out))),
        with_kwargs=True) for layer in layers]
    with fp.hooked(hooks):
        out = _tensor(run())
    if len(calls) < 2:
        raise DiscoveryError(
            f"{comp.name} returns hidden states (B, T, d_model), not logits, and another class of the file "
            "builds it or it holds no output layer: a backbone, checked through a model that adds the head",
            zh=f"{comp.name} 返回隐藏状态 (B, T, d_model)，不是 logits，而且文件里另一个类构造了它，"
               "或者它没有输出层：这是主干网络，通过加上输出层的模型来检查")
    handed = max(_apart(given, before[1]) for before, (given, _) in zip(calls, calls[1:]))
    last = calls[-1][1]
    finals = [last] + [leaf.module(last) for leaf in of_kind(outside(module, layers), "norm")]
    returned = min(_apart(out, final) for final in finals)
    res.checks += [Check(text("each layer is handed what the one before returned",
                              "每一层拿到的是上一层的输出"), handed < 1e-9,
                         text(f"apart by {handed:.3g}", f"相差 {handed:.3g}")),
                   Check(text("it returns the last layer's output (through its final norm)",
                              "返回最后一层的输出（经过最终归一化）"), returned < 1e-9,
                         text(f"apart by {returned:.3g}", f"相差 {returned:.3g}"))]
    res.notes.append(STACK_NOTE)
    if handed >= 1e-9:
        number, code = _layer_call(module)
        res.findings.append(Finding(DEPARTS, text(
            "a layer is not handed what the one before returned: your stack parts from the reference here",
            "某一层拿到的不是上一层的输出：你的堆叠在这里与参考实现分开"), number, code))
    return finish(res)


def _layer_call(module: nn.Module) -> tuple[int | None, str | None]:
    """The line of the model's forward that calls its layers (the loop's `layer(x, mask)`)."""
    lines, start = inspect.getsourcelines(type(module).forward)
    loop = re.search(r"for\s+(?:\w+\s*,\s*)?(\w+)\s+in\s+", "".join(lines))
    calls = [i for i, line in enumerate(lines) if loop and re.search(rf"\b{loop.group(1)}\(", line)]
    return (start + calls[0], lines[calls[0]].strip()) if calls else (None, None)
