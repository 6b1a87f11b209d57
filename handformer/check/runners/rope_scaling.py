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

import functools
import inspect
import math
import re
from types import SimpleNamespace

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import CONFIG_NAMES, Component, cannot_fill
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.rotary import field_value, geometric_base, module_tables, table_frequencies
from handformer.check.core.source import first_line, source_lines, source_text
from handformer.config import LinearRopeScaling, Llama3RopeScaling, RopeScaling, YarnRopeScaling
from handformer.nn.positions import llama3_inv_freq, yarn_inv_freq

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
        values = list(map(defaults.get, names)) + [float(m.group(1)) for m in assigned if m]
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
    res.findings += band_departs(source_lines([comp.obj]), freqs, out, settings)
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


def band_departs(lines: list[tuple[int, str]], freqs: torch.Tensor, got: torch.Tensor,
                 settings: Llama3RopeScaling) -> list[Finding]:
    """Where frequencies scaled from `freqs` (pair j's first) part from Llama 3.1's (compared as ratios
    to each): the first band of wavelengths that departs, at the line of `lines` that writes it; none
    where every band is right."""
    wavelen, context = 2 * math.pi / freqs, settings.original_max_positions  # (F,)
    long, short = wavelen > context / settings.low_freq_factor, wavelen < context / settings.high_freq_factor
    ratio, want = got / freqs, llama3_inv_freq(freqs, settings) / freqs  # (F,) each
    masks = (long, ~long & ~short, short)
    bad = next((i for i, m in enumerate(masks) if fp.max_error(ratio[m], want[m]) >= 1e-6), None)
    if bad is None:
        return []
    (en, zh), patterns = BANDS[bad]
    number, code = first_line(list(patterns), lines)
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


# each known schedule of rotary frequencies past the plain theta^(-2j/Dh), by the type of its settings:
# the frequencies (F,) it makes of the plain ones of a base (Hugging Face's "dynamic" NTK holds the plain
# ones within the original context, the only one check's tables reach)
SCHEDULES = {Llama3RopeScaling: lambda plain, s, base: llama3_inv_freq(plain, s),
             LinearRopeScaling: lambda plain, s, base: plain / s.factor,
             YarnRopeScaling: lambda plain, s, base: yarn_inv_freq(2 * plain.numel(), base, s).double()}
SCHEDULE_WORDS = {Llama3RopeScaling: ("Llama 3.1's", "Llama 3.1 的"), LinearRopeScaling: (
    "linear (position interpolation)", "线性（位置插值）"), YarnRopeScaling: ("YaRN's", "YaRN 的")}
FREQUENCY_NAMES = re.compile("freq|theta", re.I)


def held_frequencies(module: nn.Module, width: int) -> torch.Tensor | None:
    """The width/2 rotary frequencies a module holds, ascending: read back from its tables, else its
    `frequency_buffer`; None where it holds neither."""
    got = table_frequencies(module_tables(module), width)
    return got if got is not None else frequency_buffer(module, width)


