"""Find the components a learner's file defines, by the names tutorials use, and build them with
constructor arguments matched by name (d_model, num_heads / n_heads / h, d_ff, dropout, ...).

Only objects defined in the learner's file count (an `nn.LayerNorm` imported from torch is not
theirs to grade). `--component kind=Name` points a kind at any other name.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import inspect
import itertools
import re
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from handformer.check.core.argument_names import (
    REFERENCE_MODEL_NAMES,
    call_parameters,
    input_roles,
    readable_parameters,
)
from handformer.check.core.bpe_parts import snippet_parts
from handformer.check.core.callables import neutral_callable
from handformer.check.core.defaults import given, quietly
from handformer.check.core.hosts import host_arguments
from handformer.check.core.kinds import COLLATOR_KINDS, KINDS_TABLE, METHOD_NAMES, TABLED
from handformer.check.core.own_calls import file_arguments, record
from handformer.check.core.own_defaults import flags, own_defaults, settings_class
from handformer.check.core.sections import fit_sections_
from handformer.check.core.size_roles import with_roles
from handformer.check.core.source import code_text, config_fallbacks, config_reads, module_reads, source_text
from handformer.check.core.special_config_ids import special_ids_within
from handformer.check.core.wordpiece_parts import wordpiece_trainer, writes_wordpiece

NAMES: dict[str, tuple[str, ...]] = {k.name: k.names for k in KINDS_TABLE}  # kind -> names, in order
KINDS = tuple(NAMES)
DESCRIPTIONS = {k.name: k.en for k in KINDS_TABLE}

# constructor argument names -> the size they stand for
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "d_model": ("d_model", "dim", "embed_dim", "hidden_size", "hidden_dim", "n_embd", "d", "features",
                "size", "model_dim", "emb_dim", "d_embed", "embedding_dim", "normalized_shape", "dmodel",
                "num_hiddens", "norm_shape", "ffn_num_input", "ffn_num_outputs", "key_size", "query_size",
                "value_size", "ndim", "n_embed", "embed_size", "d_in", "d_out", "emb_size",
                "num_features"),  # gpt-oss's RMSNorm(num_features)
    "d_head": ("head_size", "head_dim", "d_k", "d_head", "dim_head", "headsize", "rotary_dim", "d_kv",
               "query_pre_attn_scalar",  # Gemma 2's scores scaled by 1/sqrt of it: the head width
               "kv_channels"),  # Megatron's and ChatGLM's config field
    "n_heads": ("num_heads", "n_heads", "h", "heads", "n_head", "nhead", "num_head", "head_num",
                "nheads", "num_attention_heads",
                # BART's and Marian's config fields (Hugging Face), a layer's arguments named so
                "encoder_attention_heads", "decoder_attention_heads"),
    "n_kv_heads": ("n_kv_heads", "num_kv_heads", "num_key_value_heads", "kv_heads", "n_kv_head",
                   "num_kv_head", "n_kv", "num_groups", "n_groups", "n_rep_heads",
                   "num_kv_groups", "n_kv_groups",
                   "n_query_groups", "num_query_groups",  # litgpt's and Megatron's config fields
                   "multi_query_group_num"),  # ChatGLM's
    "d_ff": ("d_ff", "ff_dim", "d_hidden", "dim_feedforward", "d_inner", "ffn_dim", "hidden",
             "d_ffn", "ffn_hidden", "intermediate_size", "dff", "ff_hidden", "mlp_dim", "inner_dim",
             "ffn_num_hiddens", "d_mlp", "mlp_hidden", "encoder_ffn_dim", "decoder_ffn_dim",
             "inter_dim", "moe_inter_dim",  # DeepSeek's MLP(dim, inter_dim)
             "ffn_hidden_size"),  # Megatron's and ChatGLM's config field
    "dropout": ("dropout", "p", "drop", "dropout_rate", "drop_prob", "dropout_p", "p_drop", "pdrop",
                "dropout_prob", "attn_dropout", "resid_dropout", "attn_pdrop", "resid_pdrop", "drop_rate"),
    "src_vocab": ("src_vocab_size", "src_vocab", "source_vocab_size", "input_vocab_size", "src_vocab_len",
                  "enc_vocab_size", "vocab_size", "n_vocab", "vocab", "ntoken",
                  "num_tokens",  # lucidrains' Transformer(num_tokens, dim, depth)
                  "padded_vocab_size"),  # litgpt's Config and ChatGLM's: the embedding's and the head's rows
    "tgt_vocab": ("tgt_vocab_size", "tgt_vocab", "trg_vocab_size", "target_vocab_size", "output_vocab_size",
                  "tgt_vocab_len", "dec_vocab_size"),
    "n_layers": ("num_layers", "n_layers", "n", "num_encoder_layers", "num_decoder_layers", "n_layer",
                 "layers", "depth", "num_blocks", "nlayers", "n_encoder_layers", "n_decoder_layers",
                 "num_blks", "num_hidden_layers"),
    "pad_id": ("pad_idx", "pad_id", "padding_idx", "pad_token_id", "src_pad_idx", "tgt_pad_idx",
               "trg_pad_idx", "pad"),
    "max_len": ("max_len", "max_seq_len", "max_positions", "block_size", "seq_len", "max_length",
                "max_seq_length", "n_positions", "context_length", "maxlen", "max_position_embeddings",
                "context_size", "n_ctx", "context_length", "sequence_len"),
    "theta": ("theta", "base", "rope_theta", "rope_base"),
    "n_classes": ("num_classes", "n_classes", "num_labels", "n_labels", "num_class", "n_class", "class_num"),
    "eps": ("eps", "norm_eps", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "epsilon",
            "layernorm_epsilon"),
    # the FFN's width as a multiple of d_model (Persson's forward_expansion, lucidrains' ff_mult); an
    # argument of another name is one where the constructor multiplies a width by it (size_roles.py)
    "ffn_mult": ("ffn_mult", "ff_mult", "forward_expansion", "mlp_ratio", "expansion_factor"),
}
# the hidden width of an FFN that also takes d_model (Llama's FeedForward(dim, hidden_dim, ...))
HIDDEN_WHEN_PAIRED = ("hidden_dim", "hidden_size", "hidden")
# arguments with one sensible value here whatever the component: a layer's index (d2l's
# TransformerDecoderBlock(..., i); ChatGLM's layer_number counts from 1), Llama's rounding of the FFN
# width, nanoGPT's LayerNorm(ndim, bias)
FIXED: dict[str, Any] = {"i": 0, "layer_idx": 0, "layer_id": 0, "layer_index": 0, "layer_number": 1,
                         "multiple_of": 1,
                         "ffn_dim_multiplier": None, "bias": True, "use_bias": False,
                         # a GPT's config that says whether to tie the head: it says no (a head tied
                         # anyway is a finding of the gpt runner)
                         "tie_weights": False, "tie_word_embeddings": False, "tie_embeddings": False,
                         # Raschka's cfg["qkv_bias"]; Meta's KV cache sizes (max_seq_len is the block size)
                         "qkv_bias": False, "max_batch_size": 4,
                         # Raschka's cfg["dtype"] (nn.Linear(..., dtype=None)) and cfg["rope_freq"] (None:
                         # no Llama 3 frequency scaling)
                         "dtype": None, "rope_freq": None, "rope_base": 10000.0,
                         # Raschka's Qwen3 cfg: QK-norm, as Qwen3 has (its q_norm and k_norm are
                         # compared with handformer's), no experts
                         "qk_norm": True, "num_experts": 0,
                         # partial rotary (GPT-NeoX's rotary_pct, Phi's and StableLM's
                         # partial_rotary_factor): half of check's 4 dims a head turn, an even
                         # width as every real model's (0.25 of 4 would turn 1)
                         "rotary_pct": 0.5, "partial_rotary_factor": 0.5,
                         # a mixture of experts' config (minimind's, DeepSeek's), for its MoE layer
                         # built alone: 4 experts, 2 a token, renormalized, one shared, one group
                         # (DeepSeek's inference names and its Hugging Face ones), a softmax of the
                         # router's scores unscaled (DeepSeek-V2-Lite's: handformer's router), in every
                         # layer (Hugging Face's first_k_dense_replace: no dense layer first)
                         "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                         "n_activated_experts": 2, "n_expert_groups": 1, "n_limited_groups": 1,
                         "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "scoring_func": "softmax",
                         "routed_scaling_factor": 1.0, "first_k_dense_replace": 0,
                         # a capacity of capacity_factor * tokens / experts a expert (Switch's, GShard's):
                         # every token kept for any count of experts up to 16 (which tokens a full
                         # expert drops is not compared: the routing is)
                         "capacity_factor": 16.0, "eval_capacity_factor": 16.0, "train_capacity_factor": 16.0}
# fixed values for a dict config alone (Raschka's cfg["num_experts"] = 0: one FFN); a config class or a
# namespace keeps its own (Mixtral's MoEArgs: num_experts = 4, checked against handformer's MixtureOfExperts)
DICT_ONLY = ("num_experts",)
# switches built on even where their default is off: Raschka's GroupedQueryAttention(..., qk_norm=False)
# has QK-norm, and the order of its norm and RoPE, only when built with it
SWITCHED_ON = ("qk_norm",)
# settings given their FIXED value even where they have a default: the switches, and a capacity factor
# (Switch's SwitchFeedForward(..., capacity_factor=1.25)) set so high that no token is dropped
OVERRIDDEN = (*SWITCHED_ON, "capacity_factor", "eval_capacity_factor", "train_capacity_factor")
CONFIG_NAMES = ("config", "cfg", "args", "params", "hparams", "model_args", "conf")
# the names of the classic PyTorch tutorials' arguments: jadore801120's d_v, d_hid (the FFN's
# hidden width beside d_in, the width alone) and n_position; bentrevett's hid_dim and pf_dim;
# hyunwoongko's enc_voc_size, device and trg_sos_idx (kept, never read); minGPT's
# config.model_type (None: the sizes are given)
# timm's Mlp(in_features, hidden_features=None, out_features=None, act_layer, ...) (an FFN's output
# width is its input's: a tutorial's copy may drop the defaults)
# UvA's MultiheadAttention(input_dim, embed_dim, num_heads) and EncoderBlock(input_dim, ...): the
# width of the input (bentrevett's Encoder(input_dim, ...) embeds it: a vocabulary, size_roles.py)
for _key, _names in {"d_model": ("hid_dim", "d_hid", "d_word_vec", "n_state", "emb", "in_features",
                                 "out_features",
                                 "input_dim",
                                 # MLX's nn.RMSNorm(dims), nn.RoPE(dims, ...), ports that keep its names
                                 "dims"),
                     "d_head": ("d_v",), "d_ff": ("pf_dim", "hidden_features"),
                     # a Chinese course's MultiHeadedAttention(head, embedding_dim, ...); openai/whisper's
                     # MultiHeadAttention(n_state, n_head), ResidualAttentionBlock(n_state, n_head)
                     "n_heads": ("head",),
                     # Hugging Face BERT's and ViT's config fields
                     "dropout": ("embd_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob"),
                     # Peter Bloem's GTransformer(emb, heads, depth, seq_length, ...)
                     "max_len": ("n_position", "src_seq_len", "tgt_seq_len", "seq_length"),
                     # the same course's make_model(source_vocab, target_vocab, ...)
                     "src_vocab": ("n_src_vocab", "enc_voc_size", "source_vocab"),
                     "tgt_vocab": ("n_trg_vocab", "dec_voc_size", "target_vocab")}.items():
    ARGUMENTS[_key] += _names
HIDDEN_WHEN_PAIRED += ("d_hid",)
FIXED.update({"device": "cpu", "model_type": None, "trg_sos_idx": 1})
# a causal switch (tiny-universe's MultiHeadAttention(config, is_causal=False)): on where the attention
# is checked as causal (its runner gives "causal"), else its default; not a size an adapter is given;
# Peter Bloem's SelfAttention(k, heads, mask) names it mask
SWITCHES = {"is_causal": "causal", "causal": "causal", "mask": "causal"}
# a norm's eps with no default (llama2.c's RMSNorm(dim, eps)): the norms read it back from the module
FIXED.update(dict.fromkeys(ARGUMENTS["eps"], 1e-5))
# a constructor's required argument alone, never a config field (a config keeps its own base): RoPE's
# base in CS336's TransformerBlock(d_model, num_heads, d_ff, max_seq_len, theta)
REQUIRED_FIXED = {**FIXED, "theta": 10000.0, "rope_theta": 10000.0}
# a mixture of experts' constructor that requires its count of experts (makeMoE's SparseMoE(n_embed,
# num_experts, top_k)): 4 experts, 2 a token, as a config of one is built (FIXED)
MOE_REQUIRED = {"num_experts": 4, "n_experts": 4, "num_local_experts": 4, "top_k": 2, "k": 2,
                "experts_per_token": 2, "num_experts_per_tok": 2}
EXPERT_COUNTS = {"num_experts", "n_experts", "num_local_experts"}


def moe_counts(cls: Any) -> dict[str, Any]:
    """MOE_REQUIRED for a constructor that requires a count of experts; none for any other (a top_k
    filter's TopKWarper(top_k) keeps its own)."""
    required = {p.name.lower() for p in init_parameters(cls) if p.default is p.empty}
    return dict(MOE_REQUIRED) if required & EXPERT_COUNTS else {}


# an argument's name (lower case) -> the size it stands for: the first key of ARGUMENTS that lists it
SIZE_OF = {alias: key for key, aliases in reversed(ARGUMENTS.items()) for alias in aliases}
# the words of a name no table lists that say a size (fairseq's attention_heads, ffn_embed_dim): a
# count of heads, or an FFN's width (a word of the FFN and a word of a width)
FFN_WORDS = {"ffn", "ff", "mlp", "feedforward", "intermediate", "filter"}  # filter: tensor2tensor's
WIDTH_WORDS = {"dim", "size", "hidden", "width"}
# a dropout's rate of any place (GLM's attention_dropout_prob, output_dropout_prob, BART's
# activation_dropout): a word of a dropout; a maximum length (GLM's max_sequence_length): the word max
# and a word of a length
DROPOUT_WORDS = {"dropout", "pdrop"}
LENGTH_WORDS = {"len", "length", "sequence", "seq", "positions", "position", "ctx", "context"}
# a vocabulary's side (trg_vocab, target_vocab_len, decoder_vocab): the target's, else the source's; a
# name of other words is another table's (type_vocab_size: BERT's token types)
VOCAB_WORDS = {"vocab", "voc", "vocabulary", "dictionary"}  # dictionary: fairseq's joined one
TARGET_WORDS = {"tgt", "trg", "target", "dec", "decoder", "output", "out"}
SIDE_WORDS = VOCAB_WORDS | TARGET_WORDS | {"src", "source", "enc", "encoder", "input", "in", "size", "len",
                                           "num", "n"}
# a width of the model named by its side and words of a width (fairseq's encoder_embed_dim, Griffin's
# width): the words of a side, of an embedding and of a width only (lru_width is another width)
MODEL_WIDTH_WORDS = {"src", "source", "enc", "encoder", "tgt", "trg", "target", "dec", "decoder", "model",
                     "embed", "embedding", "emb", "token", "word", "d", "dim", "width"}


# the size a name's words say, by the first rule that holds: (sets the name holds a word of each of,
# words it holds none of, the words it holds nothing but (None: any), the size)
WORD_RULES: tuple[tuple[tuple[set[str], ...], set[str], set[str] | None, str], ...] = (
    (({"heads"}, {"kv", "key", "value"}), WIDTH_WORDS, None, "n_kv_heads"),
    (({"heads"},), WIDTH_WORDS, None, "n_heads"),  # heads_dim is a width, not a count
    ((FFN_WORDS, WIDTH_WORDS), set(), None, "d_ff"),
    ((VOCAB_WORDS, TARGET_WORDS), set(), SIDE_WORDS, "tgt_vocab"),
    ((VOCAB_WORDS,), set(), SIDE_WORDS, "src_vocab"),
    ((DROPOUT_WORDS,), set(), None, "dropout"),
    (({"max"}, LENGTH_WORDS), {"relative", "rel", "distance"}, None, "max_len"),  # Shaw's clip is no length
    (({"layers"},), set(), SIDE_WORDS | {"layers"}, "n_layers"),  # fairseq's encoder_layers, decoder_layers
    (({"dim", "width"},), set(), MODEL_WIDTH_WORDS, "d_model"))


def size_of(name: str) -> str | None:
    """The size an argument's name stands for: its table's (SIZE_OF), else what its words say."""
    words = set(name.lower().split("_"))
    by_words = next((size for each, none, only, size in WORD_RULES if all(words & one for one in each)
                     and not words & none and words <= (only or words)), None)
    return SIZE_OF.get(name.lower(), by_words)


class DiscoveryError(ValueError):
    """A component cannot be found or built; the message says what to change (`zh`: in Chinese)."""

    def __init__(self, message: str, zh: str = "") -> None:
        super().__init__(message)
        self.zh = zh


def cannot_fill(name: str, required: list[str], known: Any, found: Any, roles: str, takes: tuple[str, str],
                ) -> None:
    """Raise the DiscoveryError of a component `name` whose arguments its runner cannot fill: the first
    of `required` (its arguments without a default) that is not `known` (one its runner fills), else
    `roles` where not `found` (an argument the runner needs that none plays); `takes` (en, zh) says
    what it takes."""
    unknown = [n for n in required if n not in known]
    if unknown or not found:
        first = (unknown or [roles])[0]
        raise DiscoveryError(f"{name}: cannot fill the argument {first!r}; {takes[0]}",
                             zh=f"{name}：填不了参数 {first!r}；{takes[1]}")


@dataclass
class Component:
    kind: str  # one of KINDS
    name: str  # the learner's name for it
    obj: Any  # the class or function
    found_by: str = "name"  # "name", "signature": a free function found by what it does (signatures.py),
    # or "structure": a model found by what it builds, "methods": a tokenizer by its methods
    switched: str = ""  # a constructor switch built on (x-transformers' FeedForward(..., glu=True))


def find_components(module: types.ModuleType, overrides: dict[str, str] | None = None,
                    only: list[str] | None = None, adapters: dict[str, Any] | None = None) -> list[Component]:
    """The learner's components in the order of KINDS (a kind may match several names, e.g. an FFN
    and a SwiGLU); each name is checked once; `only`: these kinds alone. `adapters`
    (handformer.check.core.adapters.functions): a make_<kind> builds that kind's class; a function
    named after a kind is checked in place of it."""
    overrides = overrides or {}
    own = own_objects(module)
    _refuse_unknown(overrides, only or [], own)
    wanted = set(only or KINDS)  # every kind found is one of KINDS
    found = _by_name(own, overrides, wanted)
    for name, fn in (adapters or {}).items():
        kind = name.removeprefix("make_")
        if kind not in wanted:
            continue
        if name.startswith("make_"):
            ours = [c for c in found if c.kind == kind and inspect.isclass(c.obj)]
            cls = ours[0].obj if ours else type(build(fn, SIZES_FOR_ADAPTERS))
            ADAPTERS[cls] = fn
            if not ours:
                found.append(Component(kind, cls.__name__, cls))
        else:
            found = [c for c in found if c.kind != kind] + [Component(kind, f"{name} (adapter)", fn)]
    found += _switched_on(found, wanted)
    found = _without_collators(found)
    return sorted(_without_bases(_without_dispatchers(found)), key=lambda c: KINDS.index(c.kind))


def _without_collators(found: list[Component]) -> list[Component]:
    """Leave out a data collator as a model: a class whose masking method is graded as its kind
    (Hugging Face's DataCollatorForT5MLM ends as a language model's name does)."""
    owners = {c.name.partition(".")[0] for c in found if c.kind in COLLATOR_KINDS and "." in c.name}
    return [c for c in found if c.name not in owners]


# the kinds checked again with a constructor switch on that is off by default, by the words of its name:
# (the kind found, the kind it is checked as with the switch on, the words, how the report names it)
CHECKED_SWITCHED_ON = (("mha", "causal_attention", {"causal"}, "{name}"),
                       ("ffn", "ffn", {"glu", "gated", "swiglu", "geglu"}, "{name}({switch}=True)"))


def _switched_on(found: list[Component], wanted: set[str]) -> list[Component]:
    """A class whose constructor switch, off by default, turns on code its forward runs only then: an
    attention's causal mask (x-transformers' Attention(dim, ..., causal=False), which its Decoder builds
    with causal=True), checked again as causal self-attention; an FFN's gated form (`glu=False`), checked
    again as `FeedForward(glu=True)`. Not where the file's causal attention is that class already."""
    causal = {id(c.obj) for c in found if c.kind == "causal_attention"}
    return [Component(checked, shown.format(name=c.name, switch=switch), c.obj, c.found_by, switch)
            for kind, checked, words, shown in CHECKED_SWITCHED_ON if checked in wanted
            for c in found if id(c.obj) not in causal for switch in _switches_off(c, kind, words)]


def _switches_off(c: Component, kind: str, words: set[str]) -> list[str]:
    """The first constructor argument of a class found as `kind` whose name has one of `words` and whose
    default is False (none for a function, a class found as another kind, or one whose constructor takes
    the activation: labml's FeedForward(..., activation=nn.ReLU(), is_gated=False), whose gated form
    gates with what its caller hands, not with its default)."""
    names = " ".join(p.name.lower() for p in init_parameters(c.obj))
    params = init_parameters(c.obj) * (c.kind == kind and inspect.isclass(c.obj) and "act" not in names)
    return [p.name for p in params if p.default is False and set(p.name.lower().split("_")) & words][:1]


def _without_dispatchers(found: list[Component]) -> list[Component]:
    """The components less the schedules that pick one of two or more schedules of the file (Hugging
    Face's get_scheduler(name, optimizer, ...), from a table or by `if`): the schedules they call are
    checked. A schedule that wraps one other (a LambdaLR of rate(step + 1, ...)) is a schedule itself."""
    schedules = {id(c.obj) for c in found if c.kind == "schedule"}
    return [c for c in found if c.kind != "schedule" or len(schedules & set(map(id, _reached(c.obj)))) < 2]


def _without_bases(found: list[Component]) -> list[Component]:
    """The components less the abstract base classes of tokenizers found beside them (minbpe's
    `Tokenizer`, whose train and encode raise NotImplementedError or are missing): their subclasses
    are checked."""
    bases = set(map(id, itertools.chain.from_iterable(getattr(c.obj, "__mro__", ())[1:] for c in found)))
    return [c for c in found
            if c.kind != "bpe_tokenizer" or id(c.obj) not in bases or not not_implemented(c.obj)]


def not_implemented(cls: type) -> bool:
    """A class missing one of TOKENIZER_METHODS, or one whose only global is NotImplementedError (a
    body that raises it, maybe under a docstring)."""
    methods = [getattr(cls, m, None) for m in TOKENIZER_METHODS]
    names = map(lambda m: getattr(getattr(m, "__code__", None), "co_names", ()), methods)
    return not all(map(callable, methods)) or ("NotImplementedError",) in names


def _reached(fn: Any) -> list[Any]:
    """The objects of its module a function reads, and the values of the dicts among them (a table of
    name -> schedule)."""
    reached = module_reads(fn)
    tables = filter(lambda value: isinstance(value, dict), reached)
    return reached + list(itertools.chain.from_iterable(table.values() for table in tables))


SIZES_FOR_ADAPTERS = {"d_model": 16, "n_heads": 4, "d_ff": 40, "dropout": 0.1, "max_len": 64}


def _refuse_unknown(overrides: dict[str, str], only: list[str], own: dict[str, Any]) -> None:
    """A DiscoveryError for --component KIND=NAME of a kind check has not or a name the file does not
    define, and for --component KIND of a kind check has not."""
    for kind, name in overrides.items():
        if kind not in NAMES:
            raise DiscoveryError(f"--component {kind}={name}: unknown kind {kind!r}; kinds: "
                                 f"{', '.join(KINDS)}",
                                 zh=f"--component {kind}={name}：没有 {kind!r} 这类组件；可以检查的种类："
                                    f"{', '.join(KINDS)}")
        if name not in own:
            raise DiscoveryError(f"--component {kind}={name}: the file defines no {name!r}; it defines "
                                 f"{', '.join(sorted(own)) or 'no class or function'}",
                                 zh=f"--component {kind}={name}：文件里没有定义 {name!r}；它定义了 "
                                    f"{', '.join(sorted(own)) or '（没有类或函数）'}")
    for kind in only:
        if kind not in NAMES:
            raise DiscoveryError(f"--component {kind}: unknown kind; kinds: {', '.join(KINDS)}",
                                 zh=f"--component {kind}：没有这类组件；可以检查的种类：{', '.join(KINDS)}")


def _by_name(own: dict[str, Any], overrides: dict[str, str], wanted: set[str]) -> list[Component]:
    """The components of the `wanted` kinds found by their names (and --component KIND=NAME)."""
    found, taken = [], set()
    named = set(overrides.values())  # a name given with --component is checked as that kind only
    for kind, names in NAMES.items():
        for name, actual in _named(kind, names, own, overrides, named):
            if name not in taken and actual in wanted:
                taken.add(name)
                found.append(Component(actual, name, as_called(own[name])))
    found += _by_structure(own, taken | named | set(TABLED), wanted)
    found += _by_signature(own, taken | named, wanted, set(overrides))
    read = {id(r) for c in found for r in _read_by(c.obj)}  # their helpers: graded through them
    helpers = {name for name, obj in own.items() if id(obj) in read}
    return found + _by_behaviour(own, taken | named | {c.name for c in found} | helpers, wanted)


def _read_by(obj: Any) -> list[Any]:
    """What a found component's code reads of its module (a class: its methods' reads): its helpers,
    graded through it, never probed as components of their own."""
    return [r for f in (obj, *vars(obj).values()) if inspect.isfunction(f) for r in _reached(f)]


def _by_behaviour(own: dict[str, Any], taken: set[str], wanted: set[str]) -> list[Component]:
    """The learner's top-level functions and classes that no name, structure or signature found,
    taken as the kind a behavioural probe says they are (behaviour.py): a schedule whose `__call__`
    takes the step, a loss whatever it is called."""
    from handformer.check.core.behaviour import FILE_SECONDS, Budget
    from handformer.check.core.behaviour import KINDS as PROBED
    from handformer.check.core.behaviour import found as probed

    free = [(name, obj) for name, obj in own.items() if name not in taken | TABLED and "." not in name
            and not name.startswith(("_", "handformer_"))] if wanted & PROBED else []
    budget = Budget(FILE_SECONDS)
    kinds = [(name, probed(obj, budget)) for name, obj in free]  # (name, (kind, what is graded) or None)
    return [Component(k[0], name, k[1], "behaviour") for name, k in kinds if k and k[0] in wanted]


def _named(kind: str, names: tuple[str, ...], own: dict[str, Any], overrides: dict[str, str], named: set[str],
           ) -> list[tuple[str, str]]:
    """(name, the kind it is checked as) of each of the learner's objects a kind's `names` find: the one
    --component gives it, as that kind; else those its table finds (not given to another kind), each
    as what it does says (`refine`)."""
    if kind in overrides:
        return [(overrides[kind], kind)]
    return [(n, refine(kind, own[n])) for n in _matching(names, own, kind) if n not in named]


BPE_KINDS = ("bpe", "bpe_tokenizer")  # kinds whose names a WordPiece file may use too
# what a decoder-only model's __init__ builds, whatever its name (AI2's OLMo): token embeddings and a
# list of blocks
TOKENIZER_METHODS = ("train", "encode", "decode")  # a tokenizer that trains itself, whatever its name
GPT2_METHODS = ("bpe", "encode", "decode")  # GPT-2's encoder.py Encoder, handed its vocabulary and merges
MODEL_PARTS = re.compile(r"nn\.Embedding\(.*nn\.ModuleList\(", re.S)
# torch.nn's own encoder stack as the list of blocks (nn.TransformerEncoder(layer, n)): a decoder-only
# model where the class makes a causal mask for it, an encoder (a classifier's, BERT's) where it makes
# none (its decoder stack cross-attends to a memory: no decoder-only model to compare)
TORCH_STACK = re.compile(r"nn\.Embedding\(.*nn\.TransformerEncoder\(", re.S)
MAKES_CAUSAL = re.compile(r"\btri[lu]_?\(|is_causal\s*=\s*True|subsequent_mask\(")


def _by_structure(own: dict[str, Any], taken: set[str], wanted: set[str]) -> list[Component]:
    """The learner's top-level objects that no name found but whose structure is a kind's (STRUCTURES),
    in the table's order, then its logits processors."""
    free = {name: obj for name, obj in own.items() if name not in taken and "." not in name}
    return [Component(kind, name, obj, how) for kind, how, test in STRUCTURES if kind in wanted
            for name, obj in free.items() if test(name, obj)] + _processors(own, taken, wanted) + _lightning(
        free, wanted)


def _lightning(free: dict[str, Any], wanted: set[str]) -> list[Component]:
    """The learner's Lightning modules (lightning.py): each one's training step, and the schedule its
    configure_optimizers builds, where it builds one."""
    from handformer.check.core.lightning import configured_schedule, lightning_module, schedules

    found = [(name, cls) for name, cls in free.items() if lightning_module(cls)]
    steps = [Component("lightning", name, cls, "lightning") for name, cls in found if "lightning" in wanted]
    made = [(f"{name}.configure_optimizers", configured_schedule(cls, build, DiscoveryError))
            for name, cls in found
            if "schedule" in wanted and schedules(cls)]
    return steps + [Component("schedule", name, make, "configured") for name, make in made]


def _structured_model(name: str, obj: Any) -> bool:
    """A class that is a decoder-only model by what it builds (an embedding, then a list of blocks) and
    what its forward takes (one sequence of ids: no mask it requires); not one found, or left as a
    backbone, by its name."""
    return inspect.isclass(obj) and not name.endswith(SUFFIXES["gpt"]) and not any(
        "mask" in p.name and p.default is p.empty for p in _forward_parameters(obj).values()
    ) and _decoder_model(obj) and not classifies(obj)


def classifies(cls: Any) -> bool:
    """Whether a model's constructor reads a number of classes (ARGUMENTS' n_classes: `n_classes=4`,
    `config.num_labels`): its head gives one row of class scores, not a token's next-token logits."""
    names = "|".join(ARGUMENTS["n_classes"])
    return bool(re.search(rf"\b(?:{names})\b", source_text(vars(cls).get("__init__", ""))))


def _structured_classifier(name: str, obj: Any) -> bool:
    """A class built as a model of blocks (an embedding, then a list of blocks) whose constructor reads
    a number of classes: an encoder classifier, not a language model."""
    return inspect.isclass(obj) and classifies(obj) and _decoder_model(obj)


# what an encoder's output is called where a decoder takes it (Whisper's xa, PyTorch's memory)
MEMORY_WORDS = ("xa", "memory", "enc", "audio", "feature", "context", "cross")


def cached_decoder_parts(cls: Any) -> tuple[str, list[str]] | None:
    """(its cache argument, the encoder outputs it requires) of an encoder-decoder's decoder that takes
    a KV cache (Whisper's `TextDecoder.forward(x, xa, kv_cache=None)`): a class that builds token
    embeddings, then a list of blocks, whose forward takes the ids first, a cache that defaults to None,
    and requires nothing else but encoder outputs; else None."""
    params, required = _decoder_arguments(cls)
    cache = next((p.name for p in params
                  if p.default is None and re.search("past|cache", p.name.lower())), None)
    memory = [n for n in required if any(w in n.lower() for w in MEMORY_WORDS)]
    return (cache, memory) if cache and memory and memory == required else None


NOT_MEMORY = re.compile(r"(?i)mask|input|ids|token")  # enc_inputs, memory_key_padding_mask: not outputs


def _decoder_arguments(cls: Any) -> tuple[list[inspect.Parameter], list[str]]:
    """The forward arguments after self and the ids, and the names of those it requires, of a class that
    builds token embeddings, then a list of blocks; ([], []) for anything else."""
    built = inspect.isclass(cls) and MODEL_PARTS.search(source_text(vars(cls).get("__init__", "")))
    params = list(_forward_parameters(cls).values())[2:] if built else []  # after self and the ids
    return params, [p.name for p in params
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def memory_decoder_parts(cls: Any) -> list[str] | None:
    """The encoder outputs an encoder-decoder's decoder without a KV cache requires (Whisper's
    `TextDecoder.forward(x, xa)`): a class that builds token embeddings, then a list of blocks, whose
    forward takes the ids first and requires nothing else but encoder outputs; else None."""
    required = _decoder_arguments(cls)[1]
    memory = [n for n in required if any(w in n.lower() for w in MEMORY_WORDS) and not NOT_MEMORY.search(n)]
    return memory if memory and memory == required and cached_decoder_parts(cls) is None else None


# (the kind, how it was found, the test on a name and its object) of the kinds found by their structure:
# decoder-only models, tokenizers that train themselves (minbpe's classes), optimizers written by hand,
# encoder-decoders' decoders that take a KV cache, Sennrich's get_stats and merge_vocab (bpe_parts.py)
STRUCTURES = (("gpt", "structure", _structured_model), ("classifier", "structure", _structured_classifier),
              ("cached_decoder", "decoder_structure",
               lambda name, obj: cached_decoder_parts(obj) is not None),
              ("memory_decoder", "memory_structure",
               lambda name, obj: memory_decoder_parts(obj) is not None),
              ("wordpiece", "wordpiece_code", lambda name, obj: wordpiece_trainer(obj)),
              ("bpe_tokenizer", "methods", lambda name, obj: (
                  trains_itself(obj) or trains_itself(obj, GPT2_METHODS)) and not writes_wordpiece(obj)),
              ("optimizer", "optimizer", lambda name, obj: steps_parameters(obj)),
              ("bpe", "snippet", lambda name, obj: snippet_parts(name, obj) is not None))


def as_called(obj: Any) -> Any:
    """A class or function as a runner calls it: a logits processor (processors.py), named with
    --component top_k=TopKWarper, as the filter its setting names; anything else as it is."""
    from handformer.check.core.processors import as_filter, processor_setting

    kind, setting = processor_setting(obj)
    return as_filter(obj, setting, kind) if kind else obj


def _processors(own: dict[str, Any], taken: set[str], wanted: set[str]) -> list[Component]:
    """The learner's logits processors in Hugging Face's style (processors.py), each as the filter its
    constructor's setting names, called through a function of the logits."""
    from handformer.check.core.processors import as_filter, processor_setting
    from handformer.check.core.signatures import schedule_class

    settings = {name: processor_setting(obj) for name, obj in own.items() if name not in taken}
    schedules = {name: schedule_class(obj) for name, obj in own.items() if name not in taken}
    return [Component(kind, name, as_filter(own[name], argument, kind), "call")
            for name, (kind, argument) in settings.items() if kind in wanted] + [
        Component("schedule", name, fn, "schedule_class") for name, fn in schedules.items()
        if fn is not None and "schedule" in wanted]


# an adaptive update divides by a root of the second moment; Lion's takes the sign of its momentum
OPTIMIZER_CODE = re.compile(r"\bsqrt\b|\bsign_?\(")


ADAM_SETTINGS = {"betas", "beta1", "b1", "beta_1"}  # what an Adam's constructor takes (its moments' rates)


def steps_parameters(obj: Any) -> bool:
    """A class of the file of the Adam family (its constructor takes betas) that updates parameters
    itself: a torch.optim.Optimizer, or a plain class with step and zero_grad whose code takes a square
    root (an optimizer written by hand)."""
    import torch
    from torch import nn

    adam = ADAM_SETTINGS & {p.name.lower() for p in readable_parameters(obj)}
    if not (adam and inspect.isclass(obj)) or issubclass(obj, nn.Module):
        return False
    if issubclass(obj, torch.optim.Optimizer):
        return not obj.__module__.startswith("torch")  # torch's own, imported into the file: not theirs
    methods = all(callable(getattr(obj, m, None)) for m in ("step", "zero_grad"))
    return methods and bool(OPTIMIZER_CODE.search(with_helpers(obj)))


def with_helpers(obj: Any) -> str:
    """The source of a class with that of each function of its file its code calls by name (an
    optimizer's step that hands each parameter to an `update_fn` written beside it)."""
    own = source_text(obj)
    module = vars(inspect.getmodule(obj) or inspect)
    called = list(map(module.get, dict.fromkeys(re.findall(r"\b(\w+)\(", own))))
    return own + "".join(source_text(f) for f in called if inspect.isfunction(f))


ADAM_CODE = re.compile(r"\bbeta\w*\b[^\n]*\n(?s:.*)\bsqrt\b")  # a beta's moment, then its square root


def writes_adam(fn: Any) -> bool:
    """A training step that takes no optimizer and writes Adam's update itself (its moments with a beta,
    then a square root)."""
    names = {p.name.lower() for p in readable_parameters(fn)}
    return not names & {"optimizer", "opt", "optim"} and bool(ADAM_CODE.search(source_text(fn)))


def trains_itself(obj: Any, methods: tuple[str, ...] = TOKENIZER_METHODS) -> bool:
    """A class with train, encode and decode methods: a tokenizer that trains itself (minbpe's); with
    bpe, encode and decode (`methods` GPT2_METHODS), openai's GPT-2 `Encoder(encoder, bpe_merges)`,
    handed a vocabulary and merges. No torch module (its train() is the mode switch: a seq2seq
    model's encode and decode)."""
    from torch import nn

    return inspect.isclass(obj) and not issubclass(obj, nn.Module) and all(
        callable(getattr(obj, m, None)) for m in methods)


def _by_signature(own: dict[str, Any], taken: set[str], wanted: set[str], pointed: set[str],
                  ) -> list[Component]:
    """The learner's free functions whose name is in no kind's table, taken as the kind their
    signature and a call say they are (signatures.py): Raschka's generate_text_simple, a filter called
    nucleus. A kind given with --component KIND=NAME is that name only."""
    from handformer.check.core.signatures import kind_of, mask_kind

    found = []
    for name, obj in own.items():
        skip = name in taken or name in TABLED or name.startswith("handformer_")
        # a private function only where it builds a causal mask (CLIP's _build_causal_attention_mask)
        private = name.startswith("_") and mask_kind(obj) != "causal_mask"
        if skip or private or not inspect.isfunction(obj):
            continue
        kind = kind_of(obj)
        if kind in wanted and kind not in pointed:
            found.append(Component(kind, name, obj, "mask_code" if mask_kind(obj) else "signature"))
    return found


# classes found by how their name ends, after every exact name: minimind's MiniMindBlock and
# MiniMindForCausalLM, Karpathy's GPTLanguageModel
# and Hugging Face's LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding
SUFFIXES: dict[str, tuple[str, ...]] = {"block": ("Block", "Layer"), "decoder_layer": ("DecoderLayer",),
                                        "encoder_layer": ("EncoderLayer",),  # BartEncoderLayer
                                        "gpt": ("ForCausalLM", "LanguageModel", "LM", "Model"),
                                        "encoder_model": ("Model",),  # RoFormerModel, AlbertModel: segments
                                        "mha": ("Attention",), "ffn": ("MLP", "Mlp", "FeedForward"),
                                        # torchtune's Llama3ScaledRoPE
                                        "rmsnorm": ("RMSNorm",), "rope": ("RotaryEmbedding", "RoPE"),
                                        # Mixtral's MixtralSparseMoeBlock, Qwen-MoE's Qwen2MoeSparseMoeBlock
                                        "moe": ("SparseMoeBlock", "SparseMoEBlock", "MoeBlock", "MoEBlock",
                                                "MoeLayer", "MoELayer", "MoE")}  # DeepSeek's DeepseekMoE
# what a block's __init__ builds and a mixture of experts' never does: an attention
BUILDS_ATTENTION = re.compile(r"(?i)\battn|attention")
# a list of modules built, then a choice among them by score (a router's softmax, top-k or argmax)
ROUTES_EXPERTS = re.compile(r"nn\.ModuleList\(.*(?:softmax|topk|argmax|\.max\()", re.S)
# an encoder's or decoder's block has its own kind; a mixture of experts is no FFN to compare
NOT_SUFFIXED = ("Encoder", "Decoder", "Cross")
NOT_SUFFIXED_WORDS = re.compile("|".join(NOT_SUFFIXED), re.I)
# MoE in a name: a mixture of experts where the class holds them (a list of experts, weights a slice
# per expert); a family's prefix otherwise (Qwen3MoeRMSNorm, Qwen3MoeAttention, Qwen3MoeDecoderLayer)
MOE_WORD = re.compile("moe", re.I)
HOLDS_EXPERTS = re.compile(r"ModuleList\(|Parameter\(.*\b(num|n)_?(local_)?experts\b", re.I)
HEAD_MODELS = ("LanguageModel", "LMHeadModel")  # a model with its head: kept beside Hugging Face's backbone


VERSIONED = r"_?[vV]\d+"  # a name's version: Raschka's SelfAttention_v1, SelfAttention_v2


@functools.cache  # the names of the kinds' tables: a few hundred
def _versioned(name: str) -> re.Pattern[str]:
    """The pattern of `name` with a version after it, compiled once: the tables hold more names than
    `re` keeps compiled, and every check looks each one up."""
    return re.compile(re.escape(name) + VERSIONED)


# the kinds found by a name of their table made private too: functions of logits, each confirmed by a call
PRIVATE_KINDS = ("sample", "top_p", "top_k", "min_p", "greedy", "temperature")


def _matching(names: tuple[str, ...], own: dict[str, Any], kind: str = "") -> list[str]:
    """The learner's names among `names`, in that order (see `_stands_for`); then their classes whose
    name ends as this kind's do (SUFFIXES)."""
    out = []
    # the only names a table's name can stand for or carry a version of: looked through once, not once
    # a table name (a kind's table holds dozens, and every check looks up every kind's)
    dotted, numbered = [n for n in own if "." in n], [n for n in own if n[-1:].isdigit()]
    for name in names:
        # the name, or a sampling step's name made private (Meta's `_sample_top_p`, a helper of its loop)
        out += [name] * (name in own) + [f"_{name}"] * (f"_{name}" in own) * (kind in PRIVATE_KINDS)
        out += sorted(n for n in dotted if _stands_for(name, n))
        out += sorted(n for n in numbered if _versioned(name).fullmatch(n))
    out += sorted(n for n, o in own.items() if inspect.isclass(o) and n not in TABLED and n not in out
                  and _suffixed(n, o, SUFFIXES.get(kind, ("\0",))) and SUFFIX_TESTS.get(kind, bool)(o))
    if any(n.endswith(("ForCausalLM", "LMHeadModel")) for n in own):  # Hugging Face's XModel is the backbone
        out = [n for n in out if n in TABLED or not n.endswith("Model") or n.endswith(HEAD_MODELS)]
    return out


def _stands_for(name: str, dotted: str) -> bool:
    """Whether a name of a kind's table stands for a class's method `dotted` ("Class.method"):
    ".generate" for any generation method (`GPT.generate`, `GPT.generate_cached`), a plain name for a
    static method of that name (`make_std_mask` for the Annotated Transformer's Batch.make_std_mask)."""
    method = dotted.rpartition(".")[2]
    return method.startswith(name[1:]) if name.startswith(".") else method == name


# what a class found by its name's ending must compute besides (an ...Attention, an attention)
ATTENTION_CODE = re.compile(r"(?i:softmax)|scaled_dot_product_attention|MultiheadAttention\(|flash_attn")


def computes_attention(cls: Any) -> bool:
    """Whether a class computes attention: its source, or that of the file's classes and functions it
    names (and theirs, in turn), applies a softmax or an attention kernel. labml's
    PrepareForMultiHeadAttention, a projection split into heads, does not: it is checked as a part of
    the attention that builds it."""
    own = own_objects(sys.modules[cls.__module__])
    reached, sources = {cls.__name__}, [source_text(cls)]
    for source in sources:  # grows as the objects it names are reached
        named = [n for n in own if n not in reached and re.search(rf"\b{re.escape(n)}\b", source)]
        reached.update(named)
        sources += [source_text(own[n]) for n in named]
    return bool(ATTENTION_CODE.search("".join(sources)))


# what an encoder-only model (BERT's) takes or embeds and a decoder-only one never does: token types
SEGMENTS = re.compile(r"token_?type|segment|type_vocab", re.I)


def encoder_only(cls: Any) -> bool:
    """A model of BERT's family by its forward's parameters or its __init__: token types (segments)
    embedded beside the tokens; a decoder-only model (GPT) has none."""
    built = source_text(vars(cls).get("__init__", ""))
    return bool(SEGMENTS.search(" ".join(_forward_parameters(cls)) + built))


def part_of_a_block(cls: Any) -> bool:
    """Whether another ...Block or ...Layer class of its file builds it: gpt-oss's AttentionBlock (norm,
    attention, residual) and MLPBlock inside its TransformerBlock are that block's parts, checked in it."""
    own = own_objects(sys.modules[cls.__module__])
    return any(inspect.isclass(o) and o is not cls and n.endswith(SUFFIXES["block"])
               and re.search(rf"\b{cls.__name__}\(", source_text(vars(o).get("__init__", "")))
               for n, o in own.items())


# a recurrent layer of torch.nn: a language model built on one (an RNN's ...LM) is no Transformer
RECURRENT = re.compile(r"\b(?:GRU|LSTM|RNN)\(")


def transformer_lm(cls: Any) -> bool:
    """A decoder-only Transformer by what it builds: no token types (BERT's), and attention where it
    builds a recurrent layer (a toy GRU language model that drives a generation loop is none)."""
    return not encoder_only(cls) and (not RECURRENT.search(source_text(cls)) or computes_attention(cls))


SUFFIX_TESTS: dict[str, Callable[[Any], bool]] = {"mha": computes_attention,
                                                  "gpt": transformer_lm, "encoder_model": encoder_only,
                                                  "block": lambda c: not part_of_a_block(c),
                                                  "moe": lambda c: not _decoder_model(c),  # no ...MoE model
                                                  "ffn": lambda c: not maps_elsewhere(c)}
# a class named ...Layer is a block when its __init__ builds an attention and an FFN (GPT-NeoX's GPTNeoXLayer;
# Hugging Face BERT's BertLayer, whose FFN's first linear is its `intermediate`)
LAYER_PARTS = re.compile(r"(?=[\s\S]*(attn|attention))(?=[\s\S]*(mlp|ffn|feed_?forward|intermediate))", re.I)


LINEAR_SIZES = re.compile(r"\bLinear\(\s*(\w+)\s*,\s*(\w+)\s*[,)]")  # nn.Linear(d_in, d_out...


def maps_elsewhere(cls: Any) -> bool:
    """A stack of linear layers whose output width is not its input width at the constructor's own
    defaults (`TinyMLP(d_in=8, d_hidden=32, n_classes=3)`: 8 features to 3 classes): a small model of
    its own, never a sublayer whose output is added back to the stream it reads. A width the defaults
    do not give (timm's `out_features=None`, meaning the input's) decides nothing."""
    init = vars(cls).get("__init__", "")
    sizes = LINEAR_SIZES.findall(source_text(init))
    if len(sizes) < 2 or not callable(init):
        return False
    defaults = {p.name: p.default for p in inspect.signature(init).parameters.values()}
    first, last = defaults.get(sizes[0][0]), defaults.get(sizes[-1][1])
    return type(first) is int and type(last) is int and first != last


def _suffixed(name: str, obj: Any, suffixes: tuple[str, ...]) -> bool:
    """Whether a class is found by how its name ends: the words of NOT_SUFFIXED not in the rest of its
    name (FalconDecoderLayer: Falcon) unless it is a decoder-only model by what it builds (DecoderLM),
    nor MoE where it holds experts (MOE_WORD), and a ...Layer building an attention and an FFN."""
    rest = [name[:-len(s)] for s in suffixes if name.endswith(s)]
    built = source_text(vars(obj).get("__init__", ""))
    builds = not name.endswith("Layer") or LAYER_PARTS.match(built)
    moe = bool(rest) and MOE_WORD.search(rest[0]) and HOLDS_EXPERTS.search(built)
    return bool(rest and builds and (not (NOT_SUFFIXED_WORDS.search(rest[0]) or moe) or _decoder_model(obj)))


def _decoder_model(cls: Any) -> bool:
    """A decoder-only model by its embedding and list of blocks and its forward of one id sequence
    (DecoderLM: the word Decoder in its name is no seq2seq decoder)."""
    built = source_text(vars(cls).get("__init__", ""))
    stack = MODEL_PARTS.search(built) or TORCH_STACK.search(built) and MAKES_CAUSAL.search(source_text(cls))
    return bool(stack) and decoder_only(cls) and not encoder_only(cls)


# kinds of a function of tensors alone (logits, labels): a function of theirs of one of these names that
# takes a model, a data loader or a dataset is something else (an evaluation loop), none of these kinds
TENSORS_ONLY = ("distill", "chunked_ce", "z_loss", "lm_shift", "perplexity", "penalties", "no_repeat_ngram",
                "min_length")
MODEL_WORD = re.compile(r"(?i)model|loader|dataset|^(net|m|lm|gpt|data|batch)$")


def refine(kind: str, obj: Any) -> str:
    """The kind a found name is checked as, by what the class or function does (CLASS_RULES): a
    multi-head attention built with a number of key/value heads (Llama's `Attention(dim, n_heads,
    n_kv_heads)`) is grouped-query attention. A BPE name on WordPiece code (`train_tokenizer`, a
    `Tokenizer` class, `encode`) is the WordPiece tokenizer where it trains one, else none of its own
    (an encode or decode beside the trainer, checked with it)."""
    if kind in BPE_KINDS and writes_wordpiece(obj):
        return "wordpiece" if wordpiece_trainer(obj) else ""
    if inspect.isfunction(obj):
        return _refine_function(kind, obj)
    return next((to for name, test, to in CLASS_RULES if name == kind and test(obj)), kind)


def _refine_function(kind: str, obj: Any) -> str:
    """The kind a found function is checked as by the first of FUNCTION_RULES that holds; else a
    function of SAME_FAMILY is the kind of the family that its signature and a call say."""
    from handformer.check.core.signatures import kind_of

    to = next((to for kinds, test, to in FUNCTION_RULES if kind in kinds and test(obj)), None)
    family = FAMILY_OF.get(kind, ()) * (to is None)
    said = kind_of(obj) if family else None
    # a `sample(model, input_ids, processors, max_new_tokens)` that takes a model is a generation loop
    return said if said in (*family, "generate") else given(to, kind)


def _lowered_names(fn: Any) -> set[str]:
    return {p.name.lower() for p in readable_parameters(fn)}


def _said(fn: Any, test: str) -> Any:
    """What signatures.py's `test` says of fn (imported when asked: it imports torch)."""
    from handformer.check.core import signatures

    return getattr(signatures, test)(fn)


# the kind a found function is checked as, by the first row that holds: (the kinds found as, what the
# function does, the kind it is checked as)
FUNCTION_RULES: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    # `perplexity(model, loader)`: an evaluation loop, not the function of logits
    (TENSORS_ONLY, lambda f: any(map(MODEL_WORD.search, inspect.signature(f).parameters)), ""),
    (("train_step", "lm_train_step"), writes_adam, "adam_step"),
    # `train_step(policy, ref_model, optimizer, batch)`: a frozen reference beside it
    (("train_step",), lambda f: bool(_lowered_names(f) & set(REFERENCE_MODEL_NAMES)), "dpo_step"),
    (("train_step",), lambda f: _said(f, "lm_step"), "lm_train_step"),  # it takes the windows x and y
    # compute_advantages(rewards, group_size): GRPO's, not GAE
    (("gae",), lambda f: _grouped(_lowered_names(f)), "group_advantages"),
    # Gemma 2's make_masks(q_len, ...): no pad
    (("mask_helper",), lambda f: _said(f, "mask_kind") == "causal_mask", "causal_mask"),
    (("greedy_decode", "generate"), lambda f: _loops_over_memory(f), "memory_greedy"),
)


def _grouped(names: set[str]) -> bool:
    """Arguments of GRPO's advantages: a group size (group_size, num_generations), and no values."""
    return any(re.search(r"group|generations", n) for n in names) and not any("value" in n for n in names)


def _loops_over_memory(fn: Any) -> bool:
    """A decoding loop handed a decoder and the encoder's output (`greedy_decode(decoder,
    audio_features, sot_sequence, eot)`, Whisper's): its second argument is named as an encoder output."""
    names = [p.name.lower() for p in readable_parameters(fn)]
    return len(names) > 1 and any(w in names[1] for w in LOOP_MEMORY_WORDS)


# an encoder's output as a decoding loop's second argument (not `context`: a prompt's name)
LOOP_MEMORY_WORDS = ("xa", "memory", "audio", "feature", "encoder_out", "enc_out", "encoder_hidden")


def reads_kv_heads(cls: Any) -> bool:
    """Meta's Attention(args): the config its constructor reads names the key/value heads."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return any(set().union(*config_reads(cls, p.name)) & set(ARGUMENTS["n_kv_heads"]) for p in params)


# kinds whose functions are told apart by what they take and return, whatever their name: a
# greedy_decode(model, idx, max_new_tokens) is a generation loop, a sample_top_p that returns
# filtered logits is a filter
SAME_FAMILY = (("greedy_decode", "beam_search", "generate"),
               ("top_k", "top_p", "min_p", "sample", "temperature", "greedy"))
FAMILY_OF = {kind: family for family in SAME_FAMILY for kind in family}  # the families are apart

CAUSAL_WORDS = re.compile(r"\btri[lu]_?\b|is_causal\s*=\s*True|causal")  # tril_: ChatGLM's in-place


TOKEN_EXTRAS = ("start_pos", "targets", "target", "labels", "y", "position_ids", "positions", "pos",
                "cache", "kv_cache")  # a KV cache it requires (mistral-src's forward(ids, positions, cache))
# what a decoder-only layer's forward takes besides its one stream: the rotary tables and positions
POSITION_EXTRAS = TOKEN_EXTRAS + ("freqs_cis", "freqs_complex", "pos_cis", "freqs_cos", "freqs_sin", "cos",
                                  "sin", "cos_sin", "position_embeddings", "input_pos", "rope", "rotary_emb",
                                  "rotary_pos_emb",  # ChatGLM's cache (T, Dh/2, 2)
                                  # a KV cache handed in, and where to write it (gemma_pytorch's)
                                  "kv_cache", "cache", "past_key_value", "layer_past", "kv_write_indices",
                                  # the index of its layer in that cache (mistral-src's layer_id)
                                  "layer_id", "layer_idx", "layer")


# what only a decoding layer's forward takes: a KV cache, and where its new tokens start
DECODING_EXTRAS = {"start_pos", "kv_cache", "cache", "past_key_value", "layer_past", "input_pos"}
# (the kind a class's name says, what the class shows, the kind it is then checked as): the first that
# applies, in order
# the first three inputs of an attention handed q, k and v already projected (ChatGLM's CoreAttention:
# query_layer, key_layer, value_layer), and what its constructor may build beside: nothing with weights
QKV_INPUTS = (re.compile(r"(?i)^(?:q|query|queries|xq)(?:_\w+)?$"),
              re.compile(r"(?i)^(?:k|key|keys|xk)(?:_\w+)?$"),
              re.compile(r"(?i)^(?:v|value|values|xv)(?:_\w+)?$"))
UNWEIGHTED = {"Dropout", "Softmax", "Identity"}


def core_attention(cls: Any) -> bool:
    """Whether an attention class takes q, k, v already projected and builds no layer with weights
    (ChatGLM's CoreAttention(config), d2l's DotProductAttention(dropout)): scaled dot-product attention,
    checked so; a multi-head attention's projections live in the class that calls it."""
    inputs = list(_forward_parameters(cls))[1:4]
    built = set(re.findall(r"\b([A-Z]\w*)\(", source_text(vars(cls).get("__init__", ""))))
    return len(inputs) == 3 and all(map(re.match, QKV_INPUTS, inputs)) and built <= UNWEIGHTED


CLASS_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("mha", core_attention, "sdpa"),
    ("mha", lambda c: "n_kv_heads" in argument_keys(c).values(), "gqa"),
    ("block", lambda c: encoder_block(c) or takes_keys_apart(c), "encoder_layer"),
    # Umar Jamil's EncoderBlock(args): a start position is a decoder's KV cache
    ("encoder_layer", lambda c: "start_pos" in _forward_parameters(c), "block"),
    ("transformer", lambda c: decoder_only(c), "gpt"),
    # a decoder-only model's DecoderLayer (llama2.c's kin): no memory to attend to
    ("decoder_layer", lambda c: decoder_only(c, POSITION_EXTRAS), "block"),
    # a model of token ids and features of another modality (CLIP's text tower beside image_embeds):
    # neither a language model nor an encoder-decoder, none of check's kinds
    ("gpt", lambda c: takes_features(c), ""),
    # found by its ending (Llama3Model's "Model"): what its forward takes says
    ("gpt", lambda c: c.__name__ not in NAMES["gpt"] and not decoder_only(c), "transformer"),
    ("gpt", lambda c: encoder_only_model(c), "encoder_model"),  # DistilBertForMaskedLM: nothing causal
    ("mha", lambda c: causal_inside(c), "causal_attention"),  # Raschka's, Karpathy's: forward(x)
    ("mha", lambda c: reads_kv_heads(c), "gqa"),
    # a LoRA class that wraps a whole model (`LoRA(model, r)`): no layer to check on its own
    ("lora", lambda c: any(map(MODEL_WORD.search, inspect.signature(c.__init__).parameters)), ""),
    # a mixture of experts named for an FFN (Switch's SparseMLP): a list of experts it routes among
    ("ffn", lambda c: bool(ROUTES_EXPERTS.search(source_text(c))), "moe"),
    # a block of a mixture-of-experts model named for its FFN (MoEBlock: attention, then the experts)
    ("moe", lambda c: bool(BUILDS_ATTENTION.search(source_text(vars(c).get("__init__", "")))), "block"),
    # a Batch that builds no masks of the Annotated Transformer's (a dataset's record): not checked
    # (its source mask named for the mask and its side: src_mask, source_mask, enc_mask)
    ("batch_masks", lambda c: not SOURCE_MASK.search(source_text(c)), "none"),
)


