"""The temperature of a sampling loop (`generate(model, idx, max_new_tokens, temperature=1.0)`):
driven once more for one new token at temperature TEMPERATURE (its switch to sampling on, minGPT's
do_sample=True), its model's logits handed as the model gives them (not made certain), and
`torch.multinomial` answering the likeliest token while it records the probabilities it was handed.
Those must be softmax(logits / TEMPERATURE) on the tokens the loop keeps (its filters may drop some:
compared after renormalising on the kept ones, in the order of their size, so that a loop that
samples from them sorted compares too). A loop that samples
otherwise (Gumbel noise, argmax at its default) is not probed.

Shape legend: B prompts, V vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from handformer.check.core.argument_names import SAMPLE_SWITCH_NAMES, TEMPERATURE_NAMES
from handformer.check.core.context import Context, forward_names, forward_parameters
from handformer.check.core.options_object import option_fields
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines

TEMPERATURE = 0.5
VOCAB = 24  # the stand-in model's vocabulary (generate_loop builds it; generate_top_p hands it as top-k)
# True while a loop is probed: its model's logits handed as the model gives them; CENTRED where they must
# take both signs (their median subtracted, not their largest)
SOFT: list[bool | str] = [False]
CENTRED = "centred"


def shifted(logits: Tensor) -> Tensor:
    """The logits less their largest (the likeliest at 0), or less their median where SOFT is CENTRED
    (a repetition penalty's rule differs by the sign of a logit); the last dimension the vocabulary."""
    if SOFT[0] == CENTRED:
        return logits - logits.median(-1, keepdim=True).values
    return logits - logits.amax(-1, keepdim=True)


@contextlib.contextmanager
def recorded_draws(seen: list[Tensor], soft: list[bool]) -> Iterator[None]:
    """torch.multinomial (and Tensor.multinomial) recording their probabilities and answering the
    likeliest token; the model's logits left soft meanwhile."""
    def draw(probs: Tensor, num_samples: int = 1, *args: Any, **kwargs: Any) -> Tensor:
        seen.append(probs.detach().double().clone())
        return probs.argmax(-1, keepdim=True).expand(*probs.shape[:-1], num_samples)

    soft[0] = True
    try:
        with mock.patch.object(torch, "multinomial", draw), \
                mock.patch.object(torch.Tensor, "multinomial", draw):
            yield
    finally:
        soft[0] = False


class Afresh:
    """A loop's driver whose every new model (each return style run_generate tries) clears the draws
    recorded: those of the try that ran are the ones read (a try that raised after a draw, such as an
    unbatched loop handed (1, T, V) logits, leaves none)."""

    def __init__(self, driver: Any, seen: list[Tensor]) -> None:
        self.driver, self.seen = driver, seen

    def new_model(self, style: str, budget: int) -> Any:
        self.seen.clear()
        return self.driver.new_model(style, budget)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)


def kept_gap(probs: Tensor, logits: Tensor) -> float:
    """The largest difference of the two as log-probabilities of the tokens the loop kept (its m
    largest probabilities; Meta's sample_top_p samples from them sorted), each renormalised there."""
    m = int((probs > 0).sum(-1).min())
    mine = probs.sort(-1, descending=True).values[:, :m].log().log_softmax(-1)
    theirs = logits.sort(-1, descending=True).values[:, :m].log_softmax(-1)
    return float((mine - theirs).abs().max())


def sampling_on(fn: Any) -> dict[str, bool]:
    """The loop's switch to sampling turned on, where it has one off by default (minGPT's
    do_sample=False takes the argmax, and its temperature would go unseen)."""
    return {p.name: True for p in forward_parameters(fn)
            if p.name.lower() in SAMPLE_SWITCH_NAMES and p.default is False}


def check_temperature(res: ComponentResult, ctx: Context, comp: Any, driver: Any, short: Any,
                      run_generate: Any) -> None:
    """The probe of the module docstring, when the loop takes a temperature and samples with
    torch.multinomial (generate_loop's run_generate runs it); a difference is named in the form the
    probabilities take."""
    names = forward_names(comp.obj) + option_fields(comp.obj)  # its arguments, or its settings object's
    # by the aliases' order: "temperature" before "tau" (Mirostat's target surprise)
    name = next((n for alias in TEMPERATURE_NAMES for n in names if n.lower() == alias), None)
    if name is None:
        return
    seen: list[Tensor] = []
    B, as_list = short.prompt.size(0), short.as_list
    with recorded_draws(seen, SOFT):
        options = {name: TEMPERATURE, **sampling_on(comp.obj)}
        run = run_generate(ctx, comp, Afresh(driver, seen), 1, B, as_list, options)
        # the logits its model handed the loop (a lossy cache's, as computed), else the full forward's
        outputs = getattr(run.model, "outputs", None)
        logits = (outputs[0] if outputs else driver.logits(run.prompt)[:, -1]).double()  # (B, V)
    if not seen or seen[0].shape[-1] != logits.size(-1):  # it never sampled, or sampled a subset
        return
    # its draws' first rows: one draw of every prompt, or each prompt's own draw in turn (a loop that runs
    # each through the model on its own)
    probs = torch.cat([s.reshape(-1, logits.size(-1)) for s in seen])[: logits.size(0)]
    gap = kept_gap(probs, logits / TEMPERATURE)
    res.checks.append(Check(text(f"{name}={TEMPERATURE}: the probabilities it samples from are "
                                 f"softmax(logits / {TEMPERATURE}) on the tokens it keeps",
                                 f"{name}={TEMPERATURE}：它采样用的概率是保留的 token 上的 softmax(logits / "
                                 f"{TEMPERATURE})"), gap < 1e-4,
                            text(f"largest difference of the log-probabilities {gap:.3g}",
                                 f"对数概率最大相差 {gap:.3g}")))
    if gap >= 1e-4:
        _named_form(res, ctx, comp, name, probs, logits)


def _named_form(res: ComponentResult, ctx: Context, comp: Any, name: str, probs: Tensor, logits: Tensor,
                ) -> None:
    """The catalogued mistake whose distribution the loop samples from, if one is: the logits
    multiplied by the temperature, or the temperature applied after the softmax (which the draw's
    renormalising undoes: softmax(logits), as at t = 1)."""
    forms = (("temperature_multiplied", logits * TEMPERATURE, f"softmax(logits * {TEMPERATURE})",
              f"softmax(logits * {TEMPERATURE})"),
             ("temperature_after_softmax", logits, "softmax(logits), as at t = 1",
              "softmax(logits)，相当于 t = 1"))
    for diagnosis, alternative, en, zh in forms:
        if kept_gap(probs, alternative) < 1e-4:
            number, code = locate(diagnosis, source_lines([comp.obj]))  # the loop's own lines first
            if number is None:
                number, code = locate(diagnosis, source_lines(ctx.objects(comp, "sample", "temperature")))
            said = text(f"at {name}={TEMPERATURE} your loop samples from {en}",
                        f"{name}={TEMPERATURE} 时你的循环从 {zh} 采样")
            res.findings.append(Finding(diagnosis, said, number, code))
            return
