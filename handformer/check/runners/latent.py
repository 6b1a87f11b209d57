"""Runner for multi-head latent attention (DeepSeek-V2/V3's MLA, `handformer.families.deepseek`): the
queries through a low-rank latent (wq_a, q_norm, wq_b) or one projection (wq), the keys and values out
of one compressed latent (wkv_a, kv_norm, wkv_b) with a decoupled RoPE key of one head shared by all,
the scores scaled by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim).

The learner's module is read by its layers in the order DeepSeek's model.py and Hugging Face's
modeling file define them (q_a, q_norm, q_b, kv_a, kv_norm, kv_b, o; the head widths follow from
their shapes), driven with the rotary table of the RoPE width in the form its forward names, and
compared with the reference below in either layout of the pairs (Meta's interleaved, or halves).
Named mistakes: the latent and the RoPE key taken from the wrong ends of wkv_a's output, the scale
from another head width, the shared RoPE key not rotated. Any other difference is localized: the
first line whose tensor is none of the reference's sub-steps (`latent_views`).

Shape legend: B batch, T length, D d_model, H heads, Dn / Dr / Dv the head dims without RoPE, with
RoPE and of values, r the key/value latent's width.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import (
    Context,
    error_text,
    finish,
    forward_names,
    is_mask_name,
)
from handformer.check.core.defaults import given, then
from handformer.check.core.discovery import Component
from handformer.check.core.localize import View, first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.moe import ffn_readings
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.rope_tables import POSITION_ARGUMENTS
from handformer.check.core.sizes import SIZES, D, H
from handformer.check.core.weights import (
    Leaf,
    MappingError,
    Slot,
    ffn_weights,
    is_gated,
    leaves,
    norm_weights,
    of_kind,
)
from handformer.check.reference import variants as V
from handformer.check.runners.pieces import ffn_activations

B, T = 2, 6
LAYOUTS = ("interleaved", "half")  # DeepSeek's complex freqs_cis first, then Hugging Face's halves
FLAGS = ("latent_split_swapped", "latent_scale_wrong_width:v", "latent_scale_wrong_width:nope",
         "latent_key_not_rotated")
# the causal mask (T, S) as it may be handed, then (1, 1, T, S): Meta's and DeepSeek's additive -inf,
# bool, 0/1
MASK_FORMS = (lambda keep: torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -torch.inf),
              lambda keep: keep, lambda keep: keep.long())


@dataclass
class LatentWeights:
    """The learner's latent attention as the reference computes it."""

    q: tuple[V.Linear, V.NormWeights, V.Linear] | V.Linear  # (W_DQ, its norm, W_UQ), or one projection
    kv_a: V.Linear  # (r + Dr, D): the latent and the shared RoPE key
    kv_norm: V.NormWeights
    kv_b: V.Linear  # (H * (Dn + Dv), r)
    o: V.Linear  # (D, H * Dv)
    dims: tuple[int, int, int, int]  # r, Dn, Dr, Dv


def read_latent(module: nn.Module, heads: int = H) -> tuple[LatentWeights, list[str]]:
    """The weights of a latent attention from its layers in definition order, and the mapping's lines."""
    found = leaves(module)
    linears, norms = of_kind(found, "linear"), of_kind(found, "norm")
    if (len(linears), len(norms)) not in ((5, 2), (4, 1)):
        raise MappingError(f"expected the layers of multi-head latent attention (wq_a, q_norm, wq_b, wkv_a, "
                           f"kv_norm, wkv_b, wo), found {len(linears)} linear layers and {len(norms)} norms",
                           zh=f"应当有多头潜在注意力的各层（wq_a、q_norm、wq_b、wkv_a、kv_norm、wkv_b、wo），"
                              f"实际找到 {len(linears)} 个线性层和 {len(norms)} 个归一化")
    *q_layers, kv_a, kv_b, o = linears
    r = norms[-1].weight.numel()
    Dr = kv_a.weight.size(0) - r
    Dn = q_layers[-1].weight.size(0) // heads - Dr
    Dv = kv_b.weight.size(0) // heads - Dn
    if min(Dr, Dn, Dv) <= 0 or Dr % 2 or kv_b.weight.size(1) != r or o.weight.size(1) != heads * Dv:
        raise MappingError("the layers' shapes are not those of multi-head latent attention",
                           zh="这些层的形状不是多头潜在注意力的形状")
    q = _linear(q_layers[0]) if len(q_layers) == 1 else (
        _linear(q_layers[0]), norm_weights(Slot("q_norm", norms[0])), _linear(q_layers[1]))
    roles = ["W_DQ", "q_norm", "W_UQ"] if len(q_layers) == 2 else ["W_Q"]
    names = [x.name for x in (*q_layers[:1], *norms[:len(norms) - 1], *q_layers[1:])]
    mapping = [f"{n} -> {role}" for n, role in zip(names, roles)] + [
        f"{kv_a.name} -> W_DKV", f"{norms[-1].name} -> kv_norm", f"{kv_b.name} -> W_UKV",
        f"{o.name} -> W_O"]
    return LatentWeights(q, _linear(kv_a), norm_weights(Slot("kv_norm", norms[-1])), _linear(kv_b),
                         _linear(o), (r, Dn, Dr, Dv)), mapping


