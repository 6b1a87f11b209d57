"""BERT's masked-language-model masking is judged by counts on a large batch, whatever the code's form:
a collator-style function reading its ids from a tokenizer, a function handed its ids by name that
splits with uniform thresholds, a collator class's method handed the special-tokens mask, and a function
whose probability is a constant of its own (its share is then not judged), and one whose [MASK] is a
constant of its own vocabulary (103: the commonest id it writes where it changes a picked token). Each planted mistake
FAILs; a function whose labels mark no position with -100 is NOT CHECKED, never failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_mlm_masking"
CORRECT = ("collator", "thresholds", "collator_class", "own_probability", "module_ids")
PLANTED = {"collator_random_unpicked": "the inputs are untouched where not picked (found",
           "thresholds_no_kept": "10% kept (or every one [MASK]) (found 88% [MASK]",
           "collator_class_specials": "no special token the code reads (cls, pad, sep) is picked (found"}
NO_LABELS = '''
import torch


def mask_tokens(ids, mask_token_id, mlm_probability=0.15):
    picked = torch.rand(ids.shape) < mlm_probability
    return torch.where(picked, torch.full_like(ids, mask_token_id), ids), picked
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    no_labels = tmp_path_factory.mktemp("mlm") / "no_labels.py"
    no_labels.write_text(NO_LABELS, encoding="utf-8")
    files = {name: str(HERE / f"{name}.py") for name in (*CORRECT, *PLANTED)} | {"no_labels": str(no_labels)}
    return {name: check_file(path, only=["mlm_masking"]) for name, path in files.items()}


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_masking_passes_as_bert_s_80_10_10(results, name):
    (comp,) = results[name].components
    assert comp.kind == "mlm_masking" and comp.status == "pass", format_report(results[name])
    assert "80% [MASK], 10% random, 10% kept" in comp.convention["en"]


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_mistake_in_the_masking_fails(results, name):
    (comp,) = results[name].components
    assert comp.status == "fail" and PLANTED[name] in format_report(results[name]), format_report(results[name])


def test_labels_with_no_ignored_position_are_not_checked(results):
    (comp,) = results["no_labels"].components
    assert comp.status == "not_checked", format_report(results["no_labels"])
    assert "-100" in comp.error.message and "-100" in comp.error.message_zh


def test_the_chinese_report_says_no_special_token_read_in_chinese(results):
    report = format_report(results["module_ids"], lang="zh")  # its specials are constants, none read by name
    assert "代码读到的特殊 token（无）没有被选中" in report, report