SOURCE_MASK = re.compile(r"self\.(?=\w*mask)(?=\w*(?:src|source|enc))\w+\s*=", re.I)


def _forward_parameters(cls: Any) -> dict[str, inspect.Parameter]:
    """The parameters of a class's forward, `self` first; none when it has no signature to read."""
    return {p.name: p for p in readable_parameters(getattr(cls, "forward", None))}


def _module_of(obj: Any) -> types.ModuleType | None:
    return sys.modules.get(getattr(obj, "__module__", ""), None)


# a required input that is features, not token ids: CLIP's image_embeds, pixel_values, audio_features
FEATURE_INPUT = re.compile(r"(?i)embed|feature|pixel|image|audio|vision")


def takes_features(cls: Any) -> bool:
    """Whether a model's forward requires, beside its token ids, an input named for features."""
    params = list(_forward_parameters(cls).values())[2:]
    return any(p.default is p.empty and FEATURE_INPUT.search(p.name) for p in params)


def decoder_only(cls: Any, extras: tuple[str, ...] = TOKEN_EXTRAS) -> bool:
    """A model whatever its name (Meta's `Transformer`) whose forward takes one sequence of token ids
    (and maybe Meta's start_pos or the targets, or a layer's `extras`): decoder-only; an
    encoder-decoder takes two."""
    params = list(_forward_parameters(cls).values())[1:]
    names = {p.name for p in params}
    # targets that come with their own mask (forward(source, target, source_mask, target_mask)) are
    # the decoder's input, not the labels of a loss
    inputs = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
              and (p.name not in extras and not POSITION_WORDS.search(p.name) or f"{p.name}_mask" in names)
              and "mask" not in p.name]
    return len(inputs) == 1 > len(names & set(MEMORY_NAMES))  # one input, and no encoder output named


