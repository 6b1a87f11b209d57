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

llama.cpp's `gpt-oss` (GGUF both ways) fixes what the checkpoint may vary: the clamp at 7 and
alpha 1.702, every second layer global (layer i when i % 2 = 1), untied. Its converter stores the
experts as MXFP4 (convert/gguf_quants.py reads them) and splits gate and up. llama.cpp rounds
YaRN's ramp to whole dims; gpt-oss's checkpoints do not (truncate false): export-gguf writes the
run's choice in a key of handformer's own and says so, import-gguf reads a file without it as the
checkpoints have it.

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
from handformer.families.mixtral import EXPERT, EXPERT_KEYS, GGUF_EXPERTS, expert_problems
from handformer.families.spec import Differences, FamilySpec, GgufCode, GgufEntry, stacked, to
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


# --- llama.cpp's gpt-oss (GGUF) ------------------------------------------------------------------
GGUF_TENSORS = {
    **{n: keys for n, keys in llama.GGUF_TENSORS.items() if not n.startswith("blk.") or ".attn_" in n},
    # llama.cpp's name for the norm before the experts
    "blk.{i}.post_attention_norm.weight": ("layers.{i}.ffn_norm.weight",),
    "blk.{i}.attn_sinks.weight": ("layers.{i}.self_attn.sinks",),  # (H,)
    **GGUF_EXPERTS, "blk.{i}.ffn_gate_inp.bias": ("layers.{i}.ffn.router.bias",),  # (E,)
    # each layer's experts' biases stacked: gate and up (E, F), down (E, D)
    **{f"blk.{{i}}.ffn_{p}_exps.bias": (f"{EXPERT}.{p}_proj.bias",) for p in ("gate", "up", "down")}}
_ARCH = "gpt-oss"
# the keys written and read here beside the engine's (the names are gguf.Keys', checked by the tests)
WINDOW, PATTERN = f"{_ARCH}.attention.sliding_window", f"{_ARCH}.attention.sliding_window_pattern"
YARN_TYPE, YARN_FACTOR = f"{_ARCH}.rope.scaling.type", f"{_ARCH}.rope.scaling.factor"
YARN_ORIGINAL = f"{_ARCH}.rope.scaling.original_context_length"
YARN_BETAS = {"beta_fast": (f"{_ARCH}.rope.scaling.yarn_beta_fast", 32.0),  # key, llama.cpp's default
              "beta_slow": (f"{_ARCH}.rope.scaling.yarn_beta_slow", 1.0)}
# llama.cpp multiplies cos and sin by these (1, 0 and 1: none); gpt-oss has none
YARN_REFUSED = {f"{_ARCH}.rope.scaling.attn_factor": 1.0, f"{_ARCH}.rope.scaling.yarn_log_multiplier": 0.0,
                f"{_ARCH}.rope.scaling.yarn_ext_factor": 1.0}
# handformer's own (llama.cpp reads neither): what gives the run's YaRN back exactly
TRUNCATE, ATTENTION_FACTOR = "handformer.rope_scaling.truncate", "handformer.rope_scaling.attention_factor"


def gguf_problems(cfg: CausalLMConfig) -> list[str]:
    """What llama.cpp's gpt-oss cannot run: another layer pattern, another scaling, YaRN's mscale."""
    found = expert_problems(cfg, "llama.cpp's gpt-oss", shared=False)
    odd = [i for i in range(cfg.n_layers) if i % 2 == 1]
    if cfg.sliding_window is not None and cfg.sliding_window < cfg.max_positions and cfg.global_layers != odd:
        found.append(f"global_layers={cfg.global_layers!r} (llama.cpp's gpt-oss makes layer i global when "
                     f"i % 2 = 1: {odd} for {cfg.n_layers} layers)")
    s = cfg.rope_scaling
    if s is not None and not isinstance(s, YarnRopeScaling):
        found.append(f"rope_scaling={s!r} (llama.cpp's gpt-oss takes YaRN or none)")
    elif s is not None and (s.mscale or s.mscale_all_dim):
        found.append(f"rope_scaling={s!r} (llama.cpp's gpt-oss has no YaRN mscale; that is DeepSeek's)")
    elif s is not None and s.cos_sin_factor() != s.mscale_of(s.factor):
        found.append(f"rope_scaling.attention_factor={s.attention_factor!r} (llama.cpp's gpt-oss multiplies "
                     f"cos and sin by 0.1 ln(factor) + 1 = {s.mscale_of(s.factor)!r})")
    return found


def gguf_notes(cfg: CausalLMConfig) -> list[str]:
    s = cfg.rope_scaling
    if isinstance(s, YarnRopeScaling) and not s.truncate:
        return ["llama.cpp rounds YaRN's ramp to whole dims (truncate); this run does not (truncate=false, "
                "as gpt-oss's checkpoints): llama.cpp turns the dims inside the ramp slightly otherwise"]
    return []


