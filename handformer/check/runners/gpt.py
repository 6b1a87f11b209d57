"""Runner for the assembled decoder-only model: nanoGPT's `GPT(config)` with `forward(idx)`
returning logits, or `forward(idx, targets)` returning (logits, loss) as nanoGPT does (logits of the
last position only when there are no targets, which is compared as such).

The learner's parameters are mapped onto handformer's `CausalLM` (GPT-2 style): the token and
position embeddings by their shapes, the blocks by the ModuleList that holds them (inside each as
the block runner maps it: a fused c_attn is split in three), the norm outside the blocks as the
final norm, and the (vocab, d_model) head, tied to the token embedding or not. Choices reported:
tied or separate head, with a bias or not, the FFN's activation, pre- or post-norm. The
fingerprint search names: the causal mask missing or off by one, the position embedding never
added, the final norm missing. The loss, when forward returns one, is compared with the
cross-entropy of handformer's logits.

Shape legend: B batch, T length, D d_model, V vocabulary.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.block_order import call_order, order_note
from handformer.check.core.built_masks import built_mask, with_use
from handformer.check.core.causality import check_causality
from handformer.check.core.context import (
    DRIVER_NOTE,
    SEQUENCE_FIRST,
    SIZES,
    Context,
    D,
    H,
    attributes_double_,
    batch_first,
    batch_first_by_shape,
    check_determinism,
    drives_only,
    error_text,
    finish,
    forward_defaults,
    forward_parameters,
    is_mask_name,
    logits_shape,
    named,
    names_of,
    reads_sequence_first,
    shape_of,
)
from handformer.check.core.discovery import CONFIG_NAMES, Component, DiscoveryError, own_objects
from handformer.check.core.fused_qkv import find_layouts_
from handformer.check.core.layer_map import (
    Gainless,
    LayerMap,
    gainless_norm,
    layer_modules,
    list_items,
    map_layer,
    output_head,
    outside,
    prefixed,
    rows_normed,
)
from handformer.check.core.localize_kinds import localize_model, made_at, module_views, note_departure
from handformer.check.core.moe import moe_config, moe_note
from handformer.check.core.reference_attention import handformer_attention, with_sinks
from handformer.check.core.result import (
    DRIVER,
    NOT_CHECKED,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.rotary import interleaved_to_half_, partial_layouts, turned_width
from handformer.check.core.score_scale import PLAIN, Form, layer_forms, model_factors
from handformer.check.core.setup_method import setup_name, setup_of
from handformer.check.core.source import (
    LINE_FINDERS,
    first_pattern_matches,
    locate,
    source_lines,
    source_text,
)
from handformer.check.core.unmapped import held_words, learned_terms, term_words, top_k_words
from handformer.check.core.weights import (
    Leaf,
    MappingError,
    Slot,
    copy_attention,
    copy_ffn,
    copy_weights,
    is_gated,
    kv_heads_of,
    leaves,
    norm_kind,
    of_kind,
    positive_eps,
    shapes_text,
    with_shape,
)
from handformer.check.core.weights import norm_weights as learner_norm
from handformer.check.core.windows import WINDOW_T, declared_window
from handformer.check.reference import variants as V
from handformer.check.reference.parallel import as_parallel_
from handformer.check.runners import generate_lossy as lossy
from handformer.check.runners import latent
from handformer.check.runners.attention import attention_cap
from handformer.check.runners.balance_loss import balance_term
from handformer.check.runners.kv_cache import CACHE_ARGS, CACHE_METHODS, check_kv_cache
from handformer.check.runners.lm_properties import free_properties, own_loss
from handformer.check.runners.localize_cache import cache_departure
from handformer.check.runners.model import as_written_, computes_sqrt, exact_norms_
from handformer.check.runners.model_loss import unshifted_finding
from handformer.check.runners.padding_left import MASK_NAME, left_padding
from handformer.check.runners.pieces import (
    HF_NAME,
    OFFSET_NOTE,
    built_activation,
    ffn_activations,
    plain_activation_,
)
from handformer.check.runners.rope_scaling import (
    UNEXPLAINED,
    model_scaling,
    named_schedule,
    scaling_words,
    unexplained,
)
from handformer.check.runners.sequence_score import check_scores
from handformer.check.runners.stack import check_stack
from handformer.config import CausalLMConfig, FamilyConfig, Llama3RopeScaling
from handformer.families import build_causal_lm
from handformer.models.causal_lm import CausalLM
from handformer.nn.kv_cache import NO_CACHE
from handformer.nn.masks import as_attention_mask
from handformer.nn.positions import RotaryEmbedding, sinusoidal_table

VOCAB, BLOCK, KV_HEADS, OPT_OFFSET = 29, 16, 2, 2
# a set-up model's argument for the positions (T,): one that names them (gpt-fast's input_pos, CS336's
# token_positions, position_ids), not a start (a start_pos is one number)
SAID_POSITIONS = re.compile(r"(?<!start)(^|_)pos(itions?)?(_|$)")
GPT_SIZES = {**SIZES, "src_vocab": VOCAB, "n_layers": 2, "max_len": BLOCK}
TARGET_NAMES = ("targets", "target", "labels", "y", "tgt")
# the forms of a causal mask (T, T) a model's forward may be handed by its caller (PyTorch's language-model
# tutorial: forward(src, src_mask) with generate_square_subsequent_mask, -inf above the diagonal): 0 / -inf
# added, torch.nn's bool (True = masked), bool True = may attend, 0/1 int (0 = masked)
CAUSAL_FORMS = (lambda keep, dtype: torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, -math.inf),
                lambda keep, dtype: ~keep, lambda keep, dtype: keep, lambda keep, dtype: keep.long())
FLAGS = ("causal_mask_missing", "causal_off_by_one:no_self", "causal_off_by_one:sees_next", "pe_missing",
         "final_norm_missing")


@dataclass
class GPTMap:
    wte: Leaf
    wpe: Leaf | None
    blocks: list[Any]  # model.LayerMap, one per block
    ln_f: Slot | None
    head: Leaf | None
    tied: bool
    bias: bool
    n_kv_heads: int | None = None  # grouped-query attention (Llama's n_kv_heads)
    ropes: tuple[str | None, ...] = (None,)  # rotary layouts to try: "half", "interleaved"
    theta: float = 10000.0  # the rotary base read from the learner's model
    table_theta: float | None = None  # the base of its tables, when it is not the one its config names
    rope_scaling: Llama3RopeScaling | None = None  # Llama 3.1's scaling of the rotary frequencies
    normed_head: bool = False  # the head's rows L2-normalised before the product (Baichuan 2's NormHead)
    built: dict[Any, CausalLM] = field(default_factory=dict)  # handformer's, by choices
    embed_norm: Leaf | None = None  # nanochat's norm of the token embeddings, a function without gains
    attn_softcap: float | None = None  # the attention scores soft-capped (Gemma 2's)
    scaled: bool = False  # token embeddings times sqrt(d_model) (Gemma's, the original Transformer's)
    added: str | None = None  # the positions added to them: "learned" (wpe), "sinusoidal" (the paper's sines)
    held: list[Leaf] = field(default_factory=list)  # parts no reference has, held at zero or as built
    # tables looked up by ids of their own, not the tokens' (P-Tuning v2's prefix keys and values)
    own_ids: list[Leaf] = field(default_factory=list)
    windows: tuple[int | None, ...] = ()  # each block's sliding window, measured (None: it sees every key)
    softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2's, nanochat's)
    offset: int = 0  # the first row of the learned positions (OPT's 2: its table keeps two rows before them)
    embed_factor: float | None = None  # token embeddings times a configured number (Granite's)
    logit_factor: float | None = None  # logits times a configured number (Cohere's logit_scale, 1 / Granite's
    # logits_scaling)
    order: tuple[int, ...] = ()  # the blocks in the order the model calls them, where it reuses one

    def describe(self) -> list[str]:
        tied = " (tied to the token embedding)" if self.tied else ""
        parts = [(self.wte, "token embedding"), (self.embed_norm, "embedding norm"),
                 (self.wpe, "position embedding"), *[(b, f"block {i}") for i, b in enumerate(self.blocks)],
                 (getattr(self.ln_f, "leaf", None), "final norm"), (self.head, f"output head{tied}")]
        return [f"{part.name} -> {what}" for part, what in parts if part is not None]  # (the parts it has)


# why a model's blocks are not mapped, by whether it holds a decoder (a class named so)
NO_BLOCKS = {
    False: ("expected the blocks in an nn.ModuleList (nanoGPT's transformer.h), each with one attention and "
            "an MLP",
            "应当把 Block 放在一个 nn.ModuleList 里（nanoGPT 的 transformer.h），"
            "每个 Block 有一个注意力和一个 MLP"),
    True: ("it runs an encoder and a decoder with cross-attention on one sequence of token ids "
           "(tiny-universe's and happy-llm's Transformer.forward(idx, targets)): neither handformer's "
           "CausalLM nor its Seq2SeqTransformer computes that; its layers are checked alone",
           "它把同一个 token 序列同时送进编码器和带交叉注意力的解码器（tiny-universe 和 happy-llm 的 "
           "Transformer.forward(idx, targets)）：handformer 的 CausalLM 和 Seq2SeqTransformer 都不这样计算；"
           "它的各层单独检查"),
}


def _mapped_blocks(layers: list[tuple[str, nn.Module]], kv: int | None) -> list[LayerMap]:
    return [map_layer(path, child, SIZES["d_ff"], kv) for path, child in layers]


def map_gpt(module: nn.Module) -> GPTMap:
    layers, n_kv, kv = layer_modules(module), None, None
    if not layers:  # grouped-query attention: KV_HEADS key/value heads, each D // H wide
        layers, n_kv, kv = _grouped_blocks(module), KV_HEADS, KV_HEADS * (D // H)
    try:
        blocks = _mapped_blocks(layers, kv)
    except MappingError:  # its key and value heads fewer (grouped-query), the blocks found by their experts
        n_kv, kv = KV_HEADS, KV_HEADS * (D // H)
        blocks = _mapped_blocks(layers, kv)
    if not blocks or any(b.decoder for b in blocks):
        en, zh = NO_BLOCKS[any("decoder" in type(m).__name__.lower() for m in module.modules())]
        raise MappingError(en, zh=zh)
    _comparable(module, layers, blocks)
    outer = outside(module, [child for _, child in layers])
    embeds = of_kind(outer, "embedding")
    wte = next((e for e in embeds if e.weight.size(0) == VOCAB), None)
    if wte is None:
        found = [(e.name, tuple(e.weight.shape)) for e in embeds]
        raise MappingError(f"expected nn.Embedding(vocab_size={VOCAB}, n_embd); found {found}",
                           zh=f"应当有 nn.Embedding(vocab_size={VOCAB}, n_embd)；实际找到 {found}")
    # positions: (max_len, D), not a table of the tokens (nanochat's value embeddings)
    wpe = next((e for e in embeds if e is not wte and e.weight.shape[0] != VOCAB and e.weight.shape[1] == D),
               None)
    norms = of_kind(outer, "norm")
    embed_norm, norms = _embedding_norm(module, norms, layers)
    head, tied, bias = output_head(outer, VOCAB, wte, norms[1:], (
        "parameters outside the blocks that a GPT does not have", "Block 之外有 GPT 没有的参数"))
    n_kv = n_kv or kv_heads_of(blocks[0].attn[0], H)  # a fused multi-query projection: its shape says
    m = GPTMap(wte, wpe, blocks, Slot("final norm", norms[0]) if norms else None, head, tied, bias, n_kv)
    # nanochat's value_embeds and scalars; a block's parameters no reference has (gpt-oss's attention sinks)
    mapped = {id(s.leaf.weight) for b in blocks for s in b.attn[0]}  # (gpt-oss's sinks: mapped)
    _held_(m, [e for e in embeds if e not in (wte, wpe)], [
        x for x in of_kind(leaves(module), "scalar") if id(x.weight) not in mapped])
    m.embed_norm = embed_norm or _embed_norm(module, blocks)
    # OPT's (fairseq's) learned positions: a table of max_len + 2 rows, position p at row p + 2
    m.offset = OPT_OFFSET if wpe is not None and wpe.weight.size(0) == BLOCK + OPT_OFFSET else 0
    if wpe is None:
        _rotary_(m, module)
    m.normed_head = head is not None and not tied and rows_normed(head)  # Baichuan 2's NormHead
    return m


def _held_(m: GPTMap, tables: list[Leaf], scalars: list[Leaf]) -> None:
    """The parts no reference has, set on the map: the token tables and scalars held (`held`), and the
    tables of ids of their own (`own_ids`: P-Tuning v2's prefix, whose rows are not the tokens')."""
    m.own_ids = [*filter(lambda e: e.weight.size(0) != VOCAB, tables)]
    m.held = [*filter(lambda e: e.weight.size(0) == VOCAB, tables)] + scalars


def _comparable(module: nn.Module, layers: list[tuple[str, nn.Module]], blocks: list[LayerMap]) -> None:
    """MappingError where handformer's CausalLM cannot be the reference: a module of the blocks' class
    not read as a block (`_all_blocks`), the blocks' feed-forward networks not read alike (nanoMoE's
    mixture of experts in every other block, a dense FFN in the rest): handformer's CausalLM has one in
    every block."""
    _all_blocks(module, layers)
    if len({tuple((s.role, tuple(s.weight().shape)) for s in block.ffn) for block in blocks}) > 1:
        raise MappingError("its blocks' feed-forward networks are not all built alike (a mixture of experts "
                           "in some blocks, one network in others?); handformer's CausalLM has the same "
                           "one in every block, so the model is not compared; its layers are checked on "
                           "their own",
                           zh="它各 Block 的前馈网络结构不全相同（有的 Block 用混合专家，有的用一个网络？）；"
                              "handformer 的 CausalLM 每个 Block 用同一种，所以不比较整个模型；"
                              "它的各层单独检查")


def _all_blocks(module: nn.Module, layers: list[tuple[str, nn.Module]]) -> None:
    """MappingError where a module of the blocks' class is no block check reads (CLA's second layer of
    a pair: wq and wo alone, its keys and values another layer's): handformer's CausalLM has its blocks
    alike, so the model is not compared; named with their parameters."""
    taken = dict(layers)
    kinds = {t for t in map(type, taken.values()) if not t.__module__.startswith("torch.")}  # not ModuleList
    rest = [path for path, m in module.named_modules() if type(m) in kinds and path and path not in taken]
    shown = "; ".join(map(lambda path: shapes_text(prefixed(leaves(module.get_submodule(path)), path)), rest))
    if rest:
        raise MappingError(
            f"its blocks are not all alike: check reads no attention in {', '.join(rest)} ({shown}); "
            "handformer's CausalLM has every block alike, so the model is not compared; its layers are "
            "checked on their own",
            zh=f"它的各 Block 不全相同：检查程序在 {'、'.join(rest)} 里读不出注意力（{shown}）；"
               "handformer 的 CausalLM 每个 Block 都一样，所以不比较整个模型；它的各层单独检查")


def _rotary_(m: GPTMap, module: nn.Module) -> None:
    """The rotary settings of a model without learned positions: its layouts, base, its tables' base
    where that is another, and Llama 3.1's scaling where its tables show it."""
    m.ropes, m.theta, m.table_theta = _rotary(module)
    # frequencies that no schedule explains, in a file that names one: that one (the code departs from it)
    m.rope_scaling = model_scaling(module, m.theta, D // H) or (
        named_schedule(module) if m.table_theta is not None else None)
    if unexplained(module, m.theta, D // H):
        raise MappingError(UNEXPLAINED["en"], zh=UNEXPLAINED["zh"])
    m.table_theta = None if m.rope_scaling else m.table_theta


EMBED_NORM = re.compile(r"(?<![\w.])(?:F\.)?(\w+)\(\s*self\.[\w.\[\]\"']*(wte|emb|tok)")


def _embedding_norm(module: nn.Module, norms: list[Leaf], layers: list[tuple[str, nn.Module]],
                    ) -> tuple[Leaf | None, list[Leaf]]:
    """BLOOM's word_embeddings_layernorm: of two norms outside the blocks (in definition order), one
    defined before them and one after, the first norms the embeddings (the other is the final norm);
    (None, norms) otherwise."""
    place = {id(sub): i for i, sub in enumerate(module.modules())}  # (NaN: a norm none of its modules)
    at = [place.get(id(n.module), math.nan) for n in norms]
    if len(norms) != 2 or not at[0] < place[id(layers[0][1])] < at[1]:
        return None, norms
    return norms[0], norms[1:]


def _embed_norm(module: nn.Module, blocks: list[LayerMap]) -> Leaf | None:
    """nanochat's x = norm(self.transformer.wte(idx)): the token embeddings normed by a function
    without gains before the first block; a gainless norm like the blocks' stands for it."""
    found = EMBED_NORM.search(source_text(type(module).forward))
    norm = blocks[0].norms[0].leaf  # (map_gpt has raised for a model without blocks)
    # the blocks' norm function, not another
    if found is None or not isinstance(norm, Gainless) or found.group(1) not in norm.name:
        return None
    return gainless_norm(f"{found.group(1)}(embeddings) (no gain)", norm_kind(norm), D)


def _normed_when_handed(call: Caller, m: GPTMap, idx: Tensor) -> Leaf | None:
    """nanochat's norm of the token embeddings written on a line of its own (`x = wte(idx)`, then
    `x = norm(x)`): read from what the first block is handed, the embeddings normed by a norm like
    the blocks' own gainless one; None when it is handed anything else."""
    leaf = gainless_norm("norm(embeddings) (no gain)", norm_kind(m.blocks[0].norms[0].leaf), D)
    normed = leaf.module(F.embedding(idx, m.wte.weight))  # (B, T, D)
    return leaf if fp.max_error(_handed(call, m, idx), normed) < fp.TOL else None


class NormedEmbedding(nn.Module):
    """handformer's token embedding followed by the learner's norm of it (nanochat's)."""

    def __init__(self, embed: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.inner, self.norm = embed, norm

    @property
    def weight(self) -> Tensor:
        return self.inner.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.norm(self.inner(ids))


def _grouped_blocks(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks of a model with grouped-query attention (Llama's, minimind's): the items of its
    ModuleLists with two (D, D) projections (W_Q, W_O), two (KV_HEADS * Dh, D) ones and an FFN."""
    kv = (KV_HEADS * (D // H), D)
    return list_items(module, lambda shapes: shapes.count((D, D)) >= 2 and shapes.count(kv) >= 2
                      and any(s[1] == D and s[0] > D for s in shapes))


def _rotary(module: nn.Module) -> tuple[tuple[str | None, ...], float, float | None]:
    """The rotary layouts to try (Meta's complex freqs_cis: interleaved first), the base (the one the
    learner's config names, rope_theta; else read back from its tables; else 10000), and the base of
    its tables when that is another (rope_wrong_base: the config's base not handed to the tables)."""
    from handformer.check.core.rotary import (
        frequency_base,
        module_tables,
        named_base,
        rope_layouts,
        table_base,
    )

    if any(re.search(r"def forward\([^)]*\bcos_sin\b", source_text(type(sub))) for sub in module.modules()
           if type(sub).__module__.startswith("learner_")):  # nanochat's halves, rotated either way
        return ("half", "swapped"), named_base(module) or 10000.0, None
    ropes = rope_layouts(module, False)
    if not set(ropes) - {None, *V.SCORE_BIASES}:  # no rotation: none, or a term on the scores (ALiBi's)
        return ropes, 10000.0, None
    tables = module_tables(module)
    partial = partial_layouts(D // H)  # GPT-NeoX's rotary_pct, Phi's partial_rotary_factor
    ropes = ("interleaved", "half", None, *partial) if any(t.is_complex() for t in tables) else (
        "half", "interleaved", None, *partial)
    named = named_base(module)
    table = table_base(tables, D // H) or frequency_base(module, D // H)
    if named is None:
        return ropes, table or 10000.0, None
    return ropes, named, table if table is not None and abs(table / named - 1) > 1e-3 else None


@dataclass(frozen=True)
class Choices:
    placement: str
    activation: str
    rope: str | None = None  # the rotary layout: "half", "interleaved", or none
    form: Form = PLAIN  # the numbers its blocks take from their settings (Granite's multipliers)

    def describe(self, m: GPTMap) -> Text:
        head_en, head_zh = (HEAD_WORDS[m.tied][i] + BIAS_WORDS[m.bias][i] + NORMED_WORDS[m.normed_head][i]
                            for i in (0, 1))
        pos_en, pos_zh = (ADDED_WORDS[m.added] if m.added is not None
                          else TERM_WORDS.get(self.rope, NO_POSITIONS) if not rotary(self.rope)
                          else (f"rotary positions ({_pairs(self.rope)[0]}, base {m.theta:.0f})",
                                f"旋转位置编码（{_pairs(self.rope)[1]}，底数 {m.theta:.0f}）"))
        pos_en, pos_zh = pos_en + SCALED_WORDS[m.scaled][0], pos_zh + SCALED_WORDS[m.scaled][1]
        if m.rope_scaling is not None:
            said = scaling_words(m.rope_scaling)
            pos_en, pos_zh = pos_en + said["en"], pos_zh + said["zh"]
        if m.n_kv_heads:
            pos_en += f"; grouped-query attention ({H} heads, {m.n_kv_heads} key/value heads)"
            pos_zh += f"；分组查询注意力（{H} 个头，{m.n_kv_heads} 个键/值头）"
        blocks_en, blocks_zh = BLOCK_WORDS.get(self.placement, (f"{self.placement}-norm blocks",
                                                                f"{self.placement.capitalize()}-Norm Block"))
        factors = (self.form.scale, self.form.residual, m.embed_factor, m.logit_factor)
        said_en, said_zh = _factor_words(factors)
        return text(f"output head {head_en}; {blocks_en}; {self.activation} FFN; {pos_en}{said_en}",
                    f"输出层{head_zh}；{blocks_zh}；{self.activation} 前馈网络；{pos_zh}{said_zh}")


def _factor_words(values: tuple[float | None, ...]) -> tuple[str, str]:
    """The configured numbers a model is compared at (FACTOR_WORDS' order), in words (en, zh)."""
    en = zh = ""
    for (e, z), value in zip(FACTOR_WORDS, values):
        if value not in (None, 1.0):
            en += f"; {e.format(value)} (read from your settings)"
            zh += f"；{z.format(value)}（从你的配置读出）"
    return en, zh


# the configured numbers a model is compared at, in words (en, zh)
FACTOR_WORDS = (("scores times {:g}", "分数乘以 {:g}"),
                ("each sublayer's output times {:g}", "每个子层的输出乘以 {:g}"),
                ("token embeddings times {:g}", "词嵌入乘以 {:g}"), ("logits times {:g}", "logits 乘以 {:g}"))


def rotary(rope: str | None) -> str | None:
    """The rotary layout of a reading of the positions inside the attention; None for none, and for a
    term on the scores (ALiBi's, T5's: V.SCORE_BIASES)."""
    return dict.fromkeys(V.SCORE_BIASES).get(rope, rope)


NO_POSITIONS = ("no positions", "没有位置编码")
# a term on the scores as the convention says it (en, zh)
TERM_WORDS = {"alibi": ("ALiBi (each head's slope times the key's position, on the scores)",
                        "ALiBi（每个头的斜率乘以键的位置，加到分数上）"),
              "t5": ("T5's relative-position bias", "T5 的相对位置偏置"),
              "t5_causal": ("T5's relative-position bias (a decoder's)", "T5 的相对位置偏置（解码器的）")}


def _pairs(rope: str) -> tuple[str, str]:
    """A rotary layout in words (en, zh): "half pairs", and the dims it turns where it is partial."""
    layout, _, part = rope.partition(":")
    return (f"{layout} pairs" + f" on the first {part} dims of each head" * bool(part),
            ROPE_ZH[layout] + f"，只转每个头的前 {part} 维" * bool(part))


# parallel blocks (GPT-J's, GPT-NeoX's, Falcon's, Phi's), as the convention says them (en, zh)
BLOCK_WORDS = {"parallel": ("parallel blocks, x + attn(norm(x)) + ffn(norm(x))",
                            "并行 Block，x + attn(norm(x)) + ffn(norm(x))"),
               "reordered": ("blocks norming each sublayer's output, x + norm(f(x)) (OLMo 2's)",
                             "Block 对每个子层的输出归一化，x + norm(f(x))（OLMo 2 的写法）")}


POSITION_OFFSET_NOTE = text(
    f"its learned position table has {OPT_OFFSET} rows more than the positions: position p is compared at "
    f"row p + {OPT_OFFSET}, OPT's convention (fairseq's rows kept before the first position)",
    f"它的可学习位置表比位置数多 {OPT_OFFSET} 行：位置 p 按第 p + {OPT_OFFSET} 行比较，这是 OPT 的约定"
    "（fairseq 在第一个位置前留了几行）")
# the output head as the convention says it (en, zh): tied or not, with a bias or not
ADDED_WORDS = {"learned": ("learned positions", "可学习的位置编码"),
               "sinusoidal": ("sinusoidal positions", "正弦位置编码")}
HEAD_WORDS = {True: ("tied to the token embedding", "与词嵌入共享权重"), False: ("separate", "独立的权重")}
BIAS_WORDS = {True: (", with a bias", "，有偏置"), False: ("", "")}
NORMED_WORDS = {True: (", each row L2-normalised before the product (Baichuan 2's NormHead)",
                       "，相乘前每一行先做 L2 归一化（百川 2 的 NormHead）"), False: ("", "")}
SCALED_WORDS = {True: ("; token embeddings times sqrt(d_model)", "；词嵌入乘以 sqrt(d_model)"),
                False: ("", "")}
PLACEMENTS = ("pre", "post", "parallel", "reordered")  # the blocks' placements the search tries, in order
BY_NORMS = {4: ("sandwich",)}  # four norms a block: Gemma 2/3's, the one placement they are read in
# handformer's norms of a block with two (one a sublayer) or four (Gemma 2/3's sandwich: before and
# after each sublayer)
NORM_NAMES = {2: ("attn_norm", "ffn_norm"), 4: ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm")}
HF_PLACEMENT = {"parallel": "pre"}  # handformer's blocks a placement is built from (then run in parallel)
ROPE_ZH = {"half": "前后两半配对", "interleaved": "相邻两维配对", "swapped": "前后两半配对、反向旋转"}


# the checks that compare with handformer's model (the others are properties of the learner's alone)
COMPARED = (text("matches handformer's CausalLM on your weights and choices on 3 shapes",
                 "在 3 种形状上与使用你的权重和写法的 handformer CausalLM 一致"),
            text("the loss equals the cross-entropy of handformer's logits",
                 "损失等于 handformer 的 logits 的交叉熵"))


def reference_model(m: GPTMap, ch: Choices) -> CausalLM:
    """handformer's CausalLM with the learner's weights and choices (a final norm of weight 1 and
    bias 0 where the learner has none); built once for each set of choices."""
    if ch not in m.built:
        m.built[ch] = _reference_model(m, ch)
    return m.built[ch]


def _copy_blocks_(hf: CausalLM, m: GPTMap, ch: Choices) -> None:
    """The learner's attention and FFN weights into the reference's layers (norms apart)."""
    for target, block in zip(hf.layers, m.blocks):
        target.self_attn = with_sinks(target.self_attn, block.attn[0])  # gpt-oss's
        copy_attention(target.self_attn, block.attn[0])
        if ch.rope in V.SCORE_BIASES:  # ALiBi's: handformer's attention with that term on the scores
            target.self_attn = handformer_attention(block.attn[0], m.n_kv_heads, ch.rope)
        if ch.rope in ("interleaved", "swapped"):
            interleaved_to_half_(target.self_attn, swapped=ch.rope == "swapped")
        copy_ffn(target.ffn, block.ffn)


def _family(m: GPTMap, ch: Choices) -> FamilyConfig:
    """What a family changes that the learner's model does: Gemma 2's soft caps (the logits', the
    attention scores'), Granite's multipliers."""
    return FamilyConfig(logit_softcap=m.softcap, attn_softcap=m.attn_softcap, **_multipliers(m, ch.form))


def _reference_model(m: GPTMap, ch: Choices) -> CausalLM:
    m = _in_call_order(m)
    first, act = learner_norm(m.blocks[0].norms[0]), HF_NAME[(is_gated(m.blocks[0].ffn), ch.activation)]
    cfg = CausalLMConfig.gpt2_style(
        vocab_size=VOCAB, d_model=D, n_heads=H, d_ff=m.blocks[0].ffn[0].weight().size(0),
        n_layers=len(m.blocks), dropout=0.0, activation=built_activation(act),
        norm_placement=HF_PLACEMENT.get(ch.placement, ch.placement),
        norm=first.kind, norm_eps=positive_eps(first.eps),  # LayerNorm or RMSNorm, as theirs
        position=m.added or ("rope" if rotary(ch.rope) else "none"), rope_theta=m.theta,
        rope_scaling=m.rope_scaling if rotary(ch.rope) else None,  # the schedule its frequencies show
        rope_fraction=turned_width(rotary(ch.rope) or "", D // H) / (D // H),  # partial rotary: "half:2"
        max_positions=m.wpe.weight.size(0) - m.offset if m.wpe is not None else BLOCK, tie_embeddings=m.tied,
        n_kv_heads=m.n_kv_heads, qk_norm=_qk_norm(m), scale_embeddings=m.scaled,
        moe=moe_config(m.blocks[0].ffn), **_window_settings(m.windows),  # MoE; Mistral's, gpt-oss's windows
        family=_family(m, ch))
    hf = plain_activation_(build_causal_lm(cfg), act)  # (a GPT-2 style config: the plain CausalLM)
    if m.bias:
        hf.lm_head = nn.Linear(D, VOCAB, bias=True)
        if m.tied:
            hf.lm_head.weight = hf.embed.weight
    hf = hf.double().eval()
    _copy_outer_(hf, m)
    _copy_blocks_(hf, m, ch)
    written = []
    for target, block in zip(hf.layers, m.blocks):
        for name, slot in zip(NORM_NAMES[len(block.norms)], block.norms):
            copy_weights(getattr(target, name), slot)
            written.append((target, name, slot))
        written += [(target.self_attn, s.role, s) for s in block.attn[0] if s.role in ("q_norm", "k_norm")]
    if m.ln_f is not None and hasattr(hf.norm, "weight"):
        copy_weights(hf.norm, m.ln_f)
        written.append((hf, "norm", m.ln_f))
    exact_norms_(hf)
    as_written_(written)
    as_parallel_(list(hf.layers) * (ch.placement == "parallel"),  # GPT-J's, GPT-NeoX's, Falcon's, Phi's
                 [len({id(s.leaf) for s in block.norms}) == 1 for block in m.blocks])  # one norm: shared
    return _with_embed_norm(hf, m)


def _in_call_order(m: GPTMap) -> GPTMap:
    """The map with its blocks as the learner's model calls them (block_order.py), one reference layer
    for each call; as it is where each block is called once."""
    if not m.order:
        return m
    windows = tuple(map(dict(enumerate(m.windows)).get, m.order))  # (none measured: every key seen)
    return replace(m, blocks=[*map(m.blocks.__getitem__, m.order)], windows=windows)


@torch.no_grad()
def _copy_outer_(hf: CausalLM, m: GPTMap) -> None:
    """The learner's embeddings and head into the reference's (the head's rows L2-normalised where
    the learner's head normalises them: Baichuan 2's NormHead)."""
    hf.embed.weight.copy_(m.wte.weight)
    if m.wpe is not None:
        hf.positions.weight.copy_(m.wpe.weight[m.offset:])
    if m.head is not None:
        copy_weights(hf.lm_head, Slot("head", m.head))
    hf.lm_head.weight.copy_(HEAD_ROWS[m.normed_head](hf.lm_head.weight))


HEAD_ROWS = {False: lambda w: w, True: lambda w: F.normalize(w, dim=-1)}  # the head's weight as it multiplies


def _window_settings(windows: tuple[int | None, ...]) -> dict[str, Any]:
    """handformer's sliding_window and global_layers for the blocks' measured windows (one window,
    some blocks global); none where no block slides or their windows differ."""
    sizes = set(windows) - {None}
    if len(sizes) != 1:
        return {}
    return {"sliding_window": min(sizes), "global_layers": [i for i, w in enumerate(windows) if w is None]}


def _window_note(windows: tuple[int | None, ...]) -> list[Text]:
    """What the report says of the blocks' sliding windows, where some block has one."""
    settings = _window_settings(windows)
    if not settings:
        return []
    sliding = ", ".join(map(str, sorted(set(range(len(windows))) - set(settings["global_layers"]))))
    W = settings["sliding_window"]
    return [text(f"a sliding window on blocks [{sliding}]: each sees its last {W} tokens (measured: "
                 "changing token 0 moves only that many of its outputs), the other blocks every earlier "
                 "token: compared with handformer under the same windows",
                 f"Block [{sliding}] 用滑动窗口：每个只看最近的 {W} 个 token（实测：改变 token 0 只影响它"
                 "这么多个输出），其余 Block 看所有之前的 token：按相同的窗口与 handformer 比较")]


def _windows_measured(res: ComponentResult, call: Caller, m: GPTMap) -> None:
    """The blocks' sliding windows measured and noted; their one window checked against the window the
    model's settings name (a mask off by one fails, quoting the line that bands it)."""
    m.windows = block_windows(call, m)
    res.notes += _window_note(m.windows)
    window = _window_settings(m.windows).get("sliding_window")
    if window:
        declared_window(res, call.module, window)




def block_windows(call: Caller, m: GPTMap) -> tuple[int | None, ...]:
    """Each block's sliding window, measured: the inputs it is handed in one run of the model, then the
    block alone with position 0 of its input changed; the outputs that move are its window."""
    idx = torch.randint(0, VOCAB, (1, WINDOW_T), generator=torch.Generator().manual_seed(7))
    blocks = [call.module.get_submodule(b.name) for b in m.blocks]
    seen: dict[int, tuple[Any, Any]] = {}
    hooks = [block.register_forward_pre_hook(lambda _, args, kwargs, i=i: seen.setdefault(i, (args, kwargs)),
                                             with_kwargs=True) for i, block in enumerate(blocks)]
    with fp.hooked(hooks):
        fp.quietly(lambda: call(idx))
    return tuple(fp.quietly(lambda i=i: _reach(blocks[i], *seen[i])) for i in range(len(blocks)))


def _reach(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The outputs (B, T, D) a change of the first position of the block's input moves, where fewer
    than all and the first ones: its window; None where it sees every key. A block handed one sequence
    (T, D) (gpt-oss's) is read as a batch of one."""
    x = args[0]
    bumped = x.clone()
    bumped[..., 0, :] += fp.randn(x.size(-1), seed=6).to(x.dtype)  # not a constant: a LayerNorm would take it
    a = fp.first_tensor(block(x, *args[1:], **kwargs), x.dim())
    b = fp.first_tensor(block(bumped, *args[1:], **kwargs), x.dim())
    moved = (a - b).abs().reshape(-1, *a.shape[-2:]).amax(dim=(0, 2)) > 1e-9  # (T,)
    reach = int(moved.sum())
    banded = bool(moved[:reach].all()) & (0 < reach < x.size(-2))  # the first `reach` outputs, not all
    return reach if banded else None


def _multipliers(m: GPTMap, form: Form) -> dict[str, float | None]:
    """The configured numbers as handformer's Granite variants take them (None: not scaled)."""
    return {"attention_multiplier": form.scale,
            "residual_multiplier": form.residual if form.residual != 1 else None,
            "embedding_multiplier": m.embed_factor,
            "logits_scaling": 1 / m.logit_factor if m.logit_factor else None}


def _configured_factors(call: Caller, m: GPTMap, idx: Tensor) -> tuple[float | None, float | None]:
    """The factors on the token embeddings (what the first block is handed) and on the logits (what
    the output head gives) that a setting of the model's code names: Granite's embedding_multiplier,
    Cohere's logit_scale, each a factor; Granite's logits_scaling, which the logits are divided by
    (DIVIDED_BY). None for each that is 1, no constant factor, or a factor nobody configured."""
    factors = model_factors(call.module)
    other = (idx + 1) % VOCAB
    handed = _handed(call, m, idx) - _handed(call, m, other)  # (B, T, D): the positions cancel
    embed = configured_ratio(handed, m.wte.weight[idx] - m.wte.weight[other], factors)
    if m.head is None and m.ln_f is None:  # nothing to read the logits' factor at
        return embed, None
    # what the head gives, once it is called; a forward that multiplies by the embedding (F.linear(x,
    # wte.weight)): the final norm's output times the embedding (a module never called: no factor)
    heads = [torch.zeros(())]
    hooked, read = (m.head.module, lambda out: out) if m.head is not None else (
        m.ln_f.leaf.module, lambda out: out @ m.wte.weight.T)
    handle = hooked.register_forward_hook(lambda _, args, out: heads.append(read(out)))
    with fp.hooked([handle]):
        logits = call(idx)[0]
    head = batch_first_by_shape(heads[-1], *idx.shape)  # (B, T, V), read so from a head called on (T, B, D)
    return embed, configured_ratio(logits, head, factors) or _head_input_factor(call, m, idx, factors)


def _head_input_factor(call: Caller, m: GPTMap, idx: Tensor, factors: list[float]) -> float | None:
    """A configured factor on what a head without a bias is handed, the final norm's output times it
    (MiniCPM's `lm_head(hidden_states / (hidden_size / dim_model_base))`): the logits' factor so."""
    if m.head is None or m.head.bias is not None or m.ln_f is None:
        return None
    seen: dict[str, Tensor] = {}
    handles = [m.head.module.register_forward_pre_hook(lambda _, args: seen.update(head=args[0])),
               m.ln_f.leaf.module.register_forward_hook(lambda _, args, out: seen.update(norm=out))]
    with fp.hooked(handles):
        call(idx)
    if {"head", "norm"} - set(seen) or seen["head"].shape != seen["norm"].shape:
        return None
    return configured_ratio(seen["head"], seen["norm"], factors)


def configured_ratio(x: Tensor, y: Tensor, factors: list[float]) -> float | None:
    """c where x = c * y and c is one of `factors`; else None (a y of zeros, or NaN: none)."""
    if x.shape != y.shape:  # a tensor in another layout than the reading expects: no factor read
        return None
    c = float((x * y).sum() / (y * y).sum())
    fits = fp.max_error(x, c * y) < fp.TOL * max(1.0, abs(c))
    return c if fits and any(math.isclose(c, v, rel_tol=1e-6) for v in factors) else None


def _with_embed_norm(hf: CausalLM, m: GPTMap) -> CausalLM:
    if m.embed_norm is not None:
        hf.embed = NormedEmbedding(hf.embed, m.embed_norm.module)
    return hf


def _qk_norm(m: GPTMap) -> str:
    """"head" when the learner's attentions norm each query and key head (QK-norm), "width" when
    they norm all the heads together (OLMo 2's q_norm as wide as the queries), else "none"."""
    widths = frozenset(s.leaf.weight.numel() for s in m.blocks[0].attn[0] if s.role == "q_norm")
    return {frozenset(): "none", frozenset({D // H}): "head"}.get(widths, "width")


def keep_of(T: int, flags: frozenset[str]) -> Tensor:
    """(T, T) the keys each query sees with these mistakes."""
    if "causal_mask_missing" in flags:
        return torch.ones(T, T, dtype=torch.bool)
    return V.causal_keep(T, flags)


def variant(hf: CausalLM, idx: Tensor, flags: frozenset[str], table_theta: float | None = None) -> Tensor:
    """The logits (B, T, V) with the named mistakes (rope_wrong_base: the tables' base, not the config's)."""
    T = idx.size(1)
    x = hf.embed(idx)  # (B, T, D)
    if "pe_missing" not in flags:
        x = x + hf.positions(torch.arange(T)[None])
    mask = as_attention_mask(keep_of(T, flags)[None, None])
    if hf.cfg.sliding_window is not None and torch.equal(keep_of(T, flags), V.causal_keep(T)):
        mask = hf.build_mask(T, 0, None, NO_CACHE, idx.device)  # each layer's window, as handformer's
    rotary = hf.rotary
    if "rope_wrong_base" in flags and table_theta is not None:
        rotary = RotaryEmbedding(D // H, BLOCK, table_theta).double()
    rope = rotary(torch.arange(T)[None])  # (cos, sin), or None without rotary positions
    for layer in hf.layers:
        x = layer(x, mask, rope=rope)[0]
    if "final_norm_missing" not in flags:
        x = hf.norm(x)
    return hf.lm_head(x)


def losses_alone(raw: Any, targets: Tensor | None) -> bool:
    """Whether forward, handed targets, gave back their loss and no logits: one number (nanochat's), or
    one a target (B, T) (Megatron's per-token losses, averaged by its training step)."""
    return isinstance(raw, Tensor) and targets is not None and raw.shape in ((), targets.shape)


class Caller:
    """idx (B, T) -> (logits (B, T, V) or (B, 1, V), loss or None), with targets when forward takes them."""

    def __init__(self, module: nn.Module, ctx: Context) -> None:
        self.module, self.ctx = module, ctx
        names, required = names_of(forward_parameters(module))
        self.target = named(names, TARGET_NAMES)
        # a Llama 2 chat model's forward(tokens, start_pos=0, cache=None): a cache handed in, positions given
        self.position = named(names, ("start_pos",))
        # Meta's forward(tokens, start_pos): the whole sequence from position 0
        self.start = self.position if self.position in required else None
        # gpt-fast's forward(idx, input_pos) on what setup_caches(max_batch_size, max_seq_length) makes
        self.setup = setup_of(module, BLOCK, functools.partial(ctx.learner.call, "__init__"))
        # Mistral's forward(input_ids, positions), Hugging Face's position_ids: the positions it requires,
        # one row (T,); a set-up model's positions by any name that says so, required or not (gpt-fast's
        # input_pos=None)
        said = next(filter(SAID_POSITIONS.search, names), None)
        required_positions = named(required, ("positions", "position_ids"))
        self.positions = {False: required_positions, True: said}[self.setup is not None]
        self.rows = False  # the positions one row a sequence (B, T), Hugging Face's position_ids, once known
        self.cache_arg = named(names, CACHE_ARGS)
        # mistral-src's forward(input_ids, positions, cache): a fresh cache of its maker for every call
        self.fresh = cache_maker(module) if self.cache_arg in required else None

        self.returned: Any = None  # what forward gave back last, for a message
        self.stepwise = False  # Umar Jamil's forward asserts one token at a time: driven so, once known
        self.unbatched = False
        self.extra: dict[str, Any] = {}  # more arguments for its forward (a padding mask)
        self.padding = False  # Hugging Face's forward(input_ids, attention_mask): a (B, T) mask of ones
        self.unbatched = self._one_sequence()  # gpt-oss's forward(x): (T,) ids -> (T, V), no batch
        self.mask_name, self.mask_form = next(filter(is_mask_name, names), None), None
        # PyTorch's nn.Transformer tutorial: (T, B) ids in, (T, B, V) logits out, with the mask it requires
        self.first = any(map(self._reads_first, (None, *CAUSAL_FORMS[:self.mask_name in required and 9])))
        self.mask_form = self.mask_name and self._causal_form()
        # a padding mask it requires (1 = a real token): Hugging Face's attention_mask, or its mask by another
        # name that takes no causal form (vLLM's key_mask (B, S))
        self.padding_name = next((n for n in (MASK_NAME, self.mask_name) if n in required), None)
        self.padding = bool(not self.mask_form and self.padding_name and self._takes_padding())

    def _reads_first(self, form: Any) -> bool:
        """Whether forward reads square ids (7, 7) sequence-first, handed a causal mask (7, 7) in `form`
        (None: no mask), which either reading of the ids fits."""
        dtype = next(self.module.parameters()).dtype
        mask = {} if form is None else {self.mask_name: form(torch.ones(7, 7).tril().bool(), dtype)}
        ids = torch.randint(0, 9, (7, 7), generator=torch.Generator().manual_seed(3))
        return reads_sequence_first(self.ctx, lambda x: self.module(x, **mask), ids)

    def _one_sequence(self) -> bool:
        """Whether forward refuses a batch of ids (B, T) but gives (T, V) logits for one sequence (T,)."""
        ids = torch.randint(0, 9, (2, 7), generator=torch.Generator().manual_seed(3))
        if fp.quietly(lambda: self.module(ids)) is not None:
            return False
        out = fp.quietly(lambda: self.module(ids[0]))
        return tuple(getattr(out, "shape", ())[:-1]) == (7,)  # (T, V)

    def _causal_form(self) -> Any:
        """The form of a causal mask its forward's mask argument takes: the first of CAUSAL_FORMS under
        which changing token 3 leaves the logits before it alone and moves its own; None when it is
        causal without one, or under none (then it is driven without one, and graded so)."""
        idx = torch.randint(0, 9, (1, 5), generator=torch.Generator().manual_seed(3))
        bumped = idx.clone()
        bumped[:, 3] += 1
        for form in (None, *CAUSAL_FORMS):
            self.mask_form = form
            try:
                a, b = self(idx)[0], self(bumped)[0]
            except fp.LearnerFailure:
                continue
            if a is not None and b is not None and a.shape == b.shape and a.size(1) == 5 \
                    and torch.equal(a[:, :3], b[:, :3]) and not torch.equal(a[:, 3:], b[:, 3:]):
                return form
        return None

    def _takes_padding(self) -> bool:
        """Whether its forward, refusing to run without Hugging Face's attention_mask (1 = a real token),
        runs on one of ones (B, T) for B = 2 and T = 7: a causal mask (T, T) handed so would not broadcast."""
        self.padding = True
        ids = torch.randint(0, 9, (2, 7), generator=torch.Generator().manual_seed(3))
        out = fp.quietly(lambda: self(ids)[0])
        return tuple(getattr(out, "shape", ())[:2]) == (2, 7)

    def __call__(self, idx: Tensor, targets: Tensor | None = None, start: int = 0,
                 ) -> tuple[Tensor | None, Tensor | None]:
        if self.stepwise:
            return self._steps(idx, start)
        try:
            return self._once(idx, targets, start)
        except fp.LearnerFailure:
            rows = self._in_rows(idx, targets, start) if self.positions and not self.rows else None
            if rows is not None:  # it refuses positions (T,) and takes them as rows (B, T)
                return rows
            if not self.start or idx.size(1) == 1:
                raise
            try:  # it refuses a whole sequence: one token at a time through its own cache?
                out = self._steps(idx, start)
            except fp.LearnerFailure:
                pass
            else:
                self.stepwise = True
                return out
            raise

    def _in_rows(self, idx: Tensor, targets: Tensor | None, start: int,
                 ) -> tuple[Tensor | None, Tensor | None] | None:
        """`_once` with the positions as rows (B, T) (Hugging Face's position_ids), kept so where it runs;
        None where it refuses them so too."""
        self.rows = True
        out = fp.quietly(lambda: self._once(idx, targets, start))
        self.rows = out is not None
        return out

    def _positions(self, idx: Tensor, start: int) -> Tensor:
        """The positions of idx (B, T) from start: one row (T,), or a row a sequence (B, T) once known."""
        row = torch.arange(start, start + idx.size(1))  # (T,)
        return row.expand(idx.size(0), -1) if self.rows else row

    def with_cache(self, idx: Tensor, start: int, cache: Any) -> Tensor | None:
        """The logits (B, T, V) of idx at positions start.., through the cache handed in."""
        kwargs = {self.position: start, self.positions: self._positions(idx, start),
                  self.cache_arg: cache}
        kwargs.pop(None, None)  # (it takes start_pos, or the positions)
        return fp.first_tensor(self.ctx.learner.call("forward", self.module, idx, **kwargs), 3)

    def _steps(self, idx: Tensor, start: int) -> tuple[Tensor | None, Tensor | None]:
        """The logits (B, T, V) of the tokens given one at a time, token t at start_pos start + t."""
        outs = [self._once(idx[:, t:t + 1], None, start + t)[0] for t in range(idx.size(1))]
        if any(o is None or o.size(1) != 1 for o in outs):
            return None, None
        return torch.cat(outs, dim=1), None  # (B, T, V)

    def _once(self, idx: Tensor, targets: Tensor | None, start: int) -> tuple[Tensor | None, Tensor | None]:
        if self.unbatched:  # each sequence alone, the logits stacked (B, T, V)
            rows = [fp.first_tensor(self.ctx.learner.call("forward", self.module, row), 2) for row in idx]
            return fp.quietly(lambda: torch.stack(rows)), None
        kwargs: dict[str, Any] = {self.target: targets} if self.target and targets is not None else {}
        kwargs.update(self.extra)
        if self.setup and not start:  # a new sequence: its state made afresh for this batch
            self.setup(idx.size(0), idx.size(1))
        if self.start or start:  # DeepSeek's start_pos=0: handed where it is not 0
            kwargs[self.position] = start
        if self.positions:
            kwargs[self.positions] = self._positions(idx, start)
        if self.fresh:
            kwargs[self.cache_arg] = made_cache(self.ctx, self.fresh[1], idx.size(0), self.module)
        if self.mask_form:  # the causal mask its caller builds, in the form it takes
            dtype = next(self.module.parameters()).dtype
            kwargs[self.mask_name] = self.mask_form(torch.ones(idx.size(1), idx.size(1)).tril().bool(), dtype)
        if self.padding:  # no padding (every token real), unless a padding mask is handed
            kwargs.setdefault(self.padding_name, torch.ones(idx.shape, dtype=torch.long))
        if self.first:
            return batch_first(self.ctx.learner.call("forward", self.module, idx.T, **kwargs)), None
        asked = self.target in kwargs  # no targets handed, no loss of them (an MoE's aux loss beside logits)
        raw = self.ctx.learner.call("forward", self.module, idx, **kwargs)
        if self.target in kwargs and losses_alone(raw, targets):  # nanochat's loss, Megatron's per token
            kwargs.pop(self.target)
            raw = (self.ctx.learner.call("forward", self.module, idx, **kwargs), raw.mean())
        if not isinstance(raw, (Tensor, tuple, list)) and isinstance(getattr(raw, "logits", None), Tensor):
            raw = (raw.logits, getattr(raw, "loss", None))  # Hugging Face's output object (minimind's)
        if isinstance(raw, dict):  # fairseq's encoder: {"encoder_out": ..., ...}, read as its values
            raw = tuple(raw.values())
        self.returned = raw
        items = fp.outputs(raw)  # (logits, loss, ...), or logits
        logits, first = fp.first_tensor(items, 3), fp.first_tensor(items[:1], 2)
        if logits is None and first is not None:
            logits = _flat_logits(first, idx)
        # the loss: the one number it returns (Hugging Face's (loss, logits, presents)), else a tensor of one
        # element second (not the hidden states a model returns beside its logits for contrastive search)
        second = [t for t in items[1:2] if getattr(t, "numel", int)() == 1]
        return logits, fp.first_tensor([fp.first_tensor(items, 0), *second] * asked)


def _flat_logits(first: Tensor, idx: Tensor) -> Tensor | None:
    """2-D logits as (B, T, V): Karpathy's (B * T, V) when given targets; DeepSeek's (B, V), the last
    position's alone, as (B, 1, V); None for other rows, or a tensor of no floats (a padding mask)."""
    rows = {(idx.numel(), True): lambda: first.view(*idx.shape, -1),
            (idx.size(0), True): lambda: first[:, None]}
    return rows.get((first.size(0), first.is_floating_point()), lambda: None)()


def _rows(B: int, T: int, flags: frozenset[str]) -> Tensor:
    return keep_of(T, flags).any(-1)[None].expand(B, T)  # (B, T): queries that see a key


def gpt_sizes(ctx: Context) -> dict[str, Any]:
    """The model's sizes: with KV_HEADS key/value heads when the file has a field for them (Llama's
    n_kv_heads, minimind's num_key_value_heads), so that grouped-query attention is what is checked."""
    from handformer.check.core.discovery import ARGUMENTS

    source = _file(ctx)  # "": no name read
    kv = any(re.search(rf"\b{name}\b", source) for name in ARGUMENTS["n_kv_heads"])
    return {**GPT_SIZES, "n_kv_heads": KV_HEADS} if kv else GPT_SIZES


def _set_up(comp: Component, res: ComponentResult, call: Caller) -> None:
    """A model whose forward reads what a method of its own makes first (gpt-fast's setup_caches): the
    note that says how it is called (setup_method.py); NOT CHECKED, with the reason, where forward still
    raises after it."""
    if call.setup is None:
        return
    res.notes.append(call.setup.note())
    try:
        call(torch.zeros(1, 2, dtype=torch.long))
    except fp.LearnerFailure:
        name = f"{call.setup.name}({', '.join(call.setup.arguments(1, BLOCK))})"
        raise MappingError(f"{comp.name}.forward runs on what {name} makes first (gpt-fast's KV caches), "
                           f"and forward after {name} raised: its attention, FFN and norm are checked alone",
                           zh=f"{comp.name}.forward 依赖 {name} 先建好的东西（gpt-fast 的 KV 缓存），调用 "
                              f"{name} 之后 forward 仍然报错：它的注意力、FFN 和归一化各自单独检查") from None


def _vectors_in(comp: Component, ctx: Context, res: ComponentResult, module: nn.Module,
                ) -> ComponentResult | None:
    """A model with no table of the vocabulary (an nn.Embedding, or a (V, D) parameter it indexes)
    maps vectors to vectors (lucidrains' `Transformer(dim, depth, heads, dim_head)`, a stack of blocks
    and a norm): it takes no token ids, so it is no GPT to drive; it is checked as a stack, handed
    (B, T, D) vectors alone where its other arguments have defaults. None for a model of token ids."""
    embeds = any(isinstance(m, nn.Embedding) for m in module.modules())  # a padded vocabulary too
    if embeds or any(VOCAB in p.shape for p in module.parameters()):
        return None
    unstacked = DiscoveryError(
        f"{comp.name} has no table of the vocabulary (no nn.Embedding): it maps vectors to vectors (a "
        "stack of blocks), not token ids to logits, so it is not driven as a decoder-only model; its "
        "attention and FFN are checked on their own",
        zh=f"{comp.name} 没有词表（没有 nn.Embedding）：它把向量映射成向量（一叠 Block），"
           "不是把 token id 映射成 logits，所以不按 decoder-only 模型调用；它的注意力和前馈网络单独检查")
    if any(p.default is p.empty for p in forward_parameters(module)[1:]):
        raise unstacked
    x = fp.randn(2, 8, D, seed=3)  # (B, T, D)
    handed = _kept_mask(module, x)
    return check_stack(comp, res, module, lambda: ctx.learner.call("forward", module, x, **handed), unstacked)


def _kept_mask(module: nn.Module, x: Tensor) -> dict[str, Tensor]:
    """What a stack of vectors is handed besides them: nothing where it runs on them alone, else a mask
    of ones under its mask argument's name (DistilBERT's Transformer(x, attn_mask=None), whose layers
    read the mask whatever its default): 1 = keep in Hugging Face's convention; nothing where the
    output is then not finite (a convention that reads 1 as hidden), the stack left unchecked."""
    names = [p.name for p in forward_parameters(module)[1:] if "mask" in p.name.lower()][:1]
    if fp.quietly(lambda: module(x)) is not None:
        return {}
    handed = {name: torch.ones(x.shape[:2], dtype=torch.long) for name in names}  # (B, T)
    finite = fp.quietly(lambda: bool(fp.first_tensor(module(x, **handed)).isfinite().all()))
    return handed if finite else {}


def _held_backbone(comp: Component) -> DiscoveryError:
    """Why a backbone that calls fewer than two layers is not checked as a stack."""
    return DiscoveryError(
        f"{comp.name} returns hidden states (B, T, d_model), not logits, and another class of the file "
        "builds it or it holds no output layer: a backbone, checked through a model that adds the head",
        zh=f"{comp.name} 返回隐藏状态 (B, T, d_model)，不是 logits，而且文件里另一个类构造了它，"
           "或者它没有输出层：这是主干网络，通过加上输出层的模型来检查")


def _backbone(comp: Component, ctx: Context, module: nn.Module, out: Tensor | None, returned: Any,
              idx: Tensor) -> bool:
    """Whether the model returns hidden states (B, T, D), not logits, and another class of the file
    builds it (OPT's OPTDecoder, inside OPTModel inside OPTForCausalLM) or it holds no output layer
    (Hugging Face's GemmaModel: a forgotten tied head looks the same): a backbone, checked as a stack.
    One returning a tuple or a dict with no (B, T, ...) tensor in it, or one score a sequence (B,) or
    (B, 1) (a reward or value model: a head on a backbone), is no language model (a forgotten `return`,
    None, is a failure)."""
    _other_form(comp, out, returned, idx)  # no (B, ...) tensor at all: NOT CHECKED first
    scores = fp.first_tensor(returned)  # (B,) or (B, 1), and no logits: a reward or value head
    one_a_row = scores is not None and scores.dim() > 0 and scores.numel() == scores.size(0) and (
        out is None or out.size(-1) == 1)
    if out is None and isinstance(returned, tuple) or one_a_row:
        raise DiscoveryError(
            f"{comp.name}'s forward returns {shape_of(returned)}: no logits (B, T, vocab_size) in it (one "
            "score a sequence is a reward or value model's), so it is not driven as a decoder-only model; "
            "its layers are checked on their own",
            zh=f"{comp.name} 的 forward 返回 {shape_of(returned)}：里面没有 logits (B, T, vocab_size)"
               "（每个序列一个分数，是奖励模型或价值模型），所以不按 decoder-only 模型调用；它的各层单独检查")
    others = "".join(source_text(o) for name, o in own_objects(ctx.module).items() if name != comp.name)
    heads = with_shape(of_kind(leaves(module), "linear"), (VOCAB, D))
    held = re.search(rf"\b{re.escape(comp.name)}\(", others) or not heads or _head_read_apart(heads, others)
    return out is not None and out.size(-1) == D and bool(held)


def _head_read_apart(heads: list[Any], others: str) -> bool:
    """Whether another function of the file reads the output layer (`model.lm_head.weight` in a chunked
    cross entropy): the forward returns the hidden states on purpose, the loss applies the head."""
    names = "|".join(re.escape(head.name.rsplit(".", 1)[-1]) for head in heads)
    return re.search(rf"\.(?:{names})\b", others) is not None


def check_cached(comp: Component, ctx: Context) -> ComponentResult:
    """A model with a KV cache: one whose forward takes no cache and whose caches a method of its own
    makes (setup_method.py: an allocate_kv) is driven as a model; else as kv_cache.py drives one."""
    own = setup_name(comp.obj) and not set(inspect.signature(comp.obj.forward).parameters) & set(CACHE_ARGS)
    return {True: check_gpt, False: check_kv_cache}[bool(own)](comp, ctx)


def _other_form(comp: Component, out: Tensor | None, returned: Any, idx: Tensor) -> None:
    """NOT CHECKED where forward, handed ids (B, T), gives no logits (B, ...) at all but a tensor of
    fewer dimensions that does not start with the batch (a bigram table's (T, V) for the last row it
    indexes, the next token's (V,)): a model of one sequence, or of a list of ids, driven in a form it
    does not take; its own computation is not what failed."""
    got = fp.first_tensor(returned)
    if out is not None or not isinstance(got, Tensor) or got.dim() >= 3 or got.shape[:1] == idx.shape[:1]:
        return
    raise DiscoveryError(
        f"{comp.name}'s forward, handed token ids of shape {tuple(idx.shape)} (batch, time), returned "
        f"{shape_of(returned)}: not logits (B, T, vocab_size), so it takes its input in another form (one "
        "sequence, a list of ids, the next token's logits alone): write an adapter that calls it on a batch",
        zh=f"{comp.name} 的 forward 接到形状为 {tuple(idx.shape)}（batch, time）的 token id，返回了 "
           f"{shape_of(returned)}：不是 logits (B, T, vocab_size)，所以它的输入是另一种形式（一个序列、"
           "id 列表、只给下一个 token 的 logits）：请写一个按批调用它的适配函数")


def check_gpt(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    try:
        module = ctx.build(comp, gpt_sizes(ctx))
    except MappingError as err:  # parts check cannot give weights of its own (a depthwise convolution)
        return _unmapped(res, ctx, comp, Caller(_as_built(ctx, comp), ctx), _batch(), err)
    return _check_built(res, ctx, comp, module)


def _check_built(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module) -> ComponentResult:
    """The model built with check's weights: driven, mapped onto handformer's CausalLM and compared."""
    stacked = check_scores(res, ctx, comp, module, VOCAB) or _vectors_in(comp, ctx, res, module)
    if stacked is not None:
        return stacked
    call = Caller(module, ctx)
    _set_up(comp, res, call)
    res.notes += [SEQUENCE_FIRST] * call.first
    idx, targets = _batch()
    check_determinism(res, ctx, comp, lambda: call(idx, targets)[0], "causal_attention", "block", "ffn")
    with fp.dropout_off():
        out, loss = call(idx, targets)
        if _backbone(comp, ctx, module, out, call.returned, idx):
            return check_stack(comp, res, module, lambda: call(idx, targets)[0], _held_backbone(comp))
        last_only = out is not None and out.size(1) == 1
        if not logits_shape(res, out, (2, 1 if last_only else 8, VOCAB), "vocab_size"):
            return finish(res)
        if last_only:
            res.notes.append(text("forward returns the last position's logits only: compared there",
                                  "forward 只返回最后一个位置的 logits：只比较这一个位置"))
        if bigram(res, module, out, loss, idx, targets):
            return finish(res)
        try:
            if (lm := latent.read_model(module, VOCAB)) is not None:  # DeepSeek's: blocks on latent attention
                return _latent_model(res, ctx, comp, call, out, lm, idx)
            find_layouts_(module, lambda: call(idx[:, :1])[0], D, D // H)
            m = _position_a_token(call, map_gpt(module), idx)
        except MappingError as err:  # the checks above ran; the comparison could not
            return _unmapped(res, ctx, comp, call, (idx, targets), err)
        res.mapping = m.describe()
        res.notes += moe_note(m.blocks[0].ffn) + _held_note(m) + [POSITION_OFFSET_NOTE] * bool(m.offset)
        ctx.unmapped[comp.name] = _held_words(m) + _terms(module, m)  # unnamed: NOT CHECKED
        out, loss = call(idx, targets)  # again: the extra tables are held at zero
        _read_conventions(call, m, idx)
        _tied_despite_config(res, ctx, comp, m)
        _compare(res, ctx, comp, m, call, out, loss, idx, targets, last_only)
    return finish(res)


def _batch() -> tuple[Tensor, Tensor]:
    """Token ids (2, 8) and targets (2, 8), drawn apart."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (2, 8), generator=g), torch.randint(0, VOCAB, (2, 8), generator=g)


def whole_context(idx: Tensor) -> Tensor:
    """The ids (B, T) and the same reversed after them, cut at the context check builds: (B, BLOCK)."""
    return torch.cat([idx, idx.flip(1)], dim=1)[:, :BLOCK]


def _as_built(ctx: Context, comp: Component) -> nn.Module:
    """The model at its own initial weights, in float64: what no reference compares still has the
    properties every causal language model has (lm_properties.py)."""
    return attributes_double_(ctx.build(comp, gpt_sizes(ctx), checked=False).double()).eval()


WIDE_D = 4 * D  # the d_model of a second build: heads of 16, where a partial rotary turns several pairs


def _base_at_width(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap, module: nn.Module) -> None:
    """rope_wrong_base where check's heads of 4 cannot show it: a partial rotary that turns one pair of
    each (Persimmon's half) turns it at frequency 1 whatever the base. The model is built again with
    d_model 64 and its tables' base read back; one other than the base its config names is that base
    not handed to the tables (the default used)."""
    from handformer.check.core.rotary import named_base, turned_base

    named = named_base(module)
    if (named is None or m.table_theta is not None or m.rope_scaling is not None
            or not any(map(rotary, m.ropes)) or turned_base(module) is not None):
        return
    seen = fp.quietly(lambda: turned_base(ctx.build(comp, {**gpt_sizes(ctx), "d_model": WIDE_D})))
    if seen is None or abs(seen / named - 1) < 1e-3:
        return
    said = text(f"built with d_model {WIDE_D} (heads of {WIDE_D // H}), your rotary tables turn by base "
                f"{seen:g}, though your config names {named:g}",
                f"按 d_model {WIDE_D}（每个头 {WIDE_D // H} 维）构造时，你的旋转位置表用的底数是 {seen:g}，"
                f"而配置写的是 {named:g}")
    res.checks.append(Check(text("the rotary tables turn by the base the config names (read at a wider "
                                 "head: at check's heads of 4 a partial rotary turns one pair, the same at "
                                 "any base)",
                                 "旋转位置表使用配置给出的底数（在更宽的头上读取：check 的头只有 4 维时，"
                                 "部分旋转只转一对维度，任何底数结果都一样）"), False, said))
    lines = source_lines(ctx.objects(comp, "causal_attention", "block"))
    res.findings.append(Finding("rope_wrong_base", said, *locate("rope_wrong_base", lines)))


def _latent_model(res: ComponentResult, ctx: Context, comp: Component, call: Caller, out: Tensor,
                  lm: latent.LatentModel, idx: Tensor) -> ComponentResult:
    """DeepSeek's model on latent attention against the reference, then through the KV cache its
    start_pos fills (as Meta's)."""
    _cached(latent.check_latent_model(res, ctx, comp, out, lm, idx), ctx, comp, call, None, idx)
    return finish(res)


def _read_conventions(call: Caller, m: GPTMap, idx: Tensor) -> None:
    """What the model computes around its blocks, read from what it hands them and what it returns:
    a norm of the embeddings, their scale and the positions added, a soft cap and the factors its
    settings name (on the embeddings, on the logits)."""
    m.embed_norm = m.embed_norm or _normed_when_handed(call, m, idx)
    m.scaled, m.added = _embedding_reading(call, m, idx)
    m.ropes = m.ropes if m.added is None else (None,)
    m.softcap = _softcap(call, m, idx)
    m.attn_softcap = attention_cap(call.module)
    m.embed_factor, m.logit_factor = _configured_factors(call, m, idx)
    # one call of the model on one token (a model driven a token at a time, or a row at a time, calls
    # its blocks again for each)
    blocks = [call.module.get_submodule(b.name) for b in m.blocks]
    m.order = call_order(blocks, lambda: call._once(idx[:1, :1], None, 0))


def _unmapped(res: ComponentResult, ctx: Context, comp: Component, call: Caller, batch: tuple[Tensor, Tensor],
              err: MappingError) -> ComponentResult:
    """A model whose parts are not handformer's CausalLM's: NOT CHECKED with the reason, and the
    properties every causal language model has checked with no reference (lm_properties.py: a FAIL where
    one breaks); a toy that drives a loop (see drives_only) is a DRIVER, its causality checked besides its
    determinism and logits' shape (a FAIL where one fails)."""
    module, idx = call.module, batch[0]
    if drives_only(module) and latent.latent_child(module) is None:  # latent attention: no toy
        _causality(res, comp, call, idx)
        res.status = DRIVER
        res.notes.append(DRIVER_NOTE)
        return finish(res)
    res.status = NOT_CHECKED
    res.error = LearnerError("mapping", f"not compared with handformer's CausalLM: {err}", "__init__",
                             message_zh=f"没有与 handformer 的 CausalLM 比较：{err.zh or err}")
    free_properties(res, comp, module, call, (whole_context(idx), *batch), _file(ctx))
    if res.findings:  # it fails a property of its own: why it was not compared is a note
        res.notes.insert(0, text(res.error.message, res.error.message_zh))
        res.error = None
    return finish(res)


def _file(ctx: Context) -> str:
    """The source of the learner's file ("" where it cannot be read)."""
    return fp.quietly(lambda: inspect.getsource(ctx.module), (OSError, TypeError), "")


CAUSAL_LM = text("CausalLM", " CausalLM ")


def _terms(module: nn.Module, m: GPTMap) -> list[Text]:
    """The model's linear layers that no role of handformer's CausalLM took (a block's forget gate, a
    router that picks the tokens a block sees), said (unmapped.learned_terms); a top-k of its scores."""
    slots = [s for b in m.blocks for s in itertools.chain(*b.attn, b.ffn, b.norms)]
    return learned_terms(module, slots, CAUSAL_LM, [m.wte.weight, getattr(m.head, "weight", None)]) + (
        top_k_words(module, CAUSAL_LM))


def _held_words(m: GPTMap) -> list[Text]:
    """What the model holds that handformer's CausalLM has not (unmapped.held_words); a table looked up by
    ids of its own, not the tokens' (P-Tuning v2's prefix keys and values), is a learned term: whatever its
    values, its rows take part (zero keys still share the softmax), so an unnamed departure is no evidence."""
    tables = [(f"{t.name} {tuple(t.weight.shape)}", "", "") for t in m.own_ids]
    return held_words(m.held, CAUSAL_LM) + term_words(tables, CAUSAL_LM)


def _held_note(m: GPTMap) -> list[Text]:
    """Parts of the model that handformer's CausalLM has not (nanochat's value embeddings and per-layer
    residual scalars): its extra token tables set to zero, its scalars kept as built; a note that says
    so, since what they add is then not compared."""
    for leaf in of_kind(m.held, "embedding"):
        leaf.weight.data.zero_()
    names = shapes_text(m.held)
    return [text(f"compared with {names} held (token tables at zero, scalars as built): handformer's "
                 "CausalLM has no such parts, so what they add is not checked",
                 f"比较时固定 {names}（额外的 token 表置零，标量保持构造时的值）：handformer 的 CausalLM "
                 "没有这些部分，它们加进来的东西不检查")] * bool(m.held)


def _softcap(call: Caller, m: GPTMap, idx: Tensor) -> float | None:
    """The cap c of logits soft-capped as c * tanh(logits / c) (Gemma 2's, nanochat's), read as the
    largest logit when the head's weights are made huge; None when they grow with it, or do not move
    at all (a head that normalises its rows, Baichuan 2's NormHead: the weights' scale cancels)."""
    weight = (m.head or m.wte).weight  # a forward that multiplies by the embedding: it
    kept = weight.detach().clone()
    weight.data.mul_(1e6)
    try:
        logits = call(idx)[0]
        top = logits.abs().max().nan_to_num(math.inf).item()  # NaN: no cap
    except fp.LearnerFailure:  # its code refuses weights so large: no cap read
        top = logits = math.inf
    finally:
        weight.data.copy_(kept)
    return round(top, 6) if top < 1e4 and fp.max_error(logits, call(idx)[0]) > 1e-6 else None


def _embedding_reading(call: Caller, m: GPTMap, idx: Tensor) -> tuple[bool, str | None]:
    """(scaled, added) from what the first block is handed: the token embeddings times sqrt(d_model)
    or not (Gemma's, the original Transformer's), read from how it moves when every token changes;
    the positions added, "learned" (the model's table) or the paper's fixed "sinusoidal" ones where
    it learns none (PyTorch's nn.Transformer tutorial): added so, or a sine table the model holds."""
    other = (idx + 1) % VOCAB
    a, b = _handed(call, m, idx), _handed(call, m, other)
    scaled = fp.max_error(a - b, (m.wte.weight[idx] - m.wte.weight[other]) * D**0.5) < fp.TOL * D**0.5
    added = a - m.wte.weight[idx] * (D**0.5 if scaled else 1.0)  # (B, T, D): the positions
    sines = sinusoidal_table(idx.size(1), D).to(added)  # (T, D)
    if m.wpe is not None:
        return scaled, "learned"
    fits = fp.max_error(added, sines.expand_as(added)) < fp.TOL * D**0.5
    return scaled, "sinusoidal" if fits or _holds_sines(call.module, sines) else None


def _position_a_token(call: Caller, m: GPTMap, idx: Tensor) -> GPTMap:
    """The model's map m; MappingError where the first block is handed more positions than the tokens:
    the model puts vectors of its own before or after them (prompt tuning's soft prompt, a summary
    token), which handformer's CausalLM has not. Fewer (a model that takes one token a call, Umar
    Jamil's Llama with its cache) is read on as before."""
    handed = _handed(call, m, idx)
    if handed.dim() == 3 and handed.size(1) > idx.size(1):
        raise MappingError(
            f"its first block is handed {tuple(handed.shape)} for ids of shape {tuple(idx.shape)}: it puts "
            "vectors of its own beside the tokens (a soft prompt?), which a GPT does not have",
            zh=f"形状为 {tuple(idx.shape)} 的 id 进来，它的第一个块拿到的是 {tuple(handed.shape)}："
               "它在 token 旁边加了自己的向量（软提示？），GPT 没有这些")
    return m


def _handed(call: Caller, m: GPTMap, idx: Tensor) -> Tensor:
    """(B, T, D) what the learner's first block is handed for idx; NaN where it is handed no such tensor."""
    handed: list[Tensor] = []
    block = call.module.get_submodule(m.blocks[0].name)
    # the stream positional or by keyword (labml's layer(x=x, mask=mask))
    handle = block.register_forward_pre_hook(
        lambda _, args, kwargs: handed.append(fp.first_tensor([*args, *kwargs.values()], 3)),
        with_kwargs=True)
    with fp.hooked([handle]):
        call(idx)
    got = handed[0] if handed else None
    if got is None:
        return torch.full((*idx.shape, D), math.nan).to(m.wte.weight)
    return batch_first_by_shape(got, *idx.shape)  # (B, T, D): a stream handed (T, B, D) turned back


def _holds_sines(module: nn.Module, sines: Tensor) -> bool:
    """Whether a buffer of the model begins with the sine table, in any layout of its rows:
    (P, D), (P, 1, D) sequence-first, (1, P, D)."""
    T = sines.size(0)
    return any(b.is_floating_point() and b.numel() >= sines.numel() and b.size(-1) == D
               and fp.max_error(b.reshape(-1, D)[:T].to(sines), sines) < 1e-6 for b in module.buffers())


def bigram(res: ComponentResult, module: nn.Module, out: Tensor, loss: Tensor | None, idx: Tensor,
           targets: Tensor) -> bool:
    """A model that is one token table and nothing else (Karpathy's BigramLanguageModel, the
    lecture's first model: nn.Embedding(vocab_size, vocab_size)): its logits are the rows of the
    table for the tokens, its loss their cross-entropy with the targets. False for any other model."""
    table = next((m.weight for m in module.modules() if isinstance(m, nn.Embedding)), None)
    if table is None or len(list(module.parameters())) != 1 or table.size(1) != out.size(-1):
        return False
    want = table[idx][:, -out.size(1):]  # (B, T, V): the last position's alone when that is all it returns
    err = fp.max_error(out, want)
    res.checks.append(Check(text("the logits are the token table's rows (a bigram model)",
                                 "logits 就是 token 表中对应的行（bigram 模型）"), err < 1e-9,
                            error_text(err)))
    if loss is not None:  # a forward that computes no loss is compared on its logits
        wrong = abs(float(loss) - float(F.cross_entropy(table[idx].flatten(0, 1), targets.flatten())))
        res.checks.append(Check(text("the loss is the cross-entropy of the logits with the targets",
                                     "loss 是 logits 与目标的交叉熵"), wrong < 1e-9, error_text(wrong)))
    res.max_abs_error = err
    return True


NO_READING = text("no known mistake (or pair of them) reproduces your logits; the blocks' own checks show "
                  "where they differ from handformer's",
                  "没有任何已知错误（或两个错误的组合）能复现你的 logits；"
                  "各 Block 自己的检查会指出它们与 handformer 的差别")


def logit_unit(m: GPTMap) -> float:
    """What the logits' errors are measured in: a configured factor above 1 on the logits (μP's
    logits times base_width / d_model) grows their float32 rounding as much as a mistake's."""
    return max(1.0, abs(m.logit_factor or 1.0))


def _largest_error(call: Caller, hf: nn.Module) -> float:
    """The largest logit error against the reference model over three batch shapes (one of a single
    token, one as long as the block)."""
    errors = []
    for i, (B2, T2) in enumerate([(3, 5), (1, 1), (2, BLOCK)]):
        x = torch.randint(0, VOCAB, (B2, T2), generator=torch.Generator().manual_seed(10 + i))
        y = torch.randint(0, VOCAB, (B2, T2), generator=torch.Generator().manual_seed(20 + i))
        mine, ref = call(x, y)[0], hf(x).logits
        if mine is not None and mine.size(1) == 1:
            ref = ref[:, -1:]  # a model that returns only the last position's logits
        errors.append(fp.max_error(mine, ref))
    return max(errors)


def _compare(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap, call: Caller, out: Tensor,
             loss: Tensor | None, idx: Tensor, targets: Tensor, last_only: bool) -> None:
    gated = is_gated(m.blocks[0].ffn)
    forms = layer_forms(call.module.get_submodule(m.blocks[0].name), m.blocks[0].attn[0])
    placements = BY_NORMS.get(len(m.blocks[0].norms), PLACEMENTS)
    _windows_measured(res, call, m)
    res.notes += [order_note(m.order)] * bool(m.order)
    settings = [Choices(p, a, r, f) for f in forms for r in m.ropes for p in placements
                for a in ffn_activations(gated)]
    found = _search(m, out, idx, settings, last_only)
    if found is None:
        res.notes.append(NO_READING)
        ch = settings[0]
        _localize(res, m, call, idx, settings)
    else:
        ch = _found(res, ctx, comp, m, call, out, idx, found, last_only)
    hf = reference_model(m, ch)
    _norm_findings(res, ctx, comp, m)
    _base_at_width(res, ctx, comp, m, call.module)
    res.max_abs_error = _largest_error(call, hf)
    res.checks.append(Check(COMPARED[0], res.max_abs_error < 1e-5 * logit_unit(m),
                            error_text(res.max_abs_error)))
    if loss is not None and not last_only:
        _loss(res, comp, hf(idx).logits, loss, targets, _balance(res, m, hf, call, idx, targets))
        own_loss(res, comp, call, idx, targets, _file(ctx))  # of its own logits: what no term explains
    _causality(res, comp, call, idx)
    if not (call.stepwise or call.unbatched or call.first or call.mask_form or last_only):
        left_padding(res, ctx, comp, call.module, lambda ids, keep: _padded(call, ids, keep), idx)
    if call.stepwise:
        res.notes.append(text(f"its forward takes one token at a time: driven so, token t at {call.start} = "
                              "t, through its own KV cache, and compared position by position",
                              f"它的 forward 一次只接受一个 token：检查时逐个输入，位置 t 的 token 用 "
                              f"{call.start} = t，经过它自己的 KV 缓存，逐位置比较"))
    _cached(res, ctx, comp, call, hf if m.ropes[0] else None, idx)
    _handed_cache(res, ctx, call, idx)
    _returned_cache(res, ctx, comp, m, call, hf, idx)


def _scale_unused(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap, module: nn.Module,
                  out: Tensor, found: tuple[Choices, frozenset[str], float], idx: Tensor, last_only: bool,
                  ) -> None:
    """embedding_scale_unused: the model's classes that hold the token embedding compute sqrt(, and
    its logits are those of embeddings not scaled."""
    owners = [type(sub) for sub in module.modules() if m.wte.module in list(sub.children())] * (not m.scaled)
    if not computes_sqrt(owners):  # none where it scales them
        return
    ch, flags, matched = found
    m.scaled = True
    scaled = _reference_model(m, ch)  # built aside: the map's cache keeps the unscaled one
    m.scaled = False
    would = fp.max_error(out, _view(variant(scaled, idx, flags), last_only))
    number, code = locate("embedding_scale_unused", source_lines(owners))  # the class that computes it
    res.findings.append(Finding("embedding_scale_unused", text(
        f"your code computes sqrt( for the embeddings, but your logits are those of unscaled embeddings "
        f"(max abs difference {matched:.1e}); scaled by sqrt(d_model) = {D ** 0.5:g} they would differ by "
        f"{would:.3g}", f"你的代码为嵌入计算了 sqrt(，但 logits 是未缩放嵌入的结果（最大绝对误差 "
        f"{matched:.1e}）；乘以 sqrt(d_model) = {D ** 0.5:g} 后会相差 {would:.3g}"), number, code))


def _localize(res: ComponentResult, m: GPTMap, call: Caller, idx: Tensor, settings: list[Choices]) -> None:
    """Where the logits no search explains part from handformer's, part by part, in each setting."""
    models = [reference_model(m, c) for c in settings]
    looked_up = [("the token embeddings, before any scale", F.embedding(idx, m.wte.weight))]
    looked_up += [(f"{t.name}, held at zero", F.embedding(idx, t.weight))  # (B, T, its width)
                  for t in of_kind(m.held, "embedding")]
    positions = torch.arange(idx.size(1), dtype=torch.float64)  # (T,): the positions their code builds
    looked_up += [("the positions 0 .. T-1", positions), ("the positions 0 .. T-1", positions[None])]
    readings = [looked_up + module_views(lambda hf=hf: hf(idx), hf, {}, inputs=True)
                + _uncapped(hf, idx) * bool(m.softcap) for hf in models]
    note_departure(res, lambda: with_use(  # the line using a mask first, then where its builder made it
        localize_model(lambda: call(idx), call.module, readings, constants=(torch.int64,)),
        fp.quietly(lambda: built_mask(lambda: call(idx), call.module, idx.size(1)))))


def _uncapped(hf: CausalLM, idx: Tensor) -> list[tuple[str, Tensor]]:
    """The reference's logits before its soft-cap, a step of the learner's code of its own."""
    seen: list[Tensor] = []
    handle = hf.lm_head.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    hf(idx)  # handformer's own model: it does not raise
    handle.remove()
    return [("the logits before the soft-cap", F.linear(seen[0], hf.lm_head.weight))]  # (B, T, V)


def _norm_findings(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap) -> None:
    """The norms' own mistakes (each run alone): handformer's model computes them as written, so
    that the rest is compared; they are named here all the same."""
    named: dict[str, list[str]] = {}
    for slot in [s for b in m.blocks for s in b.norms] + ([m.ln_f] if m.ln_f is not None else []):
        for flag in sorted(getattr(getattr(slot.leaf, "computes", None), "flags", ())):
            named.setdefault(flag, []).append(slot.leaf.name)
    res.notes += [OFFSET_NOTE] * any(getattr(getattr(s.leaf, "computes", None), "offset", False)
                                     for b in m.blocks for s in b.norms)
    lines = source_lines(ctx.objects(comp, "layernorm", "rmsnorm"))
    for flag, where in named.items():
        name, _, form = flag.partition(":")
        number, code = locate(name, lines)
        modules = ", ".join(dict.fromkeys(where))
        res.findings.append(Finding(name, text(f"{modules} (run alone) compute the norm with this mistake",
                                               f"{modules}（单独运行时）计算的是带这个错误的归一化"),
                                    number, code, form))


def _view(logits: Tensor, last_only: bool) -> Tensor:
    return logits[:, -1:] if last_only else logits


def _search(m: GPTMap, out: Tensor, idx: Tensor, settings: list[Choices], last_only: bool,
            ) -> tuple[Choices, frozenset[str], float] | None:
    """The choices (placement, activation, rotary layout) and the fewest mistakes, one then two,
    that reproduce the learner's logits."""
    flags = FLAGS if m.added is not None else tuple(f for f in FLAGS if f != "pe_missing")
    flags += ("rope_wrong_base",) if m.table_theta is not None else ()
    B, T = idx.shape
    unit = logit_unit(m)

    def search_one(ch: Choices, least: int, most: int) -> tuple[frozenset[str], float] | None:
        hf = reference_model(m, ch)
        most = min(most, FEWEST_MISTAKES.get(ch.placement, most))
        return fp.search(out / unit, lambda fl: _view(variant(hf, idx, fl, m.table_theta), last_only) / unit,
                         flags,
                         lambda fl: _view(_rows(B, T, fl)[..., None], last_only)[..., 0], most, least)
    return fp.search_settings(settings, search_one)


# placements searched for one mistake at most, not a pair: OLMo 2's reordered norms, rarer than the
# others (a failing model of another placement pays for one round more, not two)
FEWEST_MISTAKES = {"reordered": 1}


def _found(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap, call: Caller, out: Tensor,
           idx: Tensor, found: tuple[Choices, frozenset[str], float], last_only: bool) -> Choices:
    """The choices found as the convention; each mistake named with how far it is from right; the
    choices."""
    ch, flags, matched = found
    res.convention = ch.describe(m)
    hf = reference_model(m, ch)
    B, T = idx.shape
    rows = _view(_rows(B, T, flags)[..., None], last_only)[..., 0]
    correct = fp.max_error(out, _view(variant(hf, idx, frozenset()), last_only), rows)
    lines = source_lines(ctx.objects(comp, "causal_attention", "block", "causal_mask"))
    for flag in sorted(flags):
        name, _, form = flag.partition(":")
        number, code = locate(name, lines)
        res.findings.append(Finding(name, text(
            f"your logits equal the model's with this mistake (max abs difference {matched:.1e}); they "
            f"differ from the correct ones by {correct:.3g}",
            f"你的 logits 与带有这个错误的模型一致（最大绝对误差 {matched:.1e}），与正确结果相差 "
            f"{correct:.3g}"), number, code, form))
    _head_lines(res, call, idx, out, lines)
    _scale_unused(res, ctx, comp, m, call.module, out, found, idx, last_only)
    return ch


# the mistakes seen where the stack's output meets the head (the final norm left out of `self.lm_head(h)`)
HEAD_LINES = ("final_norm_missing",)


def _head_lines(res: ComponentResult, call: Caller, idx: Tensor, out: Tensor, lines: list[tuple[int, str]],
                ) -> None:
    """A finding of HEAD_LINES that a guess of its patterns placed (`self.norm = RMSNorm(dim)` in
    __init__, a `return logits`), not its first pattern nor its line finder (a norm's output never
    read): quoted at the line of the model's forward that made the logits."""
    unsure = [f for f in res.findings if f.name in HEAD_LINES and f.line != LINE_FINDERS[f.name](lines)[0]
              and not first_pattern_matches(f.name, f.code or "")]
    made = unsure and fp.quietly(lambda: made_at(lambda: call(idx), call.module, out))
    for finding in unsure * bool(made):
        finding.line, finding.code = made


def _cached(res: ComponentResult, ctx: Context, comp: Component, call: Caller, hf: CausalLM | None,
            idx: Tensor) -> None:
    """Meta's KV cache, where forward takes start_pos (required, or DeepSeek's start_pos=0 with a cache
    it keeps): tokens 5.. given after 0..4 with start_pos=5 (at once, or one at a time where it takes
    no more, as DeepSeek's mask) give the logits of the whole sequence (its last position's, where
    that is all forward gives); rotary positions counted from 0 again instead (rope_no_offset) are
    named; else the line where the cached path parts."""
    if not (call.start or call.position and not call.cache_arg and _keeps_cache(call.module)):
        return
    T = idx.size(1)
    whole, _ = call(idx)
    for cuts in ([0, 5, T], [0, *range(5, T + 1)]):
        runs = [(lambda a=a, b=b: call(idx[:, a:b], start=a)[0], a, b) for a, b in zip(cuts, cuts[1:])]
        step = fp.quietly(lambda runs=runs: torch.cat([run() for run, _, _ in runs][1:], 1))
        if step is not None:
            break
    # the last positions that both give (forward's (B, 1, V): the last position alone)
    err = fp.quietly(lambda: fp.max_error(step[:, -whole.size(1):], whole[:, -step.size(1):]))
    if err is None:  # no logits, or none through the cache
        return
    res.checks.append(Check(text(f"the KV cache: tokens 5..7 given after 0..4 with {call.position}=5 give "
                                 "the logits of the whole sequence", f"KV 缓存：先给位置 0..4，再用 "
                                 f"{call.position}=5 给位置 5..7，logits 与整句一次算出的相同"),
                            err < 1e-5, error_text(err)))
    if err < 1e-5:
        return
    if hf is not None:
        _restarted(res, ctx, comp, hf, idx, step, err)
    note_departure(res, lambda: cache_departure(lambda: call(idx), runs, T, ctx.path))


def _keeps_cache(module: nn.Module) -> bool:
    """Whether the model holds a buffer it calls a cache (DeepSeek's k_cache) and fills it on every
    call (its forward takes no use_cache=False that turns it off): its forward's start_pos then says
    where the new tokens go in it."""
    return "use_cache" not in names_of(forward_parameters(module))[0] and any(
        "cache" in name.lower() for name, _ in module.named_buffers())


def _restarted(res: ComponentResult, ctx: Context, comp: Component, hf: CausalLM, idx: Tensor, step: Tensor,
               err: float) -> None:
    """rope_no_offset where the cached logits of tokens 5.. are handformer's with their rotary positions
    counted from 0 again."""
    cache = hf.new_cache(BLOCK)
    hf(idx[:, :5], cache=cache)
    restarted = hf(idx[:, 5:], cache=cache, position_ids=torch.arange(idx.size(1) - 5)[None]).logits
    matched = fp.max_error(step, restarted)
    if matched < 1e-5:
        res.findings += ctx.findings(frozenset({"rope_no_offset"}), matched, err, comp, "rope")


def _returned_cache(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap, call: Caller,
                    hf: CausalLM, idx: Tensor) -> None:
    """Hugging Face's cache: forward(ids, past_key_values=None, use_cache=False) returning (logits,
    presents); tokens 5.. handed the presents of 0..4 give the logits of the whole sequence; rotary
    positions counted from 0 again instead (rope_no_offset) are named, at the line where the cached
    path parts. Nothing where it returns no cache it takes back. Tokens handed one at a time, as
    generation feeds them, where several at once differ (ChatGLM's builds its causal mask only where
    query and key lengths are equal: new tokens handed together see each other both ways), noted."""
    whole = fp.quietly(lambda: call(idx)[0][:, 5:])
    runs = fp.quietly(lambda: _returned_runs(ctx, call, idx, [0, 5, idx.size(1)]))
    step = _stepped(runs)
    err = fp.max_error(step, whole)  # (inf: no cache)
    if err == math.inf:
        return
    singly = [0, *range(5, idx.size(1) + 1)]  # (computed only where the tokens handed together differ)
    file = source_text(sys.modules[type(call.module).__module__])
    if err >= 1e-5 and EQUAL_LENGTHS_ONLY.search(file) and 1e-5 > (one := fp.max_error(_stepped(fp.quietly(
            lambda: _returned_runs(ctx, call, idx, singly))), whole)):
        err, res.notes = one, [*res.notes, ONE_AT_A_TIME]
    rounding = err >= 1e-5 and lossy.relative(err, whole) <= lossy.tolerance(type(call.module))
    res.notes += [lossy.lossy_note(lossy.relative(err, whole))] * rounding
    res.checks.append(Check(text("the KV cache it returns: tokens 5..7 handed the cache of 0..4 give the "
                                 "logits of the whole sequence",
                                 "它返回的 KV 缓存：位置 5..7 带上 0..4 的缓存，logits 与整句一次算出的相同"),
                            err < 1e-5 or rounding, error_text(err)))
    if err < 1e-5 or rounding:
        return
    if m.ropes[0]:
        _restarted(res, ctx, comp, hf, idx, step, err)
    note_departure(res, lambda: cache_departure(lambda: call(idx), runs, idx.size(1), ctx.path))


def _stepped(runs: list[tuple[Any, int, int]] | None) -> Tensor | None:
    """The logits of every run after the first, in order (None where one gives none)."""
    return fp.quietly(lambda: torch.cat([fp.first_tensor(run(), 3) for run, _, _ in runs][1:], 1))


# a causal mask built only where no mask is handed and the query and key lengths are equal (ChatGLM's)
# (`q_len == k_len`, or the sizes read off the tensors: `scores.shape[2] == scores.shape[3]`)
EQUAL_LENGTHS_ONLY = re.compile(r"if\s+\w*mask\w*\s+is\s+None\s+and\s+[\w.\[\]()]+\s*==\s*[\w.\[\]()]+")
ONE_AT_A_TIME = text(
    "the KV cache it returns is checked with tokens 5.. handed one at a time, as generation feeds them: "
    "handed together, they give other logits (so does ChatGLM's, which builds its causal mask only where "
    "the query and key lengths are equal)",
    "它返回的 KV 缓存按生成时的方式检查：位置 5 以后的 token 一次给一个。一起给时，logits 不同"
    "（ChatGLM 也是这样：它只在 query 和 key 长度相同时才构造因果掩码）")


def _returned_runs(ctx: Context, call: Caller, idx: Tensor, cuts: list[int],
                   ) -> list[tuple[Any, int, int]]:
    """The calls on the spans between `cuts`, each after the first handed the cache the one before
    returned (the first thing it returns after the logits that is no tensor, else the second), with
    use_cache=True where it takes that (its cache argument defaulting to None; StableLM's returns its
    cache always) and the span's first position where it takes one (a GPT-2 tutorial's
    forward(idx, past_key_values=None, start_pos=0)), each with the positions it covers; raises where
    it takes or returns none; Hugging Face's position_ids (1, T) where it takes them."""
    module = call.module
    names = forward_defaults(module)
    nones = [n for n, default in names.items() if default is None]
    arg = named(nones, CACHE_ARGS)
    assert arg is not None  # noqa: S101  (quietly: no cache check)
    asked = {"use_cache": True} if "use_cache" in names else {}
    # Hugging Face's position_ids=None, counted from 0 when not handed: handed (1, T), as generate does
    ids_at = named(nones, ("position_ids",))
    held: list[Any] = []

    def run(ids: Tensor, past: Any, start: int) -> Any:
        at = torch.arange(start, start + ids.size(1))[None]  # (1, T)
        kwargs = {arg: past, **asked, call.position: start, ids_at: at}
        kwargs.pop(None, None)  # (no start position taken)
        out = ctx.learner.call("forward", module, ids, **kwargs)
        assert isinstance(out, tuple) and out[1] is not None  # noqa: S101  (logits and its presents)
        # the presents after the logits, or after (loss, logits) (Hugging Face's tuple with labels)
        held[:] = [fp.returned_cache(out, out[1])]
        return out
    spans = list(zip(cuts, cuts[1:]))
    return [(lambda a=a, b=b: run(idx[:, a:b], held[0] if a else None, a), a, b) for a, b in spans]


def _handed_cache(res: ComponentResult, ctx: Context, call: Caller, idx: Tensor) -> None:
    """A model whose forward takes start_pos and a cache made outside it (`cache_maker`): tokens 0..4,
    then 5..7 at start_pos 5 (at once, else one at a time as a generation loop feeds them: a rolling
    cache read on one token only, mistral-src's), through one cache give the logits of the whole
    sequence without it; where not, the line where the cached path parts."""
    make = cache_maker(call.module)
    position = call.position or call.positions
    if None in (make, position, call.cache_arg):
        return
    B, T = idx.shape

    def runs(cache: Any, cuts: list[int]) -> list[tuple[Any, int, int]]:
        spans = list(zip(cuts, cuts[1:]))
        return [(lambda a=a, b=b: call.with_cache(idx[:, a:b], a, cache), a, b) for a, b in spans]
    whole = fp.quietly(lambda: call(idx)[0])
    for cuts in ([0, 5, T], [0, *range(5, T + 1)]):
        got = fp.quietly(lambda cuts=cuts: torch.cat([run() for run, _, _ in runs(
            made_cache(ctx, make[1], B, call.module), cuts)], 1))
        err = fp.max_error(got, whole)  # (inf: no logits through the cache)
        if err < 1e-5:
            break
    if err == math.inf:
        return
    steps = CUT_WORDS[len(cuts) == 3]
    res.checks.append(Check(text(f"through its cache ({make[0]}): tokens 0..4, then 5..7 {steps[0]} from "
                                 f"{position}=5, give the logits of the whole sequence",
                                 f"经过它的缓存（{make[0]}）：先给位置 0..4，再从 {position}=5 起"
                                 f"{steps[1]}位置 5..7，logits 与整句一次算出的相同"), err < 1e-5,
                            error_text(err)))
    if err >= 1e-5:
        fresh = made_cache(ctx, make[1], B, call.module)
        note_departure(res, lambda: cache_departure(lambda: call(idx), runs(fresh, cuts), T, ctx.path))


CUT_WORDS = {True: ("at once", "一次给出"), False: ("one at a time", "逐个给出")}  # tokens 5..7 given so


def cache_maker(module: nn.Module) -> tuple[str, Callable[[int], Any]] | None:
    """(its name, what makes a model's cache for a batch size): the model's own method (a Llama 2 chat
    model's new_cache(batch_size)), else a class of its file named for a cache whose constructor takes
    the model's config and a batch size alone (mistral-src's RollingKVCache(config, batch_size)),
    handed the config the model holds; None where there is neither."""
    method = next((n for n in CACHE_METHODS if callable(getattr(module, n, None))), None)
    if method is not None:
        return method, getattr(module, method)
    file = sys.modules[type(module).__module__]
    for name, cls in vars(file).items():
        config, batch = (_cache_arguments(cls, file) + ["", ""])[:2]
        if config.lower() in CONFIG_NAMES and hasattr(module, config) and "batch" in batch.lower():
            dtype = next(module.parameters()).dtype  # its buffers made as the model computes (float64 here)
            return name, functools.partial(_made_as, cls, getattr(module, config), dtype)
    return None


def made_cache(ctx: Context, make: Callable[..., Any], B: int, model: nn.Module) -> Any:
    """A fresh cache of its maker, handed the batch size where it takes an argument (a Llama 2 chat
    model's new_cache(batch_size)), else none (mistral-src's model.new_cache(), sized by its config),
    its float tensors in the model's dtype."""
    takes = len(inspect.signature(make).parameters)
    cache = ctx.learner.call("__init__", make, *[B][:takes])
    return _cast(cache, next(model.parameters()).dtype)


def _cache_arguments(cls: Any, file: Any) -> list[str]:
    """The arguments without a default of a class of the learner's file (not a module) named for a
    cache, if exactly two; else none."""
    own = isinstance(cls, type) and cls.__module__ == file.__name__ and "cache" in cls.__name__.lower()
    params = fp.quietly(lambda: inspect.signature(cls).parameters.values()) if own else None
    required = [p.name for p in params or () if p.default is p.empty]
    return required * (len(required) == 2 and not issubclass(cls, nn.Module))


def _made_as(cls: type, config: Any, dtype: torch.dtype, batch: int) -> Any:
    """cls(config, batch), its float tensors (held alone or in a list, one a layer) in `dtype`."""
    return _cast(cls(config, batch), dtype)


def _cast(cache: Any, dtype: torch.dtype) -> Any:
    """The cache, its float tensors (held alone or in a list, one a layer) in `dtype`."""
    for name, value in vars(cache).items():
        setattr(cache, name, list(map(functools.partial(_floats_as, dtype=dtype), value))
                if isinstance(value, list) else _floats_as(value, dtype))
    return cache


def _floats_as(value: Any, dtype: torch.dtype) -> Any:
    return value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value


def _balance(res: ComponentResult, m: GPTMap, hf: CausalLM, call: Caller, idx: Tensor, targets: Tensor,
             ) -> float:
    """The load-balancing term a mixture of experts' loss adds to the cross-entropy (noted), else 0."""
    other = torch.randint(0, VOCAB, idx.shape, generator=torch.Generator().manual_seed(31))
    for shift in (False, True):  # the labels as given, or shifted inside (Hugging Face's)
        term, notes = balance_term(moe_config(m.blocks[0].ffn), hf, lambda x, y: call(x, y)[1],
                                   [(idx, targets), (other, other.roll(-1, 1))], shift)
        if notes:
            break
    res.notes += notes
    return term


def _loss(res: ComponentResult, comp: Component, logits: Tensor, loss: Tensor, targets: Tensor,
          term: float = 0.0) -> None:
    """The loss against the cross-entropy of handformer's logits: the targets as given (nanoGPT's, already
    shifted), or shifted inside as Hugging Face's labels are (position t predicts label t + 1); a loss
    whose logits are cut for the shift but whose labels are not (each position scored against its own
    token) is train_step_no_shift."""
    plain = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    shifted = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), targets[:, 1:].reshape(-1))
    own = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), targets[:, :-1].reshape(-1))
    err, err_shifted = abs(float(loss) - term - float(plain)), abs(float(loss) - term - float(shifted))
    if err_shifted < 1e-6 <= err:
        res.notes.append(text("your forward shifts the labels itself (Hugging Face's labels): compared so",
                              "你的 forward 自己移位 labels（Hugging Face 的 labels 写法）：按移位后比较"))
        err = err_shifted
    res.checks.append(Check(COMPARED[1], err < 1e-6, error_text(err)))
    unshifted = min(err, err_shifted) >= 1e-6 > abs(float(loss) - float(own))  # its own token, not the next
    res.findings += [unshifted_finding(comp)] * unshifted


TIE_FIELD = re.compile(r"\b(tie_weights|tie_word_embeddings|tie_embeddings)\b")


def _tied_despite_config(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap) -> None:
    """head_tied_despite_config: the file's config (or the GPT) has a tying field, the GPT was
    built with it False, and its head is the token embedding all the same."""
    source = _file(ctx)  # "": no field found
    field_name = TIE_FIELD.search(re.sub(r"#[^\n]*", "", source))  # a comment on tying sets nothing
    if field_name is None:
        return
    res.notes.append(text(f"built with config.{field_name.group(1)} = False",
                          f"构造时 config.{field_name.group(1)} = False"))
    if m.head is not None and m.head.weight is m.wte.weight:
        number, code = locate("head_tied_despite_config", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("head_tied_despite_config", text(
            f"config.{field_name.group(1)} is False, yet {m.head.name}.weight is {m.wte.name}.weight (one "
            f"{tuple(m.wte.weight.shape)} matrix)", f"config.{field_name.group(1)} 为 False，"
            f"{m.head.name}.weight 却就是 {m.wte.name}.weight（同一个 {tuple(m.wte.weight.shape)} 矩阵）"),
            number, code))


def _padded(call: Caller, idx: Tensor, keep: Tensor) -> Tensor | None:
    """The logits of idx with its padding mask handed as attention_mask."""
    call.extra = {MASK_NAME: keep}
    try:
        return call(idx)[0]
    finally:
        call.extra = {}


def _causality(res: ComponentResult, comp: Component, call: Caller, idx: Tensor) -> None:
    """Causality (core/causality.py), driven at the whole context, else at idx; the model handed the ids as
    its targets too, so that it returns every position's logits (nanoGPT's, without targets, the last)."""
    check_causality(res, comp, call.module, lambda x: call(x, x)[0], (whole_context(idx), idx), VOCAB)

