"""Mistakes that hide when check drives code one way only, each seen by a general rule, with a correct
twin that still passes: a loss of the wrong scale behind gradient clipping (the step, or a language
model's step, driven again with the clipping out of reach), a layer or an attention that ignores its
key_padding_mask (given alone), a ReLU where the code promises GELU (an attribute named gelu, a GPT-2
model; the model that uses that MLP fails with it), and greedy decoding on a model that failed its own
check (driven through that model, steered by hooks, judged as a loop)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
HIDDEN = FIXTURES / "learners_hidden" / "correct.py"


_planted = edited_copy


def _only(result, name):
    return next(c for c in result.components if c.name == name)


STEP_PLANTS = {  # (edits, the finding named or None, a note's words)
    "correct": ([], None, None),
    "not_divided": ([("(loss / accum_steps).backward()", "loss.backward()")], "train_step_loss_not_divided",
                    "2 times handformer's"),
    "doubled": ([("(loss / accum_steps).backward()", "(2 * loss).backward()")], None, "4 times handformer's"),
}


@pytest.mark.parametrize("plant", list(STEP_PLANTS))
def test_a_loss_scale_that_clipping_hides_shows_with_the_clipping_out_of_reach(tmp_path, plant):
    edits, named, words = STEP_PLANTS[plant]
    result = check_file(_planted(tmp_path, HIDDEN, edits), only=["train_step"])
    (step,) = result.components
    unclipped = step.checks[1]
    assert unclipped.name["en"].startswith("with the gradients under the clipping norm 1"), format_report(result)
    assert step.checks[0].ok, format_report(result)  # at full size the clipping hides the scale
    assert unclipped.ok == (plant == "correct") and step.status == ("pass" if plant == "correct" else "fail")
    assert [f.name for f in step.named()] == ([named] if named else [])
    assert words is None or any(words in n["en"] for n in step.notes), format_report(result)


CACHE = FIXTURES / "learners_cache" / "correct.py"
LM_CLIP = ("    loss.backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
           "    loss.backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)")  # under the norm


@pytest.mark.parametrize("doubled", [False, True])
def test_a_language_model_step_runs_again_with_its_clipping_out_of_reach(tmp_path, doubled):
    """The language model's step (AdamW, its gradient norm 0.86 clipped at 0.5: at full size a doubled
    loss moves the update only by clip_grad_norm_'s epsilon) runs again under the norm, with SGD."""
    edits = [LM_CLIP] + [("    loss.backward()\n    torch.nn", "    (2 * loss).backward()\n    torch.nn")] * doubled
    result = check_file(_planted(tmp_path, CACHE, edits), only=["lm_train_step"])
    (step,) = result.components
    unclipped = step.checks[1]
    assert unclipped.name["en"].startswith("with the gradients under the clipping norm 0.5"), format_report(result)
    assert unclipped.ok != doubled and step.status == ("fail" if doubled else "pass"), format_report(result)
    assert not doubled or any("2 times handformer's" in n["en"] for n in step.notes), format_report(result)


def test_a_layer_that_ignores_its_key_padding_mask_fails_and_its_correct_twin_passes(tmp_path):
    """The layer, and the attention itself (torch.nn's MultiheadAttention: attn_mask, key_padding_mask),
    each driven with the key_padding_mask alone."""
    ignored = _planted(tmp_path, HIDDEN, [(
        "            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float(\"-inf\"))\n",
        "            pass\n")])
    for path, ok in ((str(HIDDEN), True), (ignored, False)):
        result = check_file(path, only=["mha", "encoder_layer"])
        for comp, name in zip(result.components, ("key_padding_mask", "src_key_padding_mask")):
            (alone,) = [c for c in comp.checks if c.name["en"].startswith(f"{name} alone")]
            assert alone.ok == ok and comp.status == ("pass" if ok else "fail"), format_report(result)
        assert [c.kind for c in result.components] == ["mha", "encoder_layer"]


GPT = FIXTURES / "learners_gpt" / "correct.py"
ACTIVATION_PLANTS = {  # what the code promises GELU by, and the edits that compute ReLU there
    "attribute": [("self.gelu = nn.GELU()", "self.gelu = nn.ReLU()")],
    "gpt2": [("self.gelu = nn.GELU()", "self.act = nn.ReLU()"), ("self.gelu(self.c_fc(x))", "self.act(self.c_fc(x))"),
             ("vocab_size: int = 65  # characters of the training text", "vocab_size: int = 50257  # GPT-2's")],
}


