"""Runners for attention: the scaled dot-product function, d2l's masked softmax, multi-head attention
(self and cross, grouped-query, with rotary positions inside), and causal self-attention that builds
its own mask.

Each compares the learner's output (and returned weights, and gradients) with handformer's own
component on several shapes and masks, runs the reference-free checks (causality, padding
invariance, a key_padding_mask given alone, heads one by one, no NaN on fully masked rows, eval
determinism, the tutorials' shapes), and names mistakes by fingerprint search over
`handformer.check.reference.variants`.

Shape legend: B batch, T query length, S key length, D d_model, H heads, Hkv key/value heads,
Dh head dim.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import INPUT_ROLES as ROLES
from handformer.check.core.argument_names import RESIDUAL_NAMES
from handformer.check.core.context import (
    ATTENTION_FLAGS,
    MAX_LEN,
    ROPE_FLAGS,
    SDPA_SIZES,
    SEQUENCE_FIRST,
    TUTORIAL,
    Context,
    D,
    H,
    attention_flags,
    batch_first,
    causal,
    causal_mask_named,
    comment_says_keep,
    error_text,
    file_masks_keep,
    finish,
    first_working,
    forward_defaults,
    forward_parameters,
    grads_error,
    guarded,
    is_cache_argument,
    is_mask_name,
    is_mask_param,
    is_number,
    masked_rows,
    masks_where_true_inside,
    moved_by,
    nan_on_hidden_rows,
    not_cropped,
    optional_extra,
    optional_inputs,
    outputs_by_convention,
    positions,
    reads_sequence_first_masked,
    says_keep,
    shape_of,
)
from handformer.check.core.conventions import SEQUENCE_FIRST_CONVENTIONS, SHARED
from handformer.check.core.defaults import given, then
from handformer.check.core.discovery import Component, computes_attention, core_attention, reads_kv_heads
from handformer.check.core.fused_qkv import find_layouts_
from handformer.check.core.global_window import check_global, global_inputs, global_names
from handformer.check.core.kept_state import gradient_error, snapshot, written
from handformer.check.core.layer_map import Gainless, gainless_qk
from handformer.check.core.localize import (
    localize_attention,
    note_attention_departure,
    note_raised_attention,
)
from handformer.check.core.localize_kinds import localize_masked_softmax, localize_sdpa, note_departure
from handformer.check.core.norm_inside import (
    less_query,
    norm_taken_out,
    norms_around,
    post_norm_note,
    take_out_leading_norm,
)
from handformer.check.core.parent_inputs import handed_apart
from handformer.check.core.probe import Found, Probe, Subject, drive, run_probe
from handformer.check.core.projection_elsewhere import projection_elsewhere
from handformer.check.core.reference_attention import handformer_attention
from handformer.check.core.result import DEPARTS, DIFFERS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.rope_tables import (
    alibi_argument,
    position_kwargs,
    renamed,
    renamed_table,
    with_positions,
)
from handformer.check.core.rotary import (
    ALIBI_WORDS,
    ROPE_WORDS,
    fraction_unread,
    partial_layouts,
    rope_note,
    rope_tables,
)
from handformer.check.core.score_scale import configured_scales, scale_note
from handformer.check.core.source import (
    code_text,
    first_line,
    functions_called,
    locate,
    reads_local,
    source_lines,
    source_text,
    strided_loop,
)
from handformer.check.core.square_only import in_a_form_taken, square_note
from handformer.check.core.sublayer import grade_sublayer, sublayer_parts
from handformer.check.core.unmapped import held_apart
from handformer.check.core.weights import (
    QK_NORM_ROLES,
    RELATIVE_ROLE,
    MappingError,
    Slot,
    attention_parameters,
    attention_slots,
    kv_heads_of,
    leaves,
    mha_weights,
    no_unreferenced_parts,
    of_kind,
    qk_norm_slots,
    relative_bias_slots,
    shapes_text,
)
from handformer.check.core.windows import own_window, window_found, window_inputs, window_keep, window_note
from handformer.check.reference import variants as V
from handformer.nn.attention import scaled_dot_product_attention
from handformer.nn.masks import causal_mask
from handformer.nn.positions import RotaryEmbedding

Call = Callable[[Tensor, Tensor, Tensor, Tensor | None], Any]

@dataclass
class Caller:
    """A uniform (xq, xk, xv, mask) call into the learner's forward or function."""

    call: Call
    n_inputs: int  # 1: self-attention only; 3: query, key, value
    mask_name: str | None  # the name of its mask (or valid_lens) parameter, None if it takes none
    rope_table: bool  # it is handed Meta's freqs_cis (complex rotary table) by its caller
    state: dict[str, Any]  # "visible": the convention of an all-visible mask handed where none is given
    required: bool = False  # its mask has no default
    @property
    def takes_mask(self) -> bool:
        return self.mask_name is not None

    def mask(self, keep: Tensor | None, conv: str, batch: int) -> Tensor | None:
        """What it is handed as its mask: `keep` written in `conv`; None when it takes no mask."""
        return fp.encode_mask(keep, conv, batch) if self.takes_mask else None


def _switched(fn: Any) -> Any:
    """A free function called as its own file calls it (tiny-universe's attention(q, k, v,
    dropout_module=None, is_causal=False, mask=None)): a module it calls that defaults to None is
    nn.Identity() (dropout, off), and its causal switch is on exactly when it is given a mask."""
    defaults = forward_defaults(fn)
    modules = [n for n in re.findall(r"\b(\w+)\(", source_text(fn)) if defaults.get(n, 0) is None]
    switch = ("is_causal",) * (defaults.get("is_causal") is False)

    @functools.wraps(fn)  # its signature, for caller()
    def call(*args: Any, **kwargs: Any) -> Any:
        masked = kwargs.get("mask") is not None
        settings = {**dict.fromkeys(modules, nn.Identity()), **dict.fromkeys(switch, masked)}
        return fn(*args, **{**settings, **kwargs})
    return call


