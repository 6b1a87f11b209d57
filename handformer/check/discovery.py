"""Find the components a learner's file defines, by the names tutorials use, and build them with
constructor arguments matched by name (d_model, num_heads / n_heads / h, d_ff, dropout, ...).

Only objects defined in the learner's file count (an `nn.LayerNorm` imported from torch is not
theirs to grade). `--component kind=Name` points a kind at any other name.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any

# kind -> the names tutorials and common variants use, tried in this order
NAMES: dict[str, tuple[str, ...]] = {
    "causal_mask": ("subsequent_mask", "causal_mask", "make_causal_mask", "create_causal_mask",
                    "generate_square_subsequent_mask", "look_ahead_mask", "create_look_ahead_mask",
                    "generate_causal_mask"),
    "sdpa": ("scaled_dot_product_attention", "attention", "ScaledDotProductAttention",
             "scaled_dot_product", "dot_product_attention", "ScaledDotProduct"),
    "mha": ("MultiHeadAttention", "MultiHeadedAttention", "MultiheadAttention", "MultiHeadSelfAttention",
            "MHA", "Attention", "SelfAttention"),
    "causal_attention": ("CausalSelfAttention", "MaskedSelfAttention", "CausalAttention",
                         "MaskedMultiHeadAttention", "CausalMultiHeadAttention"),
    "ffn": ("PositionwiseFeedForward", "PositionWiseFeedForward", "FeedForward", "FFN",
            "FeedForwardNetwork", "PositionwiseFFN", "PositionWiseFFN", "MLP", "SwiGLU",
            "SwiGLUFeedForward", "GatedFeedForward", "SwiGLUFFN"),
    "layernorm": ("LayerNorm", "LayerNormalization", "LayerNormalisation", "LayerNorm1d"),
    "rmsnorm": ("RMSNorm", "RmsNorm", "RMSNormalization"),
    "positional_encoding": ("PositionalEncoding", "SinusoidalPositionalEncoding", "PositionEncoding",
                            "SinusoidalPositionEncoding", "PositionalEmbedding"),
    "encoder_layer": ("EncoderLayer", "TransformerEncoderLayer", "EncoderBlock"),
    "decoder_layer": ("DecoderLayer", "TransformerDecoderLayer"),
    "block": ("DecoderOnlyBlock", "GPTBlock", "TransformerBlock", "Block", "DecoderOnlyLayer",
              "GPTLayer"),
    "transformer": ("Transformer", "EncoderDecoder", "Seq2SeqTransformer", "TransformerModel",
                    "Seq2Seq"),
}
KINDS = tuple(NAMES)
DESCRIPTIONS = {
    "causal_mask": "causal mask function", "sdpa": "scaled dot-product attention",
    "mha": "multi-head attention", "causal_attention": "causal self-attention",
    "ffn": "position-wise feed-forward network", "layernorm": "LayerNorm", "rmsnorm": "RMSNorm",
    "positional_encoding": "sinusoidal positional encoding", "encoder_layer": "encoder layer",
    "decoder_layer": "decoder layer", "block": "decoder-only block",
    "transformer": "encoder-decoder model",
}

# constructor argument names -> the size they stand for
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "d_model": ("d_model", "dim", "embed_dim", "hidden_size", "hidden_dim", "n_embd", "d", "features",
                "size", "model_dim", "emb_dim", "d_embed", "embedding_dim", "normalized_shape", "dmodel"),
    "n_heads": ("num_heads", "n_heads", "h", "heads", "n_head", "nhead", "num_head", "head_num",
                "nheads", "num_attention_heads"),
    "d_ff": ("d_ff", "ff_dim", "d_hidden", "dim_feedforward", "d_inner", "ffn_dim", "hidden",
             "d_ffn", "ffn_hidden", "intermediate_size", "dff", "ff_hidden", "mlp_dim", "inner_dim"),
    "dropout": ("dropout", "p", "drop", "dropout_rate", "drop_prob", "dropout_p", "p_drop", "pdrop",
                "attn_dropout", "resid_dropout"),
    "src_vocab": ("src_vocab_size", "src_vocab", "source_vocab_size", "input_vocab_size", "src_vocab_len",
                  "enc_vocab_size", "vocab_size", "n_vocab", "vocab", "ntoken"),
    "tgt_vocab": ("tgt_vocab_size", "tgt_vocab", "trg_vocab_size", "target_vocab_size", "output_vocab_size",
                  "tgt_vocab_len", "dec_vocab_size"),
    "n_layers": ("num_layers", "n_layers", "n", "num_encoder_layers", "num_decoder_layers", "n_layer",
                 "layers", "depth", "num_blocks", "nlayers", "n_encoder_layers", "n_decoder_layers"),
    "pad_id": ("pad_idx", "pad_id", "padding_idx", "pad_token_id", "src_pad_idx", "tgt_pad_idx",
               "trg_pad_idx", "pad"),
    "max_len": ("max_len", "max_seq_len", "max_positions", "block_size", "seq_len", "max_length",
                "max_seq_length", "n_positions", "context_length", "maxlen", "max_position_embeddings"),
}


class DiscoveryError(ValueError):
    """A component cannot be found or built; the message says what to change."""


@dataclass
class Component:
    kind: str  # one of KINDS
    name: str  # the learner's name for it
    obj: Any  # the class or function


def find_components(module: types.ModuleType, overrides: dict[str, str] | None = None,
                    only: list[str] | None = None) -> list[Component]:
    """The learner's components in the order of KINDS (a kind may match several names, e.g. an FFN
    and a SwiGLU); each name is checked once."""
    overrides = overrides or {}
    own = own_objects(module)
    for kind, name in overrides.items():
        if kind not in NAMES:
            raise DiscoveryError(f"--component {kind}={name}: unknown kind {kind!r}; kinds: "
                                 f"{', '.join(KINDS)}")
        if name not in own:
            raise DiscoveryError(f"--component {kind}={name}: the file defines no {name!r}; it defines "
                                 f"{', '.join(sorted(own)) or 'no class or function'}")
    for kind in only or []:
        if kind not in NAMES:
            raise DiscoveryError(f"--component {kind}: unknown kind; kinds: {', '.join(KINDS)}")
    found, taken = [], set()
    named = set(overrides.values())  # a name given with --component is checked as that kind only
    for kind, names in NAMES.items():
        if only and kind not in only:
            continue
        wanted = [overrides[kind]] if kind in overrides else [n for n in names if n in own and n not in named]
        for name in wanted:
            if name not in taken:
                taken.add(name)
                found.append(Component(kind, name, own[name]))
    return found


def own_objects(module: types.ModuleType) -> dict[str, Any]:
    """The classes and functions the learner's file defines (not the ones it imports), by name."""
    return {name: obj for name, obj in vars(module).items()
            if (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module.__name__}


def defined_names(module: types.ModuleType) -> list[str]:
    return sorted(own_objects(module))


def _config_namespace(sizes: dict[str, Any]) -> types.SimpleNamespace:
    """One object with every common field name, for nanoGPT-style `Block(config)` constructors."""
    fields = {alias: sizes[key] for key, aliases in ARGUMENTS.items() if key in sizes
              for alias in aliases}
    return types.SimpleNamespace(bias=True, **fields)


def build(cls: type, sizes: dict[str, Any], parts: dict[str, Any] | None = None) -> Any:
    """cls(**arguments matched by name). `parts` builds learner modules passed as arguments
    (the Annotated Transformer's EncoderLayer(size, self_attn, feed_forward, dropout))."""
    kwargs = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        key = next((k for k, aliases in ARGUMENTS.items() if p.name.lower() in aliases), None)
        if key in sizes:
            kwargs[p.name] = sizes[key]
        elif p.name.lower() in ("config", "cfg", "args", "params", "hparams"):
            kwargs[p.name] = _config_namespace(sizes)
        elif parts and (part := _part_for(p.name, parts)) is not None:
            kwargs[p.name] = part()
        elif p.default is p.empty:
            known = "; ".join(f"{k}: {', '.join(v[:4])}" for k, v in ARGUMENTS.items())
            raise DiscoveryError(
                f"cannot fill the argument {p.name!r} of {cls.__name__}{inspect.signature(cls)}: "
                f"handformer knows these names ({known}); rename the argument or give it a default")
    return cls(**kwargs)


def _part_for(name: str, parts: dict[str, Any]) -> Any:
    lowered = name.lower()
    if "cross" in lowered or "src_attn" in lowered or "enc_attn" in lowered:
        return parts.get("mha")
    if "attn" in lowered or "attention" in lowered:
        return parts.get("mha")
    if "ff" in lowered or "feed" in lowered or "mlp" in lowered:
        return parts.get("ffn")
    return None