def _linear(leaf: Leaf) -> V.Linear:
    return leaf.weight, leaf.bias


def latent_attention(w: LatentWeights, x: Tensor, keep: Tensor | None, layout: str,
                     flags: V.Flags = frozenset()) -> Tensor:
    """(B, T, D) -> (B, T, D): multi-head latent attention, the catalogued mistakes on request."""
    Bx, Tx, _ = x.shape
    r, Dn, Dr, Dv = w.dims
    q = V.linear(x, w.q) if len(w.q) == 2 else V.linear(V.norm(w.q[1], V.linear(x, w.q[0])), w.q[2])
    q_nope, q_pe = q.view(Bx, Tx, H, Dn + Dr).transpose(1, 2).split([Dn, Dr], dim=-1)  # (B, H, T, Dn|Dr)
    c = V.linear(x, w.kv_a)  # (B, T, r + Dr)
    swapped = V.has(flags, "latent_split_swapped") is not None
    latent, k_pe = (c[..., Dr:], c[..., :Dr]) if swapped else c.split([r, Dr], dim=-1)
    k_pe = k_pe[:, None]  # (B, 1, T, Dr): one head shared by all
    q_pe = V.rotary(q_pe, layout)
    k_pe = k_pe if V.has(flags, "latent_key_not_rotated") is not None else V.rotary(k_pe, layout)
    kv = V.linear(V.norm(w.kv_norm, latent), w.kv_b).view(Bx, Tx, H, Dn + Dv).transpose(1, 2)
    k_nope, v = kv.split([Dn, Dv], dim=-1)  # (B, H, T, Dn), (B, H, T, Dv)
    q = torch.cat([q_nope, q_pe], dim=-1)  # (B, H, T, Dn + Dr)
    k = torch.cat([k_nope, k_pe.expand(-1, H, -1, -1)], dim=-1)  # (B, H, T, Dn + Dr)
    width = {"v": Dv, "nope": Dn}.get(V.has(flags, "latent_scale_wrong_width") or "", Dn + Dr)
    out, _ = V.attention(q, k, v, keep, frozenset(), scale=width ** -0.5)  # (B, H, T, Dv)
    return V.linear(out.transpose(1, 2).reshape(Bx, Tx, H * Dv), w.o)


class Driver:
    """The learner's module called on x (B, T, D) with its positions for the RoPE width and a mask in
    one convention (or none)."""

    def __init__(self, module: nn.Module, ctx: Context, rope_dim: int) -> None:
        self.module, self.ctx, self.rope_dim = module, ctx, rope_dim
        names = forward_names(module)[1:]
        self.mask = next(filter(is_mask_name, names), None)
        self.positions = set(names) & POSITION_ARGUMENTS.keys()

    def __call__(self, x: Tensor, mask: Tensor | None = None) -> Tensor | None:
        kwargs = {name: POSITION_ARGUMENTS[name](x.size(0), x.size(1), self.rope_dim, x.dtype, True)
                  for name in self.positions}
        kwargs[self.mask] = mask  # DeepSeek's mask is a positional argument: None is handed
        kwargs.pop(None, None)  # (no mask argument)
        return fp.first_tensor(self.ctx.learner.call("forward", lambda: self.module(x, **kwargs)), 3)


