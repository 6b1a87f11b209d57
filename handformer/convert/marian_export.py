"""Export a translation run (the paper's post-norm encoder-decoder) as a Hugging Face `MarianMTModel`.

    export_marian("runs/multi30k", "hf/multi30k")   # then: MarianMTModel.from_pretrained(...)

Marian is the paper's model: post-norm layers (norm(x + sublayer(x))), sinusoidal positions,
token embeddings scaled by sqrt(d_model), biases everywhere. Two layout differences are handled here:

- Marian's sinusoidal table is not interleaved: dimensions 0 .. D/2-1 hold the sines and D/2 .. D-1
  the cosines, where handformer (the paper) puts sin at 2i and cos at 2i+1. The export permutes the
  residual-stream dimensions of every tensor that touches them (embeddings, positions, each
  projection's input columns or output rows, norms, the output head) by P = [0, 2, 4, ..., 1, 3,
  ...]. LayerNorm and the attention heads do not care about the order of the model dimensions, so
  the permuted model computes exactly the same logits.
- Names: attention `o_proj` is `out_proj`, `cross_attn` is `encoder_attn`, the FFN is `fc1` / `fc2`,
  and the three norms are `self_attn_layer_norm`, `encoder_attn_layer_norm`, `final_layer_norm`.

Files written: config.json, model.safetensors, generation_config.json (decoding starts with the
target BOS and never emits it again, as handformer's translator does; sources end with EOS) and
the run's tokenizer.json (source) and tokenizer.target.json, which Marian's own sentencepiece
tokenizer cannot read: feed the model ids from handformer's tokenizers.
Shape legend: D d_model, V vocabulary, F d_ff.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from handformer.config import Seq2SeqConfig
from handformer.nn.positions import sinusoidal_table

_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}
MARIAN_EPS = 1e-5  # Marian's LayerNorm uses torch's default epsilon


def marian_mismatches(cfg: Seq2SeqConfig) -> list[str]:
    """The settings of `cfg` that `MarianMTModel` cannot express, each with what it would need."""
    want = {"norm_placement": ("post", "Marian is post-norm"), "norm": ("layernorm", "Marian uses LayerNorm"),
            "position": ("sinusoidal", "Marian's positions are sinusoidal"),
            "scale_embeddings": (True, "Marian scales embeddings by sqrt(d_model)"),
            "norm_eps": (MARIAN_EPS, "Marian's LayerNorm epsilon is 1e-5")}
    problems = [f"{name}={getattr(cfg, name)!r} ({why})" for name, (value, why) in want.items()
                if getattr(cfg, name) != value]
    if cfg.activation not in _ACTIVATIONS:
        problems.append(f"activation={cfg.activation!r} (Marian supports {', '.join(_ACTIVATIONS)})")
    if cfg.kv_heads != cfg.n_heads:
        problems.append(f"n_kv_heads={cfg.n_kv_heads} (Marian has one key/value head per query head)")
    if cfg.d_model % 2:
        problems.append(f"d_model={cfg.d_model} (the sinusoidal table needs an even width)")
    return problems


def marian_state_dict(state: dict[str, Tensor], cfg: Seq2SeqConfig) -> dict[str, Tensor]:
    """handformer's `Seq2SeqTransformer` state dict -> `MarianMTModel`'s, residual dims permuted."""
    D = cfg.d_model
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # Marian dim j <- ours perm[j]

    def get(key: str, like: str) -> Tensor:
        """state[key], or zeros shaped like state[like] for a model without biases."""
        return state[key] if key in state else torch.zeros_like(state[like])

    out: dict[str, Tensor] = {}

    def linear(ours: str, theirs: str, rows: bool, cols: bool) -> None:
        """rows: the output is the residual stream (permute rows, bias); cols: the input is."""
        weight = state[f"{ours}.weight"]
        bias = state.get(f"{ours}.bias", torch.zeros(weight.shape[0], dtype=weight.dtype))
        weight = weight[perm] if rows else weight
        out[f"{theirs}.weight"] = (weight[:, perm] if cols else weight).contiguous()
        out[f"{theirs}.bias"] = (bias[perm] if rows else bias).contiguous()

    def norm(ours: str, theirs: str) -> None:
        out[f"{theirs}.weight"] = state[f"{ours}.weight"][perm].contiguous()
        out[f"{theirs}.bias"] = get(f"{ours}.bias", f"{ours}.weight")[perm].contiguous()

    def attention(ours: str, theirs: str) -> None:
        for p in ("q_proj", "k_proj", "v_proj"):
            linear(f"{ours}.{p}", f"{theirs}.{p}", rows=False, cols=True)  # (H*Dh, D)
        linear(f"{ours}.o_proj", f"{theirs}.out_proj", rows=True, cols=False)  # (D, H*Dh)

    for side, n_layers in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n_layers):
            ours, theirs = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
            attention(f"{ours}.self_attn", f"{theirs}.self_attn")
            norm(f"{ours}.attn_norm", f"{theirs}.self_attn_layer_norm")
            if side == "decoder":
                attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn")
                norm(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm")
            linear(f"{ours}.ffn.up_proj", f"{theirs}.fc1", rows=False, cols=True)  # (F, D)
            linear(f"{ours}.ffn.down_proj", f"{theirs}.fc2", rows=True, cols=False)  # (D, F)
            norm(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm")

    table = sinusoidal_table(cfg.max_positions, D)[:, perm].contiguous()  # (P, D), Marian's order
    src = state["src_embed.weight"][:, perm].contiguous()  # (V_src, D)
    tgt = state["tgt_embed.weight"][:, perm].contiguous()  # (V_tgt, D)
    out.update({"model.encoder.embed_tokens.weight": src, "model.decoder.embed_tokens.weight": tgt,
                "model.encoder.embed_positions.weight": table,
                "model.decoder.embed_positions.weight": table.clone(),
                "lm_head.weight": state["generator.weight"][:, perm].contiguous(),
                "final_logits_bias": torch.zeros(1, cfg.tgt_vocab_size)})
    if cfg.share_embeddings:
        out["model.shared.weight"] = src.clone()
    return out


def marian_config(cfg: Seq2SeqConfig, bos_id: int, eos_id: int) -> dict[str, Any]:
    return {"architectures": ["MarianMTModel"], "model_type": "marian", "d_model": cfg.d_model,
            "vocab_size": cfg.src_vocab_size, "decoder_vocab_size": cfg.tgt_vocab_size,
            "share_encoder_decoder_embeddings": cfg.share_embeddings,
            "tie_word_embeddings": cfg.tie_output, "encoder_layers": cfg.n_encoder_layers,
            "decoder_layers": cfg.n_decoder_layers, "encoder_attention_heads": cfg.n_heads,
            "decoder_attention_heads": cfg.n_heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
            "activation_function": _ACTIVATIONS[cfg.activation], "max_position_embeddings": cfg.max_positions,
            "scale_embedding": True, "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
            "activation_dropout": 0.0, "pad_token_id": cfg.pad_id, "eos_token_id": eos_id,
            "bos_token_id": bos_id, "decoder_start_token_id": bos_id, "forced_eos_token_id": eos_id,
            "is_encoder_decoder": True, "dtype": "float32"}


__all__ = ["marian_config", "marian_mismatches", "marian_state_dict"]
