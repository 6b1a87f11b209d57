"""Learner drivers check could not build or drive, now checked: nanoGPT's sample.py loop that draws
num_samples continuations of one prompt (fixtures/learners_nanogpt_sample, run with one sample a
prompt), and d2l's EncoderDecoder(encoder, decoder) whose layers are nn.LazyLinear
(fixtures/learners_d2l_lazy, its lazy layers shaped by a first forward before its weights are
scrambled), and a decoder-only step handed the Hugging Face collator's dict, whose labels are the
input ids and which shifts them itself (fixtures/learners_hf_dict_step); DPO's two parts, each reply's
summed log-probability and the loss of the pairs, against handformer's post-training
(fixtures/learners_dpo); a step that accumulates over a global of its file (grad_accum_steps at the
top, fixtures/learners_global_accum), driven with that many micro-batches. Each correct file passes with the part checked; each plant fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
RUNS = {  # name -> (the file, the kind checked)
    "sample": ("learners_nanogpt_sample/correct.py", "generate"),
    "sample_first_position": ("learners_nanogpt_sample/p_first_position.py", "generate"),
    "d2l_lazy": ("learners_d2l_lazy/correct.py", "transformer"),
    "d2l_lazy_target_not_scaled": ("learners_d2l_lazy/p_target_not_scaled.py", "transformer"),
    "dict_step": ("learners_hf_dict_step/correct.py", "lm_train_step"),
    "dict_step_no_shift": ("learners_hf_dict_step/p_labels_not_shifted.py", "lm_train_step"),
    "dpo_logps": ("learners_dpo/correct.py", "sequence_logps"),
    "dpo_logps_no_shift": ("learners_dpo/p_no_shift.py", "sequence_logps"),
    "dpo_loss": ("learners_dpo/correct.py", "dpo_loss"),
    "dpo_loss_no_beta": ("learners_dpo/p_no_beta.py", "dpo_loss"),
    "global_accum": ("learners_global_accum/correct.py", "lm_train_step"),
    "global_accum_not_divided": ("learners_global_accum/p_not_divided.py", "lm_train_step"),
}


@pytest.fixture(scope="module", params=list(RUNS))
def run(request):
    path, kind = RUNS[request.param]
    result = check_file(str(FIXTURES / path), only=[kind])
    return request.param, result


EXPECTED = {  # name -> (status, the line a finding quotes, or None)
    "sample": ("pass", None),
    "sample_first_position": ("fail", 70),
    "d2l_lazy": ("pass", None),
    "d2l_lazy_target_not_scaled": ("fail", 155),
    "dict_step": ("pass", None),
    "dict_step_no_shift": ("fail", 26),
    "dpo_logps": ("pass", None),
    "dpo_logps_no_shift": ("fail", 11),
    "dpo_loss": ("pass", None),
    "dpo_loss_no_beta": ("fail", 23),
    "global_accum": ("pass", None),
    "global_accum_not_divided": ("fail", 28),
}


def test_driven_and_judged(run):
    name, result = run
    report = format_report(result)
    (comp,) = result.components
    status, line = EXPECTED[name]
    assert comp.status == status, report
    if line is not None:
        assert line in {f.line for f in comp.findings}, report