def check_latent_attention(comp: Component, ctx: Context) -> ComponentResult:
    """Multi-head latent attention against the reference, on x with no mask, then causal."""
    res = ctx.result(comp)
    module = ctx.build(comp, SIZES)
    w, res.mapping = read_latent(module)
    drive = Driver(module, ctx, w.dims[2])
    x = fp.randn(B, T, D, seed=11)
    out = drive(x)
    layout = next((lay for lay in LAYOUTS if fp.max_error(out, latent_attention(w, x, None, lay)) < fp.TOL),
                  LAYOUTS[0])
    res.convention = LAYOUT_WORDS[layout]
    err = fp.max_error(out, latent_attention(w, x, None, layout))
    res.max_abs_error = err
    found = fp.search(out, lambda flags: latent_attention(w, x, None, layout, flags), FLAGS, None)
    if found:  # (none, or no flags at all where it is right)
        res.findings += ctx.findings(found[0], found[1], err, comp)
    res.checks.append(Check(text("matches handformer's LatentAttention (DeepSeek's MLA) on your weights",
                                 "与使用你的权重的 handformer LatentAttention（DeepSeek 的 MLA）一致"),
                            err < fp.TOL, error_text(err)))
    if drive.mask is not None and err < fp.TOL:
        _causal_check(res, drive, lambda x, keep: latent_attention(w, x, keep, layout), x)
    filename = inspect.getsourcefile(type(module).forward)
    if err >= fp.TOL:  # where it first parts from the reference (named: the line placed there when unsure)
        note_departure(res, lambda: first_departure(trace_steps(lambda: drive(x), filename),
                                                    latent_views(w, x, layout), filename, SIZES))
    return finish(res)


def latent_views(w: LatentWeights, x: Tensor, layout: str) -> list[View]:
    """The sub-steps of `latent_attention` on x (no mask), for the localizer: those of each head also
    with heads and positions swapped ((B, T, H, .) as DeepSeek's model.py holds them)."""
    Bx, Tx, _ = x.shape
    r, Dn, Dr, Dv = w.dims
    q_low = V.linear(x, w.q[0]) if len(w.q) == 3 else x  # (B, T, q's rank): the query's latent, if any
    q_normed = V.norm(w.q[1], q_low) if len(w.q) == 3 else x
    q = V.linear(x, w.q) if len(w.q) == 2 else V.linear(q_normed, w.q[2])
    heads = q.view(Bx, Tx, H, Dn + Dr).transpose(1, 2)  # (B, H, T, Dn + Dr)
    c = V.linear(x, w.kv_a)  # (B, T, r + Dr)
    latent, k_pe = c.split([r, Dr], dim=-1)
    normed = V.norm(w.kv_norm, latent)  # (B, T, r)
    kv = V.linear(normed, w.kv_b)  # (B, T, H * (Dn + Dv))
    k_nope, v = kv.view(Bx, Tx, H, Dn + Dv).transpose(1, 2).split([Dn, Dv], dim=-1)  # (B, H, T, Dn|Dv)
    q_pe, k_rot = V.rotary(heads[..., Dn:], layout), V.rotary(k_pe[:, None], layout)  # (B, H|1, T, Dr)
    qq = torch.cat([heads[..., :Dn], q_pe], dim=-1)  # (B, H, T, Dn + Dr)
    kk = torch.cat([k_nope, k_rot.expand(-1, H, -1, -1)], dim=-1)
    weights = (qq @ kk.transpose(-1, -2) * (Dn + Dr) ** -0.5).softmax(-1)  # (B, H, T, T)
    out = weights @ v  # (B, H, T, Dv)
    merged = out.transpose(1, 2).reshape(Bx, Tx, H * Dv)
    per_head = [("q's heads", heads), ("q_nope", heads[..., :Dn]), ("q_pe", heads[..., Dn:]),
                ("q_pe rotated", q_pe), ("k_pe", k_pe[:, None]), ("k_pe rotated", k_rot), ("k_nope", k_nope),
                ("v", v), ("q", qq), ("k", kk), ("the scores", qq @ kk.transpose(-1, -2) * (Dn + Dr) ** -0.5),
                ("the weights", weights), ("the heads' outputs", out)]
    return [("the query's latent", q_low), ("the query's latent normed", q_normed), ("q", q),
            ("wkv_a's output: the latent c_kv and k_pe", c), ("the latent c_kv", latent),
            ("k_pe", k_pe), ("the latent normed", normed), ("wkv_b's output", kv),
            ("the heads merged", merged), ("the output", V.linear(merged, w.o))] + per_head + [
        (f"{what} (B, T, H, .)", t.transpose(1, 2)) for what, t in per_head]


