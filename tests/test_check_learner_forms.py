"""Loops driven in the form the learner's file hands them (tests/fixtures/learners_finish_reason/):

- a sampler that returns its tokens beside why it stopped, an API's finish_reason ("stop" or
  "length"), is read as its tokens: a list of one prompt's new ids (over a model of the file's own)
  and a (B, T + n) tensor (over a model that returns `.logits`); each checked, and a planted
  mistake in each fails;
- a function that reads its settings off an argument of no name check knows (`cfg.group_size`,
  `args.num_generations`) is handed an object that answers them (core/settings_argument.py): the
  file's own dataclass, or a namespace at the file's argparse defaults, with check's group size; each
  checked and said, and a planted mistake in each fails at its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures"
# name: (folder, fixture, edits)
CASES = {
    "api_sampler": ("learners_finish_reason", "api_sampler", ()),
    "api_sampler_first": ("learners_finish_reason", "api_sampler", (("[0, -1, :]", "[0, 0, :]"),)),
    "reason_loop": ("learners_finish_reason", "reason_loop", ()),
    "reason_loop_prepended": ("learners_finish_reason", "reason_loop",
                              (("[input_ids, next_ids]", "[next_ids, input_ids]"),)),
    "dr_grpo_config": ("learners_settings_argument", "dr_grpo_config", ()),
    "dr_grpo_config_across": ("learners_settings_argument", "dr_grpo_config", (("mean(dim=1", "mean(dim=0"),)),
    "grpo_args": ("learners_settings_argument", "grpo_args", ()),
    "grpo_args_summed": ("learners_settings_argument", "grpo_args", (("grouped.mean(dim=-1", "grouped.sum(dim=-1"),)),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner_forms")
    return {name: check_file(planted_copy(folder, name, FIXTURES / where / f"{fixture}.py", *edits))
            for name, (where, fixture, edits) in CASES.items()}


@pytest.mark.parametrize("name", ["api_sampler", "reason_loop"])
def test_a_loop_that_says_why_it_stopped_is_checked_and_passes(results, name):
    loop = results[name].components[-1]
    assert loop.status == "pass", format_report(results[name])


@pytest.mark.parametrize(("name", "line"), [("api_sampler_first", "[0, 0, :]"),
                                            ("reason_loop_prepended", "[next_ids, input_ids]")])
def test_a_planted_loop_that_says_why_it_stopped_fails_at_its_line(results, name, line):
    loop = results[name].components[-1]
    report = format_report(results[name])
    assert loop.status == "fail", report
    assert line in report, report


@pytest.mark.parametrize(("name", "said"), [("dr_grpo_config", "cfg: handed Config at your file's values"),
                                            ("grpo_args", "args: handed a namespace at your file's values")])
def test_an_argument_read_for_settings_is_handed_an_object_that_answers_them(results, name, said):
    (advantages,) = results[name].components
    assert advantages.status == "pass", format_report(results[name])
    notes = [n["en"] for n in advantages.notes]
    assert any(said in n for n in notes), notes
    assert any("check 有对应设置处" in n["zh"] for n in advantages.notes)


@pytest.mark.parametrize(("name", "line"), [("dr_grpo_config_across", "grouped.mean(dim=0, keepdim=True)"),
                                            ("grpo_args_summed", "mean = grouped.sum(dim=-1, keepdim=True)")])
def test_a_planted_mistake_behind_a_settings_argument_fails_at_its_line(results, name, line):
    (advantages,) = results[name].components
    report = format_report(results[name])
    assert advantages.status == "fail", report
    assert line in report, report
