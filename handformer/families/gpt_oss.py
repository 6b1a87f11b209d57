"""gpt-oss (OpenAI, 20b and 120b): its family spec, and where its block differs from the lesson's.

- **Attention sinks**: each head has a learned logit that joins its softmax as one more key whose
  value is zero, so a query may give part of its weight to nothing (`SinkAttention`; the lesson's
  one attention function takes the sinks: `scaled_dot_product_attention(..., sinks=)`).
- **Sliding and global layers alternate**: the even layers see the last 128 positions, the odd
  ones every position (the lesson's `global_layers`).
- **A mixture of experts with biases** on the router and on every expert's projections; the
  router's top-k logits go through a softmax of their own (`GptOssMoE`), and each expert is a
  clamped SwiGLU (`ClampedSwiGLU`).
- **YaRN** stretches RoPE's low frequencies 32 times (the lesson's `YarnRopeScaling`); biases on
  q, k, v and o.

Its checkpoints hold a layer's experts in one tensor each, (E, D, 2F) with the gate's and up's
columns alternating, and the released ones store those as MXFP4 (convert/mxfp4.py). Its chat
format, harmony, is refused by `chat` and serve by name (generation/chat_template.py).

Shape legend: N tokens, D d_model, E experts, k experts per token, F expert width, H heads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, YarnRopeScaling
from handformer.families.adopt import adopt_attention
from handformer.families.hf_config import (
    expert_keys,
    expert_width,
    experts,
    layer_types_keys,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
    unsupported,
    window_settings,
)
from handformer.families.mixtral import EXPERT, EXPERT_KEYS, expert_problems
from handformer.families.spec import Differences, FamilySpec, stacked, to
from handformer.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from handformer.nn.feed_forward import GatedFeedForward
from handformer.nn.masks import AttentionMask
from handformer.nn.moe import MixtureOfExperts


class SinkAttention(MultiHeadAttention):
    """`MultiHeadAttention` with a learned sink logit per head in each softmax. Only `attend` differs."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        adopt_attention(self, attn)  # the lesson attention's projections, as they are
        self.sinks = nn.Parameter(torch.zeros(attn.n_heads))  # (H,)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | Tensor | None,
               need_weights: bool) -> tuple[Tensor, Tensor | None]:
        out, weights = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights,
                                                    dropout_p=self.dropout * self.training, sinks=self.sinks)
        return out, weights if need_weights else None


def with_bias(linear: nn.Linear) -> nn.Linear:
    """The same Linear with a bias (zeros) where it had none."""
    if linear.bias is None:
        linear.bias = nn.Parameter(torch.zeros(linear.out_features, device=linear.weight.device))
    return linear


class ClampedSwiGLU(GatedFeedForward):
    """gpt-oss's expert: SwiGLU with biases, the gate clamped above at `limit` and the up projection
    to +-limit, then (up + 1) * gate * sigmoid(alpha * gate)."""

    def __init__(self, expert: GatedFeedForward, limit: float, alpha: float) -> None:
        nn.Module.__init__(self)
        self.activation, self.act = expert.activation, expert.act
        self.gate_proj = with_bias(expert.gate_proj)  # (N, D) -> (N, F)
        self.up_proj = with_bias(expert.up_proj)  # (N, D) -> (N, F)
        self.down_proj = with_bias(expert.down_proj)  # (N, F) -> (N, D)
        self.limit, self.alpha = limit, alpha

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)  # (N, F)
        up = self.up_proj(x).clamp(-self.limit, self.limit)  # (N, F)
        return self.down_proj((up + 1) * gate * torch.sigmoid(self.alpha * gate))