@pytest.mark.parametrize("plant", list(ACTIVATION_PLANTS))
def test_a_relu_where_the_code_promises_gelu_is_named(tmp_path, plant):
    result = check_file(_planted(tmp_path, GPT, ACTIVATION_PLANTS[plant]), only=["ffn", "gpt"])
    ffn, model = result.components
    (finding,) = ffn.findings
    assert (finding.name, finding.form, ffn.status) == ("ffn_wrong_activation", "relu_for_gelu", "fail")
    assert ("attribute that holds it" if plant == "attribute" else "GPT-2") in finding.observed["en"]
    assert "self.act = nn.ReLU()" in finding.code or "self.gelu = nn.ReLU()" in finding.code
    # the model's logits match a ReLU model's: its verdict is its MLP's
    assert model.status == "fail" and [(f.name, f.form) for f in model.findings] == [
        ("ffn_wrong_activation", "relu_for_gelu")], format_report(result)


def test_a_relu_applied_in_the_forward_is_quoted_there(tmp_path):
    """The line that applies the activation the FFN computes, not the one that names what it promises."""
    edits = [("self.c_proj(self.gelu(self.c_fc(x)))", "self.c_proj(F.relu(self.c_fc(x)))"),
             ACTIVATION_PLANTS["gpt2"][2]]
    (ffn,) = check_file(_planted(tmp_path, GPT, edits), only=["ffn"]).components
    assert [(f.name, f.code) for f in ffn.findings] == [
        ("ffn_wrong_activation", "return self.dropout(self.c_proj(F.relu(self.c_fc(x))))")]


def test_a_relu_nothing_promises_otherwise_is_a_convention_noted(tmp_path):
    """The original Transformer's FFN is ReLU: with no promise of GELU (a comment naming GPT-2 is none),
    a ReLU passes, named in a note."""
    result = check_file(_planted(tmp_path, GPT, ACTIVATION_PLANTS["gpt2"][:2]), only=["ffn", "gpt"])
    ffn, model = result.components
    assert ffn.status == "pass" and {"en": "activation: relu", "zh": "激活函数：relu"} in ffn.notes
    assert model.status == "pass", format_report(result)


CARRIED = FIXTURES / "learners_carried" / "correct.py"
MODEL_PLANT = ("x = self.pos_encoding(self.tgt_embedding(tgt) * math.sqrt(self.d_model))",
               "x = self.pos_encoding(self.tgt_embedding(tgt))")
NO_STOP = ("        if next_word == end_symbol:\n            break\n", "")


@pytest.mark.parametrize("loop_planted", [False, True])
def test_greedy_decoding_on_a_model_that_failed_its_check_is_judged_as_a_loop(tmp_path, loop_planted):
    edits = [MODEL_PLANT] + ([NO_STOP] if loop_planted else [])
    result = check_file(_planted(tmp_path, CARRIED, edits), only=["transformer", "greedy_decode"])
    model, greedy = result.components
    assert model.status == "fail", format_report(result)
    assert greedy.driven["en"].startswith("your own Transformer: it failed its own check"), format_report(result)
    assert greedy.status == ("fail" if loop_planted else "pass"), format_report(result)
    assert [f.name for f in greedy.findings] == (["greedy_no_stop_at_eos"] if loop_planted else [])


LLAMA = FIXTURES / "learners_llama"


@pytest.mark.parametrize("plant", ["correct", "kv_repeat_order"])
def test_a_complex_rotary_table_under_minimind_s_name_is_handed_as_meta_s(tmp_path, plant):
    """Meta's Llama with its freqs_cis called pos_cis (minimind's name, an assert on its shape): the
    attention, the apply function and the block are driven with the complex table, not NOT CHECKED."""
    source = (LLAMA / f"{plant}.py").read_text(encoding="utf-8").replace("freqs_cis", "pos_cis")
    path = tmp_path / f"{plant}.py"
    path.write_text(source, encoding="utf-8")
    result = check_file(str(path), only=["gqa", "rope", "block"])
    status = {c.name: c.status for c in result.components}
    wrong = "fail" if plant == "kv_repeat_order" else "pass"
    assert status == {"Attention": wrong, "repeat_kv": wrong, "apply_rotary_emb": "pass",
                      "TransformerBlock": wrong}, format_report(result)
    assert plant == "correct" or _only(result, "Attention").has("kv_repeat_order"), format_report(result)


