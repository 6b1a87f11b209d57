"""`handformer check` reaching what learners' files hold beyond the usual call: minGPT's generate that
samples only with do_sample=True (its temperature probed with sampling on), Raschka's chapter-3
self-attention on one sequence (T, d_in) with loose weight matrices (x @ self.W_query) or nn.Linear,
found by its versioned name, and a mixture of experts checked as its own layer. Each a correct file
that passes and planted copies that fail, quoting the planted line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
MINGPT = FIXTURES / "learners_mingpt" / "correct.py"
RASCHKA = FIXTURES / "learners_raschka" / "ch3_attention.py"


def _planted(factory: pytest.TempPathFactory, source: Path, *edits: tuple[str, str]) -> Path:
    return Path(edited_copy(factory.mktemp("plant"), source, list(edits)))


@pytest.fixture(scope="module")
def mingpt(tmp_path_factory):
    planted = _planted(tmp_path_factory, MINGPT, ("logits[:, -1, :] / temperature", "logits[:, -1, :]"),
                       ("probs = F.softmax(logits, dim=-1)\n", "probs = F.softmax(logits, dim=-1) / temperature\n"))
    return {name: check_file(str(path), only=["generate"]) for name, path in
            (("correct", MINGPT), ("after_softmax", planted))}


def test_mingpt_generate_passes_with_its_temperature_probed(mingpt):
    (gen,) = mingpt["correct"].components
    assert gen.status == "pass", format_report(mingpt["correct"])
    assert "temperature=0.5: the probabilities it samples from" in format_report(mingpt["correct"])


def test_mingpt_temperature_after_softmax_fails_named(mingpt):
    (gen,) = mingpt["after_softmax"].components
    assert gen.status == "fail", format_report(mingpt["after_softmax"])
    assert [(f.name, f.line) for f in gen.findings] == [("temperature_after_softmax", 99)]


@pytest.fixture(scope="module")
def raschka(tmp_path_factory):
    v1 = _planted(tmp_path_factory, RASCHKA, ("scores / d_k ** 0.5", "scores / d_k"))
    v2 = _planted(tmp_path_factory, RASCHKA, ("torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)\n        return",
                                              "torch.softmax(scores / keys.shape[-1], dim=-1)\n        return"))
    return {name: check_file(str(path), only=["mha"]) for name, path in
            (("correct", RASCHKA), ("v1", v1), ("v2", v2))}


def test_raschka_one_sequence_attention_passes(raschka):
    result = raschka["correct"]
    assert {c.name: c.status for c in result.components} == {"SelfAttention_v1": "pass",
                                                             "SelfAttention_v2": "pass"}, format_report(result)
    assert "W_query.T -> W_Q" in format_report(result)
    assert "one sequence (T, D) at a time" in format_report(result)


@pytest.mark.parametrize(("plant", "name", "line"), [("v1", "SelfAttention_v1", 21),
                                                     ("v2", "SelfAttention_v2", 37)])
def test_raschka_scale_by_dk_fails_quoted(raschka, plant, name, line):
    comp = next(c for c in raschka[plant].components if c.name == name)
    assert comp.status == "fail", format_report(raschka[plant])
    assert [(f.name, f.line) for f in comp.findings] == [("scale_by_dk", line)]


def test_a_mixture_of_experts_is_checked_as_its_own_layer():
    """minimind's MOEFeedForward, its gate a (E, D) parameter, a shared expert beside: its routing and
    sum pass against the reference written from the router's weight (its plant, the chosen weights
    not renormalized, is tests/check_plants.py's moe_weights_not_renormalized)."""
    result = check_file(str(FIXTURES / "learners_moe" / "correct.py"))
    assert {c.name: (c.kind, c.status) for c in result.components} == {
        "FeedForward": ("ffn", "pass"), "MOEFeedForward": ("moe", "pass"), "RMSNorm": ("rmsnorm", "pass")}
    moe = next(c for c in result.components if c.kind == "moe")
    assert any("each token through its top 2, their weights renormalized" in n["en"] for n in moe.notes)