def _causal_check(res: ComponentResult, drive: Driver, reference: Any, x: Tensor) -> None:
    """Handed a causal mask (in the form among MASK_FORMS that it takes), it computes what the
    reference computes with that mask."""
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    want = reference(x, keep)
    forms = [form(keep) for form in MASK_FORMS]
    forms += [m[None, None] for m in forms]  # (1, 1, T, S)
    errors = [fp.max_error(fp.quietly(lambda m=m: drive(x, m)), want) for m in forms]
    res.checks.append(Check(text("handed a causal mask, it matches the reference with that mask",
                                 "传入因果掩码时，与带这个掩码的参考实现一致"), min(errors) < fp.TOL,
                            error_text(min(errors))))


LAYOUT_WORDS = {
    "interleaved": text("RoPE pairs (2j, 2j+1), interleaved (DeepSeek's complex freqs_cis): a convention",
                        "RoPE 按 (2j, 2j+1) 相邻配对（DeepSeek 的复数 freqs_cis）：这是约定"),
    "half": text("RoPE pairs (j, j + d/2), half-split (Hugging Face): a convention",
                 "RoPE 按 (j, j + d/2) 对半配对（Hugging Face）：这是约定")}


# --- blocks and models built on latent attention ------------------------------------------------

@dataclass
class LatentBlock:
    """A pre-norm block on latent attention (DeepSeek's Block): its attention, FFN and two norms, and the
    reading its output showed (FFN slots, activation, RoPE layout)."""

    attn: LatentWeights
    readings: list[tuple[V.FFNWeights, str]]  # every (FFN, activation) reading; the matching one first
    norms: list[V.NormWeights]
    mapping: list[str]
    layout: str = LAYOUTS[0]


def latent_child(module: nn.Module) -> tuple[str, LatentWeights, list[str]] | None:
    """The submodule of `module` (not itself) that reads as latent attention: (its name, weights, mapping)."""
    for name, child in module.named_modules():
        if name and len(of_kind(leaves(child), "linear")) in (4, 5):
            read = fp.quietly(lambda child=child: read_latent(child))
            if read is not None:
                return name, *read
    return None


def read_block(module: nn.Module) -> LatentBlock | None:
    """The block's latent attention, its FFN readings and its two norms (None: no latent attention)."""
    found = latent_child(module)
    if found is None:
        return None
    name, attn, mapping = found
    rest = [x for x in leaves(module) if not x.name.startswith(f"{name}.")]
    norms = of_kind(rest, "norm")
    if len(norms) != 2:
        raise MappingError(f"expected 2 norms beside the latent attention, found {len(norms)}",
                           zh=f"潜在注意力之外应当有 2 个归一化，实际找到 {len(norms)} 个")
    slots = ffn_readings(module, of_kind(rest, "linear"), None, "FFN")
    _all_read(of_kind(rest, "linear"), slots[0])
    readings = [(ffn_weights(s, act), act) for s in slots for act in ffn_activations(is_gated(s))]
    mapping = [f"{name}.{m}" for m in mapping] + [s.describe() for s in slots[0]] + [
        f"{n.name} -> norm {i + 1}" for i, n in enumerate(norms)]
    return LatentBlock(attn, readings, [norm_weights(Slot("norm", n)) for n in norms], mapping)