def frequency_buffer(module: nn.Module, width: int) -> torch.Tensor | None:
    """The width/2 positive rotary frequencies a module holds as a 1-D buffer or tensor attribute named
    for them (Hugging Face's inv_freq, torchtune's theta), ascending; None where it holds none."""
    named = [pair for sub in module.modules()
             for pair in [*sub.named_buffers(recurse=False), *vars(sub).items()]]
    held = [t for name, t in named if isinstance(t, torch.Tensor) and FREQUENCY_NAMES.search(name)
            and t.dim() == 1 and t.numel() == width // 2 and t.is_floating_point() and bool((t > 0).all())]
    return held[0].double().sort().values if held else None


def scheduled(got: torch.Tensor, module: nn.Module, base: float, width: int) -> RopeScaling | None:
    """The known schedule (settings its config names, else Meta's llama3; linear at the one factor
    that divides every frequency) whose frequencies at this base are the ones held; None where none is."""
    plain = 1.0 / base ** (torch.arange(0, width, 2, dtype=torch.float64) / width)  # (F,)
    ratio = plain.sort().values / got  # (F,): one factor over all of them: linear, read from them
    factor = float(ratio.mean())  # (position interpolation slows every frequency: a factor above 1)
    linear = [LinearRopeScaling(round(factor, 6))] * bool(ratio.std() < 1e-5 * factor and factor > 1)
    candidates = [*_configured(module), *linear]
    return next((s for s in candidates if _same(got, SCHEDULES[type(s)](plain, s, base))), None)


def model_scaling(module: nn.Module, base: float, head_dim: int) -> RopeScaling | None:
    """The scaling of the rotary frequencies that a model's own tables or inv_freq show (llama3, linear,
    YaRN: `SCHEDULES`); None where they are the plain ones of its base, or none explains them."""
    got = held_frequencies(module, head_dim)
    plain = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (F,)
    return None if got is None or _same(got, plain) else scheduled(got, module, base, head_dim)


UNEXPLAINED = text(
    "its rotary frequencies are neither theta^(-2j/d) of one base nor a known scaling of them (linear, "
    "llama3, YaRN at the settings its config names), so the model is not compared; a config with "
    "rope_scaling {\"rope_type\": ..., \"factor\": ...} that names its schedule lets check read them",
    "它的旋转频率既不是某个底数的 theta^(-2j/d)，也不是已知的缩放（线性、llama3、按配置设置的 YaRN），"
    "所以不比较整个模型；在配置里写上 rope_scaling {\"rope_type\": ..., \"factor\": ...} 说明它的方案，"
    "check 就能读出")


def unexplained(module: nn.Module, base: float, head_dim: int) -> bool:
    """Whether a model holds rotary frequencies that are neither those of one base (the plain ones, or
    rope_wrong_base's another) nor a known schedule's: nothing check can compare them with."""
    got = held_frequencies(module, head_dim)
    return got is not None and got.numel() > 1 and geometric_base(got) is None and model_scaling(
        module, base, head_dim) is None


def _same(got: torch.Tensor, freqs: torch.Tensor) -> bool:
    """Whether the frequencies read back (ascending) are these, to float32's precision."""
    return bool(torch.allclose(got, freqs.sort().values, rtol=1e-4, atol=0))


def _configured(module: nn.Module) -> list[RopeScaling]:
    """The scaling settings the config of a module of the model (or its rope_scaling dict, or the module
    itself: torchtune's self.scale_factor) names, each known schedule at them, then Meta's llama3."""
    configs = [getattr(sub, "config", None) for sub in module.modules()]
    holders = [*configs, *map(lambda config: field_value(config, "rope_scaling"), configs), *module.modules()]
    return [*filter(None, (kind(h) for h in holders for kind in KINDS)), Llama3RopeScaling()]


def _named(holder: object, names: dict[str, tuple[str, ...]], kind: type) -> RopeScaling | None:
    """`kind` at the settings a config or a dict names under `names` (its defaults for the others); None
    where it names no factor."""
    values = {field: _number(holder, keys) for field, keys in names.items()}
    named = {field: value for field, value in values.items() if value is not None}
    return kind(**named) if "factor" in named else None


# the settings of each schedule that a config or a dict may name: Llama 3.1's, position interpolation's
# factor, YaRN's factor, original context and betas (transformers' defaults for the betas)
YARN_NAMES = {"factor": SETTINGS["factor"], "original_max_positions": SETTINGS["original_max_positions"],
              "beta_fast": ("beta_fast",), "beta_slow": ("beta_slow",)}
_settings_in = functools.partial(_named, names=SETTINGS, kind=Llama3RopeScaling)
_linear_in = functools.partial(_named, names={"factor": SETTINGS["factor"]}, kind=LinearRopeScaling)
_yarn_in = functools.partial(_named, names=YARN_NAMES, kind=YarnRopeScaling)


KINDS = (_settings_in, _linear_in, _yarn_in)
# the schedule a rope_scaling dict names by its rope_type (or type)
NAMED = {"llama3": Llama3RopeScaling, "linear": LinearRopeScaling, "yarn": YarnRopeScaling}
OWN_SETTINGS = {"low_freq_factor": "llama3", "beta_fast": "yarn"}  # a setting that only one schedule has


def named_schedule(module: nn.Module) -> RopeScaling | None:
    """The schedule a module's file names by its rope_type (a rope_scaling dict of its config, else a
    quoted "llama3", "linear" or "yarn" in its source, else a setting only one schedule has, held by
    one of its modules), at the settings its configs name; None where none names a known one."""
    dicts = [field_value(getattr(sub, "config", None), "rope_scaling") for sub in module.modules()]
    types = [str(field_value(d, "rope_type") or field_value(d, "type")) for d in dicts if isinstance(d, dict)]
    types += re.findall(r"[\"'](llama3|linear|yarn)[\"']", source_text(inspect.getmodule(type(module))))
    types += [name for sub in module.modules() for setting, name in OWN_SETTINGS.items()
              if hasattr(sub, setting)]
    kind = next((NAMED[t] for t in types if t in NAMED), None)
    return next((s for s in _configured(module) if type(s) is kind), None)


def _number(holder: object, names: tuple[str, ...]) -> float | None:
    """The first number (no bool) that the holder gives under one of these names."""
    return next(filter(lambda x: type(x) in (int, float), map(lambda n: field_value(holder, n), names)), None)


def scaling_words(s: RopeScaling) -> Text:
    """A model's scaling of its rotary frequencies, as its convention says it."""
    said = schedule_words(s)
    return text(f"; {said['en']}, read from the frequencies it holds", f"；{said['zh']}，从它保存的频率读出")


def schedule_words(s: RopeScaling) -> Text:
    """A schedule of rotary frequencies and its settings, in words."""
    en, zh = SCHEDULE_WORDS[type(s)]
    shown = ", ".join(f"{SHOWN.get(f, f)} {getattr(s, f):g}" for f in SHOWN_FIELDS[type(s)])
    return text(f"{en} rotary frequency scaling ({shown})", f"{zh}旋转频率缩放（{shown}）")


# the settings of each schedule a report shows, and the names it shows them by
SHOWN_FIELDS = {Llama3RopeScaling: ("factor", "low_freq_factor", "high_freq_factor",
                                    "original_max_positions"),
                LinearRopeScaling: ("factor",),
                YarnRopeScaling: ("factor", "original_max_positions", "beta_fast", "beta_slow")}
SHOWN = {"original_max_positions": "original context"}
