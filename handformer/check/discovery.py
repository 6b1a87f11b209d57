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

from handformer.check.kinds import KINDS_TABLE

NAMES: dict[str, tuple[str, ...]] = {k.name: k.names for k in KINDS_TABLE}  # kind -> names, in order
KINDS = tuple(NAMES)
DESCRIPTIONS = {k.name: k.en for k in KINDS_TABLE}

# constructor argument names -> the size they stand for
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "d_model": ("d_model", "dim", "embed_dim", "hidden_size", "hidden_dim", "n_embd", "d", "features",
                "size", "model_dim", "emb_dim", "d_embed", "embedding_dim", "normalized_shape", "dmodel",
                "num_hiddens", "norm_shape", "ffn_num_input", "ffn_num_outputs", "key_size", "query_size",
                "value_size", "ndim", "n_embed", "embed_size", "d_in"),
    "n_heads": ("num_heads", "n_heads", "h", "heads", "n_head", "nhead", "num_head", "head_num",
                "nheads", "num_attention_heads"),
    "n_kv_heads": ("n_kv_heads", "num_kv_heads", "num_key_value_heads", "kv_heads", "n_kv_head",
                   "num_kv_head", "n_kv", "num_groups", "n_groups", "n_rep_heads"),
    "d_ff": ("d_ff", "ff_dim", "d_hidden", "dim_feedforward", "d_inner", "ffn_dim", "hidden",
             "d_ffn", "ffn_hidden", "intermediate_size", "dff", "ff_hidden", "mlp_dim", "inner_dim",
             "ffn_num_hiddens", "d_mlp", "mlp_hidden"),
    "dropout": ("dropout", "p", "drop", "dropout_rate", "drop_prob", "dropout_p", "p_drop", "pdrop",
                "attn_dropout", "resid_dropout", "attn_pdrop", "resid_pdrop"),
    "src_vocab": ("src_vocab_size", "src_vocab", "source_vocab_size", "input_vocab_size", "src_vocab_len",
                  "enc_vocab_size", "vocab_size", "n_vocab", "vocab", "ntoken"),
    "tgt_vocab": ("tgt_vocab_size", "tgt_vocab", "trg_vocab_size", "target_vocab_size", "output_vocab_size",
                  "tgt_vocab_len", "dec_vocab_size"),
    "n_layers": ("num_layers", "n_layers", "n", "num_encoder_layers", "num_decoder_layers", "n_layer",
                 "layers", "depth", "num_blocks", "nlayers", "n_encoder_layers", "n_decoder_layers",
                 "num_blks"),
    "pad_id": ("pad_idx", "pad_id", "padding_idx", "pad_token_id", "src_pad_idx", "tgt_pad_idx",
               "trg_pad_idx", "pad"),
    "max_len": ("max_len", "max_seq_len", "max_positions", "block_size", "seq_len", "max_length",
                "max_seq_length", "n_positions", "context_length", "maxlen", "max_position_embeddings",
                "context_size", "n_ctx"),
    "theta": ("theta", "base", "rope_theta", "rope_base"),
}
# the hidden width of an FFN that also takes d_model (Llama's FeedForward(dim, hidden_dim, ...))
HIDDEN_WHEN_PAIRED = ("hidden_dim", "hidden_size", "hidden")
# arguments with one sensible value here whatever the component: a layer's index (d2l's
# TransformerDecoderBlock(..., i)), Llama's rounding of the FFN width, nanoGPT's LayerNorm(ndim, bias)
FIXED: dict[str, Any] = {"i": 0, "layer_idx": 0, "layer_id": 0, "layer_index": 0, "multiple_of": 1,
                         "ffn_dim_multiplier": None, "bias": True, "use_bias": False,
                         # a GPT's config that says whether to tie the head: it says no (a head tied
                         # anyway is a finding of the gpt runner)
                         "tie_weights": False, "tie_word_embeddings": False, "tie_embeddings": False}
CONFIG_NAMES = ("config", "cfg", "args", "params", "hparams", "model_args", "conf")


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
        wanted = [overrides[kind]] if kind in overrides else [
            n for n in _matching(names, own) if n not in named]
        for name in wanted:
            actual = kind if kind in overrides else refine(kind, own[name])
            if name not in taken and (not only or actual in only):
                taken.add(name)
                found.append(Component(actual, name, own[name]))
    return sorted(found, key=lambda c: KINDS.index(c.kind))


def _matching(names: tuple[str, ...], own: dict[str, Any]) -> list[str]:
    """The learner's names among `names`, in that order; ".generate" stands for any class's method
    of that name."""
    out = []
    for name in names:
        out += sorted(n for n in own if n.endswith(name)) if name.startswith(".") else [name] * (name in own)
    return out


def refine(kind: str, obj: Any) -> str:
    """The kind a found name is checked as: a multi-head attention built with a number of key/value
    heads (Llama's `Attention(dim, n_heads, n_kv_heads)`) is grouped-query attention."""
    if kind == "mha" and inspect.isclass(obj) and "n_kv_heads" in argument_keys(obj).values():
        return "gqa"
    return kind


def own_objects(module: types.ModuleType) -> dict[str, Any]:
    """The classes and functions the learner's file defines (not the ones it imports), by name; a
    class's own `generate` method too, as "Class.generate" (nanoGPT's `GPT.generate`)."""
    own = {name: obj for name, obj in vars(module).items()
           if (inspect.isclass(obj) or inspect.isfunction(obj))
           and getattr(obj, "__module__", None) == module.__name__}
    for name, obj in list(own.items()):
        method = vars(obj).get("generate") if inspect.isclass(obj) else None
        if inspect.isfunction(method):
            own[f"{name}.generate"] = method
    return own


def defined_names(module: types.ModuleType) -> list[str]:
    return sorted(own_objects(module))


def _config_namespace(sizes: dict[str, Any]) -> types.SimpleNamespace:
    """One object with every common field name, for nanoGPT-style `Block(config)` constructors."""
    fields = {alias: sizes[key] for key, aliases in ARGUMENTS.items() if key in sizes
              for alias in aliases}
    fields.update({k: v for k, v in FIXED.items() if k not in fields})
    fields["bias"] = True
    fields["norm_eps"] = fields["eps"] = 1e-5
    return types.SimpleNamespace(**fields)


def argument_keys(cls: Any) -> dict[str, str | None]:
    """Each constructor argument of `cls` -> the size it stands for (a key of ARGUMENTS), or None."""
    params = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    keys = {p.name: next((k for k, aliases in ARGUMENTS.items() if p.name.lower() in aliases), None)
            for p in params}
    if sum(k == "d_model" for k in keys.values()) > 1 and "d_ff" not in keys.values():
        for name in keys:
            if name.lower() in HIDDEN_WHEN_PAIRED:
                keys[name] = "d_ff"
    return keys


def build(cls: type, sizes: dict[str, Any], parts: dict[str, Any] | None = None) -> Any:
    """cls(**arguments matched by name). `parts` builds learner modules passed as arguments
    (the Annotated Transformer's EncoderLayer(size, self_attn, feed_forward, dropout))."""
    kwargs = {}
    keys = argument_keys(cls)
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        key = keys.get(p.name)
        if key in sizes:
            kwargs[p.name] = sizes[key]
        elif p.name.lower() in CONFIG_NAMES:
            kwargs[p.name] = _config_namespace(sizes)
        elif parts and (part := _part_for(p.name, parts)) is not None:
            kwargs[p.name] = part()
        elif p.default is not p.empty:
            continue
        elif p.name.lower() in FIXED:
            kwargs[p.name] = FIXED[p.name.lower()]
        else:
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
