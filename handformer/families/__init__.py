"""The families room: the catalogue of model families (one `FamilySpec` each, catalogue.py), the
variants of lesson modules that some of them need, and the one builder that puts those in place.

    model = build_causal_lm(cfg)   # CausalLM(cfg), then each variant cfg asks for

`CausalLM(cfg)` (handformer/models) is the lesson's model: what every family shares, with each
difference of a line or two a config field there (q/k norms per head, partial RoPE, LongRoPE,
sliding and global layers, mixtures of experts). Where a family differs by more, a variant here
takes the lesson module's place after the model is built (`handformer.replace.replace_layers`, as
torchtune's builders do), reusing its weights:

| setting                          | family              | variant                                   |
|----------------------------------|---------------------|-------------------------------------------|
| norm_placement = "sandwich"      | Gemma 2, 3; GLM-4   | gemma.SandwichBlock                       |
| attn_scale_dim, attn_softcap     | Gemma 2, Gemma 3    | gemma.GemmaAttention                      |
| logit_softcap                    | Gemma 2             | gemma.SoftcappedHead                      |
| rope_local_theta                 | Gemma 3, OLMo 3     | gemma.LocalGlobalRotary                   |
| norm_placement = "reordered"     | OLMo 2/3, EXAONE 4  | olmo.ReorderedNormBlock                   |
| qk_norm = "width"                | OLMo 2              | olmo.WidthQKNormAttention                 |
| nope_layers                      | SmolLM3, EXAONE 4   | smollm.NoRopeAttention                    |
| family.residual_multiplier       | Granite             | granite.GraniteBlock                      |
| family.attention_multiplier      | Granite             | granite.GraniteAttention                  |
| family.embedding_multiplier      | Granite             | granite.ScaledEmbedding                   |
| family.logits_scaling            | Granite             | granite.ScaledHead                        |
| attn_sinks                       | gpt-oss             | gpt_oss.SinkAttention                     |
| swiglu_limit                     | gpt-oss             | gpt_oss.GptOssMoE, gpt_oss.ClampedSwiGLU  |
| qk_norm = "head_after_rope"      | Hunyuan             | hunyuan.RotatedQKNormAttention            |
| mla                              | DeepSeek-V3         | deepseek.LatentAttention                  |
| moe.grouped (sigmoid, groups)    | DeepSeek-V3         | deepseek.GroupedMixture                   |
| activation = "xielu"             | Apertus             | apertus.LearnedXIELU                      |
| family.attn_output_gate          | Qwen3.5             | qwen3_5.GatedAttention                    |
| deltanet                         | Qwen3.5             | qwen3_5.GatedDeltaNet                     |
| family.query_scale_beta          | Ministral 3         | ministral.PositionScaledRotary and        |
|                                  |                     | ministral.PositionScaledAttention         |

Everything that builds a model from a config (runs, imports, training, tracing) calls
`build_causal_lm`; the variants' modules keep the lesson's parameter names, so state dicts,
LoRA targets and quantization see the same layers.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from handformer.config import CausalLMConfig
from handformer.families.apertus import put_learned_xielu
from handformer.families.deepseek import put_grouped_mixtures, put_latent_attention
from handformer.families.gemma import GemmaAttention, LocalGlobalRotary, SandwichBlock, SoftcappedHead
from handformer.families.gpt_oss import GptOssMoE, SinkAttention
from handformer.families.granite import GraniteAttention, GraniteBlock, ScaledEmbedding, ScaledHead
from handformer.families.hunyuan import RotatedQKNormAttention
from handformer.families.ministral import put_position_scaled_queries
from handformer.families.olmo import ReorderedNormBlock, WidthQKNormAttention
from handformer.families.qwen3_5 import put_deltanets, put_gated_attention
from handformer.families.smollm import NoRopeAttention
from handformer.models.causal_lm import CausalLM
from handformer.replace import replace_layers


def _layers(model: CausalLM, part: str, which: Callable[[int], bool] = lambda i: True,
            ) -> dict[str, nn.Module]:
    """{full name: module} of `part` ("" = the block itself, "self_attn") of the chosen layers."""
    return {f"layers.{i}{'.' + part if part else ''}": layer.get_submodule(part)
            for i, layer in enumerate(model.layers) if which(i)}


def _blocks(model: CausalLM, cfg: CausalLMConfig) -> None:
    variant = {"sandwich": lambda block: SandwichBlock(block, cfg), "reordered": ReorderedNormBlock}
    replace_layers(model, _layers(model, ""), variant[cfg.norm_placement])


# (does the config ask for it?, put it in place), applied in this order: blocks before attention.
VARIANTS: list[tuple[Callable[[CausalLMConfig], bool], Callable[[CausalLM, CausalLMConfig], object]]] = [
    (lambda c: c.norm_placement in ("sandwich", "reordered"), _blocks),
    (lambda c: c.family.attn_scale_dim is not None or c.family.attn_softcap is not None,
     lambda m, c: replace_layers(m, _layers(m, "self_attn"), lambda a: GemmaAttention(
         a, c.family.attn_scale_dim or c.head_dim, c.family.attn_softcap))),
    (lambda c: c.qk_norm == "width",
     lambda m, c: replace_layers(m, _layers(m, "self_attn"), lambda a: WidthQKNormAttention(a, c))),
    (lambda c: c.qk_norm == "head_after_rope",
     lambda m, c: replace_layers(m, _layers(m, "self_attn"), lambda a: RotatedQKNormAttention(a, c))),
    (lambda c: bool(c.family.nope_layers),
     lambda m, c: replace_layers(m, _layers(m, "self_attn", lambda i: i in c.family.nope_layers),
                                 NoRopeAttention)),
    (lambda c: c.family.logit_softcap is not None,
     lambda m, c: replace_layers(m, {"lm_head": m.lm_head},
                                 lambda h: SoftcappedHead(h, c.family.logit_softcap))),
    (lambda c: c.family.rope_local_theta is not None,
     lambda m, c: replace_layers(m, {"rotary": m.rotary}, lambda r: LocalGlobalRotary(c))),
    (lambda c: c.family.residual_multiplier is not None,
     lambda m, c: replace_layers(m, _layers(m, ""), lambda b: GraniteBlock(b, c.family.residual_multiplier))),
    (lambda c: c.family.attention_multiplier is not None,
     lambda m, c: replace_layers(m, _layers(m, "self_attn"),
                                 lambda a: GraniteAttention(a, c.family.attention_multiplier))),
    (lambda c: c.family.embedding_multiplier is not None,
     lambda m, c: replace_layers(m, {"embed": m.embed},
                                 lambda e: ScaledEmbedding(e, c.family.embedding_multiplier))),
    (lambda c: c.family.logits_scaling is not None,
     lambda m, c: replace_layers(m, {"lm_head": m.lm_head},
                                 lambda h: ScaledHead(h, c.family.logits_scaling))),
    (lambda c: c.attn_sinks, lambda m, c: replace_layers(m, _layers(m, "self_attn"), SinkAttention)),
    (lambda c: c.swiglu_limit is not None, lambda m, c: replace_layers(
        m, _layers(m, "ffn"), lambda moe: GptOssMoE(moe, c.swiglu_limit, c.swiglu_alpha))),
    (lambda c: c.mla is not None, put_latent_attention),
    (lambda c: c.moe is not None and c.moe.grouped, put_grouped_mixtures),
    (lambda c: c.activation == "xielu", put_learned_xielu),
    (lambda c: c.family.attn_output_gate, put_gated_attention),
    (lambda c: c.deltanet is not None, put_deltanets),
    (lambda c: c.family.query_scale_beta is not None, put_position_scaled_queries),
]


def build_causal_lm(cfg: CausalLMConfig) -> CausalLM:
    """`CausalLM(cfg)` with every variant its settings ask for in place (see the module docstring)."""
    model = CausalLM(cfg)
    for applies, put_in_place in VARIANTS:
        if applies(cfg):
            put_in_place(model, cfg)
    return model


def family_variants(cfg: CausalLMConfig) -> bool:
    """Whether `cfg` needs a variant of this room (so `CausalLM(cfg)` alone is not its model)."""
    return any(applies(cfg) for applies, _ in VARIANTS)


__all__ = ["NoRopeAttention", "VARIANTS", "build_causal_lm", "family_variants"]
