"""Models that keep or hand back a KV cache, mixtures of experts behind a router of their own, chat
loops, and a lone encoder layer that requires its padding mask, each a learner's file in a style of
its own (tests/fixtures/learners_*/):
- learners_returned_cache/: forward(input_ids, past_key_values=None, start_pos=0) returning (logits,
  presents): the cached call is handed its start position;
- learners_noisy_moe/: a noisy top-k router (a routing linear and a noise linear read in training
  only), softmax after the top-k, MixtureOfExperts(dim, num_experts, top_k) and blocks returning
  (x, aux);
- learners_rolling_window/: a sliding window with a rolling cache the model fills in place:
  forward(tokens, positions, cache), model.new_cache(), generate returning (tokens, logprobs);
- learners_chat_loop/: chat(model, tokenizer, messages, ...) with top-k and top-p on by default, its
  rotary base only in an inv_freq buffer (rope_theta 500000, the config not kept);
- learners_required_mask/: an encoder layer alone whose forward requires a (B, S) padding mask.

One module-scoped check run per file, shared by the asserts on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
RUNS: dict[str, object] = {}


def run(name: str):
    if name not in RUNS:
        RUNS[name] = check_file(str(FIXTURES / name))
    return RUNS[name]


def statuses(name: str) -> dict[str, str]:
    return {c.name: c.status for c in run(name).components}


def findings(name: str, component: str) -> list[tuple[str, str]]:
    comp = next(c for c in run(name).components if c.name == component)
    return [(f.name, (f.code or "").strip()) for f in comp.findings]


def test_returned_cache_is_handed_its_start_position():
    name = "learners_returned_cache/correct.py"
    assert statuses(name) == {"Attention": "pass", "Block": "pass", "RotaryGPT": "pass"}, format_report(run(name))
    assert "the KV cache it returns: tokens 5..7 handed the cache of 0..4" in format_report(run(name))


def test_returned_cache_rotated_from_zero_fails_at_its_line():
    name = "learners_returned_cache/rope_no_offset.py"
    assert statuses(name)["RotaryGPT"] == "fail", format_report(run(name))
    assert findings(name, "RotaryGPT")[0] == ("rope_no_offset", "cos = self.cos[:T]")


def test_noisy_router_moe_is_compared_in_eval_mode():
    name = "learners_noisy_moe/correct.py"
    assert statuses(name) == {"Attention": "pass", "MixtureOfExperts": "pass", "RMSNorm": "pass",
                              "MoEBlock": "pass", "TinyMixtral": "pass"}, format_report(run(name))
    assert exit_code(run(name)) == 0


def test_noisy_router_noise_in_eval_fails():
    name = "learners_noisy_moe/noise_in_eval.py"
    assert statuses(name)["MixtureOfExperts"] == "fail", format_report(run(name))
    assert findings(name, "MoEBlock")[0][1].startswith("if True:")


def test_rolling_cache_filled_in_place_is_checked_through_the_model():
    name = "learners_rolling_window/correct.py"
    status = statuses(name)
    assert (status["SlidingLlama"], status["generate"]) == ("pass", "pass"), format_report(run(name))
    assert "through its cache (new_cache): tokens 0..4, then 5..7 one at a time from positions=5" in \
        format_report(run(name))


def test_rolling_cache_written_a_slot_late_fails():
    name = "learners_rolling_window/cache_write_offset.py"
    assert statuses(name)["SlidingLlama"] == "fail", format_report(run(name))


def test_chat_loop_is_driven_through_a_tokenizer_and_messages():
    name = "learners_chat_loop/correct.py"
    assert set(statuses(name).values()) == {"pass"}, format_report(run(name))
    report = format_report(run(name))
    assert "top_p=0.6: it samples from the most likely tokens" in report
    assert "rotary positions (half pairs, base 500000)" in report


def test_chat_loop_top_p_dropping_the_crossing_token_fails_at_its_line():
    name = "learners_chat_loop/top_p_drops_crossing.py"
    assert statuses(name)["chat"] == "fail", format_report(run(name))
    assert findings(name, "chat")[0] == ("top_p_drops_crossing", "drop = sorted_probs.cumsum(-1) > top_p")


def test_lone_encoder_layer_with_a_required_mask_is_an_encoder_layer():
    name = "learners_required_mask/correct.py"
    assert statuses(name) == {"RobertaLayer": "pass"}, format_report(run(name))
    assert [c.kind for c in run(name).components] == ["encoder_layer"]
