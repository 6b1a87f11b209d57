"""What a model family is, in one value: `FamilySpec`, and the two tensor maps it carries.

Each module of this room defines the specs of one family or lineage (`llama.py`, `qwen.py`,
`gemma.py`, ...); `catalogue.py` lists them. The converters in handformer/convert are engines that
read a spec and know no family by name:

- `hf_weights` / `hf_import` read `from_hf_config`, `tensors` and `hf_class`;
- `hf_export` reads `fixed`, `may_set`, `claims`, `to_hf_config` and `problems`;
- `gguf_arch`, `gguf_export` and `gguf_import` read `gguf` (a `GgufEntry`: llama.cpp's view, with
  a `GgufCode` where a family writes and reads GGUF its own way).

Shape legend: D d_model, H heads, Hkv key/value heads, Dh head dim, F d_ff, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from handformer.config import CausalLMConfig, LinearRopeScaling, Llama3RopeScaling

if TYPE_CHECKING:
    from torch import Tensor

# A setting an architecture fixes: CausalLMConfig field -> (its value, why), e.g.
# {"norm": ("rmsnorm", "uses RMSNorm")}; the reason reads after the family's name in messages.
Fixed = dict[str, tuple[Any, str]]


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes. Several keys = split along dim 0 in the listed order,
    with sizes taken from the target shapes. transpose: the source is a Conv1D (in, out) weight.
    stacked: the source holds a layer's experts, (E, ...), and the keys ({e} = expert) take each
    expert's slice (transposed first with `transpose`); interleaved: the keys' rows alternate
    (row r goes to key r % len(keys)) instead of following each other."""

    keys: tuple[str, ...]
    transpose: bool = False
    stacked: bool = False
    interleaved: bool = False
    # the source rotates adjacent pairs (x0, y0, x1, y1, ...) of each head: its rows are reordered
    # to handformer's half-split RoPE (x0, x1, ..., y0, y1, ...) on import, and back on export
    rope_pairs: bool = False


def to(*keys: str) -> Target:
    return Target(keys)


def stacked(*keys: str, transpose: bool = False, interleaved: bool = False) -> Target:
    """A tensor of every expert of a layer (gpt-oss's), dealt out to each expert's `keys`."""
    return Target(keys, transpose, stacked=True, interleaved=interleaved)


def conv1d(*keys: str) -> Target:
    return Target(keys, transpose=True)


def paired(*keys: str) -> Target:
    return Target(keys, rope_pairs=True)


@dataclass(frozen=True)
class HFTensors:
    """A Hugging Face checkpoint's tensor names, as a declarative map onto handformer's."""

    weights: dict[str, Target]  # Hugging Face key template ({i} = layer, {e} = expert) -> handformer key(s)
    ignored: tuple[str, ...]  # key templates of non-weight buffers older checkpoints carry
    base_prefix: str  # prefix of the base model's keys; base-model checkpoints omit it
    embedding: str  # the token embedding's key, which a tied lm_head.weight must equal
    # transformers 5 holds a mixture's experts stacked, (E, ...) per layer, and saves them one by one
    # as checkpoints have them: an in-memory key template -> the checkpoint templates it splits into
    # (each expert's slice split along its dim 0 in the listed order; one template: a rename).
    in_memory: dict[str, tuple[str, ...]] = field(default_factory=dict)
    zero_biases: bool = False  # the architecture always has biases: a run without writes zeros
    # key templates that released checkpoints store as MXFP4 (gpt-oss): `{key}_blocks` (uint8, two
    # 4-bit values a byte) and `{key}_scales` (uint8 exponents), dequantized on import (convert/mxfp4.py)
    mxfp4: tuple[str, ...] = ()
    # the checkpoint may hold layers past num_hidden_layers, skipped (DeepSeek-V3's multi-token prediction)
    extra_layers: bool = False


def no_problems(cfg: CausalLMConfig) -> list[str]:
    return []


def _writes_nothing(writer: Any, cfg: CausalLMConfig) -> None:
    return None


