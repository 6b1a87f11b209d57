"""Beam search, vectorized over sentences and candidates, against the beam search it replaced (a
Python loop over every sentence and candidate of every step, kept here verbatim as the reference):
the same outputs on random models, with length penalties below, at and above zero, beam sizes 1 to
many, length limits and padded batches."""

import math

import helpers
import pytest
import torch
from helpers import scaled_seq2seq
from torch import Tensor

from handformer.generation import decoding
from handformer.generation.cache import DecodingCache
from handformer.generation.decoding import (
    DecodeLimits,
    _in_eval_mode,
    _step_logprobs,
    beam_search,
    best_reachable,
    greedy_decode,
)
from handformer.models.seq2seq import Seq2SeqTransformer

PAD, BOS, EOS, UNK = 0, 1, 2, 3

pytestmark = pytest.mark.usefixtures("one_thread")


# The beam search before vectorization, verbatim but for its name.
@torch.no_grad()
@_in_eval_mode
def loop_beam_search(model: Seq2SeqTransformer, src: Tensor, limits: DecodeLimits, beam_size: int = 4,
                length_penalty: float = 0.6, use_cache: bool = True) -> list[list[int]]:
    """Batched beam search. Returns, per sentence, the best hypothesis (ids ending in EOS) under
    score = sum of log-probabilities / length^length_penalty (length counts the EOS).

    Finished hypotheses (those that emitted EOS) leave the beam and are never extended; an EOS
    finishes a hypothesis only when it ranks among the K best candidates of its step (as in
    fairseq and Hugging Face), so beam size 1 with length_penalty 0 is greedy search. At its
    length limit a hypothesis must emit EOS (as in greedy decoding). A sentence
    stops when no live hypothesis can still beat its `beam_size` best finished ones
    (`best_reachable`, right for negative length penalties too).
    """
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size={beam_size!r} is invalid: it must be an integer >= 1")
    if not (isinstance(length_penalty, (int, float)) and math.isfinite(length_penalty)):
        raise ValueError(f"length_penalty={length_penalty!r} is invalid: it must be a finite number")
    K = beam_size
    B = src.size(0)
    memory, src_mask, _ = model.encode(src)  # (B, S, D)
    memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, D)
    src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
    max_lens = limits.max_lengths(src, model.cfg.max_positions).tolist()
    steps = max(max_lens)
    cache = DecodingCache(model.cfg.n_decoder_layers, steps) if use_cache else None  # BOS + steps - 1 tokens
    ys = torch.full((B * K, 1), limits.bos_id, dtype=torch.long, device=src.device)  # (B*K, 1)
    # Every beam starts as the same empty hypothesis: only beam 0 may expand at the first step.
    scores = torch.full((B, K), float("-inf"), device=src.device)  # (B, K) summed log-probs
    scores[:, 0] = 0.0
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    done = [False] * B

    def normalized(score: float, length: int) -> float:
        return score / (length ** length_penalty)

    for t in range(steps):
        logp = _step_logprobs(model, ys, memory, src_mask, cache, limits)  # (B*K, V)
        V = logp.size(-1)
        logp = logp.view(B, K, V)  # (B, K, V)
        at_limit = torch.tensor([t + 1 >= m for m in max_lens], device=src.device)  # (B,)
        if at_limit.any():  # at its length limit a hypothesis can only end: force EOS
            only_eos = torch.full_like(logp[0, 0], float("-inf"))
            only_eos[limits.eos_id] = 0.0
            logp = torch.where(at_limit[:, None, None], logp + only_eos, logp)
        candidates = (scores[:, :, None] + logp).view(B, K * V)  # (B, K*V)
        top_scores, top_idx = candidates.topk(min(2 * K, K * V), dim=-1)  # (B, 2K)
        top_scores, top_idx = top_scores.tolist(), top_idx.tolist()
        new_scores = torch.full((B, K), float("-inf"), device=src.device)
        origin = torch.zeros(B, K, dtype=torch.long, device=src.device)  # beam each slot came from
        tokens = torch.full((B, K), limits.pad_id, dtype=torch.long, device=src.device)
        length = t + 1  # tokens in a hypothesis after this step, EOS included
        for b in range(B):
            if done[b]:
                continue
            slot = 0
            for rank, (score, idx) in enumerate(zip(top_scores[b], top_idx[b])):
                if score == float("-inf"):
                    break
                beam, token = divmod(idx, V)
                if token == limits.eos_id:
                    if rank < K:  # an EOS ranked below the K best candidates is not in the beam
                        prefix = ys[b * K + beam, 1:].tolist()
                        finished[b].append((normalized(score, length), prefix + [limits.eos_id]))
                    continue
                if slot < K:
                    new_scores[b, slot], origin[b, slot], tokens[b, slot] = score, beam, token
                    slot += 1
            finished[b].sort(key=lambda h: -h[0])
            del finished[b][K:]
            live_best = new_scores[b].max().item()
            bound = (best_reachable(live_best, length, max_lens[b], length_penalty)
                     if live_best > float("-inf") else -math.inf)
            if length >= max_lens[b] or (len(finished[b]) >= K and finished[b][-1][0] >= bound):
                done[b] = True
        if all(done):
            break
        index = (origin + torch.arange(B, device=src.device)[:, None] * K).view(-1)  # (B*K,)
        ys = torch.cat([ys.index_select(0, index), tokens.view(-1, 1)], dim=1)  # (B*K, t + 2)
        scores = new_scores
        if cache is not None:  # every beam of a sentence attends to the same source: keep cross K/V
            cache.reorder(index, cross=False)
    return [max(f, key=lambda h: h[0])[1] if f else [limits.eos_id] for f in finished]


