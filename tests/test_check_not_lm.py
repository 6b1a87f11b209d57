"""What is not handformer's language model is not graded as one. A model of blocks whose constructor
reads a number of classes is an encoder classifier (found by its structure, not as a GPT). A model,
block or attention that keeps a top-k of its scores (the keys each query sees chosen by score) is NOT
CHECKED naming that line, never FAIL unlocated; a named mistake beside it still FAILs. An FFN as wide as
the model is read by its calls: the down projection is the call that ends last. Each with a planted copy
that still FAILs."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from helpers import component, planted_copy

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_not_lm"
KINDS = ["causal_attention", "block", "gpt"]
PLANTS = {  # (source, edit, the component, the mistake named, its line)
    "classifier_unscaled": ("pooled_classifier.py", (" / math.sqrt(self.d_k)", ""), "SelfAttention",
                            "no_scaling", 35),
    "topk_sees_next": ("topk_attention.py", ("dtype=torch.bool).triu(1)", "dtype=torch.bool).triu(2)"),
                       "TopKAttention", None, 22),
    "square_swapped": ("square_ffn.py", ("F.silu(self.w1(x)) * self.w3(x)", "F.silu(self.w3(x)) * self.w1(x)"),
                       "TransformerBlock", "gated_activation_wrong_branch", 47),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """name -> its FileResult, each file checked once, when a test first asks for it."""
    folder = tmp_path_factory.mktemp("not_lm")
    only = {"pooled_classifier": ["classifier"], "topk_attention": KINDS, "square_ffn": ["block"]}

    @functools.cache
    def result(name):
        if name in PLANTS:
            source, edit = PLANTS[name][:2]
            return check_file(planted_copy(folder, name, FIXTURES / source, edit), only=KINDS + ["mha", "classifier"])
        return check_file(str(FIXTURES / f"{name}.py"), only=only[name])
    return result


def test_a_model_that_reads_a_number_of_classes_is_a_classifier_not_a_gpt(results):
    c = component(results("pooled_classifier"), "SentimentNet")
    assert (c.kind, c.status) == ("classifier", "pass"), (c.kind, c.status, c.error)


@pytest.mark.parametrize("name", ["TopKAttention", "Block", "GPT"])
def test_a_top_k_of_the_scores_is_not_checked_naming_its_line(results, name):
    c = component(results("topk_attention"), name)
    assert c.status == "not_checked" and not c.findings, (c.status, c.findings)
    assert "keeps a top-k of its scores at line 23" in c.error.message and "top-k" in c.error.message_zh


def test_an_ffn_as_wide_as_the_model_is_read_by_its_calls(results):
    assert component(results("square_ffn"), "TransformerBlock").status == "pass"


@pytest.mark.parametrize("name", PLANTS)
def test_a_planted_mistake_beside_them_still_fails(results, name):
    part, mistake, line = PLANTS[name][2:]
    c = component(results(name), part)
    assert c.status == "fail", (c.status, c.findings, c.error)
    if mistake:  # named at its line
        assert (mistake, line) in [(f.name, f.line) for f in c.findings], c.findings
    else:  # a check that reads no reference (causality) fails, whatever the reference lacks
        assert any(not check.ok and "causality" in check.name["en"] for check in c.checks), c.checks
