"""Speculative decoding: guess the next K tokens cheaply, check them all in one forward of the model,
and keep the longest run the model agrees with (Leviathan et al., 2023; Chen et al., 2023).

At batch 1 on a CPU a decoding step reads every weight once for one token; a forward over K + 1
positions reads them once too, so each accepted guess is a token for (almost) nothing. The engine
(engine.py) runs one speculative step as:

    draft   = drafter.propose(context, K)          # K guesses (and what they were drawn from)
    logits  = model([last token, *draft])          # (K + 1, V): one forward, into the KV cache
    tokens  = accept_draft(p, draft, q)            # the accepted guesses and one token more
    cache.truncate(...)                            # forget the positions of rejected guesses

Two drafters:
- `PromptLookup` (no second model): the last n tokens are looked up earlier in the context and
  what followed them there is the draft. It pays on repetitive text: code, a quoted document.
- `DraftModel`: a smaller model with the same vocabulary drafts K tokens, one forward each.

K changes step by step (`DraftLength`): up to `Speculation.tokens` while the model keeps every
guess, one more than it kept after a rejection.

The rule (`accept_draft`) keeps sampling exact: guess x drawn from q is kept with probability
min(1, p(x) / q(x)); at the first guess that is not, a token is drawn from max(0, p - q),
renormalized, and the step ends; when every guess is kept, a token is drawn from the next p. Each
emitted token is then distributed as p, the distribution plain decoding samples from (after
temperature, top-k and top-p). A prompt-lookup guess is certain (q is 1 at x); with temperature
0, p is 1 at the argmax, so the rule keeps exactly the guesses plain greedy decoding would choose.

Shape legend: K draft tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from handformer.generation.prefix_cache import common_prefix
from handformer.generation.sampling import SamplingOptions, Speculation, filter_logits, greedy
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode


@dataclass
class SpeculationStats:
    """How speculation went: guesses drafted and accepted, forwards of the model that checked them."""

    drafted: int = 0
    accepted: int = 0
    forwards: int = 0  # speculative steps (one forward each)
    tokens: int = 0  # tokens those steps emitted

    @property
    def rate(self) -> float:
        """The acceptance rate: accepted / drafted (0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def __str__(self) -> str:
        forwards = max(self.forwards, 1)
        per, drafted = self.tokens / forwards, self.drafted / forwards
        return (f"speculation: {self.accepted} of {self.drafted} drafted tokens accepted "
                f"({self.rate:.0%}), {per:.2f} tokens per forward ({drafted:.2f} drafted)")


@dataclass
class DraftLength:
    """How many tokens a row's next speculative step drafts: `most` at first and after a step whose
    guesses were all kept (twice as many as that step drafted, up to `most`); after a rejection, one
    more than were kept. A long run the model agrees with then takes fewer checks, and guesses that
    keep failing cost a check of one or two tokens, which the fused step runs in about a one-token
    step's time (docs/benchmarks.md, "Speculative decoding")."""

    most: int
    next: int = field(init=False)  # the next step's number of guesses

    def __post_init__(self) -> None:
        self.next = self.most

    def update(self, drafted: int, kept: int) -> None:
        """After a step that drafted `drafted` guesses and kept the first `kept`."""
        self.next = min(self.most, 2 * drafted if kept == drafted else kept + 1)


def sampled_probabilities(logits: Tensor, options: SamplingOptions) -> Tensor:
    """(..., V) logits -> the probabilities plain decoding samples from: temperature, top-k, top-p
    (temperature 0: 1 at the argmax)."""
    return torch.softmax(filter_logits(logits.float(), options.temperature, options.top_k, options.top_p), -1)


def accept_draft(target: Tensor, draft: Sequence[int], proposal: Tensor | None,
                 generator: torch.Generator | None) -> list[int]:
    """The tokens a speculative step emits: the accepted guesses and one more.

    target: (K + 1, V) probabilities plain decoding would sample from after each guess's context
    (row i: before guess i; row K: after every guess). draft: the K guesses. proposal: (K, V) the
    distributions they were drawn from; None: each guess was certain (prompt lookup, greedy)."""
    for i, token in enumerate(draft):
        q = 1.0 if proposal is None else float(proposal[i, token])
        u = float(torch.rand((), generator=generator, device=target.device))
        if u * q < float(target[i, token]):  # kept with probability min(1, p / q)
            continue
        if proposal is None:  # q is 1 at the guess: p without it
            residual = target[i].clone()
            residual[token] = 0
        else:
            residual = (target[i] - proposal[i]).clamp_min(0)  # (V,) what q under-covers of p
        if not float(residual.sum()) > 0:  # p == q up to rounding: a rejection had probability 0
            residual = target[i]
        return [*draft[:i], int(torch.multinomial(residual, 1, generator=generator))]
    return [*draft, int(torch.multinomial(target[-1], 1, generator=generator))]


def accept_greedy(logits: Tensor, draft: Sequence[int]) -> list[int]:
    """`accept_draft` at temperature 0, where p is 1 at each row's argmax: the guesses up to the first
    that is not its row's argmax, then that row's argmax (plain greedy decoding's token). The same
    tokens without building the (K + 1, V) probabilities or drawing from them (at GPT-2's vocabulary
    about 3 ms a draw). logits: (K + 1, V)."""
    best = greedy(logits).tolist()  # (K + 1,) what plain greedy decoding picks after each context
    for i, token in enumerate(draft):
        if token != best[i]:
            return [*draft[:i], best[i]]
    return [*draft, best[-1]]


def prompt_lookup(context: Sequence[int], k: int, ngram: int) -> list[int]:
    """k tokens that followed the latest earlier occurrence of the context's last n tokens, trying
    n = ngram first, down to 1; [] when none occurs. A copy that reaches the end of the context
    goes on copying what it has just copied (text repeating with a period shorter than k)."""
    for n in range(min(ngram, len(context) - 1), 0, -1):
        tail = list(context[-n:])
        for start in range(len(context) - n - 1, -1, -1):  # the latest occurrence first
            if context[start] == tail[0] and list(context[start:start + n]) == tail:
                copied = list(context[start + n:])  # what followed, up to the end of the context
                while len(copied) < k:
                    copied.append(copied[len(copied) - (len(context) - start - n)])  # one period back
                return copied[:k]
    return []


class PromptLookup:
    """Drafts from the context itself (no second model): `prompt_lookup`; `length` says how many."""

    def __init__(self, ngram: int, tokens: int) -> None:
        self.ngram, self.length = ngram, DraftLength(tokens)

    def propose(self, context: Sequence[int], k: int, options: SamplingOptions,
                generator: torch.Generator | None) -> tuple[list[int], Tensor | None]:
        return prompt_lookup(context, k, self.ngram), None  # certain guesses


class DraftModel:
    """Drafts with a smaller model of the same vocabulary, keeping its own KV cache of the context
    (cut back to what the big model accepted at the next proposal); `length` says how many."""

    def __init__(self, model: CausalLM, tokens: int) -> None:
        self.model, self.length = model, DraftLength(tokens)
        self.cache = model.new_cache(model.cfg.max_positions)
        self.held: list[int] = []  # the tokens whose keys and values the cache holds
        self.device = next(model.parameters()).device

    def propose(self, context: Sequence[int], k: int, options: SamplingOptions,
                generator: torch.Generator | None) -> tuple[list[int], Tensor | None]:
        """k guesses drawn from the draft model's own distribution under the row's options, and
        those distributions ((k, V); None when greedy: each guess is its argmax, certain)."""
        k = min(k, self.model.cfg.max_positions - len(context) + 1)
        if k < 1:
            return [], None
        keep = min(common_prefix(self.held, context), len(context) - 1)  # run >= 1 token for logits
        if self.cache.keeps_states and keep < self.cache.length:
            keep = 0  # linear attention's state cannot forget positions: the context all again
        self.cache.truncate(keep)
        fed, tokens, drawn = list(context[keep:]), [], []
        self.held = list(context[:keep])
        with eval_mode(self.model):
            for _ in range(k):
                token = self._one(fed, options, generator, drawn)
                tokens.append(token)
                fed = [token]
        return tokens, torch.stack(drawn) if drawn else None  # (K, V)

    def _one(self, fed: list[int], options: SamplingOptions, generator: torch.Generator | None,
             drawn: list[Tensor]) -> int:
        """Run `fed` into the draft's cache and draw its next token (its distribution to `drawn`)."""
        ids = torch.tensor([fed], device=self.device)  # (1, T)
        logits = self.model(ids, cache=self.cache, logits_to_keep=1).logits[0, -1]  # (V,)
        self.held += fed
        if options.temperature == 0:
            return int(greedy(logits))
        q = sampled_probabilities(logits, options)  # (V,)
        drawn.append(q)
        return int(torch.multinomial(q, 1, generator=generator))


def drafter_for(spec: Speculation, model: CausalLM) -> PromptLookup | DraftModel:
    """The drafter a row's `Speculation` asks for, checked against the model it drafts for."""
    if spec.draft_model is None:
        return PromptLookup(spec.ngram, spec.tokens)
    draft = spec.draft_model
    if draft.cfg.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"speculate.draft_model has a vocabulary of {draft.cfg.vocab_size} tokens but the "
                         f"model has {model.cfg.vocab_size}; a draft model must share the model's tokenizer")
    if draft.cfg.sliding_window is not None:
        raise ValueError("speculate.draft_model uses a sliding window, whose rolling KV cache cannot be cut "
                         "back; draft with a model without one, or with prompt lookup (draft_model=None)")
    return DraftModel(draft, spec.tokens)


def check_speculation(model: CausalLM, processors: Sequence[object]) -> None:
    """Refuse what speculation cannot do exactly: a grammar's (or any) logit processors, which
    follow one token at a time, and a sliding-window model, whose rolling cache overwrites the
    slots a rejected guess would need back."""
    if processors:
        raise ValueError("speculative decoding cannot run under a grammar or other logit processors "
                         "(they follow one token at a time); leave out speculate, or the constraint")
    if model.cfg.sliding_window is not None:
        raise ValueError("speculative decoding needs a KV cache it can cut back, and a sliding-window "
                         "model's cache rolls over the slots a rejected guess would need; leave out "
                         "speculate for this model")


__all__ = ["DraftLength", "DraftModel", "PromptLookup", "SpeculationStats", "accept_draft", "accept_greedy",
           "check_speculation", "drafter_for", "sampled_probabilities", "prompt_lookup"]