def write_gguf_keys(writer: Any, cfg: CausalLMConfig) -> None:
    """The window (which llama.cpp requires: the whole context when there is none) and YaRN."""
    window = cfg.sliding_window
    whole = window is None or window >= cfg.max_positions
    writer.add_uint32(WINDOW, cfg.max_positions if whole else window)
    s = cfg.rope_scaling
    if isinstance(s, YarnRopeScaling):
        writer.add_string(YARN_TYPE, "yarn")
        writer.add_float32(YARN_FACTOR, s.factor)
        writer.add_uint32(YARN_ORIGINAL, s.original_max_positions)
        for name, (key, _) in YARN_BETAS.items():
            writer.add_float32(key, getattr(s, name))
        writer.add_bool(TRUNCATE, s.truncate)
        if s.attention_factor is not None:
            writer.add_float64(ATTENTION_FACTOR, s.attention_factor)


def _read_yarn(metadata: dict[str, Any], where: str) -> YarnRopeScaling | None:
    kind = metadata.get(YARN_TYPE)
    if kind in (None, "none"):
        return None
    if kind != "yarn":
        raise ValueError(f"{where} has {YARN_TYPE}={kind!r}: import-gguf reads gpt-oss with YaRN or none")
    for key, plain in YARN_REFUSED.items():
        if metadata.get(key, plain) != plain:
            raise ValueError(f"{where} has {key}={metadata[key]!r}, which import-gguf does not read for "
                             "gpt-oss")
    betas = {name: float(metadata.get(key, default)) for name, (key, default) in YARN_BETAS.items()}
    try:
        return YarnRopeScaling(factor=float(metadata[YARN_FACTOR]), **betas,
                               original_max_positions=metadata[YARN_ORIGINAL],
                               truncate=metadata.get(TRUNCATE, False),
                               attention_factor=metadata.get(ATTENTION_FACTOR))
    except KeyError as err:
        raise ValueError(f"{where} has YaRN without {err.args[0]}, which it needs") from None


def read_gguf_keys(metadata: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    """The window and its layers, YaRN (truncate false unless the file says otherwise, as gpt-oss's
    checkpoints), and experts d_ff wide read as the checkpoints' (no width of their own)."""
    window = metadata.get(WINDOW)
    if not isinstance(window, int) or window <= 0:
        raise ValueError(f"{where}: {WINDOW}={window!r}; llama.cpp's gpt-oss needs a positive window")
    if metadata.get(PATTERN, 2) != 2:
        raise ValueError(f"{where} has {PATTERN}={metadata[PATTERN]!r}; import-gguf reads gpt-oss's own "
                         "pattern (every second layer global) only")
    n, moe = settings["n_layers"], settings["moe"]
    out: dict[str, Any] = {"rope_scaling": _read_yarn(metadata, where), "sliding_window": None,
                           "global_layers": []}
    if window < settings["max_positions"]:
        out.update(sliding_window=window, global_layers=[i for i in range(n) if i % 2 == 1])
    if moe.d_expert == settings["d_ff"]:
        out["moe"] = dataclasses.replace(moe, d_expert=None)
    return out


GGUF = GgufEntry(
    _ARCH, "gpt_oss", "gpt-oss", GGUF_TENSORS,
    {**llama.GGUF_BLOCK, "bias": (True, "has biases on attention and experts"),
     "qkv_bias": (False, "has biases on q, k, v and o"), "tie_embeddings": (False, "has an untied head"),
     "attn_sinks": (True, "has attention sinks"),
     "swiglu_limit": (7.0, "clamps its experts' SwiGLU at 7 in llama.cpp"),
     "swiglu_alpha": (1.702, "gates with sigmoid(1.702 x) in llama.cpp")},
    biases=(), experts=True, writes=frozenset({"moe", "global_layers", "attn_sinks", "swiglu_limit"}),
    code=GgufCode(write=write_gguf_keys, read=read_gguf_keys, problems=gguf_problems, notes=gguf_notes,
                  rope_scalings=(YarnRopeScaling,),
                  reads=("{arch}.rope.scaling.type", "{arch}.rope.scaling.factor")))

GPT_OSS = FamilySpec(
    model_type="gpt_oss", name="gpt-oss", hf_class="GptOssForCausalLM",
    fixed={**llama.LLAMA_BLOCK, "bias": (True, "has biases on attention and experts"),
           "tie_embeddings": (False, "has an untied head")},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS, gguf=GGUF,
    may_set=frozenset({"moe", "global_layers", "attn_sinks", "swiglu_limit", "swiglu_alpha"}),
    hf_keys=EXPERT_KEYS, layer_types=True, rope_scalings=(YarnRopeScaling,), problems=problems,
    claims=((5, lambda c: c.attn_sinks or c.swiglu_limit is not None),),
    variants=("SinkAttention", "GptOssMoE", "ClampedSwiGLU"),
    differences=Differences(positions="YaRN", attention="a learned sink logit per head; biases",
                            ffn="a mixture of clamped-SwiGLU experts with biases (top-k softmaxed)",
                            cache="sliding (128) and global layers alternate"))

__all__ = ["ClampedSwiGLU", "GPT_OSS", "GptOssMoE", "SinkAttention"]