# an argument named for the positions of the tokens (gpt-fast's input_pos, start_pos, position_ids): no
# second sequence
POSITION_WORDS = re.compile(r"(^|_)pos(itions?)?(_|$)", re.I)


# the encoder's output a decoder layer's forward takes, by name, even where it defaults to None
# (Hugging Face's BartDecoderLayer.forward(hidden_states, attention_mask, encoder_hidden_states, ...))
MEMORY_NAMES = ("encoder_hidden_states", "memory", "enc_output", "enc_outputs", "encoder_output",
                "encoder_outputs", "enc_out", "encoder_out")


def encoder_block(cls: Any) -> bool:
    """A block (by its name: TransformerBlock) that is an encoder layer by what it does: its mask is
    optional, or required where it takes the stream and the mask alone (ELECTRA's BertLayer(x,
    attention_mask)), or it takes none (timm's ViT Block.forward(x)), and nothing in its file is causal (no
    tril, triu, is_causal=True or causal mask), so with no mask every token sees every other, as in
    the paper's encoder. One that takes a KV cache or where its tokens start (mistral-src's
    TransformerBlock(x, cos, sin, mask, cache, start_pos)) decodes: a decoder-only block."""
    params = _forward_parameters(cls)
    masks = [p.default for p in params.values() if "mask" in p.name.lower()]
    # a mask it requires beside more than its stream (mistral-src's block(x, freqs_cis, positions, mask))
    if set(params) & DECODING_EXTRAS or len(params) > 3 and inspect.Parameter.empty in masks:
        return False
    return nothing_causal(cls)


