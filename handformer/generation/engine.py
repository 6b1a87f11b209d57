"""The one decoding engine of the decoder-only model: prefill, step, sample, stop, for a batch of rows
that join and leave.

Every caller drives it: `generate` (a batch of prompts), `ChatSession` (one row whose KV cache lives
across turns), the playground's `Generation` (one row, one step at a time, each step's logits kept)
and serve's continuous batching (rows join and leave between steps). Only the engine chooses
tokens (it is the one caller of `next_tokens`).

    add(rows)  prefill: the new rows' prompts in one left-padded forward; each row's first token
    step()     one forward over every row's newest token; each row chooses its next
    a row ends at a stop token or at max_new_tokens (or when its caller finishes or cancels it)

A row samples with its own options and its own torch.Generator seeded from `options.seed` (choice
i of one request: seed + i), so a seeded row gives the same tokens alone or among others. A row
may carry logit processors (called with the tokens it has chosen and the (V,) logits; the hook
constrained decoding uses; one with a `prepare(tokens)` method is also told its row's tokens once
the whole batch has chosen, to start on the next step's work) and asks for the log-probabilities
of its tokens (`top_logprobs`: of the distribution it samples from).

A row whose options speculate (`SamplingOptions.speculate`; speculative.py), while it is the
engine's only row, takes speculative steps: its drafter guesses K tokens, one forward checks them,
the acceptance rule keeps some and adds one, and the cache is cut back (`truncate`) to the
positions fed; such a step hands back several choices. The forward that checks the guesses runs
through the fused C step where it serves the model (inference/fused_step.py: every weight read once
for all K + 1 tokens, each token's logits those of a one-token step). With other rows it steps plainly.

The rows live in one KV cache (generation/cache.py: DecodingCache), each right-aligned with padding
on its left that the attention mask hides (True = a real position); the model counts positions
from the mask, so a padded row sees the positions it would see alone. Joining rows are prefilled
together, then regrouped with the rows that stay. `compact=True` (serve) drops finished rows at
the next step; otherwise they stay, fed padding that the mask hides, until every row is done.

With a `prefix_cache` (generation/prefix_cache.py), a prompt whose beginning an earlier prefill
stored is prefilled on its own: a copy of the cached positions, then a forward over the rest;
the other prompts are prefilled together as above, and every prompt's positions are stored
(not for a LongRoPE model, below: a stored prefix's keys are turned with one set of factors).

LongRoPE models (Phi-3.5, Phi-4-mini) turn queries and keys with one set of factors while every
position of a forward is within the pre-training context and with the other set once one is past
it. The keys in the cache were turned with the set of the forward that wrote them, so the first
step that changes set runs every position again, into the same cache, with the new set (as
transformers' generate does when Phi-3 passes its original context).

Shape legend: B rows, S columns (the longest row so far), C capacity, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from handformer.generation.cache import DecodingCache, held_rows
from handformer.generation.prefix_cache import Hit, PrefixCache
from handformer.generation.sampling import SamplingOptions, filter_logits, greedy, next_tokens
from handformer.generation.speculative import (
    DraftModel,
    PromptLookup,
    SpeculationStats,
    accept_draft,
    accept_greedy,
    check_speculation,
    drafter_for,
    sampled_probabilities,
)
from handformer.inference.fused_step import FusedStep, fused_step_for
from handformer.inference.static_step import CAPACITY_STEP, StaticStep
from handformer.models.causal_lm import CausalLM
from handformer.nn.kv_cache import KVCache
from handformer.settings import int_at_least

LogitProcessor = Callable[[Sequence[int], Tensor], Tensor]  # (tokens chosen so far, (V,) logits) -> (V,)


@dataclass(eq=False)
class Row:
    """One sequence being generated: its prompt, limits and options, and what it has chosen."""

    prompt: list[int]
    max_new_tokens: int  # >= 1
    options: SamplingOptions = SamplingOptions()
    stop_ids: frozenset[int] = frozenset()  # tokens that end the row (the stop token is kept)
    choice: int = 0  # the seed offset: choice i of a request samples with seed + i
    processors: tuple[LogitProcessor, ...] = ()
    keep_logits: bool = False  # hand each step's (V,) logits back (the playground shows them)
    tokens: list[int] = field(default_factory=list)  # chosen so far
    finish_reason: str | None = None  # "stop", "length" or "cancelled" once done
    cancelled: bool = False  # set from any thread: the row leaves at the next step
    generator: torch.Generator | None = field(default=None, repr=False)  # given, or made by the engine
    speculation: SpeculationStats | None = None  # with options.speculate: counts drafts (made if None)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def finish(self, reason: str) -> None:
        """End the row (a caller's own stop rule: serve's stop strings)."""
        self.finish_reason = self.finish_reason or reason

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Choice:
    """A row's token at one step, and what it was chosen from."""

    row: Row
    token: int
    logprob: float | None = None  # log-probability of the token (when top_logprobs is set)
    top: list[tuple[int, float]] | None = None  # the top_logprobs likeliest (id, log-probability)
    logits: Tensor | None = None  # (V,), when the row keeps them


