"""`handformer check` on a decoder-only model's beam search with a KV cache: found by its signature
(a model, a prompt and a beam width, no start symbol), driven through the learner's own model with
its logits steered and its cache made to carry the token ids, and graded by beam search's runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_lm_beam"


def test_the_cached_attention_model_and_beam_search_pass():
    """The attention's forward(x, cache=None) is driven without a cache (not handed a key as its
    cache), and the search through the model's cache of one (B, T, 2D) tensor a layer."""
    result = check_file(str(FAMILY / "correct.py"))
    statuses = [(c.name, c.kind, c.status) for c in result.components]
    assert statuses == [("CachedAttention", "causal_attention", "pass"), ("MiniGPT", "gpt", "pass"),
                        ("decode_with_beams", "beam_search", "pass")], format_report(result)
    assert "KV cache" in result.components[-1].driven["en"]


@pytest.mark.parametrize(("plant", "only", "name", "line"), [
    ("beam_eos_not_emitted", ["gpt", "beam_search"], "beam_eos_not_emitted", 85),
    # the finished hypothesis stored as the prefix before EOS, in a list of another name: its line
    ("finalized_without_eos", ["gpt", "beam_search"], "beam_eos_not_emitted", 85),
    # the search alone: its model, not checked in this run, is built and drives it
    ("first_position", ["beam_search"], "beam_one_not_greedy", 76)])
def test_a_planted_search_is_named_at_its_line(plant: str, only: list[str], name: str, line: int):
    result = check_file(str(FAMILY / f"{plant}.py"), only=only)
    search = result.components[-1]
    assert [c.status for c in result.components] == ["pass"] * (len(only) - 1) + ["fail"], format_report(result)
    assert [(f.name, f.line) for f in search.findings] == [(name, line)]


def test_a_search_that_blocks_repeated_ngrams_is_graded():
    """A search with an n-gram block of its own (no_repeat_ngram_size) over a model without a cache is
    driven and graded, never check's own error; ranked by the last token alone, it FAILs."""
    for name, status in [("ngram_blocked", "pass"), ("ngram_blocked_not_accumulated", "fail")]:
        result = check_file(str(FAMILY / f"{name}.py"), only=["gpt", "beam_search"])
        assert [c.status for c in result.components] == ["pass", status], format_report(result)


HF_SEARCH = '''import torch
import torch.nn.functional as F


def beam_search(model, input_ids, num_beams=2, max_new_tokens=8, eos_token_id=None, length_penalty=1.0):
    """Any Hugging Face causal LM (model(ids).logits); input_ids (1, T) -> (1, T + L)."""
    alive, done = [(0.0, [])], []
    for _ in range(max_new_tokens):
        new = torch.tensor([t for _, t in alive], dtype=torch.long).view(len(alive), -1)
        logp = F.log_softmax(model(torch.cat([input_ids.repeat(len(alive), 1), new], 1)).logits[:, -1], -1)
        totals = torch.tensor([s for s, _ in alive])[:, None] + logp
        best, flat = totals.view(-1).topk(2 * num_beams)
        keep = []
        for rank, (score, i) in enumerate(zip(best.tolist(), flat.tolist())):
            row, token = divmod(i, logp.size(-1))
            tokens = alive[row][1] + [token]
            if token == eos_token_id:
                if rank < num_beams:
                    done.append((score / len(tokens) ** length_penalty, tokens))
            elif len(keep) < num_beams:
                keep.append((score, tokens))
        if len(done) >= num_beams:
            break
        alive = keep
    else:
        done += [(s / len(t) ** length_penalty, t) for s, t in alive]
    return torch.cat([input_ids, torch.tensor([max(done)[1]])], dim=1)
'''


def test_a_search_over_a_model_its_file_does_not_define_is_driven_by_a_stand_in(tmp_path):
    """A decoder-only search written for any Hugging Face causal LM (the file defines no model) is
    handed a stand-in whose `.logits` are each scenario's table; reading the first position is named."""
    path = tmp_path / "hf_search.py"
    path.write_text(HF_SEARCH)
    (search,) = check_file(str(path)).components
    assert search.status == "pass" and "stand-in decoder-only" in search.driven["en"], format_report(
        check_file(str(path)))
    path.write_text(HF_SEARCH.replace(".logits[:, -1]", ".logits[:, 0]"))
    (search,) = check_file(str(path)).components
    assert [(f.name, f.line) for f in search.findings] == [("beam_one_not_greedy", 10)], format_report(
        check_file(str(path)))


HF_LAYOUT = '''import torch
import torch.nn.functional as F


@torch.no_grad()
def beam_search(model, input_ids, num_beams=2, max_length=12, eos_token_id=None, length_penalty=1.0):
    """Hugging Face's layout: num_beams copies of the prompt, kept apart by -1e9 until they differ."""
    prompt = input_ids.shape[1]
    beams = input_ids.repeat(num_beams, 1)  # (K, T)
    beam_scores = torch.zeros(num_beams)
    beam_scores[1:] = -1e9
    finished = []  # (score / length ** length_penalty, new tokens)
    while beams.shape[1] < max_length:
        log_probs = F.log_softmax(model(beams).logits[:, -1, :], dim=-1)  # (K, V)
        next_scores = log_probs + beam_scores[:, None]
        top_scores, top_ids = next_scores.view(-1).topk(2 * num_beams)
        kept = []
        for rank, (score, i) in enumerate(zip(top_scores.tolist(), top_ids.tolist())):
            row, token = divmod(i, log_probs.shape[-1])
            if token == eos_token_id and rank < num_beams:
                new = beams[row, prompt:].tolist() + [token]
                finished.append((score / len(new) ** length_penalty, new))
            elif token != eos_token_id and len(kept) < num_beams:
                kept.append((score, row, token))
        beams = torch.stack([torch.cat([beams[row], torch.tensor([token])]) for _, row, token in kept])
        beam_scores = torch.tensor([score for score, _, _ in kept])
        worst = sorted(finished, reverse=True)[num_beams - 1][0] if len(finished) >= num_beams else None
        if worst is not None and worst >= beam_scores.max().item() / (beams.shape[1] - prompt) ** length_penalty:
            break
    finished += [(s / (beams.shape[1] - prompt) ** length_penalty, beams[r, prompt:].tolist())
                 for r, s in enumerate(beam_scores.tolist())] * (not finished)
    return torch.cat([input_ids[0], torch.tensor(max(finished)[1])]).unsqueeze(0)
'''


def test_hugging_faces_layout_with_the_scores_not_summed_is_named(tmp_path):
    """Hugging Face's layout (K copies of the prompt, beam_scores[1:] = -1e9) passes; dropping the sum
    (next_scores = log_probs) leaves every copy live and stops at the length reached: named at its line."""
    path = tmp_path / "hf_layout.py"
    path.write_text(HF_LAYOUT)
    (search,) = check_file(str(path)).components
    assert search.status == "pass", format_report(check_file(str(path)))
    path.write_text(HF_LAYOUT.replace("next_scores = log_probs + beam_scores[:, None]", "next_scores = log_probs"))
    (search,) = check_file(str(path)).components
    assert [(f.name, f.line) for f in search.findings] == [("beam_scores_not_accumulated", 15)], format_report(
        check_file(str(path)))
