"""Runner for the assembled encoder-decoder model (`Transformer(src_vocab, tgt_vocab, d_model,
num_heads, num_layers, d_ff, max_len, dropout)` and its variants).

The learner's parameters are mapped onto handformer's `Seq2SeqTransformer`: the embeddings by
their shapes (source, target, learned positions), the layers by the ModuleLists that hold them
(four attention projections and an FFN: an encoder layer; eight: a decoder layer), inside each
layer as the layer runners map them, the norms outside the layers as the stacks' final norms, and
the output layer. What tutorials do differently is detected from the outputs and reported as a
choice: the embeddings scaled by sqrt(d_model) or not, the output layer tied to the target
embedding or separate, with a bias or not, post-norm or pre-norm, logits or log-probabilities.
The fingerprint search then names what no choice explains: the positional encoding not added (to
the source, the target or both), a pre-norm stack without its final norm, a padding mask built from
the other sequence. In eval mode dropout is the identity, so the positional encoding added after
the dropout is named from what the learner's code hands to dropout; and `embedding_scale_unused`
when the output shows no scale although the embedding's code computes `sqrt(`.

The reference-free checks stay: eval determinism, no NaN, causality of the decoder, padding
invariance of the source, batch invariance.

Shape legend: B batch, S source length, T target length, D d_model, V target vocabulary.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import TGT_NAMES, call_parameters
from handformer.check.core.context import (
    MAX_LEN,
    SEQUENCE_FIRST,
    SIZES,
    SRC_VOCAB,
    TGT_VOCAB,
    Context,
    D,
    H,
    batch_first,
    causal,
    check_determinism,
    error_text,
    finish,
    forward_names,
    forward_parameters,
    guarded,
    holds_torch_attention,
    logits_shape,
    moved_by,
)
from handformer.check.core.conventions import is_lengths_name
from handformer.check.core.defaults import given
from handformer.check.core.discovery import SIZE_OF, Component, DiscoveryError, own_objects
from handformer.check.core.layer_map import LayerMap, layer_modules, map_layer, output_head, outside
from handformer.check.core.localize import View
from handformer.check.core.localize_kinds import localize_model, module_views, note_departure
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
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.core.weights import (
    Leaf,
    MappingError,
    Slot,
    copy_attention,
    copy_ffn,
    copy_weights,
    is_gated,
    norm_weights,
    of_kind,
    positive_eps,
    scramble_,
)
from handformer.check.reference import variants as V
from handformer.check.runners.model_pad import check_pad_given, takes_pad
from handformer.check.runners.pieces import (
    FFN_ACTIVATIONS,
    HF_NAME,
    built_activation,
    ffn_activations,
    plain_activation_,
)
from handformer.check.runners.seq2seq_stacks import build_from_stacks
from handformer.config import Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.nn.masks import as_attention_mask
from handformer.nn.positions import sinusoidal_table

SRC_V, TGT_V, PAD = SRC_VOCAB, TGT_VOCAB, 0
MODEL_SIZES = {**SIZES, "src_vocab": SRC_V, "tgt_vocab": TGT_V, "n_layers": 2, "pad_id": PAD}
SIDES = {"src": ("the source", "源端"), "tgt": ("the target", "目标端"), "both": ("both sides", "两端")}
STACKS = {"encoder": ("the encoder", "编码器"), "decoder": ("the decoder", "解码器"),
          "both": ("both stacks", "两个堆叠")}
MASK_SIDES = {"source": ("the source padding mask is built from the target",
                         "源端的填充掩码是用目标序列构造的"),
              "target": ("the target padding mask is built from the source",
                         "目标端的填充掩码是用源序列构造的")}


# --- mapping ----------------------------------------------------------------------------------


@dataclass
class ModelMap:
    src_embed: Leaf
    tgt_embed: Leaf
    positions: Leaf | None  # learned positions; None: a sinusoidal table (a buffer)
    tgt_positions: Leaf | None  # the decoder's own learned table (the seq2seq notebooks'); None: shared
    encoder: list[LayerMap]
    decoder: list[LayerMap]
    final: dict[str, Slot] = field(default_factory=dict)  # "encoder" / "decoder" -> its final norm
    out: Leaf | None = None  # the output layer; None when the forward reuses the target embedding
    tied: bool = False
    bias: bool = False
    table: Tensor | None = None  # the learner's sinusoidal table (L, D), when it is the paper's to 1e-5
    built: dict[Any, Seq2SeqTransformer] = field(default_factory=dict)  # handformer's, by choices

    def describe(self) -> list[str]:
        rows = [f"{self.src_embed.name} -> source embedding", f"{self.tgt_embed.name} -> target embedding"]
        rows += [f"{leaf.name} -> {side}learned positions" for leaf, side in
                 ((self.positions, "source " * bool(self.tgt_positions)), (self.tgt_positions, "target "))
                 if leaf is not None]
        for stack, layers in (("encoder", self.encoder), ("decoder", self.decoder)):
            for i, layer in enumerate(layers):
                rows.append(f"{layer.name} -> {stack} layer {i}")
        rows += [f"{slot.leaf.name} -> {stack} final norm" for stack, slot in self.final.items()]
        if self.out is not None:
            tied = " (tied to the target embedding)" if self.tied else ""
            rows.append(f"{self.out.name} -> output layer{tied}")
        return rows



def _table(module: nn.Module) -> Tensor | None:
    """The learner's sinusoidal table as it stored it (a float32 buffer: handformer uses its values,
    so that rounding is not taken for a difference); None when no buffer is the paper's table, or
    the paper's sines and cosines in another layout of its features (Marian's and fairseq's: the sines
    in the first half, the cosines in the second), a convention. A table whose first rows are zero up to
    the padding index (fairseq's: its positions start after it) is taken from the row after them."""
    longest = MAX_LEN + PADDING_ROWS
    tables = [sinusoidal_table(longest, D)] + [V.sinusoidal(longest, D, layout=k) for k in V.PE_LAYOUTS]
    for buf in module.buffers():
        if buf.dim() >= 2 and buf.size(-1) == D and buf.is_floating_point() and buf[..., 0, :].numel() == D:
            table = buf.reshape(-1, buf.size(-2), D)[0]  # (L, D)
            zero = (table[:PADDING_ROWS] == 0).all(-1).tolist()  # (PADDING_ROWS,): rows all zero
            start = len(zero) - (zero[::-1] + [True]).index(True)  # the row after the last zero one
            rows = table[start:start + MAX_LEN]  # (MAX_LEN, D) where it is long enough
            found = any(fp.max_error(rows, t[start:start + MAX_LEN]) < 1e-5 for t in tables)
            if rows.size(0) == MAX_LEN and found:
                return rows.double()
    return None


PADDING_ROWS = 4  # a padding index up to 3 (fairseq's 1): its zero row, the positions after it


def map_model(module: nn.Module, F_width: int, shared: bool = False) -> ModelMap:
    """The learner's model as handformer's parts (`shared`: one table of the target's rows for both
    sides); MappingError says what does not fit."""
    layers = layer_modules(module)
    mapped = [map_layer(path, child, F_width) for path, child in layers]
    encoder, decoder = [m for m in mapped if not m.decoder], [m for m in mapped if m.decoder]
    if not encoder or not decoder:
        raise MappingError(
            f"found {len(encoder)} encoder and {len(decoder)} decoder layers in nn.ModuleList or "
            "nn.Sequential containers; an encoder-decoder model keeps its layers in two lists "
            "(nn.ModuleList([EncoderLayer(...) for _ in range(num_layers)]), and the same for the decoder)",
            zh=f"在 nn.ModuleList 或 nn.Sequential 里找到 {len(encoder)} 个编码器层和 {len(decoder)} "
               "个解码器层；编码器-解码器模型把层放在两个列表里（nn.ModuleList([EncoderLayer(...) for _ in "
               "range(num_layers)])，解码器也一样）")
    _no_relative_tables(layers)
    outer = outside(module, [child for _, child in layers])
    embeds = of_kind(outer, "embedding")
    by_rows = {leaf.weight.size(0): leaf for leaf in reversed(embeds)}
    by_rows[SRC_V] = by_rows[TGT_V] if shared and TGT_V in by_rows else by_rows.get(SRC_V)
    if by_rows[SRC_V] is None or TGT_V not in by_rows:
        found = [(e.name, tuple(e.weight.shape)) for e in embeds]
        raise MappingError(f"expected nn.Embedding(src_vocab={SRC_V}, d_model) and nn.Embedding(tgt_vocab="
                           f"{TGT_V}, d_model); found {found}",
                           zh=f"应当有 nn.Embedding(src_vocab={SRC_V}, d_model) 和 "
                              f"nn.Embedding(tgt_vocab={TGT_V}, d_model)；实际找到 {found}")
    src, tgt = by_rows[SRC_V], by_rows[TGT_V]
    others = [e for e in embeds if e.weight is not src.weight and e.weight is not tgt.weight]
    # a learned table for each side, of one shape: the encoder's first (built first), then the decoder's
    sided = len(others) > 1 and others[0].weight.shape == others[1].weight.shape
    out, tied, bias = output_head(outer, TGT_V, tgt, others[1 + sided:], (
        "parameters outside the layers that an encoder-decoder model does not have",
        "层之外有编码器-解码器模型没有的参数"))
    model = ModelMap(src, tgt, others[0] if others else None, others[1] if sided else None, encoder, decoder,
                     out=out, table=_table(module), tied=tied, bias=bias)
    _final_norms(model, of_kind(outer, "norm"))
    return model


def _no_relative_tables(layers: list[tuple[str, nn.Module]]) -> None:
    """MappingError where a layer holds a table of one value a head (T5's relative-position bias,
    nn.Embedding(buckets, H) in the first layer's self-attention, shared by the others): handformer's
    Seq2SeqTransformer adds no such bias, so its logits are not the learner's model's to compare."""
    tables = [f"{path}.{name}" for path, child in layers for name, sub in child.named_modules()
              if isinstance(sub, nn.Embedding) and sub.embedding_dim == H]
    if tables:
        raise MappingError(
            f"{tables[0]} is a relative-position bias (T5's: a value a head for each bucket of key - query "
            "distance); handformer's Seq2SeqTransformer adds none, so only the checks that need no reference "
            "run here, and the attention holding it is compared alone",
            zh=f"{tables[0]} 是相对位置偏置（T5 的：每个 key - query 距离桶每个头一个值）；handformer 的 "
               "Seq2SeqTransformer 没有这种偏置，所以这里只做不需要参考实现的检查，含它的注意力单独比较")


def _final_norms(model: ModelMap, norms: list[Any]) -> None:
    """The encoder's and decoder's final norms: by their names (enc, src; dec, tgt), else in order."""
    for leaf in norms:
        low = leaf.name.lower()
        stack = "encoder" if re.search("enc|src", low) else "decoder" if re.search("dec|tgt", low) else None
        if stack and stack not in model.final:
            model.final[stack] = Slot(f"{stack} final norm", leaf)
    rest = [leaf for leaf in norms if leaf not in [s.leaf for s in model.final.values()]]
    for stack in ("encoder", "decoder"):
        if stack not in model.final and rest:
            model.final[stack] = Slot(f"{stack} final norm", rest.pop(0))


# --- handformer's model with the learner's weights ----------------------------------------------

@dataclass(frozen=True)
class Choices:
    """What tutorials do differently, none of it a mistake."""

    placement: str  # post | pre
    activation: str
    scale: bool  # embeddings times sqrt(d_model)
    log_probs: bool  # forward returns log_softmax of the logits
    tied_by_use: bool = False  # forward multiplies by the target embedding, not by its output layer

    def tied(self, m: ModelMap) -> bool:
        return m.tied or self.tied_by_use

    def bias(self, m: ModelMap) -> bool:
        return m.bias and not self.tied_by_use

    def describe(self, m: ModelMap) -> Text:
        words = [CHOICE_WORDS[choice][value] for choice, value in (
            ("scale", self.scale), ("tied", self.tied(m)), ("bias", self.bias(m)),
            ("learned", m.positions is not None), ("log_probs", self.log_probs))]
        (scale, scale_zh), (tied, tied_zh), (bias, bias_zh), (pos, pos_zh), (what, what_zh) = words
        return text(f"embeddings {scale}; output layer {tied}{bias}; {self.placement}-norm layers; "
                    f"{pos} positions; forward returns {what}",
                    f"嵌入{scale_zh}；输出层{tied_zh}{bias_zh}；{self.placement.capitalize()}-Norm 层；"
                    f"{pos_zh}位置编码；forward 返回 {what_zh}")


# the words of each choice, by its value: (English, Chinese)
CHOICE_WORDS = {
    "scale": {True: ("scaled by sqrt(d_model)", "乘以 sqrt(d_model)"), False: ("not scaled", "不缩放")},
    "tied": {True: ("tied to the target embedding", "与目标端嵌入共享权重"),
             False: ("separate", "独立的权重")},
    "bias": {True: (", with a bias", "，有偏置"), False: (", no bias", "，无偏置")},
    "learned": {True: ("learned", "可学习的"), False: ("sinusoidal", "正弦")},
    "log_probs": {True: ("log-probabilities", "对数概率"), False: ("logits", "logits")},
}


def reference_model(m: ModelMap, ch: Choices) -> Seq2SeqTransformer:
    """handformer's Seq2SeqTransformer with the learner's weights and choices (its final norms at
    their defaults where the learner has none); built once for each set of choices."""
    if ch not in m.built:
        m.built[ch] = _reference_model(m, ch)
    return m.built[ch]


def _reference_model(m: ModelMap, ch: Choices) -> Seq2SeqTransformer:
    first = norm_weights(m.encoder[0].norms[0])
    gated = is_gated(m.encoder[0].ffn)
    position, max_positions = (("learned", m.positions.weight.size(0)) if m.positions is not None
                               else ("sinusoidal", MAX_LEN))
    cfg = Seq2SeqConfig(
        src_vocab_size=m.src_embed.weight.size(0), tgt_vocab_size=TGT_V, d_model=D, n_heads=H,
        d_ff=m.encoder[0].ffn[0].weight().size(0), n_encoder_layers=len(m.encoder),
        n_decoder_layers=len(m.decoder), dropout=0.0,
        activation=built_activation(HF_NAME[(gated, ch.activation)]),
        norm=first.kind, norm_placement=ch.placement,  # LayerNorm or RMSNorm, as theirs
        norm_eps=positive_eps(first.eps), position=position, max_positions=max_positions,
        scale_embeddings=ch.scale, tie_output=ch.tied(m), pad_id=PAD, bias=True)
    hf = plain_activation_(SidedSeq2Seq(cfg), HF_NAME[(gated, ch.activation)])
    if ch.bias(m):
        hf.generator = nn.Linear(D, TGT_V, bias=True)
        if ch.tied(m):
            hf.generator.weight = hf.tgt_embed.weight
    hf = hf.double().eval()
    _copy_embeddings(hf, m, ch)
    written = _copy_layers(hf, m)
    exact_norms_(hf)
    as_written_(written)
    return hf


@torch.no_grad()
def _copy_embeddings(hf: Seq2SeqTransformer, m: ModelMap, ch: Choices) -> None:
    hf.src_embed.weight.copy_(m.src_embed.weight)
    hf.tgt_embed.weight.copy_(m.tgt_embed.weight)
    if m.tgt_positions is not None:
        hf.tgt_positions = copy.deepcopy(hf.positions)
        hf.tgt_positions.weight.copy_(m.tgt_positions.weight)
    if m.positions is not None:
        hf.positions.weight.copy_(m.positions.weight)
    elif m.table is not None:
        hf.positions.table.copy_(m.table)
    if m.out is not None and not ch.tied_by_use:
        copy_weights(hf.generator, Slot("output", m.out))


class SidedSeq2Seq(Seq2SeqTransformer):
    """handformer's Seq2SeqTransformer whose target side reads `tgt_positions`: the same table as the
    source's, unless the learner's decoder learns one of its own (the seq2seq notebooks' Encoder and
    Decoder each own a pos_embedding)."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__(cfg)
        self.tgt_positions = self.positions

    def _embed(self, embed: nn.Module, ids: Tensor, offset: int = 0) -> Tensor:
        table = self.positions if embed is self.src_embed else self.tgt_positions
        position_ids = torch.arange(offset, offset + ids.size(1), device=ids.device)[None]  # (1, L)
        return self.dropout(embed(ids) + table(position_ids))  # (B, L, D)


def _copy_layers(hf: Seq2SeqTransformer, m: ModelMap) -> list[tuple[nn.Module, str, Slot]]:
    """The learner's layers and final norms into handformer's; the norms written, as (module, name,
    slot), for `as_written_`."""
    written = []
    pairs = itertools.chain(zip(hf.encoder.layers, m.encoder), zip(hf.decoder.layers, m.decoder))
    for target, layer in pairs:
        copy_attention(target.self_attn, layer.attn[0])
        if layer.decoder:
            copy_attention(target.cross_attn, layer.attn[1])
        copy_ffn(target.ffn, layer.ffn)
        names = NORM_NAMES[layer.decoder]
        for name, slot in zip(names, layer.norms):
            copy_weights(getattr(target, name), slot)
        written += [(target, name, slot) for name, slot in zip(names, layer.norms)]
    for stack, slot in m.final.items():
        norm = getattr(hf, stack).norm
        if isinstance(norm, nn.Module) and hasattr(norm, "weight"):
            copy_weights(norm, slot)
            written.append((getattr(hf, stack), "norm", slot))
        else:  # a final norm after a post-norm stack (nn.Transformer's): the learner's, as it computes
            getattr(hf, stack).norm = AsWritten(norm_weights(slot))
    return written


# an encoder layer's norms (False) and a decoder layer's (True)
NORM_NAMES = {False: ("attn_norm", "ffn_norm"), True: ("attn_norm", "cross_attn_norm", "ffn_norm")}


class AsWritten(nn.Module):
    """A learner's hand-written norm as it computes, its own mistakes included (the Annotated
    Transformer's unbiased std): the norm's own check names them, the model is compared with what
    it computes."""

    def __init__(self, w: V.NormWeights) -> None:
        super().__init__()
        self.w = w

    def forward(self, x: Tensor) -> Tensor:
        return V.norm(self.w, x)


def as_written_(written: list[tuple[nn.Module, str, Slot]]) -> None:
    """The norms whose learner's module computes something else than the standard norm, replaced by
    what it computes (found once a mapped leaf)."""
    for parent, name, slot in written:
        w = getattr(slot.leaf, "computes", None)
        if w is None:
            w = slot.leaf.computes = norm_weights(slot)  # type: ignore[attr-defined]
        if w.flags or w.offset:
            setattr(parent, name, AsWritten(w))


def exact_norms_(model: nn.Module) -> None:
    """handformer's norms compute in float32 (for bf16 models); in this float64 comparison each is
    replaced by torch's norm in float64 with its weights, so rounding is not taken for a mistake."""
    from handformer.nn.norms import LayerNorm, RMSNorm

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LayerNorm):
                exact: nn.Module = nn.LayerNorm(child.weight.numel(), child.eps, bias=child.bias is not None)
            elif isinstance(child, RMSNorm):
                exact = nn.RMSNorm(child.weight.numel(), child.eps)
            else:
                continue
            exact = exact.double()
            exact.load_state_dict(child.state_dict())
            setattr(parent, name, exact)