class GptOssMoE(MixtureOfExperts):
    """The lesson's mixture with a bias on the router, its top-k logits softmaxed among themselves,
    and clamped SwiGLU experts. Only `route` differs."""

    def __init__(self, moe: MixtureOfExperts, limit: float, alpha: float) -> None:
        nn.Module.__init__(self)
        self.top_k, self.normalize = moe.top_k, True
        self.router = with_bias(moe.router)  # (N, D) -> (N, E)
        self.experts = nn.ModuleList(ClampedSwiGLU(e, limit, alpha) for e in moe.experts)
        self.shared_expert = moe.shared_expert  # none
        self.train(moe.training)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(N, D) tokens -> (weights (N, k) float32, experts (N, k))."""
        logits, experts = self.router(x).topk(self.top_k, dim=-1)  # (N, k) each, the best first
        return torch.softmax(logits.float(), dim=-1), experts


# --- the checkpoint ----------------------------------------------------------------------------
_MLP = "model.layers.{i}.mlp"
TENSORS = llama.llama_like(llama.linears(llama.ATTENTION), llama.PRE_NORMS, {
    "model.layers.{i}.self_attn.sinks": to("layers.{i}.self_attn.sinks"),  # (H,)
    f"{_MLP}.router.weight": to("layers.{i}.ffn.router.weight"),  # (E, D)
    f"{_MLP}.router.bias": to("layers.{i}.ffn.router.bias"),  # (E,)
    # (E, D, 2F) and (E, 2F): columns gate, up, gate, up, ...
    f"{_MLP}.experts.gate_up_proj": stacked(f"{EXPERT}.gate_proj.weight", f"{EXPERT}.up_proj.weight",
                                            transpose=True, interleaved=True),
    f"{_MLP}.experts.gate_up_proj_bias": stacked(f"{EXPERT}.gate_proj.bias", f"{EXPERT}.up_proj.bias",
                                                 interleaved=True),
    f"{_MLP}.experts.down_proj": stacked(f"{EXPERT}.down_proj.weight", transpose=True),  # (E, F, D)
    f"{_MLP}.experts.down_proj_bias": stacked(f"{EXPERT}.down_proj.bias")},  # (E, D)
    mxfp4=(f"{_MLP}.experts.gate_up_proj", f"{_MLP}.experts.down_proj"))

# --- config.json -------------------------------------------------------------------------------


def no_mscale(c: dict[str, Any]) -> None:
    """gpt-oss's YaRN is read by the shared reader (hf_config.rope); DeepSeek's mscale is refused."""
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if params.get("mscale") or params.get("mscale_all_dim"):
        unsupported(c, "rope_parameters", params, "YaRN's mscale (DeepSeek's) is not implemented for gpt_oss")


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """gpt-oss: sinks, sliding and global layers, clamped-SwiGLU experts with biases, YaRN."""
    silu_only(c)
    if not c.get("attention_bias", True):
        unsupported(c, "attention_bias", False, "gpt-oss has biases on q, k, v and o in handformer")
    no_mscale(c)
    return rope_decoder({"rope_theta": 150000.0, **c}, ("default", "yarn"), moe=experts(c, None, True),
                        bias=True, norm_eps=c.get("rms_norm_eps", 1e-5), attn_sinks=True,
                        swiglu_limit=float(c.get("swiglu_limit", 7.0)),
                        swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
                        **window_settings(c, c.get("sliding_window")))


def yarn_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    s = cfg.rope_scaling
    if not isinstance(s, YarnRopeScaling):
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    optional = {"attention_factor": s.attention_factor} if s.attention_factor is not None else {}
    return {"rope_type": "yarn", "rope_theta": cfg.rope_theta, "factor": s.factor, "beta_fast": s.beta_fast,
            "beta_slow": s.beta_slow, "truncate": s.truncate,
            "original_max_position_embeddings": s.original_max_positions, **optional}


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    unscaled = dataclasses.replace(cfg, rope_scaling=None)  # YaRN's keys are written below
    return {**rope_decoder_keys(unscaled, rope_scaling=False), **expert_keys(cfg, "num_local_experts"),
            "intermediate_size": expert_width(cfg), "rope_parameters": yarn_keys(cfg),
            "sliding_window": cfg.sliding_window, "layer_types": layer_types_keys(cfg),
            "attention_bias": True, "swiglu_limit": cfg.swiglu_limit, "swiglu_alpha": cfg.swiglu_alpha}


def problems(cfg: CausalLMConfig) -> list[str]:
    found = expert_problems(cfg, "gpt-oss", shared=False)
    if not cfg.attn_sinks:
        found.append("attn_sinks=False (gpt-oss has attention sinks)")
    if cfg.swiglu_limit is None:
        found.append("swiglu_limit=None (gpt-oss clamps its experts' SwiGLU)")
    if cfg.moe is not None and cfg.moe.d_expert not in (None, cfg.d_ff):
        found.append(f"moe.d_expert={cfg.moe.d_expert} (gpt-oss's experts are d_ff={cfg.d_ff} wide)")
    return found


GPT_OSS = FamilySpec(
    model_type="gpt_oss", name="gpt-oss", hf_class="GptOssForCausalLM",
    fixed={**llama.LLAMA_BLOCK, "bias": (True, "has biases on attention and experts"),
           "tie_embeddings": (False, "has an untied head")},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    may_set=frozenset({"moe", "global_layers", "attn_sinks", "swiglu_limit", "swiglu_alpha"}),
    hf_keys=EXPERT_KEYS, layer_types=True, rope_scalings=(YarnRopeScaling,), problems=problems,
    claims=((5, lambda c: c.attn_sinks or c.swiglu_limit is not None),),
    gguf_unread={"gpt-oss": "gpt-oss has attention sinks and experts with biases and a clamped SwiGLU"},
    variants=("SinkAttention", "GptOssMoE", "ClampedSwiGLU"),
    differences=Differences(positions="YaRN", attention="a learned sink logit per head; biases",
                            ffn="a mixture of clamped-SwiGLU experts with biases (top-k softmaxed)",
                            cache="sliding (128) and global layers alternate"))

__all__ = ["ClampedSwiGLU", "GPT_OSS", "GptOssMoE", "SinkAttention"]