def _reads_nothing(metadata: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    return {}


def _same_state(state: dict[str, Tensor], cfg: CausalLMConfig) -> dict[str, Tensor]:
    return state


@dataclass(frozen=True)
class GgufCode:
    """A family's own GGUF code, in its spec file, where the entry's declarative fields do not reach
    (gpt-oss's window and YaRN, Ministral 3's query scale, DeepSeek-V3's latent attention, Qwen3.5's
    DeltaNet). gguf_arch runs every part after its shared steps; a part left out does nothing.

    Keys: `write` adds the family's keys; `read` turns them back into settings, over the entry's
    fixed ones (a families/gguf_keys.py KeyReader reads them checked); `problems` names what llama.cpp's
    architecture cannot express, each with why; `notes` what export-gguf tells of llama.cpp's run.
    Tensors: `layout` turns one handformer tensor into its GGUF form and back, in place of the
    entry's rope and norm_offset flags; `to_gguf` turns the whole state dict into the tensors the
    entry's map names (a tensor split in two), `from_gguf` turns them back."""

    write: Callable[[Any, CausalLMConfig], None] = _writes_nothing  # (gguf.GGUFWriter, cfg)
    # (metadata, the settings read so far, the file's name) -> settings
    read: Callable[[dict[str, Any], dict[str, Any], str], dict[str, Any]] = _reads_nothing
    problems: Callable[[CausalLMConfig], list[str]] = no_problems
    notes: Callable[[CausalLMConfig], list[str]] = no_problems
    # the key templates ({arch}) `read` reads that import-gguf would otherwise refuse as not
    # implemented (gguf_arch._NOT_IMPLEMENTED)
    reads: tuple[str, ...] = ()
    rope_scalings: tuple[type, ...] = ()  # the rope scalings `write` writes (beside Llama 3's rope_freqs)
    # `write` and `read` write and read the attention's head sizes ({arch}.attention.head_count_kv,
    # .key_length, .value_length) and the RoPE base themselves (DeepSeek-V3's latent heads)
    heads: bool = False
    # (key, tensor, cfg, to_gguf) -> the tensor in GGUF's layout (to_gguf) or back (Qwen3.5's DeltaNet)
    layout: Callable[[str, Tensor, CausalLMConfig, bool], Tensor] | None = None
    # (state dict, cfg) -> the state the entry's map names, and back (DeepSeek-V3's kv_b_proj split per
    # head); each may change the dict it is given
    to_gguf: Callable[[dict[str, Tensor], CausalLMConfig], dict[str, Tensor]] = _same_state
    from_gguf: Callable[[dict[str, Tensor], CausalLMConfig], dict[str, Tensor]] = _same_state


@dataclass(frozen=True)
class GgufEntry:
    """llama.cpp's architecture for a family, declaratively.

    `tensors`: GGUF tensor name ({i} = block) -> the handformer key(s) it holds; several keys are
    joined along dim 0 in that order. `settings`: what the architecture fixes, with why (an export
    checks them, an import builds the config with them). The flags say how the layout differs."""

    arch: str  # general.architecture, llama.cpp's name
    model_type: str  # the Hugging Face model_type an imported run records ("source"), for export-hf
    name: str  # for messages
    tensors: dict[str, tuple[str, ...]]
    settings: Fixed
    rope: str | None = "halves"  # "pairs": q/k rows permuted for llama.cpp's Llama; None: no RoPE
    norm_offset: bool = False  # GGUF holds Gemma's gain 1 + w, handformer stores w
    zero_biases: bool = False  # llama.cpp needs every bias: a run without writes zeros
    rope_freqs: bool = False  # reads Llama 3's per-frequency factors (rope_freqs.weight)
    writes_window: bool = False  # {arch}.attention.sliding_window exists for this family
    full_width_heads: bool = False  # llama.cpp sizes attention as D wide: H * Dh must equal D
    tied_only: bool = False  # the output head is always the embedding
    biases: tuple[str, ...] = field(default=("bias", "qkv_bias"))  # bias settings read from tensors
    # Gemma 2/3: llama.cpp fixes which layers slide: with a window, layer i is global when
    # i % swa_pattern == swa_pattern - 1 (Gemma 2: every second layer, Gemma 3: every sixth)
    swa_pattern: int = 0
    softcaps: bool = False  # Gemma 2: {arch}.attn_logit_softcapping and .final_logit_softcapping
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' RoPE base, fixed in llama.cpp
    writes: frozenset[str] = frozenset()  # today's family settings (_NOT_WRITTEN) the family expresses
    experts: bool = False  # a mixture of experts in every layer ({arch}.expert_count, ...)
    experts_d_ff: bool = False  # the experts are d_ff wide unless the file says otherwise (Mixtral)
    longrope: bool = False  # Phi-3.5 / Phi-4-mini: LongRoPE as rope_factors_short / _long (Dr/2,)
    nope_step: int = 0  # SmolLM3: llama.cpp leaves RoPE out of layer i when (i + 1) % nope_step == 0
    # Granite: {arch}.embedding_scale, .attention.scale, .residual_scale and .logit_scale hold the
    # family section's four multipliers (gguf_arch writes and reads them)
    multipliers: bool = False
    tokenizer_model: str | None = None  # a tokenizer.ggml.model llama.cpp named after this family
    pre_tokenizer: str | None = None  # a tokenizer.ggml.pre this family names
    also_recorded: tuple[str, ...] = ()  # other model_types a run exported here may have recorded
    # EXAONE 4: llama.cpp turns sliding and global layers on (a window, its 32B's pattern) at this
    # depth only, and none below it: a run or file of that depth is refused, the others have no window
    hybrid_layers: int = 0
    # metadata key -> the handformer key ({i} = block) of a number each layer learns, which llama.cpp
    # keeps as an array of one float a layer in the metadata, not as a tensor (Apertus's xIELU)
    layer_values: dict[str, str] = field(default_factory=dict)
    # what llama.cpp stores its own way beyond the flags above: keys, checks, tensor transforms
    code: GgufCode = field(default_factory=GgufCode)

    @property
    def rms(self) -> bool:
        return self.settings.get("norm", ("rmsnorm",))[0] != "layernorm"


Claim = tuple[int, Callable[[CausalLMConfig], bool]]


@dataclass(frozen=True)
class Differences:
    """How a family's model differs from the lesson's decoder-only block, part by part ("-": as
    the lesson's pre-norm RMSNorm, RoPE, grouped-query attention, SwiGLU and plain KV cache)."""

    norm: str = "-"
    positions: str = "-"
    attention: str = "-"
    ffn: str = "-"
    embedding: str = "-"  # the embedding and the output head
    cache: str = "-"  # which positions each layer keeps (sliding windows)


@dataclass(frozen=True)
class FamilySpec:
    """One model family: its names, what its architecture fixes, its config and tensors both ways,
    its llama.cpp entry and its module variants."""

    model_type: str  # Hugging Face's config.json model_type
    name: str  # for people and messages: "Gemma 2"
    hf_class: str  # the transformers class whose checkpoints the tensor map reads
    fixed: Fixed  # settings the architecture fixes, with why; export-hf refuses any other value
    from_hf_config: Callable[[dict[str, Any]], CausalLMConfig]  # config.json -> CausalLMConfig
    to_hf_config: Callable[[CausalLMConfig], dict[str, Any]]  # CausalLMConfig -> config.json's keys
    tensors: HFTensors  # the Hugging Face checkpoint's tensor map
    gguf: GgufEntry | None = None  # llama.cpp's architecture (None: export-gguf picks the nearest)
    position: str = "rope"  # "learned" (GPT-2) or "rope"
    may_set: frozenset[str] = frozenset()  # family settings (hf_export.FAMILY_SETTINGS) it may set
    hf_keys: frozenset[str] = frozenset()  # config.json keys of features only some families have
    layer_types: bool = False  # its Hugging Face model reads `layer_types` (sliding and global layers)
    rope_scalings: tuple[type, ...] = (Llama3RopeScaling, LinearRopeScaling)  # what transformers reads
    problems: Callable[[CausalLMConfig], list[str]] = no_problems  # export-hf's further checks
    # (rank, test): a run trained here (no recorded model_type) exports to the family of the
    # lowest rank whose test holds (hf_export.model_type_for)
    claims: tuple[Claim, ...] = ()
    gguf_fallback: bool = False  # export-gguf's choice for a run whose own family has no entry
    look_alikes: dict[str, str] = field(default_factory=dict)  # near model_types not imported: why
    gguf_unread: dict[str, str] = field(default_factory=dict)  # llama.cpp archs import-gguf refuses: why
    residual_dropout: bool = False  # its config.json carries the residual dropout (resid_pdrop)
    variants: tuple[str, ...] = ()  # module variants of handformer/families its models use
    differences: Differences = field(default_factory=Differences)  # for `handformer families`


__all__ = ["Claim", "Differences", "FamilySpec", "Fixed", "GgufCode", "GgufEntry", "HFTensors",
           "Target", "conv1d", "no_problems", "paired", "stacked", "to"]