# --- the tests ----------------------------------------------------------------------------------

def random_model(seed: int, vocab: int = 12, scale: float = 2.0, eos_bias: float = 0.0,
                 norm_placement: str = "post") -> Seq2SeqTransformer:
    """A random model with its matrices scaled up (next-token distributions far from flat); eos_bias
    is added to EOS's output logit (> 0: hypotheses finish early and at different steps)."""
    model = scaled_seq2seq(seed, vocab=vocab, scale=scale, n_decoder_layers=2, max_positions=24,
                           norm_placement=norm_placement)
    if eos_bias:
        def hook(module, inputs, output):
            output = output.clone()
            output[..., EOS] += eos_bias
            return output
        model.generator.register_forward_hook(hook)
    return model


def random_sources(seed: int, lengths: list[int], vocab: int = 12) -> torch.Tensor:
    """(B, S) right-padded sources of the given real lengths (EOS included)."""
    return helpers.random_sources(seed, lengths, vocab, PAD, EOS, UNK)


LENGTHS = [5, 2, 9, 3, 7, 1, 6]  # one padded batch; a source of just EOS too


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam_size", [1, 2, 5])
@pytest.mark.parametrize("length_penalty", [-1.0, 0.0, 0.6, 2.0])
def test_vectorized_equals_the_loop(seed, beam_size, length_penalty):
    model = random_model(seed, scale=1.0 + seed % 3, eos_bias=seed % 2 * 2.0,
                         norm_placement="pre" if seed % 2 else "post")
    src = random_sources(seed, LENGTHS)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0 + seed % 2, max_len_b=seed)
    expected = loop_beam_search(model, src, limits, beam_size, length_penalty)
    assert beam_search(model, src, limits, beam_size, length_penalty) == expected
    if seed == 0:
        assert beam_search(model, src, limits, beam_size, length_penalty, use_cache=False) == expected


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("length_penalty", [-0.5, 0.0, 1.0])
def test_sentences_that_finish_at_different_steps_leave_the_batch_unchanged(seed, length_penalty):
    """A batch of 12 sources whose searches end at different steps (by their length limits or
    their finished hypotheses): the sentences still searching give what they give alone and what
    the loop gives."""
    model = random_model(seed, scale=2.5, eos_bias=-1.0)
    src = random_sources(seed, [2, 3, 4, 5, 6, 7, 8, 3, 5, 9, 2, 4])
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.5, max_len_b=3)
    found = beam_search(model, src, limits, 4, length_penalty)
    assert found == loop_beam_search(model, src, limits, 4, length_penalty)
    assert len(set(map(len, found))) > 1  # the sentences did finish at different steps
    for i in (0, 5, 9):
        one = src[i: i + 1, : int((src[i] != PAD).sum())]
        assert beam_search(model, one, limits, 4, length_penalty) == [found[i]]


@pytest.mark.parametrize("seed", range(4))
def test_beam_of_one_without_length_penalty_is_greedy(seed):
    model = random_model(seed, eos_bias=seed % 2 * 1.5)
    src = random_sources(seed, LENGTHS)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0, max_len_b=3)
    greedy = greedy_decode(model, src, limits).tolist()
    assert beam_search(model, src, limits, 1, 0.0) == [row[: row.index(EOS) + 1] for row in greedy]


