"""A loop's settings handed as one object of the learner's own class (vLLM's `SamplingParams`, a
dataclass of sampling `args`): the class of its file whose fields hold every attribute the loop reads
from that argument, built at its defaults with the count check asks for and every setting that has a
neutral value set to it (a penalty 0, a repetition penalty 1); the settings of no role check knows,
left at a value that is not neutral (Mirostat's tau and eta), are what the reference has no place for
and are named (`unmapped`).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
from typing import Any

from handformer.check.core.argument_names import (
    CONTEXT_NAMES,
    COUNT_NAMES,
    EOS_NAMES,
    GENERATOR_NAMES,
    K_NAMES,
    MIN_P_NAMES,
    P_NAMES,
    PAD_NAMES,
    SAMPLE_SWITCH_NAMES,
    TEMPERATURE_NAMES,
)
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import DiscoveryError
from handformer.check.core.loop_forms import name_of, nodes_of, walked
from handformer.check.core.result import Text, text
from handformer.check.core.source import config_reads

# a setting's neutral value: the one at which it leaves the plain loop's computation as it is (classifier-free
# guidance at scale 1: the conditional pass alone)
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
           "length_penalty": 1.0, "no_repeat_ngram_size": 0, "min_tokens": 0, "min_new_tokens": 0,
           "diversity_penalty": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
           "guidance_scale": 1.0, "cfg_scale": 1.0}
# the settings of the loop's own kind: given by check (the count, the EOS) or read as it reads them
KNOWN = {*COUNT_NAMES, *EOS_NAMES, *TEMPERATURE_NAMES, *SAMPLE_SWITCH_NAMES, *K_NAMES, *P_NAMES,
         *MIN_P_NAMES, *GENERATOR_NAMES, *CONTEXT_NAMES, *PAD_NAMES, "seed", "random_seed", "top_k",
         "num_samples", "num_return_sequences", "n", "stop", "stop_token_ids", "logprobs", "device",
         "alpha", "penalty_alpha"}  # (contrastive search's degeneration penalty: its own runner's)


def options_class(fn: Any, name: str) -> type | None:
    """The one class of fn's file (no module) whose constructor takes every attribute fn reads from
    its argument `name`; None where fn reads none from it or no single class holds them all."""
    attrs = config_reads(fn, name)[1] or row_reads(fn, name)
    module = vars(sys.modules.get(getattr(fn, "__module__", ""), types))  # (none: a module of no classes)
    own = [c for c in module.values() if isinstance(c, type) and c.__module__ == fn.__module__
           and not hasattr(c, "forward") and attrs <= {*_defaults(c), *_defaults(c, required=True)}]
    return own[0] if len(own) == 1 and attrs else None


def row_reads(fn: Any, name: str) -> set[str]:
    """The attributes fn reads off the items of its argument `name`: `name[i].attr`, or `p.attr` of
    the `p` a loop over it gives (`for i, p in enumerate(name)`) or `p = name[i]` binds: settings
    handed one a prompt."""
    loops = [n.target for n in nodes_of(fn, ast.For, ast.comprehension) if name_of(walked(n.iter)) == name]
    bound = [n.targets for n in nodes_of(fn, ast.Assign) if _indexes(n.value, name)]  # settings = name[i]
    items = {name_of([target, *getattr(target, "elts", [])][-1]) for target in loops + sum(bound, [])}
    reads = nodes_of(fn, ast.Attribute)
    held = {n.attr for n in reads if _indexes(n.value, name)}  # name[i].attr
    return {n.attr for n in reads if name_of(n.value) in items - {""}} | held


def per_row(fn: Any, name: str) -> bool:
    """Whether fn takes its settings one a prompt, as a list of objects (vLLM's list of SamplingParams)."""
    return not config_reads(fn, name)[1] and bool(row_reads(fn, name))


def _indexes(node: ast.AST, name: str) -> bool:
    """`name[...]`."""
    return (type(node), name_of(getattr(node, "value", None))) == (ast.Subscript, name)


def option_fields(fn: Any) -> list[str]:
    """The settings of the options objects of the learner's own class that fn reads (`options_class`)."""
    names = quietly(lambda: list(inspect.signature(fn).parameters), (TypeError, ValueError), [])
    return [field for name in names for field in _defaults(options_class(fn, name) or object)]


def _defaults(cls: Any, required: bool = False) -> dict[str, Any]:
    """The constructor's arguments with their defaults (a dataclass's fields); with `required`, those
    with none instead."""
    params = quietly(lambda: inspect.signature(cls).parameters.values(), (TypeError, ValueError), ())
    return {p.name: p.default for p in params
            if (p.default is p.empty) is required and p.kind is p.POSITIONAL_OR_KEYWORD}


def settings(defaults: dict[str, Any], given: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Each setting's value: the one check gives by name (the count: `given` by alias), else its neutral
    one, else its default; with the settings left at another value that no role of the loop's covers
    ("mirostat_tau=5.0"), and those set to their neutral value."""
    values = {n: given.get(n.lower(), NEUTRAL.get(n.lower(), v)) for n, v in defaults.items()}
    left = [f"{n}={v!r}" for n, v in values.items() if n.lower() not in KNOWN | NEUTRAL.keys()
            and isinstance(v, (int, float)) and not isinstance(v, bool) and v]
    neutral = [f"{n}={v!r}" for n, v in values.items() if n.lower() in NEUTRAL.keys() - given.keys()]
    return values, left, neutral


def build_options(cls: type, given: dict[str, Any]) -> tuple[Any, list[str], list[str]]:
    """An instance of the learner's class at `settings`' values, with what it left and set neutral; a
    setting it requires that check gives no value and that has no neutral one: NOT CHECKED, named."""
    required = [n for n in _defaults(cls, required=True) if n.lower() not in given.keys() | NEUTRAL.keys()]
    if required:
        raise DiscoveryError(
            f"{cls.__name__} requires {', '.join(required)}, a setting handformer's loop has no place for "
            "and no neutral value of: write an adapter that builds it with the value you mean",
            zh=f"{cls.__name__} 必须给出 {', '.join(required)}，handformer 的生成循环没有对应的设置，"
               "也没有中性取值：请写一个适配函数，用你想要的取值构造它")
    every = {**dict.fromkeys(_defaults(cls, required=True)), **_defaults(cls)}
    values, left, neutral = settings(every, given)
    return cls(**values), left, neutral


def signature_settings(fn: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """The loop's own arguments with a default (generate(..., repetition_penalty=1.2)): the neutral
    values to hand by name (lower-cased), what it left and set neutral. Of its own arguments only a
    float is a setting left (a sampler's tau, eta): an int is a size the kind's runners read by their
    own names (attention sinks' n_sink, a window), a count. A default that is neutral by its use
    (`neutral_by_use`) is not left: it is said with those set neutral."""
    defaults = _defaults(fn)
    _, left, neutral = settings(dict(filter(_float_setting, defaults.items())), {})
    kept = neutral_by_use(fn, defaults)
    neutral += [f"{n}={defaults[n]!r}" for n in kept]
    left = [said for said in left if said.split("=")[0] not in kept]
    return {n.lower(): NEUTRAL[n.lower()] for n in defaults if n.lower() in NEUTRAL}, left, neutral


# an operation -> the value of an operand that leaves the other as it is
IDENTITY = {ast.Mult: 1, ast.Div: 1, ast.Add: 0, ast.Sub: 0}


def neutral_by_use(fn: Any, defaults: dict[str, Any]) -> list[str]:
    """The float arguments of no role check knows whose default is the identity of every operation fn's
    code applies them in (a repetition penalty of 1.0 that only divides or multiplies, however the
    argument is spelled): at that value it leaves the computation as it is. A use of any other kind
    (handed to a call, compared) leaves it out."""
    empty = ast.Module(body=[], type_ignores=[])
    tree = quietly(lambda: ast.parse(textwrap.dedent(inspect.getsource(fn))), Exception, empty)
    nodes = list(ast.walk(tree))
    operands = {id(getattr(node, side, None)): IDENTITY.get(type(node.op), "other") for node in nodes
                if isinstance(node, (ast.BinOp, ast.AugAssign)) for side in ("left", "right", "value")}
    uses: dict[str, set[Any]] = {}
    for node in filter(lambda n: isinstance(n, ast.Name) and n.id in defaults, nodes):
        uses.setdefault(node.id, set()).add(operands.get(id(node), "other"))
    return [n for n, ids in uses.items() if type(defaults[n]) is float and ids == {defaults[n]}
            and n.lower() not in KNOWN | NEUTRAL.keys()]  # (a float first: a default may be unhashable)


def _float_setting(item: tuple[str, Any]) -> bool:
    return isinstance(item[1], float)


OBJECT = ("its settings object {}", "它的设置对象 {} ")
ARGUMENTS = ("its arguments", "它的参数")


def unmapped_words(holder: tuple[str, str], left: list[str]) -> list[Text]:
    """The reason naming the settings (of a `holder`: OBJECT, ARGUMENTS) that the reference has no
    place for, left at their values (none where there are none)."""
    kept = ", ".join(left)
    return [text(f"{holder[0]} holds settings handformer's loop has no place for ({kept}), left at your "
                 "values",
                 f"{holder[1]}里有 handformer 的生成循环没有对应的设置（{kept}），保持你的取值"),
            ] * bool(left)


def neutral_words(holder: tuple[str, str], neutral: list[str]) -> list[Text]:
    """The note on the settings set to the value that leaves the plain loop as it is (none where none)."""
    off = ", ".join(neutral)
    return [text(f"checked with {holder[0]} at {off}: their neutral values, at which the loop is the plain "
                 "one; other values not checked",
                 f"检查时{holder[1]}取 {off}：这是中性取值，此时它就是普通的生成循环；其他取值没有检查"),
            ] * bool(neutral)