RASCHKA = FIXTURES / "learners_raschka" / "correct.py"
HEADS_FOR_HEAD_SIZE = ("attn_scores / keys.shape[-1] ** 0.5", "attn_scores / keys.shape[1] ** 0.5")


@pytest.mark.parametrize("planted", [False, True])
def test_a_size_read_from_the_wrong_axis_shows_at_sizes_that_all_differ(tmp_path, planted):
    """keys.shape[1] (the heads) for the head size is the right number at check's 4 heads of 4: the
    attention is compared again with 2 heads of 8."""
    result = check_file(_planted(tmp_path, RASCHKA, [HEADS_FOR_HEAD_SIZE] * planted), only=["causal_attention"])
    (attention,) = result.components
    (distinct,) = [c for c in attention.checks if c.name["en"].startswith("with 2 heads of 8")]
    assert distinct.ok != planted and attention.status == ("fail" if planted else "pass"), format_report(result)


RATE_LR_MUL = [("def rate(step, model_size, factor, warmup):", "def rate(step, model_size, warmup, lr_mul=2.0):"),
               ("return factor * (model_size", "return lr_mul * (model_size")]
LOSS_N_CLASS = [("def __init__(self, size, padding_idx, smoothing=0.1):",
                 "def __init__(self, n_class, padding_idx, smoothing=0.1):"), ("self.size = size", "self.size = n_class")]
STEP_TUPLE = [("logits = model(src_part, tgt_part[:, :-1])", "logits, _ = model(src_part, tgt_part[:, :-1])")]
TRAINING = FIXTURES / "learners_training" / "correct.py"
LOSS_NO_PAD = [("def masked_cross_entropy(logits, targets, pad_idx):", "def masked_cross_entropy(logits, targets):"),
               ("    real = (targets != pad_idx).float()\n    return (nll * real).sum() / real.sum()",
                "    return nll.mean()")]
OWN_CLIP = [("def lm_train_step(", "def gradient_clipping(parameters, max_l2_norm):\n"
             "    grads = [p.grad for p in parameters if p.grad is not None]\n"
             "    total = torch.sqrt(sum((g ** 2).sum() for g in grads))\n"
             "    for g in grads:\n        g.mul_(min(1.0, max_l2_norm / (total + 1e-6)))\n\n\ndef lm_train_step("),
            ("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", "gradient_clipping(model.parameters(), 0.5)")]
KV_PAIR = [("def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:",
            "def repeat_kv(x, v, n_rep):\n    return _rep(x, n_rep), _rep(v, n_rep)\n\n\ndef _rep(x, n_rep):"),
           ("        keys = repeat_kv(keys, self.n_rep)", "        keys, values = repeat_kv(keys, values, self.n_rep)"),
           ("        values = repeat_kv(values, self.n_rep)\n", "")]
SETUP_CACHES = [("    def forward(self, idx, targets=None):\n        B, T = idx.size()\n",
                 "    def setup_caches(self, max_batch_size, max_seq_length):\n"
                 "        self.max_seq_length = max_seq_length  # gpt-fast's: the caches' length\n\n"
                 "    def forward(self, idx, targets=None):\n        B, T = idx.size()\n"
                 "        assert T <= self.max_seq_length, 'call setup_caches first'\n")]
SAMPLING = FIXTURES / "learners_sampling" / "correct.py"
LAST_POSITION = [("    logits = apply_temperature(logits, temperature)\n    if top_k",
                  "    logits = apply_temperature(logits[:, -1], temperature)  # (B, S, V): the last position's\n"
                  "    if top_k"),
                 ("    return torch.multinomial(probs, num_samples=1)\n",
                  "    return torch.multinomial(probs, num_samples=1), probs\n"),
                 ("idx_next = sample_next_token(logits[:, -1, :], temperature, top_k)",
                  "idx_next, _ = sample_next_token(logits, temperature, top_k)")]