DIAGONALS = {"causal_off_by_one:no_self": -1, "causal_off_by_one:sees_next": 1}  # the target's tril(diagonal)
POSITIONS = {"src": lambda hf: hf.positions, "tgt": lambda hf: hf.tgt_positions}  # each side's table
COMBINED = {False: torch.logical_and, True: torch.logical_or}  # mask_combined_with_or: a key either keeps


def variant(hf: Seq2SeqTransformer, src: Tensor, tgt: Tensor, flags: frozenset[str], log_probs: bool,
            memo: dict[frozenset[str], tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """The model's logits (B, T, V) with the named mistakes: the positional encoding left out of one
    side, a stack's final norm left out, a padding mask built from the other sequence, the
    target's padding and causal masks combined with an or. A search over the mistakes of one `hf`,
    `src` and `tgt` hands a `memo`: the encoder runs once for each set of the mistakes that reach it."""
    tgt_pad = src if "mask_pad_wrong_sequence:target" in flags else tgt
    tgt_keep = (tgt_pad != PAD)[:, None, None, :]  # (B, 1, 1, T)
    either = "mask_combined_with_or" in flags  # a future key seen where it is real, a pad where it is past
    diagonal = sum(map(DIAGONALS.get, flags, [0] * len(flags)))  # the causal mask off by one: moved
    future = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).tril(diagonal)  # (T, T), True = seen
    tgt_keep = COMBINED[either](tgt_keep, future)  # (B, 1, T, T)
    memo = given(memo, {})
    x, mask = memo.get(flags & ENCODER_FLAGS) or memo.setdefault(flags & ENCODER_FLAGS,
                                                                  _encoded(hf, src, tgt, flags))
    y = _side_embedded(hf, hf.tgt_embed, tgt, "tgt", flags)
    self_mask = as_attention_mask(tgt_keep)
    swapped = "decoder_masks_swapped" in flags  # each decoder layer given the other attention's mask
    for layer in hf.decoder.layers:
        y = layer(y, x, *(mask, self_mask)[::1 - 2 * swapped])[0]
    if not ({"final_norm_missing:decoder", "final_norm_missing:both"} & flags):
        y = hf.decoder.norm(y)
    logits = hf.generator(y)  # (B, T, V)
    return logits.log_softmax(-1) if log_probs else logits


# the mistakes that reach the encoder's output or the source's mask (what `_encoded` reads)
ENCODER_FLAGS = frozenset({"pe_missing:src", "pe_missing:both", "embedding_scale_unused:src",
                           "mask_pad_wrong_sequence:source", "final_norm_missing:encoder",
                           "final_norm_missing:both"})


def _side_embedded(hf: Seq2SeqTransformer, table: nn.Module, ids: Tensor, side: str, flags: frozenset[str],
                   ) -> Tensor:
    """(B, L, D) one side's embeddings, scaled as the choice says (that factor left out:
    embedding_scale_unused), plus its positions (left out: pe_missing)."""
    x = table(ids) / table.scale ** (f"embedding_scale_unused:{side}" in flags)
    if not ({f"pe_missing:{side}", "pe_missing:both"} & flags):
        x = x + POSITIONS[side](hf)(torch.arange(ids.size(1))[None])
    return x


def _encoded(hf: Seq2SeqTransformer, src: Tensor, tgt: Tensor, flags: frozenset[str],
             ) -> tuple[Tensor, Tensor]:
    """The encoder's output (B, S, D) and the source's attention mask, with the mistakes of `flags`
    that reach them (ENCODER_FLAGS)."""
    src_pad = tgt if "mask_pad_wrong_sequence:source" in flags else src
    mask = as_attention_mask((src_pad != PAD)[:, None, None, :])  # from (B, 1, 1, S)
    x = _side_embedded(hf, hf.src_embed, src, "src", flags)
    for layer in hf.encoder.layers:
        x = layer(x, mask)[0]
    if not ({"final_norm_missing:encoder", "final_norm_missing:both"} & flags):
        x = hf.encoder.norm(x)
    return x, mask


# --- calling the learner's model -----------------------------------------------------------------

class Caller:
    """(src, tgt) -> the learner's (B, T, V) output; masks (0/1 int, pad 0, causal target) are passed
    when forward asks for them; an output of width d_model goes through the model's generator
    (the Annotated Transformer's EncoderDecoder returns the decoder's states)."""

    def __init__(self, module: nn.Module, ctx: Context) -> None:
        self.module, self.ctx = module, ctx
        self.forward = composed(module) or module
        self.masks = [p.name for p in forward_parameters(self.forward) if "mask" in p.name.lower()]
        # the mask forms to try on the first call, and the one whose error is theirs when none runs: a
        # model on torch.nn's attention takes them as torch.nn does, or as the tutorials' keep-masks
        # that it turns into torch.nn's itself
        self.forms, self.fallback = MASK_FORMS[holds_torch_attention(module)]
        # HF's forward(input_ids, attention_mask, decoder_input_ids, ...): ids and masks by name
        if HF_IDS <= set(forward_names(self.forward)):
            self.forms, self.fallback = ("hf",), "hf"
        # d2l's forward(enc_X, dec_X, *args): the source's valid lengths as its one more argument
        lengths = {True: "lens"}.get(_takes_rest(self.forward), self.fallback)
        self.rank: int | str | None = None if self.masks else lengths

    def raw(self, src: Tensor, tgt: Tensor, rank: int | str = 4) -> Any:
        """Rank 4: (B, 1, 1, S) and (B, 1, T, T); rank 3 (the Annotated Transformer's, whose attention
        adds the head axis): (B, 1, S) and (B, T, T); 0/1 ints, or bool at ranks -4 and -3; "torch":
        as torch.nn's attention (nn.Transformer, nn.MultiheadAttention) takes them (torch_mask)."""
        if rank in LAYOUTS:  # torch_first: nn.Transformer's default (S, B) layout
            into, back = LAYOUTS[rank]
            masks = {name: torch_mask(name, src, tgt) for name in self.masks}
            return back(self.forward(into(src), into(tgt), **masks))
        own_forms = {"lens": self._with_lengths, "hf": self._hf}  # lengths in place of masks; Hugging Face's
        if rank in own_forms:
            return own_forms[rank](src, tgt)
        kwargs = {}
        for name in self.masks:
            if names_source(name):
                keep = (src != PAD)[:, None, None, :]  # (B, 1, 1, S)
            else:
                keep = causal(tgt.size(1))[None, None] & (tgt != PAD)[:, None, None, :]  # (B, 1, T, T)
            keep = keep[:, 0] if abs(int(rank)) == 3 else keep  # (B, 1, S) or (B, T, T) at rank 3
            kwargs[name] = keep.to(MASK_DTYPE[int(rank) < 0])
        return self.forward(src, tgt, **kwargs)

    def _hf(self, src: Tensor, tgt: Tensor) -> Any:
        """HF's forward(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask): the ids by
        name, each mask a padding mask (B, S) or (B, T), 1 = token, of the side its name says (the
        decoder builds its causal mask itself)."""
        masks = {name: ((tgt if "decoder" in name.lower() else src) != PAD).long() for name in self.masks}
        return self.forward(input_ids=src, decoder_input_ids=tgt, **masks)

    def _with_lengths(self, src: Tensor, tgt: Tensor) -> Any:
        """d2l's forward(enc_X, dec_X, *args): the source's valid lengths (B,) as its one more argument,
        in training mode with dropout off (its decoder builds its causal mask in training mode only)."""
        was = self.module.training
        with fp.dropout_off():
            self.module.train()
            out = self.forward(src, tgt, (src != PAD).sum(-1))
        self.module.train(was)
        return out

    def __call__(self, src: Tensor, tgt: Tensor) -> Tensor | None:
        if self.rank is None:  # the first call: each form in turn, the first that gives (B, T, ...) kept
            for form in self.forms:
                try:
                    out = self._call(src, tgt, form)
                    if out is not None and tuple(out.shape[:2]) == tuple(tgt.shape):
                        self.rank = TAKEN_FORM[self.module] = form
                        return out
                except fp.LearnerFailure:
                    pass
            self.rank = self.fallback
        return self._call(src, tgt, self.rank)

    def _call(self, src: Tensor, tgt: Tensor, rank: int | str) -> Tensor | None:
        raw = self.ctx.learner.call("forward", self.raw, src, tgt, rank)
        out, flat = fp.first_tensor(raw, 3), fp.first_tensor(raw, 2)
        if out is None and flat is not None and flat.size(0) == tgt.numel():  # jadore801120's view(-1, V)
            out = flat.reshape(*tgt.shape, -1)  # (B * T, V) -> (B, T, V)
        generator = getattr(self.module, "generator", None) or _vocab_head(self.module)
        if out is not None and out.size(-1) == D and D != TGT_V and callable(generator):
            out = fp.first_tensor(self.ctx.learner.call("forward", generator, out), 3)
        return out


def _vocab_head(module: nn.Module) -> nn.Module | None:
    """The model's one output layer of its own, d_model to the target vocabulary, where its forward
    returns the decoder's states and another method applies it (the Annotated Transformer's
    generator, under another name)."""
    widths = {m: (getattr(m, "in_features", 0), getattr(m, "out_features", 0)) for m in module.children()}
    heads = [m for m, (d_in, d_out) in widths.items() if (d_in, d_out) == (D, TGT_V)]
    return heads[0] if len(heads) == 1 else None


LENGTHS_NOTE = text("forward(enc_X, dec_X, *args) was handed the source's valid lengths (d2l) and run in "
                    "training mode with dropout switched off (its decoder builds its causal mask in training "
                    "mode only)",
                    "forward(enc_X, dec_X, *args) 传入了源序列的有效长度（d2l 的写法），并在训练模式下运行，"
                    "dropout 关掉（它的解码器只在训练模式下构造因果掩码）")


def _takes_rest(forward: Any) -> bool:
    """A forward(enc_X, dec_X, *args) that hands its *args (d2l's valid lengths) on, or one whose
    third argument names the source's valid lengths (forward(enc_X, dec_X, enc_valid_lens); not
    fairseq's forward(src_tokens, src_lengths, prev_output_tokens))."""
    params = list(inspect.signature(getattr(forward, "forward", forward)).parameters.values())  # a module's
    third = [p.name for p in params[2:3]]
    return any(p.kind == p.VAR_POSITIONAL for p in params) or any(map(is_lengths_name, third))


SOURCE_WORDS = re.compile("src|enc|memory|source")  # in a mask argument's name: the source's mask


def names_source(name: str) -> bool:
    """Whether a mask argument's name says it is the source's (src_mask, enc_mask, memory_mask)."""
    return bool(SOURCE_WORDS.search(name.lower()))


def torch_mask(name: str, src: Tensor, tgt: Tensor) -> Tensor | None:
    """A mask argument as torch.nn's attention takes it (True = masked), by its name: a padding mask
    (B, S) or (B, T) of the side it names; the target's attention mask, causal (T, T); no source
    attention mask (nn.Transformer's src_mask and memory_mask: every key visible)."""
    lowered = name.lower()
    source = names_source(name)
    kind = next((k for k in ("padding", "memory") if k in lowered), "attention")
    S, T = src.size(1), tgt.size(1)
    forms = {("padding", True): lambda: src == PAD, ("padding", False): lambda: tgt == PAD,  # (B, S|T)
             ("memory", True): lambda: None,  # (T, S) would be every key visible
             ("attention", True): lambda: torch.zeros(S, S, dtype=torch.bool),  # nothing masked
             ("attention", False): lambda: ~causal(T)}  # (T, T)
    return forms[kind, source]()


# torch.nn's masks with the ids batch-first, or sequence-first (ids in, logits back)
LAYOUTS: dict[int | str, tuple[Callable[[Tensor], Tensor], Callable[[Any], Any]]] = {
    "torch": (lambda t: t, lambda out: out), "torch_first": (lambda t: t.T, batch_first)}
# by whether a model holds torch.nn's attention: the mask forms its Caller tries, and the one it falls back to
MASK_FORMS: dict[bool, tuple[tuple[int | str, ...], int | str]] = {
    True: (("torch", "torch_first", -4, -3), "torch"), False: ((4,), 3)}
HF_IDS = {"input_ids", "decoder_input_ids"}  # a forward's arguments: Hugging Face's seq2seq forward
MASK_DTYPE = {True: torch.bool, False: torch.long}  # the tutorials' masks: bool (a negative rank) or 0/1 int
# the mask form each of the learner's models took when its Caller first ran it: the form its decoding
# functions hand it
TAKEN_FORM: weakref.WeakKeyDictionary[nn.Module, int | str] = weakref.WeakKeyDictionary()


def source_mask(model: Any, src: Tensor) -> Tensor:
    """The source mask a decoding function is handed with its model: as torch.nn takes it for a model
    on torch.nn's attention ((S, S), nothing masked: PyTorch's translation tutorial) unless that model
    took the tutorials' keep-masks, else the tutorials' (B, 1, S), 1 = may attend."""
    form = TAKEN_FORM.get(model, MASK_FORMS[holds_torch_attention(model)][1])
    nothing = lambda: torch_mask("src_mask", src, src)  # noqa: E731  (S, S): nothing masked
    masks = {"torch": nothing, "torch_first": nothing, -4: lambda: (src != PAD)[:, None, None, :],
             "hf": lambda: (src != PAD).long()}  # HF's attention_mask: (B, S), 1 = token
    return masks.get(form, lambda: (src != PAD)[:, None, :])()  # (B, 1, 1, S) or (B, 1, S) keep-masks


def source_ids(model: Any, src: Tensor) -> Tensor:
    """The source ids (1, S) a decoding function is handed with its model: (S, 1) for a model that took
    them sequence-first (nn.Transformer's default layout, PyTorch's translation tutorial)."""
    return LAYOUTS.get(TAKEN_FORM.get(model), LAYOUTS["torch"])[0](src)  # (1, S), or (S, 1)


def inputs(S: int, T: int, src_pad: list[int], tgt_pad: list[int], seed: int) -> tuple[Tensor, Tensor]:
    """(src (B, S), tgt (B, T)) ids, row b ending in src_pad[b] / tgt_pad[b] pad tokens."""
    g = torch.Generator().manual_seed(seed)
    B = len(src_pad)
    src = torch.randint(1, SRC_V, (B, S), generator=g)
    tgt = torch.randint(1, TGT_V, (B, T), generator=g)
    for b, (ps, pt) in enumerate(zip(src_pad, tgt_pad)):  # no padding: an empty slice
        src[b, S - ps:] = PAD
        tgt[b, T - pt:] = PAD
    return src, tgt


def real_rows(tgt: Tensor) -> Tensor:
    return tgt != PAD  # (B, T): the target positions compared (padded ones predict nothing)


# --- the runner ------------------------------------------------------------------------------

def _flags(m: ModelMap, ch: Choices, builds_masks: bool) -> tuple[str, ...]:
    flags = tuple(f"pe_missing:{s}" for s in SIDES)
    if ch.scale:  # one side's embedding not scaled (the other's is)
        flags += ("embedding_scale_unused:src", "embedding_scale_unused:tgt")
    if ch.placement == "pre":
        flags += tuple(f"final_norm_missing:{s}" for s in STACKS)
    if builds_masks:
        flags += tuple(f"mask_pad_wrong_sequence:{s}" for s in MASK_SIDES)
        flags += ("mask_combined_with_or", *DIAGONALS, "decoder_masks_swapped")
    return flags


Found = tuple[Choices, frozenset[str], float]


def _search(m: ModelMap, out: Tensor, src: Tensor, tgt: Tensor, builds_masks: bool) -> Found | None:
    log_probs = bool(((out.exp().sum(-1) - 1).abs() < 1e-6).all())
    gated = is_gated(m.encoder[0].ffn)
    ties = (False, True) if m.out is not None and not m.tied else (False,)
    settings = [Choices(p, a, s, log_probs, t) for t in ties for p in ("post", "pre") for s in (True, False)
                for a in ffn_activations(gated)]

    def search_one(ch: Choices, least: int, most: int) -> tuple[frozenset[str], float] | None:
        hf, memo = reference_model(m, ch), {}  # the encoder's outputs of this setting's search
        hit = fp.search(out, lambda fl: variant(hf, src, tgt, fl, ch.log_probs, memo),
                        _flags(m, ch, builds_masks), real_rows(tgt), most, least)
        # the masks combined with an or differ from no causal mask only at the padded rows (right-padded,
        # no real token has a pad before it): there too, or it is not that mistake
        flags = (hit or (frozenset(),))[0]
        everywhere = fp.max_error(out, variant(hf, src, tgt, flags, ch.log_probs)) if (
            "mask_combined_with_or" in flags) else 0.0  # on every row
        # combined with an or, the padding mask keeps every real key: a causal diagonal moved cannot be seen
        hidden = len(flags & {"mask_combined_with_or", *DIAGONALS}) == 2
        return None if everywhere >= fp.TOL or hidden else hit
    return fp.search_settings(settings, search_one)


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "",
             objs: list[Any] | None = None) -> Finding:
    number, code = locate(name, source_lines(objs or ctx.objects(comp, "positional_encoding")))
    return Finding(name, observed, number, code, form)


