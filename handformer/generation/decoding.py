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
from handformer.generation.cache import DecodingCache
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.modes import eval_mode
from handformer.settings import is_int


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
            if not is_int(value) or value < 0:
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
    logp[:, limits.pad_id] = float("-inf")
    logp[:, limits.bos_id] = float("-inf")
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


class FinishedHypotheses:
    """The `beam_size` best finished hypotheses of each sentence, best first.

    scores (B, K) float64: sum of log-probabilities / length^length_penalty, -inf for an empty slot;
    tokens (B, K, L_max): each hypothesis's ids, EOS last, then padding."""

    def __init__(self, n_sentences: int, beam_size: int, max_length: int, pad_id: int,
                 device: torch.device) -> None:
        self.scores = torch.full((n_sentences, beam_size), float("-inf"), dtype=torch.float64,
                                 device=device)  # (B, K)
        self.tokens = torch.full((n_sentences, beam_size, max_length), pad_id, dtype=torch.long,
                                 device=device)  # (B, K, L_max)

    def add(self, scores: Tensor, tokens: Tensor) -> None:
        """Merge newly finished hypotheses, scores (B, K) (-inf where none finished) and tokens
        (B, K, L_max), keeping the K best; on a tie the one that finished first ranks first."""
        K = self.scores.size(1)
        all_scores = torch.cat([self.scores, scores], dim=1)  # (B, 2K)
        best = all_scores.sort(dim=1, descending=True, stable=True).indices[:, :K]  # (B, K)
        self.scores = all_scores.gather(1, best)  # (B, K)
        all_tokens = torch.cat([self.tokens, tokens], dim=1)  # (B, 2K, L_max)
        best = best[:, :, None].expand(-1, -1, all_tokens.size(2))  # (B, K, L_max)
        self.tokens = all_tokens.gather(1, best)  # (B, K, L_max)

    def full(self) -> Tensor:
        """(B,) bool: whether a sentence has K finished hypotheses."""
        return self.scores[:, -1] > float("-inf")

    def worst(self) -> Tensor:
        """(B,) the score of the K-th best finished hypothesis (-inf while there are fewer)."""
        return self.scores[:, -1]

    def best(self, sentence: int, eos_id: int) -> list[int]:
        """The best finished hypothesis of a sentence, up to its EOS ([EOS] if none finished)."""
        if self.scores[sentence, 0] == float("-inf"):
            return [eos_id]
        ids = self.tokens[sentence, 0].tolist()
        return ids[: ids.index(eos_id) + 1]

    def select(self, sentences: Tensor) -> None:
        """Keep the given sentences (B',), in that order."""
        self.scores, self.tokens = self.scores[sentences], self.tokens[sentences]  # (B', K), (B', K, L_max)


INITIAL_BEAM_CACHE = 16  # positions


def _room_for(cache: DecodingCache, positions: int, most: int) -> int:
    """A cache capacity for `positions` positions: the current one, or doubled (at most `most`)."""
    return cache.slots if positions <= cache.slots else min(most, max(positions, 2 * cache.slots))


