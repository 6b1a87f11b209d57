"""Loops driven in the form the learner's file hands them (tests/fixtures/learners_finish_reason/):

- a sampler that returns its tokens beside why it stopped, an API's finish_reason ("stop" or
  "length"), is read as its tokens: a list of one prompt's new ids (over a model of the file's own)
  and a (B, T + n) tensor (over a model that returns `.logits`); each checked, and a planted
  mistake in each fails;
- a function that reads its settings off an argument of no name check knows (`cfg.group_size`,
  `args.num_generations`) is handed an object that answers them (core/settings_argument.py): the
  file's own dataclass, or a namespace at the file's argparse defaults, with check's group size; each
  checked and said, and a planted mistake in each fails at its line;
- a word-level BPE (an end-of-word marker written in its code or held in a constant of its file)
  whose trainer takes a count by a name of no role (`num_symbols`, `n_operations`: the merges) and
  whose class is built from the merges or their ranks, its encode giving subword strings, is graded
  on its pieces (runners/bpe_words.py); a planted encode or decode fails, a decode that gives the words
  back otherwise at the line that handles the end marker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.runners.bpe import parameter_role

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
    "symbols_class": ("learners_word_bpe_class", "symbols_class", ()),
    "symbols_class_latest": ("learners_word_bpe_class", "symbols_class", (("_, best = min(pairs)", "_, best = max(pairs)"),)),
    "symbols_class_spaced": ("learners_word_bpe_class", "symbols_class",
                             (("return ''.join(pieces).replace('</w>', ' ')", "return ' '.join(pieces).replace('</w>', '')"),)),
    "ranks_class": ("learners_word_bpe_class", "ranks_class", ()),
    "ranks_class_joined": ("learners_word_bpe_class", "ranks_class", (('.replace(EOW, " ")', '.replace(EOW, "")'),)),
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


@pytest.mark.parametrize("name", ["symbols_class", "ranks_class"])
def test_a_word_bpe_class_that_gives_subword_strings_is_graded_on_its_pieces(results, name):
    trainer, codec = results[name].components
    assert (trainer.status, codec.status) == ("pass", "pass"), format_report(results[name])
    assert any("encode gives each of" in c.name["en"] for c in codec.checks), format_report(results[name])


@pytest.mark.parametrize(("name", "mistake", "line"), [
    ("symbols_class_latest", "bpe_encode_merge_order", "_, best = max(pairs)"),
    ("ranks_class_joined", None, 'return "".join(pieces).replace(EOW, "").rstrip()'),
    ("symbols_class_spaced", None, "return ' '.join(pieces).replace('</w>', '').strip()")])
def test_a_planted_word_bpe_class_fails(results, name, mistake, line):
    codec = results[name].components[-1]
    report = format_report(results[name])
    assert codec.status == "fail", report
    assert mistake is None or mistake in [f.name for f in codec.findings], report
    assert line in report, report


def _counted(text, num_symbols, min_frequency=2):
    return text, num_symbols, min_frequency


def _parallel(input_path, vocab_size, num_processes):
    return input_path, vocab_size, num_processes


def test_a_count_by_its_name_is_the_merges_only_where_the_trainer_takes_no_other_count():
    """`num_symbols` of a trainer that takes no vocab_size or num_merges is its number of merges;
    `num_processes` beside a vocab_size is not (it stays unfilled: NOT CHECKED, never a count of merges)."""
    roles = {fn.__name__: [parameter_role(p, i == 0, call_parameters(fn)) for i, p in enumerate(call_parameters(fn))]
             for fn in (_counted, _parallel)}
    assert roles == {"_counted": ["text", "merges", ""], "_parallel": ["path", "vocab_size", ""]}, roles
