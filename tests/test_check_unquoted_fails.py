"""A FAIL always quotes a line of the learner's, and a correct file of a form check had no reading for
does not FAIL: one learner file per form (tests/fixtures/learners_unquoted_fails/), each checked once,
its planted line marked `# planted`.

Forms: two Batch classes that build their masks (the Chinese tutorials' trg_mask through a helper; a
source_mask and target_mask built inline), two schedules with a floor named for where the decay ends
(Hugging Face's polynomial factory with lr_end and power; a function of the step with eta_min), two BPE
trainers that take a list of texts (GPT-2's characters with ties to the greater pair of them and a
pattern of the standard `re`; bytes with GPT-2's pattern through a split function of their own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core import engine
from handformer.check.core.engine import check_file
from handformer.check.core.kinds import KINDS_BY_NAME
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS, FAIL, UNLOCATED, Check, ComponentResult, text
from handformer.check.core.unlocated import place_unlocated

FIXTURES = Path(__file__).parent / "fixtures" / "learners_unquoted_fails"
CORRECT = {"batch_trg": ("Batch", "pass"), "batch_source": ("Batch", "pass"),
           "sched_poly": ("polynomial_warmup_schedule", "pass"), "sched_floor": ("linear_lr", "pass"),
           # ties to the greater pair of GPT-2's characters: a convention (DIFFERS)
           "bpe_texts": ("train_bpe", "differs"), "bpe_documents": ("train_bpe", "pass"),
           "mlm_split": ("mask_tokens", "pass")}
PLANTED = {"batch_trg_planted": DEPARTS, "batch_source_planted": DEPARTS, "sched_poly_planted": DEPARTS,
           "sched_floor_planted": DEPARTS, "bpe_texts_planted": "bpe_pairs_not_weighted",
           "bpe_documents_planted": "bpe_merges_across_pretokens",
           # the lambda returns the rate, not the multiplier: seen only on an optimizer of lr 2
           "sched_poly_rate_planted": DEPARTS}
UNPLACED = ["mlm_split_planted"]  # a split of 80/10/10 no localizer places: the failed check at its def line


@pytest.fixture(scope="module")
def checked():
    """Each file checked once; a BPE trainer's timing corpus stopped after 0.1 s (slow is not wrong)."""
    import handformer.check.runners.bpe as bpe

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bpe, "CEILING", 0.1)
        results = {name: check_file(str(FIXTURES / f"{name}.py")) for name in [*CORRECT, *PLANTED, *UNPLACED]}
    return {name: ({c.name: c for c in r.components}, format_report(r)) for name, r in results.items()}


@pytest.mark.parametrize("name", list(CORRECT))
def test_the_correct_form_is_read(checked, name):
    component, status = CORRECT[name]
    by_name, report = checked[name]
    assert by_name[component].status == status and not by_name[component].findings, report


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_plant_fails_quoting_its_line(checked, name):
    component = CORRECT[name.removesuffix("_planted").removesuffix("_rate")][0]
    by_name, report = checked[name]
    comp = by_name[component]
    planted = next(n for n, line in enumerate((FIXTURES / f"{name}.py").read_text().splitlines(), 1)
                   if "# planted" in line)
    assert comp.status == FAIL and [(f.name, f.line) for f in comp.findings] == [(PLANTED[name], planted)], report


def test_a_fail_no_localizer_places_quotes_the_definition(checked):
    by_name, report = checked["mlm_split_planted"]
    comp = by_name["mask_tokens"]
    assert comp.status == FAIL and [(f.name, f.line) for f in comp.findings] == [(UNLOCATED, 5)], report
    assert "found 40% [MASK], 49% random, 11% kept" in comp.findings[0].observed["en"], report
    assert "x unlocated: no known mistake reproduces it" in report and "line 5: def mask_tokens(" in report


@pytest.mark.parametrize("kind", sorted(KINDS_BY_NAME))
def test_a_fail_with_nothing_found_quotes_the_definition(monkeypatch, kind):
    """Whatever the kind, a runner's FAIL with no finding (and no line it raised at) leaves check with one
    finding: the failed check, at the line that defines the component."""
    def bare_fail(comp, ctx):
        return ComponentResult(comp.kind, comp.name, FAIL, checks=[Check(text("it matches", "一致"), False)])

    monkeypatch.setattr(engine, "_grouped_or_not", bare_fail)
    (comp,) = check_file(str(FIXTURES / "stub.py"), overrides={kind: "Thing"}, only=[kind]).components
    assert comp.status == FAIL and [(f.name, f.line, f.code) for f in comp.findings] == [
        (UNLOCATED, 5, "class Thing(nn.Module):")], comp
    assert "it matches" in comp.findings[0].observed["en"] and "一致" in comp.findings[0].observed["zh"]


def test_the_unlocated_finding_says_the_failed_check_or_that_the_values_differ():
    """place_unlocated on its own: the first failed check with its detail; with no failed check, that the
    values differ from the reference's; where the object has no source, no line."""
    for checks, said in [([Check(text("ok", "对"), True), Check(text("a", "甲"), False, text("b", "乙"))],
                          ("failed: a (b)", "未通过：甲（乙）")),
                         ([], ("failed: its values differ from the reference's", "未通过：它的数值与参考不同"))]:
        result = ComponentResult("mha", "Thing", FAIL, checks=checks)
        place_unlocated(len, result)
        assert [(f.name, f.line, f.observed["en"], f.observed["zh"]) for f in result.findings] == [
            (UNLOCATED, None, *said)]
