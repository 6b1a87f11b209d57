"""check's searches stop once their answer is decided, and answer as they did searching on: the beam
runner's search for one mistake that explains each difference (runners/beam.py) searches no scenario
after one whose answer is neither handformer's nor the mistake's. The reference is replaced by a table
of answers, so each test runs no model."""

from __future__ import annotations

from handformer.check.runners import beam

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
