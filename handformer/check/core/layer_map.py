"""The learner's layers, found in their ModuleLists and Sequentials and read as handformer's slots:
the attentions, the FFN and the norms of each encoder, decoder or decoder-only layer."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import D, H
from handformer.check.core.gains import fold
from handformer.check.core.moe import ffn_readings, outside_moe
from handformer.check.core.qkv_layouts import ffn_ups, kv_width
from handformer.check.core.score_scale import smallest_holder
from handformer.check.core.source import source_text
from handformer.check.core.weights import (
    Gainless,
    Leaf,
    MappingError,
    Slot,
    attention_slots,
    by_sublayer,
    leaves,
    no_unreferenced_parts,
    norm_slots,
    of_kind,
    one_head_width,
    qk_norm_slots,
    shapes_text,
    sink_slots,
    split_attention_ffn,
    with_shape,
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
    return [Leaf(f"{prefix}.{leaf.name}".removesuffix(".(self)"), leaf.kind, leaf.module, leaf.weight,
                 leaf.bias) for leaf in found]


def list_items(module: nn.Module, keep: Callable[[list[tuple[int, ...]]], bool],
               split: Callable[[list[Leaf]], list[Leaf]] = list) -> list[tuple[str, nn.Module]]:
    """The items of the learner's ModuleLists and Sequentials whose linear layers' weight shapes `keep`
    accepts (those layers read through `split`), outermost first (an item inside one already taken is
    not looked at), in definition order."""
    out: list[tuple[str, nn.Module]] = []
    for name, sub in module.named_modules():
        if not isinstance(sub, (nn.ModuleList, nn.Sequential)):
            continue
        for child_name, child in sub.named_children():
            path = f"{name}.{child_name}".removeprefix(".")  # (a list that is the module itself: no name)
            if any(path.startswith(p + ".") for p, _ in out):
                continue
            if keep([tuple(leaf.weight.shape) for leaf in split(of_kind(leaves(child), "linear"))]):
                out.append((path, child))
    return out


def outside(module: nn.Module, parts: list[nn.Module]) -> list[Leaf]:
    """The leaves of module outside these parts (a model's embeddings, final norm and head, outside
    its layers), in definition order."""
    inside = {id(m) for part in parts for m in part.modules()}
    return [leaf for leaf in leaves(module) if id(leaf.module) not in inside]


@torch.no_grad()
def rows_normed(head: Leaf) -> bool:
    """Whether an output head multiplies by its weight with each row L2-normalised (Baichuan 2's
    NormHead: F.linear(x, F.normalize(weight))), by what it gives for the unit vectors."""
    weight = head.weight.detach()  # (V, D)
    out = fp.quietly(lambda: head.module(torch.eye(weight.size(1), dtype=weight.dtype)))  # (D, V)
    normed = torch.nn.functional.normalize(weight, dim=-1)
    return (isinstance(out, torch.Tensor) and out.shape == weight.T.shape
            and fp.max_error(out.T, normed) < 1e-6 < fp.max_error(normed, weight))


def output_head(outer: list[Leaf], vocab: int, embed: Leaf, more: list[Leaf], what: tuple[str, str],
                ) -> tuple[Leaf | None, bool, bool]:
    """An assembled model's output layer among the leaves outside its layers: the nn.Linear(d_model,
    vocab) (None when the forward multiplies by the embedding), whether it is tied to `embed`,
    whether it has a bias. MappingError for any other nn.Linear outside the layers, or `more` (the
    leaves the model has one too many of); `what` words the error (en, zh)."""
    head = next(iter(with_shape(of_kind(outer, "linear"), (vocab, D))), None)
    # beside the output layer, a head of one number a position (PPO's value head, v_head (1, D)) is no
    # part of the language model: its output is not compared
    beside = with_shape(of_kind(outer, "linear"), (1, D)) if head is not None else []
    extra = [leaf for leaf in of_kind(outer, "linear") if leaf not in [head, *beside]] + more
    if extra:
        raise MappingError(f"{what[0]}: {shapes_text(extra)}", zh=f"{what[1]}：{shapes_text(extra)}")
    return head, head is None or head.weight is embed.weight, head is not None and head.bias is not None


def layer_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The items of the learner's ModuleLists and Sequentials that hold an attention and an FFN (PaLM's
    two in one projection, fused_attn_ff_proj, read as two)."""
    return list_items(module, lambda shapes: projection_width(shapes) >= 4 and _has_ffn(shapes), _split)


