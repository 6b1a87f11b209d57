"""Decoding for the encoder-decoder model: batched greedy search and batched beam search.

Both encode the source once; cross-attention keys/values are computed at the first step and reused
(KV cache), and decoder self-attention keeps past keys/values, so each step costs one position.
`use_cache=False` recomputes everything from scratch; the outputs are identical (a test pins it).

Shape legend: B batch, K beam size, S source length, L generated length, V vocabulary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from handformer.config import _fail
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.modes import eval_mode


@dataclass
class DecodeLimits:
    bos_id: int
    eos_id: int
    pad_id: int
    max_len_a: float = 1.5  # a hypothesis may have at most a * source length + b tokens
    max_len_b: int = 10

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            _fail("DecodeLimits", name, getattr(self, name), fix)

        for name in ("bos_id", "eos_id", "pad_id", "max_len_b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                fail(name, "it must be an integer >= 0")
        if not (isinstance(self.max_len_a, (int, float)) and math.isfinite(self.max_len_a)
                and self.max_len_a >= 0):
            fail("max_len_a", "it must be a number >= 0")

    def max_lengths(self, src: Tensor, max_positions: int) -> Tensor:
        """(B,) the longest output per sentence (EOS included), relative to its real source length.
        An output of m tokens feeds the decoder BOS + its first m - 1: m positions at most."""
        src_len = (src != self.pad_id).sum(-1)  # (B,)
        limit = (self.max_len_a * src_len.float()).floor().long() + self.max_len_b
        return limit.clamp(min=1, max=max_positions)


def _step_logprobs(model: Seq2SeqTransformer, ys: Tensor, memory: Tensor, src_mask: Tensor,
                   cache, limits: DecodeLimits) -> Tensor:
    """Log-probabilities (N, V) of the next token after the prefixes ys (N, L).

    Padding and BOS are never valid outputs: they get log-probability -inf (a generated pad would
    also be masked out of self-attention without a cache but not with one)."""
    inputs = ys[:, -1:] if cache is not None else ys  # only the new position with a cache
    h, _, _ = model.decode(inputs, memory, src_mask, cache=cache)  # (N, L or 1, D)
    logp = torch.log_softmax(model.generator(h[:, -1]).float(), dim=-1)  # (N, V)
    logp[:, [limits.pad_id, limits.bos_id]] = float("-inf")
    return logp


def best_reachable(score: float, length: int, max_length: int, length_penalty: float) -> float:
    """The best normalized score (sum / length^length_penalty) that a live hypothesis with summed
    log-probability `score` <= 0 and `length` tokens can still reach. Its sum can only fall, and it
    ends with between length + 1 and max_length tokens; s / n^p with s <= 0 is largest where n^p
    is largest: at the longest length for p >= 0, at the shortest for p < 0 (short outputs are
    favoured)."""
    n = max_length if length_penalty >= 0 else min(length + 1, max_length)
    return score / n ** length_penalty


DecodeFn = TypeVar("DecodeFn", bound=Callable)


def _in_eval_mode(fn: DecodeFn) -> DecodeFn:
    """Run a decoding function with the model in eval mode (dropout off), then restore its flag."""
    @functools.wraps(fn)
    def wrapper(model: Seq2SeqTransformer, *args, **kwargs):
        with eval_mode(model):
            return fn(model, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


@torch.no_grad()
@_in_eval_mode
def greedy_decode(model: Seq2SeqTransformer, src: Tensor, limits: DecodeLimits,
                  use_cache: bool = True) -> Tensor:
    """(B, S) source ids -> (B, L) output ids (no BOS), EOS then only padding after it."""
    memory, src_mask, _ = model.encode(src)  # (B, S, D)
    B = src.size(0)
    max_lens = limits.max_lengths(src, model.cfg.max_positions)  # (B,)
    steps = int(max_lens.max())
    cache = model.new_cache(steps) if use_cache else None  # BOS + steps - 1 tokens
    ys = torch.full((B, 1), limits.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    for t in range(steps):
        next_token = _step_logprobs(model, ys, memory, src_mask, cache, limits).argmax(-1)  # (B,)
        next_token = next_token.masked_fill(finished, limits.pad_id)
        # A sentence at its length limit ends with EOS.
        next_token = torch.where(~finished & (t + 1 >= max_lens), limits.eos_id, next_token)
        ys = torch.cat([ys, next_token[:, None]], dim=1)  # (B, t + 2)
        finished |= next_token == limits.eos_id
        if finished.all():
            break
    return ys[:, 1:]


@torch.no_grad()
@_in_eval_mode
def beam_search(model: Seq2SeqTransformer, src: Tensor, limits: DecodeLimits, beam_size: int = 4,
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
    cache = model.new_cache(steps) if use_cache else None  # BOS + steps - 1 tokens
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
