"""`handformer check` on learner files retyped from three public styles without their libraries: Hugging
Face's Qwen3 (QK-norm before RoPE, a causal LM with its own generate) and Mixtral (attention with its
rotary module inside at the config's base, a sparse mixture of experts whose router is as wide as a
key projection), Hugging Face's logits processors with a sampling loop that takes a model and a chain
of processors, and d2l-zh's Transformer chapter (EncoderDecoder(encoder, decoder) over the stacks that
implement its Encoder and Decoder interfaces). Each correct file passes with every component checked;
each planted one fails, quoted at its line. One check run a file, shared by its asserts."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def _run(path: Path, only: list[str] | None = None):
    result = check_file(str(path), only=only)
    return result, {c.name: c.status for c in result.components}, format_report(result)


@pytest.fixture(scope="module")
def qwen3():
    return _run(FIXTURES / "learners_qwen3_hf" / "correct.py")


@pytest.fixture(scope="module")
def mixtral():
    return _run(FIXTURES / "learners_mixtral_hf" / "correct.py")


@pytest.fixture(scope="module")
def processors():
    return _run(FIXTURES / "learners_hf_processors" / "correct.py")


@pytest.fixture(scope="module")
def d2l_zh():
    return _run(FIXTURES / "learners_d2l_zh" / "correct.py")


def _all_pass(status: dict[str, str], report: str, drivers: tuple[str, ...] = ()) -> None:
    assert {n: s for n, s in status.items() if n not in drivers} == dict.fromkeys(
        [n for n in status if n not in drivers], "pass"), report


def test_qwen3_model_and_its_generate_are_checked(qwen3):
    result, status, report = qwen3
    _all_pass(status, report)
    assert {"Qwen3Attention", "Qwen3DecoderLayer", "Qwen3ForCausalLM", "Qwen3ForCausalLM.generate"} <= set(status)


def test_mixtral_attention_at_its_configs_base_passes(mixtral):
    """Its rotary module is built from the config's rope_theta = 1e6; the attention is built at the
    reference's base, the model reads its own (base 1000000)."""
    result, status, report = mixtral
    _all_pass(status, report)
    assert status["MixtralAttention"] == "pass" and status["MixtralSparseMoeBlock"] == "pass", report
    assert "base 1000000" in report and "sparse mixture of 8 experts" in report


def test_mixtral_model_with_a_router_as_wide_as_its_keys_is_checked(mixtral):
    """The router nn.Linear(D, E) has the shape of the grouped key projection (E = n_kv_heads *
    head_dim = 8): it is no attention's weight."""
    result, status, report = mixtral
    assert status["MixtralForCausalLM"] == "pass", report
    assert "block_sparse_moe.gate" not in report.split("MixtralForCausalLM (")[1].split("\n")[1]


def test_processors_and_the_sampling_loop_are_graded(processors):
    result, status, report = processors
    _all_pass(status, report, drivers=("ToyLM",))
    assert status["RepetitionPenaltyLogitsProcessor"] == "pass" and status["sample"] == "pass", report
    assert "sample (generation loop): PASS" in report and exit_code(result) == 0


def test_d2l_encoder_decoder_is_checked(d2l_zh):
    result, status, report = d2l_zh
    _all_pass(status, report)
    assert status["EncoderDecoder"] == "pass", report
    assert "encoder.blks.block0 -> encoder layer 0" in report


@pytest.mark.parametrize(("folder", "name", "component", "finding", "line", "kind"), [
    ("learners_qwen3_hf", "rope_rotation_sign.py", "apply_rotary_pos_emb", "rope_rotation_sign", 74, "rope"),
    ("learners_mixtral_hf", "scale_by_dk.py", "MixtralAttention", "scale_by_dk", 127, "gqa"),
    ("learners_hf_processors", "repetition_penalty_sign_ignored.py", "RepetitionPenaltyLogitsProcessor",
     "repetition_penalty_sign_ignored", 40, "repetition_penalty"),
    ("learners_d2l_zh", "decoder_masks_swapped.py", "DecoderBlock", "decoder_masks_swapped", 263, "decoder_layer"),
    ("learners_d2l_zh", "add_norm_no_residual.py", "AddNorm", "no_residual", 131, "add_norm"),
])
def test_each_plant_fails_at_its_line(folder, name, component, finding, line, kind):
    result, status, report = _run(FIXTURES / folder / name, only=[kind])
    comp = next(c for c in result.components if c.name == component)
    assert comp.status == "fail", report
    assert [(f.name, f.line) for f in comp.findings][:1] == [(finding, line)], report
