"""`handformer check` on the assembled models: the encoder-decoder Transformer against handformer's
Seq2SeqTransformer on the learner's weights, its choices reported as choices (each planted mistake
is named in tests/test_check.py)."""

from __future__ import annotations

import json

import pytest
from check_plants import correct_file

from handformer.check.report import exit_code, format_report, to_json
from handformer.check.runners import check_file

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_assembled_model_passes_against_seq2seq_transformer():
    result = check_file(str(correct_file("model")), only=["transformer"])
    (comp,) = result.components
    assert comp.status == "pass" and comp.max_abs_error < 1e-9, format_report(result)
    assert comp.mapping[:2] == ["src_embed.lut -> source embedding", "tgt_embed.lut -> target embedding"]
    assert "encoder_norm -> encoder final norm" in comp.mapping and "out -> output layer" in comp.mapping
    assert comp.convention["en"] == ("embeddings scaled by sqrt(d_model); output layer separate, with a bias; "
                                     "pre-norm layers; sinusoidal positions; forward returns logits")
    assert "嵌入乘以 sqrt(d_model)" in comp.convention["zh"]
    assert exit_code(result) == 0


CHOICES = [("self.scale = math.sqrt(d_model)", "self.scale = 1.0"),
           ("        self.out = nn.Linear(d_model, tgt_vocab)\n",
            "        self.out = nn.Linear(d_model, tgt_vocab, bias=False)\n"
            "        self.out.weight = self.tgt_embed.lut.weight\n"),
           ("return self.out(self.decode(memory, src_mask, tgt, tgt_mask))",
            "return F.log_softmax(self.out(self.decode(memory, src_mask, tgt, tgt_mask)), dim=-1)")]


def test_unscaled_tied_embeddings_without_bias_and_log_probabilities_are_choices(tmp_path):
    source = correct_file("model").read_text()
    for old, new in CHOICES:
        assert old in source
        source = source.replace(old, new)
    path = tmp_path / "choices.py"
    path.write_text(source)
    result = check_file(str(path), only=["transformer"])
    (comp,) = result.components
    assert comp.status == "pass" and not comp.findings, format_report(result)
    assert comp.convention["en"] == ("embeddings not scaled; output layer tied to the target embedding, no bias; "
                                     "pre-norm layers; sinusoidal positions; forward returns log-probabilities")
    assert "out -> output layer (tied to the target embedding)" in comp.mapping


def test_a_planted_model_mistake_in_json_and_a_model_that_exits_is_an_error(tmp_path):
    source = correct_file("model").read_text()
    path = tmp_path / "model.py"
    path.write_text(source.replace("x = self.pos(self.src_embed(src))", "x = self.src_embed(src)"))
    data = json.loads(to_json(check_file(str(path), only=["transformer"])))
    (comp,) = data["components"]
    assert comp["status"] == "fail" and [f["name"] for f in comp["findings"]] == ["pe_missing"]
    assert comp["findings"][0]["form"] == "src"
    path.write_text(source.replace("        memory = self.encode(src, src_mask)\n",
                                   "        import sys\n        sys.exit(3)\n"))
    (comp,) = check_file(str(path), only=["transformer"]).components
    assert comp.status == "error" and "sys.exit(3)" in comp.error.message
    path.write_text(source.replace("return self.out(self.decode(", "return float('nan') * self.out(self.decode("))
    (comp,) = check_file(str(path), only=["transformer"]).components
    assert comp.status == "fail" and not comp.findings


class _Context:
    """What the steered model needs of a check's context: a way to call (here: handformer's) code."""

    def __init__(self) -> None:
        from handformer.check.fingerprint import Learner

        self.learner = Learner("handformer")


