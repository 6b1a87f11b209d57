"""The numbers a layer or model takes from its settings where handformer's reference has none.

Some families scale q·kᵀ by a value their config names: Granite's `attention_multiplier`, a
`softmax_scale` argument (Gemma 2's `query_pre_attn_scalar` is a size check sets: the head's width).
Such a scale is a convention to
read, not a mistake: the attention is compared at it. A factor nobody configured (`/ head_dim`,
`/ math.sqrt(d_model)`, a forgotten `/ sqrt(d_k)`) is not one: only a number the module holds (or a
field of a config it holds), that its forward reads by name, and that its constructor sets from a
setting of its config or arguments which is no size counts. The same reading gives a block's
residual multiplier (Granite's `residual_multiplier`) and a model's factors on its embeddings and
logits (`embedding_multiplier`, `logits_scaling`, Cohere's `logit_scale`): each is compared as
configured, never a factor found alone.
"""

from __future__ import annotations

import inspect
import math
import re
from collections import ChainMap
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from handformer.check.core.discovery import WIDTH_WORDS, size_of
from handformer.check.core.result import Text, text
from handformer.check.core.sizes import D, is_number
from handformer.check.core.source import source_text
from handformer.check.core.weights import leaves, of_kind

# the words of a name that says a size (a width, a count, a length) or a setting that is no factor (a
# dropout, an epsilon, a rotary base, a window): never a scale's setting
NOT_FACTORS = WIDTH_WORDS | {"head", "heads", "embd", "model", "vocab", "layers", "len", "length", "seq", "d",
                             "k", "dropout", "drop", "eps", "epsilon", "p", "prob", "rate", "theta", "base",
                             "window", "idx", "index", "id", "pdrop", "std", "range", "layer"}
# the settings a documented family divides by, where every other configured factor multiplies
# (handformer.families.granite's ScaledHead: the logits / logits_scaling)
DIVIDED_BY = {"logits_scaling": -1}  # the power of the setting's value that multiplies
ASSIGNED = re.compile(r"self\.(\w+)\s*=\s*([^\n#]+)")  # self.NAME = what it is set from
# register_buffer("NAME", what it is set from)
REGISTERED = re.compile(r"register_buffer\(\s*[\"'](\w+)[\"']\s*,\s*([^\n#]+)")


def _scalar(value: Any) -> Any:
    """A one-number floating tensor (a buffer, a parameter) as its number; anything else as it is."""
    single = isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point()
    return float(value.detach()) if single else value


def configured_scales(module: nn.Module) -> tuple[float, ...]:
    """The factors a module may apply from its settings: the values of `configured_settings`."""
    return tuple(sorted(set(configured_settings(module).values())))


def configured_settings(module: nn.Module) -> dict[str, float]:
    """name -> value of each positive number its forward reads by name that the module holds, set in
    its constructor from a setting (`self.scaling = config.attention_multiplier`, `cfg.x ** -0.5`; a
    one-number tensor too, a buffer registered so or a parameter: `torch.tensor(logit_scale)`), or
    that a config it holds has (Granite's
    `logits / self.config.logits_scaling`); none that says a size or another kind of setting."""
    cls = type(module)
    words = set(re.findall(r"\w+", source_text(getattr(cls, "forward", cls))))
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    held = _configs(module)  # a config, a namespace
    init = source_text(cls.__init__)
    own = {name: _scalar(getattr(module, name, None)) for name, rhs in [*ASSIGNED.findall(init),
                                                                        *REGISTERED.findall(init)]
           if _from_a_setting(rhs, params)}
    return {name: float(value) for name, value in ChainMap(own, *held).items() if _factor(name, value, words)}


def _from_a_setting(expression: str, params: list[str]) -> bool:
    """Whether an expression reads an argument of the constructor (`config.X`, or `X`) and no name
    that says a size (`self.head_dim`, `config.hidden_size`) but the layer count a depth scale divides
    by (`cfg.scale_depth / math.sqrt(cfg.n_layers)`, μP's); an argument read as itself (Cohere's
    `self.logit_scale = logit_scale`) is a setting, a layer count alone (`config.n_layers`) is not."""
    names = set(re.findall(r"[A-Za-z_]\w*", expression))
    counts = set(filter(_layer_count, names))
    holders = set(re.findall(r"([A-Za-z_]\w*)\s*\.", expression))  # `config` in `config.n_layers`
    return bool(names & set(params)) and not set(filter(_says_a_size, names)) - counts and bool(
        names - holders - counts)


