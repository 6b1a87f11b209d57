"""Hugging Face config.json keys both ways, as the Llama-like families share them: the helpers a
family spec's `from_hf_config` and `to_hf_config` are written with.

Reading (config.json -> CausalLMConfig): `rope_decoder` reads the keys every Llama-like config
shares and takes the family's variation on top; `windows`, `qwen_windows`, `rope`, `experts` read
one feature each. Anything handformer does not implement raises one `ValueError` naming the key,
its value and why. Writing: `rope_decoder_keys` and the `*_keys` helpers are the inverse.
"""

from __future__ import annotations

from typing import Any

from handformer.config import (
    CausalLMConfig,
    LinearRopeScaling,
    Llama3RopeScaling,
    LongRopeScaling,
    MoEConfig,
    RopeScaling,
    YarnRopeScaling,
)
from handformer.settings import is_int

# --- config.json -> CausalLMConfig ----------------------------------------------------------------


def require(c: dict[str, Any], key: str) -> Any:
    if c.get(key) is None:
        raise ValueError(f"{c.get('model_type')} config lacks {key!r}, which handformer needs")
    return c[key]


def unsupported(c: dict[str, Any], key: str, value: Any, why: str) -> None:
    raise ValueError(f"{c.get('model_type')} config has {key}={value!r}: {why}")


def windows(c: dict[str, Any], window: Any) -> tuple[int | None, list[int]]:
    """(sliding_window, global_layers): the window of the sliding layers (None: none slides) and
    the layers that attend to every position, from `layer_types` (transformers 5), which names
    each layer's kind; without it every layer slides. Whether the family reads a mix is the
    import engine's check (`hf_weights.check_implemented`)."""
    if window is None:
        return None, []
    if not is_int(window) or window <= 0:
        unsupported(c, "sliding_window", window, "it must be a positive integer or null")
    kinds = c.get("layer_types") or ["sliding_attention"] * c.get("num_hidden_layers", 1)
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if unknown:
        unsupported(c, "layer_types", unknown, "handformer knows sliding_attention and full_attention")
    if "sliding_attention" not in kinds:
        return None, []
    return window, [i for i, kind in enumerate(kinds) if kind == "full_attention"]


def window_settings(c: dict[str, Any], window: Any) -> dict[str, Any]:
    sliding_window, global_layers = windows(c, window)
    return dict(sliding_window=sliding_window, global_layers=global_layers)


def qwen_windows(c: dict[str, Any]) -> dict[str, Any]:
    """Qwen's sliding window: only with use_sliding_window, and then on the layers from
    max_window_layers on (layer_types, which transformers 5 writes, says so itself)."""
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    if window is not None and "layer_types" not in c and "max_window_layers" in c:
        first, n_layers = c["max_window_layers"], require(c, "num_hidden_layers")
        c = {**c, "layer_types": ["sliding_attention" if i >= first else "full_attention"
                                  for i in range(n_layers)]}
    return window_settings(c, window)


def rope_parameters(c: dict[str, Any], key: str, params: dict[str, Any],
                    allowed: tuple[str, ...]) -> tuple[float | None, RopeScaling | None]:
    """rope_theta and the scaling of one `rope_parameters` / `rope_scaling` table."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in allowed:
        unsupported(c, key, params, f"rope scaling type {rope_type!r} is not implemented for "
                    f"{c.get('model_type')}; handformer supports {', '.join(repr(t) for t in allowed)} here")
    # As transformers: a top-level original_max_position_embeddings (Phi-3 style) wins.
    original = c.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings", c.get("max_position_embeddings"))
    needs = {"llama3": ("factor", "low_freq_factor", "high_freq_factor"), "linear": ("factor",),
             "longrope": ("short_factor", "long_factor"), "yarn": ("factor",)}.get(rope_type, ())
    for needed in needs:
        if needed not in params:
            unsupported(c, key, params, f"rope_type {rope_type!r} needs {needed!r}")
    scaling: RopeScaling | None = None
    if rope_type == "llama3":
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]), original_max_positions=original)
    elif rope_type == "linear":
        scaling = LinearRopeScaling(factor=float(params["factor"]))
    elif rope_type == "yarn":
        scaling = YarnRopeScaling(
            factor=float(params["factor"]), original_max_positions=original,
            **{k: params[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                                      "attention_factor", "truncate") if params.get(k) is not None})
    elif rope_type == "longrope":
        scaling = LongRopeScaling(
            short_factor=[float(f) for f in params["short_factor"]],
            long_factor=[float(f) for f in params["long_factor"]], original_max_positions=original,
            attention_factor=params.get("attention_factor"), factor=params.get("factor"))
    return params.get("rope_theta"), scaling


def rope(c: dict[str, Any], allowed: tuple[str, ...] = ("default", "llama3", "linear"),
         partial: bool = False) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from `rope_parameters` (transformers 5) or the top level with
    `rope_scaling` (older configs); scaling types outside `allowed` are refused, and so is a
    partial_rotary_factor unless the family rotates part of each head (`partial`)."""
    theta, scaling = c.get("rope_theta", 10000.0), None
    for key in ("rope_parameters", "rope_scaling"):
        params = c.get(key) or {}
        found, found_scaling = rope_parameters(c, key, params, allowed)
        if params.get("partial_rotary_factor", 1.0) != 1.0 and not partial:
            unsupported(c, key, params, "partial rotary embeddings are read for Phi-3, GLM-4, Qwen3.5 only")
        theta, scaling = found or theta, found_scaling or scaling
    return float(theta), scaling