def _best_candidates(scores: Tensor, logp: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best continuations of each sentence's live hypotheses, best first: their summed
    log-probabilities (B, 2K), the beam each extends (B, 2K) and its token (B, 2K).

    scores: (B, K) summed log-probabilities of the live hypotheses (-inf for an empty beam);
    logp: (B, width, V) next-token log-probabilities of each row (width 1 broadcasts over K)."""
    B, V = scores.size(0), logp.size(-1)
    candidates = (scores[:, :, None] + logp).view(B, K * V)  # (B, K*V)
    top_scores, top_idx = candidates.topk(min(2 * K, K * V), dim=-1)  # (B, 2K)
    return top_scores, top_idx // V, top_idx % V


def _ended_hypotheses(ys: Tensor, beam: Tensor, K: int, eos_id: int, pad_id: int, max_length: int) -> Tensor:
    """(B, K, max_length) the hypotheses that the K best candidates of this step would finish:
    the prefix of the beam each extends (ys (B*K, t + 1) without its BOS), EOS, then padding."""
    B, t = beam.size(0), ys.size(1) - 1
    tokens = torch.full((B, K, max_length), pad_id, dtype=torch.long, device=ys.device)  # (B, K, L_max)
    if t > 0:  # (one row per sentence only at the first step, t = 0)
        prefix = ys.view(B, K, t + 1)[:, :, 1:]  # (B, K, t)
        tokens[:, :, :t] = prefix.gather(1, beam[:, :K, None].expand(-1, -1, t))  # (B, K, t)
    tokens[:, :, t] = eos_id
    return tokens


def _live_hypotheses(top_scores: Tensor, beam: Tensor, token: Tensor, is_eos: Tensor, K: int,
                     pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """The K best candidates that are not EOS, in rank order: summed log-probabilities (B, K), the
    beam each extends (B, K), the token it appends (B, K). A slot without a finite candidate (a
    vocabulary of a few tokens) gets -inf, beam 0 and padding."""
    live = torch.argsort(is_eos.byte(), dim=1, stable=True)[:, :K]  # (B, K): ranks, EOS last
    scores = top_scores.gather(1, live)  # (B, K)
    empty = scores == float("-inf")  # (B, K)
    return (scores, beam.gather(1, live).masked_fill(empty, 0),
            token.gather(1, live).masked_fill(empty, pad_id))


# Inference mode, not just no_grad: no version counters or view tracking on the many small
# tensors of a step (about 10% of a beam search on a small model); only lists of ids leave it.
@torch.inference_mode()
@_in_eval_mode
def beam_search(model: Seq2SeqTransformer, src: Tensor, limits: DecodeLimits, beam_size: int = 4,
                length_penalty: float = 0.6, use_cache: bool = True) -> list[list[int]]:
    """Batched beam search. Returns, per sentence, the best hypothesis (ids ending in EOS) under
    score = sum of log-probabilities / length^length_penalty (length counts the EOS).

    Each sentence keeps K = beam_size live hypotheses, ranked by summed log-probability. At each
    step every live hypothesis proposes every next token; of the K * V candidates the 2K best are
    taken (at most K are EOS, so at least K are not):
    - an EOS among the K best candidates finishes its hypothesis (as in fairseq and Hugging Face):
      it leaves the beam, is scored as above and joins the sentence's K best finished ones, and is
      never extended; an EOS ranked below the K best is not in the beam and is dropped;
    - the K best candidates that are not EOS are the new live hypotheses.
    So beam size 1 with length_penalty 0 is greedy search. At its length limit a hypothesis must
    emit EOS (as in greedy decoding). A sentence is done at its length limit, or when it has K
    finished hypotheses and no live one can still beat the worst of them (`best_reachable`, right
    for negative length penalties too).

    Every sentence is handled at once with tensor operations (the loop is over steps), and a done
    sentence leaves the batch: its rows of the KV cache and of the encoder output go, so later
    steps decode only the sentences still searching. Rows are sentence-major: row b * K + k holds
    beam k of sentence b.
    """
    if not is_int(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size={beam_size!r} is invalid: it must be an integer >= 1")
    if not (isinstance(length_penalty, (int, float)) and math.isfinite(length_penalty)):
        raise ValueError(f"length_penalty={length_penalty!r} is invalid: it must be a finite number")
    K, B, device = beam_size, src.size(0), src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    max_lens = limits.max_lengths(src, model.cfg.max_positions)  # (B,)
    steps = int(max_lens.max())
    # The cache starts small and doubles when full, up to BOS + steps - 1 tokens: most searches
    # end long before their length limit, and a smaller cache is faster to reorder.
    cache = DecodingCache(model.cfg.n_decoder_layers, min(steps, INITIAL_BEAM_CACHE)) if use_cache else None
    # n^length_penalty for every length n >= 1, as Python floats (the divisor of a finished score).
    length_power = torch.tensor([1.0] + [float(n) ** length_penalty for n in range(1, steps + 2)],
                                dtype=torch.float64, device=device)  # (steps + 2,)
    # Every beam starts as the same empty hypothesis, so the first step decodes one row per
    # sentence (width 1) and only beam 0 may expand; from the second step on, K rows per sentence.
    width = 1
    ys = torch.full((B, 1), limits.bos_id, dtype=torch.long, device=device)  # (B*width, 1)
    scores = torch.full((B, K), float("-inf"), device=device)  # (B, K) summed log-probs
    scores[:, 0] = 0.0
    finished = FinishedHypotheses(B, K, steps, limits.pad_id, device)
    sentence_ids = list(range(B))  # the sentence of `src` in each row of the batch
    outputs: list[list[int]] = [[limits.eos_id] for _ in range(B)]
    first_limit = int(max_lens.min())  # the first step at which some sentence reaches its limit
    # best_reachable's divisor, when it does not depend on the step (length_penalty >= 0).
    reach_power = length_power[max_lens] if length_penalty >= 0 else None  # (B,)

    for t in range(steps):
        length = t + 1  # tokens in a hypothesis after this step, EOS included
        logp = _step_logprobs(model, ys, memory, src_mask, cache, limits)  # (B*width, V)
        logp = logp.view(B, width, -1)  # (B, width, V)
        at_limit = max_lens <= length if length >= first_limit else None  # (B,)
        if at_limit is not None:  # at its length limit a hypothesis can only end: force EOS
            only_eos = torch.full_like(logp[0, 0], float("-inf"))  # (V,)
            only_eos[limits.eos_id] = 0.0
            logp = torch.where(at_limit[:, None, None], logp + only_eos, logp)
        top_scores, beam, token = _best_candidates(scores, logp, K)  # (B, 2K) each
        is_eos = token == limits.eos_id  # (B, 2K)

        ends = is_eos[:, :K] & (top_scores[:, :K] > float("-inf"))  # (B, K): EOS among the K best
        if ends.any():
            normalized = top_scores[:, :K].double() / length_power[length]  # (B, K)
            finished.add(normalized.masked_fill(~ends, float("-inf")),
                         _ended_hypotheses(ys, beam, K, limits.eos_id, limits.pad_id, steps))
        scores, origin, new_token = _live_hypotheses(top_scores, beam, token, is_eos, K, limits.pad_id)

        power = reach_power if reach_power is not None else length_power[max_lens.clamp(max=length + 1)]
        can_reach = scores.max(dim=1).values.double() / power  # (B,): best_reachable, every sentence
        done = finished.full() & (finished.worst() >= can_reach)  # (B,)
        if at_limit is not None:
            done |= at_limit
        rows = (origin + torch.arange(B, device=device)[:, None] * width).view(-1)  # (B*K,) rows extended
        if done.any() or width == 1:
            for i in done.nonzero()[:, 0].tolist():
                outputs[sentence_ids[i]] = finished.best(i, limits.eos_id)
            if done.all():
                break
            # Done sentences leave the batch (and after the first step each sentence's one row
            # becomes K); each live hypothesis gets its own row of the encoder output and of the
            # cross-attention keys/values (the rows of one sentence are copies).
            kept = (~done).nonzero()[:, 0]  # (B',)
            rows = rows.view(B, K)[kept].view(-1)  # (B'*K,)
            source_rows = (kept * width).repeat_interleave(K)  # (B'*K,)
            memory, src_mask = memory[source_rows], src_mask[source_rows]  # (B'*K, S, D), (B'*K, 1, 1, S)
            scores, new_token, max_lens = scores[kept], new_token[kept], max_lens[kept]  # (B', K), (B',)
            reach_power = reach_power[kept] if reach_power is not None else None  # (B',)
            finished.select(kept)
            sentence_ids = [sentence_ids[i] for i in kept.tolist()]
            first_limit = int(max_lens.min())
            B, width = kept.numel(), K
            if cache is not None:
                cache.reorder(rows, cross=source_rows, capacity=_room_for(cache, length + 1, steps))
        elif cache is not None:  # every beam of a sentence attends to the same source: keep cross K/V
            cache.reorder(rows, cross=False, capacity=_room_for(cache, length + 1, steps))
        ys = torch.cat([ys[rows], new_token.view(-1, 1)], dim=1)  # (B*K, t + 2)
    return outputs
