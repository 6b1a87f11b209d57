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


BERT = FIXTURES / "learners_bert" / "correct.py"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    plants = {"mask_inverted": ("(1.0 - attention_mask[:, None, None, :].float()) * -10000.0",
                                "attention_mask[:, None, None, :].float() * -10000.0"),
              "dropout_in_eval": ("return self.dropout(self.LayerNorm(x))",
                                  "return nn.functional.dropout(self.LayerNorm(x), p=0.1)")}
    paths = {"correct": BERT, **{n: _planted(tmp_path_factory, BERT, edit) for n, edit in plants.items()}}
    return {name: check_file(str(path), only=["encoder_model"]) for name, path in paths.items()}


def test_bert_model_passes_its_determinism_and_padding_checks(bert):
    (model,) = bert["correct"].components
    assert (model.name, model.status) == ("BertModel", "pass"), format_report(bert["correct"])
    assert "padding invariance: with attention_mask" in format_report(bert["correct"])


@pytest.mark.parametrize(("plant", "line"), [("mask_inverted", 118), ("dropout_in_eval", 42)])
def test_bert_model_plants_fail_named_at_their_line(bert, plant, line):
    (model,) = bert[plant].components
    assert model.status == "fail", format_report(bert[plant])
    assert [(f.name, f.line) for f in model.findings] == [(plant, line)]


INLINE_FFN = FIXTURES / "learners_bert" / "inline_ffn.py"
INLINE_PLANTS = {"no_residual": ("return self.LayerNorm(hidden_states + input_tensor)",
                                 "return self.LayerNorm(hidden_states)"),
                 "ffn_no_activation": ("inner = F.gelu(self.intermediate(attended))",
                                       "inner = self.intermediate(attended)")}


@pytest.fixture(scope="module")
def inline_ffn(tmp_path_factory):
    paths = {"correct": INLINE_FFN, **{n: _planted(tmp_path_factory, INLINE_FFN, e) for n, e in INLINE_PLANTS.items()}}
    return {name: check_file(str(path), only=["encoder_layer"]) for name, path in paths.items()}


def test_a_bert_layer_with_its_ffn_written_inline_is_checked_as_an_encoder_layer(inline_ffn):
    (layer,) = inline_ffn["correct"].components
    assert (layer.name, layer.status) == ("BertLayer", "pass"), format_report(inline_ffn["correct"])


@pytest.mark.parametrize("plant", list(INLINE_PLANTS))
def test_a_bert_layers_plants_fail_named_at_their_line(inline_ffn, plant):
    (layer,) = inline_ffn[plant].components
    assert layer.status == "fail", format_report(inline_ffn[plant])
    assert [(f.name, f.code.split("  #")[0]) for f in layer.findings] == [(plant, INLINE_PLANTS[plant][1])], (
        format_report(inline_ffn[plant]))


LLAMA3 = FIXTURES / "learners_llama3" / "rope_scaling.py"


def test_llama3_rope_scaling_passes_and_its_table_is_compared_unscaled():
    result = check_file(str(LLAMA3))
    assert {c.name: c.status for c in result.components} == {"precompute_freqs_cis": "pass",
                                                             "apply_scaling": "pass"}, format_report(result)


def test_llama3_rope_scaling_with_its_blend_swapped_fails(tmp_path_factory):
    path = _planted(tmp_path_factory, LLAMA3, ("(1 - smooth) * scaled / scale_factor + smooth * scaled",
                                               "(1 - smooth) * scaled + smooth * scaled / scale_factor"))
    result = check_file(str(path), only=["rope_scaling"])
    assert [c.status for c in result.components] == ["fail"], format_report(result)


STATIC = FIXTURES / "learners_static" / "batch_masks.py"


@pytest.mark.parametrize(("old", "new", "status", "named"), [
    (None, None, "pass", []),
    ("self.src_mask = (src != pad)", "self.src_mask = (src != 0)", "fail", [("mask_pad_id", 18)])])
def test_the_annotated_batch_builds_its_masks_with_its_pad_id(tmp_path_factory, old, new, status, named):
    """The Annotated Transformer's Batch(src, tgt, pad): its src_mask and tgt_mask, built on ids padded
    with 1; a src_mask that assumes the pad id 0 is named at its line."""
    path = _planted(tmp_path_factory, STATIC, (old, new)) if old else STATIC
    result = check_file(str(path), only=["batch_masks"])
    (batch,) = result.components
    assert batch.status == status, format_report(result)
    assert [(f.name, f.line) for f in batch.findings] == named