def _observed(name: str, form: str, matched: float, correct: float) -> Text:
    words, (en_form, zh_form) = OBSERVED[name]
    en, zh = en_form.format(words[form][0]), zh_form.format(words[form][1])
    return text(f"your logits equal the model's with this mistake ({en}; max abs difference {matched:.1e}); "
                f"they differ from the correct ones by {correct:.3g}",
                f"你的 logits 与带有这个错误的模型一致（{zh}；最大绝对误差 {matched:.1e}），与正确结果相差 "
                f"{correct:.3g}")


# each of the model's named mistakes: the words of its forms, and how its observation puts them
OBSERVED = {"pe_missing": (SIDES, ("no positional encoding on {}", "{}没有加位置编码")),
            "embedding_scale_unused": (SIDES, ("{}'s embedding not scaled by sqrt(d_model), the other side's "
                                               "scaled", "{}的嵌入没有乘 sqrt(d_model)，另一端乘了")),
            "final_norm_missing": (STACKS, ("no final norm after {}", "{}之后没有最后的归一化层")),
            "mask_pad_wrong_sequence": (MASK_SIDES, ("{}", "{}")),
            "causal_off_by_one": ({"no_self": ("a token does not see itself", "token 看不到自己"),
                                   "sees_next": ("a token sees the next one", "token 看到了下一个位置")},
                                  ("the target's causal mask: {}", "目标端的因果掩码：{}")),
            "decoder_masks_swapped": ({"": ("each decoder layer's self-attention given the source mask, its "
                                            "cross-attention the target mask",
                                            "每个解码器层的自注意力用了源端掩码，交叉注意力用了目标端掩码")},
                                      ("{}", "{}")),
            "mask_combined_with_or": ({"": ("the target's padding and causal masks combined so that a key "
                                            "either one keeps is seen", "目标端的填充掩码和因果掩码组合后，"
                                            "任一个保留的键都能被看到")}, ("{}", "{}"))}


