"""The catalogue: every model family handformer reads and writes, one `FamilySpec` each (spec.py).

Adding a family is adding its spec module (or a spec to its lineage's module) and one line here.

    spec = SPECS[model_type]       # the spec of a model_type
    spec_of(cfg)                   # where a run trained here exports to
"""

from __future__ import annotations

from handformer.config import CausalLMConfig
from handformer.families.apertus import APERTUS
from handformer.families.deepseek import DEEPSEEK_V3
from handformer.families.ernie import ERNIE4_5
from handformer.families.exaone4 import EXAONE4
from handformer.families.gemma import GEMMA, GEMMA2, GEMMA3_TEXT
from handformer.families.glm4 import GLM4
from handformer.families.gpt2 import GPT2
from handformer.families.gpt_oss import GPT_OSS
from handformer.families.granite import GRANITE
from handformer.families.hunyuan import HUNYUAN_DENSE
from handformer.families.llama import LLAMA
from handformer.families.ministral import MINISTRAL3
from handformer.families.mistral import MISTRAL
from handformer.families.mixtral import MIXTRAL
from handformer.families.olmo import OLMO2, OLMOE
from handformer.families.olmo3 import OLMO3
from handformer.families.phi import PHI3
from handformer.families.qwen import QWEN2, QWEN2_MOE, QWEN3, QWEN3_MOE
from handformer.families.qwen3_5 import QWEN3_5
from handformer.families.seed_oss import SEED_OSS
from handformer.families.smollm import SMOLLM3
from handformer.families.spec import FamilySpec, GgufEntry
from handformer.families.starcoder2 import STARCODER2

# In the order messages list them.
SPECS: dict[str, FamilySpec] = {s.model_type: s for s in (
    GPT2, LLAMA, QWEN2, QWEN3, MISTRAL, GEMMA, GEMMA2, GEMMA3_TEXT, SMOLLM3, OLMO2, PHI3, MIXTRAL, QWEN3_MOE,
    QWEN2_MOE, OLMOE, STARCODER2, GRANITE, GPT_OSS, SEED_OSS, OLMO3, HUNYUAN_DENSE, ERNIE4_5,
    DEEPSEEK_V3, APERTUS, QWEN3_5, GLM4, EXAONE4, MINISTRAL3)}

# llama.cpp's architectures import-gguf reads, in the order messages list them (Mixtral shares
# Llama's architecture and is told apart by its expert count).
GGUF_ENTRIES: tuple[GgufEntry, ...] = tuple(s.gguf for s in (
    LLAMA, QWEN2, QWEN3, QWEN3_MOE, GEMMA, GEMMA2, GEMMA3_TEXT, OLMO2, SMOLLM3, PHI3, GPT2, MIXTRAL, GRANITE,
    SEED_OSS, HUNYUAN_DENSE, ERNIE4_5, GLM4, EXAONE4, GPT_OSS, APERTUS, MINISTRAL3, DEEPSEEK_V3,
    QWEN3_5) if s.gguf)

# llama.cpp's names that came from a family: the tokenizer.ggml.model of byte-level BPE (GPT-2's)
# and of SentencePiece (Llama's), and Qwen2's tokenizer.ggml.pre
BYTE_LEVEL_BPE = GPT2.gguf.tokenizer_model if GPT2.gguf else None
SENTENCEPIECE = LLAMA.gguf.tokenizer_model if LLAMA.gguf else None
QWEN2_PRE = QWEN2.gguf.pre_tokenizer if QWEN2.gguf else None


def spec_of(cfg: CausalLMConfig, among: tuple[FamilySpec, ...] | None = None) -> FamilySpec:
    """The family a run trained here goes to: the lowest-ranked claim whose test holds (among the
    given specs, or all)."""
    ranked = sorted((rank, i, spec, test) for i, spec in enumerate(among or tuple(SPECS.values()))
                    for rank, test in spec.claims)
    for _, _, spec, test in ranked:
        if test(cfg):
            return spec
    raise ValueError("no family claims this configuration")  # Llama claims every RoPE model


PARTS = ("norm", "positions", "attention", "ffn", "embedding", "cache")  # the columns of `table`


def table() -> list[dict[str, str]]:
    """One row a family: its name, model_type, spec file, llama.cpp architecture, module variants
    and, part by part (`PARTS`), how its model differs from the lesson's block (what `handformer
    families` prints; "-": as the lesson's)."""
    rows = []
    for spec in SPECS.values():
        path = spec.from_hf_config.__module__.replace(".", "/") + ".py"
        rows.append({"family": spec.name, "model_type": spec.model_type, "spec": path,
                     "llama.cpp": spec.gguf.arch if spec.gguf else "-",
                     "variants": ", ".join(spec.variants) or "-",
                     **{part: getattr(spec.differences, part) for part in PARTS}})
    return rows


def look_alike(model_type: object) -> str:
    """Why a known but unsupported model_type is not imported, as " (...)", or ""."""
    for spec in SPECS.values():
        if model_type in spec.look_alikes:
            return f" ({spec.look_alikes[model_type]})"  # type: ignore[index]
    return ""


__all__ = ["BYTE_LEVEL_BPE", "GGUF_ENTRIES", "PARTS", "QWEN2_PRE", "SENTENCEPIECE", "SPECS", "look_alike",
           "spec_of", "table"]