def _all_read(linears: list[Leaf], slots: list[Slot]) -> None:
    """MappingError where the FFN read leaves layers of the block out (DeepSeek's MoE: its router, a
    matrix of its own, and its routed experts beside the shared ones read as one FFN)."""
    used = {id(s.leaf.weight) for s in slots}  # a router too: a RouterSlot is a slot
    left = [x.name for x in linears if id(x.weight) not in used]
    if left:
        names = f"{', '.join(left[:3])}: {len(left)} in all"
        raise MappingError(f"its FFN holds layers that no FFN handformer maps reads ({names}): a mixture "
                           "of experts whose router is not an nn.Linear(d_model, n_experts) beside its "
                           "list of experts",
                           zh=f"它的 FFN 里有 handformer 能对应的 FFN 读不到的层（{names}）：一个混合专家，"
                              "它的路由器不是放在专家列表旁边的 nn.Linear(d_model, n_experts)")


def block_reference(b: LatentBlock, x: Tensor, keep: Tensor | None, flags: V.Flags = frozenset(),
                    reading: int = 0, layout: str | None = None) -> Tensor:
    """x + attn(norm_1(x)), then + ffn(norm_2(.)): (B, T, D)."""
    x = x + latent_attention(b.attn, V.norm(b.norms[0], x), keep, layout or b.layout, flags)
    return x + V.feed_forward(b.readings[reading][0], V.norm(b.norms[1], x))


def fit_block(b: LatentBlock, out: Tensor | None, x: Tensor) -> bool:
    """Take the reading (FFN, activation, layout) whose block computes `out`; whether one does."""
    for layout in LAYOUTS:
        for i in range(len(b.readings)):
            if fp.max_error(out, block_reference(b, x, None, reading=i, layout=layout)) < fp.TOL:
                b.readings.insert(0, b.readings.pop(i))
                b.layout = layout
                return True
    return False


def check_latent_block(comp: Component, ctx: Context, module: nn.Module, b: LatentBlock) -> ComponentResult:
    """A block on latent attention against the pre-norm reference, with no mask, then causal."""
    res = ctx.result(comp)
    res.mapping = b.mapping
    drive = Driver(module, ctx, b.attn.dims[2])
    x = fp.randn(B, T, D, seed=12)
    out = drive(x)
    fitted = fit_block(b, out, x)
    err = fp.max_error(out, block_reference(b, x, None))
    res.max_abs_error = err
    found = fp.search(out, lambda flags: block_reference(b, x, None, flags), FLAGS, None)
    if found:
        res.findings += ctx.findings(found[0], found[1], err, comp, "mla")
    res.notes += [LAYOUT_WORDS[b.layout]]
    res.notes.append(text(f"pre-norm block on multi-head latent attention (DeepSeek's); FFN: "
                          f"{b.readings[0][1]}", f"基于多头潜在注意力（DeepSeek）的 Pre-Norm Block；"
                          f"前馈网络：{b.readings[0][1]}"))
    res.checks.append(Check(text("matches the pre-norm block on handformer's LatentAttention",
                                 "与基于 handformer LatentAttention 的 Pre-Norm Block 一致"),
                            err < fp.TOL, error_text(err)))
    if drive.mask is not None and fitted:
        _causal_check(res, drive, lambda x, keep: block_reference(b, x, keep), x)
    return finish(res)


@dataclass
class LatentModel:
    """A decoder-only model on latent-attention blocks (DeepSeek's Transformer): token embedding, blocks,
    final norm, output head (None: tied to the embedding)."""

    embed: Tensor  # (V, D)
    blocks: list[LatentBlock]
    norm: V.NormWeights | None
    head: V.Linear | None
    mapping: list[str]


def read_model(module: nn.Module, vocab: int) -> LatentModel | None:
    """The model's parts where its blocks are on latent attention; None where they are not."""
    from handformer.check.core.layer_map import outside

    lists = [(name, lst) for name, lst in module.named_modules() if isinstance(lst, nn.ModuleList)]
    blocks = [b for name, lst in lists for b in _list_blocks(name, lst)]
    outer = outside(module, [m for _, m, _ in blocks])
    parts = {(x.kind, tuple(x.weight.shape)): x for x in outer}  # the embedding (V, D), the head (V, D)
    embed, head = parts.get(("embedding", (vocab, D))), parts.get(("linear", (vocab, D)))
    norms = of_kind(outer, "norm")
    if not blocks or embed is None:
        return None
    mapping = [f"{embed.name} -> token embedding"]
    mapping += [f"{n} -> block {i}" for i, (n, _, _) in enumerate(blocks)]
    mapping += [f"{norms[0].name} -> final norm"] * bool(norms) + [f"{head.name} -> output head"] * bool(head)
    return LatentModel(embed.weight, [b for _, _, b in blocks], norm_weights(Slot("norm", norms[0])) if norms
                       else None, then(head, _linear), mapping)


