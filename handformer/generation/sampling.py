"""Pure logit filters for sampling the next token: no model, only (..., V) logits in and out.

    logits -> apply_temperature -> top_k_filter -> top_p_filter -> sample (or argmax when t = 0)

`SamplingOptions` is how one sequence chooses its tokens: every door (`generate`, a chat, the
server's routes, GRPO's rollouts) builds one, checked once when it is made, and hands it to the
decoding engine as it is. Its `speculate` (a `Speculation`) asks the engine to draft tokens ahead
and check them in one forward (speculative.py): the same tokens when greedy, the same distribution
when sampling, fewer forwards.

Shape legend: B batch, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.settings import is_int, is_number, positive_int

# Cumulative probabilities this close to top_p count as reaching it, so float rounding of e.g.
# 0.5 + 0.3 does not pull one more token into the nucleus at p = 0.8.
TOP_P_TOLERANCE = 1e-6


def check_sampling_options(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the first sampling option that is out of range."""
    if not is_number(temperature) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and (not is_number(top_p)
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding of a row (generation/speculative.py): guess `tokens` ahead, check them
    in one forward of the model, keep what the acceptance rule keeps."""

    tokens: int = 7  # K: the most tokens drafted per forward (fewer after a rejection: DraftLength)
    ngram: int = 3  # prompt lookup: the last n tokens (n from this down to 1) are looked up earlier
    draft_model: Any = None  # a smaller CausalLM with the same vocabulary; None: prompt lookup

    def __post_init__(self) -> None:
        if not is_int(self.tokens) or self.tokens < 1:
            raise ValueError(f"speculate.tokens (tokens drafted per step) must be an integer >= 1, "
                             f"got {self.tokens!r}")
        if not is_int(self.ngram) or self.ngram < 1:
            raise ValueError(f"speculate.ngram (the longest n-gram looked up) must be an integer >= 1, "
                             f"got {self.ngram!r}")
        if self.draft_model is not None and not hasattr(getattr(self.draft_model, "cfg", None), "vocab_size"):
            raise ValueError("speculate.draft_model must be a decoder-only model (a CausalLM, e.g. "
                             "load_lm(run_dir).model) or None for prompt lookup")


@dataclass(frozen=True)
class SamplingOptions:
    """How a row chooses its tokens; checked when it is made (a ValueError names the field)."""

    temperature: float = 1.0  # 0 = greedy (argmax)
    top_k: int | None = None  # keep the k most likely tokens
    top_p: float | None = None  # keep the smallest set whose probability reaches p
    seed: int | None = None  # None: a random seed
    top_logprobs: int | None = None  # None: no log-probabilities; n >= 0: the token's and n others'
    speculate: Speculation | None = None  # None: one token per forward

    def __post_init__(self) -> None:
        check_sampling_options(self.temperature, self.top_k, self.top_p)
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        n = self.top_logprobs
        if n is not None and (not is_int(n) or n < 0):
            raise ValueError(f"top_logprobs must be None or an integer >= 0, got {n!r}")
        if self.speculate is not None and not isinstance(self.speculate, Speculation):
            raise ValueError(f"speculate must be a Speculation or None, got {type(self.speculate).__name__}")

    def generator(self, device: torch.device, choice: int = 0) -> torch.Generator:
        """The row's own generator: seeded with seed + choice, or randomly."""
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed + choice)
        return generator


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """(..., V) logits divided by `temperature` (> 1 flattens, < 1 sharpens the distribution).

    Temperature 0 is the limit t -> 0: the argmax keeps its logit and every other token gets -inf
    (with ties, the first maximal index wins, as in `argmax`)."""
    if not temperature >= 0:  # also rejects NaN
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if temperature == 0:
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(
            -1, logits.argmax(-1, keepdim=True), True)
        return logits.masked_fill(~keep, float("-inf"))
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row, set the rest to -inf.

    Ties at the boundary are all kept: every token whose logit equals the k-th largest survives,
    so more than k tokens remain when several share that value (which one would be dropped is
    otherwise arbitrary). k >= V keeps everything."""
    positive_int("top_k", k)
    if k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose total probability is
    >= p (Holtzman et al., 2019), set the rest to -inf.

    A token is kept when the probability of the tokens ranked above it is still below p, so the
    most likely token is always kept and the set is never empty. p = 1 keeps everything. Tokens
    with equal probability are ranked by index (a stable sort)."""
    if not is_number(p) or not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")
    if p >= 1:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (..., V)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs  # probability ranked strictly above each token
    keep_sorted = mass_above < p - TOP_P_TOLERANCE
    keep_sorted[..., 0] = True  # the most likely token, even when p is below the tolerance
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to vocabulary order
    return logits.masked_fill(~keep, float("-inf"))


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> Tensor:
    """The documented order: temperature, then top-k, then top-p (top-p measures probability
    after temperature and among the top-k survivors only)."""
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits


def greedy(logits: Tensor) -> Tensor:
    """(..., V) logits -> (...) the argmax of each row, the first maximal index on ties (as `argmax`).
    `max(-1).indices`: torch 2.13 on a CPU at GPT-2's vocabulary took 68 µs a row against `argmax`'s
    123, and 216 µs against 668 for a check's 5 rows (docs/benchmarks.md, "Speculative decoding")."""
    return logits.max(-1).indices


def next_tokens(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """(B, V) logits -> (B,) token ids: argmax when temperature is 0, else a sample from the
    filtered distribution drawn with `generator`."""
    if temperature == 0:
        return greedy(logits)
    probs = torch.softmax(filter_logits(logits.float(), temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
