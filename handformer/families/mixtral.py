"""Mixtral, and what every mixture-of-experts family here shares: the router and experts' tensor
names (Hugging Face's and llama.cpp's) and what export-hf checks of a mixture.

Mixtral is Mistral's block with a mixture of experts (SwiGLU experts intermediate_size wide, the
top-k weights renormalized). Its checkpoints name the mixture block_sparse_moe and the expert
matrices w1 (gate), w3 (up), w2 (down); transformers 5 calls it mlp and stacks the experts in memory.
"""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import (
    expert_keys,
    expert_width,
    experts,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
    window_settings,
)
from handformer.families.spec import Differences, FamilySpec, GgufEntry, to

EXPERT = "layers.{i}.ffn.experts.{e}"
ROUTER = {"model.layers.{i}.mlp.gate.weight": to("layers.{i}.ffn.router.weight")}  # (E, D)
EXPERTS = {f"model.layers.{{i}}.mlp.experts.{{e}}.{p}.weight": to(f"{EXPERT}.{p}.weight")
           for p in ("gate_proj", "up_proj", "down_proj")}  # (F, D), (F, D), (D, F) each
STACKED_EXPERTS = {  # transformers 5: (E, 2F, D) gate then up, and (E, D, F)
    "model.layers.{i}.mlp.experts.gate_up_proj": ("model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
                                                  "model.layers.{i}.mlp.experts.{e}.up_proj.weight"),
    "model.layers.{i}.mlp.experts.down_proj": ("model.layers.{i}.mlp.experts.{e}.down_proj.weight",)}
# llama.cpp: the router (E, D) and each layer's experts stacked ({e} = expert) into one 3-D tensor
# per projection: gate and up (E, F, D), down (E, D, F)
GGUF_EXPERTS = {
    "blk.{i}.ffn_gate_inp.weight": (f"{llama.FFN}.router.weight",),
    "blk.{i}.ffn_gate_exps.weight": (f"{EXPERT}.gate_proj.weight",),
    "blk.{i}.ffn_up_exps.weight": (f"{EXPERT}.up_proj.weight",),
    "blk.{i}.ffn_down_exps.weight": (f"{EXPERT}.down_proj.weight",),
}
EXPERT_KEYS = frozenset({"num_local_experts", "num_experts"})  # config.json keys of a mixture


def dense_free(tensors: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """llama.cpp tensors without the dense feed-forward (its norms stay)."""
    return {name: keys for name, keys in tensors.items() if ".ffn_" not in name or "_norm" in name}


def expert_problems(cfg: CausalLMConfig, name: str, shared: bool) -> list[str]:
    """What export-hf checks of a mixture-of-experts family's run."""
    if cfg.moe is None:
        return [f"moe=None ({name} is a mixture of experts)"]
    found = []
    if cfg.moe.grouped:
        found.append(f"moe={cfg.moe!r} ({name} routes each token to its softmax top-k, without groups, "
                     "sigmoid scores or dense layers)")
    if (cfg.moe.d_shared > 0) != shared:
        has = "has" if shared else "has no"
        found.append(f"moe.d_shared={cfg.moe.d_shared} ({name} {has} shared expert)")
    return found


_MIXTURE = "model.layers.{i}.block_sparse_moe"
TENSORS = llama.llama_like(llama.linears(llama.ATTENTION), llama.PRE_NORMS, {
    f"{_MIXTURE}.gate.weight": to("layers.{i}.ffn.router.weight"),
    f"{_MIXTURE}.experts.{{e}}.w1.weight": to(f"{EXPERT}.gate_proj.weight"),
    f"{_MIXTURE}.experts.{{e}}.w3.weight": to(f"{EXPERT}.up_proj.weight"),
    f"{_MIXTURE}.experts.{{e}}.w2.weight": to(f"{EXPERT}.down_proj.weight")},
    in_memory={"model.layers.{i}.mlp.gate.weight": (f"{_MIXTURE}.gate.weight",),
               "model.layers.{i}.mlp.experts.gate_up_proj": (f"{_MIXTURE}.experts.{{e}}.w1.weight",
                                                             f"{_MIXTURE}.experts.{{e}}.w3.weight"),
               "model.layers.{i}.mlp.experts.down_proj": (f"{_MIXTURE}.experts.{{e}}.w2.weight",)})


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """Mixtral: Mistral's block with a mixture of experts (SwiGLU, intermediate_size wide), top-k
    weights renormalized."""
    silu_only(c)
    return rope_decoder(c, moe=experts(c, None, True),  # the experts are d_ff (intermediate_size) wide
                        norm_eps=c.get("rms_norm_eps", 1e-5), **window_settings(c, c.get("sliding_window")))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), **expert_keys(cfg, "num_local_experts"),
        "intermediate_size": expert_width(cfg),
            "sliding_window": cfg.sliding_window, "router_jitter_noise": 0.0}


def problems(cfg: CausalLMConfig) -> list[str]:
    found = expert_problems(cfg, "Mixtral", shared=False)
    if cfg.moe is not None and not cfg.moe.normalize:
        found.append("moe.normalize=False (Mixtral always renormalizes the top-k weights)")
    return found


# llama.cpp's Llama with {arch}.expert_count set (as its convert_hf_to_gguf.py writes it): no biases
GGUF = GgufEntry(llama.GGUF.arch, "mixtral", "Mixtral",
                 {**{n: k for n, k in dense_free(llama.GGUF_TENSORS).items() if not n.endswith(".bias")},
                  **GGUF_EXPERTS},
                 {**llama.GGUF.settings, **llama.NO_BIASES}, rope="pairs", rope_freqs=True, biases=(),
                 experts=True, experts_d_ff=True, writes=frozenset({"moe"}))

MIXTRAL = FamilySpec(
    model_type="mixtral", name="Mixtral", hf_class="MixtralForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS, gguf=GGUF,
    may_set=frozenset({"moe"}), hf_keys=EXPERT_KEYS, problems=problems,
    claims=((13, lambda c: c.moe is not None),),
    differences=Differences(ffn="a mixture of experts (top-k renormalized)",
                            cache="a sliding window when set"))

__all__ = ["EXPERTS", "EXPERT_KEYS", "GGUF_EXPERTS", "MIXTRAL", "ROUTER", "STACKED_EXPERTS", "dense_free",
           "expert_problems"]