def _list_blocks(name: str, lst: nn.ModuleList) -> list[tuple[str, nn.Module, LatentBlock]]:
    """The blocks on latent attention in a model's list; MappingError where the list holds some and
    another of its items cannot be read as one (DeepSeek's layers on a mixture of experts, beside its
    dense first layer): the model is not compared on a part of its blocks."""
    read = [(f"{name}.{i}", m, _read_block(m)) for i, m in enumerate(lst)]
    found = [(n, m, b) for n, m, b in read if isinstance(b, LatentBlock)]
    failed = next(((n, b) for n, _, b in read if isinstance(b, MappingError)), None)
    if failed:  # a latent attention in a block it cannot read
        raise MappingError(f"its block {failed[0]} on latent attention is not one handformer maps: "
                           f"{failed[1]}",
                           zh=f"它的 Block {failed[0]}（潜在注意力）不是 handformer 能对应的："
                              f"{failed[1].zh or failed[1]}")
    return found


def _read_block(module: nn.Module) -> LatentBlock | MappingError | None:
    try:
        return read_block(module)
    except MappingError as err:
        return err if latent_child(module) is not None else None
    except Exception:  # noqa: BLE001 - a module that is no block at all
        return None


def model_reference(m: LatentModel, idx: Tensor, flags: V.Flags = frozenset(), reading: int = 0,
                    layout: str = LAYOUTS[0]) -> Tensor:
    """The logits (B, T, V) of the model on latent attention, causal."""
    x = m.embed[idx]  # (B, T, D)
    keep = torch.ones(idx.size(1), idx.size(1), dtype=torch.bool).tril()
    act = m.blocks[0].readings[reading][1]  # each block reads its FFN (dense, or MoE) with that activation
    for b in m.blocks:
        own = next((i for i, r in enumerate(b.readings) if r[1] == act), 0)
        x = block_reference(b, x, keep, flags, own, layout)
    x = V.norm(m.norm, x) if m.norm is not None else x
    return V.linear(x, given(m.head, (m.embed, None)))


def check_latent_model(res: ComponentResult, ctx: Context, comp: Component, logits: Tensor, m: LatentModel,
                       idx: Tensor) -> ComponentResult:
    """The model's logits against the reference on the reading (FFN activation, RoPE layout) that
    gives them, else with one of the latent attention's mistakes."""
    res.mapping = m.mapping
    settings = [(i, layout) for layout in LAYOUTS for i in range(len(m.blocks[0].readings))]

    def ref(flags: V.Flags, *setting: Any) -> Tensor:  # the last positions alone where that is all it gives
        return model_reference(m, idx, flags, *setting)[:, -logits.size(1):]

    searched = [fp.search(logits, lambda flags, s=s: ref(flags, *s), FLAGS, None)
                for s in settings]  # (no flags where it is right; None where nothing reproduces it)
    errors = [fp.max_error(logits, ref(frozenset(), *s)) for s in settings]
    best = min(range(len(settings)), key=lambda i: (searched[i] is None, errors[i]))
    (_, layout), found, err = settings[best], searched[best], errors[best]
    res.max_abs_error = err
    res.findings += ctx.findings(found[0], found[1], err, comp, "mla", "block") if found else []
    res.notes += [LAYOUT_WORDS[layout]]
    res.checks.append(Check(text("matches a decoder-only model of pre-norm blocks on handformer's "
                                 "LatentAttention on your weights", "与使用你的权重、由基于 handformer "
                                 "LatentAttention 的 Pre-Norm Block 组成的 decoder-only 模型一致"),
                            err < fp.TOL, error_text(err)))
    return finish(res)
