"""DeepSeek-V3: multi-head latent attention and a mixture of experts with shared experts and grouped
routing (DeepSeek-V3 technical report, sections 2.1.1 and 2.1.2), in the lesson's pre-norm block.

Multi-head latent attention (`LatentAttention`). A position's keys and values come out of one
latent c, kv_rank (r) wide, and its queries out of one q_rank wide; each query and key head is Dn
dims without RoPE and Dr dims with it, and the RoPE part of the key is one head shared by all:

    q            = RMSNorm(x W_DQ) W_UQ, per head [q_nope ; q_rope]   q_a_proj, q_a_norm, q_b_proj
    c, k_rope    = x W_DKV; c normed                                 kv_a_proj, kv_a_norm
    k_nope, v    = c W_UK, c W_UV, per head                           kv_b_proj
    out          = softmax([q_nope ; q_rope] [k_nope ; k_rope]^T / sqrt(Dn + Dr)) v

The KV cache keeps c and k_rope only (handformer.nn.latent_kv_cache). A decoding step can skip the
expansion: q_nope k_nope^T = (q_nope W_UK) c^T, so the scores are [q_nope W_UK ; q_rope] against
[c ; k_rope] (one key head, r + Dr wide, for every query head), and the output is (weights c) W_UV
("absorbed"). Both forms run the one attention function; a test pins them equal.

The mixture (`GroupedMixture`): each expert's score is a sigmoid of its own; a learned correction
bias joins the scores when experts are chosen, not their weights; the experts are in n_groups
groups, a group scores by its best two, and a token's top_k come from its top_groups best groups;
the chosen scores are renormalized and times routed_scale; a shared expert every token goes
through, without a gate. The first dense_layers layers keep one dense FFN, d_ff wide.

YaRN (nn.positions.YarnRotaryEmbedding) turns the RoPE dims; DeepSeek also multiplies the softmax
scale by mscale(factor, mscale_all_dim) squared. RoPE pairs dims (2j, 2j + 1) (rope_interleave):
those are moved to the halves the lesson's RoPE pairs, in queries and keys alike, as transformers does.

Shape legend: B batch, T query length, S key length, D d_model, H heads, Dn / Dr / Dv the head
dims without RoPE, with RoPE and of values, r latent width, N tokens, E experts, G groups, k top_k.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import gguf
import torch
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, MLAConfig, MoEConfig, YarnRopeScaling
from handformer.families.gguf_keys import KeyReader
from handformer.families.hf_config import (
    expert_keys,
    experts,
    no_attention_bias,
    require,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
    unsupported,
)
from handformer.families.mixtral import EXPERT_KEYS, EXPERTS, GGUF_EXPERTS, ROUTER, STACKED_EXPERTS
from handformer.families.spec import Differences, FamilySpec, GgufCode, GgufEntry, to
from handformer.nn.attention import scaled_dot_product_attention
from handformer.nn.feed_forward import FeedForward
from handformer.nn.kv_cache import NO_CACHE, LayerCache, as_cache
from handformer.nn.masks import AttentionMask
from handformer.nn.moe import MixtureOfExperts
from handformer.nn.norms import RMSNorm
from handformer.nn.positions import apply_rotary
from handformer.replace import replace_layers

Mask = AttentionMask | Tensor | None  # see handformer.nn.masks
LATENT_NORM_EPS = 1e-6  # the latents' RMSNorms keep this epsilon whatever rms_norm_eps says (as transformers)


def softmax_scale(cfg: CausalLMConfig) -> float:
    """1 / sqrt(Dn + Dr), times YaRN's mscale(factor, mscale_all_dim) squared when set (DeepSeek's)."""
    assert cfg.mla is not None
    scale = (cfg.mla.nope_dim + cfg.head_dim) ** -0.5
    s = cfg.rope_scaling
    if isinstance(s, YarnRopeScaling) and s.mscale_all_dim:
        scale *= s.mscale_of(s.factor, s.mscale_all_dim) ** 2
    return scale


class LatentAttention(nn.Module):
    """Multi-head latent attention (see the module docstring); in a decoder-only block it takes the
    place of `MultiHeadAttention`, with the same call."""

    absorb = True  # fold W_UK and W_UV into the query and the output at a decoding step

    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        m: MLAConfig = cfg.mla  # type: ignore[assignment]
        D, H, Dr = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_heads, self.kv_rank, self.rope_dim = H, m.kv_rank, Dr
        self.nope_dim, self.v_dim = m.nope_dim, m.v_dim
        self.interleave, self.dropout = m.interleave, cfg.attention_dropout
        self.scale = softmax_scale(cfg)
        qk_dim = m.nope_dim + Dr
        if m.q_rank is None:
            self.q_proj = nn.Linear(D, H * qk_dim, bias=False)  # (B, T, D) -> (B, T, H * (Dn + Dr))
        else:
            self.q_a_proj = nn.Linear(D, m.q_rank, bias=False)  # W_DQ: the query latent
            self.q_a_norm = RMSNorm(m.q_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(m.q_rank, H * qk_dim, bias=False)  # W_UQ
        self.kv_a_proj = nn.Linear(D, m.kv_rank + Dr, bias=False)  # W_DKV and the shared RoPE key's
        self.kv_a_norm = RMSNorm(m.kv_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(m.kv_rank, H * (m.nope_dim + m.v_dim), bias=False)  # W_UK and W_UV
        self.o_proj = nn.Linear(H * m.v_dim, D, bias=False)

    def query(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, H * (Dn + Dr)), through the query latent when there is one."""
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def turn(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """RoPE on (B, H, T, Dr); interleaved pairs (2j, 2j + 1) first moved to (j, j + Dr/2)."""
        if self.interleave:
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)  # (B, H, T, Dr)
        return apply_rotary(x, *rope)

    def forward(self, x: Tensor, mask: AttentionMask | Tensor | None = None, *, need_weights: bool = False,
                rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache | None = None) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) -> (output (B, T, D), weights (B, H, T, S) or None)."""
        cache = as_cache(cache)
        B, T, _ = x.shape
        q = self.query(x).view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, Dn + Dr)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)  # (B, H, T, Dn), (B, H, T, Dr)
        c = self.kv_a_proj(x)  # (B, T, r + Dr)
        latent, k_rope = c.split([self.kv_rank, self.rope_dim], dim=-1)  # (B, T, r), (B, T, Dr)
        latent, k_rope = self.kv_a_norm(latent)[:, None], k_rope[:, None]  # (B, 1, T, r), (B, 1, T, Dr)
        if rope is not None:
            q_rope, k_rope = self.turn(q_rope, rope), self.turn(k_rope, rope)
        latent, k_rope = cache.update(latent, k_rope)  # (B, 1, S, r), (B, 1, S, Dr): what the cache holds
        attend = self.attend_absorbed if self.absorbs(cache, T) else self.attend_expanded
        out, weights = attend(q_nope, q_rope, latent, k_rope, mask, need_weights)  # (B, H, T, Dv)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.v_dim)  # (B, T, H * Dv)
        return self.o_proj(out), weights

    def absorbs(self, cache: Any, T: int) -> bool:
        """A decoding step (one new position, a cache) with kv_b_proj a plain Linear (not LoRA's,
        int8's or packed), whose weight the absorbed form reads."""
        return self.absorb and T == 1 and cache is not NO_CACHE and type(self.kv_b_proj) is nn.Linear

    def attend_expanded(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor,
                        mask: Mask, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Every head's keys and values built from the latents, then attention: (B, H, T, Dv)."""
        B, _, S, _ = latent.shape
        kv = self.kv_b_proj(latent[:, 0]).view(B, S, self.n_heads, -1).transpose(1, 2)  # (B, H, S, Dn + Dv)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)  # (B, H, S, Dn), (B, H, S, Dv)
        k = torch.cat([k_nope, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)  # (B, H, S, Dn + Dr)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, Dn + Dr)
        return self.attention(q, k, v, mask, need_weights)

    def attend_absorbed(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor,
                        mask: Mask, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """W_UK folded into the queries and W_UV into the output: attention over the latents, one
        key head for every query head. (B, H, T, Dv)."""
        w = self.kv_b_proj.weight.view(self.n_heads, -1, self.kv_rank)  # (H, Dn + Dv, r)
        w_uk, w_uv = w.split([self.nope_dim, self.v_dim], dim=1)  # (H, Dn, r), (H, Dv, r)
        q = torch.cat([q_nope @ w_uk, q_rope], dim=-1)  # (B, H, T, r + Dr)
        k = torch.cat([latent, k_rope], dim=-1)  # (B, 1, S, r + Dr)
        out, weights = self.attention(q, k, latent, mask, need_weights)  # (B, H, T, r)
        return out @ w_uv.transpose(1, 2), weights  # (B, H, T, r) @ (H, r, Dv) -> (B, H, T, Dv)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask,
                  need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The one attention function, which divides by sqrt(q's width): the queries rescaled so the
        scores are divided by sqrt(Dn + Dr) (and times YaRN's mscale squared) in either form."""
        if q.size(-1) ** -0.5 != self.scale:
            q = q * (self.scale * math.sqrt(q.size(-1)))
        return scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights,
                                            dropout_p=self.dropout * self.training)


class GroupedMixture(MixtureOfExperts):
    """DeepSeek-V3's mixture: the lesson's experts and weighted sum, its own routing (`route`) and
    a shared expert without a gate. Takes the lesson mixture's router and experts."""

    def __init__(self, moe: MixtureOfExperts, cfg: CausalLMConfig) -> None:
        nn.Module.__init__(self)
        m = cfg.moe
        assert m is not None
        self.top_k, self.normalize = moe.top_k, moe.normalize
        self.router, self.experts = moe.router, moe.experts  # (E, D), and E gated FFNs
        self.scoring, self.n_groups, self.top_groups, self.routed_scale = (
            m.scoring, m.n_groups, m.top_groups, m.routed_scale)
        self.shared_expert = moe.shared_expert
        if m.d_shared and not m.shared_gate:
            self.shared_expert = FeedForward(cfg.d_model, m.d_shared, cfg.activation, bias=False)
        # added to the scores when the experts are chosen (balanced by DeepSeek's training, not gradients)
        self.register_buffer("correction_bias", torch.zeros(m.n_experts) if m.scoring == "sigmoid" else None)
        self.train(moe.training)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(N, D) tokens -> (weights (N, k) float32, experts (N, k))."""
        logits = self.router(x).float()  # (N, E), scored in float32
        scores = logits.sigmoid() if self.scoring == "sigmoid" else logits.softmax(dim=-1)  # (N, E)
        choice = scores if self.correction_bias is None else scores + self.correction_bias  # (N, E)
        if self.n_groups > 1:
            choice = self.best_groups(choice)
        experts = choice.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, experts)  # (N, k): the scores, without the bias
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scale, experts

    def best_groups(self, choice: Tensor) -> Tensor:
        """(N, E) -> (N, E) with the experts outside each token's top_groups groups at -inf."""
        N, E = choice.shape
        groups = choice.view(N, self.n_groups, E // self.n_groups)  # (N, G, E/G)
        group_scores = groups.topk(2, dim=-1).values.sum(dim=-1)  # (N, G): each group's best two
        best = group_scores.topk(self.top_groups, dim=-1).indices  # (N, top_groups)
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)  # (N, G)
        return groups.masked_fill(~keep[..., None], float("-inf")).view(N, E)  # (N, E)


def put_latent_attention(model: nn.Module, cfg: CausalLMConfig) -> None:
    replace_layers(model, {f"layers.{i}.self_attn": layer.self_attn for i, layer in enumerate(model.layers)},
                   lambda attn: LatentAttention(cfg).train(attn.training))


def put_grouped_mixtures(model: nn.Module, cfg: CausalLMConfig) -> None:
    """The first dense_layers layers get one dense FFN (d_ff wide); the others `GroupedMixture`."""
    assert cfg.moe is not None
    ffns = {f"layers.{i}.ffn": layer.ffn for i, layer in enumerate(model.layers)}
    dense = {name: ffn for i, (name, ffn) in enumerate(ffns.items()) if i < cfg.moe.dense_layers}
    sparse = {name: ffn for name, ffn in ffns.items() if name not in dense}
    replace_layers(model, dense, lambda ffn: FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=False))
    replace_layers(model, sparse, lambda moe: GroupedMixture(moe, cfg))


__all__ = ["DEEPSEEK_V3", "GroupedMixture", "LatentAttention", "put_grouped_mixtures", "put_latent_attention",
           "softmax_scale"]


# --- the family spec -----------------------------------------------------------------------------

def _check_routing(c: dict[str, Any]) -> None:
    for key, value in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("moe_layer_freq", 1)):
        if c.get(key, value) != value:
            unsupported(c, key, c[key], f"DeepSeek-V3 routes with {key}={value!r} in handformer")
    if c.get("n_shared_experts", 1) < 1:
        unsupported(c, "n_shared_experts", c["n_shared_experts"], "DeepSeek-V3 has a shared expert")


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """DeepSeek-V3: latent attention (head_dim is the RoPE dims, qk_rope_head_dim) and the grouped
    mixture; num_key_value_heads is not read (every query head has its own key and value)."""
    silu_only(c)
    no_attention_bias(c)
    _check_routing(c)
    mla = MLAConfig(kv_rank=require(c, "kv_lora_rank"), q_rank=c.get("q_lora_rank"),
                    nope_dim=require(c, "qk_nope_head_dim"), v_dim=require(c, "v_head_dim"),
                    interleave=bool(c.get("rope_interleave", True)))
    moe = experts({**c, "num_experts": c.get("n_routed_experts")}, require(c, "moe_intermediate_size"),
                  c.get("norm_topk_prob", True), c["moe_intermediate_size"] * c.get("n_shared_experts", 1))
    moe = dataclasses.replace(moe, scoring="sigmoid", shared_gate=False, n_groups=c.get("n_group") or 1,
                              top_groups=c.get("topk_group") or 1,
                              dense_layers=c.get("first_k_dense_replace") or 0,
                              routed_scale=float(c.get("routed_scaling_factor", 1.0)))
    return rope_decoder(c, ("default", "yarn"), moe=moe, mla=mla, n_kv_heads=None,
                        head_dim=require(c, "qk_rope_head_dim"))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    m, moe = cfg.mla, cfg.moe
    assert m is not None and moe is not None
    width = moe.d_expert or cfg.d_ff
    return {**rope_decoder_keys(cfg), **expert_keys(cfg, "n_routed_experts"),
            "num_key_value_heads": cfg.n_heads, "kv_lora_rank": m.kv_rank, "q_lora_rank": m.q_rank,
            "qk_nope_head_dim": m.nope_dim,
            "qk_rope_head_dim": cfg.head_dim, "v_head_dim": m.v_dim, "rope_interleave": m.interleave,
            "moe_intermediate_size": width, "n_shared_experts": moe.d_shared // width,
            "n_group": moe.n_groups, "topk_group": moe.top_groups, "routed_scaling_factor": moe.routed_scale,
            "first_k_dense_replace": moe.dense_layers, "norm_topk_prob": moe.normalize,
            "attention_bias": False, "num_nextn_predict_layers": 0}


def problems(cfg: CausalLMConfig) -> list[str]:
    found = [] if cfg.mla is not None else ["mla=None (DeepSeek-V3 has multi-head latent attention)"]
    moe = cfg.moe
    if moe is None:
        return found + ["moe=None (DeepSeek-V3 is a mixture of experts)"]
    width = moe.d_expert or cfg.d_ff
    if moe.scoring != "sigmoid" or moe.shared_gate or not moe.d_shared or moe.d_shared % width:
        found.append(f"moe={moe!r} (DeepSeek-V3 scores experts with a sigmoid and has ungated shared "
                     "experts as wide as the routed ones, or a whole multiple)")
    return found


_ATTN = "model.layers.{i}.self_attn"
TENSORS = llama.llama_like(
    llama.linears({**llama.MLP, **{f"self_attn.{p}": f"self_attn.{p}" for p in (
        "q_proj", "q_a_proj", "q_b_proj", "kv_b_proj", "o_proj")}}),  # q_b_proj (H*(Dn+Dr), r_q), ...
    {f"{_ATTN}.kv_a_proj_with_mqa.weight": to("layers.{i}.self_attn.kv_a_proj.weight"),  # (r + Dr, D)
     f"{_ATTN}.q_a_layernorm.weight": to("layers.{i}.self_attn.q_a_norm.weight"),  # (r_q,)
     f"{_ATTN}.kv_a_layernorm.weight": to("layers.{i}.self_attn.kv_a_norm.weight"),  # (r,)
     "model.layers.{i}.mlp.gate.e_score_correction_bias": to("layers.{i}.ffn.correction_bias"),  # (E,)
     **{f"model.layers.{{i}}.mlp.shared_experts.{p}.weight": to(f"layers.{{i}}.ffn.shared_expert.{p}.weight")
        for p in ("gate_proj", "up_proj", "down_proj")}},
    llama.PRE_NORMS, ROUTER, EXPERTS, in_memory=STACKED_EXPERTS, extra_layers=True)  # the MTP layer skipped

# --- llama.cpp's deepseek2 ---------------------------------------------------------------------------
# llama.cpp runs latent attention absorbed (the module docstring's decoding step) at every position:
# kv_b_proj is split per head into W_UK, transposed, (attn_k_b: (H, r, Dn)) and W_UV (attn_v_b:
# (H, Dv, r)), as its convert_hf_to_gguf.py writes them; its cache is one key head r + Dr wide
# (head_count_kv 1, key_length r + Dr, value_length r), and the heads' own widths are the "_mla" keys.
# RoPE turns adjacent pairs, as DeepSeek's checkpoints do (rope_interleave): no rows are permuted.

_GGUF_ATTENTION = {
    "blk.{i}.attn_q.weight": (f"{llama.ATTN}.q_proj.weight",),  # (H*(Dn+Dr), D): no query latent
    "blk.{i}.attn_q_a.weight": (f"{llama.ATTN}.q_a_proj.weight",),  # (r_q, D)
    "blk.{i}.attn_q_a_norm.weight": (f"{llama.ATTN}.q_a_norm.weight",),  # (r_q,)
    "blk.{i}.attn_q_b.weight": (f"{llama.ATTN}.q_b_proj.weight",),  # (H*(Dn+Dr), r_q)
    "blk.{i}.attn_kv_a_mqa.weight": (f"{llama.ATTN}.kv_a_proj.weight",),  # (r + Dr, D)
    "blk.{i}.attn_kv_a_norm.weight": (f"{llama.ATTN}.kv_a_norm.weight",),  # (r,)
    "blk.{i}.attn_k_b.weight": (f"{llama.ATTN}.k_b",),  # (H, r, Dn): from kv_b_proj (`_split_kv_b`)
    "blk.{i}.attn_v_b.weight": (f"{llama.ATTN}.v_b",),  # (H, Dv, r)
    "blk.{i}.attn_output.weight": (f"{llama.ATTN}.o_proj.weight",),  # (D, H*Dv)
}
_GGUF_FFN = {  # the dense first layers, then the experts, their correction bias and the shared expert
    **{f"blk.{{i}}.ffn_{p}.weight": (f"{llama.FFN}.{p}_proj.weight",) for p in ("gate", "up", "down")},
    **GGUF_EXPERTS, "blk.{i}.exp_probs_b.bias": (f"{llama.FFN}.correction_bias",),  # (E,)
    **{f"blk.{{i}}.ffn_{p}_shexp.weight": (f"{llama.FFN}.shared_expert.{p}_proj.weight",)
       for p in ("gate", "up", "down")},
}
_K = gguf.Keys
_GATING = {"softmax": gguf.ExpertGatingFuncType.SOFTMAX, "sigmoid": gguf.ExpertGatingFuncType.SIGMOID}


def _split_kv_b(state: dict[str, Tensor], cfg: CausalLMConfig) -> dict[str, Tensor]:
    """Each layer's kv_b_proj (H*(Dn+Dv), r) -> k_b (H, r, Dn) and v_b (H, Dv, r)."""
    m = cfg.mla
    assert m is not None
    for i in range(cfg.n_layers):
        w = state.pop(f"layers.{i}.self_attn.kv_b_proj.weight")
        w = w.view(cfg.n_heads, m.nope_dim + m.v_dim, m.kv_rank)  # (H, Dn+Dv, r)
        k_b, v_b = w.split([m.nope_dim, m.v_dim], dim=1)  # (H, Dn, r), (H, Dv, r)
        state[f"layers.{i}.self_attn.k_b"] = k_b.transpose(1, 2).contiguous()  # (H, r, Dn)
        state[f"layers.{i}.self_attn.v_b"] = v_b.contiguous()
    return state


def _join_kv_b(state: dict[str, Tensor], cfg: CausalLMConfig) -> dict[str, Tensor]:
    """The inverse of `_split_kv_b`."""
    for i in range(cfg.n_layers):
        k_b, v_b = state.pop(f"layers.{i}.self_attn.k_b"), state.pop(f"layers.{i}.self_attn.v_b")
        w = torch.cat([k_b.transpose(1, 2), v_b], dim=1)  # (H, Dn+Dv, r)
        state[f"layers.{i}.self_attn.kv_b_proj.weight"] = w.reshape(-1, w.size(-1)).contiguous()
    return state


def _gguf_problems(cfg: CausalLMConfig) -> list[str]:
    """What llama.cpp's deepseek2 cannot express, beyond what export-hf checks (`problems`)."""
    found = problems(cfg)
    if found:
        return found
    m, s = cfg.mla, cfg.rope_scaling
    assert m is not None
    if not m.interleave:
        found.append("mla.interleave=False (llama.cpp's DeepSeek-V3 turns adjacent pairs (2j, 2j + 1))")
    if m.q_rank is not None and cfg.n_layers in (26, 27):
        found.append(f"n_layers={cfg.n_layers} with mla.q_rank={m.q_rank} (llama.cpp reads a deepseek2 of "
                     "26 or 27 layers as DeepSeek-V2-Lite, without a query latent)")
    if isinstance(s, YarnRopeScaling) and (s.attention_factor is not None or not s.mscale_all_dim
                                           or s.mscale != s.mscale_all_dim or not s.truncate):
        found.append(f"rope_scaling={s!r} (llama.cpp's DeepSeek-V3 multiplies cos and sin by 1 and the "
                     "scores by mscale(factor, mscale_all_dim) squared: it needs mscale = mscale_all_dim, no "
                     "attention_factor and truncate=true, as DeepSeek-V3's 1.0 and 1.0)")
    return found


def _write_gguf(writer: Any, cfg: CausalLMConfig) -> None:
    """deepseek2's keys: the latent and head widths, the grouped mixture, YaRN (as convert_hf_to_gguf.py)."""
    m, moe, s = cfg.mla, cfg.moe, cfg.rope_scaling
    assert m is not None and moe is not None
    width = moe.d_expert or cfg.d_ff
    writer.add_head_count_kv(1)  # one key head, the latent and the RoPE key: r + Dr wide
    writer.add_key_length(m.kv_rank + cfg.head_dim)
    writer.add_value_length(m.kv_rank)
    writer.add_key_length_mla(m.nope_dim + cfg.head_dim)
    writer.add_value_length_mla(m.v_dim)
    writer.add_kv_lora_rank(m.kv_rank)
    writer.add_q_lora_rank(m.q_rank or 0)  # 0: queries projected directly (attn_q)
    writer.add_leading_dense_block_count(moe.dense_layers)
    writer.add_expert_count(moe.n_experts)
    writer.add_expert_used_count(moe.top_k)
    writer.add_expert_feed_forward_length(width)
    writer.add_expert_shared_count(moe.d_shared // width)
    writer.add_expert_group_count(moe.n_groups)
    writer.add_expert_group_used_count(moe.top_groups)
    writer.add_expert_gating_func(_GATING[moe.scoring])
    writer.add_expert_weights_scale(moe.routed_scale)
    writer.add_expert_weights_norm(moe.normalize)
    if isinstance(s, YarnRopeScaling):
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(s.factor)
        writer.add_rope_scaling_orig_ctx_len(s.original_max_positions)
        writer.add_rope_scaling_yarn_beta_fast(s.beta_fast)
        writer.add_rope_scaling_yarn_beta_slow(s.beta_slow)
        writer.add_rope_scaling_yarn_log_mul(0.1 * s.mscale_all_dim)  # llama.cpp's 0.1 x mscale_all_dim


def _read_yarn(keys: KeyReader) -> YarnRopeScaling | None:
    """YaRN as llama.cpp runs deepseek2: cos and sin times 1, so mscale is mscale_all_dim."""
    kind = keys.get(_K.Rope.SCALING_TYPE, "none")
    if kind == "none":
        return None
    if kind != "yarn" or not keys.get(_K.Rope.SCALING_YARN_LOG_MUL):
        without = f" without {keys.name(_K.Rope.SCALING_YARN_LOG_MUL)}" if kind == "yarn" else ""
        raise ValueError(f"{keys.where}: {keys.name(_K.Rope.SCALING_TYPE)}={kind!r}{without}: handformer's "
                         "DeepSeek-V3 reads YaRN with mscale_all_dim (DeepSeek-V3's)")
    mscale = float(f"{keys.float(_K.Rope.SCALING_YARN_LOG_MUL) / 0.1:.6g}")  # a float32 key: 6 digits
    return YarnRopeScaling(factor=keys.float(_K.Rope.SCALING_FACTOR),
                           original_max_positions=keys.int(_K.Rope.SCALING_ORIG_CTX_LEN),
                           beta_fast=keys.float(_K.Rope.SCALING_YARN_BETA_FAST, 32.0),
                           beta_slow=keys.float(_K.Rope.SCALING_YARN_BETA_SLOW, 1.0),
                           mscale=mscale, mscale_all_dim=mscale)


def _read_moe(keys: KeyReader) -> MoEConfig:
    """The grouped mixture: sigmoid routing only (a file without the key routes with a softmax)."""
    gating, sigmoid = keys.get(_K.LLM.EXPERT_GATING_FUNC), _GATING["sigmoid"].value
    if gating != sigmoid:
        raise ValueError(f"{keys.where}: {keys.name(_K.LLM.EXPERT_GATING_FUNC)}={gating!r} routes experts "
                         "with a softmax (DeepSeek-V2's; llama.cpp's default without the key); handformer's "
                         f"DeepSeek-V3 routes with a sigmoid ({sigmoid})")
    width = keys.int(_K.LLM.EXPERT_FEED_FORWARD_LENGTH)
    return MoEConfig(n_experts=keys.int(_K.LLM.EXPERT_COUNT), top_k=keys.int(_K.LLM.EXPERT_USED_COUNT),
                     d_expert=width, normalize=bool(keys.get(_K.LLM.EXPERT_WEIGHTS_NORM, False)),
                     d_shared=width * keys.int(_K.LLM.EXPERT_SHARED_COUNT), scoring="sigmoid",
                     n_groups=keys.int(_K.LLM.EXPERT_GROUP_COUNT, 1),
                     top_groups=keys.int(_K.LLM.EXPERT_GROUP_USED_COUNT, 1),
                     routed_scale=keys.float(_K.LLM.EXPERT_WEIGHTS_SCALE, 1.0),
                     dense_layers=keys.get(_K.LLM.LEADING_DENSE_BLOCK_COUNT, 0), shared_gate=False)


def _read_gguf(metadata: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    """Latent attention, the grouped mixture and YaRN from deepseek2's keys."""
    keys = KeyReader(metadata, "deepseek2", where)
    rope_dim = keys.int(_K.Rope.DIMENSION_COUNT)
    mla = MLAConfig(kv_rank=keys.int(_K.Attention.KV_LORA_RANK),
                    q_rank=keys.get(_K.Attention.Q_LORA_RANK) or None,  # 0: queries projected directly
                    nope_dim=keys.int(_K.Attention.KEY_LENGTH_MLA) - rope_dim,
                    v_dim=keys.int(_K.Attention.VALUE_LENGTH_MLA))
    return {"mla": mla, "moe": _read_moe(keys), "head_dim": rope_dim, "n_kv_heads": None,
            "rope_theta": keys.float(_K.Rope.FREQ_BASE, 10000.0), "rope_scaling": _read_yarn(keys)}


GGUF = GgufEntry(
    "deepseek2", "deepseek_v3", "DeepSeek-V3",
    {**llama.GGUF_ENDS, **llama.GGUF_NORMS, **_GGUF_ATTENTION, **_GGUF_FFN},
    {**llama.GGUF_BLOCK, **llama.NO_BIASES, "sliding_window": llama.NO_WINDOW}, biases=(),
    writes=frozenset({"moe", "mla"}),
    code=GgufCode(write=_write_gguf, read=_read_gguf, problems=_gguf_problems, heads=True,
                  to_gguf=_split_kv_b, from_gguf=_join_kv_b, rope_scalings=(YarnRopeScaling,),
                  reads=(_K.LLM.EXPERT_COUNT, _K.Rope.SCALING_TYPE, _K.Rope.SCALING_FACTOR)))

DEEPSEEK_V3 = FamilySpec(
    model_type="deepseek_v3", name="DeepSeek-V3", hf_class="DeepseekV3ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES, "sliding_window": llama.NO_WINDOW},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    may_set=frozenset({"moe", "mla"}), hf_keys=EXPERT_KEYS, rope_scalings=(YarnRopeScaling,),
    problems=problems, claims=((5, lambda c: c.mla is not None),),
    variants=("LatentAttention", "GroupedMixture"), gguf=GGUF,
    look_alikes={"deepseek_v2": "DeepSeek-V2 routes with a softmax over groups; DeepSeek-V3 "
                                "(model_type 'deepseek_v3') is imported"},
    differences=Differences(
        positions="YaRN on the RoPE dims of each head", attention="multi-head latent attention",
        ffn="dense first layers, then experts with grouped sigmoid routing and a shared expert",
        cache="the latents and one RoPE key, not keys and values"))
