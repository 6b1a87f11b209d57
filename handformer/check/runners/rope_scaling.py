"""Llama 3.1's scaling of the rotary frequencies (Meta's `apply_scaling(freqs)`, Hugging Face's rope_type
"llama3"): a frequency whose wavelength 2 pi / f is longer than old_context_len / low_freq_factor
turns scale_factor times slower, one shorter than old_context_len / high_freq_factor is kept, and in
between the two are blended, (1 - smooth) * f / scale_factor + smooth * f with smooth =
(old_context_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).

The function is handed the frequencies of a Llama 3 head (Dh = 128, base 500000: every band holds
some) and compared with handformer's `llama3_inv_freq` at the settings it writes: its arguments'
defaults, else the values its own lines assign to Meta's names, else Meta's (8, 1, 4, 8192).

Shape legend: F frequencies (Dh / 2).
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import CONFIG_NAMES, Component, cannot_fill
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.rotary import module_tables, table_frequencies
from handformer.check.core.source import first_line, source_lines, source_text
from handformer.config import Llama3RopeScaling
from handformer.nn.positions import llama3_inv_freq

# each setting of Llama3RopeScaling, by the names Meta's and Hugging Face's code give it
SETTINGS = {"factor": ("scale_factor", "factor", "scaling_factor"),
            "low_freq_factor": ("low_freq_factor",), "high_freq_factor": ("high_freq_factor",),
            "original_max_positions": ("old_context_len", "original_max_position_embeddings",
                                       "original_context_len", "original_max_positions")}


def frequencies() -> torch.Tensor:
    """A Llama 3 head's rotary frequencies (F,) = 500000^(-2j/128)."""
    return 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)


def written_settings(fn: object) -> Llama3RopeScaling:
    """The settings the function writes: a default of its arguments, else a number its lines assign to
    the name, else Meta's."""
    defaults = {p.name: p.default for p in forward_parameters(fn) if isinstance(p.default, (int, float))}
    source = source_text(fn)
    found = {}
    for field, names in SETTINGS.items():
        assigned = (re.search(rf"^\s*{n}\s*=\s*([\d.]+)\s*(#|$)", source, re.M) for n in names)
        values = [defaults.get(n) for n in names] + [float(m.group(1)) for m in assigned if m]
        found[field] = next((v for v in values if v is not None), getattr(Llama3RopeScaling, field))
    return Llama3RopeScaling(**found)