class Engine:
    """Decodes the rows given to `add`, one `step` at a time. Not thread-safe: one caller drives it
    (serve's engine thread, under the model's lock)."""

    def __init__(self, model: CausalLM, *, pad_id: int = 0, compact: bool = False,
                 use_cache: bool = True, static_step: StaticStep | FusedStep | None = None,
                 prefix_cache: PrefixCache | None = None) -> None:
        """pad_id: fed to finished rows that stay in the batch. use_cache=False recomputes every
        position at each step (slow; for testing the cache). static_step: the model's compiled
        one-token step (inference/static_step.py), run when the batch allows it (no padding, every
        row live; else the model eagerly); the prefill's cache capacity is then rounded up to a
        multiple of CAPACITY_STEP. Without one, a Llama-style or GPT-2-style model steps through its
        fused C step where that applies (inference/fused_step.py). prefix_cache: kept across batches
        (serve's), whose prefixes prefills reuse."""
        self.model, self.pad_id, self.compact, self.use_cache = model, pad_id, compact, use_cache
        self.prefix_cache = prefix_cache if use_cache else None
        if prefix_cache is not None and model.cfg.linear_layers:
            raise ValueError("a prefix cache keeps keys and values of positions, but this model's linear-"
                             "attention layers keep one state a row; decode it without a prefix cache")
        if prefix_cache is not None and prefix_cache.sliding_window != model.cfg.sliding_window:
            raise ValueError("the prefix cache was made for another sliding window than the model's; "
                             "make it with PrefixCache(..., sliding_window=model.cfg.sliding_window)")
        self.static = (static_step or fused_step_for(model)) if use_cache else None
        self.device = next(model.parameters()).device
        self.rows: list[Row] = []
        self.cache: KVCache | None = None
        self.lengths: list[int] = []  # real positions of each row
        self.mask: Tensor | None = None  # (B, C) True = a real position; columns < width in use
        self.ids: Tensor | None = None  # (B, C) every position's token (without a cache only)
        self.width = 0  # S: columns in use
        self.steps = 0  # decoding steps run (prefills not counted)
        self.largest_batch = 0  # the most rows one step has decoded
        self._chosen: Tensor | None = None  # (B,) the last step's argmax, while it is every row's token
        self.drafters: dict[int, PromptLookup | DraftModel] = {}  # id(row) -> a speculating row's drafter
        # the frequencies a forward of n positions turns keys with (one set, unless the rotary
        # module's change with the length): cached keys of another set are stale
        self.key_set = frequency_set(model)
        self.cached_set: int | None = self.key_set(0)  # the set of the cached keys (None: mixed)
        if self.key_set(1) != self.key_set(model.cfg.max_positions):  # a stored prefix's could be either
            self.prefix_cache = None

    @property
    def long_keys(self) -> bool | None:
        """Whether the cached keys were turned with the second set of frequencies (LongRoPE's long
        factors); None: rows of both sets."""
        return None if self.cached_set is None else bool(self.cached_set)

    @property
    def live(self) -> list[Row]:
        return [row for row in self.rows if not row.done]

    # --- joining ------------------------------------------------------------------------------
    def add(self, rows: Sequence[Row], cache: KVCache | None = None) -> list[Choice]:
        """Prefill the new rows and choose each one's first token. Rows with the same prompt share
        one prefill. `cache`: for a single row only, a one-row cache already holding the first
        `cache.length` positions of its prompt (a chat's earlier turns): only the rest is run.
        Returns the first choices; rows that are not done join the batch."""
        if self.rows and not self.compact:
            raise ValueError("rows join a running batch only in a compact engine (Engine(..., compact=True))")
        rows = [row for row in rows if not row.cancelled]
        if not rows:
            return []
        for row in rows:
            check_row(row, self.model.cfg.max_positions)
            row.generator = row.generator or row.options.generator(self.device, row.choice)
            if row.options.speculate is not None:
                check_speculation(self.model, row.processors)
                self.drafters[id(row)] = drafter_for(row.options.speculate, self.model)
                row.speculation = row.speculation or SpeculationStats()
        prompts = list(dict.fromkeys(tuple(row.prompt) for row in rows))
        if cache is not None:
            logits, sources = self._resume(rows, cache)
        else:
            logits, sources = self._prefill_all(prompts, rows)
        by_prompt = {p: i for i, p in enumerate(prompts)}
        which = [by_prompt[tuple(row.prompt)] for row in rows]
        choices = self._choose(rows, logits[which])
        had_rows, joining_set = bool(self.rows), self.key_set(max(len(p) for p in prompts))
        self._join(rows, which, sources, [len(p) for p in prompts])
        if self.rows and any(not row.done for row in rows):  # the joining rows' keys are in the cache
            self.cached_set = joining_set if not had_rows or self.cached_set == joining_set else None
        return choices

    def _prefill_all(self, prompts: list[tuple[int, ...]], rows: list[Row]) -> tuple[Tensor, list]:
        """The prompts' last logits (P, V) and where each prompt's keys and values are: (cache,
        row) pairs. Prompts with a cached prefix are run one by one on a copy of it; the others
        together."""
        hits = {} if self.prefix_cache is None else {
            i: hit for i, p in enumerate(prompts) if (hit := self.prefix_cache.lookup(p)) is not None}
        rest = [i for i in range(len(prompts)) if i not in hits]
        logits: list[Tensor | None] = [None] * len(prompts)
        sources: list[tuple[KVCache | None, int]] = [(None, 0)] * len(prompts)
        if rest:
            out, prefill = self._prefill([prompts[i] for i in rest], rows)
            for r, i in enumerate(rest):
                logits[i], sources[i] = out[r], (prefill, r)
        for i, hit in hits.items():
            logits[i], cache = self._continue(prompts[i], hit, rows)
            sources[i] = (cache, 0)
        if self.prefix_cache is not None:
            for p, (cache, r) in zip(prompts, sources):
                self.prefix_cache.insert(p, cache, r)
        return torch.stack(logits), sources

    def _continue(self, prompt: tuple[int, ...], hit: Hit, rows: list[Row]) -> tuple[Tensor, KVCache]:
        """One prompt whose first hit.length positions the prefix cache holds: ((V,) logits, its
        one-row cache)."""
        longest = max(row.max_new_tokens for row in rows if tuple(row.prompt) == prompt)
        room = len(prompt) + longest - 1 if not self.rows else len(prompt)
        cache = self.prefix_cache.materialize(hit, max(room, len(prompt)))
        ids = torch.tensor([prompt[hit.length:]], device=self.device)  # (1, T): the rest
        return self.model(ids, cache=cache, logits_to_keep=1).logits[0, -1], cache  # (V,)

    def _prefill(self, prompts: list[tuple[int, ...]], rows: list[Row]) -> tuple[Tensor, KVCache | None]:
        """One forward over the distinct prompts, left-padded: ((P, V) last logits, their cache)."""
        L = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), L), self.pad_id, dtype=torch.long, device=self.device)  # (P, L)
        mask = torch.zeros(len(prompts), L, dtype=torch.bool, device=self.device)
        for i, prompt in enumerate(prompts):
            ids[i, L - len(prompt):] = torch.tensor(prompt)
            mask[i, L - len(prompt):] = True
        padded = len(prompts) > 1 and not bool(mask.all())
        if not self.use_cache:
            out = self.model(ids, mask if padded else None, logits_to_keep=1)
            return out.logits[:, -1], None
        # Room for the new tokens when these rows are the whole batch (no regroup copies them).
        room = L + max(row.max_new_tokens for row in rows) - 1 if not self.rows else L
        if isinstance(self.static, StaticStep):  # one compiled step serves every capacity in a bucket
            room = -(-room // CAPACITY_STEP) * CAPACITY_STEP
        cache = self.model.new_cache(max(room, 1))
        out = self.model(ids, mask if padded else None, cache=cache, logits_to_keep=1)
        return out.logits[:, -1], cache  # (P, V)

    def _resume(self, rows: list[Row], cache: KVCache) -> tuple[Tensor, list]:
        """A single row continuing `cache` (which holds its prompt's first cache.length tokens)."""
        if len(rows) != 1 or self.rows or not self.use_cache:
            raise ValueError("a cache to continue is for one row alone, in an empty engine, with a cache")
        if cache.length and self.key_set(cache.length) != self.key_set(len(rows[0].prompt)):
            cache.truncate(0)  # the frequencies change (LongRoPE): every position again, with the new ones
        new = rows[0].prompt[cache.length:]
        if not new:
            raise ValueError("the cache holds the whole prompt; leave at least one token to run")
        ids = torch.tensor([new], device=self.device)  # (1, T)
        return self.model(ids, cache=cache, logits_to_keep=1).logits[:, -1], [(cache, 0)]  # (1, V)

    def _join(self, rows: list[Row], which: list[int], sources: list, lengths: list[int]) -> None:
        """The next batch: the rows that stay (all but the finished ones, in a compact engine) and
        the new rows that are not done, each with its prompt's cache row (`sources[prompt]`)."""
        stay = [i for i, row in enumerate(self.rows) if not (self.compact and (row.done or row.cancelled))]
        joining = [(row, w) for row, w in zip(rows, which) if not row.done]
        if not joining and len(stay) == len(self.rows):
            return
        rows_after = [self.rows[i] for i in stay] + [row for row, _ in joining]
        if not rows_after:
            self._reset()
            return
        lengths = [self.lengths[i] for i in stay] + [lengths[w] for _, w in joining]
        width = max(lengths)
        capacity = width + max(1, max(row.max_new_tokens - len(row.tokens) for row in rows_after))
        if self.use_cache:
            self.cache = self._cache_for(stay, [sources[w] for _, w in joining], width, capacity)
        self._layout(rows_after, lengths, width, capacity)

    def _cache_for(self, stay: list[int], joining: list[tuple[KVCache, int]], width: int,
                   capacity: int) -> KVCache:
        """The batch's cache: a prefill's own when its rows, in order, are the whole batch and it
        has room; else the rows that stay and the joining ones regrouped into a new one."""
        first = joining[0][0] if joining else None
        if (not stay and first is not None and all(c is first for c, _ in joining)
                and [r for _, r in joining] == list(range(rows_of(first))) and first.max_length >= capacity):
            return first  # nothing to copy
        blocks = [(self.cache, torch.tensor(stay))] if stay else []
        for cache, r in joining:  # consecutive rows of one cache make one block
            if blocks and blocks[-1][0] is cache and len(blocks) > bool(stay):
                blocks[-1] = (cache, torch.cat([blocks[-1][1], torch.tensor([r])]))
            else:
                blocks.append((cache, torch.tensor([r])))
        return DecodingCache.regroup(blocks, width, capacity, self.model.cfg.sliding_window)

    def _layout(self, rows: list[Row], lengths: list[int], width: int, capacity: int) -> None:
        """The batch's mask (and, without a cache, every position's token), rows right-aligned."""
        B = len(rows)
        mask = torch.zeros(B, capacity, dtype=torch.bool, device=self.device)  # (B, C)
        for r, n in enumerate(lengths):
            mask[r, width - n:width] = True
        mask[:, width:] = True  # the positions to come are real until their row is done (step)
        ids = None
        if not self.use_cache:
            ids = torch.full((B, capacity), self.pad_id, dtype=torch.long, device=self.device)  # (B, C)
            for r, row in enumerate(rows):
                fed = row.prompt + row.tokens[:-1]  # every position fed so far
                ids[r, width - len(fed):width] = torch.tensor(fed)
        self.rows, self.lengths, self.mask, self.ids, self.width = rows, lengths, mask, ids, width
        self.drafters = {id(row): self.drafters[id(row)] for row in rows if id(row) in self.drafters}
        self._chosen = None  # the rows changed: the next step builds its tokens from the rows

    def _reset(self) -> None:
        self.rows, self.lengths, self.cache, self.mask, self.ids, self.width = [], [], None, None, None, 0
        self._chosen, self.drafters = None, {}

    # --- decoding -----------------------------------------------------------------------------
    def step(self) -> list[Choice]:
        """One forward over every row's newest token; each live row chooses its next. Rows that
        are done leave first (compact engines), or are fed padding that the mask hides."""
        for row in self.rows:
            if row.cancelled and not row.done:
                row.finish("cancelled")
        if self.compact and any(row.done for row in self.rows):
            self._join([], [], [], [])
        live = [not row.done for row in self.rows]
        rows = [row for row, alive in zip(self.rows, live) if alive]
        if not rows:
            return []
        if len(self.rows) == 1 and id(rows[0]) in self.drafters and self.use_cache:
            if (choices := self._speculate(rows[0])) is not None:
                return choices
        B, S, all_live = len(self.rows), self.width, len(rows) == len(self.rows)
        if S >= self.mask.size(1):
            raise ValueError(f"the batch is full ({S} positions); a row asked for more than it said")
        tokens = [row.tokens[-1] if alive else self.pad_id for row, alive in zip(self.rows, live)]
        if not all_live:
            self.mask[:, S] = torch.tensor(live, device=self.device)  # a finished row's column is hidden
        self.lengths = [n + alive for n, alive in zip(self.lengths, live)]
        self.width = S + 1
        padded = B > 1 and min(self.lengths) < self.width
        mask = self.mask[:, :self.width] if padded else None  # (B, S + 1)
        chosen, self._chosen = self._chosen, None
        key_set = self.key_set(max(self.lengths))
        if self.use_cache and key_set != self.cached_set:  # the frequencies change: every position again
            logits, self.cached_set = self._rerun(mask), key_set
        elif self.use_cache:
            # (B, 1): the cache holds the rest. Every row's last step chose by one argmax: its result
            # is these tokens already (no tensor built from a list).
            fed = chosen if all_live and chosen is not None else torch.tensor(tokens, device=self.device)
            ids = fed[:, None]
            if self.static is not None and all_live and self.static.usable(self.cache, mask):
                logits = self.static(ids, self.cache)  # (B, V), compiled or fused
            else:
                logits = self.model(ids, mask, cache=self.cache, logits_to_keep=1).logits[:, -1]  # (B, V)
        else:
            self.ids[:, S] = torch.tensor(tokens, device=self.device)
            logits = self.model(self.ids[:, :self.width], mask, logits_to_keep=1).logits[:, -1]
        self.steps += 1
        self.largest_batch = max(self.largest_batch, len(rows))
        if not all_live:
            logits = logits[torch.tensor(live, device=self.device)]  # (live rows, V)
        choices = self._choose(rows, logits)
        if self.compact and not self.live:
            self._reset()  # the last rows are done: nothing left to keep
        return choices

    def _speculate(self, row: Row) -> list[Choice] | None:
        """One speculative step of the engine's one row (speculative.py): K guesses, one forward
        over the newest token and them, the tokens the acceptance rule keeps, and the cache cut
        back to the positions fed. None when nothing is drafted: a plain step then."""
        if self.cache.keeps_states:
            return None  # linear attention's state cannot forget rejected guesses: plain steps
        S, o, drafter = self.width, row.options, self.drafters[id(row)]
        k = min(drafter.length.next, row.max_new_tokens - len(row.tokens) - 1, self.mask.size(1) - S - 1)
        if k < 1 or self.key_set(S + k + 1) != self.cached_set:  # LongRoPE's switch: a plain step reruns
            return None
        draft, proposal = drafter.propose(row.prompt + row.tokens, k, o, row.generator)
        if not draft:
            return None
        ids = torch.tensor([[row.tokens[-1], *draft]], device=self.device)  # (1, K + 1)
        logits = self._check(ids)  # (K + 1, V)
        tokens = (accept_greedy(logits, draft) if o.temperature == 0
                  else accept_draft(sampled_probabilities(logits, o), draft, proposal, row.generator))
        choices = []
        for i, token in enumerate(tokens):
            logprob, top = (None, None) if o.top_logprobs is None else token_logprobs(logits[i], token, o)
            choices.append(record(Choice(row, token, logprob, top, logits[i] if row.keep_logits else None)))
            if row.done:
                break
        n = len(choices)  # positions S .. S + n - 1 were fed: the newest token and the kept guesses
        self.cache.truncate(S + n)
        self.width, self.lengths, self._chosen = S + n, [self.lengths[0] + n], None
        drafter.length.update(len(draft), len(tokens) - 1)
        stats = row.speculation
        stats.drafted, stats.accepted = stats.drafted + len(draft), stats.accepted + len(tokens) - 1
        stats.forwards, stats.tokens = stats.forwards + 1, stats.tokens + n
        self.steps, self.largest_batch = self.steps + 1, max(self.largest_batch, 1)
        if self.compact and row.done:
            self._reset()
        return choices

    def _check(self, ids: Tensor) -> Tensor:
        """The one forward over a speculative step's (1, K + 1) newest token and guesses, into the cache:
        (K + 1, V) logits. Through the fused C step where it serves the cache (each weight read once for
        every row, each row's logits those of a one-token step), else the model's own forward."""
        if isinstance(self.static, FusedStep) and self.static.usable(self.cache, None, ids.size(1)):
            return self.static(ids, self.cache)
        return self.model(ids, cache=self.cache, logits_to_keep=ids.size(1)).logits[0]

    def _rerun(self, mask: Tensor | None) -> Tensor:
        """Every position of every row run again into the emptied cache: (B, V) last logits. A row's
        real positions are where its mask is True, holding its prompt and the tokens fed since."""
        B, S = len(self.rows), self.width
        ids = torch.full((B, S), self.pad_id, dtype=torch.long, device=self.device)  # (B, S)
        for r, (row, n) in enumerate(zip(self.rows, self.lengths)):
            fed = (row.prompt + row.tokens)[:n]  # a finished row's stop token was never fed
            ids[r, self.mask[r, :S]] = torch.tensor(fed, device=self.device)
        self.cache.truncate(0)
        return self.model(ids, mask, cache=self.cache, logits_to_keep=1).logits[:, -1]  # (B, V)

    def _choose(self, rows: list[Row], logits: Tensor) -> list[Choice]:
        """Each row's next token from its (V,) logits row: processors, then its own sampling."""
        plain = all(r.options.temperature == 0 and not r.processors and r.options.top_logprobs is None
                    and not r.keep_logits for r in rows)
        if plain:  # greedy rows that need nothing else: one argmax for the batch
            chosen = greedy(logits)  # (rows,)
            choices = [Choice(row, t) for row, t in zip(rows, chosen.tolist())]
            self._chosen = chosen if len(rows) == len(self.rows) else None  # what the next step feeds
            for choice in choices:
                record(choice)
        else:
            choices = [record(self._choose_one(row, logits[i])) for i, row in enumerate(rows)]
            prepare_next(rows)
        return choices

    @staticmethod
    def _choose_one(row: Row, logits: Tensor) -> Choice:
        for process in row.processors:
            logits = process(row.tokens, logits)
        o = row.options
        token = int(next_tokens(logits[None], o.temperature, o.top_k, o.top_p, row.generator)[0])
        logprob, top = (None, None) if o.top_logprobs is None else token_logprobs(logits, token, o)
        return Choice(row, token, logprob, top, logits if row.keep_logits else None)

    def run(self, on_choice: Callable[[Choice], None] | None = None) -> None:
        """Step until every row is done, handing each choice to `on_choice`."""
        while choices := self.step():  # no choices: every row is done
            if on_choice is not None:
                for choice in choices:
                    on_choice(choice)


def record(choice: Choice) -> Choice:
    """The chosen token appended to its row, which ends at a stop token or its limit."""
    row = choice.row
    row.tokens.append(choice.token)
    if choice.token in row.stop_ids:
        row.finish("stop")
    elif len(row.tokens) >= row.max_new_tokens:
        row.finish("length")
    return choice


def prepare_next(rows: list[Row]) -> None:
    """Every row has its token: the processors of the rows that go on that have a
    `prepare(tokens)` method may start on the next step's work (a grammar's next mask, on a worker
    thread) while the next forward runs. Called after the whole batch has chosen, so that work
    does not compete with the other rows' sampling."""
    for row in rows:
        if not row.done:
            for process in row.processors:
                if (prepare := getattr(process, "prepare", None)) is not None:
                    prepare(row.tokens)


def rows_of(cache: KVCache) -> int:
    return held_rows(cache)


def _one_set(positions: int) -> int:
    return 0


def frequency_set(model: CausalLM) -> Callable[[int], int]:
    """positions -> which frequencies a forward of the model whose longest row has that many
    positions turns keys with: the rotary module's `factor_set` where its frequencies change with
    the length (LongRoPE), else one set for every length."""
    return getattr(getattr(model, "rotary", None), "factor_set", _one_set)


def check_row(row: Row, max_positions: int) -> None:
    """A row's prompt and limit: prompt + max_new_tokens - 1 positions fit in the context (the
    last token is returned, never fed back)."""
    if not row.prompt:
        raise ValueError("a prompt is empty; give at least one token (e.g. the BOS id)")
    int_at_least("max_new_tokens", row.max_new_tokens, 1)
    if len(row.prompt) + row.max_new_tokens - 1 > max_positions:
        raise ValueError(f"a prompt of {len(row.prompt)} tokens plus {row.max_new_tokens} new tokens needs "
                         f"{len(row.prompt) + row.max_new_tokens - 1} positions but the model has "
                         f"max_positions={max_positions}")


def sampled_distribution(logits: Tensor, options: SamplingOptions) -> Tensor:
    """(V,) log-probabilities of the distribution a token is drawn from: after temperature, top-k
    and top-p (filtered-out tokens are -inf). With temperature 0 (greedy) that distribution is a
    single certain token, so the model's own distribution (temperature 1, unfiltered) is given."""
    if options.temperature == 0:
        return torch.log_softmax(logits.float(), dim=-1)
    filtered = filter_logits(logits.float(), options.temperature, options.top_k, options.top_p)
    return torch.log_softmax(filtered, dim=-1)


def token_logprobs(logits: Tensor, token: int, options: SamplingOptions,
                   ) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability and the `top_logprobs` most likely (id, log-probability)
    pairs of the sampled distribution (never a filtered-out token)."""
    logprobs = sampled_distribution(logits, options)  # (V,)
    k = min(options.top_logprobs or 0, logprobs.numel())
    values, ids = torch.topk(logprobs, k) if k else (logprobs[:0], logprobs[:0].long())
    top = [(int(i), float(v)) for i, v in zip(ids, values) if v > float("-inf")]
    return float(logprobs[token]), top


__all__ = ["Choice", "Engine", "LogitProcessor", "Row", "SamplingOptions", "check_row", "frequency_set",
           "sampled_distribution", "token_logprobs"]