def test_the_beam_reference_is_handformers_beam_search():
    """check/beam.py's reference follows handformer.generation.decoding.beam_search: both give the
    same best hypothesis on every scenario of the steered model."""
    import torch
    from torch import nn

    from handformer.check.beam import BOS, EOS, MAX_LEN, PAD, SCENARIOS, HandformerModel, Steered, reference
    from handformer.generation.decoding import DecodeLimits, beam_search

    base, src = HandformerModel(), torch.tensor([[5, 7, 9, 11, 3, 6]])
    for table in SCENARIOS.values():
        steered = Steered(base, table, _Context())

        class Adapter(nn.Module):  # handformer's call convention on the steered model
            cfg = base.inner.cfg

            def encode(self, src):
                return base.inner.encode(src)

            def decode(self, ys, memory, src_mask, cache=None, steered=steered):
                return steered.decode(memory, None, ys, None), None, None

            def generator(self, h, steered=steered):
                return steered.generator(h)

        limits = DecodeLimits(BOS, EOS, PAD, max_len_a=0, max_len_b=MAX_LEN - 1)
        (theirs,) = beam_search(Adapter(), src, limits, beam_size=2, length_penalty=1.0, use_cache=False)
        ours = reference(steered, base.encode(src), 2, MAX_LEN - 1, 1.0, "eos")
        assert ours[1:] == theirs and ours[-1] == EOS


def test_beam_search_without_a_transformer_of_its_own_runs_on_handformers_model(tmp_path):
    source = correct_file("model").read_text()
    path = tmp_path / "beam.py"
    path.write_text("import torch\nimport torch.nn.functional as F\n\n\n" + source[source.index("def beam_search("):])
    result = check_file(str(path))
    (comp,) = result.components
    assert comp.kind == "beam_search" and comp.status == "pass", format_report(result)
    assert any("handformer's tiny Seq2SeqTransformer" in n["en"] for n in comp.notes)
    assert comp.convention["en"] == "score / length^alpha; the length counts the new tokens and EOS"
    (comp,) = check_file(str(correct_file("model")), only=["beam_search"]).components
    assert comp.status == "pass" and any("your own Transformer" in n["en"] for n in comp.notes)
    path.write_text(source.replace("finished.append((score / (len(tokens) - 1) ** alpha, tokens))",
                                   "finished.append((score / (len(tokens) - 2) ** alpha, tokens))"))
    (comp,) = check_file(str(path), only=["beam_search"]).components
    assert comp.status == "pass" and not comp.findings, format_report(check_file(str(path), only=["beam_search"]))
    assert comp.convention["en"] == "score / length^alpha; the length counts the new tokens without EOS"
    path.write_text(source.replace("finished.append((score / (len(tokens) - 1) ** alpha, tokens))",
                                   "finished.append((score / len(tokens) ** alpha, tokens))"))
    (comp,) = check_file(str(path), only=["beam_search"]).components
    assert comp.status == "pass" and comp.convention["en"].endswith("every token, BOS and EOS included")


def test_the_gpt_passes_against_causal_lm_and_its_inference_forward_is_compared_at_the_last_position(tmp_path):
    result = check_file(str(correct_file("gpt")), only=["gpt"])
    (comp,) = result.components
    assert comp.status == "pass" and comp.max_abs_error < 1e-9, format_report(result)
    assert comp.mapping[-1] == "lm_head -> output head (tied to the token embedding)"
    assert comp.convention["en"] == ("output head tied to the token embedding; pre-norm blocks; gelu FFN; "
                                     "learned positions")
    assert [c.name["en"] for c in comp.checks][-2:] == ["the loss equals the cross-entropy of handformer's logits",
                                                          "causality: changing token 5 leaves logits 0..4 unchanged"]
    source = correct_file("gpt").read_text()
    path = tmp_path / "gpt.py"
    path.write_text(source.replace("def forward(self, idx, targets=None):",
                                   "def forward(self, idx):\n        targets = None").replace(
        "        self.transformer.wte.weight = self.lm_head.weight  # weight tying\n", "").replace(
        "nn.GELU()", "nn.GELU(approximate='tanh')"))
    result = check_file(str(path), only=["gpt"])
    (comp,) = result.components
    assert comp.status == "pass", format_report(result)
    assert comp.convention["en"].startswith("output head separate; pre-norm blocks; gelu_tanh FFN")
    assert any("last position's logits only" in n["en"] for n in comp.notes)