REFUSES = [("def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):\n",
            "def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):\n"
            "    assert idx.size(1) + max_new_tokens <= model.config.block_size, 'longer than the block'\n")]
OWN_FORMS = {  # a learner's own form of a component, correct and planted: (file, kind, edits, its name)
    "lr_mul": (CARRIED, "schedule", RATE_LR_MUL, "rate"),
    "lr_mul_planted": (CARRIED, "schedule", RATE_LR_MUL + [("step * warmup ** (-1.5)", "step * warmup ** (-0.5)")],
                       "rate"),
    "n_class": (CARRIED, "loss", LOSS_N_CLASS, "LabelSmoothing"),
    "n_class_planted": (CARRIED, "loss", LOSS_N_CLASS + [("true_dist[:, self.padding_idx] = 0", "true_dist[:, 1] = 0")],
                        "LabelSmoothing"),
    "model_returns_a_tuple": (HIDDEN, "train_step", STEP_TUPLE, "train_step"),
    "model_returns_a_tuple_planted": (HIDDEN, "train_step", STEP_TUPLE + [
        ("(loss / accum_steps).backward()", "loss.backward()")], "train_step"),
    "loss_without_pad": (TRAINING, "loss", LOSS_NO_PAD, "masked_cross_entropy"),
    "loss_without_pad_planted": (TRAINING, "loss", LOSS_NO_PAD[:1] + [(
        "    real = (targets != pad_idx).float()\n    return (nll * real).sum() / real.sum()",
        "    return nll.sum() / nll.size(0)")], "masked_cross_entropy"),
    "own_clipping": (CACHE, "lm_train_step", OWN_CLIP, "lm_train_step"),
    "own_clipping_planted": (CACHE, "lm_train_step", OWN_CLIP + [
        ("    loss.backward()\n    gradient", "    (2 * loss).backward()\n    gradient")], "lm_train_step"),
    "keys_and_values": (LLAMA / "correct.py", "gqa", KV_PAIR, "repeat_kv"),
    "keys_and_values_planted": (LLAMA / "correct.py", "gqa", KV_PAIR + [(
        "x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim)",
        "x[:, :, None, :, :].expand(bs, slen, n_rep, n_kv_heads, head_dim)")], "repeat_kv"),
    "setup_caches": (GPT, "gpt", SETUP_CACHES, "GPT"),
    "setup_caches_planted": (GPT, "gpt", SETUP_CACHES + [("        x = self.transformer.ln_f(x)\n", "")], "GPT"),
    "sample_reads_the_last_position": (SAMPLING, "sample", LAST_POSITION, "sample_next_token"),
    "sample_reads_the_last_position_planted": (SAMPLING, "sample", LAST_POSITION + [
        ("logits = top_k_filter(logits, top_k)", "logits = top_k_filter(logits, top_k + 1)")], "sample_next_token"),
    "generate_refuses_past_the_block": (SAMPLING, "generate", REFUSES, "generate"),
    "generate_refuses_past_the_block_planted": (SAMPLING, "generate", REFUSES + [
        ("sample_next_token(logits[:, -1, :]", "sample_next_token(logits[:, 0, :]")], "generate"),
    "rope_table_and_its_apply": (FIXTURES / "learners_hf" / "correct.py", "rope", [], "LlamaRotaryEmbedding"),
    "rope_table_and_its_apply_planted": (FIXTURES / "learners_hf" / "correct.py", "rope", [
        ("emb = torch.cat((freqs, freqs), dim=-1)", "emb = freqs.repeat_interleave(2, dim=-1)")],
                                         "LlamaRotaryEmbedding"),
    "positions_follow_on": (FIXTURES / "learners_llama_gen" / "correct.py", "generate", [], "Llama.generate"),
    "greedy_on_a_passing_model": (CARRIED, "greedy_decode", [], "greedy_decode"),
    "greedy_on_a_passing_model_planted": (CARRIED, "greedy_decode", [
        ("next_word = model.fc_out(out[:, -1])", "next_word = model.fc_out(out[:, 0])")], "greedy_decode"),
}


