"""Continuous batching: one engine per served language model, a background thread that decodes
every live sequence's next token in one forward pass.

    submit(seq) -> inbox -> joins the decoding engine at the next step (prefill, first token)
    each step:  one forward over the batch's last tokens -> each row samples its own next token
    a row that is done (stop token, stop text, max_tokens) or cancelled leaves before the next step

The decoding itself is generation/engine.py's Engine (compact: finished rows leave the batch's KV
cache at the next step), the one every caller drives. Each sequence samples with its own options
and its own seeded torch.Generator, exactly as `generate` samples a single prompt, so a seeded
request gives the same tokens alone or among others. The model is shared, never copied;
`ServedModel.lock` is held around every forward pass. Tokens go to each sequence's `TokenSink`,
called on the engine thread (the HTTP layer forwards them to its event loop).

A sequence may carry a grammar constraint (structured output, forced tool calls;
generation/grammar.py): it is the row's logit processor, and the sequence ends with "stop" as soon
as its text is complete, or fails (status 400) when the model's vocabulary cannot continue it.
The engine's prefix cache (`prefix_cache_mb`; generation/prefix_cache.py) lets prompts that share
a prefix with earlier ones reuse its keys and values.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch

from handformer.generation.engine import Choice, Engine, LogitProcessor, Row
from handformer.generation.grammar import Constraint
from handformer.generation.prefix_cache import PrefixCache
from handformer.generation.sampling import SamplingOptions
from handformer.models.causal_lm import CausalLM
from handformer.serve.metrics import ModelMetrics
from handformer.training.cpu_memory import give_back_freed_memory

log = logging.getLogger("handformer.serve")
GIVE_BACK_EVERY_S = 1.0  # under load, freed memory is given back this often (see BatchEngine._give_back)


class TokenSink(Protocol):
    """Where a sequence's tokens go; every method is called on the engine thread."""

    def token(self, token_id: int, logprob: float | None, top: list[tuple[int, float]] | None,
              is_stop_token: bool) -> bool:
        """A new token; return True to end the sequence here (a stop string was reached)."""

    def finish(self, reason: str) -> None:
        """The sequence is done: "stop" (a stop token or stop string) or "length" (max_tokens)."""

    def fail(self, message: str, status: int = 500) -> None:
        """The sequence could not be finished: a failed forward pass or the server stopping (500),
        or a constraint the vocabulary cannot follow (400)."""


@dataclass(eq=False)
class Sequence:
    """One choice being generated: a row of the decoding engine and where its tokens go."""

    prompt: list[int]
    max_tokens: int  # >= 1; prompt + max_tokens - 1 positions fit in the model's context
    options: SamplingOptions
    stop_ids: frozenset[int]  # tokens that end the sequence (kept out of the text by the sink)
    sink: TokenSink
    constraint: Constraint | None = None  # the grammar its text must follow
    choice: int = 0  # choice i of a request samples with the options' seed + i
    processors: tuple[LogitProcessor, ...] = ()  # others (a thinking budget: serve/thinking.py)
    row: Row = field(init=False, repr=False)
    last_at: float = field(default=0.0, init=False, repr=False)  # when it was submitted, then its last token

    def __post_init__(self) -> None:
        processors = ((self.constraint,) if self.constraint is not None else ()) + self.processors
        self.row = Row(self.prompt, self.max_tokens, self.options, self.stop_ids, self.choice,
                       processors=processors)

    @property
    def generated(self) -> int:
        return len(self.row.tokens)

    @property
    def done(self) -> bool:
        """Finished (stop, length or failed); a cancelled sequence just leaves."""
        return self.row.done and self.row.finish_reason != "cancelled"

    @property
    def cancelled(self) -> bool:
        return self.row.cancelled

    def cancel(self) -> None:
        """From any thread (a client went away): the sequence leaves at the next step."""
        self.row.cancel()


