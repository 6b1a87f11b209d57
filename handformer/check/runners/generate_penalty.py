"""The repetition penalty of a generation loop (`generate(..., repetition_penalty=1.1)`): check's other
runs hand it 1, where the penalty and its catalogued mistakes compute the same. Here the loop is driven
once more for one new token at penalty PENALTY, on prompts that repeat a token, its model's logits
handed as the model gives them (not made certain), with `torch.argmax` and `torch.multinomial`
recording the scores they are handed. Those must be CTRL's rule (Hugging Face's
RepetitionPenaltyLogitsProcessor, runners/repetition.py) on the prompt's tokens: compared as
log-probabilities on the tokens the loop keeps, so that a loop that subtracts the largest logit or
filters compares too. A loop that leaves the first step's logits as they are (one that penalizes only
the tokens it generated) is not probed: nothing there says which rule it follows. The logits are handed
less their median, so that seen tokens take both signs; a departure is named where one catalogued form
alone fits.

Shape legend: B prompts, L prompt length, V vocabulary.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from handformer.check.core.argument_names import TEMPERATURE_NAMES, named
from handformer.check.core.context import Context, forward_names
from handformer.check.core.options_object import option_fields
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines
from handformer.check.runners.generate_temperature import CENTRED, SOFT, Afresh, kept_gap, sampling_on
from handformer.check.runners.repetition import FORMS, penalized

PENALTY = 1.5
NAMES = ("repetition_penalty", "rep_penalty", "repeat_penalty")
REPEATED = torch.tensor([[3, 17, 3], [11, 2, 11]])  # (B, L): each prompt repeats its first token


@contextlib.contextmanager
def recorded_scores(seen: list[Tensor], vocab: int) -> Iterator[None]:
    """torch.argmax (and Tensor.argmax) recording, as probabilities, the (B, V) scores a greedy loop
    picks from and answering as ever; torch.multinomial recording its probabilities and answering the
    likeliest token; the model's logits left soft meanwhile (generate_temperature's SOFT)."""
    original = torch.argmax

    def pick(scores: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if scores.shape[1:] == (vocab,):  # (B, V)
            seen.append(scores.detach().double().softmax(-1))
        return original(scores, *args, **kwargs)

    def draw(probs: Tensor, num_samples: int = 1, *args: Any, **kwargs: Any) -> Tensor:
        seen.append(probs.detach().double().clone())
        return original(probs, -1, keepdim=True).expand(*probs.shape[:-1], num_samples)

    SOFT[0] = CENTRED  # seen logits of both signs: the rule and its mistakes differ by sign
    try:
        with mock.patch.object(torch, "argmax", pick), mock.patch.object(torch.Tensor, "argmax", pick), \
                mock.patch.object(torch, "multinomial", draw), \
                mock.patch.object(torch.Tensor, "multinomial", draw):
            yield
    finally:
        SOFT[0] = False


def _options(comp: Any, name: str) -> dict[str, Any]:
    """The penalty at PENALTY; a temperature the loop takes at 1 (the rule is read on the logits)."""
    names = forward_names(comp.obj) + option_fields(comp.obj)
    at_one = {n: 1.0 for n in names if n.lower() in TEMPERATURE_NAMES}
    return {name: PENALTY, **at_one, **sampling_on(comp.obj)}


def check_repetition_penalty(res: ComponentResult, ctx: Context, comp: Any, driver: Any, short: Any,
                             run_generate: Any) -> None:
    """The probe of the module docstring, when the loop takes a repetition penalty (generate_loop's
    run_generate runs it); a difference is named in the catalogued form the scores take."""
    names = forward_names(comp.obj) + option_fields(comp.obj)
    name = named(names, NAMES)
    if name is None:
        return
    seen: list[Tensor] = []
    B = short.prompt.size(0)
    prompt = REPEATED[:B]
    with recorded_scores(seen, driver.logits(prompt).size(-1)), \
            mock.patch.object(inspect.getmodule(run_generate), "prompts", lambda b: REPEATED[:b]):
        run = run_generate(ctx, comp, Afresh(driver, seen), 1, B, short.as_list, _options(comp, name))
        logits = driver.logits(run.prompt)[:, -1].double()  # (B, V)
    probs = _first(seen, logits)
    if probs.size(0) < B or kept_gap(probs, logits) < 1e-4:  # no pick seen, or nothing penalized
        return
    gap = kept_gap(probs, penalized(logits, prompt, PENALTY))
    res.checks.append(Check(text(f"{name}={PENALTY} on prompts that repeat a token: each prompt token's "
                                 "positive logit divided by it, a negative one multiplied, once per token",
                                 f"{name}={PENALTY}，提示词里有重复的 token：提示词里每个 token 的正 logit "
                                 "被除、负 logit 被乘，每个 token 只罚一次"), gap < 1e-4,
                            text(f"largest difference of the log-probabilities {gap:.3g}",
                                 f"对数概率最大相差 {gap:.3g}")))
    found = [d for d, (form, _, _) in FORMS.items()
             if kept_gap(probs, penalized(logits, prompt, PENALTY, form)) < 1e-4]
    for diagnosis in found * (gap >= 1e-4) * (len(found) == 1):  # a form only where no other fits
        _, en, zh = FORMS[diagnosis]
        number, code = locate(diagnosis, source_lines([comp.obj]))
        said = text(f"at {name}={PENALTY}: {en}", f"{name}={PENALTY} 时：{zh}")
        res.findings.append(Finding(diagnosis, said, number, code))


def _first(seen: list[Tensor], logits: Tensor) -> Tensor:
    """The first pick of every prompt: one (B, V) pick, or each prompt's own in turn."""
    rows = [s.reshape(-1, logits.size(-1)) for s in seen]
    return torch.cat([logits[:0], *rows])[: logits.size(0)]