@pytest.mark.parametrize("form", list(OWN_FORMS))
def test_a_component_in_a_learner_s_own_form_is_built_and_driven(tmp_path, form):
    """A schedule's multiplier named lr_mul (jadore801120's), a label-smoothing loss sized by n_class, a
    step that unpacks `logits, _ = model(...)` (bentrevett's model returns the attention too), a loss
    with no pad id (CS336's cross_entropy: a mean over every target), a step clipping with its own
    gradient_clipping (CS336's), Mistral's repeat_kv(keys, values, repeats), a model
    that runs after setup_caches, a sampling step that reads logits[:, -1] and returns (token, probs),
    a loop that asserts it stays within the block (gpt-fast's), greedy decoding that reads the first
    position on a model that passed (steered along a path, each position's choice differs), a rotary
    table of interleaved pairs beside an apply function of halves: each checked, the correct one passing and the planted one failing."""
    source, kind, edits, name = OWN_FORMS[form]
    result = check_file(_planted(tmp_path, source, edits), only=[kind])
    status = _only(result, name).status
    assert status == ("fail" if form.endswith("_planted") else "pass"), format_report(result)


# a cached loop's calls: (tokens fed, the position passed); the first three are right
POSITIONS = {"prompt_then_one_by_one": ([(3, 0), (1, 3), (1, 4)], False),
             "prompt_fed_again_from_0": ([(3, 0), (4, 0)], False),
             "first_new_token_at_T_minus_1": ([(3, 0), (1, 2), (1, 3)], True),
             "start_pos_left_at_0": ([(3, 0), (1, 0)], True)}


@pytest.mark.parametrize("case", list(POSITIONS))
def test_a_cached_loop_s_positions_must_go_on_from_the_call_before(case):
    """gpt-fast's input_pos (or Meta's start_pos) after the prompt: a first new token at T - 1
    overwrites the prompt's last in the cache, and a tiny model's tokens may not show it."""
    import types

    import torch

    from handformer.check.runners.generate_loop import Call, Run, _positions_break

    fed, broken = POSITIONS[case]
    calls = [Call(torch.zeros(2, n, dtype=torch.long), start, torch.zeros(2, n), True, start) for n, start in fed]
    run = Run({"en": "", "zh": ""}, types.SimpleNamespace(calls=calls), torch.zeros(2, 3), 2)
    assert (_positions_break(run) is not None) == broken


KEEP_TOP = [("logits = top_k_filter(logits, top_k)", "logits = keep_top(logits, top_k)"),
            ("    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n", ""),
            ("def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None):",
             "def sample_next_token(logits, temperature=1.0, top_k=None):"),
            ("@torch.no_grad()\ndef generate(", "def keep_top(logits, k):\n"
             "    pivot = torch.topk(logits, k).values[..., -1:]\n"
             "    return logits.masked_fill(logits <= pivot, float('-inf'))  # the k-th dropped too\n\n\n"
             "@torch.no_grad()\ndef generate(")]


def test_a_mistake_in_a_helper_is_quoted_there_before_the_rest_of_the_file(tmp_path):
    """The sampling step calls a helper of its own (gpt-fast's logits_to_probs) that drops the k-th
    token: named from the draws, quoted in the helper, not at a `<=` elsewhere in the file."""
    result = check_file(_planted(tmp_path, SAMPLING, KEEP_TOP), only=["sample"])
    (finding,) = _only(result, "sample_next_token").findings
    assert (finding.name, finding.code) == ("top_k_off_by_one", "return logits.masked_fill(logits <= pivot, "
                                            "float('-inf'))  # the k-th dropped too"), format_report(result)


def test_a_norm_computed_in_a_helper_method_is_quoted_in_the_helper(tmp_path):
    """Meta's RMSNorm computes in `_norm(x)`: the square of the mean in place of the mean of the
    squares departs at the helper's return, not at the forward's call of it."""
    planted = ("return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
               "return x * torch.rsqrt(x.mean(-1, keepdim=True) ** 2 + self.eps)")
    result = check_file(_planted(tmp_path, LLAMA / "correct.py", [planted]), only=["rmsnorm"])
    (norm,) = result.components
    assert norm.status == "fail" and any(planted[1] in f.observed["en"] for f in norm.findings), format_report(result)