def _says_a_size(name: str) -> bool:
    return size_of(name) is not None or bool(set(name.lower().split("_")) & NOT_FACTORS - {"p", "id"})


def _factor(name: str, value: Any, words: set[str]) -> bool:
    """A positive number under a name among `words` (its forward's) that says neither a size nor a
    setting of another kind."""
    return name in words and is_number(value) and value > 0 and not set(name.lower().split("_")) & NOT_FACTORS


def model_factors(module: nn.Module) -> list[float]:
    """The factors a model's code may apply from its settings, in any of its own classes: each
    setting's value, or its inverse for a setting a documented family divides by (DIVIDED_BY); and
    μP's base width over the model's, check's d_model (MiniCPM's logits / (hidden_size / dim_model_base))."""
    own = [sub for sub in module.modules() if type(sub).__module__.startswith("learner_")]
    return [v ** DIVIDED_BY.get(name, 1) for sub in own for name, v in configured_settings(sub).items()] + [
        base / D for sub in own for base in _held(sub, BASE_WIDTH.fullmatch)]


def _configs(module: nn.Module) -> list[dict[str, Any]]:
    """The attributes of each object with attributes the module holds (a config, a namespace)."""
    return [vars(v) for v in vars(module).values() if hasattr(v, "__dict__")]


def _held(module: nn.Module, test: Any) -> set[float]:
    """The positive numbers the module, or a config it holds, keeps under a name `test` accepts."""
    return {float(v) for name, v in ChainMap(vars(module), *_configs(module)).items()
            if test(name) and is_number(v) and v > 0}


# a μP base width (MiniCPM's dim_model_base, a base_width): "base" and a width word
BASE_WIDTH = re.compile(r"(?i)(?=(.*_)?base(_|$))(?=(.*_)?(dim|width|size|hidden)(_|$)).*")


def _layer_count(name: str) -> bool:
    return size_of(name) == "n_layers"


@dataclass(frozen=True)
class Form:
    """The numbers a layer takes from its settings where the reference has none (Granite's
    attention_multiplier in place of 1/sqrt(d_k), its residual_multiplier on each pre-norm sublayer's
    output): conventions searched as readings, the plain layer first."""

    scale: float | None = None  # the attention's scores times this (configured_scales of the attention)
    residual: float = 1.0  # each sublayer's output times this before the add (the layer's configured_scales)


PLAIN = Form()  # a layer that takes no number from its settings


def layer_forms(module: nn.Module, attn: list[Any]) -> list[Form]:
    """The plain form, then each configured scale of the attention (the smallest submodule holding
    its projections `attn`, slots) with each configured number of the layer itself as the residual
    multiplier, or that number over the square root of the layer count it holds (MiniCPM's
    scale_depth / sqrt(num_hidden_layers))."""
    holder = smallest_holder(module, {id(s.leaf.module) for s in attn if s.leaf.kind == "linear"}) or module
    scales = configured_scales(holder) * (holder is not module)
    residuals = set(configured_scales(module)) - set(scales)
    residuals |= {r / math.sqrt(n) for r in residuals for n in _held(module, _layer_count)}  # MiniCPM's
    return [Form(scale, residual) for scale in (None, *scales) for residual in (1.0, *sorted(residuals))]


def smallest_holder(module: nn.Module, linears: set[int]) -> nn.Module | None:
    """The smallest submodule whose linear layers are exactly `linears` (their modules' ids), or None."""
    subs = sorted(module.modules(), key=lambda m: len(list(m.modules())))
    return next((m for m in subs if {id(leaf.module) for leaf in of_kind(leaves(m), "linear")} == linears),
                None)


def scale_note(scale: float) -> Text:
    """The report's note on an attention compared at its configured scale."""
    return text(f"the scores are scaled by {scale:g}, a value your constructor takes from its settings "
                "(Granite's attention_multiplier), not by 1/sqrt(d_k): a convention, compared so",
                f"分数乘以 {scale:g}，这是你的构造函数从配置里读出的值（Granite 的 attention_multiplier），"
                "不是 1/sqrt(d_k)：这是约定，按它比较")