def nothing_causal(cls: Any) -> bool:
    """Whether nothing in the class's file is causal: no tril, triu, is_causal=True, causal,
    subsequent or look-ahead mask."""
    source = source_text(_module_of(cls))
    return bool(source) and not CAUSAL_WORDS.search(source) and not re.search(r"subsequent|look_?ahead",
                                                                               source)


def encoder_only_model(cls: Any) -> bool:
    """A model of one sequence of token ids (found by its name as a GPT: DistilBertForMaskedLM,
    DistilBertModel) that takes Hugging Face's attention_mask and whose file is causal nowhere: every
    token sees every other, an encoder-only model (BERT's kin), not a decoder-only one."""
    return "attention_mask" in _forward_parameters(cls) and nothing_causal(cls)


def takes_keys_apart(cls: Any) -> bool:
    """A block whose forward takes an attention's inputs apart (Persson's TransformerBlock.forward(value,
    key, query, mask)): a layer of an encoder-decoder, whose decoder hands it the encoder's output as
    keys; a decoder-only block takes one stream."""
    return len(input_roles(list(_forward_parameters(cls))[1:])) >= 2


def causal_inside(cls: Any) -> bool:
    """An attention that builds its own causal mask: its forward takes no mask, and its source (or
    that of a class of the same file it builds, Karpathy's `Head`) makes a triangle."""
    params = _forward_parameters(cls)
    if not params or any("mask" in p.lower() or "valid_len" in p.lower() for p in params):
        return False
    own = source_text(cls)
    module = _module_of(cls)
    used = [o for o in (vars(module).values() if module else ()) if inspect.isclass(o) and o is not cls
            and getattr(o, "__module__", None) == cls.__module__ and re.search(rf"\b{o.__name__}\s*\(", own)]
    return any(CAUSAL_WORDS.search(source_text(o)) for o in [cls, *used])