def _side_sources(module: nn.Module, m: ModelMap) -> dict[str, list[Any]]:
    """A mistake of one side's embedding (its scale, its positions): the learner's classes that hold that
    side's embedding, where its line is looked for (the Encoder's, not the Decoder's)."""
    owner = {child: type(sub) for sub in module.modules() for child in sub.children()}  # each module's holder
    return {f"{name}:{side}": [owner[leaf.module]] for name in ("embedding_scale_unused", "pe_missing")
            for side, leaf in (("src", m.src_embed), ("tgt", m.tgt_embed))}


def _embedding_sources(module: nn.Module, m: ModelMap) -> list[Any]:
    """The learner's classes that hold the embeddings, then the model's class."""
    owners = [type(sub) for sub in module.modules()
              if any(child in (m.src_embed.module, m.tgt_embed.module) for child in sub.children())]
    return list(dict.fromkeys([*owners, type(module)]))  # each class once, in that order


SQRT = re.compile(r"sqrt\(|\*\*\s*0?\.5\b")  # math.sqrt(d), d ** 0.5
NOT_EMBEDDING = re.compile(r"d_k|head|\bdk\b|std|init|attn|attention|score", re.I)


def computes_sqrt(objs: list[Any]) -> bool:
    """Whether the code of these classes takes a square root that is not an attention's or an init's."""
    return any(SQRT.search(line.split("#")[0]) and not NOT_EMBEDDING.search(line)
               for obj in objs for line in source_text(obj).splitlines())