def check_rope_scaling(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    rest = [p.name for p in forward_parameters(comp.obj)[1:] if p.default is p.empty]
    configs = set(rest) & set(CONFIG_NAMES)  # apply_llama3_scaling(freqs, config)
    cannot_fill(comp.name, [*filter(lambda name: name not in configs, rest)], (), [comp.name], "freqs", (
        "the scaling takes the frequencies alone, its settings with defaults or written inside",
        "缩放只接收频率，设置要么有默认值，要么写在函数里"))
    freqs = frequencies()
    settings = Llama3RopeScaling() if configs else written_settings(comp.obj)  # handed: Meta's
    handed = {p.name: _meta_dict(settings) for p in forward_parameters(comp.obj)[1:]  # gpt-fast's
              if p.default is None and "scal" in p.name}  # apply_rope_scaling(freqs, rope_scaling=None)
    handed |= dict.fromkeys(configs, Settings(**_meta_dict(settings), rope_scaling=_meta_dict(settings)))
    out = torch.as_tensor(ctx.learner.call("forward", comp.obj, freqs.clone(), **handed)).double()
    err = res.max_abs_error = fp.max_error(out / freqs, llama3_inv_freq(freqs, settings) / freqs)
    res.notes.append(_settings_note(settings, bool(configs)))
    res.checks.append(Check(text("a Llama 3 head's 64 frequencies: the long wavelengths divided by the scale "
                                 "factor, the short ones kept, those between blended as Llama 3.1's "
                                 "(compared as the ratio to each frequency)",
                                 "Llama 3 一个头的 64 个频率：长波长的除以缩放系数，短波长的保持不变，"
                                 "中间的按 Llama 3.1 的方式插值（按与原频率之比比较）"),
                            err < 1e-6, error_text(err)))
    res.findings += _band_departs(comp, out / freqs, llama3_inv_freq(freqs, settings) / freqs, settings)
    return finish(res)


# each band of wavelengths (long, between, short), in words and the lines that write its frequencies:
# Meta's `freq / scale_factor` (none of the blend's words), the blend `(1 - smooth) * ...`, the kept one
BANDS = (
    (("longer than old_context_len / low_freq_factor (divided by the scale factor)",
      "长于 old_context_len / low_freq_factor（除以缩放系数）"),
     (r"^(?!.*smooth)(?!.*_freq_factor).*\bfreq\w*\s*[*/]\s*[\w.]*factor\b",)),
    (("between the two bounds (blended)", "介于两个界限之间（插值）"),
     (r"\(\s*1\.?0?\s*-\s*smooth", r"smooth\w*\s*\*", r"smooth\w*\s*=")),
    (("shorter than old_context_len / high_freq_factor (kept)",
      "短于 old_context_len / high_freq_factor（保持不变）"),
     (r"high_freq_wavelen",)),
)


def _band_departs(comp: Component, got: torch.Tensor, want: torch.Tensor, settings: Llama3RopeScaling,
                  ) -> list[Finding]:
    """Where the scaled frequencies (as ratios to each frequency) part from Llama 3.1's: the first band
    of wavelengths that departs, at the line that writes it; none where every band is right."""
    wavelen, context = 2 * math.pi / frequencies(), settings.original_max_positions  # (F,)
    long, short = wavelen > context / settings.low_freq_factor, wavelen < context / settings.high_freq_factor
    masks = (long, ~long & ~short, short)
    bad = next((i for i, m in enumerate(masks) if fp.max_error(got[m], want[m]) >= 1e-6), None)
    if bad is None:
        return []
    (en, zh), patterns = BANDS[bad]
    number, code = first_line(list(patterns), source_lines([comp.obj]))
    return [Finding(DEPARTS, text(f"the frequencies whose wavelength is {en} are not Llama 3.1's",
                                  f"波长{zh}的那些频率与 Llama 3.1 的不同"), number, code)]


def _settings_note(settings: Llama3RopeScaling, handed: bool) -> Text:
    """The settings it was compared at: read from its code, or handed in a config (Meta's)."""
    shown = (f"scale_factor {settings.factor:g}, low_freq_factor {settings.low_freq_factor:g}, "
             f"high_freq_factor {settings.high_freq_factor:g}, "
             f"old_context_len {settings.original_max_positions:g}")
    if handed:
        return text(f"settings handed in its config (Meta's): {shown}",
                    f"通过 config 传入的设置（Meta 的）：{shown}")
    return text(f"settings read from your code: {shown}", f"从你的代码读出的设置：{shown}")


def _meta_dict(settings: Llama3RopeScaling) -> dict[str, float | str]:
    """The settings as a Hugging Face config's rope_scaling dict, every name of SETTINGS a key."""
    values = {name: getattr(settings, field) for field, names in SETTINGS.items() for name in names}
    return {**values, "rope_type": "llama3"}


class Settings(SimpleNamespace):
    """A config handed to a scaling that reads its settings from one: each name of SETTINGS (and
    rope_scaling, a dict of them) as an attribute or a key."""

    def __getitem__(self, name: str) -> object:
        return getattr(self, name)


def model_scaling(module: nn.Module, base: float, head_dim: int) -> Llama3RopeScaling | None:
    """Llama 3.1's scaling that a model's own rotary tables show: their frequencies are llama3_inv_freq
    of base^(-2j/Dh) at the settings its config names (factor, low_freq_factor, ..., or a rope_scaling
    dict), else at Meta's; None where they are the plain ones, or no settings explain them."""
    got = table_frequencies(module_tables(module), head_dim)
    plain = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (F,)
    if got is None or _same(got, plain):
        return None
    return next((s for s in _configured(module) if _same(got, llama3_inv_freq(plain, s))), None)


def _same(got: torch.Tensor, freqs: torch.Tensor) -> bool:
    """Whether the frequencies read back (ascending) are these, to float32's precision."""
    return bool(torch.allclose(got, freqs.sort().values, rtol=1e-4, atol=0))


def _configured(module: nn.Module) -> list[Llama3RopeScaling]:
    """The scaling settings the config of a module of the model (or its rope_scaling dict) names, then
    Meta's."""
    configs = [getattr(sub, "config", None) for sub in module.modules()]
    holders = [*configs, *map(lambda config: _value(config, "rope_scaling"), configs)]
    return [*filter(None, map(_settings_in, holders)), Llama3RopeScaling()]


def _settings_in(holder: object) -> Llama3RopeScaling | None:
    """The settings a config or a dict names (Meta's for those it does not); None where it names no factor."""
    values = {field: _number(holder, names) for field, names in SETTINGS.items()}
    named = {field: value for field, value in values.items() if value is not None}
    return Llama3RopeScaling(**named) if "factor" in named else None


def _number(holder: object, names: tuple[str, ...]) -> float | None:
    """The first number (no bool) that the holder gives under one of these names."""
    return next(filter(lambda x: type(x) in (int, float), map(lambda n: _value(holder, n), names)), None)


def _value(obj: object, name: str) -> object:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def scaling_words(s: Llama3RopeScaling) -> Text:
    """A model's Llama 3.1 scaling, as its convention says it."""
    shown = (f"factor {s.factor:g}, low_freq_factor {s.low_freq_factor:g}, "
             f"high_freq_factor {s.high_freq_factor:g}, original context {s.original_max_positions:g}")
    return text(f"; Llama 3.1's rotary frequency scaling, read from its tables ({shown})",
                f"；Llama 3.1 的旋转频率缩放，从它的表读出（{shown}）")