def rope_decoder(c: dict[str, Any], rope_types: tuple[str, ...] = ("default", "llama3", "linear"),
                 partial: bool = False, **variation: Any) -> CausalLMConfig:
    """The keys every Llama-like config shares, then the family's `variation` on top."""
    d_model, n_heads = require(c, "hidden_size"), require(c, "num_attention_heads")
    theta, scaling = rope(c, rope_types, partial)
    settings = dict(
        vocab_size=require(c, "vocab_size"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads") or n_heads, head_dim=c.get("head_dim"),
        n_layers=require(c, "num_hidden_layers"), d_ff=require(c, "intermediate_size"),
        max_positions=c.get("max_position_embeddings", 2048), norm_eps=c.get("rms_norm_eps", 1e-6),
        rope_theta=theta, rope_scaling=scaling, tie_embeddings=c.get("tie_word_embeddings", False),
        dropout=0.0, attention_dropout=0.0)
    return CausalLMConfig.llama_style(**{**settings, **variation})


def silu_only(c: dict[str, Any]) -> None:
    if c.get("hidden_act", "silu") != "silu":
        unsupported(c, "hidden_act", c["hidden_act"], "this family's MLP is SwiGLU (silu) in handformer")


def no_attention_bias(c: dict[str, Any]) -> None:
    if c.get("attention_bias", False):
        unsupported(c, "attention_bias", True, f"{c.get('model_type')} has no attention biases in handformer")


def experts(c: dict[str, Any], d_expert: int | None, normalize: bool, d_shared: int = 0) -> MoEConfig:
    """The mixture of a MoE config: every layer sparse (decoder_sparse_step 1, no mlp_only_layers)."""
    if c.get("decoder_sparse_step", 1) != 1:
        unsupported(c, "decoder_sparse_step", c["decoder_sparse_step"],
                    "handformer puts a mixture of experts in every layer (decoder_sparse_step 1)")
    if c.get("mlp_only_layers"):
        unsupported(c, "mlp_only_layers", c["mlp_only_layers"], "dense layers between the "
                    "mixture-of-experts layers are not implemented; every layer is sparse in handformer")
    n_experts = c.get("num_experts") or c.get("num_local_experts")
    return MoEConfig(n_experts=n_experts or require(c, "num_experts"),
                     top_k=require(c, "num_experts_per_tok"), d_expert=d_expert,
                     normalize=bool(normalize), d_shared=d_shared,
                     aux_loss_coef=float(c.get("router_aux_loss_coef", 0.001)))


# --- CausalLMConfig -> config.json ----------------------------------------------------------------

def rope_parameters_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    """transformers 5's rope_parameters (the older rope_scaling keys, as import reads them)."""
    s = cfg.rope_scaling
    if s is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if isinstance(s, LinearRopeScaling):
        return {"rope_type": "linear", "rope_theta": cfg.rope_theta, "factor": s.factor}
    if isinstance(s, YarnRopeScaling):  # what differs from transformers' defaults
        defaults = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "mscale": None,
                    "mscale_all_dim": None, "attention_factor": None}
        return {"rope_type": "yarn", "rope_theta": cfg.rope_theta, "factor": s.factor,
                "original_max_position_embeddings": s.original_max_positions,
                **{k: getattr(s, k) for k, default in defaults.items() if getattr(s, k) != default}}
    if isinstance(s, LongRopeScaling):
        optional = {k: getattr(s, k) for k in ("factor", "attention_factor") if getattr(s, k) is not None}
        return {"rope_type": "longrope", "rope_theta": cfg.rope_theta, "short_factor": s.short_factor,
                "long_factor": s.long_factor, "original_max_position_embeddings": s.original_max_positions,
                **optional}
    return {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": s.factor,
            "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_positions}


def rope_decoder_keys(cfg: CausalLMConfig, rope_scaling: bool = True) -> dict[str, Any]:
    """The keys every Llama-like config.json shares (the inverse of `rope_decoder`)."""
    return {"hidden_size": cfg.d_model, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.kv_heads, "num_hidden_layers": cfg.n_layers,
            "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
            "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu", "attention_dropout": cfg.attention_dropout,
            "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta,
                "rope_parameters": rope_parameters_keys(cfg),
            # transformers 4 reads the scaling from rope_scaling (5 takes either; import reads both)
            **({"rope_scaling": rope_parameters_keys(cfg)} if cfg.rope_scaling and rope_scaling else {})}


def layer_types_keys(cfg: CausalLMConfig) -> list[str]:
    window = cfg.sliding_window
    return ["full_attention" if window is None or i in cfg.global_layers else "sliding_attention"
            for i in range(cfg.n_layers)]


def qwen_window_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    """Qwen's sliding window: use_sliding_window, and layer_types naming each layer's kind
    (max_window_layers: the first sliding layer, for readers of the older key)."""
    kinds = layer_types_keys(cfg)
    first = kinds.index("sliding_attention") if "sliding_attention" in kinds else cfg.n_layers
    return {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
            "max_window_layers": first, "layer_types": kinds}


def expert_keys(cfg: CausalLMConfig, count: str = "num_experts") -> dict[str, Any]:
    m = cfg.moe
    assert m is not None
    return {count: m.n_experts, "num_experts_per_tok": m.top_k,
            "router_aux_loss_coef": m.aux_loss_coef, "output_router_logits": False}


def expert_width(cfg: CausalLMConfig) -> int:
    assert cfg.moe is not None
    return cfg.moe.d_expert or cfg.d_ff


__all__ = ["expert_keys", "expert_width", "experts", "layer_types_keys", "no_attention_bias",
           "qwen_window_keys", "qwen_windows", "require", "rope", "rope_decoder", "rope_decoder_keys",
           "rope_parameters", "rope_parameters_keys", "silu_only", "unsupported", "window_settings",
           "windows"]