class BatchEngine:
    """The decoding thread of one model. `submit` from any thread; `start` / `stop` once."""

    def __init__(self, model: CausalLM, lock: threading.Lock, max_batch: int = 32,
                 prefix_cache_mb: float = 0, metrics: ModelMetrics | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.lock, self.max_batch = model, lock, max_batch
        self.metrics = metrics if metrics is not None else ModelMetrics()  # /metrics reads it
        # off for a model of linear-attention layers (Qwen3.5): their cache is a state a row, not columns
        self.prefix_cache = (PrefixCache(int(prefix_cache_mb * 2**20), model.cfg.sliding_window)
                             if prefix_cache_mb > 0 and not model.cfg.linear_layers else None)
        self.engine = self._new_engine()
        self.sequences: dict[int, Sequence] = {}  # id(row) -> its sequence, for the rows in the engine
        self.waiting: deque[Sequence] = deque()  # submitted, not yet admitted (the batch was full)
        self.inbox: queue.Queue[Sequence | None] = queue.Queue()
        self._closing = False
        self._decoded = False  # a step ran since freed memory was last given back
        self._given_back = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="handformer-engine", daemon=True)

    @property
    def rows(self) -> list[Sequence]:
        """The sequences in the batch, in the order of its rows."""
        return [self.sequences[id(row)] for row in self.engine.rows if id(row) in self.sequences]

    @property
    def running(self) -> int:
        """Sequences in the batch (read from any thread: a snapshot)."""
        return sum(not row.done for row in list(self.engine.rows))

    @property
    def queued(self) -> int:
        """Sequences submitted and not yet in the batch (a snapshot)."""
        return len(self.waiting) + self.inbox.qsize()

    @property
    def alive(self) -> bool:
        """The decoding thread runs and takes new sequences."""
        return self._thread.is_alive() and not self._closing

    @property
    def steps(self) -> int:
        return self.engine.steps  # decoding steps run (prefills not counted)

    @property
    def largest_batch(self) -> int:
        return self.engine.largest_batch  # the most rows one step has decoded together

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._closing = True
        self.inbox.put(None)
        self._thread.join(timeout=30)

    def submit(self, seq: Sequence) -> None:
        if self._closing:
            seq.sink.fail("the server is shutting down", 503)
            return
        seq.last_at = time.monotonic()
        self.inbox.put(seq)

    # --- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while not self._closing:
                try:
                    if self.engine.rows and not self.engine.live:  # rows their sinks ended (a stop
                        with self.lock:  # string, a complete grammar) leave the cache now
                            self.engine.step()
                    idle = not self.engine.live and not self.waiting and self.inbox.empty()
                    self._give_back(idle)
                    self._collect(block=idle)
                    if self._closing:
                        break
                    self._join(self._admit())
                    if self.engine.live:
                        with self.lock:
                            choices = self.engine.step()
                        self._deliver(choices)
                        self._decoded = True
                except Exception as err:  # never a dead engine: the batch fails, later requests run
                    log.exception("decoding failed")
                    message = f"generation failed: {type(err).__name__}: {err}"
                    self._fail(list(self.sequences.values()), message)
                    self.engine, self.sequences = self._new_engine(), {}
        left = [*self.sequences.values(), *self.waiting, *self._drain()]
        self._fail(left, "the server is shutting down", 503)

    def _give_back(self, idle: bool) -> None:
        """Freed memory back to the kernel when there is nothing to decode, and every
        GIVE_BACK_EVERY_S seconds under a load that never lets up: glibc keeps the pages of the
        dropped KV caches otherwise, and the process stays at the peak of its busiest moment.
        The price: the next batches fault those pages in again."""
        now = time.monotonic()
        if self._decoded and (idle or now - self._given_back >= GIVE_BACK_EVERY_S):
            give_back_freed_memory()
            self._decoded, self._given_back = False, now

    def _new_engine(self) -> Engine:
        return Engine(self.model, compact=True, prefix_cache=self.prefix_cache)

    @staticmethod
    def _fail(seqs: list[Sequence], message: str, status: int = 500) -> None:
        for seq in seqs:
            if not seq.done:
                seq.row.finish("failed")
                seq.sink.fail(message, status)

    def _drain(self) -> list[Sequence]:
        out = []
        while True:
            try:
                seq = self.inbox.get_nowait()
            except queue.Empty:
                return out
            if seq is not None:
                out.append(seq)

    def _collect(self, block: bool) -> None:
        if block:
            seq = self.inbox.get()
            if seq is not None:
                self.waiting.append(seq)
        self.waiting.extend(self._drain())

    def _admit(self) -> list[Sequence]:
        """The waiting sequences that fit in the batch, oldest first (cancelled ones dropped)."""
        free = self.max_batch - sum(not row.cancelled for row in self.engine.live)
        admitted = []
        while self.waiting and len(admitted) < free:
            seq = self.waiting.popleft()
            if not seq.cancelled:
                admitted.append(seq)
        return admitted

    def _join(self, seqs: list[Sequence]) -> None:
        """Prefill the admitted sequences together; if that fails, one prompt at a time, so a
        prompt that fails fails its own sequences only."""
        if not seqs:
            return
        try:
            self._add(seqs)
        except Exception:
            for group in _by_prompt(seqs):
                try:
                    self._add(group)
                except Exception as err:
                    log.exception("prefill failed")
                    self._fail(group, f"generation failed: {type(err).__name__}: {err}")

    def _add(self, seqs: list[Sequence]) -> None:
        with self.lock:
            choices = self.engine.add([seq.row for seq in seqs])
        self.sequences.update({id(seq.row): seq for seq in seqs})
        self.metrics.admitted(sum(len(seq.prompt) for seq in seqs if seq.choice == 0))
        self._deliver(choices)

    def _deliver(self, choices: list[Choice]) -> None:
        """Each choice to its sequence's sink; a sink that reaches a stop string ends the row."""
        now = time.monotonic()
        for choice in choices:
            seq = self.sequences[id(choice.row)]
            self.metrics.token(len(seq.row.tokens) == 1, now - seq.last_at)
            seq.last_at = now
            constraint = seq.constraint
            if constraint is not None and constraint.error is not None:  # this token is not the text's
                seq.row.finish("failed")
                seq.sink.fail(constraint.error, 400)
                continue
            is_stop = choice.token in seq.stop_ids
            if seq.sink.token(choice.token, choice.logprob, choice.top, is_stop) and not seq.done:
                seq.row.finish("stop")  # a stop string: the text ends there
            if constraint is not None and seq.row.finish_reason in (None, "length"):
                constraint.sync(seq.row.tokens)
                if constraint.error is not None:  # the grammar engine reached a limit on this token
                    seq.row.finish("failed")
                    seq.sink.fail(constraint.error, 400)
                    continue
                if constraint.complete:  # nothing can follow: end now rather than sample an end token
                    seq.row.finish_reason = "stop"
            if seq.done:
                seq.sink.finish(seq.row.finish_reason)
        live = {id(row) for row in self.engine.rows}
        self.sequences = {k: s for k, s in self.sequences.items() if k in live or not s.row.done}


def _by_prompt(seqs: list[Sequence]) -> list[list[Sequence]]:
    groups: dict[tuple[int, ...], list[Sequence]] = {}
    for seq in seqs:
        groups.setdefault(tuple(seq.prompt), []).append(seq)
    return list(groups.values())


__all__ = ["BatchEngine", "Sequence", "TokenSink"]
