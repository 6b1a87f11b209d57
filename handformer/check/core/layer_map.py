"""The learner's layers, found in their ModuleLists and Sequentials and read as handformer's slots:
the attentions, the FFN and the norms of each encoder, decoder or decoder-only layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from handformer.check.core.context import D, H
from handformer.check.core.weights import (
    Leaf,
    Slot,
    attention_slots,
    ffn_slots,
    leaves,
    norm_slots,
    qk_norm_slots,
)


@dataclass
class LayerMap:
    """One of the learner's encoder or decoder layers: its attentions, FFN and norms as slots."""

    name: str
    decoder: bool
    attn: list[list[Slot]]
    ffn: list[Slot]
    norms: list[Slot]


def prefixed(found: list[Leaf], prefix: str) -> list[Leaf]:
    return [Leaf(f"{prefix}.{leaf.name}" if leaf.name != "(self)" else prefix, leaf.kind, leaf.module,
                 leaf.weight, leaf.bias) for leaf in found]


def list_items(module: nn.Module, keep: Callable[[list[tuple[int, ...]]], bool],
               ) -> list[tuple[str, nn.Module]]:
    """The items of the learner's ModuleLists and Sequentials whose linear layers' weight shapes `keep`
    accepts, outermost first (an item inside one already taken is not looked at), in definition order."""
    out: list[tuple[str, nn.Module]] = []
    for name, sub in module.named_modules():
        if not isinstance(sub, (nn.ModuleList, nn.Sequential)):
            continue
        for child_name, child in sub.named_children():
            path = f"{name}.{child_name}" if name else child_name
            if any(path.startswith(p + ".") for p, _ in out):
                continue
            if keep([tuple(leaf.weight.shape) for leaf in leaves(child) if leaf.kind == "linear"]):
                out.append((path, child))
    return out


def layer_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The items of the learner's ModuleLists and Sequentials that hold an attention and an FFN."""
    return list_items(module, lambda shapes: projection_width(shapes) >= 4 and any(
        s[1] == D and s[0] > D for s in shapes if s[0] != 3 * D))


def projection_width(shapes: list[tuple[int, ...]]) -> int:
    """The number of (D, D) projections among the linear layers' weight shapes, a fused (3D, D) one
    counting three."""
    return sum(1 if s == (D, D) else 3 if s == (3 * D, D) else 0 for s in shapes)


def map_layer(path: str, child: nn.Module, F_width: int) -> LayerMap:
    found = prefixed(leaves(child), path)
    linears = [leaf for leaf in found if leaf.kind == "linear"]
    decoder = projection_width([tuple(x.weight.shape) for x in linears]) >= 7
    attn = attention_slots(linears, D, 2 if decoder else 1, path)
    ffn = ffn_slots(linears, D, F_width, path)[0]
    names = ["self-attention", "cross-attention", "FFN"] if decoder else ["self-attention", "FFN"]
    norms, qk = block_norms([leaf for leaf in found if leaf.kind == "norm"])
    attn[0] += qk
    if len(norms) == 1:
        norms = norms * len(names)
    return LayerMap(path, decoder, attn, ffn, norm_slots(norms, len(names), names, path))


def block_norms(norms: list[Leaf]) -> tuple[list[Leaf], list[Slot]]:
    """A layer's norms apart from its attention's q/k norms (QK-norm, Qwen3's and minimind's: two
    norms of width head_dim named like q_norm and k_norm), which are the attention's slots: a layer
    has one norm a sublayer besides them."""
    qk = qk_norm_slots([n for n in norms if tuple(n.weight.shape) == (D // H,)], D // H)
    taken = {id(slot.leaf) for slot in qk}
    return [n for n in norms if id(n) not in taken], qk