def caller(fn: Any, head_dim: int = D // H) -> Caller:
    """How to call the learner's attention: its inputs by position, its mask by name (None when
    there is no mask: d2l's `valid_lens` has no default), and the rotary table or positions a
    Llama-style forward(x, freqs_cis, mask) or forward(x, start_pos, ...) asks for."""
    fn, params = renamed_table(fn, forward_parameters(fn))  # Umar Jamil's freqs_complex: freqs_cis
    fn, params = renamed(fn, params, _alibi_handed(fn, params), "alibi")  # MPT's attn_bias: alibi
    extra = {"freqs_cis", "start_pos", "position_ids", "positions", "pos", "position_embeddings", "cos",
             "sin", "cos_sin", "freqs_cos", "freqs_sin", "alibi"}
    # nanochat's value embedding `ve`: None; its window_size: one over the whole sequence
    fixed = {**dict.fromkeys(optional_inputs(fn, params, extra)), **window_inputs(fn, params),
             **_residual_inputs(params), **_bias_inputs(params)}
    others = {*extra, *fixed, *(marks := global_names(params)), *handed_apart(fn)}  # Longformer's; pos_emb
    first_other = next((i for i, p in enumerate(params) if is_mask_param(p.name, fn) or p.name in others
                        or isinstance(p.default, (int, float, str)) or is_cache_argument(p)
                        or i > 0 and optional_extra(p)),
                       len(params))  # layer_idx=0, layer_past=None, CS336's token_positions=None: kept
    inputs = params[:first_other]  # the tensors before the mask or rotary table (minimind: x only)
    masks = _masks_taken(fn, params)
    named = {p.name for p in params} & extra
    n = min(len(inputs), 3)
    layout: dict[str, bool] = {}  # "batched": Hugging Face's (cos, sin) of (B, T, Dh), once known
    state: dict[str, Any] = {}
    required = bool(masks) and masks[0].default is masks[0].empty
    roles = _input_roles([p.name for p in inputs[:n]])

    def call(xq: Tensor, xk: Tensor, xv: Tensor, mask: Tensor | None) -> Any:
        args = [{"q": xq, "k": xk, "v": xv}[r] for r in roles]
        if mask is None and required and state.get("visible") and not state.get("none"):  # Raschka's
            everything = torch.ones(xq.size(0), 1, xq.size(-2), xk.size(-2), dtype=torch.bool)  # T, S
            mask = fp.mask_like(run_mask(everything, state["visible"], xq.size(0)), xq)
        kwargs: dict[str, Any] = {**fixed, **({masks[0].name: mask} if masks else {})}
        kwargs.update(state.get("more", {}))  # a key_padding_mask given alone, by _key_padding_alone
        B, T = xq.shape[:2]
        kwargs.update(position_kwargs(named - {"alibi"}, B, T, head_dim, xq.dtype))
        kwargs.update(global_inputs(marks, B, T, state.get("global")))
        kwargs.update({"alibi": alibi_argument(B, xq.size(-1) // head_dim, xk.size(1), xq.dtype)}
                      if "alibi" in named else {})  # BLOOM's model hands each attention its ALiBi term
        return _pairing_kept(_laid_out(fn, args, kwargs, layout, state), layout, state)

    return Caller(call, n, masks[0].name if masks else None, "freqs_cis" in named, state, required)


def _masks_taken(fn: Any, params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """Its mask parameters; one it may be handed and never reads is none it takes (a `pad_mask=None`
    left unused)."""
    return [p for p in params
            if is_mask_param(p.name, fn) and (p.default is p.empty or reads_local(fn, p.name))]


def _pairing_kept(out: Any, layout: dict[str, Any], state: dict[str, Any]) -> Any:
    """out, the pairing of a table handed as its angles (rope_tables.either_angles) kept in the caller's
    state, where rope_settings reads it."""
    state["angle_pairs"] = layout.get("angle_pairs")
    return out


def _residual_inputs(params: list[inspect.Parameter]) -> dict[str, Tensor]:
    """The stream a forward adds its output to (BLOOM's forward(x, residual, alibi, mask)): zero (a 0-dim
    tensor, of any shape and dtype), so that its output is the attention alone."""
    names = [p.name for p in params if p.name in RESIDUAL_NAMES and p.default is p.empty]
    return dict.fromkeys(names, torch.zeros(()))


def _bias_inputs(params: list[inspect.Parameter]) -> dict[str, Tensor]:
    """The score bias a forward must be handed by its caller (T5's forward(x, kv, position_bias, mask),
    the bias table held by the model): zero (a 0-dim tensor), so that the scores are its own alone."""
    required = [p.name for p in params if p.default is p.empty]
    return dict.fromkeys(filter(is_bias_argument, required), torch.zeros(()))


def is_bias_argument(name: str) -> bool:
    """A forward argument named for a bias its scores take from the caller (T5's `position_bias`, MPT's
    `attn_bias`, `rel_pos_bias`), as no weight of a layer's is: its name ends in bias."""
    return name.lower().endswith("bias")


def _alibi_handed(fn: Any, params: list[inspect.Parameter]) -> str | None:
    """The score bias its caller must hand (no default: MPT's forward(x, attn_bias)) where its source
    speaks of ALiBi: handed ALiBi's term as an `alibi` argument is; None otherwise."""
    source = source_text(type(fn) if isinstance(fn, nn.Module) else fn).lower()
    names = [p.name for p in params if is_bias_argument(p.name) and p.default is p.empty
             and ALIBI_WORDS.search(source)]
    return (names + [None])[0]


def _input_roles(names: list[str]) -> list[str]:
    """The query, key and value in the order the forward takes them: as their names say (the
    TensorFlow tutorial's forward(v, k, q, mask)), else q, k, v."""
    roles = [ROLES.get(n.lower(), "") for n in names]
    return roles if sorted(roles) == ["k", "q", "v"] else list("qkv")[:len(names)]


def _sequence_first(res: ComponentResult, ctx: Context, c: Caller) -> None:
    """Whether the attention reads its inputs (T, B, D) (PyTorch's tutorial: nn.MultiheadAttention's
    batch_first=False), from what it does (`reads_sequence_first`); then it is driven so
    (c.state["first"]), its masks also as nn.MultiheadAttention's attn_mask (B * H, T, S) first, and
    the report says so."""
    convs = ("torch", "torch3", "torch2") + SEQUENCE_FIRST_CONVENTIONS + ctx.conventions(c.mask_name)
    c.state["first"] = reads_sequence_first_masked(ctx, lambda x: c.call(x, x, x, None),
                                                   lambda conv: c.state.update(visible=conv),
                                                   (None, *convs * c.required))
    res.notes += [SEQUENCE_FIRST] * c.state["first"]


def _laid_out(fn: Any, args: list[Tensor], kwargs: dict[str, Any], layout: dict[str, bool],
              state: dict[str, Any]) -> Any:
    """fn on the inputs (B, T, D) in the layout it takes: (T, B, D) in and out (PyTorch's tutorial,
    batch_first=False: state "first"), one sequence (T, D) at a time (Raschka's SelfAttention_v1,
    queries @ keys.T: state "one", its outputs stacked), else as they are."""
    B = args[0].size(0)
    if state.get("first"):
        return batch_first(with_positions(fn, [a.transpose(0, 1) for a in args], kwargs, layout, B))
    if state.get("one"):
        outs = [with_positions(fn, [a[b] for a in args], kwargs, layout, 1) for b in range(B)]
        return tuple(map(torch.stack, zip(*outs))) if isinstance(outs[0], tuple) else torch.stack(outs)
    return with_positions(fn, args, kwargs, layout, B)


def _one_sequence(res: ComponentResult, c: Caller, x: Tensor) -> None:
    """Whether the attention serves one sequence (T, D) at a time and no batch (B, T, D): Raschka's
    SelfAttention_v1 and v2, `queries @ keys.T`; then it is driven one sequence at a time
    (c.state["one"]) and the report says so. An attention that takes a mask is never driven so."""
    if c.takes_mask or fp.quietly(lambda: c.call(x, x, x, None)) is not None:
        return
    c.state["one"] = True
    out = fp.first_tensor(fp.quietly(lambda: c.call(x, x, x, None)), 3)
    c.state["one"] = out is not None and out.shape[:2] == x.shape[:2]
    res.notes += [ONE_SEQUENCE] * c.state["one"]


ONE_SEQUENCE = text("it takes one sequence (T, D) at a time, no batch (Raschka's SelfAttention_v1 and v2, "
                    "queries @ keys.T): driven one sequence at a time, each output stacked",
                    "它一次只接收一个序列 (T, D)，不接收 batch（Raschka 的 SelfAttention_v1 和 v2，"
                    "queries @ keys.T）：逐个序列运行，再把输出叠起来")


def run_mask(keep: Tensor | None, conv: str, batch: int) -> Tensor | None:
    return fp.encode_mask(keep, conv, batch)  # None for no mask


Compute = Callable[[frozenset[str], str], Tensor]
RowsOf = Callable[[frozenset[str], str], Tensor | None]


def detect(run: Callable[[str], Tensor | None], compute: Compute, universe: tuple[str, ...],
           rows: RowsOf, conventions: tuple[str, ...], most_flags: int = 2,
           ) -> tuple[str | None, tuple[frozenset[str], float] | None, fp.LearnerFailure | None]:
    """The mask convention that explains the learner's output with the fewest mistakes (at most
    `most_flags`), and those mistakes. compute and rows take the convention too (a key padding mask
    cannot carry the causal part, so such conventions are searched with a padding mask). Returns
    (convention, (flags, error) or None, the first learner failure)."""
    outputs, failure = outputs_by_convention(run, conventions)
    universe = responsive(outputs, universe)

    def search_one(conv: str, least: int, most: int) -> tuple[frozenset[str], float] | None:
        return fp.search(outputs[conv], lambda fl: compute(fl, conv), universe, lambda fl: rows(fl, conv),
                         min(most, most_flags), least)
    found = fp.search_settings(list(outputs), search_one, fewest=True)
    if found:
        return found[0], found[1:], failure
    return (next(iter(outputs), None), None, failure)


def by_convention(probe: Probe, subject: Subject, out: Tensor | None, x: Any) -> Found:
    """The search of a kind run under each mask convention (`subject.run(conv)`, its readings one a
    convention, `facts["rows"]` the rows each set of mistakes leaves visible): `detect`. The key is
    None when no convention gives an output (the first failure kept as `facts["failure"]`)."""
    weights = dict(subject.readings)

    def compute(flags: frozenset[str], conv: str) -> Tensor:
        return probe.reference(weights[conv], x, flags)

    conv, found, subject.facts["failure"] = detect(subject.run, compute, probe.universe(subject),
                                                   subject.facts["rows"], tuple(weights))
    flags, err = found or (frozenset(), None)
    return Found(conv, weights.get(conv), flags, err, subject.run(conv) if found else None, x,
                 lambda fl: compute(fl, conv))


def convention_found(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                     *kinds: str) -> None:
    """The convention found (a failure when none gives an output), the mistakes named with how far
    the output is from correct on the rows they leave visible, NaN on rows hidden."""
    if found.key is None:
        raise subject.facts["failure"] or ctx.learner.fail("forward", *subject.facts["no_output"])
    if subject.facts["takes_mask"]:  # the convention it is read in
        res.convention = fp.describe_convention(found.key)
    rows = subject.facts["rows"](found.flags, found.key)
    if found.named:
        off = fp.max_error(found.out, found.reference(frozenset()), rows)
        res.findings += ctx.findings(found.flags, found.matched, off, comp, *kinds)
    if found.matched is not None:
        nan_on_hidden_rows(res, found.out, rows, comp, ctx)


def responsive(outputs: dict[str, Tensor], universe: tuple[str, ...]) -> tuple[str, ...]:
    """The mistakes to search for, given the outputs under each mask convention: when they differ,
    the code reads its mask (in one of the conventions at least), so it is not a mask never applied
    (under a convention its comparisons never fire, e.g. `mask == 1` on an additive mask, it would
    look like one)."""
    distinct = []
    for out in outputs.values():
        if not any(out.shape == seen.shape and torch.equal(out, seen) for seen in distinct):
            distinct.append(out)
    return tuple(f for f in universe if f != "mask_not_applied") if len(distinct) > 1 else universe


def keeps_for(keep: Tensor | None, fallback: Tensor | None, conventions: tuple[str, ...],
              ) -> dict[str, Tensor | None]:
    """The mask each convention is searched with: `keep`, or `fallback` (padding only) where the
    convention cannot write `keep`; a convention of one (T, S) mask for the whole batch (SHARED), the
    causal mask alone where it cannot write `keep`."""
    shared = {c: _causal_like(keep) for c in SHARED if c in conventions}
    return {c: keep if fp.encodable(keep, c) else shared.get(c, fallback) for c in conventions}


def _causal_like(keep: Tensor | None) -> Tensor | None:
    """The causal mask in keep's shape (B, 1, T, S), its queries the last T positions."""
    if keep is None:
        return None
    T, S = keep.shape[-2:]
    return torch.ones(T, S, dtype=torch.bool).tril(S - T)[None, None].expand_as(keep)


# --- scaled dot-product attention and masked softmax -------------------------------------------

def _sdpa_callable(comp: Component, ctx: Context) -> Any:
    """The learner's attention as check calls it: their class built (in float64, eval mode), or
    their function called as its own file calls it."""
    if not isinstance(comp.obj, type):
        return _switched(comp.obj)
    kwargs = {**_dropout_kwargs(comp.obj), **_temperature(comp.obj)}
    if _sized(comp.obj):  # ChatGLM's CoreAttention(config): built at the inputs' heads and width
        _, heads, _, _, Dh = SDPA_SIZES
        return _unweighted(comp, ctx.build(comp, {"d_model": heads * Dh, "n_heads": heads, "d_head": Dh,
                                                  "dropout": 0.0}))
    fn = ctx.learner.call("__init__", lambda: comp.obj(**kwargs))
    return _unweighted(comp, fn.double().eval() if isinstance(fn, nn.Module) else fn)


def _unweighted(comp: Component, fn: Any) -> Any:
    """The attention found as one handed q, k, v already projected (discovery's core_attention), as
    built; one that holds weights after all (its projections built by a helper) is no such attention:
    NOT CHECKED, never compared without its weights."""
    if next(iter(getattr(fn, "parameters", list)()), None) is not None and core_attention(comp.obj):
        raise Weighted
    return fn


class Weighted(Exception):
    """An attention found as one handed q, k, v already projected holds weights: a multi-head attention."""




def _sized(cls: type) -> bool:
    """Whether a class's constructor requires more than a dropout rate or a temperature (a config, its
    sizes): then it is built as check builds a layer."""
    if not isinstance(cls, type):  # a function: called as it is
        return False
    kwargs = {**_dropout_kwargs(cls), **_temperature(cls)}
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and p.name not in (*kwargs, "self") for p in forward_parameters(cls.__init__))


def _build_sdpa(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's attention function run under each mask convention (causal + padding where the
    convention can write it), in the layout it takes."""
    fn = _sdpa_callable(comp, ctx)
    c = caller(fn)
    convs = _conventions(ctx, fn, c)
    B, _, T, S, Dh = SDPA_SIZES
    q, k, v = fp.randn(B, H, T, Dh, seed=1), fp.randn(B, H, S, Dh, seed=2), fp.randn(B, H, S, Dh, seed=3)
    keeps = keeps_for(causal(T) & positions(B, S, [0, 2]), positions(B, S, [0, 2]), convs)
    layout = _layout(ctx, c, convs, keeps)

    def run(conv: str) -> Tensor | None:
        return layout.run(ctx, c, q, k, v, keeps[conv], conv)  # dropped where it takes no mask

    def rows(flags: frozenset[str], conv: str) -> Tensor | None:
        return fp.visible_rows(V.applied_keep(keeps[conv], flags, H), B, T)  # inverted: other rows hidden

    # a mask it requires (picoGPT's attention(q, k, v, mask) adds it): all visible where none is meant
    c.state["visible"] = working = first_working(ctx, run, convs)
    inside = not c.takes_mask and _causal_core(ctx, c, layout, working)
    keeps.update(dict.fromkeys(convs, causal(T).expand(B, 1, T, S)) if inside else {})  # its own mask
    facts = {"rows": rows, "layout": layout, "working": working, "takes_mask": c.takes_mask, "inside": inside,
             "no_output": (f"{comp.name} returned no (B, H, T, Dh) tensor",
                           f"{comp.name} 没有返回形状为 (B, H, T, Dh) 的张量")}
    return Subject(run, [(conv, (q, k, v, keeps[conv])) for conv in convs], c, facts)


SDPA = Probe(
    build=_build_sdpa,                      # the function (or module), its layout, a mask per convention
    inputs=lambda s: s.facts["working"],    # the first convention it runs with
    shape=lambda ctx, comp, s, x, out: None,  # a (B, H, T, Dh) output: the search reads only those
    reference=lambda w, conv, flags: V.attention(*w, flags)[0],
    universe=lambda s: ATTENTION_FLAGS,
    steps=(lambda res, ctx, comp, s, found: convention_found(res, ctx, comp, s, found, "mha"),
           lambda res, ctx, comp, s, found: _compare_sdpa(res, ctx, comp, s.module, s.facts["layout"],
                                                          found.key, SDPA_SIZES[4], s.facts["inside"]),
           lambda res, ctx, comp, s, found: _sdpa_departure(res, ctx, comp, s, found.key)),
    search=by_convention,
)


def check_sdpa(comp: Component, ctx: Context) -> ComponentResult:
    """Scaled dot-product attention, as the SDPA probe states it; an attention found as one handed q, k, v
    already projected that holds weights after all (its projections built by a helper of the file's),
    checked as the multi-head attention it is."""
    try:
        return run_probe(SDPA, comp, ctx)
    except Weighted:
        return check_mha(dataclasses.replace(comp, kind="mha"), ctx)


def _sdpa_departure(res: ComponentResult, ctx: Context, comp: Component, s: Subject, conv: str) -> None:
    """A FAIL no catalogued mistake explains: where the attention of 2 heads (3 queries, 5 keys, the
    last hidden, 4 dims: every size apart; one head where the function takes one at a time; 5 queries
    where it is causal inside) first parts from the reference, in the layout the function takes."""
    inside = s.facts["inside"]  # causal inside, handed no mask: 5 queries, its own causal mask
    keep, handed = departure_masks(inside)
    if res.max_abs_error < 1e-5 or not (inside or s.module.takes_mask and fp.encodable(keep, conv)):
        return
    heads = 1 if s.facts["layout"].single else 2
    # a class built at check's sizes (from a config): the heads and width it was built for
    heads, dh = (SDPA_SIZES[1], SDPA_SIZES[4]) if _sized(comp.obj) else (heads, 4)
    q, k, v = (fp.randn(1, heads, n, dh, seed=seed) for n, seed in ((keep.size(2), 7), (5, 8), (5, 9)))
    note_departure(res, lambda: localize_sdpa(
        lambda *qkv: s.facts["layout"].raw(ctx, s.module, *qkv, handed, conv), comp.obj, q, k, v, keep))


def departure_masks(inside: bool) -> tuple[Tensor, Tensor | None]:
    """(the mask the reference applies, the one handed) by whether the attention is causal inside: 3
    queries and 5 keys, the last hidden; 5 queries and 5 keys, causal, none handed. Built when asked,
    not at import: the fork server computes nothing before it forks (zygote.py)."""
    if inside:
        return torch.ones(5, 5, dtype=torch.bool).tril()[None, None], None  # (1, 1, T, S)
    last_hidden = torch.arange(5).lt(4).expand(1, 1, 3, 5)  # (1, 1, T, S)
    return last_hidden, last_hidden


def _sdpa_cases() -> list[tuple[str, int, int, int, Tensor | None]]:
    """(label, B, T, S, the mask)."""
    return [("no mask", 2, 5, 5, None), ("padding", 3, 5, 7, positions(3, 7, [0, 2, 7])),
            ("causal + padding", 2, 7, 7, causal(7) & positions(2, 7, [0, 2])),
            ("cross, T != S", 2, 3, 5, positions(2, 5, [0, 1]))]


def case_errors(raw: Any, out: Tensor | None, ref: Tensor, ref_w: Tensor, rows: Tensor | None) -> list[float]:
    """One case's errors against handformer's: the output's on the rows compared, and the attention
    weights' when the learner's call returns them (in the reference's shape)."""
    errors = [fp.max_error(out, ref, rows)]
    weights = fp.weights_of(raw)
    if weights is not None and weights.shape == ref_w.shape:
        errors.append(fp.max_error(weights, ref_w, rows))
    return errors


def _causal_core(ctx: Context, c: Caller, layout: Layout, conv: str) -> bool:
    """Whether an attention handed no mask hides the future all the same (ChatGLM's CoreAttention
    builds its causal mask from the query length): the last key and value moved move the last output,
    not the first (an own mask off by one too: then compared with the causal reference, and failed)."""
    q, k, v = (fp.randn(1, H, 5, SDPA_SIZES[4], seed=seed) for seed in (7, 8, 9))
    moved = [torch.cat([t[:, :, :-1], t[:, :, -1:] + 1.0], 2) for t in (k, v)]  # (1, H, S, Dh)
    a, b = (fp.quietly(lambda kv=kv: layout.output(layout.raw(ctx, c, q, *kv, None, conv), q.shape))
            for kv in ((k, v), moved))  # (B, H, T, Dh)
    same = getattr(a, "shape", None) == getattr(b, "shape", ())
    return same and _last_moved(a, b)


def _last_moved(a: Tensor, b: Tensor) -> bool:
    """Whether two (B, H, T, Dh) outputs differ at the last query and not at the first."""
    return torch.allclose(a[:, :, 0], b[:, :, 0], atol=1e-9) and not torch.allclose(a[:, :, -1], b[:, :, -1])


def _compare_sdpa(res: ComponentResult, ctx: Context, comp: Component, c: Caller, layout: Layout, conv: str,
                  Dh: int, inside: bool = False) -> None:
    """The output and the returned weights against handformer's on the cases the convention can write;
    one causal inside (`inside`, handed no mask) against the causal reference."""
    errors, square = [], []
    for label, b, t, s, mask in _sdpa_cases():
        mask = mask if c.takes_mask else None
        if not fp.encodable(mask, conv):
            continue

        def run(t: int, s: int, b: int = b, mask: Tensor | None = mask) -> list[float]:
            qc, kc, vc = (fp.randn(b, H, t, Dh, seed=4), fp.randn(b, H, s, Dh, seed=5),
                          fp.randn(b, H, s, Dh, seed=6))
            raw = layout.raw(ctx, c, qc, kc, vc, mask, conv)
            mask = torch.ones(t, s, dtype=torch.bool).tril(s - t) if inside else mask  # its own, (T, S)
            ref, ref_w = scaled_dot_product_attention(qc, kc, vc, mask, need_weights=True)
            rows = fp.visible_rows(mask, b, t)
            out = layout.output(raw, qc.shape)
            masked_rows(res, out, rows, comp, ctx)
            return case_errors(raw, out, ref, ref_w, rows)
        errors += in_a_form_taken(run, t, s, square, label)  # a square-only core: T = S
    square_note(res, square)
    res.max_abs_error = max(errors)
    n = len(errors)
    res.checks.append(Check(text(f"matches handformer's scaled_dot_product_attention on {n} cases",
                                 f"在 {n} 组输入上与 handformer 的 scaled_dot_product_attention 一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))


@dataclass
class Layout:
    """How the learner's attention function takes its inputs: (B, H, T, Dh) tensors, d2l's
    (B * H, T, Dh) with the mask (or valid lengths) repeated for each head, or one head of one
    sequence at a time (picoGPT's attention(q, k, v, mask): (T, Dh) tensors and a (T, S) mask, called
    for each row and head, its mask all visible where none is meant)."""

    flat: bool
    single: bool = False
    order: tuple[int, ...] = (0, 1, 2, 3)  # (0, 2, 1, 3): Flax's (B, T, H, Dh), einsum("bqhd,bkhd->bhqk")
    # (2, 0, 1, 3): ChatGLM's CoreAttention, (T, B, H, Dh) in and the heads merged out, (T, B, H * Dh)

    def raw(self, ctx: Context, c: Caller, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None,
            conv: str) -> Any:
        B, heads = q.shape[:2]
        if keep is None and c.required and c.state.get("visible") and not c.state.get("none"):
            # a mask it requires, every key visible: written here, where the layout's sizes are known
            keep, conv = torch.ones(B, 1, q.size(2), k.size(2), dtype=torch.bool), c.state["visible"]
        q, k, v = q.permute(self.order), k.permute(self.order), v.permute(self.order)
        if self.single:
            return self._one_by_one(ctx, c, q, k, v, keep, conv)
        if self.flat:
            q, k, v = (t.reshape(B * heads, *t.shape[2:]) for t in (q, k, v))  # (B * H, T, Dh)
            if keep is not None:
                keep = keep.expand(B, heads, *keep.shape[2:]).reshape(B * heads, 1, *keep.shape[2:])
        mask = c.mask(keep, conv, q.size(0) if self.flat else B)
        return ctx.learner.call("forward", c.call, q, k, v, mask)

    def _one_by_one(self, ctx: Context, c: Caller, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None,
                    conv: str) -> Tensor | None:
        B, heads = q.shape[:2]
        everything = torch.ones(1, 1, q.size(2), k.size(2), dtype=torch.bool)
        keep = given(keep, everything)  # all visible where no mask is meant
        masks = [c.mask(keep[b % keep.size(0)][None], conv, 1) for b in range(B)]  # a row's, in its rank
        masks = [m if m is None else m.reshape(-1, m.size(-1)) for m in masks]  # (T|1, S)
        outs = [fp.first_tensor(ctx.learner.call("forward", c.call, q[b, h], k[b, h], v[b, h], masks[b]), 2)
                for b, h in itertools.product(range(B), range(heads))]
        shapes = {getattr(o, "shape", None) for o in outs} - {outs[0].shape}
        return None if shapes else torch.stack(outs).reshape(B, heads, *outs[0].shape)  # (B, H, T, Dh)

    def output(self, raw: Any, shape: torch.Size) -> Tensor | None:
        # the heads merged (ChatGLM's (T, B, H * Dh)), returned first (before the weights, (B, H, T, S))
        merged = None if self.flat else self._split(fp.first_tensor(raw), shape)
        out = fp.first_tensor(raw, 3 if self.flat else 4)
        back = torch.tensor(self.order).argsort().tolist()  # the inverse permutation
        out = out if out is None or self.flat else out.permute(back)  # (B, H, T, Dh)
        if self.flat and out is not None and out.numel() == math.prod(shape):
            return out.reshape(shape)  # (B, H, T, Dh)
        return given(merged, out)

    def _split(self, merged: Tensor | None, shape: torch.Size) -> Tensor | None:
        """An output with its heads merged, (B, T, H * Dh), or (T, B, H * Dh) for inputs sequence-first
        (ChatGLM's), as (B, H, T, Dh); None for any other."""
        outer = sorted((0, 2), key=self.order.index)  # the batch and query axes, in the inputs' order
        want = (shape[outer[0]], shape[outer[1]], shape[1] * shape[3])
        if tuple(getattr(merged, "shape", ())) != want:
            return None
        split = merged.reshape(*want[:2], shape[1], shape[3])  # (.., .., H, Dh)
        return split.permute(torch.tensor([*outer, 1, 3]).argsort().tolist())  # (B, H, T, Dh)

    def run(self, ctx: Context, c: Caller, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None,
            conv: str) -> Tensor | None:
        return self.output(self.raw(ctx, c, q, k, v, keep, conv), q.shape)


def _layout(ctx: Context, c: Caller, convs: tuple[str, ...], keeps: dict[str, Tensor | None]) -> Layout:
    """The first layout the learner's function computes attention in: (B, H, T, Dh), d2l's
    (B * H, T, Dh), one head of one sequence at a time, or Flax's (B, T, H, Dh); else the first it runs
    on and returns a tensor from (its mistake then shows in the comparison). A function that takes a
    batch of heads, (B, H, T, Dh) in and out, is not read one head at a time: on a (T, Dh) head the
    last axis is axis 1, so a size read from the wrong axis (`query.size(1)`) would hide there."""
    B, _, T, _, Dh = SDPA_SIZES
    q = fp.randn(B, H, T, Dh, seed=0)
    runs = []
    for layout in LAYOUTS:
        for conv in convs:
            try:
                out = layout.run(ctx, c, q, q, q, keeps[conv], conv)
            except fp.LearnerFailure:
                continue
            if _attends(out, q, keeps[conv]) and not (layout.single and LAYOUTS[0] in runs):
                return layout
            if isinstance(out, Tensor) and (out.shape == q.shape or layout.flat):
                runs.append(layout)
    return (runs + [Layout(False)])[0]


LAYOUTS = (Layout(False), Layout(True), Layout(False, single=True), Layout(False, order=(0, 2, 1, 3)),
           Layout(False, order=(2, 0, 1, 3)))


def _attends(out: Tensor | None, q: Tensor, keep: Tensor | None) -> bool:
    """Whether `out` is self-attention of q (B, H, T, Dh) under `keep`, on the rows that see a key."""
    ref = scaled_dot_product_attention(q, q, q, keep)[0]
    rows = fp.visible_rows(keep, q.size(0), q.size(2))
    return isinstance(out, Tensor) and out.shape == q.shape and fp.max_error(out, ref, rows) < 1e-6


SOFTMAX_SIZES = (3, 5, 6)  # B, T, S of the scores


def _build_masked_softmax(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """d2l's masked_softmax(X, valid_lens): softmax over the last axis of X (B, T, S), keys at or
    past each row's valid length masked (-1e6); run under each mask convention (causal + padding
    where the convention can write it)."""
    params = forward_parameters(comp.obj)
    mask_name = next((p.name for p in params if is_mask_name(p.name)),
                     params[-1].name if len(params) > 1 else None)
    convs = ctx.conventions(mask_name)
    B, T, S = SOFTMAX_SIZES
    scores = fp.randn(B, T, S, seed=1) * 2
    keeps = keeps_for(causal_mask(T, S) & positions(B, S, [0, 2, 1]), positions(B, S, [0, 2, 1]), convs)

    def run(conv: str, keep: Tensor | None = None) -> Tensor | None:
        mask = run_mask(keeps[conv] if keep is None else keep, conv, B)
        return fp.first_tensor(ctx.learner.call("forward", comp.obj, scores.clone(), mask), 3)

    def rows(flags: frozenset[str], conv: str) -> Tensor | None:
        return fp.visible_rows(V.applied_keep(keeps[conv], flags), B, T)

    no_output = (f"{comp.name} returned no (B, T, S) tensor for scores of shape {(B, T, S)}",
                 f"对形状为 {(B, T, S)} 的分数，{comp.name} 没有返回形状为 (B, T, S) 的张量")
    facts = {"rows": rows, "scores": scores, "working": first_working(ctx, run, convs), "takes_mask": True,
             "no_output": no_output}
    return Subject(run, [(conv, (scores, keeps[conv])) for conv in convs], comp.obj, facts)


def _softmax_departure(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                       ) -> None:
    """The step that, on a FAIL, notes where the learner's softmax first parts from the reference
    (on a padding mask, in the convention found)."""
    if res.max_abs_error >= 1e-5:
        B, _, S = SOFTMAX_SIZES
        keep = positions(B, S, [1, 3, 2])  # (B, 1, 1, S)
        scores, conv = subject.facts["scores"], found.key
        note_departure(res, lambda: localize_masked_softmax(
            lambda x: comp.obj(x, run_mask(keep, conv, B)), comp.obj, scores, keep[:, 0]))


MASKED_SOFTMAX = Probe(
    build=_build_masked_softmax,
    inputs=lambda s: s.facts["working"],
    shape=lambda ctx, comp, s, x, out: None,
    reference=lambda w, conv, flags: V.masked_softmax(w[0][:, None], w[1], flags)[:, 0],
    universe=lambda s: ("softmax_wrong_dim:-2", "mask_inverted", "mask_after_softmax:zero",
                        "mask_after_softmax:neg", "mask_not_applied"),
    steps=(convention_found,
           lambda res, ctx, comp, s, found: _compare_masked_softmax(res, ctx, comp, s.run, s.facts["scores"],
                                                                    found.key),
           _softmax_departure),
    search=by_convention, deterministic=False,
)


def check_masked_softmax(comp: Component, ctx: Context) -> ComponentResult:
    """d2l's masked softmax, as the MASKED_SOFTMAX probe states it."""
    return run_probe(MASKED_SOFTMAX, comp, ctx)


def _compare_masked_softmax(res: ComponentResult, ctx: Context, comp: Component,
                            run: Callable[..., Tensor | None], scores: Tensor, conv: str) -> None:
    """The largest difference from the softmax over the visible keys, on 3 masks (None included)."""
    B, T, S = scores.shape
    errors = []
    for keep in (positions(B, S, [0, 6, 3]), causal_mask(T, S) & positions(B, S, [1, 0, 2]), None):
        if not fp.encodable(keep, conv):
            continue
        out = run(conv, keep) if keep is not None else fp.first_tensor(
            ctx.learner.call("forward", comp.obj, scores.clone(), None), 3)
        ref = torch.softmax(scores if keep is None else scores.masked_fill(~keep[:, 0], -1e6), dim=-1)
        errors.append(fp.max_error(out, ref, fp.visible_rows(keep, B, T)))
    res.max_abs_error = max(errors)
    n = len(errors)
    res.checks.append(Check(text(f"equals the softmax over the visible keys on {n} masks (None included)",
                                 f"在 {n} 组掩码上（含 None）与只对可见键做的 softmax 一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))


def _temperature(cls: type) -> dict[str, float]:
    """jadore801120's ScaledDotProductAttention(temperature): the scale its caller gives, sqrt(Dh)."""
    params = forward_parameters(cls.__init__)
    width = SDPA_SIZES[4] ** 0.5  # the inputs' head width
    return {p.name: width for p in params if p.name.lower() == "temperature" and p.default is p.empty}


def _dropout_kwargs(cls: type) -> dict[str, float]:
    params = forward_parameters(cls.__init__)
    return {p.name: 0.1 for p in params if "drop" in p.name.lower() and p.default is p.empty}


# --- multi-head attention -----------------------------------------------------------------------


# the rotary layout of a table handed as its angles (T, Dh), by its pairing (rope_tables.either_angles):
# halves (torch.cat([freqs, freqs])) or pairs; Meta's complex table's pairs where none was
ANGLE_LAYOUTS = {False: "half", True: "interleaved"}


def rope_settings(comp: Component, c: Caller, module: nn.Module) -> tuple[str | None, ...]:
    """Where the learner's attention may apply rotary positions: given Meta's freqs_cis, pairs are
    interleaved; otherwise, if its source or that of a class it holds (torchtune's pos_embeddings, a
    RotaryPositionalEmbeddings handed in) speaks of rotary positions, either layout (or none)."""
    if c.rope_table:  # the table's angles handed (lucidrains'): rotated in the pairing they run in
        return (ANGLE_LAYOUTS.get(c.state.get("angle_pairs"), "interleaved"),)
    held = {type(sub) for sub in module.modules() if type(sub).__module__ == comp.obj.__module__}
    source = "".join(map(source_text, [comp.obj, *held])).lower()
    if re.search(r"def forward\([^)]*\bcos_sin\b", source):  # nanochat's: rotated either way
        return ("half", "swapped")
    if re.search(r"def forward\([^)]*\bfreqs_cos\b", source):  # llama2.c's: one angle a pair
        return ("interleaved", "half")
    tables = re.search(r"def forward\([^)]*\bcos\b[^)]*\bsin\b", source)  # Raschka's (x, mask, cos, sin)
    spoken = tables or ROPE_WORDS.search(source)
    return (None, "half", "interleaved", *partial_layouts(D // H)) if spoken else (None,)


# the forward arguments that take a positional term for the scores from the attention's caller (T5's
# position_bias, handed down from the layer that holds the table), even where they default to None;
# any other required one named for a bias is one too (`_bias_inputs`)
BIAS_ARGUMENTS = ("position_bias", "pos_bias", "rel_pos_bias", "relative_position_bias", "attn_bias",
                  "attention_bias")


def score_biases(comp: Component, slots: list[Slot]) -> tuple[str | None, ...]:
    """The positional terms the learner's scores may take, by what the attention holds and is handed:
    T5's learned relative-position bias where it holds the table (a bidirectional encoder's, or a
    decoder's), ALiBi's where its source speaks of ALiBi or its forward takes `alibi`, and unscaled
    scores (T5's, the bias left to its caller) or scaled ones where its forward takes a bias it is not
    handed as ALiBi's; none
    otherwise. A table or ALiBi is searched in place of no positions (an attention that builds ALiBi
    and adds none is not read as a plain one)."""
    source = code_text(comp.obj).lower()  # (a comment that speaks of ALiBi adds no term)
    table = ("t5", "t5_causal") * any(s.role == RELATIVE_ROLE for s in slots)
    takes = inspect.signature(getattr(comp.obj, "forward", comp.obj)).parameters  # (a class: its forward's)
    handed = _alibi_handed(comp.obj, list(takes.values()))  # a bias it must be handed, ALiBi's
    alibi = ("alibi",) * bool(ALIBI_WORDS.search(source) or handed)
    given = (set(takes) & set(BIAS_ARGUMENTS) | set(_bias_inputs(list(takes.values())))) - {handed}
    return table + alibi + (None, "unscaled") * (bool(given) > bool(table))


def positions_inside(comp: Component, c: Caller, slots: list[Slot], module: nn.Module,
                     ) -> tuple[str | None, ...]:
    """The readings of the positions inside the attention the search tries: its score biases (`None`
    among them: none), else none, then the rotary layouts its source allows."""
    biases = score_biases(comp, slots)
    return (biases or (None,)) + tuple(r for r in rope_settings(comp, c, module) if r is not None)


def softcaps(module: nn.Module, named: str = "") -> tuple[float, ...]:
    """The soft caps its scores may take (Gemma 2's c * tanh(scores / c)): where its forward calls
    tanh (or a function of its file that it calls does), each number of 1 or more that it reads by name
    from itself or a config it holds
    (`self.cfg.attn_logit_softcapping`); with `named`, those whose name holds it ("cap")."""
    forward = type(module).forward
    words = set(re.findall(r"\w+", source_text(forward)))
    # its tanh written in a helper of its file it calls (Gemma's `soft_cap(scores, self.softcap)`) too
    tanh = "tanh" in "".join(map(source_text, [forward, *functions_called(forward)]))
    held = dict(vars(module))
    for value in vars(module).values():  # a config dataclass, namespace or dict: its fields too
        held.update(getattr(value, "__dict__", value if isinstance(value, dict) else {}))
    return tuple(sorted({float(v) for name, v in held.items()
                         if tanh and name in words and named in name.lower()
                         and is_number(v) and v >= 1}))


def attention_cap(model: nn.Module) -> float | None:
    """The soft cap of the attention scores (Gemma 2's c * tanh(scores / c)) inside a block or a model,
    read from the learner's modules as the attention's own check reads it (`softcaps`), a setting named
    for a cap (`attn_logit_softcapping`, not the head count): the one cap they name, else None."""
    caps = {cap for sub in model.modules() if sub is not model for cap in softcaps(sub, named="cap")}
    return next(iter(caps)) if len(caps) == 1 else None


def behaves_causal(ctx: Context, c: Caller, width: int) -> bool:
    """Whether the learner's self-attention, given no mask, is causal: what it does, not its name or
    its parameters (minimind's takes an attention_mask and applies is_causal=True without one)."""
    x = fp.randn(1, 5, width, seed=7)
    bumped = x.clone()
    bumped[:, 3] += 1.0
    return _causal_given(ctx, c, x, bumped, None)


def causal_with_keys_kept(ctx: Context, c: Caller, width: int) -> bool:
    """Whether an attention that requires its mask is causal when handed a padding mask that hides
    no key, ones (B, S), as float then as bool: a keys-only mask its caller hands (a reward model's
    forward(x, attention_mask), its causal mask built inside), not the causal mask itself."""
    x = fp.randn(1, 5, width, seed=7)
    bumped = x.clone()
    bumped[:, 3] += 1.0
    return any(_causal_given(ctx, c, x, bumped, torch.ones(1, 5, dtype=dtype))
               for dtype in (x.dtype, torch.bool))


def _causal_given(ctx: Context, c: Caller, x: Tensor, bumped: Tensor, mask: Tensor | None) -> bool:
    try:
        a, b = (fp.first_tensor(ctx.learner.call("forward", c.call, v, v, v, mask), 3) for v in (x, bumped))
    except fp.LearnerFailure:
        return False
    return causal_outputs(a, b)


def causal_outputs(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether two (B, T, D) outputs of inputs that differ at token 3 alone are a causal one's: the
    same at tokens 0..2, moved after."""
    return (a is not None and b is not None and a.shape == b.shape
            and torch.allclose(a[:, :3], b[:, :3], atol=1e-9) and not torch.allclose(a[:, 3:], b[:, 3:]))


def check_mha(comp: Component, ctx: Context, causal_inside: bool = False, n_kv_heads: int | None = None,
              heads: int = H) -> ComponentResult:
    """Multi-head attention (grouped-query with n_kv_heads; causal_inside: one that builds its own
    causal mask), as the MHA probe states it."""
    res = ctx.result(comp)
    n_kv_heads = n_kv_heads and ctx.kv_heads(n_kv_heads, heads)
    n_kv_heads = None if n_kv_heads == heads else n_kv_heads  # ungrouped: read as multi-head attention
    sizes = {**ctx_sizes(), "causal": causal_inside, **({"n_kv_heads": n_kv_heads} if n_kv_heads else {})}
    built = _build_mha(res, ctx, comp, sizes, n_kv_heads, heads)
    if isinstance(built, ComponentResult):
        return built
    drive(MHA, res, ctx, comp, built)
    guarded(res, lambda: _tutorial_shapes_at_their_sizes(res, ctx, comp, built.facts["probe"].c, sizes))
    if global_names(forward_parameters(built.module)):
        guarded(res, lambda: _global_window(res, ctx, comp, built, heads))
    if built.facts["setup"].conv.startswith("torch"):
        _nan_as_torch(res)
    return finish(res)


def _global_window(res: ComponentResult, ctx: Context, comp: Component, built: Subject, heads: int) -> None:
    """Longformer's window and global tokens (global_window.py), once it is graded as a full attention."""
    c, facts = built.facts["probe"].c, built.facts

    def run(x: Tensor, marked: Tensor) -> Tensor | None:
        c.state["global"] = marked
        try:
            return fp.first_tensor(ctx.learner.call("forward", c.call, x, x, x, None), 3)
        finally:
            c.state.pop("global")
    weights = mha_weights(facts["slots"], heads, facts["n_kv_heads"], None)
    check_global(res, run, lambda x, keep: V.multi_head_attention(weights, x, x, x, keep)[0], D,
                 source_lines(ctx.objects(comp)))


def _build_mha(res: ComponentResult, ctx: Context, comp: Component, sizes: dict[str, Any],
               n_kv_heads: int | None, heads: int) -> Subject | ComponentResult:
    """The learner's attention built, its projections mapped, run under each mask convention; the
    check with one head instead (a result) when it has one, or the result so far when it refuses a
    causal input longer than it was built for."""
    x = fp.randn(2, 6, D, seed=1)
    module = ctx.build(comp, sizes, warmup=lambda m: caller(m).call(x.float(), x.float(), x.float(), None))
    if (parts := sublayer_parts(module, computes_attention, D)) is not None:  # T5's layer, BERT's wrapper
        return grade_sublayer(res, comp, module, parts)
    take_out_leading_norm(res, module, D, lambda h: fp.first_tensor(caller(module).call(h, h, h, None), 3))
    around = _post_norm_out(res, ctx, comp, module, x)  # jadore801120's: norm(q + attention) in one module
    linears, qk_norms = _projections(comp, module, heads)
    if heads != 1 and single_head(comp, linears, n_kv_heads):  # checked again with one head
        return check_mha(comp, ctx, sizes["causal"], n_kv_heads, heads=1)
    c = _driven(res, module, around, x)
    _sequence_first(res, ctx, c)  # before the layouts: its one token is then (1, B, D)
    find_layouts_(module, _one_token(c, x[:, :1], _conventions(ctx, module, c)), D, D // heads)
    kv_width = n_kv_heads * (D // heads) if n_kv_heads else None  # None: read from a fused projection
    slots = attention_slots(linears, D, 1, comp.name, kv_width)[0] + qk_norms
    n_kv_heads = n_kv_heads or kv_heads_of(slots, heads)
    res.mapping, ctx.unmapped[comp.name] = [s.describe() for s in slots], held_apart(module, slots, ATTENTION)
    causal_inside = _causal_inside(res, ctx, c, sizes["causal"], module)
    has_o = _head_notes(res, comp, c, slots, causal_inside, heads, source_text(ctx.module))
    probe = MHAProbe(ctx, c, x, _one_mask_first(c, _conventions(ctx, module, c)), causal_inside, heads)
    probe.window = window = _window_inside(res, ctx, c, module) if causal_inside else None
    try:
        # a mask it requires, when a case has none: every key visible in the first convention it runs with
        c.state["visible"] = first_working(ctx, probe.run, probe.convs)
    except fp.LearnerFailure as failure:
        if causal_inside and not_cropped(res, ctx, comp, module, failure, probe.T):
            return finish(res)
        runs = [(visible_call(c, cv), None) for cv in probe.convs]
        note_raised_attention(res, comp, runs, mha_weights(slots, heads, n_kv_heads, None), causal_inside)
        raise
    facts = {"probe": probe, "rows": probe.rows, "takes_mask": c.takes_mask, "slots": slots,
             "universe": _universe(c, has_o, n_kv_heads, causal_inside), "n_kv_heads": n_kv_heads,
             "ropes": positions_inside(comp, c, slots, module), "caps": softcaps(module),
             "scales": configured_scales(module),
             "setup": Setup(module, slots, c, "", causal_inside, n_kv_heads, None, heads, window=window)}
    return Subject(probe.run, [], module, facts)


ATTENTION = text("MultiHeadAttention", " MultiHeadAttention ")


def _mha_search(mha: Probe, subject: Subject, out: Tensor | None, working: str) -> Found:
    """The rotary layout and mask convention that explain the learner's output with the fewest
    mistakes: no mistake in any (layout, convention) first, then one, then a pair, layouts in order
    (the learner run once a convention). The key is the convention, the weights (rotary layout,
    reference, soft cap); the key None when no convention gives an output (the first failure kept as
    facts["failure"])."""
    p, slots, n_kv_heads = subject.facts["probe"], subject.facts["slots"], subject.facts["n_kv_heads"]
    outputs, subject.facts["failure"] = outputs_by_convention(p.run, p.convs)
    qk = ("qk_norm_after_rope",) if any(s.role in QK_NORM_ROLES for s in slots) else ()
    readings = {rope: (p.computer(slots, n_kv_heads, rope), responsive(outputs, subject.facts["universe"] + (
        (*ROPE_FLAGS, *qk) if V.is_rotary(rope) else ()))) for rope in subject.facts["ropes"]}

    def search_one(setting: tuple[str | None, str], least: int, most: int,
                   ) -> tuple[frozenset[str], float] | None:
        (compute, universe), conv = readings[setting[0]], setting[1]
        return fp.search(outputs[conv], lambda fl: compute(fl, conv), universe, lambda fl: p.rows(fl, conv),
                         most, least)
    best = _fewest(subject, readings, list(itertools.product(readings, outputs)), search_one)
    held = next((r for r in subject.facts["ropes"][:1] if r in V.SCORE_BIASES), None)  # compared with it
    rope, conv, (flags, err), compute, form = best or (held, next(iter(outputs), None), (frozenset(), None),
                                                       p.computer(slots, n_kv_heads, held), (None, None))
    return Found(conv, (rope, compute, *form), flags, err, p.run(conv) if best else None, working,
                 lambda fl: compute(fl, conv))


def _fewest(subject: Subject, readings: dict[Any, tuple[Compute, tuple[str, ...]]], settings: list[Any],
            search_one: Callable[..., tuple[frozenset[str], float] | None]) -> tuple[Any, ...] | None:
    """The reading with the fewest mistakes: (rotary layout, convention, (flags, error), reference,
    (cap, scale)). A soft cap or a configured scale the attention holds (`_scored`) wins where it
    explains the output with fewer mistakes; with at most one, it explains it with fewer than any pair,
    so the settings' pairs (the costliest round by far) are searched only where neither did."""
    found = fp.search_settings(settings, search_one, fewest=True, rounds=slice(2))  # no mistake, then one
    scored = _scored(subject, readings)
    if not (found or scored):
        found = fp.search_settings(settings, search_one, fewest=True, rounds=slice(2, 3))  # a pair
    best = found and (found[0][0], found[0][1], found[1:], readings[found[0][0]][0], (None, None))
    return min(filter(None, (best, scored)), key=lambda b: len(b[2][0]), default=None)


def _scored(subject: Subject, readings: dict[Any, tuple[Compute, tuple[str, ...]]]) -> tuple[Any, ...] | None:
    """The reading of an attention whose scores take a form of its own that reproduces the output
    with at most one mistake: a soft cap (Gemma 2's) or a configured scale (Granite's
    attention_multiplier), each `softcaps` and `configured_scales` offer tried with each layout.
    (rotary layout, convention, (flags, error), reference, (cap, scale)); None when none does."""
    p, slots, n_kv_heads = subject.facts["probe"], subject.facts["slots"], subject.facts["n_kv_heads"]
    caps, scales = subject.facts["caps"], subject.facts["scales"]
    forms = list(itertools.product((None, *caps), (None, *scales)))[1:]  # (cap, scale), not the plain one
    for (rope, (_, universe)), form in itertools.product(readings.items(), forms):
        compute = p.computer(slots, n_kv_heads, rope, *form)
        conv, found, _ = detect(p.run, compute, universe, p.rows, p.convs, most_flags=1)
        if found is not None:
            return rope, conv, found, compute, form
    return None


def _mha_rope(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """The step that fails when no convention gives an output, notes the rotary layout found and
    keeps what the search found for the comparisons after it."""
    p = subject.facts["probe"]
    if found.key is None:
        raise subject.facts["failure"] or _no_output(ctx, comp, p, found.x)
    rope = found.weights[0]
    if rope:
        res.notes.append(rope_note(rope))
    if rope in ("half", "interleaved"):
        _whole_head_rotary(res, ctx, comp)
    if rope in V.UNSCALED:  # T5's scores, without 1/sqrt(d_k) by design
        res.status = DIFFERS
    cap, scale = found.weights[2:4]
    res.notes += [note(value) for note, value in ((softcap_note, cap), (scale_note, scale)) if value]
    subject.facts["setup"] = dataclasses.replace(subject.facts["setup"], conv=found.key, rope=rope,
                                                 softcap=cap, scale=scale)


def softcap_note(cap: float) -> Text:
    return text(f"the scores are soft-capped, {cap:g} * tanh(scores / {cap:g}), before the mask (Gemma 2's "
                "attn_logit_softcapping; the cap read from your module): a convention, compared so",
                f"分数先软截断为 {cap:g} * tanh(scores / {cap:g})，再加掩码（Gemma 2 的 "
                "attn_logit_softcapping；上限从你的模块读出）：这是约定，按它比较")


def _whole_head_rotary(res: ComponentResult, ctx: Context, comp: Component) -> None:
    """A finding where the attention turns the whole head while its file's config declares a share
    below one that no line reads (GPT-NeoX's rotary_pct ignored)."""
    unread = fraction_unread(code_text(ctx.module))  # a share a comment names is no config
    if unread:
        number, code = first_line([r"self\.\w*rot\w*\s*=", r"rotary|rope"], source_lines([comp.obj]))
        res.findings.append(Finding(DEPARTS, text(
            f"the whole head is rotated, while the config declares {unread} and no line reads it: only "
            "that share of each head's dims should turn", f"整个头都做了旋转，而配置里写了 {unread}，"
            "却没有一行读取它：每个头只应旋转这一部分维度"), number, code))


def _mha_localized(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                   ) -> None:
    """The step that notes where the learner's attention first parts from the reference."""
    s, p = subject.facts["setup"], subject.facts["probe"]
    w = dataclasses.replace(mha_weights(s.slots, s.heads, s.n_kv_heads, s.rope), softcap=s.softcap,
                            scale=s.scale)
    guarded(res, lambda: note_attention_departure(res, comp, _localizer_runs(comp, s, p),
                                                  w, s.causal_inside))


MHA = Probe(                                # built by check_mha: the module, its slots, a mask per convention
    inputs=lambda s: s.facts["probe"].c.state["visible"],  # the first convention it runs with
    shape=lambda ctx, comp, s, x, out: None,  # a (B, T, D) output: the search reads only those
    reference=lambda w, conv, flags: w[1](flags, conv),
    universe=lambda s: s.facts["universe"],
    steps=(_mha_rope, lambda res, ctx, comp, s, found: convention_found(res, ctx, comp, s, found, "sdpa"),
           lambda res, ctx, comp, s, _: causal_mask_named(res, ctx, comp, s.facts["setup"].causal_inside),
           lambda res, ctx, comp, s, _: guarded(res, lambda: _compare_mha(res, ctx, comp, s.facts["setup"])),
           _mha_localized,
           lambda res, ctx, comp, s, _: guarded(res, lambda: _properties(res, ctx, comp, s.facts["setup"]))),
    dropout_kinds=("sdpa",), search=_mha_search,
)


def _localizer_runs(comp: Component, s: Setup, probe: MHAProbe,
                    ) -> list[tuple[Callable[..., Any], str | None]]:
    """The ways the localizer runs the learner's attention: with an all-visible mask in each
    convention (the one found first) and, when the search found no rotary layout, each layout (a
    score bias is found whenever it is there)."""
    ropes = (s.rope,) if s.rope else rope_settings(comp, s.c, s.module)
    convs = (s.conv,) + tuple(cv for cv in probe.convs if cv != s.conv) if s.c.takes_mask else (s.conv,)
    return [(visible_call(s.c, cv), r) for cv in convs for r in ropes]


def visible_call(c: Caller, conv: str) -> Callable[..., Any]:
    """The learner's attention handed an all-visible mask in the convention found (Meta's forward
    adds its mask to the scores: a bool mask of ones would add 1), for the localizer's run."""
    def call(xq: Tensor, xk: Tensor, xv: Tensor, mask: Tensor | None) -> Any:
        everything = torch.ones(xq.size(0), 1, xq.size(1), xk.size(1), dtype=torch.bool)
        if c.takes_mask and fp.encodable(everything, conv):
            mask = run_mask(everything, conv, xq.size(0))
        return c.call(xq, xk, xv, mask)
    return call


def _causal_inside(res: ComponentResult, ctx: Context, c: Caller, causal_inside: bool,
                   module: nn.Module) -> bool:
    """Causal inside: said so by its kind, or a self-attention that is causal given no mask
    (minimind's is_causal=True), or whose forward's causal switch is on by default (MPT's
    forward(x, ..., is_causal=True): causal by what it says, however its mask came out), noted. One
    that requires its mask and is not causal without it (litgpt's forward(x, cos, sin, mask)) is
    handed its causal mask by its caller: checked with masks."""
    if causal_inside and c.required and not (behaves_causal(ctx, c, D) or causal_with_keys_kept(ctx, c, D)):
        res.notes.append(MASK_FROM_CALLER)
        return False
    if causal_inside or c.n_inputs != 1:
        return causal_inside
    if behaves_causal(ctx, c, D):  # handed None where a case has no mask (ChatGLM's builds its own then)
        res.notes.append(CAUSAL_WITHOUT_MASK)
        c.state["none"] = c.required
    elif c.required and causal_with_keys_kept(ctx, c, D):  # its padding mask required, its causal one inside
        res.notes.append(CAUSAL_WITH_KEYS_KEPT)
    elif switched_causal(module):
        res.notes.append(CAUSAL_BY_SWITCH)
    else:
        return False
    return True


def _window_inside(res: ComponentResult, ctx: Context, c: Caller, module: nn.Module) -> int | None:
    """The sliding window of the causal mask an attention builds itself (Gemma 2's local layers,
    i - W < j <= i), measured, noted and checked against its settings; None where it sees every
    earlier token."""
    reach = own_window(lambda v: fp.first_tensor(ctx.learner.call("forward", c.call, v, v, v, None), 3), D)
    if reach:
        window_found(res, module, reach)
    return reach


def switched_causal(module: nn.Module) -> bool:
    """Whether its forward's causal switch (`is_causal`, `causal`) is on by default."""
    return any(p.name in ("is_causal", "causal") and p.default is True for p in forward_parameters(module))


CAUSAL_WITHOUT_MASK = text("with no mask it is causal (changing token 3 leaves outputs 0..2 unchanged): "
                           "checked as causal self-attention",
                           "不给掩码时它是因果的（改变位置 3 的 token，位置 0..2 的输出不变）："
                           "按因果自注意力检查")
CAUSAL_WITH_KEYS_KEPT = text("it requires a padding mask of its keys (B, S), and handed one that hides none "
                             "it is causal: checked as causal self-attention, its padding handed as that "
                             "mask",
                             "它必须传入键的填充掩码 (B, S)，传入不遮任何键的掩码时它是因果的：按因果自注意力"
                             "检查，填充用这个掩码传入")
CAUSAL_BY_SWITCH = text("its forward's causal switch is on by default (is_causal=True): checked as causal "
                        "self-attention",
                        "它的 forward 的因果开关默认打开（is_causal=True）：按因果自注意力检查")


MASK_FROM_CALLER = text("its forward requires a mask and is not causal without one: its caller hands the "
                        "causal mask (litgpt's forward(x, cos, sin, mask)), so it was checked with the masks "
                        "handed",
                        "它的 forward 必须传入掩码，不传时不是因果的：因果掩码由调用方传入（litgpt 的 "
                        "forward(x, cos, sin, mask)），所以按传入的掩码检查")


def _tutorial_shapes_at_their_sizes(res: ComponentResult, ctx: Context, comp: Component, c: Caller,
                                    sizes: dict[str, Any]) -> None:
    with ctx.sizes_set(comp, TUTORIAL):  # their module-level sizes too, at the tutorial's
        _tutorial_shapes(res, ctx, comp, c, sizes)


def _driven(res: ComponentResult, module: nn.Module, around: bool, x: Tensor) -> Caller:
    """caller(module), its query taken away where its norm was taken out (_post_norm_out), one
    sequence at a time where it takes no batch (_one_sequence, on x); a window it is handed, noted."""
    c = caller(module)
    c.call = less_query(c.call) if around else c.call
    _one_sequence(res, c, x)
    res.notes += window_note(window_inputs(module, forward_parameters(module)))
    return c


def _post_norm_out(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module, x: Tensor) -> bool:
    """Whether the attention ends with its residual and one norm of the model's width, norm(q +
    attention) (jadore801120's MultiHeadAttention, nlp-tutorial's): that norm taken out
    (norm_taken_out), so that the attention plus its query is what its forward returns; False (nothing
    changed) for any other. A mask it requires is handed every key visible, as _one_token does."""
    extra = [leaf for leaf in leaves(module) if leaf.kind != "linear"]
    if len(extra) != 1 or extra[0].kind != "norm" or getattr(extra[0].weight, "shape", None) != (D,):
        return False
    norms = norms_around(comp.name, extra, D, text("", ""))
    c = caller(module)
    if not norm_taken_out(module, norms, extra[0], _one_token(c, x, _conventions(ctx, module, c))):
        return False
    res.notes.append(post_norm_note(extra[0]))
    return True


def _projections(comp: Component, module: nn.Module, heads: int) -> tuple[list[Any], list[Slot]]:
    """The attention's linear layers, and its q/k norms (QK-norm, Qwen3's) as slots; bare parameters
    besides are held as built (a learned temperature a head: what they change is not in the
    reference, held_apart), any other parameter is not in the reference."""
    found = no_unreferenced_parts(leaves(module), D // heads)  # Shaw's tables, per-head q/k gains
    extra = [leaf for leaf in found if leaf.kind != "linear"]
    qk_norms = qk_norm_slots(extra, D // heads, D) or relative_bias_slots(extra, heads)
    if extra and not qk_norms and of_kind(extra, "scalar") != extra:
        shapes = shapes_text(extra)
        raise MappingError(f"{comp.name} has parameters besides its projections ({shapes}); handformer's "
                           "reference attention has only a QK-norm (two norms of width head_dim named "
                           "q_norm and k_norm), no residual and norm inside",
                           zh=f"{comp.name} 除了投影矩阵还有别的参数（{shapes}）；handformer 的参考注意力"
                              "只认 QK-norm（两个宽度为 head_dim、名为 q_norm 和 k_norm 的归一化），"
                              "内部没有残差和归一化")
    if not qk_norms:  # nanochat's norm(q), norm(k): handformer's QK-norm with gains of one
        qk_norms = gainless_qk(module, D // heads)
    return of_kind(found, "linear"), qk_norms


def _head_notes(res: ComponentResult, comp: Component, c: Caller, slots: list[Slot], causal_inside: bool,
                heads: int, source: str) -> bool:
    """Notes on what the attention takes and has (no mask, one head, W_O in a sibling module of the
    file's `source`), the missing W_O as a finding; whether it has W_O."""
    if not c.takes_mask and not causal_inside:
        res.notes.append(text("its forward takes no mask: the masked cases were skipped",
                              "它的 forward 不接收掩码：跳过了带掩码的用例"))
    has_o = any(s.role.endswith("W_O") for s in slots)
    if heads == 1:
        res.notes.append(text(
            "one head (its constructor takes no number of heads, and it has W_Q, W_K, W_V and no W_O): "
            "compared with handformer's attention with one head and no output projection",
            "单头注意力（构造函数不接受头数，只有 W_Q、W_K、W_V，没有 W_O）：与只有一个头、"
            "没有输出投影的 handformer 注意力比较"))
    elif not has_o:
        _no_output_projection(res, comp, source)
    return has_o


def _no_output_projection(res: ComponentResult, comp: Component, source: str) -> None:
    """W_O is missing: a finding; a note instead where the file's `source` hands the attention's output
    to a sibling module that holds it (Hugging Face's BERT and ViT)."""
    elsewhere = projection_elsewhere(source, comp.name)
    if elsewhere:
        res.notes.append(text(
            f"no W_O of its own: {elsewhere[0]} hands its output to {elsewhere[1]}, which holds the output "
            "projection (Hugging Face BERT's layout): compared with handformer's attention without W_O",
            f"它自己没有 W_O：{elsewhere[0]} 把它的输出交给 {elsewhere[1]}，输出投影在那里（Hugging Face "
            "BERT 的写法）：与没有 W_O 的 handformer 注意力比较"))
        return
    number, code = locate("no_output_projection", source_lines([comp.obj]))
    res.findings.append(Finding("no_output_projection", text(
        f"{comp.name} has 3 projections ({', '.join(res.mapping)}), no nn.Linear(d_model, d_model) "
        f"for W_O", f"{comp.name} 只有 3 个投影（{', '.join(res.mapping)}），没有用于 W_O 的 "
        "nn.Linear(d_model, d_model)"), number, code))


def _one_token(c: Caller, one: Tensor, convs: tuple[str, ...]) -> Callable[[], Tensor | None]:
    """The learner's attention on one token (B, 1, D), where its output reads the value rows alone;
    where it requires a mask (BLOOM's forward(x, residual, alibi, mask)), that one key visible in the
    first convention it runs with (a softmax over one key is 1 in any of them)."""
    def run() -> Tensor | None:
        for conv in convs if c.required else (None,):
            c.state["visible"] = conv
            out = fp.quietly(lambda: fp.first_tensor(c.call(one, one, one, None), 3))
            c.state.pop("visible")
            if fp.max_error(out, out) == 0.0:  # (inf for none, or a NaN)
                return out
        return None
    return run


def _conventions(ctx: Context, module: Any, c: Caller) -> tuple[str, ...]:
    """The mask conventions to try: torch.nn's (True = masked) first where the source (the
    attention's own, or a class of the learner's inside it) masks where the mask is True, unless the
    file's own causal mask writes True = may see (then that attention reads its file's masks inverted)."""
    convs = SEQUENCE_FIRST_CONVENTIONS * bool(c.state.get("first")) + ctx.conventions(c.mask_name)
    if ctx.convention is None and masks_where_true_inside(module, c.mask_name) and not file_masks_keep(ctx) \
            and not says_keep(c.mask_name) and not comment_says_keep(getattr(module, "forward", module)):
        convs = ("torch", "torch3", "torch2") + convs
    shared = bool(c.mask_name) and _shared_mask(getattr(module, "forward", module), c.mask_name)
    return SHARED * shared + convs


def _one_mask_first(c: Caller, convs: tuple[str, ...]) -> tuple[str, ...]:
    """The conventions, one (T, S) mask for the whole batch first (SHARED) where the attention reads
    its mask so, by what it does (fp.reads_one_mask)."""
    one_mask = c.takes_mask and convs[:1] != SHARED[:1] and fp.reads_one_mask(
        lambda v, m: c.call(v, v, v, m), fp.randn(2, 5, D, seed=3), convs)
    return SHARED * bool(one_mask) + convs


def _shared_mask(forward: Any, name: str) -> bool:
    """Whether the forward gives its mask two leading axes (Mistral's `mask[None, None, ...]`): it takes
    one (T, S) mask for the whole batch, and a (B, 1, T, S) one would add two more batch axes."""
    return bool(re.search(rf"\b{re.escape(name)}\s*\[\s*None\s*,\s*None\b", source_text(forward)))


def shares_mask(module: nn.Module) -> bool:
    """Whether the module or one inside it gives a mask two leading axes (the attention of Mistral's
    block: `mask[None, None, ...]`): the block takes one (T, S) mask for the whole batch."""
    return any(re.search(r"\w*mask\w*\s*\[\s*None\s*,\s*None\b", source_text(type(sub).forward))
               for sub in module.modules())


def _universe(c: Caller, has_o: bool, n_kv_heads: int | None, causal_inside: bool) -> tuple[str, ...]:
    """The mistakes the attention is searched for."""
    universe = attention_flags(has_o)
    if c.mask_name and fp.is_lengths_name(c.mask_name):
        universe += ("mask_repeat_order",)
    if n_kv_heads:
        universe += ("kv_repeat_order",)
    if causal_inside:
        dropped = ("mask_after_softmax",) + (() if c.takes_mask else ("mask_hides_queries",))
        universe = tuple(f for f in universe if f.split(":")[0] not in dropped)
        universe += ("causal_off_by_one:no_self", "causal_off_by_one:sees_next", "mask_inverted:causal")
    return universe


class MHAProbe:
    """The search's input (B, T, D), the masks it is given under each convention, and the masks the
    attention applies with a set of mistakes."""

    B, T = 2, 6

    def __init__(self, ctx: Context, c: Caller, x: Tensor, convs: tuple[str, ...],
                 causal_inside: bool, heads: int) -> None:
        self.ctx, self.c, self.x, self.convs, self.causal_inside = ctx, c, x, convs, causal_inside
        self.heads, self.window = heads, None  # the sliding window of its own causal mask, if any
        self.pad = positions(self.B, self.T, [0, 2]) if c.takes_mask else None
        keep = self.pad if self.pad is None else causal(self.T) & self.pad  # (B, 1, T, T)
        # causal inside too: one that applies a mask it is given in place of its own (Hugging Face's
        # StableLM, causal when handed none) is handed both; the padding alone where the convention
        # cannot write them (a (B, S) key padding)
        self.keeps = keeps_for(keep, self.pad, convs)

    def run(self, conv: str) -> Tensor | None:
        mask = self.c.mask(self.keeps[conv], conv, self.B)
        return fp.first_tensor(self.ctx.learner.call("forward", self.c.call, self.x, self.x, self.x, mask), 3)

    def applied(self, flags: frozenset[str], conv: str) -> Tensor | None:
        """The mask as the learner's attention with these mistakes applies it: the one it is given,
        or (causal inside) its own causal mask, off by one if so, & the padding it is given."""
        if not self.causal_inside:
            return V.applied_keep(self.keeps[conv], flags, self.heads)
        own = window_keep(self.T, self.window, frozenset(flags))[None, None]  # its own, in its window
        if self.pad is None:
            return V.applied_keep(own, flags, self.heads)
        given = V.applied_keep(self.pad, flags, self.heads)
        return own if given is None else own & given

    def rows(self, flags: frozenset[str], conv: str) -> Tensor | None:
        return fp.visible_rows(self.applied(flags, conv), self.B, self.T)

    def computer(self, slots: list[Slot], n_kv_heads: int | None, rope: str | None,
                 softcap: float | None = None, scale: float | None = None) -> Compute:
        w = dataclasses.replace(mha_weights(slots, self.heads, n_kv_heads, rope), softcap=softcap,
                                scale=scale)
        x = self.x
        return lambda flags, conv: V.multi_head_attention(w, x, x, x, self.applied(flags, conv),
                                                          flags - V.MASK_TRANSFORMS)[0]


def _no_output(ctx: Context, comp: Component, p: MHAProbe, working: str) -> fp.LearnerFailure:
    mask = run_mask(p.keeps[working], working, p.B)
    got = shape_of(ctx.learner.call("forward", p.c.call, p.x, p.x, p.x, mask))
    return ctx.learner.fail(
        "forward", f"{comp.name} returned {got} for inputs of shape {tuple(p.x.shape)}; expected a "
        "(B, T, D) tensor (and the weights (B, H, T, S) if you return them)",
        f"输入形状为 {tuple(p.x.shape)} 时，{comp.name} 返回了 {got}；应当返回一个 (B, T, D) "
        "张量（如果返回权重，权重是 (B, H, T, S)）")


def _nan_as_torch(res: ComponentResult) -> None:
    """A fully masked query gives NaN with torch.nn's masks (True = masked, filled with -inf), as
    torch.nn.MultiheadAttention's does: a convention of that mask, noted, not a mistake."""
    if res.has("nan_on_masked_rows"):
        res.findings = [f for f in res.findings if f.name != "nan_on_masked_rows"]
        res.notes.append(text(
            "a query whose keys are all masked gives NaN, as torch.nn.MultiheadAttention's does with its "
            "masks (True = masked): a convention; handformer gives zeros there",
            "所有键都被屏蔽的查询得到 NaN，和 torch.nn.MultiheadAttention 用它的掩码（True = 屏蔽）时一样："
            "这是约定；handformer 在那里给出 0"))


def single_head(comp: Component, linears: list[Any], n_kv_heads: int | None) -> bool:
    """One head (Raschka's CausalAttention(d_in, d_out, context_length, dropout)): a class whose
    constructor takes no number of heads (nor a config that could hold it), with three (D, D)
    projections and nothing else."""
    from handformer.check.core.discovery import CONFIG_NAMES, argument_keys

    if n_kv_heads or len(linears) != 3 or not inspect.isclass(comp.obj):
        return False
    names = [p.lower() for p in inspect.signature(comp.obj.__init__).parameters]
    if "n_heads" in argument_keys(comp.obj).values() or any(n in CONFIG_NAMES for n in names):
        return False
    return all(tuple(leaf.weight.shape) == (D, D) for leaf in linears)


def ctx_sizes() -> dict[str, Any]:
    from handformer.check.core.context import SIZES

    return dict(SIZES)



@dataclass
class Setup:
    """What the search found about the learner's attention, for the comparisons after it."""

    module: nn.Module
    slots: list[Slot]
    c: Caller
    conv: str
    causal_inside: bool
    n_kv_heads: int | None
    rope: str | None
    heads: int  # H, or 1 for a single-head attention
    softcap: float | None = None  # its scores soft-capped at this value (Gemma 2's)
    scale: float | None = None  # its scores' configured scale in place of 1/sqrt(d_k) (Granite's)
    window: int | None = None  # the sliding window of the causal mask it builds itself (Gemma 2's)


def _cases(s: Setup) -> list[tuple[str, int, int, int, Tensor | None, Tensor | None]]:
    """(label, B, T, S, the mask handed over, the mask applied): a causal attention is handed only
    the padding, if it takes a mask at all."""
    takes_mask = s.c.takes_mask
    cross = s.c.n_inputs >= 2 and not s.causal_inside and s.rope is None
    if s.causal_inside:
        own = functools.partial(window_keep, window=s.window)  # (T, T): its own causal mask
        cases = [("causal self-attention", 2, 5, 5, None, own(5)[None, None]),
                 ("causal self-attention", 3, 8, 8, None, own(8)[None, None])]
        if takes_mask:
            pad = positions(3, 7, [0, 2, 5])
            given = keeps_for(causal(7) & pad, pad, (s.conv,))[s.conv]  # as MHAProbe's
            cases.append(("causal self-attention, padding", 3, 7, 7, given, own(7) & pad))
    else:
        cases = [("self-attention, no mask", 2, 5, 5, None, None)]
        if takes_mask:
            pad, both = positions(3, 7, [0, 2, 7]), causal(6) & positions(2, 6, [0, 2])
            cases += [("self-attention, padding (one row fully padded)", 3, 7, 7, pad, pad),
                      ("self-attention, causal + padding", 2, 6, 6, both, both)]
        if cross:
            keep = positions(2, 9, [0, 3]) if takes_mask else None
            label = "cross-attention, T=4, S=9" + (", padding" if takes_mask else "")
            cases.append((label, 2, 4, 9, keep, keep))
    return [case for case in cases if fp.encodable(case[4], s.conv)]


def _compare_mha(res: ComponentResult, ctx: Context, comp: Component, s: Setup) -> None:
    hf = handformer_attention(s.slots, s.n_kv_heads, s.rope, heads=s.heads, softcap=s.softcap,
                              scale=s.scale)
    errors, grad_errors = [], []
    cases = _cases(s)
    before = snapshot(s.module)
    for i, (label, B, T, S, handed, mask) in enumerate(cases):
        xq = fp.randn(B, T, D, seed=10 + i).requires_grad_()
        xkv = xq if S == T and "cross" not in label else fp.randn(B, S, D, seed=20 + i).requires_grad_()
        rope = rope_tables(T, heads=s.heads, rope=s.rope) if V.is_rotary(s.rope) else None
        with torch.enable_grad():
            raw = ctx.learner.call("forward", s.c.call, xq, xkv, xkv, run_mask(handed, s.conv, B))
            out = fp.first_tensor(raw, 3)
            if out is None:
                raise ctx.learner.fail("forward", f"{comp.name} returned {shape_of(raw)}, not a (B, T, D) "
                                       f"tensor, for inputs of shape {tuple(xq.shape)}",
                                       f"输入形状为 {tuple(xq.shape)} 时，{comp.name} 返回了 "
                                       f"{shape_of(raw)}，不是 (B, T, D) 张量")
            ref, ref_w = hf(xq, xkv, xkv, mask, need_weights=True, rope=rope)
            rows = fp.visible_rows(mask, B, T)
            errors += case_errors(raw, out, ref, ref_w, rows)
            masked_rows(res, out, rows, comp, ctx)
            # gradients on the first case, where every query sees a key (a row of -inf gives NaN
            # gradients in torch.nn's convention, which spread to the weights' gradients)
            if out.shape == ref.shape and i == 0:
                grads = functools.partial(_grads_again, (out, xq, rows, mask, xkv, rope), s, hf)
                grad_errors.append(gradient_error(res, grads, written(s.module, before), hf))
    res.max_abs_error = max(errors)
    res.checks.append(Check(text(f"matches handformer's MultiHeadAttention on {len(errors)} outputs",
                                 f"在 {len(errors)} 组输出上与 handformer 的 MultiHeadAttention 一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))
    if grad_errors:
        res.checks.append(Check(text("gradients (input and weights) match handformer's",
                                     "梯度（输入与权重）与 handformer 一致"),
                                max(grad_errors) < 1e-5, error_text(max(grad_errors))))


def _grads_again(run: tuple[Any, ...], s: Setup, hf: nn.Module, retain: bool) -> float:
    """`_grads` on run = (out, xq, rows, mask, xkv, rope), handformer's output computed again (with its
    keys and values held, inside kept_state.keys_held)."""
    out, xq, rows, mask, xkv, rope = run
    return _grads(out, hf(xq, xkv, xkv, mask, rope=rope)[0], xq, rows, s, hf, retain)


def _grads(out: Tensor, ref: Tensor, xq: Tensor, rows: Tensor | None, s: Setup, hf: nn.Module,
           retain: bool = False) -> float:
    """The largest difference of the input's and the projections' gradients (the input's only when
    handformer's W_Q and W_K rows were permuted for interleaved rotary pairs); `retain`: out's graph kept
    for another comparison."""
    B, T = xq.shape[:2]
    g = fp.randn(*out.shape, seed=99)
    sel = rows.reshape(B, T, 1) if rows is not None else 1.0
    slots = [sl for sl in s.slots if not isinstance(sl.leaf, Gainless)]  # a function's norm has no weight
    params = [xq] + [p for sl in slots for p in sl.leaf.tensors()]
    flat = torch.autograd.grad((out * g * sel).sum(), params, allow_unused=True, retain_graph=retain)
    mine, i = [flat[0]], 1
    for sl in slots:  # heads kept as single-head modules: their gradients stacked as their weights are
        n = len(sl.leaf.tensors())
        grads = flat[i:i + n]
        i += n
        mine.append(None if any(x is None for x in grads) else torch.cat(grads))
    hf_params = [attention_parameters(hf)[sl.role.split(" ")[-1]].weight for sl in slots]
    theirs = torch.autograd.grad((ref * g * sel).sum(), [xq] + hf_params, allow_unused=True)
    if s.rope in ("interleaved", "swapped"):
        return grads_error([(mine[0], theirs[0])])
    return grads_error(list(zip([mine[0]] + [_rows(m, sl) for m, sl in zip(mine[1:], slots)], theirs)))


def _rows(grad: Tensor | None, slot: Slot) -> Tensor | None:
    if grad is None or slot.rows is None:
        return grad
    return grad[slot.rows]


def _properties(res: ComponentResult, ctx: Context, comp: Component, s: Setup) -> None:
    """Reference-free checks: causality, padding invariance, heads one by one."""
    x = fp.randn(2, 7, D, seed=30)
    _causality(res, ctx, s, x)
    if s.c.takes_mask and s.rope is None:
        _padding_invariance(res, ctx, s, x)
    _key_padding_alone(res, ctx, s)
    if s.rope is None and s.n_kv_heads is None and s.heads == H:
        _at_distinct_sizes(res, ctx, comp, s)
        if strided_loop(ctx.objects(comp)):
            _across_tiles(res, ctx, comp, s)
    has_o = any(sl.role.endswith("W_O") for sl in s.slots)
    w = mha_weights(s.slots, s.heads)
    if has_o and not s.causal_inside and s.n_kv_heads is None and s.rope is None and w.qk_norm is None:
        out = fp.first_tensor(ctx.learner.call("forward", s.c.call, x, x, x, None), 3)
        heads = one_head_at_a_time(w, x)
        err = fp.max_error(out, heads)
        res.checks.append(Check(text("split + concat of heads equals the heads computed one by one",
                                     "拆分再拼接多头，与逐个头单独计算的结果一致"), err < 1e-5,
                                error_text(err)))


def _causality(res: ComponentResult, ctx: Context, s: Setup, x: Tensor, j: int = 3) -> None:
    """Changing token j leaves the outputs before it unchanged (causal inside, or given a causal mask)."""
    B, T = x.shape[:2]
    bumped = x.clone()
    bumped[:, j] += 1.0
    causal_keep = causal(T)[None, None]
    if not (s.causal_inside or (s.c.takes_mask and fp.encodable(causal_keep, s.conv))):
        return
    mask = None if s.causal_inside else run_mask(causal_keep, s.conv, B)  # (causal inside: no padding)
    a = fp.first_tensor(ctx.learner.call("forward", s.c.call, x, x, x, mask), 3)
    b = fp.first_tensor(ctx.learner.call("forward", s.c.call, bumped, bumped, bumped, mask), 3)
    past = moved_by(a, b, (slice(None), slice(0, j)))
    res.checks.append(Check(text(f"causality: changing token {j} leaves outputs 0..{j - 1} unchanged",
                                 f"因果性：改变位置 {j} 的 token，不影响位置 0..{j - 1} 的输出"),
                            past < 1e-9, text(f"outputs before it moved by {past:.3g}",
                                              f"之前位置的输出变化了 {past:.3g}")))


def _padding_invariance(res: ComponentResult, ctx: Context, s: Setup, x: Tensor) -> None:
    """Changing the padded keys and values (the padded positions of x, for self-attention only)
    changes no real output; nothing said where its convention has no padding of one row alone (one
    (T, S) mask for the whole batch)."""
    B, T = x.shape[:2]
    if not fp.encodable(keep := positions(B, T, [0, 3]), s.conv):
        return
    mask = run_mask(keep, s.conv, B)
    if s.c.n_inputs == 1:  # self-attention only: move the padded positions of x, compare the real ones
        other = x.clone()
        other[1, T - 3:] += 5.0
        a = fp.first_tensor(ctx.learner.call("forward", s.c.call, x, x, x, mask), 3)
        b = fp.first_tensor(ctx.learner.call("forward", s.c.call, other, other, other, mask), 3)
        moved = moved_by(a, b, (slice(None), slice(0, T - 3)))
    else:
        xkv = fp.randn(B, T, D, seed=31)
        other = xkv.clone()
        other[1, T - 3:] += 5.0
        a = fp.first_tensor(ctx.learner.call("forward", s.c.call, x, xkv, xkv, mask), 3)
        b = fp.first_tensor(ctx.learner.call("forward", s.c.call, x, other, other, mask), 3)
        moved = moved_by(a, b, (slice(None), slice(None)))
    res.checks.append(Check(text("padding invariance: changing padded keys/values changes nothing",
                                 "填充不变性：改变被填充的键/值不影响输出"), moved < 1e-9,
                            text(f"outputs moved by {moved:.3g}", f"输出变化了 {moved:.3g}")))


# sizes at which no two differ (batch 3, 5 tokens, 2 heads of 8, d_model 16): at check's 4 heads of 4, a
# size read from the wrong axis (keys.shape[1], the heads, for the head size) is the right number
DISTINCT_HEADS, DISTINCT_B, DISTINCT_T = 2, 3, 5


def _at_distinct_sizes(res: ComponentResult, ctx: Context, comp: Component, s: Setup) -> None:
    """The attention built again with 2 heads of 8 and compared with handformer's on the same weights;
    nothing is said when it cannot be built or run so (a size only its own code allows)."""
    sizes, dh = {**ctx_sizes(), "n_heads": DISTINCT_HEADS, "causal": s.causal_inside}, D // DISTINCT_HEADS
    x = fp.randn(DISTINCT_B, DISTINCT_T, D, seed=7)
    try:
        with ctx.sizes_set(comp, sizes):
            module = ctx.build(comp, sizes, warmup=lambda m: caller(m, dh).call(x, x, x, None))
            c = caller(module, dh)
            c.state.update(s.c.state)  # the convention of a mask it requires
            out = fp.first_tensor(ctx.learner.call("forward", c.call, x, x, x, None), 3)
        linears, qk_norms = _projections(comp, module, DISTINCT_HEADS)
        find_layouts_(module, lambda: fp.first_tensor(c.call(x[:, :1], x[:, :1], x[:, :1], None), 3), D, dh)
        slots = attention_slots(linears, D, 1, comp.name, head_dim=dh)[0] + qk_norms
    except (fp.LearnerFailure, MappingError):
        return
    hf = handformer_attention(slots, kv_heads_of(slots, DISTINCT_HEADS), heads=DISTINCT_HEADS,
                              softcap=s.softcap)
    mask = window_keep(DISTINCT_T, s.window)[None, None] if s.causal_inside else None
    # an attention that turned no dims at check's 4 a head may turn a part of each head at 8 (Phi's
    # partial rotary, 0.4 of it rounded to even): each even width is tried, none first
    errors = {r: fp.max_error(out, hf(x, x, x, mask, need_weights=True, rope=_turned(r))[0])
              for r in range(0, dh + 1, 2)}
    turned = min(errors, key=errors.get)
    if errors[turned] >= 1e-5:  # no width matches: a mistake, not a convention; none turned is compared
        turned = 0
    err = errors[turned]
    res.notes += [text(f"with {dh} dims a head, rotary positions turn the first {turned} of each head's dims "
                       "(partial rotary, as Phi's): a convention, compared so",
                       f"每头 {dh} 维时，旋转位置编码只转每个头的前 {turned} 维（部分旋转，和 Phi 一样）："
                       "这是约定，按它比较")] * (0 < turned < dh)
    res.checks.append(Check(text(
        f"with {DISTINCT_HEADS} heads of {dh} (batch {DISTINCT_B}, {DISTINCT_T} tokens: no two sizes equal) "
        "it still matches handformer's", f"{DISTINCT_HEADS} 个头、每头 {dh} 维（batch {DISTINCT_B}，"
        f"{DISTINCT_T} 个 token：没有两个尺寸相等）时仍与 handformer 一致"), err < 1e-5, error_text(err)))
    if err >= 1e-5 and turned == dh * bool(s.rope):  # the reference's rotary as at check's sizes
        _localized_distinct(res, comp, c, s, slots)


# (the context size it is built with, the tokens it is run on): a loop over the sequence in tiles whose
# size is the context size (FlashAttention's block_size) runs over 3 tiles, the last one short; one whose
# tile size is its own default (16 or 32) runs over 2 or more at 61 tokens, the last one short too
TILE_RUNS = ((4, 11), (MAX_LEN, MAX_LEN - 3))


def _across_tiles(res: ComponentResult, ctx: Context, comp: Component, s: Setup) -> None:
    """An attention whose code loops over the sequence in strides (tiled attention with an online
    softmax), built again and run on more tokens than one tile holds, not a multiple of it, and compared
    with handformer's on the same weights; nothing is said where no such run can be built or run."""
    runs = [r for r in (_tiled_run(ctx, comp, s, *run) for run in TILE_RUNS) if r is not None]
    if not runs:
        return
    err, c, slots = max(runs, key=lambda r: r[0])
    res.checks.append(Check(text(
        f"its loop over the sequence in strides, run over several tiles (built with a context of "
        f"{TILE_RUNS[0][0]} on {TILE_RUNS[0][1]} tokens, and on {TILE_RUNS[1][1]} tokens): it still matches "
        "handformer's", f"它按步长遍历序列的循环跨过多个分块时（上下文按 {TILE_RUNS[0][0]} 构建、输入 "
        f"{TILE_RUNS[0][1]} 个 token，以及输入 {TILE_RUNS[1][1]} 个 token）仍与 handformer 一致"),
        err < 1e-5, error_text(err)))
    if err >= 1e-5 and not res.has(DEPARTS):  # where it first parts from the reference over the tiles
        w = mha_weights(slots, H, None, None)
        note_departure(res, lambda: localize_attention([(visible_call(c, s.conv), None)], w,
                                                       inspect.getsourcefile(comp.obj), s.causal_inside))


def _tiled_run(ctx: Context, comp: Component, s: Setup, context: int, T: int,
               ) -> tuple[float, Caller, list[Slot]] | None:
    """(the largest difference from handformer's, its caller, its slots) of the attention built with
    `context` as its context size and run on T tokens; None where it cannot be built, mapped or run so."""
    sizes = {**ctx_sizes(), "max_len": context, "causal": s.causal_inside}
    x = fp.randn(2, T, D, seed=8)
    try:
        with ctx.sizes_set(comp, sizes):
            module = ctx.build(comp, sizes, warmup=lambda m: caller(m).call(x, x, x, None))
            c = caller(module)
            c.state.update(s.c.state)  # the convention of a mask it requires
            out = fp.first_tensor(ctx.learner.call("forward", c.call, x, x, x, None), 3)
        linears, qk_norms = _projections(comp, module, H)
        one = x[:, :1]
        find_layouts_(module, lambda: fp.first_tensor(c.call(one, one, one, None), 3), D, D // H)
        slots = attention_slots(linears, D, 1, comp.name)[0] + qk_norms
    except (fp.LearnerFailure, MappingError):
        return None
    hf = handformer_attention(slots, kv_heads_of(slots, H), heads=H, softcap=s.softcap)
    mask = window_keep(T, s.window)[None, None] if s.causal_inside else None
    return then(out, lambda o: (fp.max_error(o, hf(x, x, x, mask, need_weights=True)[0]), c, slots))


def _localized_distinct(res: ComponentResult, comp: Component, c: Caller, s: Setup, slots: list[Slot],
                        ) -> None:
    """Where the attention built with 2 heads of 8 first parts from the reference, when only those
    sizes show a mistake (a size read from the wrong axis: the heads for the head size): its line."""
    if res.has(DEPARTS):  # already localized at check's sizes
        return
    w = mha_weights(slots, DISTINCT_HEADS, None, s.rope)
    filename = inspect.getsourcefile(comp.obj)
    note_departure(res, lambda: localize_attention([(visible_call(c, s.conv), s.rope)], w, filename,
                                                   s.causal_inside))


def _turned(width: int) -> tuple[Tensor, Tensor] | None:
    """The rotary tables (cos, sin), (1, 1, DISTINCT_T, width) each, that turn the first `width` dims of
    each head (half-split pairs within them); None for none."""
    if width == 0:
        return None
    cos, sin = RotaryEmbedding(width, MAX_LEN)(torch.arange(DISTINCT_T)[None])
    return cos.double(), sin.double()


PAD_KEYS = 3  # row 1's first keys are padding (left padding: later queries of every kind see them)
# what the padded positions are changed by: a vector of many values, which a norm before the attention
# keeps (5.0 added to every feature is what a LayerNorm takes away: a pre-norm layer never saw it)
@functools.cache
def pad_bump() -> Tensor:
    """(PAD_KEYS, D): made when first asked, not at import (the fork server computes nothing: zygote.py)."""
    return 5.0 * fp.randn(PAD_KEYS, D, seed=46)
# the forms of a key padding mask tried: torch.nn's two, (B, S) True = padding or 0 / -inf added, and
# True = keep (a layer of its own that reads it so); the one that hides the padding counts
KEY_PADDING_FORMS = (lambda pads: pads, lambda pads: torch.zeros(pads.shape).masked_fill(pads, -math.inf),
                     lambda pads: ~pads)


def _key_padding_alone(res: ComponentResult, ctx: Context, s: Setup) -> None:
    """Each key_padding_mask the forward takes beside the mask it is handed (torch.nn's
    MultiheadAttention: attn_mask and key_padding_mask), given alone in torch.nn's forms: changing
    the keys and values it marks as padding must change no real query's output."""
    names = [p.name for p in forward_parameters(s.module)
             if "key_padding_mask" in p.name and p.name != s.c.mask_name]
    res.checks += [key_padding_check(name, ("keys and values", "被填充的键和值"),
                                     lambda form, name=name: _padding_alone_moved(ctx, s, name, form))
                   for name in names]


def key_padding_check(name: str, padded: tuple[str, str],
                      moved_in: Callable[[Callable[[Tensor], Tensor]], float]) -> Check:
    """The check of a key_padding_mask `name` given alone, in each of KEY_PADDING_FORMS: changing what it
    marks as padding (`padded`, en and zh) moves no real output (`moved_in(form)`) in the form that
    hides it best."""
    moved = min(map(moved_in, KEY_PADDING_FORMS))
    return Check(text(
        f"{name} alone ((B, S): True = padding as torch.nn takes it, 0 / -inf, or True = keep): "
        f"changing the padded {padded[0]} changes no real output",
        f"只给 {name}（(B, S)：torch.nn 的 True = 填充、0 / -inf，或 True = 可以看）："
        f"改变{padded[1]}，不影响真实位置的输出"), moved < 1e-9,
        text(f"outputs moved by {moved:.3g}: the padding it marks is not applied",
             f"输出变化了 {moved:.3g}：它标出的填充没有被用上"))


def left_padding(B: int = 2, T: int = 7) -> Tensor:
    """(B, T) bool, True = padding: row 1's first PAD_KEYS positions."""
    pads = torch.zeros(B, T, dtype=torch.bool)
    pads[1, :PAD_KEYS] = True
    return pads


def _padding_alone_moved(ctx: Context, s: Setup, name: str, form: Callable[[Tensor], Tensor]) -> float:
    """How far real queries' outputs move in self-attention when the padded positions change, the
    padding given as `name` alone in `form`; inf when the attention does not take that form."""
    pads = left_padding()
    x = fp.randn(*pads.shape, D, seed=44)
    bumped = x.clone()
    bumped[1, :PAD_KEYS] += pad_bump()
    s.c.state["more"] = {name: form(pads)}
    counts = ctx.learner.calls, ctx.learner.nan_calls  # a form read the other way round gives NaN: not theirs
    try:
        a, b = (fp.first_tensor(ctx.learner.call("forward", s.c.call, v, v, v, None), 3) for v in (x, bumped))
    except fp.LearnerFailure:
        return math.inf
    finally:
        s.c.state.pop("more")
        ctx.learner.calls, ctx.learner.nan_calls = counts
    # NaN on real queries (a form read the other way round hides all their keys): that form is not taken
    return float(torch.tensor(moved_by(a, b, ~pads)).nan_to_num(nan=math.inf))


def one_head_at_a_time(w: V.MHAWeights, x: Tensor) -> Tensor:
    """softmax(Q_i K_i^T / sqrt(Dh)) V_i for each head i on its own slice of the weights, then
    concat and W_O: the paper's formula written without any reshape."""
    Dh = D // w.n_heads
    heads = []
    for i in range(w.n_heads):
        rows = slice(i * Dh, (i + 1) * Dh)
        q, k, v = (V.linear(x, _head_rows(p, rows)) for p in (w.q, w.k, w.v))  # (B, T, Dh) each
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(Dh), dim=-1)  # (B, T, T)
        heads.append(weights @ v)  # (B, T, Dh)
    return V.linear(torch.cat(heads, dim=-1), w.o)  # (B, T, D)


def _head_rows(p: V.Linear, rows: slice) -> V.Linear:
    """One head's rows of a projection's (weight, bias)."""
    weight, bias = p
    return weight[rows], then(bias, lambda b: b[rows])


def _tutorial_shapes(res: ComponentResult, ctx: Context, comp: Component, c: Caller, sizes: dict[str, Any],
                     ) -> None:
    """The tutorial's own example: (2, 10, 512) in, (2, 10, 512) out, weights (2, 8, 10, 10)."""
    x = torch.randn(2, 10, 512, generator=torch.Generator().manual_seed(0))
    tutorial = {**TUTORIAL, **({"n_kv_heads": 2} if "n_kv_heads" in sizes else {})}
    dh = TUTORIAL["d_model"] // TUTORIAL["n_heads"]
    module = ctx.build(comp, tutorial, checked=False, warmup=lambda m: caller(m, dh).call(x, x, x, None))
    tc = caller(module, dh)
    tc.state.update(c.state)  # the convention of a mask it requires
    with torch.no_grad():
        raw = ctx.learner.call("forward", tc.call, x, x, x, None)
    out, weights = fp.first_tensor(raw, 3), fp.weights_of(raw)
    ok = out is not None and tuple(out.shape) == (2, 10, 512) and (
        weights is None or tuple(weights.shape) == (2, 8, 10, 10))
    got = shape_of(raw)
    res.checks.append(Check(text("shapes as the tutorial states: (2, 10, 512) -> (2, 10, 512), weights "
                                 "(2, 8, 10, 10)", "形状与教程一致：(2, 10, 512) -> (2, 10, 512)，注意力权重 "
                                 "(2, 8, 10, 10)"), ok, text(f"got {got}", f"实际得到 {got}")))


GQA_HEADS = 2  # key/value heads of an attention whose config names them, of its H query heads


def check_causal_attention(comp: Component, ctx: Context) -> ComponentResult:
    """A causal attention; one whose config names its key/value heads (Gemma's, Llama's) is built with
    2 of its 4 heads, where a repeat that tiles the heads instead of interleaving them shows."""
    kv_heads = GQA_HEADS if reads_kv_heads(comp.obj) else None
    return check_mha(comp, ctx, causal_inside=True, n_kv_heads=kv_heads)