def _has_ffn(shapes: list[tuple[int, ...]]) -> bool:
    """An FFN's up projection (F, D) among the shapes: one wider than D, at 3D only where its down
    projection follows (else a fused q|k|v projection)."""
    ups = ffn_ups(shapes)
    return any(s[1] == D and s[0] > D and (s[0] != 3 * D or i in ups) for i, s in enumerate(shapes))


def _split(linears: list[Leaf]) -> list[Leaf]:
    return split_attention_ffn(linears, D, D // H)


def projection_width(shapes: list[tuple[int, ...]]) -> int:
    """The number of (D, D) projections among the linear layers' weight shapes, a fused (3D, D) one
    (or a multi-query one, (D + 2 kv, D): Falcon's, SantaCoder's) counting three."""
    ups = ffn_ups(shapes)  # an FFN's (2D, D) or (3D, D) up projection: no fused one
    one_query = 2 * (one_head_width(shapes, D) != D)  # a multi-query k_proj and v_proj (Dh, D)
    return one_query + sum(1 if s == (D, D) else 3 if s[1] == D and kv_width(s[0], D, D // H) and i not in ups
                           else 0 for i, s in enumerate(shapes))  # (3D: kv = D)


SUBLAYERS = {False: ["self-attention", "FFN"], True: ["self-attention", "cross-attention", "FFN"]}  # decoder?


def map_layer(path: str, child: nn.Module, F_width: int, kv: int | None = None) -> LayerMap:
    """The layer's slots; `kv`: the width of its key and value projections (grouped-query attention)."""
    found = no_unreferenced_parts(prefixed(leaves(child), path), D // H)  # Shaw's tables, per-head q/k gains
    linears = _split(of_kind(found, "linear"))
    # a cross-attention's projections besides its own; never an expert's (Qwen3-MoE's at d_ff = d_model)
    decoder = projection_width([tuple(x.weight.shape) for x in outside_moe(child, linears)]) >= 7
    names = SUBLAYERS[decoder]
    attn = attention_slots(outside_moe(child, linears), D, len(names) - 1, path, kv)  # each but the FFN
    ffn = ffn_reading(child, ffn_readings(child, linears, F_width, path, label=path))
    *attn, ffn = fold(of_kind(found, "gain"), [*attn, ffn], path)  # LayerScale: into W_O's and W_down's rows
    norms, qk = block_norms(of_kind(found, "norm"))
    attn[0] += qk or gainless_qk(child)
    attn[0] += sink_slots(of_kind(found, "scalar"), H)  # gpt-oss's attention sinks
    norms = norms or gainless_norms(child, len(names))
    if len(norms) == 1:
        norms = norms * len(names)
    norms = by_sublayer(norms, [*attn, ffn])
    slots = norm_slots(norms, len(names), names, path, sandwich=not decoder)  # (Gemma's four: a block's)
    return LayerMap(path, decoder, attn, ffn, slots)


# the gate named second where the code splits a fused projection: OLMo's x, gate = x.chunk(2, -1)
GATE_SECOND = re.compile(r"\w+\s*,\s*\w*gate\w*\s*=\s*[\w.()\[\]]*chunk\(\s*2")


def ffn_reading(child: nn.Module, readings: list[list[Slot]]) -> list[Slot]:
    """The FFN reading a layer's mapping takes: for gate and up fused in one layer, the half its file's
    code names the gate (OLMo's `x, gate = x.chunk(2, dim=-1)`: the second); for two layers, the second
    order where the FFN's output is linear in its up projection (Qwen's w1 * silu(w2)); else the first."""
    fused = readings[0][0].rows is not None
    second = GATE_SECOND.search(_own_file(child)) if fused else \
        fp.quietly(lambda: _linear_in_up(child, readings[1]))
    return readings[int(bool(second))]


def _own_file(child: nn.Module) -> str:
    """The source of the learner's file a layer comes from: that of its first part of a class not torch's
    (lucidrains' layer is an nn.ModuleList of its PreNorm wrappers)."""
    own = next((type(m) for m in child.modules() if not type(m).__module__.startswith("torch.")), type(child))
    return source_text(sys.modules.get(own.__module__))


@torch.no_grad()
def _linear_in_up(child: nn.Module, reading: list[Slot]) -> bool:
    """Whether the smallest module of `child` that holds the reading's FFN is linear in its up
    projection's output: f(u) + f(-u) = 2 f(0), a down projection's bias or not (the gate passes an
    activation: it is not, even ReLU's, which doubling would not tell)."""
    up = next(s.leaf.module for s in reading if s.role == "FFN W_up")
    ffn = smallest_holder(child, {id(s.leaf.module) for s in reading})
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(5)).to(up.weight.dtype)
    plus, minus, zero = _scaled(ffn, up, x, 1.0), _scaled(ffn, up, x, -1.0), _scaled(ffn, up, x, 0.0)
    return bool(torch.allclose(plus + minus, 2 * zero, rtol=1e-4, atol=1e-6))


def _scaled(ffn: nn.Module, up: nn.Module, x: torch.Tensor, c: float) -> torch.Tensor:
    """The FFN's output with its up projection's output times c."""
    with fp.hooked([up.register_forward_hook(lambda module, args, out: c * out)]):
        return fp.first_tensor(ffn(x))


# OLMo 2's q/k norms over the whole width, inside the block's attention (self_attn.q_norm)
QK_WIDE = re.compile(r"(?i).+\.(q|k|query|key)_?(norm|layernorm|ln)")


def block_norms(norms: list[Leaf]) -> tuple[list[Leaf], list[Slot]]:
    """A layer's norms apart from its attention's q/k norms (QK-norm, Qwen3's and minimind's: two
    norms of width head_dim named like q_norm and k_norm), which are the attention's slots: a layer
    has one norm a sublayer besides them."""
    qk = qk_norm_slots([n for n in norms if tuple(n.weight.shape) == (D // H,) or QK_WIDE.fullmatch(n.name)],
                       D // H, D)
    taken = {id(slot.leaf) for slot in qk}
    return [n for n in norms if id(n) not in taken], qk


# a call of a function, not of a module's method: norm(x), F.rms_norm(q, ...), rms(h)
CALL = re.compile(r"(?<![\w.])(?:F\.|torch\.nn\.functional\.)?(\w+)\(\s*(\w+)")
NORM_BODY = re.compile(r"rms_norm|layer_norm|rsqrt")
QK_NAMES = ("q", "k", "xq", "xk", "query", "key", "queries", "keys")
EPS64 = float(torch.finfo(torch.float64).eps)  # F.rms_norm's eps=None in the float64 comparisons


def _norm_kind(function: str, owner: Any) -> str:
    """rmsnorm or layernorm: F.layer_norm, F.rms_norm, or what the learner's own function calls."""
    if "layer" in function.lower():
        return "layernorm"
    module = sys.modules.get(getattr(owner, "__module__", ""), None)
    own = getattr(module, function, None)  # None where no module: no source
    return "layernorm" if "layer_norm" in source_text(own) else "rmsnorm"


def gainless_norm(name: str, kind: str, width: int) -> Gainless:
    module = nn.RMSNorm(width, eps=EPS64) if kind == "rmsnorm" else nn.LayerNorm(width)
    module = module.double()
    return Gainless(name, "norm", module, module.weight, getattr(module, "bias", None))


def _calls(module: nn.Module, forward_only: bool) -> list[tuple[str, str, Any]]:
    """(function, first argument, class) of the norm-function calls in the learner's class of
    `module` (its forward), or in any learner class inside it (forward_only False)."""
    owners = [type(module)] if forward_only else list(map(type, module.modules()))
    out = []
    for cls in dict.fromkeys(owners):
        if not cls.__module__.startswith("learner_"):
            continue
        source = source_text(cls.forward) if forward_only else source_text(cls)
        out += [(f, arg, cls) for f, arg in CALL.findall(source) if _norm_function(f, cls)]
    return out


def _norm_function(name: str, owner: Any) -> bool:
    """A norm function: torch's (F.rms_norm, F.layer_norm), or one of the learner's file named like a
    norm or computing one (nanochat's norm(x), a rms(x) that calls F.rms_norm)."""
    if name[0].isupper():  # a class: a module built, not a function called
        return False
    module = sys.modules.get(getattr(owner, "__module__", ""), None)
    own = getattr(module, name, None)  # None where no module
    if own is not None and getattr(own, "__module__", None) == module.__name__ and callable(own):
        return "norm" in name.lower() or bool(NORM_BODY.search(source_text(own)))
    return name in ("rms_norm", "layer_norm")


def gainless_qk(module: nn.Module, head_dim: int = D // H) -> list[Slot]:
    """QK-norm written as a function without gains (nanochat's q, k = norm(q), norm(k)): two gainless
    norms of width head_dim, handformer's QK-norm with gains of one (before or after RoPE is the
    same: a rotation keeps each head's root mean square); none when no such call is in the source."""
    calls = [(f, cls) for f, arg, cls in _calls(module, False) if arg in QK_NAMES]
    if not calls:
        return []
    f, cls = calls[0]
    # nanochat's `q = q * 1.2` after norm(q): the gain the norm does without, fixed
    gains = {arg: _constant_factor(source_text(cls.forward), arg) for arg in ("q", "k")}
    named = {arg: f"{f}({arg}) (no gain)" if g == 1 else f"{f}({arg}) * {g:g} (a fixed gain)"
             for arg, g in gains.items()}
    slots = [Slot(role, gainless_norm(named[arg], _norm_kind(f, cls), head_dim))
             for role, arg in (("q_norm", "q"), ("k_norm", "k"))]
    with torch.no_grad():
        for slot, arg in zip(slots, ("q", "k")):
            slot.leaf.weight.fill_(gains[arg])
    return slots


NUMBER = r"(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"


def _constant_factor(source: str, name: str) -> float:
    """The number a forward multiplies `name` by in a line of its own (`q = q * 1.2`, `q *= 1.2`,
    `q = 1.2 * q`), 1 when there is none: after a QK-norm without gains it is the gain its queries or
    keys get (a gain of that value, fixed), not a mistake."""
    n = re.escape(name)
    forms = (rf"^\s*{n}\s*=\s*{n}\s*\*\s*{NUMBER}\s*(?:#.*)?$", rf"^\s*{n}\s*\*=\s*{NUMBER}\s*(?:#.*)?$",
             rf"^\s*{n}\s*=\s*{NUMBER}\s*\*\s*{n}\s*(?:#.*)?$")
    found = [float(m.group(1)) for form in forms for m in re.finditer(form, source, re.M)]
    return found[0] if len(found) == 1 else 1.0


def gainless_norms(module: nn.Module, count: int) -> list[Leaf]:
    """A block's (or model's) norms written as function calls in its forward (nanochat's
    x + self.attn(norm(x))): `count` gainless norms of width d_model, in call order; none when the
    forward calls fewer."""
    calls = [(f, cls) for f, arg, cls in _calls(module, True) if arg not in QK_NAMES]
    if len(calls) < count:
        return []
    return [gainless_norm(f"{f}() #{i} (no gain)", _norm_kind(f, cls), D) for i, (f, cls) in
            enumerate(calls[:count])]