def defined_here(module: types.ModuleType) -> dict[str, Any]:
    """The classes and functions the learner's file defines (not the ones it imports), by name."""
    return {name: obj for name, obj in vars(module).items()
            if (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module.__name__
            and getattr(obj, "__name__", "") != "<lambda>"}  # encode = lambda s: [stoi[c] ...]: no component


def own_objects(module: types.ModuleType) -> dict[str, Any]:
    """`defined_here`, and a class's own generation methods too, as "Class.generate" (nanoGPT's
    `GPT.generate`, a `generate_cached` beside it), its static methods (the Annotated
    Transformer's `Batch.make_std_mask`) and a collator's masking methods (METHOD_NAMES): functions of
    their own, graded as their kind is."""
    own = defined_here(module)
    for name, cls in [(n, o) for n, o in own.items() if inspect.isclass(o)]:
        for attr, member in vars(cls).items():
            function = getattr(member, "__func__", member) if isinstance(member, staticmethod) else None
            function = member if attr.startswith("generate") and inspect.isfunction(member) and _repeats(
                member, cls, own) or attr in METHOD_NAMES else function
            if inspect.isfunction(function):
                own[f"{name}.{attr}"] = function
    return own


def _repeats(method: Any, cls: type, own: dict[str, Any]) -> bool:
    """A generation method: one that loops (for, while) or hands on to a function of the file or a
    method of its class that may; not the Annotated Transformer's Transformer.generate(x), its
    output layer's log-softmax, a step a loss is computed on."""
    code = code_text(method).partition(":")[2]  # (its `def` line left out)
    called = set(re.findall(r"(\w+)\s*\(", code))
    return bool(LOOPS.search(code) or called & (set(vars(cls)) | set(own)))


LOOPS = re.compile(r"^\s*(for|while)\b", re.M)


def defined_names(module: types.ModuleType) -> list[str]:
    return sorted(own_objects(module))


# the sizes a config gives where the component built never uses them (happy-llm's attention built from
# a ModelArgs whose vocab_size and n_layer have no default; nanochat's attention reads n_layer)
SPARE_SIZES = {"src_vocab": 29, "n_layers": 2}


def _config_values(sizes: dict[str, Any]) -> dict[str, Any]:
    """Every common field name -> its value, for configuration objects (nanoGPT's config, Raschka's
    cfg dict, Meta's ModelArgs, a minimind-style config class)."""
    sizes = {**SPARE_SIZES, **with_head_size(sizes)}
    sizes.setdefault("n_kv_heads", sizes.get("n_heads"))
    sizes.setdefault("tgt_vocab", sizes.get("src_vocab"))
    fields = {alias: sizes[key] for key, aliases in ARGUMENTS.items() if sizes.get(key) is not None
              for alias in aliases}
    fields = {**FIXED, **fields}  # a size given over a fixed value of the same name
    fields["bias"] = True
    fields["norm_eps"] = fields["eps"] = fields["rms_norm_eps"] = 1e-5
    return fields


def with_head_size(sizes: dict[str, Any]) -> dict[str, Any]:
    """The sizes with the head width (Karpathy's head_size, Meta's head_dim) d_model / n_heads, and
    the FFN's width as a whole multiple of d_model (at least 4: an FFN as wide as the model would
    hide which layer is which, and OLMo's fused gate and up, mlp_ratio * d_model rows halved by its
    SwiGLU, is as wide at 2, and as tall as a fused q/k/v projection at 3)."""
    out = dict(sizes)
    if "d_model" in sizes and "n_heads" in sizes:
        out["d_head"] = sizes["d_model"] // sizes["n_heads"]
    if "d_model" in sizes and sizes.get("d_ff"):
        out.setdefault("ffn_mult", max(4, sizes["d_ff"] // sizes["d_model"]))
    return out


def _dict_keys(cls: Any) -> set[str]:
    """The string keys the learner's whole file subscripts (cfg["emb_dim"]), from its source."""
    return set(re.findall(r"""\[["'](\w+)["']\]""", source_text(_module_of(cls))))


def _config_class(p: inspect.Parameter, cls: Any) -> Any:
    """The class a config argument is annotated with, when the learner's file defines it (Meta's
    ModelArgs, a minimind-style config class)."""
    ann = annotation(p, cls)
    # a module the constructor is handed (Umar Jamil's Transformer(encoder: Encoder, ...)) is a part; a
    # dataclass of another file of the learner's (gemma_pytorch's gemma_config.GemmaConfig) is a config
    same = inspect.isclass(ann) and (getattr(ann, "__module__", None) == getattr(cls, "__module__", None)
                                     or dataclasses.is_dataclass(ann))
    if same and not hasattr(ann, "forward"):
        return ann
    return _covering_config(cls, p.name) if p.name.lower() in CONFIG_NAMES else None


def annotation(p: inspect.Parameter, cls: Any) -> Any:
    """The argument's annotation as an object: a string one ("ModelArgs", "gemma_config.GemmaConfig")
    looked up in the learner's file; None where it names nothing there."""
    ann, module = p.annotation, _module_of(cls)
    if isinstance(ann, str) and module is not None:
        head, *rest = ann.split("[")[0].strip("'\" ").split(".")
        found = vars(module).get(head, getattr(builtins, head, None))  # "bool": the builtin
        ann = functools.reduce(lambda obj, name: getattr(obj, name, None), rest, found)
    return ann


def plain_choice(p: inspect.Parameter, cls: Any) -> Any:
    """What an argument without a default gets where its type says the choices: an enum's first
    member (gemma_pytorch's attn_type: AttentionType.GLOBAL), False for a bool (its quant); else None."""
    ann = annotation(p, cls)
    members = list(ann) if inspect.isclass(ann) and issubclass(ann, enum.Enum) else [None]
    return False if ann in (bool, "bool") else members[0]


def defaulted_config(fn: Any, name: str) -> Any:
    """The dataclass the argument `name` of a function is annotated with (`cfg: TrainConfig`), when every
    field has a default (check builds it at the learner's defaults); an argument without annotation
    nor default whose attributes the function reads as values (`params.min_p`, `args.grad_clip`): a
    dataclass of them at the file's own values (own_defaults.settings_class); else None."""
    p = inspect.signature(fn).parameters[name]
    ann = annotation(p, fn)
    if not dataclasses.is_dataclass(ann):  # an annotation is a class (an instance of one would be odd)
        return settings_class(fn, name) if p.default is p.empty else None
    required = [f for f in dataclasses.fields(ann) if f.default is f.default_factory is dataclasses.MISSING]
    return None if required else ann


def _covering_config(cls: Any, name: str) -> Any:
    """An unannotated `config` argument's class: the one config class of the learner's file whose fields
    hold every attribute the constructor reads from it (GPT-NeoX's GPTNeoXConfig with rotary_pct and
    use_parallel_residual), so that the fields check does not know keep the file's defaults."""
    attrs = config_reads(cls, name)[1]
    own = [c for c in vars(_module_of(cls) or types).values()  # the file's own: not what it imports
           if isinstance(c, type) and c.__module__ == cls.__module__]
    covering = [c for c in own if (held := _held_fields(c)) and attrs <= held]
    return covering[0] if len(covering) == 1 else None


def _held_fields(c: type) -> set[str]:
    """The fields a class of the learner's file holds as a configuration (not a module): a dataclass's,
    a plain class's constructor arguments and the attributes it sets there (Hugging Face's GPT2Config:
    hidden_size = n_embd; BertConfig(vocab_size=..., hidden_size=...) handed on whole by BertModel)."""
    return set() if hasattr(c, "forward") else _class_fields(c) | config_reads(c, "self")[1]


def make_config(cls: Any, p: inspect.Parameter, sizes: dict[str, Any]) -> Any | None:
    """The configuration for the argument `p` of `cls`, in the form its code reads it: a dict when it
    is subscripted (cfg["emb_dim"]), the learner's own config class (a dataclass filled field by
    field, or a class built by its keyword arguments), or a namespace with every common field; None
    when `p` is not a configuration."""
    keys, attrs = config_reads(cls, p.name)
    values = {**_word_sizes(keys | attrs, sizes),
              **_config_values(sizes)}
    # `config.a or config.b`: a field check has no size for stands for b's (OLMo's embedding_size)
    fallbacks = config_fallbacks(cls, p.name).items()
    values.update({a: values[b] for a, b in fallbacks if b in values and a not in values})
    own = _config_class(p, cls)
    if own is None and not keys and p.name.lower() not in CONFIG_NAMES and not _read_as_config(p, cls, attrs):
        return None
    if keys:
        own_values = file_dict_values(cls, keys)  # where check has no size: the file's own
        config = {**own_values, **values, **{k: values[k.lower()] for k in keys if k.lower() in values}}
        if sizes.get("d_ff") and _dict_keys(cls) & {"emb_dim", "d_model", "dim", "n_embd"}:
            config["hidden_dim"] = sizes["d_ff"]  # Raschka's cfg: emb_dim the width, hidden_dim the FFN's
        return config
    for key in DICT_ONLY:  # a config class or a namespace keeps the file's own (its count of experts)
        values.pop(key, None)
    if own is not None:
        values = {**rotary_shares(class_defaults(own)), **paired_hidden(values, _class_fields(own), sizes)}
        values.update(special_ids_within(class_defaults(own), values))  # built in check's vocabulary
        if dataclasses.is_dataclass(own):
            names = {f.name for f in dataclasses.fields(own) if f.init}
            values = {**required_windows(own, sizes), **paired_hidden(values, names | attrs, sizes)}
            config = own(**{n: values[n] for n in names if n in values})
        else:
            params = inspect.signature(own).parameters
            takes_any = any(q.kind is q.VAR_KEYWORD for q in params.values())
            source = source_text(own)  # kwargs.get("vocab_size", 6400): the names its code reads
            config = own(**{n: v for n, v in values.items()
                            if n in params or (takes_any and re.search(rf"\b{n}\b", source))})
        return _with_values(config, {attr: value for attr, value in values.items() if (
            attr in attrs or hasattr(config, attr)) and not callable(getattr(config, attr, None))
            and not isinstance(getattr(type(config), attr, None), property)})  # gpt-fast's head_dim
    return _namespace(cls, values, attrs, sizes)


def _with_values(config: Any, values: dict[str, Any]) -> Any:
    """The config with `values` (what the learner's code reads, at check's sizes) set field by field; a
    frozen dataclass (Griffin's GriffinConfig) as its constructor built it from them, never assigned to."""
    frozen = getattr(getattr(config, "__dataclass_params__", None), "frozen", False)
    for attr, value in ({} if frozen else values).items():
        setattr(config, attr, value)
    return config


def _word_sizes(names: set[str], sizes: dict[str, Any]) -> dict[str, Any]:
    """Check's size for each field whose words say one (size_of: fairseq's encoder_embed_dim, Griffin's
    width), under the names the tables list."""
    sized = _config_sizes(sizes)
    return {n: sized[size_of(n)] for n in names if sized.get(size_of(n)) is not None}


def fit_config_sections_(config: Any, half: int) -> Any:
    """The config with its section lists fitted to `half`, tied by the sizes its class gives by default."""
    defaults = quietly(type(config), (Exception,), None)  # the config of the file's own defaults
    fit_sections_(getattr(config, "__dict__", {}), own_half_head(getattr(defaults, "__dict__", {})), half)
    return config


def own_half_head(values: Mapping[str, Any]) -> int | None:
    """Half the head width that the file's values (a config's defaults, a module's constants) give by
    their names: a head width, or a width over heads (none without heads); None where they do not say."""
    sizes = {size_of(n): v for n, v in values.items() if type(v) is int}
    head = sizes.get("d_head") or sizes.get("d_model", 0) // sizes.get("n_heads", 1 << 62)
    return head // 2 or None


def _namespace(cls: Any, values: dict[str, Any], attrs: set[str], sizes: dict[str, Any]) -> SizedNamespace:
    """A config namespace with check's values, the file's own for what check has no size for, a rotary
    share of the file's at check's (rotary_shares)."""
    own = own_defaults(cls)
    shared = {**rotary_shares(own), **paired_hidden(values, attrs, sizes)}
    return SizedNamespace(shared, _config_sizes(sizes), {**dict.fromkeys(flags(cls), False), **own})


# what a constructor reads of a layer it is handed (LoRA's base_layer.in_features), never of a config
LAYER_ATTRS = frozenset({"weight", "in_features", "out_features", "embedding_dim", "num_embeddings",
                         "parameters", "forward"})


def _read_as_config(p: inspect.Parameter, cls: Any, attrs: set[str]) -> bool:
    """An argument of any name whose fields the constructor reads by a size's name (`hp.n_embd`,
    `a.block_size`) is a configuration; not one annotated with a module, or read as a layer is."""
    read = attrs | set(dir(annotation(p, cls)))  # an annotation of a module has its forward
    return any(map(size_of, attrs)) and not read & LAYER_ATTRS


def _config_sizes(sizes: dict[str, Any]) -> dict[str, Any]:
    """The sizes a config namespace answers by a field's name (SizedNamespace), as _config_values fills
    them."""
    sizes = {**SPARE_SIZES, **with_head_size(sizes)}
    sizes.setdefault("n_kv_heads", sizes.get("n_heads"))
    return {**sizes, "tgt_vocab": sizes.get("tgt_vocab", sizes.get("src_vocab"))}


class SizedNamespace(types.SimpleNamespace):
    """A configuration that also answers a field no table lists by what its name says (size_of): the
    fields a part built from the same config reads (GLM's TransformerLayer(args) reads
    args.attention_dropout, which GLMModel hands on), and a name of common words (max_sequence_length);
    a field whose name says no size, by the value the learner's file gives it (own_defaults: BERT's
    type_vocab_size=2 in the file's own argparse.Namespace(...)); else missing, as in any namespace."""

    def __init__(self, values: dict[str, Any], sizes: dict[str, Any],
                 own: Mapping[str, Any] = types.MappingProxyType({})) -> None:
        super().__init__(**values)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_own", own)

    def __getattr__(self, name: str) -> Any:
        held = self.__dict__  # __deepcopy__ and the like: no size, no value of the file
        value = given(held.get("_sizes", {}).get(size_of(name)), held.get("_own", {}).get(name.lower()))
        if value is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return value

    def __getitem__(self, key: str) -> Any:
        """config["hidden_size"]: a config handed on whole to parts that subscript it (a BERT layer that
        reads nothing itself hands it to its attention, which reads config["num_attention_heads"])."""
        return getattr(self, key)


def file_dict_values(cls: Any, keys: set[str]) -> dict[str, Any]:
    """The values of the file's own config dicts (a module-level `peizhi = {"rope_theta": 10000.0, ...}`)
    that hold a key its code reads: what check has no size for keeps the file's (the rotary base, a
    norm's epsilon, the layers built from the dict handed on); under them, the value the file writes for
    any key its code subscripts (own_defaults: a `dict(type_vocab_size=2, ...)` a function builds)."""
    dicts = [v for v in vars(_module_of(cls) or types).values() if isinstance(v, dict) and keys & set(v)]
    own = own_defaults(cls)
    written = {k: own[k] for k in _dict_keys(cls) & own.keys()}  # a dict a function of the file builds
    return {**written, **{k: v for d in reversed(dicts) for k, v in d.items()}}


# a sliding window's field (Mistral's ModelArgs.window_size)
WINDOW_NAMES = frozenset({"window_size", "sliding_window", "sliding_window_size", "attention_window"})


def required_windows(own: type, sizes: dict[str, Any]) -> dict[str, Any]:
    """A window field the learner's dataclass requires (no default: Mistral's window_size) as long as
    the longest input, the whole causal mask; a window with a default (Gemma's) keeps it, and the
    model's runner measures it."""
    fields = dataclasses.fields(own)
    required = {f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING}
    return dict.fromkeys(required & WINDOW_NAMES, sizes.get("max_len"))


def paired_hidden(values: dict[str, Any], names: set[str], sizes: dict[str, Any]) -> dict[str, Any]:
    """The config's values with hidden_dim (hidden_size, hidden) the FFN's width where the config also
    names the width another way and names no FFN width (Meta's and llama2.c's ModelArgs: dim and
    hidden_dim); the width itself where it names no other width (Hugging Face's hidden_size, a
    config's `hidden` beside its FFN's `ffn`), as a constructor's arguments are read (argument_keys)."""
    paired = {n for n in names if n.lower() in HIDDEN_WHEN_PAIRED}
    widths = {n for n in names if n.lower() in ARGUMENTS["d_model"]} - paired
    if paired and not widths and sizes.get("d_model"):
        return {**values, **dict.fromkeys(paired, sizes["d_model"])}
    if not paired or not widths or (names - paired) & set(ARGUMENTS["d_ff"]) or not sizes.get("d_ff"):
        return values
    return {**values, **dict.fromkeys(paired, sizes["d_ff"])}


# the share of each head that partial rotary turns, at check's 4 dims a head: 2, an even width as every
# real model's (litgpt's rotary_percentage = 0.25 of 4 would turn 1, an odd width no rotation has)
ROTARY_SHARE = 0.5
ROTARY_WORDS = re.compile(r"rot|rope", re.I)


def rotary_share(name: str, value: Any) -> bool:
    """A setting named for rotary positions whose value is a share below one (GPT-NeoX's rotary_pct,
    litgpt's rotary_percentage, Phi's partial_rotary_factor): the part of each head that turns."""
    return isinstance(value, float) and 0 < value < 1 and bool(ROTARY_WORDS.search(name))


def rotary_shares(defaults: Mapping[str, Any]) -> dict[str, float]:
    """The rotary shares among a config's values as the learner's file gives them (rotary_share): each
    at ROTARY_SHARE, so that the part of check's narrow heads that turns is even."""
    return {name: ROTARY_SHARE for name, value in defaults.items() if rotary_share(name, value)}


def class_defaults(own: type) -> dict[str, Any]:
    """The values a config class gives its fields: its constructor's defaults and its class attributes."""
    try:
        defaults = {n: p.default for n, p in inspect.signature(own).parameters.items()}
    except (TypeError, ValueError):  # no signature to read (a C type)
        defaults = {}
    return {**defaults, **vars(own)}


def _class_fields(own: type) -> set[str]:
    """The field names of the learner's config class (a Hugging Face config: its __init__'s)."""
    try:
        fields = set(vars(own)) | set(inspect.signature(own).parameters)
    except (TypeError, ValueError):  # a class with no signature to read (functools.partial, a C type)
        fields = set(vars(own))
    return fields | set(getattr(own, "__dataclass_fields__", {}))


def init_parameters(cls: Any) -> list[inspect.Parameter]:
    """The arguments of a class's constructor (or of a function), `self`, *args and **kwargs left out."""
    init = cls.__init__ if inspect.isclass(cls) else cls
    return call_parameters(init)[int(inspect.isclass(cls)):]


def argument_keys(cls: Any) -> dict[str, str | None]:
    """Each constructor argument of `cls` (or parameter of a function) -> the size it stands for (a
    key of ARGUMENTS), or None."""
    keys = with_roles(cls, {p.name: None if _is_axis(p) else size_of(p.name)
                            for p in init_parameters(cls)}, SIZE_OF)
    if inspect.isclass(cls) and next(iter(keys), None) == "k" and "d_model" not in keys.values():
        keys["k"] = "d_model"  # Peter Bloem's SelfAttention(k, heads): the width first, named k
    if sum(k == "d_model" for k in keys.values()) > 1 and "d_ff" not in keys.values():
        for name in keys:
            if name.lower() in HIDDEN_WHEN_PAIRED:
                keys[name] = "d_ff"
    if "d_model" not in keys.values():  # BERT's Attention(hidden, heads): with no other width, the width
        keys.update({name: "d_model" for name in keys if name.lower() in HIDDEN_WHEN_PAIRED})
    return keys


def _is_axis(p: inspect.Parameter) -> bool:
    """An argument whose default is a negative int is an axis, not a size: LitGPT's
    RMSNorm(size, dim=-1) normalizes over `dim`, its width is `size`."""
    return isinstance(p.default, int) and not isinstance(p.default, bool) and p.default < 0


ADAPTERS: dict[Any, Any] = {}  # the learner's class -> the make_<kind> adapter that builds it


NO_PARTS: Mapping[str, Any] = types.MappingProxyType({})  # a constructor built with no part of the learner's


def build(cls: type, sizes: dict[str, Any], parts: Mapping[str, Any] = NO_PARTS) -> Any:
    """cls(**arguments matched by name). `parts` builds learner modules passed as arguments
    (the Annotated Transformer's EncoderLayer(size, self_attn, feed_forward, dropout)). A class with
    an adapter (make_<kind> in the adapters file) is built by it, its arguments matched the same way.
    A class whose arguments check cannot fill is taken from inside a host of the learner's file that
    builds it (hosts.py: torchtune's llama3_tiny() for its MultiHeadAttention(q_proj=..., ...))."""
    module = vars(sys.modules.get(getattr(cls, "__module__", ""), object()))  # its file's constants
    fit_sections_(module, own_half_head(module), with_head_size(sizes).get("d_head", 0) // 2)
    try:
        return _build_matched(cls, sizes, parts)
    except DiscoveryError:
        handed = host_arguments(cls, sizes, build, argument_keys)
        if handed is None:
            raise
        return _build_matched(cls, sizes, parts, handed)


def _build_matched(cls: type, sizes: dict[str, Any], parts: Mapping[str, Any],
                   handed: Mapping[str, Any] = NO_PARTS) -> Any:
    """cls(**arguments matched by name), each by the first of FILLS whose test holds; what check cannot
    fill, the arguments a host `handed` it."""
    target = ADAPTERS.get(cls, cls)
    f = Filling(target, with_head_size(sizes), parts, handed, argument_keys(target),
                {**REQUIRED_FIXED, **moe_counts(target)})
    for p in init_parameters(target):
        fill = next((fill for test, fill in FILLS if test(p, f)), None)
        if fill is None:
            raise _unfilled(cls, p)
        f.kwargs.update(fill(p, f))
    return target(**f.kwargs)


@dataclass
class Filling:
    """What one build fills a constructor's arguments from, the arguments filled so far, and the value
    the last test found (a config, a choice, a part), which its fill hands on."""

    target: Any
    sizes: dict[str, Any]
    parts: Mapping[str, Any]
    handed: Mapping[str, Any]
    keys: dict[str, str | None]
    fixed: dict[str, Any]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    found: Any = None

    def key(self, p: inspect.Parameter) -> str | None:
        """The size an argument stands for, or the case a switch of its name is on in ("causal")."""
        return self.keys.get(p.name) or SWITCHES.get(p.name)

    def holds(self, value: Any) -> bool:
        """Whether a test found a value (not None), kept for its fill."""
        self.found = value
        return value is not None


# a constructor's argument by the first row whose test holds: (test, the arguments it fills)
FILLS: tuple[tuple[Callable[[inspect.Parameter, Filling], Any], Callable[..., dict[str, Any]]], ...] = (
    (lambda p, f: p.name == f.sizes.get("switched"), lambda p, f: {p.name: True}),  # a switch built on
    (lambda p, f: f.key(p) in f.sizes, lambda p, f: {p.name: f.sizes[f.key(p)]}),
    (lambda p, f: f.holds(make_config(f.target, p, f.sizes)),
     lambda p, f: {p.name: fit_config_sections_(f.found, f.sizes.get("d_head", 0) // 2)}),
    (lambda p, f: p.name.lower() in f.fixed and (p.default is p.empty or p.name.lower() in OVERRIDDEN),
     lambda p, f: {p.name: f.fixed[p.name.lower()]}),
    # T5's has_relative_attention_bias: built with its relative-position table, which the check then grades
    (lambda p, f: p.default is False and "relative" in p.name.lower(), lambda p, f: {p.name: True}),
    # torchtune's q_proj=nn.Linear(...), as the learner's builder makes it
    (lambda p, f: p.name in f.handed, lambda p, f: {p.name: f.handed[p.name]}),
    # Gemma's RMSNorm(..., add_unit_offset=True): no part, its default; a rotary share at check's
    # (rotary_pct=0.25)
    (lambda p, f: p.default is not p.empty, lambda p, f: rotary_shares({p.name: p.default})),
    (lambda p, f: f.holds(plain_choice(p, f.target)), lambda p, f: {p.name: f.found}),
    (lambda p, f: f.holds(_part_for(p.name, f.parts)), lambda p, f: {p.name: f.found()}),
    # DbrxBlock(config, i); Megatron's init_method, a callable of the file's or a neutral one
    (lambda p, f: f.holds(file_arguments(f.target, [p.name], f.kwargs, f.sizes, argument_keys)
                          or neutral_callable(f.target, p.name) or None),
     lambda p, f: record(f.target, f.found)),
)


def _unfilled(cls: type, p: inspect.Parameter) -> DiscoveryError:
    known = "; ".join(f"{k}: {', '.join(v[:4])}" for k, v in ARGUMENTS.items())
    return DiscoveryError(
        f"cannot fill the argument {p.name!r} of {cls.__name__}{inspect.signature(cls)}: "
        f"handformer knows these names ({known}); rename the argument, give it a default, or "
        "write the adapter below",
        zh=f"填不了 {cls.__name__}{inspect.signature(cls)} 的参数 {p.name!r}：handformer "
           f"认识这些名字（{known}）；请给参数改名、给它一个默认值，或者写下面的适配函数")


# the words of a constructor argument that takes the learner's own part (self_attn, src_attn, feed_forward)
PART_WORDS = (("mha", ("cross", "attn", "attention")), ("ffn", ("ff", "feed", "mlp")))


def _part_for(name: str, parts: Mapping[str, Any]) -> Any:
    lowered = name.lower()
    return next((parts.get(key) for key, words in PART_WORDS if any(w in lowered for w in words)), None)
