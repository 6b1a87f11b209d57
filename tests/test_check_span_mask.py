"""T5's span-corruption noise mask is judged by what every mask must hold (its noise count, its number
of spans, non-noise first and noise last), in two forms: a NumPy function handed its settings, and a
PyTorch collator's method, built with its settings (its class, named as a language model ends, is no
model to check). Each planted mistake FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_span_mask"
CORRECT = ("t5_numpy", "collator")
PLANTED = {"t5_numpy_truncated": "found 8 of 57, not 9", "collator_noise_first": "noise tokens (found 17 of 20"}


@pytest.fixture(scope="module")
def results():
    only = ["span_noise_mask", "gpt", "transformer"]  # a collator named ...MLM ends as a model's name does
    return {name: check_file(str(HERE / f"{name}.py"), only=only) for name in (*CORRECT, *PLANTED)}


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_noise_mask_passes_as_a_function_or_a_collator_s_method(results, name):
    (comp,) = results[name].components
    assert comp.kind == "span_noise_mask" and comp.status == "pass", format_report(results[name])


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_mistake_in_the_noise_mask_fails(results, name):
    (comp,) = results[name].components
    assert comp.status == "fail" and PLANTED[name] in format_report(results[name]), format_report(results[name])
