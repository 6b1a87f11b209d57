"""Losses and training steps graded in their own form (runners/loss.py, core/objective.py).

- A next-token loss that shifts its labels itself (logits[:, :-1] against labels[:, 1:]) and reads its
  own ignore id (-100, Hugging Face's labels) is handed one position more and its padding so marked:
  F.cross_entropy with ignore_index and a hand-written masked NLL pass; a mean over the batch and a
  normaliser counting every target FAIL named.
- A training step whose objective reads more than logits and targets (chosen and rejected replies, a
  beta, an odds ratio) is NOT CHECKED naming what it reads, never compared with a next-token step: an
  odds-ratio objective on one batch of 2B rows and a length-normalised one on two batches; an
  off-by-one causal mask beside them FAILs named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
FILES = {
    "learners_shifted_losses/hf_labels.py": ["loss"],
    "learners_shifted_losses/hf_labels_batch_mean.py": ["loss"],
    "learners_shifted_losses/masked_nll.py": ["loss"],
    "learners_shifted_losses/masked_nll_every_target.py": ["loss"],
    "learners_preference_steps/odds_ratio.py": ["causal_mask", "lm_train_step"],
    "learners_preference_steps/odds_ratio_mask.py": ["causal_mask", "lm_train_step"],
    "learners_preference_steps/length_normalised.py": ["causal_mask", "train_step"],
    "learners_preference_steps/length_normalised_mask.py": ["causal_mask", "train_step"],
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kinds in FILES.items():
        result = check_file(str(FIXTURES / name), only=kinds)
        out[name.rpartition("/")[2]] = ({c.kind: c for c in result.components}, format_report(result))
    return out


@pytest.mark.parametrize("name", ["hf_labels.py", "masked_nll.py"])
def test_a_loss_that_shifts_and_ignores_minus_100_itself_passes(results, name):
    parts, report = results[name]
    assert parts["loss"].status == "pass", report
    assert "it shifts the labels itself" in report and "(-100, Hugging Face's labels)" in report


@pytest.mark.parametrize(("name", "mistake", "line"), [("hf_labels_batch_mean.py", "loss_mean_over_batch", 13),
                                                      ("masked_nll_every_target.py", "loss_counts_padding", 12)])
def test_its_catalogued_mistakes_fail_named(results, name, mistake, line):
    parts, report = results[name]
    assert [(f.name, f.line) for f in parts["loss"].findings] == [(mistake, line)], report


@pytest.mark.parametrize(("name", "kind", "reads"), [("odds_ratio.py", "lm_train_step", "chosen, rejected, beta, odds"),
                                                     ("length_normalised.py", "train_step", "chosen, rejected, beta")])
def test_a_preference_objectives_step_is_not_checked_naming_what_it_reads(results, name, kind, reads):
    parts, report = results[name]
    step = parts[kind]
    assert step.status == "not_checked" and not step.findings, report
    assert f"its objective reads {reads}: a preference objective" in step.error.message, report
    assert f"它的目标函数读取了 {reads.replace(', ', '、')}" in step.error.message_zh
    assert parts["causal_mask"].status == "pass", report


@pytest.mark.parametrize("name", ["odds_ratio_mask.py", "length_normalised_mask.py"])
def test_a_mistake_beside_the_preference_step_fails_named(results, name):
    parts, report = results[name]
    assert [f.name for f in parts["causal_mask"].findings] == ["causal_off_by_one"], report