@pytest.mark.parametrize("max_len_a, max_len_b", [(0.0, 0), (0.0, 1), (0.5, 2), (1.0, 100)])
@pytest.mark.parametrize("length_penalty", [-1.0, 0.6])
def test_length_limits_force_eos_as_the_loop_does(max_len_a, max_len_b, length_penalty):
    """EOS made unlikely: the length limit (per sentence, up to the model's positions) ends the
    hypotheses; a limit of 0 still gives a one-token output, the EOS."""
    model = random_model(1, eos_bias=-20.0)
    src = random_sources(1, LENGTHS)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=max_len_a, max_len_b=max_len_b)
    found = beam_search(model, src, limits, 3, length_penalty)
    assert found == loop_beam_search(model, src, limits, 3, length_penalty)
    max_lens = limits.max_lengths(src, model.cfg.max_positions).tolist()
    assert [len(hyp) for hyp in found] == max_lens
    assert all(hyp[-1] == EOS and EOS not in hyp[:-1] for hyp in found)


@pytest.mark.parametrize("beam_size", [2, 3, 6])
def test_a_vocabulary_smaller_than_the_beam_leaves_slots_empty_as_the_loop_does(beam_size):
    """Four tokens (pad, BOS, EOS and one word): each hypothesis has two continuations, so the
    first steps cannot fill the beam."""
    model = random_model(2, vocab=4)
    src = random_sources(2, [3, 1, 4], vocab=4)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0, max_len_b=2)
    for length_penalty in (-1.0, 0.0, 1.0):
        assert (beam_search(model, src, limits, beam_size, length_penalty)
                == loop_beam_search(model, src, limits, beam_size, length_penalty))


def test_reorder_can_select_the_cross_attention_rows_by_their_own_index():
    """Beam search dropping a finished sentence: self-attention rows follow the surviving beams,
    cross-attention rows the kept sentences' beams."""
    cache = DecodingCache(n_layers=1, max_length=6)
    g = torch.Generator().manual_seed(0)
    cache.layer(0).update(torch.randn(4, 2, 3, 5, generator=g), torch.randn(4, 2, 3, 5, generator=g))
    cache.advance(3)
    cache.cross[0] = (torch.randn(4, 2, 7, 5, generator=g), torch.randn(4, 2, 7, 5, generator=g))
    keys, cross = cache.keys[0], cache.cross[0]
    cache.reorder(torch.tensor([3, 3]), cross=torch.tensor([2, 3]))
    assert torch.equal(cache.keys[0][:, :, :3], keys[[3, 3], :, :3])
    assert torch.equal(cache.cross[0][0], cross[0][[2, 3]]) and torch.equal(cache.cross[0][1], cross[1][[2, 3]])


@pytest.mark.parametrize("initial", [1, 3])
def test_a_cache_that_starts_small_and_grows_gives_the_same_outputs(monkeypatch, initial):
    """The beam search's cache doubles as hypotheses lengthen (here from 1 or 3 positions)."""
    monkeypatch.setattr(decoding, "INITIAL_BEAM_CACHE", initial)
    model = random_model(3, eos_bias=-1.0)
    src = random_sources(3, LENGTHS)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0, max_len_b=6)
    for length_penalty in (-1.0, 0.6):
        assert (beam_search(model, src, limits, 3, length_penalty)
                == loop_beam_search(model, src, limits, 3, length_penalty))


def test_reorder_can_change_the_capacity_and_keeps_what_is_filled():
    cache = DecodingCache(n_layers=1, max_length=4)
    k, v = torch.randn(2, 2, 3, 5), torch.randn(2, 2, 3, 5)
    cache.layer(0).update(k, v)
    cache.advance(3)
    cache.reorder(torch.tensor([1, 0]), cross=False, capacity=8)
    assert cache.keys[0].shape == (2, 2, 8, 5) and cache.slots == cache.max_length == 8
    assert torch.equal(cache.keys[0][:, :, :3], k[[1, 0]]) and torch.equal(cache.values[0][:, :, :3], v[[1, 0]])
    keys, _ = cache.layer(0).update(torch.ones(2, 2, 5, 5), torch.ones(2, 2, 5, 5))  # room for 5 more
    assert keys.shape == (2, 2, 8, 5) and torch.equal(keys[:, :, :3], k[[1, 0]])
    with pytest.raises(ValueError, match="cannot resize a KV cache of 3 positions to capacity 2"):
        _filled_cache(3).reorder(torch.tensor([0]), capacity=2)
    with pytest.raises(ValueError, match="rolling window"):
        DecodingCache(1, 8, window=4).reorder(torch.tensor([0]), capacity=16)


def _filled_cache(n: int) -> DecodingCache:
    cache = DecodingCache(n_layers=1, max_length=4)
    cache.layer(0).update(torch.randn(1, 2, n, 5), torch.randn(1, 2, n, 5))
    cache.advance(n)
    return cache
