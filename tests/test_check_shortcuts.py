"""check's shortcuts answer as the long way does. The beam runner's search for one mistake that
explains each difference (runners/beam.py) searches no scenario after one whose answer is neither
handformer's nor the mistake's (the reference replaced by a table of answers: no model runs). The
reference's calls of the learner's own encoder-decoder (runners/beam_own.py) hook no module for the
decoder's states while the output layer is handed every position at once, and record them from the
first call that hands it rows alone: the same log-probabilities either way."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from handformer.check.core.sizes import SIZES
from handformer.check.runners import beam
from handformer.check.runners.beam_own import OwnSteered
from handformer.check.runners.model import TGT_V

RIGHT, GOT = [1, 3, 2], [1, 4, 2]  # handformer's answer, and the learner's where it differs


def answering(monkeypatch, answers, asked):
    """beam.reference replaced: scenario -> (its answer without mistakes, its answer with any one);
    each scenario searched is recorded in `asked`."""
    def reference(model, memory, K, steps, alpha, conv, flags=frozenset()):
        asked.append(model)
        plain, with_mistake = answers[model]
        return with_mistake if flags else plain
    monkeypatch.setattr(beam, "reference", reference)


def test_no_scenario_is_searched_after_one_that_answers_neither(monkeypatch):
    asked = []
    answering(monkeypatch, {"a": (RIGHT, RIGHT), "b": (RIGHT, GOT)}, asked)
    outcomes = {"a": ("a", None, GOT), "b": ("b", None, GOT)}  # "a": neither answer is the learner's
    assert beam._explains_each_difference(outcomes, 11, [1.0]) is None
    assert set(asked) == {"a"}, asked


def test_a_mistake_that_explains_every_difference_is_still_found(monkeypatch):
    asked = []
    answering(monkeypatch, {"a": (RIGHT, GOT), "b": (RIGHT, RIGHT)}, asked)
    outcomes = {"a": ("a", None, GOT), "b": ("b", None, RIGHT)}  # the mistake's in "a", handformer's in "b"
    conv, alpha, combo = beam._explains_each_difference(outcomes, 11, [1.0])
    assert (conv, alpha, combo) == (next(iter(beam.CONVENTIONS)), 1.0, beam._combos(1)[0])
    assert set(asked) == {"a", "b"}


class Decoder(nn.Module):
    """A tiny decoder: its output layer is handed (N, L, D) at once, or each position's rows alone."""

    def __init__(self, rows_alone: bool):
        super().__init__()
        torch.manual_seed(0)
        D = SIZES["d_model"]
        self.embed, self.mix, self.out = nn.Embedding(TGT_V, D), nn.Linear(D, D), nn.Linear(D, TGT_V)
        self.rows_alone = rows_alone

    def forward(self, src, tgt):
        h = self.mix(self.embed(tgt)).cumsum(1)  # (N, L, D)
        if self.rows_alone:
            return torch.stack([self.out(h[:, i]) for i in range(h.size(1))], 1)  # (N, L, V)
        return self.out(h)  # (N, L, V)


def steered(module: nn.Module) -> OwnSteered:
    return OwnSteered(module, module, beam.SCENARIOS["long"], None, None, None)


@pytest.mark.parametrize("rows_alone", [False, True])
def test_the_reference_hooks_the_states_only_once_rows_come_alone(monkeypatch, rows_alone):
    src, prefixes = torch.tensor([[5, 7, 9]]), [(3, 5), (4, 5)]
    always = steered(Decoder(rows_alone))
    always.reference_reads_rows = True  # the long way: the states recorded in every call
    right = always.batch_logprobs(src, prefixes)
    states = []
    monkeypatch.setattr(OwnSteered, "_states", lambda self, *a: states.append(1))
    model = steered(Decoder(rows_alone))
    got = [model.batch_logprobs(src, prefixes), model.batch_logprobs(src, prefixes)]
    assert got == [right, right]
    assert model.reference_reads_rows == rows_alone and bool(states) == rows_alone
