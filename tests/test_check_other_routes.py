"""Loops, tokenizers and training loops that compute what the reference computes by another route
(tests/fixtures/learners_other_routes/): each correct one is graded and passes, never FAILs, and a
mistake planted in it FAILs:

- a generation loop that accepts several tokens a step and returns (tokens, forward passes), and one
  that takes its prompts as lists of their own lengths with one settings object a prompt (read off
  `requests[i]`, its count the field its loop's range reads, whatever it is called);
- a SentencePiece BPE that keeps its merges as {merged piece: score}, the score minus the merge's
  order, in two forms (the best-scoring join merged first, with byte fallback; the table walked from the
  highest score down): its merges are read from that table, each piece cut where training made it;
- a training loop that accumulates micro-batches, its count an argument or a global of any name (read
  as the bound of the `for` around its backward), with a scheduler and clipping, or with an optimizer
  of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = Path(__file__).parent / "fixtures" / "learners_other_routes"
# name: (fixture, edits, kinds checked, the finding a plant is named by ("": any FAIL))
CASES = {
    "parallel_accept": ("parallel_accept", (), ["generate"], None),
    "parallel_accept_shifted": ("parallel_accept", (("start = len(out) - 1", "start = len(out)"),), ["generate"],
                                ""),
    "per_request": ("per_request", (), ["generate"], None),
    "per_request_first": ("per_request", (("model(tokens)[:, -1, :]", "model(tokens)[:, 0, :]"),), ["generate"], ""),
    "scored_pieces": ("scored_pieces", (), ["bpe_tokenizer"], None),
    "scored_pieces_lowest": ("scored_pieces", (("i = -max(joins)[1]", "i = -min(joins)[1]"),), ["bpe_tokenizer"],
                             "bpe_encode_merge_order"),
    "merge_table": ("merge_table", (), ["bpe_tokenizer"], None),
    "merge_table_unweighted": ("merge_table", (("stats.get(pair, 0) + n", "stats.get(pair, 0) + 1"),),
                               ["bpe_tokenizer"], ""),
    "accum_param": ("accum_param", (), ["lm_train_loop"], None),
    "accum_param_not_divided": ("accum_param", (("(loss / micro).backward()", "loss.backward()"),),
                                ["lm_train_loop"], "train_step_loss_not_divided"),
    "accum_global": ("accum_global", (), ["lm_train_loop"], None),
    "accum_global_no_zero_grad": ("accum_global", (("        optimizer.zero_grad()\n", ""),), ["lm_train_loop"],
                                  "train_step_no_zero_grad"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("other_routes")
    return {name: check_file(planted_copy(folder, name, FOLDER / f"{fixture}.py", *edits), only=only)
            for name, (fixture, edits, only, _) in CASES.items()}


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] is None])
def test_the_correct_file_passes(results, name):
    result = results[name]
    assert [c.status for c in result.components] == ["pass"], format_report(result)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] is not None])
def test_the_planted_mistake_fails(results, name):
    result, said = results[name], CASES[name][3]
    found = {f.name for c in result.components if c.status == "fail" for f in c.findings}
    assert found and (not said or said in found), format_report(result)


def test_the_settings_read_by_the_loop_are_said(results):
    notes = " ".join(n["en"] for n in results["per_request"].components[0].notes)
    assert "max_new=" not in notes, notes  # its count is check's, not a setting left at the file's value
    notes = " ".join(n["en"] for n in results["accum_param"].components[0].notes)
    assert "micro=2: each batch" in notes, notes


def _batched(model, prompts, params):
    """vLLM's loop: as many steps as the longest request asks for, read off its list of settings."""
    for _ in range(max(p.max_tokens for p in params)):
        model(prompts)


def test_a_list_of_settings_is_no_count():
    from handformer.check.core.loop_forms import counted_parameter

    assert counted_parameter(_batched) == ""
