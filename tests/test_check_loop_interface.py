"""Loops driven through the interface they use (tests/fixtures/learners_loop_interface/):

- a loop that reads attribute chains off the model it is handed (`model.config.block_size`,
  `model.max_seq_len`, `model.config.eos_token_id`, `model.params.max_seq_len`) is handed a stand-in
  that carries them (core/carried.py): checked, and a planted mistake named;
- a generation loop that calls a method of its model beyond forward (`model.step(token, pos, caches)`,
  `model.init_state(B)` and `model.forward_one(ids, state)`) is driven with the learner's own model and
  judged against that model's full forward; where the file has no model, NOT CHECKED naming the method;
- a beam search over a model that returns (logits, None) or (None, logits) is driven (the None is not
  read as logits or a cache), never a grader error.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.carried import carry
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = Path(__file__).parent / "fixtures" / "learners_loop_interface"
STEP_LOOP = '''import torch


@torch.no_grad()
def generate(model, prompt, max_new_tokens):
    tokens, caches = prompt.clone(), None
    for t in range(prompt.size(1)):
        logits, caches = model.step(tokens[:, t], t, caches)
    for _ in range(max_new_tokens):
        next_token = logits.argmax(dim=-1)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        logits, caches = model.step(next_token, tokens.size(1) - 1, caches)
    return tokens
'''
LOSS_FIRST = (("        return logits, loss\n", "        return loss, logits\n"),
              ("            logits, _ = model(", "            _, logits = model("))
# an optimizer that sets its own rate (Adafactor's relative step): its groups' lr is None
OWN_RATE = ("def get_batch", '''class OwnRateSGD(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, dict(lr=None))
        self.steps = 0

    @torch.no_grad()
    def step(self):
        self.steps += 1
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-0.01 / self.steps ** 0.5)


def get_batch''')
# an engine class that holds the model (`self.model = model`) and calls it: no method beyond forward
ENGINE = ("\n\n@torch.no_grad()\ndef sample(", '''

class Engine:
    def __init__(self, model: LM):
        self.model = model

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens):
        ids, block = prompt_ids, self.model.pos.num_embeddings
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.model(ids[:, -block:])[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


@torch.no_grad()
def sample(''')
# name: (fixture, edits, the kinds checked)
CASES = {
    "config_block": ("train_config_block", (), None),
    "config_block_clip_after": ("train_config_block", ((
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)\n        optimizer.step()\n",
        "        optimizer.step()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)\n"),), None),
    "own_rate": ("train_config_block", (OWN_RATE, (
        "torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.1)", "OwnRateSGD(model.parameters())")),
        None),
    "max_seq_len": ("train_max_seq_len", (), None),
    "max_seq_len_no_zero_grad": ("train_max_seq_len", (("        opt.zero_grad()\n", ""),), None),
    "config_ids": ("generate_config_ids", (), None),
    "config_ids_first": ("generate_config_ids", (("model(input_ids)[:, -1, :]", "model(input_ids)[:, 0, :]"),),
                         None),
    "params_window": ("generate_params_window", (), None),
    "params_window_first": ("generate_params_window", (("tokens[:, -window:]", "tokens[:, :window]"),), None),
    "step_cached": ("step_cached", (), ["generate"]),
    "step_cached_position": ("step_cached", (("tokens.size(1) - 1, caches)", "tokens.size(1), caches)"),),
                             ["generate"]),
    # its model's forward planted (no final norm): the model fails its check, and still drives the loop
    "step_cached_model_wrong": ("step_cached", (("        return self.head(self.ln_f(x))  # (B, T, vocab_size)",
                                                 "        return self.head(x)  # (B, T, vocab_size)"),),
                                ["gpt", "generate"]),
    "state_sampling": ("state_sampling", (), ["generate"]),
    "engine": ("state_sampling", (ENGINE,), ["generate"]),
    "state_sampling_refed": ("state_sampling", (("model.forward_one(nxt, state)", "model.forward_one(out, state)"),),
                             ["generate"]),
    "beam_loss_none": ("beam_loss_none", (), ["beam_search"]),
    "beam_loss_first": ("beam_loss_none", LOSS_FIRST, ["beam_search"]),
    "beam_not_accumulated": ("beam_loss_none", (("(score + lp, seq + [tok])", "(lp, seq + [tok])"),),
                             ["beam_search"]),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loop_interface")
    (folder / "step_no_model.py").write_text(STEP_LOOP, encoding="utf-8")
    out = {"step_no_model": check_file(str(folder / "step_no_model.py"))}
    for name, (fixture, edits, only) in CASES.items():
        out[name] = check_file(planted_copy(folder, name, FOLDER / f"{fixture}.py", *edits), only=only)
    return out


def _loop(result):
    return result.components[-1]


@pytest.mark.parametrize("name", ["config_block", "own_rate", "max_seq_len", "config_ids", "params_window", "step_cached",
                                  "state_sampling", "engine", "beam_loss_none", "beam_loss_first"])
def test_the_correct_loop_is_checked_and_passes(results, name):
    result = results[name]
    assert [c.status for c in result.components] == ["pass"] * len(result.components), format_report(result)


@pytest.mark.parametrize(("name", "said"), [
    ("config_block", "model.config.block_size = 16"), ("max_seq_len", "model.max_seq_len = 16, model.vocab_size = 13"),
    ("config_ids", "model.config.eos_token_id = -1, model.config.pad_token_id = 0"),
    ("params_window", "model.params.seq_length = 8")])
def test_what_the_stand_in_carries_is_said(results, name, said):
    notes = [n["en"] for n in _loop(results[name]).notes]
    assert any(said in n and "stand-in carries" in n for n in notes), notes
    assert any("替身带上了" in n["zh"] for n in _loop(results[name]).notes)


@pytest.mark.parametrize(("name", "mistake"), [
    ("config_block_clip_after", "train_step_clip_after_step"), ("max_seq_len_no_zero_grad", "train_step_no_zero_grad"),
    ("config_ids_first", None), ("params_window_first", "generate_no_crop"), ("step_cached_position", None),
    ("state_sampling_refed", None), ("step_cached_model_wrong", None),
    ("beam_not_accumulated", "beam_scores_not_accumulated")])
def test_a_planted_loop_fails(results, name, mistake):
    loop = _loop(results[name])
    assert loop.status == "fail", format_report(results[name])
    assert mistake is None or mistake in [f.name for f in loop.findings], format_report(results[name])


@pytest.mark.parametrize(("name", "said"), [("step_cached", "model.step(...)"), ("step_cached_model_wrong", "model.step(...)"),
                                            ("state_sampling", "model.forward_one(...), model.init_state(...)")])
def test_a_loop_that_calls_its_model_s_own_methods_is_driven_by_that_model(results, name, said):
    loop = _loop(results[name])
    assert "your own" in loop.driven["en"], format_report(results[name])
    assert any(said in n["en"] and "full forward" in n["en"] for n in loop.notes), loop.notes


def test_a_method_no_model_of_the_file_has_is_not_checked_and_named(results):
    (loop,) = results["step_no_model"].components
    assert loop.status == "not_checked", format_report(results["step_no_model"])
    assert loop.error.kind == "cannot_call" and "model.step(...)" in loop.error.message, loop.error.message
    assert "model.step(...)" in loop.error.message_zh


def _reads_a_tokenizer(model, idx):
    stop = model.tokenizer.eos_token_id
    shown = model.tokenizer.decode(idx)
    return idx[:, -model.config.block_size:], stop, shown


def test_a_chain_through_an_object_the_loop_calls_methods_of_is_not_carried():
    """`model.tokenizer.eos_token_id` beside `model.tokenizer.decode(...)`: the tokenizer is an object
    with methods, not a holder of values, so the stand-in is not given a namespace for it (its missing
    attribute then names the tokenizer); `model.config.block_size` is carried."""
    stand_in = types.SimpleNamespace()
    pairs = carry(stand_in, _reads_a_tokenizer, "model", {"context": 8, "eos": 3})
    assert pairs == [("model.config.block_size", 8)] and not hasattr(stand_in, "tokenizer"), pairs