def _pe_after_dropout(res: ComponentResult, ctx: Context, comp: Component, call: Caller,
                      hf: Seq2SeqTransformer, src: Tensor, tgt: Tensor, flags: frozenset[str]) -> None:
    """pe_after_dropout when what the learner's code hands to dropout (recorded in eval mode) is an
    embedding without its positional encoding, and never the embedding with it."""
    sides = []
    for side, table, ids in (("src", hf.src_embed, src), ("tgt", hf.tgt_embed, tgt)):
        if {f"pe_missing:{side}", "pe_missing:both"} & flags:
            continue
        emb = table(ids)  # (B, L, D)
        pos = POSITIONS[side](hf)(torch.arange(ids.size(1))[None])
        sides.append((side, [emb, emb / table.scale], emb + pos))
    with fp.dropout_recorder() as seen:
        call(src, tgt)

    def hit(t: Tensor, ref: Tensor) -> bool:
        return t.shape == ref.shape and fp.max_error(t, ref) < fp.TOL

    late = [side for side, plain, with_pe in sides
            if any(hit(t, p) for t in seen for p in plain) and not any(hit(t, with_pe) for t in seen)]
    if not late:
        return
    where = " and ".join(SIDES[s][0] for s in late)
    where_zh = "和".join(SIDES[s][1] for s in late)
    res.findings.append(_finding(ctx, comp, "pe_after_dropout", text(
        f"on {where} your code hands the embedding to dropout without its positional encoding ({len(seen)} "
        "dropout calls recorded in eval mode): in training the positions are never dropped out",
        f"在{where_zh}，你的代码交给 dropout 的是没有加位置编码的嵌入"
        f"（eval 模式下记录了 {len(seen)} 次 dropout 调用）：训练时位置编码不会被 dropout")))


