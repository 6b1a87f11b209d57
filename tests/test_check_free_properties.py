"""What check cannot map, it still tests: properties every causal language model has (lm_properties.py).

A model check cannot compare with handformer's CausalLM (a depthwise convolution it cannot give weights,
a recurrent scan its blocks do not hold) stays NOT CHECKED, saying which properties held; it FAILs where
one breaks: changing a token moves the logits before it (at the first module that leaks, on its mask or
the line that builds its layer), or its own loss scores each position against its own token
(train_step_no_shift, at the line that slices or hands the labels). Two forms each: a GPT with a causal
depthwise convolution and Hugging Face's labels, and a recurrent LM whose targets are its inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_failed_at, component, planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_free_properties"
CONV, SCAN = FIXTURES / "conv_lm.py", FIXTURES / "recurrent_lm.py"
SCORE = FIXTURES / "score_conv_lm.py"  # its scores convolved over (query, key), padded above
GATED = Path(__file__).parent / "fixtures" / "learners_learned_terms" / "gated_block.py"  # a learned gate
# (planted file: source, edit, the mistake's name or None, the line it quotes, the model)
PLANTS = {
    "conv_no_shift": (CONV, ("labels[..., 1:]", "labels[..., :-1]"), "train_step_no_shift",
                      "shift_labels = labels[..., :-1]", "ConvLM"),
    "scan_no_shift": (SCAN, ("logits[:, :-1].reshape(-1, logits.size(-1)), targets[:, 1:]",
                             "logits.reshape(-1, logits.size(-1)), targets"), "train_step_no_shift",
                      "targets.reshape(-1)", "ScanLM"),
    "conv_reads_ahead": (CONV, ("y[..., :T]", "y[..., -T:]"), None, "return y[..., -T:]", "ConvLM"),
    "conv_off_by_one": (CONV, ("torch.ones(T, T, dtype=torch.bool))", "torch.ones(T, T, dtype=torch.bool), 1)"),
                        "causal_off_by_one", "mask = torch.tril(", "ConvLM"),
    "scan_state_of_all": (SCAN, ("h = torch.zeros_like(u[:, 0])", "h = u.mean(dim=1)"), None,
                          "h = u.mean(dim=1)", "ScanLM"),
    # a leak where no mask lets it in is quoted at the line whose tensor first moves: a softmax over the
    # queries; a convolution's input padded below (later queries), the padding not the convolution
    "score_softmax_over_queries": (SCORE, ("scores.softmax(dim=-1)", "scores.softmax(dim=-2)"), None,
                                   "y = scores.softmax(dim=-2) @ v", "ScoreConvLM"),
    "score_padded_below": (SCORE, ("self.kq - 1, 0))", "0, self.kq - 1))"), None, "padded = F.pad(scores",
                           "ScoreConvLM"),
    # a model check compares, whose learned gate makes its departure no evidence: the leak still says where
    "gated_not_causal": (GATED, ("is_causal=True", "is_causal=False"), None, "is_causal=False)", "GatedLM"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("free_properties")
    paths = {name: planted_copy(folder, name, source, edit) for name, (source, edit, *_) in PLANTS.items()}
    paths |= {"conv": str(CONV), "scan": str(SCAN), "score": str(SCORE)}
    return {name: check_file(path, only=["gpt"]) for name, path in paths.items()}


@pytest.mark.parametrize(("name", "model"), [("conv", "ConvLM"), ("scan", "ScanLM")])
def test_a_correct_model_check_cannot_map_says_which_properties_held(results, name, model):
    c = component(results[name], model)
    assert c.status == "not_checked", format_report(results[name])
    assert [ch.ok for ch in c.checks if ch.name["en"].startswith(("causality", "its loss"))] == [True, True]
    assert any("properties every causal language model has" in n["en"] for n in c.notes)


@pytest.mark.parametrize("name", PLANTS)
def test_a_broken_property_fails_at_its_line(results, name):
    *_, mistake, line, model = PLANTS[name]
    result = results[name]
    assert component(result, model).status == "fail", format_report(result)
    assert_failed_at(result, mistake, line)
    assert any(line in (f.code or "") for f in component(result, model).findings), format_report(result)


def test_a_leak_names_the_module_it_starts_in(results):
    said = " ".join(f.observed["en"] for f in component(results["conv_reads_ahead"], "ConvLM").findings)
    assert "blocks.0.mix (CausalConv)" in said, said


def test_a_correct_score_convolution_keeps_causality(results):
    c = component(results["score"], "ScoreConvLM")
    assert c.status == "not_checked", format_report(results["score"])
    assert [ch.ok for ch in c.checks if ch.name["en"].startswith("causality")] == [True]
