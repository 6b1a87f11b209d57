"""Logits processors in Hugging Face's style (`transformers/generation/logits_process.py`), whatever
their names: a class whose `__call__(input_ids, scores)` returns the new scores and whose constructor
takes one filter's setting by its name (`TopKLogitsWarper(top_k, filter_value, min_tokens_to_keep)`).
Each is checked as that filter, through a function of the logits that builds the class with the
setting and calls it; and a sampling step that takes a list of processors
(`sample_next_token(logits, processors)`) is handed an empty one.

Shape legend: B rows, V vocabulary.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.argument_names import (
    EPSILON_NAMES,
    ETA_NAMES,
    K_NAMES,
    MIN_P_NAMES,
    P_NAMES,
    TEMPERATURE_NAMES,
    TOP_A_NAMES,
    TYPICAL_NAMES,
    call_parameters,
    named,
    names_of,
)
from handformer.check.core.defaults import quietly

# a processor's setting by its name -> the filter it is checked as
SETTINGS = {"temperature": TEMPERATURE_NAMES, "top_k": K_NAMES, "top_p": P_NAMES, "min_p": MIN_P_NAMES,
            # Hugging Face's RepetitionPenaltyLogitsProcessor(penalty): it reads the ids it is handed
            "repetition_penalty": ("penalty", "repetition_penalty", "rep_penalty", "repeat_penalty"),
            # Hugging Face's EpsilonLogitsWarper(epsilon) and EtaLogitsWarper(epsilon): one setting's name
            # for two filters, told apart by the word of the class's name (Eta, Epsilon)
            "epsilon_cut": EPSILON_NAMES, "eta_cut": ETA_NAMES, "top_a": TOP_A_NAMES,
            "typical": TYPICAL_NAMES}  # Hugging Face's TypicalLogitsWarper(mass)
READS_IDS = ("repetition_penalty",)  # the filters whose function takes the ids after the logits
# what a processor's second argument is called (not a plain x: a layer's `__call__(self, ctx, x)`)
SCORES_NAMES = ("scores", "logits", "logit", "next_token_scores", "next_token_logits")
# a sampling step's list of processors (Hugging Face's logits_processor / logits_warper)
PROCESSOR_NAMES = ("processors", "processor", "logits_processor", "logits_processors", "logits_warper",
                   "logits_warpers", "warpers", "warper", "processor_list")


class NoProcessors(list):
    """An empty list of processors that, as Hugging Face's LogitsProcessorList, can be called too:
    `processors(input_ids, scores)` returns the scores as they are."""

    def __call__(self, input_ids: Any, scores: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return scores


def processor_setting(cls: Any) -> tuple[str, str]:
    """(the filter, its argument's name) of a processor class: its own `__call__` (or one of a base of
    its file) takes the ids and then the scores, and its constructor takes exactly one filter's
    setting and requires nothing else; ("", "") for any other class."""
    names = [p.name.lower() for p in call_parameters(own_call(cls), ("self",))]
    if len(names) < 2 or names[1] not in SCORES_NAMES:
        return NONE
    # a constructor of C with no signature to read: no settings, no processor of the learner's
    params = quietly(lambda: call_parameters(cls.__init__, ("self",)), ValueError, [])
    names, required = names_of(params)
    found = [(kind, name) for kind, aliases in SETTINGS.items() if (name := named(names, aliases))]
    words = {w.lower() for w in re.findall(r"[A-Z]?[a-z]+", cls.__name__)}
    found = [f for f in found if f[0].split("_")[0] in words] if len(found) > 1 else found
    return found[0] if len(found) == 1 and set(required) <= {found[0][1]} else NONE


NONE = ("", "")  # no processor


def own_call(cls: Any) -> Any:
    """The `__call__` a class of the learner's file defines, or inherits from a class of that file
    (else a function of no arguments)."""
    return own_method(cls, "__call__")


def own_method(cls: Any, name: str) -> Any:
    """The method `name` a class of the learner's file defines, or inherits from a class of that file
    (else a function of no arguments)."""
    method = inspect.getattr_static(cls, name, _nothing)  # a class's own or inherited: a plain function
    return method if inspect.isfunction(method) and method.__module__ == cls.__module__ else _nothing


def _nothing() -> None:
    """What a class with no `__call__` of the learner's has in its place: no parameters."""


def as_filter(cls: Any, setting: str, kind: str = "") -> type:
    """A callable `(scores, <setting>)` that builds the processor with that setting and calls it on
    ids (B, 1) of zeros and the scores: the processor as a filter's runner calls one; for a filter
    that reads the ids (READS_IDS: a repetition penalty), `(scores, input_ids, <setting>)`. It is a
    class named and placed as the learner's (its source, its file: what a report quotes and a traced
    run follows) whose `__new__` returns the filtered scores; its own code stays handformer's, so a
    traced run (localize.py) starts in the learner's `__call__`."""

    def new(_: type, scores: Tensor, **settings: Any) -> Tensor:
        return cls(**settings)(_zero_ids(scores), scores)

    def new_with_ids(_: type, scores: Tensor, input_ids: Tensor, **settings: Any) -> Tensor:
        return cls(**settings)(input_ids, scores)

    reads = kind in READS_IDS
    given = inspect.Parameter.POSITIONAL_OR_KEYWORD
    names = ("scores", *("input_ids",) * reads, setting)
    return posing_as(cls, (new, new_with_ids)[reads], inspect.Signature([inspect.Parameter(n, given)
                                                                          for n in names]))


def posing_as(cls: Any, new: Any, signature: inspect.Signature) -> type:
    """A class named and placed as `cls` (its module, qualified name and docstring: what a report
    quotes and a traced run follows) whose `__new__` is `new` and whose signature is `signature`."""
    names = {k: getattr(cls, k) for k in ("__module__", "__qualname__", "__doc__")}
    return type(cls.__name__, (), {**names, "__new__": new, "__signature__": signature})


def _zero_ids(scores: Tensor) -> Tensor:
    """The ids a processor is handed with the scores: (B, 1) zeros (a filter does not read them)."""
    return torch.zeros(*scores.shape[:-1], 1, dtype=torch.long)