def model_factory(comp: Component, ctx: Context) -> Any:
    """The file's function that builds the model: `make_model` (the Annotated Transformer's), or one
    whose return annotation is the model's class (Umar Jamil's build_transformer(...) -> Transformer)
    or that returns a call of it (d2l's `return EncoderDecoder(encoder, decoder)`)."""
    own = own_objects(ctx.module)
    returns = (f for f in own.values() if inspect.isfunction(f) and (f.__annotations__.get("return") in (
        comp.obj, comp.name) or re.search(rf"^\s*return {comp.name}\(", source_text(f), re.M)))
    return own.get("make_model") or next(returns, None)


def composed(module: nn.Module) -> Callable[..., Any] | None:
    """The forward of a model that defines none but encode, decode and project (Umar Jamil's
    Transformer, the Annotated Transformer's methods without its forward):
    project(decode(encode(src, src_mask), ...)), decode's arguments given by their names; None for a
    model with a forward of its own."""
    if type(module).forward is not nn.Module.forward or not callable(getattr(module, "decode", None)):
        return None

    def forward(src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Any:
        given = {"memory": module.encode(src, src_mask), "src_mask": src_mask, "tgt_mask": tgt_mask,
                 "tgt": tgt}
        out = module.decode(*[given[_decode_role(p.name)] for p in call_parameters(module.decode)])
        return getattr(module, "project", lambda x: x)(out)
    return forward


def _decode_role(name: str) -> str:
    """What a decode argument takes, by its name: the source or target mask, the target, the memory."""
    lowered = name.lower()
    mask = "src_mask" if names_source(name) else "tgt_mask"
    return mask if "mask" in lowered else "tgt" if lowered in TGT_NAMES else "memory"


def build_model(comp: Component, ctx: Context) -> tuple[nn.Module, bool]:
    """The learner's model built from its constructor (with the target's vocabulary on both sides
    where it has one vocabulary: Marian's and BART's shared table), or (the Annotated Transformer's
    EncoderDecoder(encoder, decoder, src_embed, tgt_embed, generator)) by the file's factory."""
    module, by_factory = _built(comp, ctx, MODEL_SIZES)
    shapes = [p.shape for p in module.parameters()]
    if by_factory or not shapes or any(TGT_V in s for s in shapes):
        return module, by_factory
    module, by_factory = _built(comp, ctx, {**MODEL_SIZES, "src_vocab": TGT_V})
    SHARED.add(module)
    return module, by_factory


# the models built with the target's vocabulary on both sides (built_model: no table of its size at first)
SHARED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _reference_free(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module, call: Caller,
                    own_masks: bool) -> None:
    """The checks without a reference (_properties), and of a model that builds its own masks from the
    pad id it is given, that pad id (model_pad.py)."""
    guarded(res, lambda: _properties(res, call))
    if own_masks and takes_pad(comp):
        guarded(res, lambda: check_pad_given(res, ctx, comp, built_sizes(module), Caller, inputs))


def built_sizes(module: nn.Module) -> dict[str, Any]:
    """The sizes the model was built with (build_model)."""
    return {**MODEL_SIZES, "src_vocab": TGT_V} if one_vocabulary(module) else MODEL_SIZES


def one_vocabulary(module: nn.Module) -> bool:
    """Whether the model was built with one vocabulary for both sides, the target's (build_model)."""
    return module in SHARED


def _built(comp: Component, ctx: Context, sizes: dict[str, Any]) -> tuple[nn.Module, bool]:
    src, tgt = inputs(6, 6, [0, 2], [1, 0], seed=0)
    warmup = lambda m: Caller(m, ctx)(src, tgt)  # noqa: E731  (lazy layers get their shapes: d2l's)
    try:
        return ctx.build(comp, sizes, warmup=warmup), False
    except DiscoveryError:
        factory = model_factory(comp, ctx)
        if not inspect.isfunction(factory):
            stacked = ctx.learner.call("__init__", build_from_stacks, comp.obj, ctx.module, MODEL_SIZES)
            if stacked is None:  # not bentrevett's Seq2Seq(encoder, decoder, ...) either
                raise
            ctx.materialize(comp, stacked, warmup)
            scramble_(stacked, 0)
            return stacked.double().eval(), False
    kwargs = {}
    for p in inspect.signature(factory).parameters.values():
        key = SIZE_OF.get(p.name.lower())
        if key in MODEL_SIZES:
            kwargs[p.name] = MODEL_SIZES[key]
        elif p.default is p.empty:
            raise DiscoveryError(f"{factory.__name__}: cannot fill the argument {p.name!r}; it takes "
                                 "(src_vocab, tgt_vocab, N, d_model, d_ff, h, dropout, max_len)",
                                 zh=f"{factory.__name__}：填不了参数 {p.name!r}；它接受 (src_vocab, "
                                    "tgt_vocab, N, d_model, d_ff, h, dropout, max_len)")
    module = ctx.learner.call("__init__", factory, **kwargs)
    if not isinstance(module, nn.Module):
        raise ctx.learner.fail("__init__", f"{factory.__name__}(...) did not return an nn.Module",
                               f"{factory.__name__}(...) 返回的不是 nn.Module")
    ctx.materialize(comp, module, warmup)
    scramble_(module, 0)
    return module.double().eval(), True


def check_model(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module, by_factory = build_model(comp, ctx)
    if by_factory:
        name = model_factory(comp, ctx).__name__
        res.notes.append(text(f"{comp.name} takes modules: built with your {name}(...)",
                              f"{comp.name} 的参数是模块：用你的 {name}(...) 构造"))
    tables = [p.shape for p in module.parameters() if p.dim() == 2]  # none: a starter not written yet
    if tables and not any(rows in (cols, 3 * cols) for rows, cols in tables):
        return _no_attention(res)  # no square projection (nor a fused (3n, n) one) at any width
    if tables and not any(TGT_V in shape for shape in tables):
        return _one_vocabulary(res)
    call = Caller(module, ctx)
    builds_masks = not call.masks
    res.notes += [LENGTHS_NOTE] * (call.rank == "lens")
    src, tgt = inputs(6, 6, [0, 2], [1, 0], seed=0)  # S == T: a mask from the other side still runs

    check_determinism(res, ctx, comp, lambda: call(src, tgt), "encoder_layer", "decoder_layer", "mha", "ffn")
    res.notes += [SEQUENCE_FIRST] * (call.rank == "torch_first")
    with fp.dropout_off():
        out = call(src, tgt)
        if not logits_shape(res, out, (2, 6, TGT_V), "tgt_vocab"):
            return finish(res)
        finite = bool(torch.isfinite(out).all())
        res.checks.append(Check(text("no NaN or inf", "没有 NaN 或 inf"), finite))
        if not finite:  # no variant computes NaN: nothing to search
            return finish(res)
        try:
            m = map_model(module, SIZES["d_ff"], one_vocabulary(module))
        except MappingError as err:
            res.notes.append(text(f"not compared with handformer's Seq2SeqTransformer: {err}",
                                  f"没有与 handformer 的 Seq2SeqTransformer 比较：{err.zh or err}"))
            m = None
        if m is not None:
            res.mapping = m.describe()
            _compare(res, ctx, comp, module, call, m, out, src, tgt, builds_masks)
        _reference_free(res, ctx, comp, module, call, builds_masks and not by_factory)
    seen: list[Any] = []  # a learner's code that raises on S != T fails "runs on every shape" once
    res.checks = [c for c in res.checks if not (c in seen or seen.append(c))]
    return finish(res)


def _no_attention(res: ComponentResult) -> ComponentResult:
    """A model with a forward(src, tgt, ...) and no attention's projection anywhere (a toy model
    a training loop is tried on): no Transformer to compare, NOT CHECKED, never run on inputs meant for
    one (its vocabulary and its layers are not a Transformer's): a DRIVER, noted."""
    res.status = DRIVER
    res.notes.append(text("it holds no attention (no square projection, nor a fused (3n, n) one): a toy "
                          "model a training loop drives, not a Transformer; not run on a Transformer's "
                          "inputs, not compared with handformer's Seq2SeqTransformer",
                          "它没有注意力（没有方阵投影，也没有 (3n, n) 的合并投影）：是训练循环驱动的小模型，"
                          "不是 Transformer；不用 Transformer 的输入运行，也不和 handformer 的 "
                          "Seq2SeqTransformer 比较"))
    return finish(res)


def _one_vocabulary(res: ComponentResult) -> ComponentResult:
    """A model built with one vocabulary for both sides (Marian's and BART's shared embedding and
    head): NOT CHECKED, since the comparison hands it a target vocabulary of another size."""
    res.status = NOT_CHECKED
    res.error = LearnerError(
        "mapping", f"it has one vocabulary for both sides (no table or layer of {TGT_V} rows: check builds "
        f"it with a target vocabulary of {TGT_V} tokens beside a source one of {SRC_V}); handformer's "
        "Seq2SeqTransformer is compared with two", "__init__",
        message_zh=f"它的两端共用一个词表（没有 {TGT_V} 行的表或层：check 构造时给目标端 {TGT_V} 个词、"
                   f"源端 {SRC_V} 个）；handformer 的 Seq2SeqTransformer 按两个词表比较")
    return finish(res)


NO_READING = text("no known mistake (or pair of them) reproduces your logits; the layers' own checks show "
                  "where they differ from handformer's",
                  "没有任何已知错误（或两个错误的组合）能复现你的 logits；"
                  "各层自己的检查会指出它们与 handformer 的差别")


def _compare(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module, call: Caller,
             m: ModelMap, out: Tensor, src: Tensor, tgt: Tensor, builds_masks: bool) -> None:
    found = _search(m, out, src, tgt, builds_masks)
    if found is None:
        res.notes.append(NO_READING)
        ch = Choices("post", FFN_ACTIVATIONS[is_gated(m.encoder[0].ffn)][0], True, False)
        flags: frozenset[str] = frozenset()
        readings = _readings(m, ch, src, tgt)
        note_departure(res, lambda: localize_model(lambda: call(src, tgt), module, readings))
    else:
        ch, flags, matched = found
        res.convention = ch.describe(m)
        hf = reference_model(m, ch)
        rows = real_rows(tgt)
        correct = fp.max_error(out, variant(hf, src, tgt, frozenset(), ch.log_probs), rows)
        for flag in sorted(flags):
            name, _, form = flag.partition(":")
            objs = _side_sources(module, m).get(flag, []) + ctx.objects(comp, "positional_encoding")
            observed = _observed(name, form, matched, correct)
            res.findings.append(_finding(ctx, comp, name, observed, form, objs))  # its side's class first
        if ch.placement == "pre" and not flags & {f"final_norm_missing:{s}" for s in STACKS}:
            missing = [s for s in ("encoder", "decoder") if s not in m.final]
            if missing:  # matched with a final norm of weight 1 and bias 0: one the learner never wrote
                res.notes.append(text(f"no final norm module found for {', '.join(missing)}",
                                      f"没有找到{'、'.join(missing)}的最后归一化层"))
        if not ch.scale and computes_sqrt(_embedding_sources(module, m)):
            objs = _embedding_sources(module, m) + ctx.objects(comp)
            scaled = fp.max_error(out, variant(reference_model(m, dataclasses.replace(ch, scale=True)),
                                               src, tgt, flags, ch.log_probs), rows)
            res.findings.append(_finding(ctx, comp, "embedding_scale_unused", text(
                f"your code computes sqrt( for the embeddings, but your logits are those of unscaled "
                f"embeddings (max abs difference {matched:.1e}); scaled by sqrt(d_model) = {D ** 0.5:g} they "
                f"would differ by {scaled:.3g}",
                f"你的代码为嵌入计算了 sqrt(，但 logits 是未缩放嵌入的结果（最大绝对误差 {matched:.1e}）；"
                f"乘以 sqrt(d_model) = {D ** 0.5:g} 后会相差 {scaled:.3g}"), objs=objs))
        _pe_after_dropout(res, ctx, comp, call, hf, src, tgt, flags)
    guarded(res, lambda: _against_handformer(res, call, m, ch))


def _part_words(m: ModelMap) -> dict[str, str]:
    """handformer's Seq2SeqTransformer's parts by their role, for the localizer's views."""
    layers = {f"{stack}.layers.{i}": f"{stack} layer {i}'s output" for stack, n in
              (("encoder", len(m.encoder)), ("decoder", len(m.decoder))) for i in range(n)}
    return {"src_embed": "the source embedding (scaled as chosen)",
            "tgt_embed": "the target embedding (scaled as chosen)", "positions": "the positional encoding",
            "encoder.norm": "the encoder's final norm", "decoder.norm": "the decoder's final norm",
            "generator": "the logits", **layers}


def _readings(m: ModelMap, ch: Choices, src: Tensor, tgt: Tensor) -> list[list[View]]:
    """The reference model's parts on (src, tgt) for each placement and embedding scale, with the
    embeddings unscaled (emb(ids)), as the localizer reads them."""
    raw = [("emb(ids), the source embedding unscaled", m.src_embed.weight[src].double()),
           ("emb(ids), the target embedding unscaled", m.tgt_embed.weight[tgt].double())]
    choices = [dataclasses.replace(ch, placement=p, scale=s) for p in ("post", "pre") for s in (True, False)]
    models = [reference_model(m, c) for c in choices]
    return [module_views(lambda hf=hf: hf(src, tgt), hf, _part_words(m)) + raw + _embedded(hf, src, tgt)
            for hf in models]


@torch.no_grad()
def _embedded(hf: Seq2SeqTransformer, src: Tensor, tgt: Tensor) -> list[View]:
    """Each side's embedding (scaled as chosen) plus its positions (B, S or T, D)."""
    return [(f"the {side} embedding plus positions",
             (embed(ids) + POSITIONS[key](hf)(torch.arange(ids.size(1))[None])).double())
            for side, key, embed, ids in (("source", "src", hf.src_embed, src),
                                          ("target", "tgt", hf.tgt_embed, tgt))]


def _against_handformer(res: ComponentResult, call: Caller, m: ModelMap, ch: Choices) -> None:
    """handformer's Seq2SeqTransformer.forward with the learner's weights and choices, on three shapes."""
    hf = reference_model(m, ch)
    errors = []
    shapes = [(7, 5, [0, 3], [0, 2]), (4, 9, [0, 0, 1], [2, 0, 0]), (1, 1, [0], [0])]
    for i, (S, T, sp, tp) in enumerate(shapes):
        src, tgt = inputs(S, T, sp, tp, seed=10 + i)
        ref = hf(src, tgt).logits
        ref = ref.log_softmax(-1) if ch.log_probs else ref
        errors.append(fp.max_error(call(src, tgt), ref, real_rows(tgt)))
    res.max_abs_error = max(errors)
    res.checks.append(Check(text(f"matches handformer's Seq2SeqTransformer on your weights and choices "
                                 f"({ch.placement}-norm) on 3 shapes",
                                 f"在 3 种形状上与使用你的权重和写法"
                                 f"（{ch.placement.capitalize()}-Norm）的 handformer "
                                 "Seq2SeqTransformer 一致"), max(errors) < 1e-5, error_text(max(errors))))


def _properties(res: ComponentResult, call: Callable[[Tensor, Tensor], Tensor | None]) -> None:
    src, tgt = inputs(7, 5, [0, 2], [0, 0], seed=1)
    out = call(src, tgt)
    if out is None:
        return
    bumped = tgt.clone()
    bumped[:, 3] = (bumped[:, 3] % (TGT_V - 1)) + 1
    moved = moved_by(call(src, bumped), out, (slice(None), slice(0, 3)))
    res.checks.append(Check(text("causality: changing target token 3 leaves logits 0..2 unchanged",
                                 "因果性：改变目标端位置 3 的 token，不影响位置 0..2 的 logits"),
                            moved < 1e-9, text(f"moved by {moved:.3g}", f"变化了 {moved:.3g}")))
    longer = torch.cat([src, torch.full((2, 2), PAD)], dim=1)
    moved = moved_by(call(longer, tgt), out, slice(None))
    res.checks.append(Check(text("padding invariance: more source padding changes nothing",
                                 "填充不变性：源端多加填充不影响结果"), moved < 1e-9,
                            text(f"moved by {moved:.3g}", f"变化了 {moved:.3g}")))
    alone = moved_by(call(src[:1], tgt[:1]), out[:1], slice(None))
    res.checks.append(Check(text("batch invariance: a sentence alone gives its logits in a batch",
                                 "batch 不变性：一句话单独输入和放进 batch 里，得到的 logits 相同"),
                            alone < 1e-9,
                            text(f"moved by {alone:.3g}", f"变化了 {alone:.3g}")))
