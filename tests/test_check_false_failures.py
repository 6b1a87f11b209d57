"""Correct code that `handformer check` once failed, each in the style it was found in, with a plant
in each that must still fail:

- BLOOM's attention: a fused query_key_value laid out head by head ([q_h | k_h | v_h]) whose forward
  requires its mask, its ALiBi term and the residual it adds (the layout is read on one token with
  the mask handed; the residual is handed zero);
- Falcon's rotary embedding on (batch * heads, seq, head_dim);
- Mistral's repeat_kv(keys, values, repeats, dim);
- a mixture of experts with a shared expert, whose loss adds the load-balancing term;
- build-nanogpt's train(model, optimizer, loader, steps, grad_accum_steps) (steps: how many to run)
  and a generate(prompts, model, max_tokens);
- a BPE trainer on GPT-2's byte characters, its ties broken by comparing those strings;
- a step stopped at the time limit in check's own code is NOT CHECKED, in the learner's an ERROR.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import LearnerError
from handformer.check.core.sandbox import _stopped_component

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def statuses(result):
    return {c.name: c.status for c in result.components}


def quoted(result, name):
    comp = next(c for c in result.components if c.name == name)
    return [(f.name, f.code) for f in comp.findings]


def test_bloom_attention_passes_and_a_softmax_over_queries_fails(tmp_path):
    source = FIXTURES / "learners_bloom" / "correct.py"
    result = check_file(str(source))
    assert statuses(result) == {"BloomAttention": "pass", "alibi_slopes": "pass"}, format_report(result)
    wrong = edited_copy(tmp_path, source, [("weights = F.softmax(scores, dim=-1)",
                                             "weights = F.softmax(scores, dim=-2)")])
    planted = check_file(wrong)
    assert statuses(planted) == {"BloomAttention": "fail", "alibi_slopes": "pass"}, format_report(planted)
    assert ("softmax_wrong_dim", "weights = F.softmax(scores, dim=-2)") in quoted(planted, "BloomAttention")


def test_falcon_rotary_on_heads_folded_into_the_batch(tmp_path):
    source = FIXTURES / "learners_falcon" / "correct.py"
    result = check_file(str(source))
    assert statuses(result) == {"FalconRotaryEmbedding": "pass"}, format_report(result)
    assert any("(B * H, T, Dh)" in n["en"] for n in result.components[0].notes)
    no_offset = edited_copy(tmp_path, source, [("torch.arange(past_key_values_length, past_key_values_length + "
                                                "length)", "torch.arange(length)")])
    assert statuses(check_file(no_offset)) == {"FalconRotaryEmbedding": "fail"}


def test_mistral_repeat_kv_of_keys_and_values_along_an_axis(tmp_path):
    source = FIXTURES / "learners_mistral" / "correct.py"
    assert statuses(check_file(str(source))) == {"repeat_kv": "pass"}
    tiled = edited_copy(tmp_path, source, [("keys = torch.repeat_interleave(keys, repeats=repeats, dim=dim)",
                                            "keys = torch.cat([keys] * repeats, dim=dim)")])
    assert statuses(check_file(tiled)) == {"repeat_kv": "fail"}


@pytest.fixture(scope="module")
def moe():
    return check_file(str(FIXTURES / "learners_moe_shared" / "correct.py"))


def test_a_shared_expert_and_the_balancing_loss_are_compared(moe):
    assert statuses(moe) == {"CausalAttention": "pass", "SwiGLU": "pass", "SharedMoE": "pass", "Block": "pass",
                             "MoEGPT": "pass"}, \
        format_report(moe)
    model = next(c for c in moe.components if c.name == "MoEGPT")
    assert any("0.01 times the load-balancing loss" in n["en"] for n in model.notes), model.notes


def test_a_loss_off_by_a_factor_is_not_taken_for_a_balancing_term(tmp_path):
    """c is read on one batch and must hold on a second: half the cross-entropy does not."""
    wrong = edited_copy(tmp_path, FIXTURES / "learners_moe_shared" / "correct.py", [(
        "ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())",
        "ce = 0.5 * F.cross_entropy(logits.flatten(0, 1), targets.flatten())")])
    assert statuses(check_file(wrong, only=["gpt"])) == {"MoEGPT": "fail"}


@pytest.fixture(scope="module")
def nanogpt():
    return check_file(str(FIXTURES / "learners_nanogpt_steps" / "correct.py"))


def test_a_train_loop_of_steps_and_a_generate_of_prompts_pass(nanogpt):
    assert set(statuses(nanogpt).values()) == {"pass"} and {"train", "generate"} <= set(statuses(nanogpt)), \
        format_report(nanogpt)


def test_a_train_loop_that_does_not_divide_its_micro_batch_losses_fails(tmp_path):
    wrong = edited_copy(tmp_path, FIXTURES / "learners_nanogpt_steps" / "correct.py",
                        [("(loss / grad_accum_steps).backward()", "loss.backward()")])
    (train,) = [c for c in check_file(wrong).components if c.name == "train"]
    assert train.status == "fail" and [f.name for f in train.findings] == ["train_step_loss_not_divided"]


def test_bpe_ties_by_gpt2_byte_characters_differ_by_convention(tmp_path):
    source = FIXTURES / "learners_bpe_symbols" / "correct.py"
    (trainer,) = check_file(str(source)).components
    assert trainer.status == "differs", trainer.notes
    assert "GPT-2's characters of the bytes" in trainer.convention["en"]
    first_counted = edited_copy(tmp_path, source, [("best = max(counts, key=lambda p: (counts[p], p))",
                                                    "best = max(counts, key=counts.get)")])
    (trainer,) = check_file(first_counted).components
    assert trainer.status == "fail" and trainer.findings[0].name == "bpe_ties_not_by_bytes"


STACK = """Timeout (0:00:20)!
Thread 0x00007f (most recent call first):
  File "{inner}", line 276 in same
  File "/x/handformer/check/runners/gpt.py", line 795 in check_gpt
"""


@pytest.mark.parametrize(("inner", "status"), [("/x/handformer/check/core/localize.py", "not_checked"),
                                               ("{path}", "error")])
def test_a_timeout_is_the_learners_only_with_their_code_on_the_stack(tmp_path, inner, status):
    path = str(tmp_path / "mine.py")
    error = LearnerError("timeout", "stopped after 20 s in Transformer: an infinite loop", "Transformer")
    stack = STACK.format(inner=inner.format(path=path))
    result = _stopped_component("gpt", "Transformer", error, "timeout", stack, path, 20.0)
    assert result.status == status
    assert (result.error.kind == "timeout") == (status == "error")
