"""YaRN in GGUF, both ways, as llama.cpp reads it ({arch}.rope.scaling.*), for the families whose
`GgufEntry` says `yarn` (Ministral 3).

llama.cpp turns the frequencies as transformers' rope_type "yarn" does with the ramp's ends
rounded to whole dims (`truncate`), and multiplies cos and sin by

    mscale(factor)                                   with no yarn_log_multiplier,
    mscale(factor) / mscale(factor, multiplier)      with one (it takes the checkpoint's mscale as 1),

times rope.scaling.attn_factor (1 when absent), where mscale(f, m) = 0.1 m ln(f) + 1. transformers
takes attention_factor when set, else mscale(f, mscale) / mscale(f, mscale_all_dim) when both are
set, else mscale(f). So the export writes the multiplier as mscale_all_dim where transformers uses
it (as convert_hf_to_gguf.py does for Ministral 3), and rope.scaling.attn_factor for what remains
of the run's factor (an attention_factor of its own, an mscale other than 1). The run's own
mscale, mscale_all_dim and attention_factor go in handformer.yarn.* too, so an import gives the
run's settings back; a file without them (llama.cpp's converter's) is read as llama.cpp reads it.
"""

from __future__ import annotations

import math
from typing import Any

import gguf

from handformer.config import CausalLMConfig, YarnRopeScaling
from handformer.settings import is_int, is_number

EXACT = ("mscale", "mscale_all_dim", "attention_factor")  # kept as handformer.yarn.{name}
EXACT_KEYS = {name: f"handformer.yarn.{name}" for name in EXACT}
READ_HERE = (gguf.Keys.Rope.SCALING_TYPE, gguf.Keys.Rope.SCALING_FACTOR)  # gguf_arch leaves these to us


def llama_cpp_factor(factor: float, multiplier: float) -> float:
    """What llama.cpp multiplies cos and sin by before rope.scaling.attn_factor."""
    mscale = YarnRopeScaling.mscale_of
    return mscale(factor) / mscale(factor, multiplier) if multiplier else mscale(factor)


def _multiplier(s: YarnRopeScaling) -> float:
    return s.mscale_all_dim if s.mscale and s.mscale_all_dim else 0.0


def yarn_problems(cfg: CausalLMConfig, name: str) -> list[str]:
    s = cfg.rope_scaling
    if isinstance(s, YarnRopeScaling) and not s.truncate:
        return [f"rope_scaling.truncate=False (llama.cpp's {name} rounds YaRN's ramp to whole dims)"]
    return []


def write_yarn(writer: Any, cfg: CausalLMConfig) -> None:
    """The YaRN keys of a run with YaRN (none without)."""
    s = cfg.rope_scaling
    if not isinstance(s, YarnRopeScaling):
        return
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(s.factor)
    writer.add_rope_scaling_orig_ctx_len(s.original_max_positions)
    writer.add_rope_scaling_yarn_beta_fast(s.beta_fast)
    writer.add_rope_scaling_yarn_beta_slow(s.beta_slow)
    multiplier = _multiplier(s)
    if multiplier:
        writer.add_rope_scaling_yarn_log_mul(multiplier)
    rest = s.cos_sin_factor() / llama_cpp_factor(s.factor, multiplier)
    if rest != 1.0:
        writer.add_rope_scaling_attn_factors(rest)
    for name, key in EXACT_KEYS.items():
        if getattr(s, name) is not None:
            writer.add_float64(key, getattr(s, name))


def _number(metadata: dict[str, Any], key: str, where: str, default: float) -> float:
    value = metadata.get(key, default)
    if not is_number(value) or not value >= 0:
        raise ValueError(f"{where}: {key}={value!r} must be a number >= 0")
    return float(value)


def read_yarn(metadata: dict[str, Any], arch: str, max_positions: int, where: str) -> YarnRopeScaling | None:
    """The file's YaRN (None when it has no rope scaling), as llama.cpp computes with it."""
    k = lambda template: template.format(arch=arch)  # noqa: E731
    kind = metadata.get(k(gguf.Keys.Rope.SCALING_TYPE), "none")
    factor = _number(metadata, k(gguf.Keys.Rope.SCALING_FACTOR), where, 0.0)
    if kind == "none" or (kind == "linear" and factor in (0.0, 1.0)):  # llama.cpp: "linear" by 1 = none
        return None
    if kind != "yarn":
        raise ValueError(f"{where} has {k(gguf.Keys.Rope.SCALING_TYPE)}={kind!r}: rope scaling of that type, "
                         f"which import-gguf does not read for {arch} (it reads 'yarn')")
    ext = k(gguf.Keys.Rope.SCALING_YARN_EXT_FACTOR)
    if metadata.get(ext, 1.0) != 1.0:
        raise ValueError(f"{where} has {ext}={metadata[ext]!r}: YaRN blended other than by its ramp, which "
                         "import-gguf does not read")
    original = metadata.get(k(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN), max_positions)  # llama.cpp: the context
    if not is_int(original) or original <= 0:
        raise ValueError(f"{where}: {k(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN)}={original!r} must be a positive "
                         "integer")
    multiplier = _number(metadata, k(gguf.Keys.Rope.SCALING_YARN_LOG_MUL), where, 0.0)
    rest = _number(metadata, k(gguf.Keys.Rope.SCALING_ATTN_FACTOR), where, 1.0)
    common = dict(factor=factor, original_max_positions=original,
                  beta_fast=_number(metadata, k(gguf.Keys.Rope.SCALING_YARN_BETA_FAST), where, 32.0),
                  beta_slow=_number(metadata, k(gguf.Keys.Rope.SCALING_YARN_BETA_SLOW), where, 1.0))
    mscales = {"mscale": 1.0, "mscale_all_dim": multiplier} if multiplier else {}
    own = llama_cpp_factor(factor, multiplier) * rest if rest != 1.0 else None
    read = YarnRopeScaling(**common, **mscales, attention_factor=own)
    exact = {name: metadata[key] for name, key in EXACT_KEYS.items() if key in metadata}
    if exact:  # the run's own settings, when they give what llama.cpp computes from its keys
        ours = YarnRopeScaling(**common, **exact)
        if math.isclose(ours.cos_sin_factor(), read.cos_sin_factor(), rel_tol=1e-6):
            return ours
    return read


__all__ = ["EXACT_KEYS", "READ_HERE", "llama_cpp_factor", "read_yarn", "write_yarn", "yarn_problems"]
