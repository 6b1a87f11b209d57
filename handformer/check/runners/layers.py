"""Runners for the layers: encoder layer, decoder layer, decoder-only block, and d2l's AddNorm.

The learner's parameters are mapped by shape and definition order: the attentions' W_Q, W_K, W_V,
W_O in order (W_K and W_V narrower with grouped-query attention), the FFN's matrices, the norms one
per sublayer in order. The fingerprint search then runs over the norm placement (post, the paper's,
or pre), rotary positions inside the attention (when the code speaks of them), the attention
mistakes and the layer mistakes (residual missing or started from the normed input, one sublayer's
norm misplaced or shared, FFN activation missing, the decoder's masks swapped). A property test on
the residual stream names dropout on it. A `key_padding_mask` the forward takes beside the masks it is
handed (torch.nn's names) is given alone too: the keys it marks must change no real output.

d2l's decoder block, forward(X, state), builds its causal mask only in training mode (it decodes one
token at a time in eval mode, keeping the keys in `state`): it is run in training mode with dropout
switched off, and step by step in eval mode.

Shape legend: B batch, T target length, S source length, D d_model, H heads, F FFN width.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import input_roles, names_of
from handformer.check.core.context import (
    ROPE_FLAGS,
    SEQUENCE_FIRST,
    SIZES,
    TUTORIAL,
    Context,
    D,
    H,
    attention_flags,
    batch_first,
    causal,
    causal_mask_named,
    check_determinism,
    dropout_on_residual,
    error_text,
    finish,
    first_working,
    form_text,
    forward_parameters,
    grads_error,
    guarded,
    hidden_rows,
    holds_torch_attention,
    is_mask_name,
    is_mask_param,
    masked_rows,
    masks_where_true_inside,
    moved_by,
    nan_on_hidden_rows,
    not_cropped,
    optional_inputs,
    outputs_by_convention,
    positions,
    reads_sequence_first_masked,
    shape_of,
)
from handformer.check.core.conventions import ONE_ATTN_MASK, SEQUENCE_FIRST_CONVENTIONS, SHARED
from handformer.check.core.defaults import then
from handformer.check.core.discovery import MEMORY_NAMES, NAMES, Component, argument_keys
from handformer.check.core.fused_qkv import find_layouts_
from handformer.check.core.gains import fold, folded_gains, gain_note
from handformer.check.core.global_window import check_global, global_inputs, global_names
from handformer.check.core.kept_state import gradient_error, snapshot, written
from handformer.check.core.layer_map import Gainless, block_norms, gainless_norms, gainless_qk
from handformer.check.core.localize_kinds import localize_add_norm, note_departure
from handformer.check.core.moe import ffn_readings, moe_config, moe_note, outside_moe
from handformer.check.core.probe import Found as Explained
from handformer.check.core.probe import Probe, Subject, name_findings, run_probe
from handformer.check.core.residual_wrapper import residual_wrapper, wrapped_note
from handformer.check.core.result import (
    DEPARTS,
    DIFFERS,
    Check,
    ComponentResult,
    Finding,
    Text,
    text,
)
from handformer.check.core.rope_tables import (
    alibi_argument,
    position_kwargs,
    renamed_table,
    with_positions,
    with_tables,
)
from handformer.check.core.rotary import rope_layouts, rope_tables
from handformer.check.core.score_scale import PLAIN, Form, layer_forms, scale_note, smallest_holder
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.core.unmapped import held_apart
from handformer.check.core.weights import (
    Leaf,
    MappingError,
    Slot,
    attention_slots,
    by_sublayer,
    copy_ffn,
    copy_weights,
    ffn_weights,
    has_down_projection,
    is_gated,
    kv_heads_of,
    leaves,
    mha_weights,
    no_unreferenced_parts,
    norm_slots,
    norm_weights,
    of_kind,
    positive_eps,
    relative_bias_slots,
    sink_slots,
    split_attention_ffn,
)
from handformer.check.core.windows import own_window, window_found, window_inputs, window_keep, window_note
from handformer.check.core.written_order import sequence_findings
from handformer.check.reference import variants as V
from handformer.check.reference.parallel import as_parallel_
from handformer.check.reference.remembered import remembering
from handformer.check.runners import generate_lossy as lossy
from handformer.check.runners.attention import (
    PAD_KEYS,
    attention_cap,
    causal_outputs,
    key_padding_check,
    left_padding,
    pad_bump,
    responsive,
    shares_mask,
    softcap_note,
)
from handformer.check.runners.generate_loop import CACHE_NAMES
from handformer.check.runners.pieces import (
    FFN_ACTIVATIONS,
    HF_NAME,
    OFFSET_NOTE,
    built_activation,
    ffn_activations,
    ffn_name_findings,
    plain_activation_,
)
from handformer.config import BlockConfig
from handformer.families.gemma import SandwichBlock
from handformer.families.granite import GraniteBlock
from handformer.families.olmo import ReorderedNormBlock
from handformer.nn.blocks import DecoderLayer, DecoderOnlyBlock, EncoderLayer

# the rotary layouts a layer handed these tables may use: nanochat's halves rotated either way, llama2.c's
# one angle a pair (interleaved, as Meta's)
GIVEN_ROPES = {"cos_sin": ("half", "swapped"), "freqs_cos": ("interleaved", "half")}
KV_HEADS = 2  # key/value heads a layer is built with when its constructor asks for them
SANDWICH = {(4, 2): ("sandwich",)}  # (norms, sublayers) -> the placements tried: Gemma 2/3's four norms


@dataclass(frozen=True)
class LayerKind:
    """One kind of layer as data: handformer's layer it is compared with, the norm placements the
    search tries (the tutorials' first), its sublayers and what the report calls each, the
    tutorial's example (T, the attention weights' shape, the words), how the reference variants
    compute it (`variant`: layer, weights, inputs, flags, trace) and how handformer's layer is called
    (`handformer`: the layer, x, memory, the source and target masks, the rotary layout)."""

    reference: type[nn.Module]
    placements: tuple[str, ...]
    decoder: bool
    causal_block: bool
    sublayers: tuple[list[str], list[str]]
    tutorial: tuple[int, tuple[int, ...], str]
    variant: Callable[..., Tensor]
    handformer: Callable[..., Tensor]

    @property
    def expected(self) -> str:
        return self.placements[0]
# the position arguments a layer's forward may take (rope_tables.POSITION_ARGUMENTS: what each is handed)
LAYER_POSITIONS = {"freqs_cis", "start_pos", "position_ids", "positions", "position_embeddings", "cos", "sin",
                   "input_pos", "cos_sin", "freqs_cos", "freqs_sin"}


class Layer:
    """The learner's layer, its mapping, and a uniform call (x, memory, src_keep, tgt_keep)."""

    more: dict[str, Any] = {}  # further arguments a check hands the forward (a key_padding_mask alone)
    marked: Tensor | None = None  # Longformer's global marks (B, T) handed while set; None: all global
    first = False  # it reads its stream sequence-first, (T, B, D) (found by _check_layer)
    window = 2 ** 31  # the sliding window of a causal mask it builds itself (Mistral's), measured; else none
    unbatched = False  # it takes one sequence (T, D), no batch (gpt-oss's): driven sequence by sequence
    kept: tuple[str, bool] | None = None  # its required padding mask, handed as ones (name, bool or float)

    def __init__(self, comp: Component, ctx: Context, kind: LayerKind) -> None:
        self.comp, self.ctx, self.kind = comp, ctx, kind
        self.decoder, self.causal_block = decoder, causal_block = kind.decoder, kind.causal_block
        params = forward_parameters(comp.obj.forward) if inspect.isclass(comp.obj) else []
        self.renamed, params = renamed_table(_call_module, params, comp.obj)  # freqs_complex: freqs_cis
        self.params = params
        self.head_dim = D // H  # for Meta's freqs_cis handed to the forward
        self.stateful = decoder and any(p.name == "state" for p in params)  # d2l's forward(X, state)
        self.masks = [] if self.stateful else [p.name for p in params if is_mask_param(p.name, comp.obj)]
        # Raschka's forward(x, mask, cos, sin) requires its mask: where a case hands none, every key
        # is visible in the convention found (`visible`, once known)
        self.required_mask = any(p.name in self.masks and p.default is p.empty for p in params)
        self.padding, self.handed, self.unpadded = _mask_roles(comp.obj, self.masks, names_of(params)[1])
        self.visible: str | None = None
        self.extra = {p.name for p in params} & LAYER_POSITIONS
        self.optional = optional_inputs(getattr(comp.obj, "forward", comp.obj),  # not self, nor a memory
                                        params[1 + decoder:], self.extra, True)
        self.table_layout: dict[str, bool] = {}  # which rotary table and start run (rope_tables)
        self.takes_mask = bool(self.masks)
        # _stepwise: a cache kept inside (Umar Jamil's); one handed in (a `cache` argument) is left out
        self.stepwise = causal_block and "start_pos" in self.extra and not self.masks and not any(
            p.name in CACHE_NAMES for p in params)
        self.sizes = layer_sizes(comp.obj)
        x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0))
        self.module = ctx.build(comp, self.sizes, warmup=lambda m: self._warmup(m, x))
        self.unbatched = _one_sequence(self, x)
        found = no_unreferenced_parts(leaves(self.module), D // H)  # Shaw's tables, per-head q/k gains
        self.cap = attention_cap(self.module)  # Gemma 2's scores soft-capped, read from its setting
        linears = split_attention_ffn(of_kind(found, "linear"), D, D // H)
        names = self.sublayers = kind.sublayers[0]
        self.n_kv_heads, self.attn = self._attentions(outside_moe(self.module, linears), len(names) - 1)
        self.ffn_candidates = ffn_readings(self.module, linears, self.sizes["d_ff"], comp.name)
        self._fold_gains(of_kind(found, "gain"))  # LayerScale: into W_O's and W_down's rows
        norms, qk = block_norms(of_kind(found, "norm"))
        self.attn[0] += qk or gainless_qk(self.module)  # QK-norm: the attention's q_norm and k_norm
        self.attn[0] += relative_bias_slots(of_kind(found, "embedding"), H)  # T5's relative-position table
        self.attn[0] += sink_slots(of_kind(found, "scalar"), H)  # gpt-oss's attention sinks
        self._read_norms(norms, kind)
        self.ropes = GIVEN_ROPES.get(min(self.extra & set(GIVEN_ROPES), default="")) or rope_layouts(
            self.module, "freqs_cis" in self.extra, bool({"position_embeddings", "cos"} & self.extra))

    def _fold_gains(self, gains: list[Leaf]) -> None:
        """Per-channel gains on the sublayers' outputs folded into their output projections' rows, in
        every FFN reading (gains.fold)."""
        readings = [fold(gains, [*self.attn, ffn], self.comp.name) for ffn in self.ffn_candidates or [[]]]
        self.attn = readings[0][:-1]
        self.ffn_candidates = [r[-1] for r in readings][:len(self.ffn_candidates)]

    @property
    def masks_itself(self) -> bool:
        """A causal block handed no mask: it builds its causal mask itself."""
        return self.causal_block and not self.takes_mask

    @property
    def masks_handed(self) -> bool:
        """It takes a mask, or is a decoder that takes the source's keys (not tiny-universe's
        DecoderLayer.forward(x, enc_out)): the convention of the masks handed to it matters."""
        return self.takes_mask or self.decoder and not self.bare

    def _read_norms(self, norms: list[Leaf], kind: LayerKind) -> None:
        """The norms' slots: one a sublayer, one for every sublayer (shared), or Gemma 2/3's four of a
        block, before and after each sublayer (then the one placement they are read in)."""
        names, roles = kind.sublayers
        norms = norms or gainless_norms(self.module, len(names))  # nanochat's norm(x), a function
        self.shared = len(norms) == 1  # one norm for every sublayer
        norms = by_sublayer(norms, [*self.attn, self.ffn_candidates[0]])
        self.norm_slots = norm_slots(norms * len(names) if self.shared else norms, len(names), roles,
                                     self.comp.name, sandwich=kind.causal_block)
        self.placements = SANDWICH.get((len(self.norm_slots), len(names)), kind.placements)
        self.norm_ws = list(map(norm_weights, self.norm_slots))

    def _attentions(self, linears: list[Leaf], count: int) -> tuple[int | None, list[list[Slot]]]:
        """The attentions' slots, a fused projection read in the layout its one-token output shows,
        and the key/value heads (those its shapes show where the constructor names none)."""
        find_layouts_(self.module, self._one_token(fp.randn(2, 1, D, seed=3)), D, D // H)
        return _attentions(linears, count, self.comp.name)

    def _one_token(self, one: Tensor) -> Callable[[], Tensor | None]:
        """The layer on one token (B, 1, D); where it requires its mask (BLOOM's block(x, alibi, mask)),
        that one key visible in the first convention it runs with (a softmax over one key is 1 in any)."""
        def run() -> Tensor | None:
            for conv in self.ctx.conventions(self.masks[0]) if self.required_mask else (None,):
                self.visible = conv
                out = fp.quietly(lambda: fp.first_tensor(self.call(one, one, None, None), 3))
                self.visible = None
                if fp.max_error(out, out) == 0.0:  # (inf for none, or a NaN)
                    return out
            return None
        return run

    @property
    def alibi(self) -> bool:
        """Whether it takes ALiBi's term (BLOOM's block(x, alibi, mask)): handed check's."""
        return "alibi" in names_of(self.params)[0]

    @functools.cached_property
    def windows(self) -> dict[str, Any]:
        """What a window it takes with no default is handed: one over the whole sequence (nanochat's
        window_size)."""
        return window_inputs(self.comp.obj, self.params)

    @functools.cached_property
    def forms(self) -> list[Form]:
        """The readings of the numbers it takes from its settings (score_scale.layer_forms)."""
        return layer_forms(self.module, self.attn[0])

    @property
    def bare(self) -> bool:
        """A decoder layer whose forward takes the stream and the memory alone (tiny-universe's
        forward(x, enc_out)): it builds its causal mask and hides no source key."""
        width = len(self.params) - len(self.extra | self.optional | set(self.windows))  # self, x, memory: 3
        return self.decoder and not self.stateful and width == 3

    @functools.cached_property
    def wrapper(self) -> Any:
        """lucidrains' Residual(Block(...)): the wrapper that adds the residual of a block of one input
        outside it, where its file has one; else None."""
        return residual_wrapper(self.comp.obj) if len(self.params) == 2 else None

    @property
    def target_mask_only(self) -> bool:
        """A decoder layer handed its target's mask alone (CS231n's forward(tgt, memory, tgt_mask)): every
        position of the memory is visible, as a captioner's image features are."""
        return self.decoder and _decoder_mask_names(self.masks) == (None, *self.masks)

    @property
    def memory_name(self) -> str | None:
        """A decoder's forward argument that takes the encoder's output by its name (Hugging Face's
        encoder_hidden_states, after the mask), else None: it is handed second."""
        return next((p.name for p in self.params[1:] * self.decoder if p.name in MEMORY_NAMES), None)

    @property
    def own_mask(self) -> bool:
        """A decoder layer that builds its causal mask: d2l's stateful one, a bare one, or one handed
        the source's mask alone (d2l's forward(X, enc_outputs, enc_valid_lens))."""
        return self.stateful or self.bare or self.decoder and _decoder_mask_names(self.masks)[1:] == (None,) \
            and len(self.masks) == 1

    def _warmup(self, module: nn.Module, x: Tensor) -> Any:
        self.module = module
        return self.call(x, x, None, None)

    def call(self, x: Tensor, memory: Tensor | None, src: Tensor | None, tgt: Tensor | None) -> Any:
        src, tgt = fp.mask_like(src, x), fp.mask_like(tgt, x)  # fairseq's `scores + attn_mask`: x's dtype
        if self.stateful:  # d2l: state = [enc_outputs, enc_valid_lens, one cache slot a block]
            self.module.train()  # its causal mask exists in training mode only (dropout is off here)
            try:
                return self.module(x, [memory, src, [None]])
            finally:
                self.module.eval()
        args = self._streams(x, memory)
        kwargs = self._extra_kwargs(x)
        if self.memory_name:  # HF's forward(x, mask, encoder_hidden_states): the memory by its name
            kwargs[self.memory_name] = args.pop()
        if self.decoder:
            src_name, tgt_name = _decoder_mask_names(self.masks)
            if src_name and tgt_name:
                kwargs.update({src_name: src, tgt_name: tgt})
            elif src_name and self.own_mask:  # d2l's forward(X, enc_outputs, enc_valid_lens)
                kwargs[src_name] = src
            elif self.target_mask_only:
                kwargs[tgt_name] = tgt
            elif not self.own_mask:
                args += [src, tgt]
        elif self.masks:
            mask = tgt if self.causal_block else src
            if mask is None and self.required_mask and self.visible:
                everything = torch.ones(x.size(0), 1, x.size(1), x.size(1), dtype=torch.bool)
                mask = fp.encode_mask(everything, self.visible, x.size(0))
            kwargs.update(dict.fromkeys(self.handed, mask))
        return self._run(args, kwargs, x.size(0))

    def _streams(self, x: Tensor, memory: Tensor | None) -> list[Any]:
        """The forward's leading inputs: x, then a decoder's memory; where the forward names them as an
        attention's (Persson's TransformerBlock.forward(value, key, query, mask) and DecoderBlock.forward(x,
        value, key, src_mask, trg_mask)), x for each, but a decoder's keys and values the memory."""
        roles = input_roles([p.name for p in self.params[1 + self.decoder:]])
        if not self.decoder:
            return [x] * max(1, len(roles))
        return [x] + [{"q": x}.get(role, memory) for role in roles or "k"]

    def _run(self, args: list[Any], kwargs: dict[str, Any], B: int) -> Any:
        """The module on args, its rotary table in the form it takes, start_pos 0 or one a row
        (rope_tables), or one token at a time (_stepwise); sequence-first, (T, B, D), when it reads so."""
        if self.first:  # PyTorch's tutorial: the stream and the memory (T, B, D) in, the output out
            args = list(map(batch_first, args))  # (B, T, D) -> (T, B, D): one transpose either way
            if self.memory_name in kwargs:  # fairseq's encoder_out, by its name
                kwargs[self.memory_name] = batch_first(kwargs[self.memory_name])
            return batch_first(with_positions(self._module, args, kwargs, self.table_layout, B))
        if self.stepwise:
            return _stepwise(lambda *a, **k: with_tables(self._module, list(a), k, self.table_layout, B),
                             args, kwargs)
        if self.unbatched:  # each sequence (T, D) alone, the outputs stacked (B, T, D)
            return torch.stack([fp.first_tensor(self._module(*row, **kwargs), 2) for row in zip(*args)])
        return with_positions(self._module, args, kwargs, self.table_layout, B)

    def _module(self, *args: Any, **kwargs: Any) -> Any:
        """The learner's module (inside the wrapper that adds its residual, where its file has one), its
        rotary table named freqs_complex when it calls it so (Umar Jamil's)."""
        module = self.module if self.wrapper is None else self.wrapper(self.module)
        return self.renamed(module, *args, **kwargs)

    def _extra_kwargs(self, x: Tensor) -> dict[str, Any]:
        heads = x.size(-1) // self.head_dim  # H, or the tutorial's 8 at its d_model 512
        alibi = {"alibi": alibi_argument(x.size(0), heads, x.size(1), x.dtype)} if self.alibi else {}
        positions = position_kwargs(self.extra, *x.shape[:2], self.head_dim, x.dtype)
        kept = {self.kept[0]: torch.ones(x.shape[:2], dtype=torch.bool if self.kept[1] else x.dtype)
                } if self.kept else {}  # (B, T): every token real
        marks = global_inputs(global_names(self.params), *x.shape[:2], self.marked)  # Longformer's
        unpadded = dict.fromkeys(self.unpadded, torch.zeros(x.shape[:2], dtype=torch.bool))  # (B, T): none
        return {**dict.fromkeys(self.optional), **positions, **self.windows, **unpadded, **self.more, **alibi,
                **kept, **marks}

    def weights(self, slots: list[Slot], act: str, placement: str, rope: str | None = None,
                form: Form = PLAIN) -> V.LayerWeights:
        attn = mha_weights(self.attn[0], H, self.n_kv_heads, rope)
        attn = dataclasses.replace(attn, scale=form.scale, softcap=self.cap)
        return V.LayerWeights(attn, ffn_weights(slots, act), self.norm_ws,
                              mha_weights(self.attn[1], H, self.n_kv_heads) if self.decoder else None,
                              placement, self.sublayers, form.residual, folded_gains([*self.attn, slots]))


# an argument a forward passes on as torch.nn's key padding mask (B, S), True = padded
PASSED_AS_PADDING = r"key_padding_mask\s*=\s*(\w+)"


def key_padding_masks(obj: Any, masks: list[str]) -> list[str]:
    """The mask arguments that are a key padding mask (B, S): named so (torch.nn's src_key_padding_mask),
    or passed on as one (forward(x, causal_mask, padding_mask) calling nn.MultiheadAttention(...,
    attn_mask=causal_mask, key_padding_mask=padding_mask))."""
    passed = set(re.findall(PASSED_AS_PADDING, source_text(getattr(obj, "forward", obj))))
    return [m for m in masks if "key_padding_mask" in m or m in passed]


def _mask_roles(obj: Any, masks: list[str], required: list[str]) -> tuple[list[str], list[str], set[str]]:
    """Its key padding masks (B, S), handed apart (`_key_padding`'s); the masks handed the attention's mask
    (the first, and each other it requires: Gemma 2's causal_mask and sliding_mask, it picks one); the
    required padding masks handed none padded."""
    padding = key_padding_masks(obj, masks)
    attn = [m for m in masks if m not in padding] or masks
    handed = attn[:1] + sorted(set(attn[1:]) & set(required))
    return padding, handed, set(required) & set(padding) - set(handed)


def _call_module(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def _stepwise(run: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Tensor:
    """The block on x (B, T, D) one token at a time, token t at start_pos t with its row of the
    rotary table: (B, T, D), each step through the block's own KV cache. A block with a start position
    and no mask (Umar Jamil's Llama: a KV cache, no causal mask) is causal only so."""
    x, outs = args[0], []
    for t in range(x.size(1)):
        step = {**kwargs, "start_pos": t}
        if "freqs_cis" in step:
            step["freqs_cis"] = step["freqs_cis"][t:t + 1]  # (1, Dh/2)
        outs.append(fp.first_tensor(run(x[:, t:t + 1], *args[1:], **step), 3))
    return torch.cat(outs, dim=1)  # (B, T, D)


STEPWISE_NOTE = text("it takes start_pos and no mask (a KV cache, one token at a time): driven one token at "
                     "a time through its own cache, token t at start_pos t, and compared position by "
                     "position; gradients not compared (its cache is written in place)",
                     "它接受 start_pos、不接受掩码（KV 缓存，一次一个 token）：检查时一次输入一个 token，"
                     "经过它自己的缓存，位置 t 的 token 用 start_pos t，逐位置比较；不比较梯度"
                     "（它的缓存是原地写入的）")


def layer_sizes(cls: Any) -> dict[str, Any]:
    """The sizes a layer is built with: grouped-query key/value heads only when it asks for them."""
    keys = argument_keys(cls) if inspect.isclass(cls) else {}
    wants_kv = "n_kv_heads" in keys.values() or any(n.lower() in ("config", "args", "model_args", "cfg")
                                                     for n in keys)
    return {**SIZES, **({"n_kv_heads": KV_HEADS} if wants_kv else {})}


def _attentions(linears: list[Any], count: int, what: str) -> tuple[int | None, list[list[Slot]]]:
    """The key/value heads and the attentions' slots: W_K and W_V as wide as W_Q (or as a fused
    multi-query projection's shape says), else grouped-query (KV_HEADS heads)."""
    try:
        slots = attention_slots(linears, D, count, what)
        return kv_heads_of(slots[0], H), slots
    except MappingError:
        try:
            return KV_HEADS, attention_slots(linears, D, count, what, KV_HEADS * (D // H))
        except MappingError:
            pass
        raise


# torch.nn's convention (True = masked) in the ranks to try: as nn.MultiheadAttention takes its masks
# when the layer holds one, else rank 4, 3 and 2
TORCH_CONVENTIONS = {True: ("torchn",), False: ("torch", "torch3", "torch2")}


def _torch_rows(layer: Layer, conv: str) -> bool:
    """Whether a fully masked query's NaN is torch.nn's own: the layer holds an nn.MultiheadAttention,
    or takes torch.nn's masks (True = masked, filled with -inf, as nn.MultiheadAttention does)."""
    return holds_torch_attention(layer.module) or conv.startswith("torch")


TORCH_NAN_NOTE = text("rows whose keys are all masked come out NaN, as torch's nn.MultiheadAttention gives "
                      "them with its masks (True = masked; its documented behaviour; such a row comes only "
                      "from a sentence that is all padding): a convention, not compared, not charged",
                      "所有键都被屏蔽的行输出 NaN，和 torch 的 nn.MultiheadAttention 用它的掩码"
                      "（True = 屏蔽）时一样（这是它文档里写明的行为；只有整句都是填充时才会出现这样的行）："
                      "是约定，不比较，不算错误")


def _torch_nan_note(res: ComponentResult, out: Tensor | None, rows: Tensor | None, comp: Component,
                    ctx: Context) -> None:
    values = hidden_rows(out, rows)
    if values is not None and bool(torch.isnan(values).any()) and TORCH_NAN_NOTE not in res.notes:
        res.notes.append(TORCH_NAN_NOTE)


# a row whose keys are all masked and comes out NaN: a finding, or torch's own behaviour (noted)
NAN_ROWS = {False: nan_on_hidden_rows, True: _torch_nan_note}
MASKED_ROWS = {False: masked_rows, True: _torch_nan_note}


# the words of a decoder layer's source mask and target mask
SOURCE_MASK = re.compile("src|memory|enc|cross", re.I)
TARGET_MASK = re.compile("tgt|trg|self|look|causal|dec|target|sub|slf", re.I)
# a padding mask is the source's unless it names the target (torch.nn's tgt_key_padding_mask)
SOURCE_PADDING = re.compile("^(?!.*(?:tgt|trg|self|look|causal|dec|target|sub|slf)).*pad", re.I)


def _decoder_mask_names(masks: list[str]) -> tuple[str | None, str | None]:
    src = next(filter(SOURCE_MASK.search, masks), None) or next(filter(SOURCE_PADDING.search, masks), None)
    tgt = next((m for m in masks if m != src and TARGET_MASK.search(m)), None)
    others = set(masks) - {src}
    if len(others) == 1 < len(masks):  # HF's attention_mask beside encoder_attention_mask (or tgt itself)
        tgt = min(others)
    return src, tgt


# The mistakes the search may apply to a layer: each rule names the condition under which the layer
# can make them (its weights, the way it takes its masks) and the flags, in the search's order.
FlagRule = tuple[Callable[["Layer", V.LayerWeights], Any],
                 Callable[["Layer", V.LayerWeights], tuple[str, ...]]]
LAYER_FLAGS: tuple[FlagRule, ...] = (
    (lambda layer, w: True, lambda layer, w: attention_flags(w.self_attn.o is not None)),
    (lambda layer, w: w.self_attn.rope, lambda layer, w: ROPE_FLAGS + (
        ("qk_norm_after_rope",) if w.self_attn.qk_norm else ())),
    (lambda layer, w: w.self_attn.sinks is not None, lambda layer, w: ("sink_not_in_softmax",)),
    (lambda layer, w: getattr(w.ffn, "gate", None) is not None,  # (a mixture of experts has none)
     lambda layer, w: ("gated_act_after_product",)),
    (lambda layer, w: True, lambda layer, w: tuple(f"no_residual:{s}" for s in layer.sublayers + ["all"])
     + tuple(f"pre_norm:{s}" for s in layer.sublayers) + ("ffn_no_activation",)),
    (lambda layer, w: w.placement in ("pre", "sandwich"),
     lambda layer, w: tuple(f"residual_from_normed:{s}" for s in layer.sublayers + ["all"])),
    (lambda layer, w: w.placement == "sandwich",
     lambda layer, w: tuple(f"sandwich_norm_missing:{s}" for s in layer.sublayers)),
    (lambda layer, w: not layer.shared, lambda layer, w: ("shared_norm:first", "shared_norm:last")),
    (lambda layer, w: layer.n_kv_heads, lambda layer, w: ("kv_repeat_order",)),
    (lambda layer, w: layer.decoder, lambda layer, w: ("decoder_masks_swapped",)),
    # valid lengths (d2l)
    (lambda layer, w: layer.stateful or layer.masks and fp.is_lengths_name(layer.masks[0]),
     lambda layer, w: ("mask_repeat_order",)),
    # a layer that builds its causal mask
    (lambda layer, w: layer.masks_itself or layer.own_mask,
     lambda layer, w: ("causal_off_by_one:no_self", "causal_off_by_one:sees_next")),
)


def _flags(layer: Layer, w: V.LayerWeights) -> tuple[str, ...]:
    return sum((flags(layer, w) for applies, flags in LAYER_FLAGS if applies(layer, w)), ())


def check_encoder_layer(comp: Component, ctx: Context) -> ComponentResult:
    """An encoder layer; one that takes no mask and is causal as it runs (a decoder-only block whose
    causal mask no word of its file shows: `arange(T)[:, None] >= arange(T)`) is checked as a block."""
    takes_mask = any(is_mask_name(p.name) for p in forward_parameters(comp.obj.forward))
    if not takes_mask and _runs_causal(Layer(comp, ctx, KINDS[comp.kind])):
        return _check_layer(dataclasses.replace(comp, kind="block"), ctx)
    res = _check_layer(comp, ctx)
    if comp.name in NAMES["block"] and takes_mask:  # no decoder's TransformerBlock (discovery.encoder_block)
        res.notes.append(ENCODER_BLOCK_NOTE)
    res.notes += [NO_MASK_NOTE] * (not takes_mask)
    return res


ENCODER_BLOCK_NOTE = text("checked as an encoder layer: its mask is optional and nothing in your file is "
                          "causal (no tril, triu or is_causal), so with no mask every token sees every other",
                          "按编码器层检查：它的掩码参数可以不传，文件里也没有任何因果的写法（没有 tril、triu "
                          "或 is_causal），所以不传掩码时每个 token 都能看到所有 token")
NO_MASK_NOTE = text("its forward takes no mask (a ViT block's): compared as an encoder layer where every "
                    "token sees every other; how it would apply a mask is not graded",
                    "它的 forward 不接收掩码（ViT 的 Block 就是这样）：按每个 token 都能看到所有 token 的"
                    "编码器层比较；它会怎样使用掩码，不在检查范围内")


def check_decoder_layer(comp: Component, ctx: Context) -> ComponentResult:
    return _check_layer(comp, ctx)


def check_block(comp: Component, ctx: Context) -> ComponentResult:
    from handformer.check.runners import latent  # a block on DeepSeek's latent attention: its own reference

    module = ctx.build(comp, layer_sizes(comp.obj))
    found = latent.read_block(module)
    return _check_layer(comp, ctx) if found is None else latent.check_latent_block(comp, ctx, module, found)


def _one_sequence(layer: Layer, x: Tensor) -> bool:
    """Whether the layer, whose forward takes x alone, refuses a batch (B, T, D) but runs on each
    sequence (T, D) alone (gpt-oss's blocks read x as (T, D) everywhere)."""
    if len(layer.params) > 2 or fp.quietly(lambda: layer.call(x, x, None, None)) is not None:  # self, x
        return False
    layer.unbatched = True
    runs = fp.quietly(lambda: layer.call(x, x, None, None)) is not None
    layer.unbatched = False
    return runs


class Inputs:
    """The search's inputs and masks (T == S: a layer that swaps its masks still runs, so the swap
    can be named)."""

    def __init__(self, layer: Layer) -> None:
        B, T, S = self.B, self.T, self.S = 2, 6, 6
        self.x, self.memory = fp.randn(B, T, D, seed=1), fp.randn(B, S, D, seed=2)
        self.src_keep, self.tgt_keep = _case_keeps(layer, B, T, S, [0, 2], [1, 0])


def causal_without_its_mask_(layer: Layer) -> bool:
    """Whether the layer is a block causal without its mask (`_causal_without_its_mask`): then it is
    driven with its mask argument left out."""
    if not _causal_without_its_mask(layer):
        return False
    layer.masks, layer.takes_mask = [], False
    return True


def causal_with_keys_kept_(layer: Layer) -> bool:
    """Whether the layer is a decoder-only block that requires a padding mask of its keys (B, S) and is
    causal handed one that hides none (a reward model's Block.forward(x, attention_mask), its causal
    mask built inside): then it is driven as a block that builds its own causal mask, handed that
    mask of real tokens only, ones as float or else as bool (`Layer.kept`)."""
    if not (layer.causal_block and layer.required_mask and len(layer.masks) == 1):
        return False
    masks = layer.masks
    layer.masks, layer.takes_mask = [], False
    for as_bool in (False, True):
        layer.kept = (masks[0], as_bool)
        if _runs_causal(layer):
            return True
    layer.masks, layer.takes_mask, layer.kept = masks, True, None
    return False


def _check_layer(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    layer = Layer(comp, ctx, KINDS[comp.kind])
    _down_projection(res, ctx, comp, layer)
    wrapped = [wrapped_note(layer.wrapper, comp.name)] if layer.wrapper is not None else []
    res.notes += wrapped + window_note(layer.windows) + list(map(softcap_note, filter(None, [layer.cap])))
    _mask_inside(res, layer)
    inp = Inputs(layer)
    own_mask = layer.masks_itself or layer.own_mask
    convs = _layer_conventions(layer, ctx, inp, res)

    @functools.cache  # the layer and inputs are set: each set of mistakes the search tries, once
    def search_rows(flags: frozenset[str]) -> Tensor | None:
        return _search_rows(layer, inp, flags)

    def run(conv: str) -> Tensor | None:
        src, tgt = _encode(layer, inp.src_keep, inp.tgt_keep, conv, inp.B)
        return fp.first_tensor(ctx.learner.call("forward", layer.call, inp.x, inp.memory, src, tgt), 3)

    if (ran := _working(res, layer, ctx, run, inp, convs)) is None:
        return finish(res)
    working, convs = ran
    layer.visible = working
    if layer.stateful:
        res.notes.append(STATEFUL_NOTE)
    else:
        check_determinism(res, ctx, comp, lambda: run(working), "mha", "ffn", "sdpa")
    with fp.dropout_off():
        found = _search(layer, ctx, run, inp, search_rows, convs[:1] if own_mask else convs)
        _report_layer(res, layer, ctx, run, inp, search_rows, found, working)
        _key_padding(res, layer, ctx)
        if global_names(layer.params) and found is not None and not found[6] and not layer.decoder:
            _global_window(res, ctx, layer, layer.weights(*found[1:6]))  # its reading, no mistake in it

    def shapes() -> None:
        with ctx.sizes_set(comp, TUTORIAL):  # their module-level sizes too, at the tutorial's
            _tutorial_shapes(res, layer, ctx)

    guarded(res, shapes)
    return finish(res)


def _global_window(res: ComponentResult, ctx: Context, layer: Layer, weights: V.LayerWeights) -> None:
    """Longformer's window and global tokens in an encoder layer (global_window.py), once it is graded
    with every token global; the layer's marks handed as `layer.marked` while it runs."""
    def run(x: Tensor, marked: Tensor) -> Tensor | None:
        layer.marked = marked
        try:
            return fp.first_tensor(ctx.learner.call("forward", layer.call, x, None, None, None), 3)
        finally:
            layer.marked = None
    guarded(res, lambda: check_global(res, run, lambda x, keep: V.encoder_layer(weights, x, keep), D,
                                      source_lines(ctx.objects(layer.comp))))


def _working(res: ComponentResult, layer: Layer, ctx: Context, run: Callable[[str], Tensor | None],
             inp: Inputs, convs: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """The first convention the layer runs with, and the conventions to search; None where a block
    that does not crop its context raised past its length (said in res). A decoder layer that runs
    with none of them is tried with its masks as fairseq's and torch.nn's layers take them, the
    source's padding (B, S) and one causal attn_mask (T, T) for the batch: its target is then given
    no padding (`inp` changed so, noted); the first failure stands where that does not run either."""
    try:
        return first_working(ctx, run, convs), convs
    except fp.LearnerFailure as failure:
        if layer.causal_block and not_cropped(res, ctx, layer.comp, layer.module, failure, inp.T):
            return None
        if not layer.decoder:
            raise
        inp.src_keep, inp.tgt_keep = _case_keeps(layer, inp.B, inp.T, inp.S, [0, 2], [0, 0])
        try:
            working = first_working(ctx, run, ONE_ATTN_MASK)
        except fp.LearnerFailure:
            raise failure from None
    res.notes.append(ONE_ATTN_MASK_NOTE)
    return working, ONE_ATTN_MASK


ONE_ATTN_MASK_NOTE = text(
    "it takes its target's causal mask as one (T, T) for the whole batch beside the source's padding "
    "(B, S), as fairseq's and torch.nn's decoder layers do (the target's padding a separate argument): "
    "checked with a target without padding",
    "它的目标端因果掩码是整个 batch 共用的一个 (T, T)，源端填充另给 (B, S)，"
    "和 fairseq、torch.nn 的解码器层一样（目标端的填充是另一个参数）：检查时目标端不加填充")


def _needs_its_mask(layer: Layer, ctx: Context) -> bool:
    """Whether a layer whose mask may be left out raises handed none (DistilBERT's attn_mask=None,
    read unguarded): then the tutorial's case hands it every key visible."""
    x = fp.randn(2, 3, D, seed=5)
    try:
        ctx.learner.call("forward", layer.call, x, x, None, None)
    except fp.LearnerFailure:
        return layer.takes_mask
    return False


def _handed_masks(layer: Layer) -> set[str]:
    """The mask arguments `Layer.call` fills: an encoder's first, a decoder's source and target masks."""
    if not layer.decoder:
        return set(layer.handed)
    names = _decoder_mask_names(layer.masks)
    return set(names) if all(names) else set(layer.masks[:2])


def _padded_stream(layer: Layer, name: str) -> str:
    """What a key_padding_mask pads: a decoder's memory (memory_key_padding_mask), else the layer's
    own input (src_key_padding_mask, tgt_key_padding_mask)."""
    return "memory" if layer.decoder and re.search("memory|src|enc", name) else "x"


def _key_padding(res: ComponentResult, layer: Layer, ctx: Context) -> None:
    """Each key_padding_mask the forward takes beside the masks it is handed (torch.nn's names),
    given alone in torch.nn's forms: changing the keys it marks as padding must change no real query's
    output. A layer that ignores it (padding reaching it only through another mask) fails."""
    names = [n for n in layer.padding if n not in _handed_masks(layer)]
    for name in names:
        stream = _padded_stream(layer, name)
        res.checks.append(key_padding_check(
            name, (f"{stream} positions", f" {stream} 中被填充的位置"),
            lambda form, name=name, stream=stream: _padding_moved(layer, ctx, name, stream, form)))


def _padding_moved(layer: Layer, ctx: Context, name: str, stream: str, form: Callable[[Tensor], Tensor],
                   ) -> float:
    """How far real queries' outputs move when the padded positions of `stream` change, the padding
    given as `name` alone in `form`; inf when the layer does not take that form."""
    pads = left_padding()
    given = {"x": fp.randn(*pads.shape, D, seed=44), "memory": fp.randn(*pads.shape, D, seed=45)}
    bumped = {**given, stream: given[stream].clone()}
    bumped[stream][1, :PAD_KEYS] += pad_bump()
    real = {"x": ~pads, "memory": torch.ones_like(pads)}[stream]  # the queries compared: the real ones
    layer.more = {name: form(pads)}
    try:
        a, b = (fp.first_tensor(ctx.learner.call("forward", layer.call, v["x"], v["memory"], None, None), 3)
                for v in (given, bumped))
    except fp.LearnerFailure:
        return math.inf
    finally:
        layer.more = {}
    # NaN (a form read the other way round hides every key of a row): that form is not taken
    return float(torch.tensor(moved_by(a, b, real)).nan_to_num(nan=math.inf))


def _causal_without_its_mask(layer: Layer) -> bool:
    """A decoder-only block whose mask argument can be left out (minimind's attention_mask=None, a
    padding mask) and that is causal without it: checked as a block that builds its own causal mask."""
    return bool(layer.causal_block and layer.masks and not layer.required_mask) and _runs_causal(layer)


def _runs_causal(layer: Layer) -> bool:
    """Whether the layer, given no mask, is causal: changing token 3 leaves outputs 0..2 unchanged and
    moves the rest."""
    x = fp.randn(1, 5, D, seed=3)
    y = x.clone()
    y[:, 3] += fp.randn(D, seed=4)  # not a constant: a LayerNorm first would take it away
    try:
        with torch.no_grad():
            a, b = (fp.first_tensor(layer.call(v, v, None, None), 3) for v in (x, y))
    except Exception:  # noqa: BLE001 - their error: the checks run it with a mask and report it
        return False
    # token 3 reaches token 4 too: the rows of a block that reads (T, B, D) as (B, T, D) never mix
    return (a is not None and a.shape == x.shape and not torch.allclose(a[:, 4], b[:, 4])
            and causal_outputs(a, b))


def _mask_inside(res: ComponentResult, layer: Layer) -> None:
    """A block causal with no mask is checked as one that builds its own, in its window if any."""
    res.notes += [CAUSAL_INSIDE_NOTE] * causal_without_its_mask_(layer)
    res.notes += [KEYS_KEPT_NOTE] * (not layer.masks_itself and causal_with_keys_kept_(layer))
    _sliding_window(res, layer)


def _sliding_window(res: ComponentResult, layer: Layer) -> None:
    """A block that builds its causal mask and lets each query see only its last W keys (Mistral's
    sliding window, i - W < j <= i): W measured (`own_window`), and the reference given the same
    window."""
    if not layer.masks_itself:
        return
    reach = own_window(lambda v: fp.first_tensor(layer.call(v, v, None, None), 3), D)
    if reach:
        layer.window = reach
        window_found(res, layer.module, reach)


# the flags causal_keep reads
CAUSAL_FORMS = frozenset({"causal_off_by_one:no_self", "causal_off_by_one:sees_next"})


def _own_causal(layer: Layer, T: int, flags: frozenset[str] = frozenset()) -> Tensor:
    """(T, T) bool, True = may attend: the causal mask a block builds itself, in its window if any
    (the same tensor each time: never written to)."""
    return window_keep(T, layer.window, frozenset(flags) & CAUSAL_FORMS)


KEYS_KEPT_NOTE = text("it requires a padding mask of its keys (B, S) and is causal handed one that hides "
                      "none: checked as a block that builds its own causal mask, handed a mask of real "
                      "tokens only (padding is checked with its attention)",
                      "它必须传入键的填充掩码 (B, S)，传入不遮任何键的掩码时它是因果的：按自己构造因果掩码的"
                      "块检查，传入的掩码全是真实 token（填充在它的注意力里检查）")
CAUSAL_INSIDE_NOTE = text("with no mask it is causal (changing token 3 leaves outputs 0..2 unchanged): "
                          "checked as a block that builds its own causal mask, its mask argument left out",
                          "不给掩码时它是因果的（改变位置 3 的 token，位置 0..2 的输出不变）：按自己构造因果"
                          "掩码的 Block 检查，不传掩码参数")
STATEFUL_NOTE = text("forward(X, state) builds its causal mask in training mode only (d2l): it was "
                     "run in training mode with dropout switched off, and step by step in eval mode",
                     "forward(X, state) 只在训练模式下构造因果掩码（d2l 的写法）：检查时在训练模式下"
                     "关闭 dropout 运行，并在 eval 模式下逐步运行")
NO_MISTAKE_NOTE = text("no known mistake (or pair of them) reproduces your output; see the "
                       "checks below for where it goes wrong",
                       "没有任何已知错误（或两个错误的组合）能复现你的输出；请看下面的检查项定位问题")


def _down_projection(res: ComponentResult, ctx: Context, comp: Component, layer: Layer) -> None:
    """A finding when the FFN has no nn.Linear(d_ff, d_model)."""
    if not has_down_projection(layer.ffn_candidates[0]):
        number, code = locate("ffn_no_down_projection", source_lines(ctx.objects(comp, "ffn")))
        found = ", ".join(s.describe() for s in layer.ffn_candidates[0])
        res.findings.append(Finding("ffn_no_down_projection", text(
            f"{comp.name}'s FFN has no nn.Linear(d_ff, d_model) ({found})",
            f"{comp.name} 的前馈网络没有 nn.Linear(d_ff, d_model)（{found}）"), number, code))


def _layer_conventions(layer: Layer, ctx: Context, inp: Inputs, res: ComponentResult) -> tuple[str, ...]:
    """The mask conventions to try, those that can encode the search's masks first; a layer that reads
    its stream sequence-first (T, B, D) found first (driven so from then on, noted), its masks also as
    nn.MultiheadAttention's attn_mask (B * H, T, S)."""
    convs = ("lens",) if layer.stateful else ctx.conventions(layer.masks[0] if layer.masks else None)
    convs = SHARED * (shares_mask(layer.module) or _reads_one_mask(layer, convs)) + convs  # Mistral's
    torch_first = ctx.convention is None and layer.masks and masks_where_true_inside(layer.module)
    torch_convs = TORCH_CONVENTIONS[holds_torch_attention(layer.module)] if torch_first else ()
    layer.first = reads_sequence_first_masked(  # a mask it requires: handed every key visible
        ctx, lambda x: layer.call(x, x, None, None), lambda conv: setattr(layer, "visible", conv),
        (None, *(torch_convs + SEQUENCE_FIRST_CONVENTIONS + convs) * layer.required_mask))
    res.notes += [SEQUENCE_FIRST] * layer.first
    convs = torch_convs + SEQUENCE_FIRST_CONVENTIONS * layer.first + convs
    passed = [k for k in _encode_keeps(layer, inp.src_keep, inp.tgt_keep) if k is not None]
    return tuple(c for c in convs if all(fp.encodable(k, c) for k in passed)) or convs[:1]


def _reads_one_mask(layer: Layer, convs: tuple[str, ...]) -> bool:
    """Whether a decoder-only block reads its mask as one (T, S) for the whole batch (Baichuan's, whose
    attention puts a batch axis in front of it), by what it does (fp.reads_one_mask)."""
    return bool(layer.masks) and not layer.stateful | layer.decoder and fp.reads_one_mask(
        lambda v, m: layer.call(v, None, m, m), fp.randn(2, 5, D, seed=3), convs)


def _search_rows(layer: Layer, inp: Inputs, flags: frozenset[str]) -> Tensor | None:
    """The rows the masks leave visible as the layer with these mistakes applies them (inverted, or
    off by one in a block that builds its own)."""
    if layer.masks_itself:
        own = _own_causal(layer, inp.T, flags)[None, None]
        return fp.visible_rows(V.applied_keep(own, flags), inp.B, inp.T)
    if layer.own_mask:  # d2l's decoder builds its causal mask from valid lengths
        return _rows(layer, V.applied_keep(inp.src_keep, flags, H),
                     V.applied_keep(V.causal_keep(inp.T, flags)[None, None], flags, H), inp.B, inp.T)
    return _rows(layer, V.applied_keep(inp.src_keep, flags, H), V.applied_keep(inp.tgt_keep, flags, H),
                 inp.B, inp.T)


def _report_layer(res: ComponentResult, layer: Layer, ctx: Context, run: Callable[[str], Tensor | None],
                  inp: Inputs, search_rows: Callable[[frozenset[str]], Tensor | None], found: Found | None,
                  working: str) -> None:
    """The search's findings (or a note that it found none), then the checks on the layer as it is."""
    comp, expected = layer.comp, layer.placements[0]
    if found is None:
        res.notes.append(NO_MISTAKE_NOTE)
        conv, slots, act, placement = working, layer.ffn_candidates[0], _first_act(layer), expected
        rope, form = None, PLAIN
        flags: frozenset[str] = frozenset()
    else:
        conv, slots, act, placement, rope, form, flags, matched = found
        right = {"parallel": placement}.get(placement, expected)  # a parallel block is right as parallel
        correct = _compute(layer, layer.weights(slots, act, right, rope, form), inp, frozenset())
        out = run(conv)
        if flags:
            res.findings += ctx.findings(flags, matched, fp.max_error(out, correct, search_rows(flags)),
                                         comp, "mha", "ffn", "sdpa", "causal_mask")
            causal_mask_named(res, ctx, comp, layer.masks_itself)
        NAN_ROWS[_torch_rows(layer, conv)](res, out, search_rows(flags), comp, ctx)
    _layer_mapping(res, layer, slots, conv)
    _structure_findings(res, layer, ctx, placement if found is not None else "")  # "": not known
    res.notes += moe_note(slots) + gain_note([*itertools.chain(*layer.attn), *slots])
    if found is not None:
        res.findings += ffn_name_findings(ctx, comp, _ffn_class(layer, slots), slots, act, found[7],
                                          activated="ffn_no_activation" not in flags)
    if found is not None and not any(f.startswith("no_residual") for f in flags):  # no residual, no path
        w = layer.weights(slots, act, placement, rope, form)
        dropout_on_residual(res, ctx, comp, lambda: run(conv),
                            lambda trace: _compute(layer, w, inp, flags, trace))
    if rope:
        res.notes.append(_rope_layer_note(rope))
    res.notes += form_notes(form)
    if placement != expected and found is not None and not res.has(DEPARTS):  # parallel as written: a note
        res.notes.append(_placement_note(placement, expected))
        if not res.findings and placement in ("pre", "post"):  # parallel: a convention of its own
            res.status = DIFFERS
    guarded(res, lambda: _compare(res, layer, ctx, conv, slots, act, placement, rope, form))
    guarded(res, lambda: _properties(res, layer, ctx, conv))
    ctx.unmapped[comp.name] = held_apart(layer.module, _taken(layer), LAYER)  # unnamed departure: NOT CHECKED


LAYER = text("layer", "层")


def _taken(layer: Layer) -> Iterator[Slot]:
    """The slots any reading of the layer took: its attention's, every FFN reading's, its norms."""
    return itertools.chain(*layer.attn, *layer.ffn_candidates, layer.norm_slots)


def _layer_mapping(res: ComponentResult, layer: Layer, slots: list[Slot], conv: str) -> None:
    """Which of the learner's modules stand for which part, and the mask convention it takes."""
    norms = layer.norm_slots[:1] if layer.shared else layer.norm_slots
    res.mapping = [s.describe() for s in itertools.chain(*layer.attn, slots, norms)]
    if layer.masks_handed:
        res.convention = fp.describe_convention(conv)


def _ffn_class(layer: Layer, slots: list[Slot]) -> str:
    """The class name of the module that holds the FFN's weights."""
    owner = slots[0].leaf.name.rpartition(".")[0]
    return type(layer.module.get_submodule(owner) if owner else layer.module).__name__


def _first_act(layer: Layer) -> str:
    return FFN_ACTIVATIONS[is_gated(layer.ffn_candidates[0])][0]


def _encode_keeps(layer: Layer, src_keep: Tensor | None, tgt_keep: Tensor | None,
                  ) -> tuple[Tensor | None, Tensor | None]:
    """The masks the learner's layer is handed: a target mask to a decoder layer and to a block that
    takes one, none to an encoder layer (its padding mask alone, which (B, S) can say: fairseq's)."""
    wants_tgt = (layer.decoder or layer.causal_block and layer.takes_mask) and not layer.stateful
    return src_keep, tgt_keep if wants_tgt else None


def _encode(layer: Layer, src_keep: Tensor | None, tgt_keep: Tensor | None, conv: str, B: int,
            ) -> tuple[Tensor | None, Tensor | None]:
    """The masks as the learner's layer takes them, in its convention."""
    src, tgt = _encode_keeps(layer, src_keep, tgt_keep)
    return fp.encode_mask(src, conv, B), fp.encode_mask(tgt, conv, B)


def _structure_findings(res: ComponentResult, layer: Layer, ctx: Context, placement: str) -> None:
    """Mistakes seen in the layer's parts: its norms' own (each run alone), one norm for every
    sublayer."""
    comp = layer.comp
    lines = source_lines(ctx.objects(comp, "layernorm", "rmsnorm", "add_norm"))
    named: dict[str, list[str]] = {}
    for slot, w in zip(layer.norm_slots[:1 if layer.shared else None], layer.norm_ws):
        for flag in sorted(w.flags):
            named.setdefault(flag, []).append(slot.leaf.name)
    for flag, where in named.items():
        name, _, form = flag.partition(":")
        number, code = locate(name, lines)
        en, zh = form_text(name, form)
        res.findings.append(Finding(name, text(
            f"{', '.join(where)} (run alone) compute the norm with this mistake{f' ({en})' if en else ''}",
            f"{', '.join(where)}（单独运行时）计算的是带这个错误的归一化{f'（{zh}）' if zh else ''}"),
            number, code, form))
    res.notes += [OFFSET_NOTE] * any(w.offset for w in layer.norm_ws)
    res.findings += sequence_findings(layer.module) if placement == "parallel" else []  # written in sequence
    if layer.shared and placement in ("pre", "post"):  # one norm for both: a parallel block's own (GPT-J's)
        number, code = locate("shared_norm", lines)
        res.findings.append(Finding("shared_norm", text(
            f"{comp.name} has one norm ({layer.norm_slots[0].leaf.name}) for its {len(layer.sublayers)} "
            "sublayers", f"{comp.name} 的 {len(layer.sublayers)} 个子层只有一个归一化层"
            f"（{layer.norm_slots[0].leaf.name}）"), number, code, "one"))


def _rope_layer_note(rope: str) -> dict[str, str]:
    from handformer.check.core.rotary import rope_note

    return rope_note(rope)


PARALLEL_NOTE = text("attention and FFN run in parallel, x = x + attn(norm(x)) + ffn(norm(x)) (GPT-J's, "
                     "GPT-NeoX's, Falcon's, Phi's; one norm for both where the block has one): a convention, "
                     "compared with handformer's block computed so",
                     "注意力和 FFN 并行计算，x = x + attn(norm(x)) + ffn(norm(x))（GPT-J、GPT-NeoX、"
                     "Falcon、Phi 的写法；只有一个归一化时两者共用）：这是约定，按 handformer 的 Block "
                     "这样计算后比较")
PLACEMENT_NOTES = {  # a placement found that the kind does not expect, said so
    "pre": text("every sublayer is pre-norm, x = x + f(norm(x)), where the paper's layer is post-norm, "
                "x = norm(x + f(x)): a difference by design, not an error; compared with handformer's "
                "pre-norm layer", "每个子层都是 Pre-Norm，x = x + f(norm(x))，而论文的层是 Post-Norm，"
                "x = norm(x + f(x))：这是设计上的差异，不是错误；已与 handformer 的 Pre-Norm 层比较"),
    "post": text("every sublayer is post-norm, x = norm(x + f(x)), where modern decoder-only blocks are "
                 "pre-norm: a difference by design, not an error; compared with handformer's post-norm block",
                 "每个子层都是 Post-Norm，x = norm(x + f(x))，而现代 decoder-only Block 是 Pre-Norm："
                 "这是设计上的差异，不是错误；已与 handformer 的 Post-Norm Block 比较"),
    "parallel": PARALLEL_NOTE,
    "reordered": text("each sublayer's output is normed inside the residual, x = x + norm(f(x)) (OLMo 2's "
                      "reordered norms): a convention, compared with handformer's block computed so",
                      "每个子层的输出在残差分支里归一化，x = x + norm(f(x))（OLMo 2 的 reordered norm）："
                      "这是约定，按 handformer 的 Block 这样计算后比较")}
PLACEMENT_WORDS = {"parallel": ("computed in parallel", "并行计算")}  # (en, zh); else "pre-norm", ...
# handformer's block a placement is built from (then run in parallel, or its norms moved after each sublayer)
HF_PLACEMENT = {"parallel": "pre", "reordered": "pre", "sandwich": "pre"}


def _placement_note(placement: str, expected: str) -> dict[str, str]:
    return PLACEMENT_NOTES[placement]


def _rows(layer: Layer, src_keep: Tensor | None, tgt_keep: Tensor | None, B: int, T: int) -> Tensor | None:
    rows = None
    for keep in (tgt_keep, None if layer.causal_block else src_keep):
        r = fp.visible_rows(keep, B, T) if keep is not None and keep.size(-2) in (1, T) else None
        if r is not None:
            rows = r if rows is None else rows & r
    return rows


def _compute(layer: Layer, w: V.LayerWeights, inp: Inputs, flags: frozenset[str],
             trace: list[Tensor] = V.UNKEPT) -> Tensor:
    return layer.kind.variant(layer, w, inp, flags, trace)


def _decoder_variant(layer: Layer, w: V.LayerWeights, inp: Inputs, flags: frozenset[str],
                     trace: list[Tensor]) -> Tensor:
    tgt_keep = V.causal_keep(inp.T, flags)[None, None] if layer.own_mask else inp.tgt_keep
    return V.decoder_layer(w, inp.x, inp.memory, inp.src_keep, tgt_keep, flags, trace)


def _block_variant(layer: Layer, w: V.LayerWeights, inp: Inputs, flags: frozenset[str],
                   trace: list[Tensor]) -> Tensor:
    keep = inp.tgt_keep if layer.takes_mask else _own_causal(layer, inp.x.size(1), flags)[None, None]
    return V.encoder_layer(w, inp.x, keep, flags, trace)


def _encoder_variant(layer: Layer, w: V.LayerWeights, inp: Inputs, flags: frozenset[str],
                     trace: list[Tensor]) -> Tensor:
    return V.encoder_layer(w, inp.x, inp.src_keep, flags, trace)


Found = tuple[str, list[Slot], str, str, str | None, Form, frozenset[str], float]


def _search(layer: Layer, ctx: Context, run: Callable[[str], Tensor | None], inp: Inputs, rows: fp.Rows,
            conventions: tuple[str, ...]) -> Found | None:
    """Convention, FFN mapping, activation, placement and rotary layout first with at most one
    mistake, then with pairs: the smallest explanation of the learner's output."""
    ran, failure = outputs_by_convention(run, conventions)
    outputs: dict[str, Tensor] = {}
    for conv, out in ran.items():
        if out.shape == inp.x.shape and not any(torch.equal(out, seen) for seen in outputs.values()):
            outputs[conv] = out  # conventions that give the same output are searched once
    if not outputs:
        if failure:
            raise failure
        out = run(conventions[0])
        raise layer.ctx.learner.fail("forward", f"{layer.comp.name} returned {shape_of(out)} for x of "
                                     f"shape {tuple(inp.x.shape)}; a layer keeps the shape (B, T, d_model)",
                                     f"x 的形状为 {tuple(inp.x.shape)} 时，{layer.comp.name} 返回了 "
                                     f"{shape_of(out)}；一层不改变形状 (B, T, d_model)")
    settings = list(itertools.product(outputs, ffn_ruled(layer, layer_settings(layer))))

    def search_one(setting: tuple[Any, ...], least: int, most: int) -> tuple[frozenset[str], float] | None:
        conv, (slots, act, placement, rope, form) = setting
        w = layer.weights(slots, act, placement, rope, form)
        return fp.search(outputs[conv], lambda flags: _compute(layer, w, inp, flags),
                         responsive(outputs, _flags(layer, w)), rows, most, least)
    with remembering():  # the attention of each reading computed once for all the readings that share it
        found = fp.search_settings(settings, search_one, fewest=True)
    return then(found, lambda f: (f[0][0], *f[0][1], f[1], f[2]))


def ffn_ruled(layer: Layer, settings: list[Setting]) -> list[Setting]:
    """The settings whose FFN reading (mapping, activation) is what the layer's FFN computes alone, run
    on a probe where one submodule holds its linears and nothing else's; all of them where none does,
    or none matches (the FFN's own mistake is then searched in the layer)."""
    holder = smallest_holder(layer.module, {id(s.leaf.module) for s in layer.ffn_candidates[0]})
    if holder is None:
        return settings
    x = fp.randn(2, 3, D, seed=31)  # (B, T, D)
    try:
        out = fp.first_tensor(holder(x), 3)
    except (Exception, SystemExit):  # noqa: BLE001  (it takes other inputs: the search tries every reading)
        return settings
    kept = [s for s in settings if fp.max_error(out, V.feed_forward(ffn_weights(s[0], s[1]), x)) < fp.TOL]
    return kept or settings


Setting = tuple[list[Slot], str, str, str | None, Form]


def layer_settings(layer: Layer) -> list[Setting]:
    """Every reading of the layer's weights the search tries: FFN mapping, activation, placement
    (the kind's first), rotary layout, the numbers it takes from its settings (`Form`)."""
    gated = is_gated(layer.ffn_candidates[0])
    return list(itertools.product(layer.ffn_candidates, ffn_activations(gated), layer.placements,
                                  layer.ropes, layer.forms))


def form_notes(form: Form) -> list[Text]:
    """What the report says of the numbers a layer was compared at (none for the plain form)."""
    notes = [scale_note(form.scale)] if form.scale else []
    return notes + [text(
        f"each sublayer's output times {form.residual:g} before the add, a value your layer takes from its "
        "settings (Granite's residual_multiplier, MiniCPM's scale_depth / sqrt(num_hidden_layers)): a "
        "convention, compared so",
        f"每个子层的输出先乘以 {form.residual:g} 再相加，这是你的层从配置里读出的值（Granite 的 "
        "residual_multiplier，MiniCPM 的 scale_depth / sqrt(num_hidden_layers)）：这是约定，按它比较")
    ] * (form.residual != 1.0)


def _hf_layer(layer: Layer, slots: list[Slot], act: str, placement: str, rope: str | None,
              form: Form = PLAIN) -> nn.Module:
    from handformer.check.core.reference_attention import handformer_attention

    gated = is_gated(slots)
    first = layer.norm_ws[0]
    cfg = BlockConfig(d_model=D, n_heads=H, n_kv_heads=layer.n_kv_heads, d_ff=slots[0].weight().size(0),
                      moe=moe_config(slots),
                      dropout=0.0, activation=built_activation(HF_NAME[(gated, act)]),
                      norm="rmsnorm" if first.kind == "rmsnorm" else "layernorm",
                      norm_placement=HF_PLACEMENT.get(placement, placement), norm_eps=positive_eps(first.eps),
                      bias=True)
    hf = plain_activation_(layer.kind.reference(cfg), HF_NAME[(gated, act)]).double().eval()
    as_parallel_([hf] * (placement == "parallel"), [layer.shared])  # GPT-J's, Falcon's, Phi's: both read x
    hf = PLACED.get(placement, lambda hf, cfg: hf)(hf, cfg)
    hf.self_attn = handformer_attention(layer.attn[0], layer.n_kv_heads, rope, softcap=layer.cap,
                                        scale=form.scale)
    if layer.decoder:
        hf.cross_attn = handformer_attention(layer.attn[1], layer.n_kv_heads)
    copy_ffn(hf.ffn, slots)
    for target, slot, w in zip(_hf_norms(hf, layer), layer.norm_slots, layer.norm_ws):
        copy_weights(target, slot)
        with torch.no_grad():
            target.weight.copy_(w.weight)  # the gain as it computes (1 + weight, kept as an offset)
    return GraniteBlock(hf, form.residual) if form.residual != 1.0 else hf


# handformer's block in a placement of its own: OLMo 2's x + norm(f(x)); Gemma 2/3's norms before and after
PLACED = {"reordered": lambda hf, cfg: ReorderedNormBlock(hf), "sandwich": SandwichBlock}


def _hf_norms(hf: nn.Module, layer: Layer) -> list[nn.Module]:
    """handformer's norms in the order of the learner's norm slots."""
    if isinstance(hf, SandwichBlock):
        return [hf.attn_norm, hf.post_attn_norm, hf.ffn_norm, hf.post_ffn_norm]
    return [hf.attn_norm] + ([hf.cross_attn_norm] if layer.decoder else []) + [hf.ffn_norm]


def _compare(res: ComponentResult, layer: Layer, ctx: Context, conv: str, slots: list[Slot], act: str,
             placement: str, rope: str | None, form: Form) -> None:
    """Against handformer's EncoderLayer / DecoderLayer / DecoderOnlyBlock on several shapes."""
    hf = _hf_layer(layer, slots, act, placement, rope, form)
    cases = [(2, 5, 7, [0, 0], [0, 0]), (3, 4, 9, [0, 3, 9], [0, 1, 0]), (1, 1, 3, [0], [0])]
    errors, grad_err, before = [], 0.0, snapshot(layer.module)
    for i, (B, T, S, src_pad, tgt_pad) in enumerate(cases):
        if not layer.decoder:
            S = T
        x = fp.randn(B, T, D, seed=10 + i).requires_grad_()
        memory = fp.randn(B, S, D, seed=20 + i)
        src_keep, tgt_keep = _case_keeps(layer, B, T, S, src_pad, tgt_pad)
        if not all(fp.encodable(k, conv) for k in _encode_keeps(layer, src_keep, tgt_keep)):
            continue
        with torch.enable_grad():
            src, tgt = _encode(layer, src_keep, tgt_keep, conv, B)
            raw = ctx.learner.call("forward", layer.call, x, memory, src, tgt)
            out = fp.first_tensor(raw, 3)
            ref = layer.kind.handformer(hf, x, memory, src_keep, tgt_keep, rope)
            rows = _rows(layer, src_keep, tgt_keep, B, T)
            errors.append(fp.max_error(out, ref, rows))
            MASKED_ROWS[_torch_rows(layer, conv)](res, out, rows, layer.comp, ctx)
            if i == 0 and out is not None and out.shape == ref.shape and not layer.stepwise:
                again = functools.partial(layer.kind.handformer, hf, x, memory, src_keep, tgt_keep, rope)
                grads = functools.partial(_grads_again, (layer, hf, x, out), again)
                grad_err = gradient_error(res, grads, written(layer.module, before), hf)
    res.max_abs_error = max(errors, default=None)
    name = layer.kind.reference.__name__
    n = len(errors)
    en, zh = PLACEMENT_WORDS.get(placement, (f"{placement}-norm", f"{placement.capitalize()}-Norm"))
    bound = _stepwise_bound(layer, max(errors, default=math.inf), res)
    res.checks.append(Check(text(f"matches handformer's {name} ({en}) on {n} shapes",
                                 f"在 {n} 种形状上与 handformer 的 {name}（{zh}）一致"),
                            max(errors, default=math.inf) < bound, error_text(max(errors, default=0.0))))
    if layer.stepwise:
        res.notes.append(STEPWISE_NOTE)
        return
    res.checks.append(Check(text("gradients (input and first norm) match handformer's",
                                 "梯度（输入与第一个归一化层）与 handformer 一致"), grad_err < 1e-5,
                            error_text(grad_err)))


def _stepwise_bound(layer: Layer, err: float, res: ComponentResult) -> float:
    """The error allowed a block: float rounding, or, driven through its own cache (stepwise) in a file
    that computes lossily (an int8 or float16 cache), that cache's rounding: LOSSY of its outputs'
    unit scale (inputs of unit variance), noted where it is used."""
    lossy_cache = layer.stepwise and lossy.computes_lossily(type(layer.module))
    if lossy_cache and 1e-5 <= err < lossy.LOSSY:  # said in the note, not taken for a mistake's error
        res.notes.append(lossy.lossy_note(err, relative=False))
        res.max_abs_error = None
    return lossy.LOSSY if lossy_cache else 1e-5


def _grads_again(run: tuple[Layer, nn.Module, Tensor, Tensor], reference: Callable[[], Tensor],
                 retain: bool) -> float:
    """`_grads` on run = (layer, hf, x, out), handformer's output computed again by `reference` (with its
    keys and values held, inside kept_state.keys_held)."""
    return _grads(*run, reference(), retain)


def _grads(layer: Layer, hf: nn.Module, x: Tensor, out: Tensor, ref: Tensor, retain: bool = False) -> float:
    """The input's and the first norm's gradients against handformer's (a function's norm: none);
    `retain`: out's graph kept for another comparison."""
    g = fp.randn(*ref.shape, seed=5)
    gains = [] if isinstance(layer.norm_slots[0].leaf, Gainless) else [
        (layer.norm_slots[0].leaf.weight, hf.attn_norm.weight)]
    mine = torch.autograd.grad((out * g).sum(), [x] + [a for a, _ in gains], allow_unused=True,
                               retain_graph=retain)
    theirs = torch.autograd.grad((ref * g).sum(), [x] + [b for _, b in gains])
    return grads_error(list(zip(mine, theirs)))


def _source_keep(layer: Layer, B: int, S: int, pad: list[int]) -> Tensor | None:
    """The source's padding mask; none for a layer that takes no mask (tiny-universe's
    EncoderLayer.forward(x), DecoderLayer.forward(x, enc_out)) or a decoder's target mask alone: it is
    compared with every key visible."""
    return positions(B, S, pad) if layer.masks_handed and not layer.target_mask_only else None


def _case_keeps(layer: Layer, B: int, T: int, S: int, src_pad: list[int],
                tgt_pad: list[int]) -> tuple[Tensor | None, Tensor | None]:
    """One shape's source and target masks (True = may attend), as the layer's kind takes them."""
    src_keep = _source_keep(layer, B, S, [min(p, S) for p in src_pad])
    tgt_keep: Tensor | None = causal(T) & positions(B, T, [min(p, T - 1) for p in tgt_pad])
    if layer.causal_block:
        src_keep, tgt_keep = None, _own_causal(layer, T).clone()[None, None]  # theirs to read: a copy
    if layer.own_mask:  # d2l's decoder: causal inside, the source by valid lengths (or none)
        tgt_keep = causal(T)[None, None]
    return src_keep, tgt_keep


# each kind of layer, by the kind discovery names it (the layer's tutorial example: a decoder's
# output (2, 5, 512) and cross-attention weights (2, 8, 5, 10), an encoder's (2, 10, 512))
ENCODER_SUBLAYERS = (["attn", "ffn"], ["self-attention", "FFN"])
ENCODER_TUTORIAL = (10, (2, 8, 10, 10), "(2, 10, 512)")
KINDS = {
    "encoder_layer": LayerKind(EncoderLayer, ("post", "pre"), False, False, ENCODER_SUBLAYERS,
                               ENCODER_TUTORIAL, _encoder_variant,
                               lambda hf, x, memory, src_keep, tgt_keep, rope: hf(x, src_keep)[0]),
    "decoder_layer": LayerKind(DecoderLayer, ("post", "pre"), True, False,
                               (["attn", "cross", "ffn"], ["self-attention", "cross-attention", "FFN"]),
                               (5, (2, 8, 5, 10), "(2, 5, 512), cross-attention (2, 8, 5, 10)"),
                               _decoder_variant,  # handformer's in the tutorial's order: src_mask, tgt_mask
                               lambda hf, x, memory, src_keep, tgt_keep, rope: hf(x, memory, src_keep,
                                                                                   tgt_keep)[0]),
    "block": LayerKind(DecoderOnlyBlock, ("pre", "post", "parallel", "reordered"), False, True,
                       ENCODER_SUBLAYERS,
                       ENCODER_TUTORIAL, _block_variant, lambda hf, x, memory, src_keep, tgt_keep, rope: hf(
                           x, tgt_keep,
                           rope=rope_tables(x.shape[1], rope=rope) if V.is_rotary(rope) else None)[0]),
}


def _properties(res: ComponentResult, layer: Layer, ctx: Context, conv: str) -> None:
    """Causality of the (decoder) self-attention, padding invariance of the keys, and for d2l's
    decoder, step-by-step decoding with its state equal to the whole sequence at once."""
    B, T, j = 2, 7, 3
    x, memory = fp.randn(B, T, D, seed=40), fp.randn(B, T, D, seed=41)
    if layer.decoder or layer.causal_block:
        src, tgt = _encode(layer, positions(B, T, [0, 0]), causal(T)[None, None], conv, B)
        bumped = x.clone()
        bumped[:, j] += 1.0
        a = fp.first_tensor(ctx.learner.call("forward", layer.call, x, memory, src, tgt), 3)
        b = fp.first_tensor(ctx.learner.call("forward", layer.call, bumped, memory, src, tgt), 3)
        past = moved_by(a, b, (slice(None), slice(0, j)))
        res.checks.append(Check(text(f"causality: changing token {j} leaves outputs 0..{j - 1} unchanged",
                                     f"因果性：改变位置 {j} 的 token，不影响位置 0..{j - 1} 的输出"),
                                past < 1e-9,
                                text(f"outputs before it moved by {past:.3g}",
                                     f"之前位置的输出变化了 {past:.3g}")))
        if layer.stateful:
            _step_by_step(res, layer, ctx, x, memory, a)
    if layer.takes_mask and not layer.causal_block and not layer.target_mask_only or layer.stateful:
        keep = positions(B, T, [0, 3])
        other = (memory if layer.decoder else x).clone()
        other[1, T - 3:] += 5.0
        src, tgt = _encode(layer, keep, causal(T)[None, None] if layer.decoder else None, conv, B)

        def run(x: Tensor, memory: Tensor | None) -> Tensor | None:
            return fp.first_tensor(ctx.learner.call("forward", layer.call, x, memory, src, tgt), 3)

        if layer.decoder:
            moved = moved_by(run(x, memory), run(x, other), slice(None))
        else:
            moved = moved_by(run(x, None), run(other, None), (slice(None), slice(0, T - 3)))
        res.checks.append(Check(text("padding invariance: changing padded positions changes no real one",
                                     "填充不变性：改变被填充的位置不影响真实位置的输出"), moved < 1e-9,
                                text(f"outputs moved by {moved:.3g}", f"输出变化了 {moved:.3g}")))


def _step_by_step(res: ComponentResult, layer: Layer, ctx: Context, x: Tensor, memory: Tensor,
                  whole: Tensor | None) -> None:
    """d2l's decoder in eval mode, one token at a time, its keys kept in state[2]: the same outputs as
    the whole sequence in training mode (dropout off)."""
    B, T, _ = x.shape
    lens = torch.full((B,), T)
    state: list[Any] = [memory, lens, [None]]
    steps = []
    for t in range(T):
        raw = ctx.learner.call("forward", layer.module, x[:, t:t + 1], state)
        out = fp.first_tensor(raw, 3)
        if isinstance(raw, (tuple, list)) and len(raw) > 1 and isinstance(raw[1], list):
            state = raw[1]
        steps.append(out)
    ok = all(s is not None and s.shape == (B, 1, D) for s in steps)
    err = fp.max_error(torch.cat(steps, dim=1), whole) if ok and whole is not None else float("inf")
    res.checks.append(Check(text(f"decoding step by step with state (eval mode) gives the same {T} outputs",
                                 f"用 state 逐步解码（eval 模式）得到相同的 {T} 个输出"), err < 1e-9,
                            error_text(err)))


def _tutorial_shapes(res: ComponentResult, layer: Layer, ctx: Context) -> None:
    """The tutorial's example: encoder (2, 10, 512) -> (2, 10, 512); decoder (2, 5, 512) with
    enc_output (2, 10, 512) -> (2, 5, 512), cross-attention weights (2, 8, 5, 10)."""
    T, attn, expect = layer.kind.tutorial
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(2, T, 512, generator=g), torch.randn(2, 10, 512, generator=g)
    big = Layer.__new__(Layer)
    big.__dict__.update(layer.__dict__)
    big.head_dim = TUTORIAL["d_model"] // TUTORIAL["n_heads"]
    tutorial = {**layer.sizes, **TUTORIAL}  # with the key/value heads it was built with, if it asks
    conv = layer.visible if layer.visible and not layer.visible.startswith("lens") else "int"
    wants = layer.takes_mask or not layer.causal_block
    heads = TUTORIAL["n_heads"]  # nn.MultiheadAttention's attn_mask: one row a head
    tgt = fp.encode_mask(causal(T)[None, None], conv, 2, heads) if wants else None  # in the convention found
    tgt = fp.mask_like(tgt, x)
    # a mask the forward requires is given (every source key visible): None is no input it accepts
    every = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    needed = layer.required_mask or _needs_its_mask(layer, ctx)
    visible = fp.mask_like(fp.encode_mask(every, conv, 2, heads) if needed else None, x)
    src = torch.full((2,), 10) if layer.stateful or str(layer.visible).startswith("lens") else visible
    masks = (src, tgt if layer.causal_block or layer.required_mask else None)

    def warm(m: nn.Module) -> Any:
        big.module = m
        return big.call(x, memory, *masks)

    big.module = ctx.build(layer.comp, tutorial, checked=False, warmup=warm)
    raw = ctx.learner.call("forward", big.call, x, memory, *masks)
    out, weights = fp.first_tensor(raw, 3), fp.weights_of(raw, skip_first=True)
    want = (2, T, 512)
    # a decoder layer may return both weights (jadore801120's: out, self-attention's, cross-attention's)
    returned = [tuple(t.shape) for t in raw[1:] if isinstance(t, Tensor)] if isinstance(raw, tuple) else []
    ok = out is not None and tuple(out.shape) == want and (
        weights is None or tuple(weights.shape) == attn or attn in returned)
    res.checks.append(Check(text(f"shapes as the tutorial states: {expect}", f"形状与教程一致：{expect}"), ok,
                            text(f"got {shape_of(raw)}", f"实际得到 {shape_of(raw)}")))


# --- d2l's AddNorm ----------------------------------------------------------------------------

def _build_add_norm(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """d2l's AddNorm(norm_shape, dropout): its norm's weights, the one reading; run on (X, Y)."""
    module = ctx.build(comp)
    slot = norm_slots(of_kind(leaves(module), "norm"), 1, ["norm"], comp.name)[0]
    res.mapping = [slot.describe()]

    def run(xy: tuple[Tensor, Tensor]) -> Tensor | None:
        return fp.first_tensor(ctx.learner.call("forward", module, *xy), 3)
    return Subject(run, [(slot, norm_weights(slot))], module)


def _add_norm_shape(ctx: Context, comp: Component, subject: Subject, xy: tuple[Tensor, Tensor],
                    out: Tensor | None) -> tuple[str, str] | None:
    """AddNorm keeps the shape of X."""
    x = xy[0]
    if out is not None and out.shape == x.shape:
        return None
    got = shape_of(ctx.learner.call("forward", subject.module, *xy))
    shape = tuple(x.shape)
    return (f"{comp.name}(X, Y) returned {got} for X and Y of shape {shape}; expected {shape}",
            f"X 和 Y 的形状为 {shape} 时，{comp.name}(X, Y) 返回了 {got}；应当是 {shape}")


def _add_norm_localized(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                        found: Explained) -> None:
    """Where an AddNorm that differs from norm(X + Y) parts from it (a mistake named or not)."""
    if res.max_abs_error >= 1e-5:
        module = subject.module
        note_departure(res, lambda: localize_add_norm(module, module, found.weights, *found.x))


def _add_norm_residual(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                       found: Explained) -> None:
    dropout_on_residual(res, ctx, comp, lambda: subject.run(found.x),
                        lambda trace: _add_norm_trace(found.weights, *found.x, trace))


ADD_NORM = Probe(
    build=_build_add_norm,
    inputs=lambda s: (fp.randn(2, 5, D, seed=1), fp.randn(2, 5, D, seed=2)),  # X, Y
    shape=_add_norm_shape,
    reference=lambda w, xy, flags: V.add_norm(w, *xy, flags),
    universe=lambda s: ("no_residual:add_norm",),
    steps=(name_findings,
           lambda res, ctx, comp, s, found: _norm_findings(res, ctx, comp, *s.readings[0]),
           _add_norm_residual,
           lambda res, ctx, comp, s, found: _against_norm(res, *s.readings[0], lambda a, b: s.run((a, b))),
           _add_norm_localized),
    depth=1,
)


def check_add_norm(comp: Component, ctx: Context) -> ComponentResult:
    """AddNorm(norm_shape, dropout), forward(X, Y) = norm(dropout(Y) + X), against handformer's
    LayerNorm of X + Y, as the ADD_NORM probe states it."""
    return run_probe(ADD_NORM, comp, ctx)


def _norm_findings(res: ComponentResult, ctx: Context, comp: Component, slot: Slot, w: V.NormWeights) -> None:
    """The norm's own mistakes, found when it ran alone."""
    for flag in sorted(w.flags):
        name, _, form = flag.partition(":")
        number, code = locate(name, source_lines(ctx.objects(comp, "layernorm", "rmsnorm")))
        res.findings.append(Finding(name, text(f"{slot.leaf.name} (run alone) computes the norm with "
                                               "this mistake", f"{slot.leaf.name}（单独运行时）计算的是带"
                                               "这个错误的归一化"), number, code, form))


def _against_norm(res: ComponentResult, slot: Slot, w: V.NormWeights,
                  run: Callable[[Tensor, Tensor], Tensor | None]) -> None:
    """AddNorm against handformer's norm of X + Y on 3 shapes."""
    from handformer.nn.norms import LayerNorm, RMSNorm

    hf = RMSNorm(D, w.eps) if w.kind == "rmsnorm" else LayerNorm(D, w.eps, bias=w.bias is not None)
    hf = hf.double()
    copy_weights(hf, slot)
    errors = []
    for i, (B, T) in enumerate([(2, 5), (1, 1), (3, 7)]):
        a, b = fp.randn(B, T, D, seed=10 + i), fp.randn(B, T, D, seed=20 + i)
        errors.append(fp.max_error(run(a, b), hf(a + b)))
    res.max_abs_error = max(errors)
    res.checks.append(Check(text("matches handformer's norm(X + Y) on 3 shapes",
                                 "在 3 种形状上与 handformer 的 norm(X + Y) 一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))


def _add_norm_trace(w: V.NormWeights, x: Tensor, y: Tensor, trace: list[Tensor]) -> Tensor:
    trace += [x, x + y]  # the residual input, and the sum before the norm
    return V.add_norm(w, x, y)
