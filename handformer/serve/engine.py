"""Continuous batching: one engine per served language model, a background thread that decodes
every live sequence's next token in one forward pass.

    submit(seq) -> inbox -> [prefill: the prompt alone, first token] -> joins the batch
    each step:  one forward over the batch's last tokens -> each row samples its own next token
    a row that is done (stop token, stop text, max_tokens) or cancelled leaves before the next step

A sequence joins the running batch at the next step and leaves when done (batch.py keeps the rows
in one KV cache with left padding). Each sequence samples with its own options and its own
seeded torch.Generator, exactly as `generate` samples a single prompt (`next_tokens` on its row's
logits), so a seeded request gives the same tokens alone or among others. The model is shared,
never copied; `ServedModel.lock` is held around every forward pass. Tokens go to each sequence's
`TokenSink`, called on the engine thread (the HTTP layer forwards them to its event loop).

Shape legend: B rows in the batch, P prompt length, V vocabulary.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from handformer.generation.sampling import filter_logits, next_tokens
from handformer.models.causal_lm import CausalLM
from handformer.nn.kv_cache import KVCache
from handformer.serve.batch import PaddedBatch

log = logging.getLogger("handformer.serve")


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None  # None: a random seed
    top_logprobs: int | None = None  # None: no log-probabilities; n >= 0: the token's and n others'


class TokenSink(Protocol):
    """Where a sequence's tokens go; every method is called on the engine thread."""

    def token(self, token_id: int, logprob: float | None, top: list[tuple[int, float]] | None,
              is_stop_token: bool) -> bool:
        """A new token; return True to end the sequence here (a stop string was reached)."""

    def finish(self, reason: str) -> None:
        """The sequence is done: "stop" (a stop token or stop string) or "length" (max_tokens)."""

    def fail(self, message: str) -> None:
        """The sequence could not be finished (a failed forward pass, or the server stopping)."""


@dataclass(eq=False)
class Sequence:
    """One choice being generated."""

    prompt: list[int]
    max_tokens: int  # >= 1; prompt + max_tokens - 1 positions fit in the model's context
    options: SamplingOptions
    stop_ids: frozenset[int]  # tokens that end the sequence (kept out of the text by the sink)
    sink: TokenSink
    cancelled: bool = False  # set from any thread (a client went away): leaves at the next step
    generated: int = 0
    last_token: int = -1  # the newest token, fed at the next step
    done: bool = False
    generator: torch.Generator | None = field(default=None, repr=False)

    def cancel(self) -> None:
        self.cancelled = True


class BatchEngine:
    """The decoding thread of one model. `submit` from any thread; `start` / `stop` once."""

    def __init__(self, model: CausalLM, lock: threading.Lock, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.lock, self.max_batch = model, lock, max_batch
        self.device = next(model.parameters()).device
        self.batch = PaddedBatch(model.cfg.n_layers)
        self.rows: list[Sequence] = []  # the batch's rows, in cache order
        self.waiting: deque[Sequence] = deque()  # submitted, not yet admitted (the batch was full)
        self.inbox: queue.Queue[Sequence | None] = queue.Queue()
        self.steps = 0  # decoding steps run (prefills not counted)
        self.largest_batch = 0  # the most rows one step has decoded together
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="handformer-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._closing = True
        self.inbox.put(None)
        self._thread.join(timeout=30)

    def submit(self, seq: Sequence) -> None:
        if self._closing:
            seq.sink.fail("the server is shutting down")
            return
        self.inbox.put(seq)

    # --- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while not self._closing:
                joining: list[tuple[Sequence, KVCache]] = []
                try:
                    self._collect(block=not self.rows and not self.waiting)
                    if self._closing:
                        break
                    joining = self._prefill(self._admit())
                    self._regroup(joining)
                    if self.rows:
                        self._step()
                except Exception as err:  # never a dead engine: the batch fails, later requests run
                    log.exception("decoding failed")
                    self._fail([*self.rows, *(seq for seq, _ in joining)],
                               f"generation failed: {type(err).__name__}: {err}")
                    self.rows, self.batch = [], PaddedBatch(self.model.cfg.n_layers)
        self._fail([*self.rows, *self.waiting, *self._drain()], "the server is shutting down")

    @staticmethod
    def _fail(seqs: list[Sequence], message: str) -> None:
        for seq in seqs:
            if not seq.done:
                seq.done = True
                seq.sink.fail(message)

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
        free = self.max_batch - sum(not (s.done or s.cancelled) for s in self.rows)
        admitted = []
        while self.waiting and len(admitted) < free:
            seq = self.waiting.popleft()
            if not seq.cancelled:
                admitted.append(seq)
        return admitted

    def _prefill(self, seqs: list[Sequence]) -> list[tuple[Sequence, KVCache]]:
        """Run each distinct prompt alone (n choices of one prompt share it), choose every
        sequence's first token; the ones not done yet join with their one-row caches."""
        by_prompt: dict[tuple[int, ...], list[Sequence]] = {}
        for seq in seqs:
            by_prompt.setdefault(tuple(seq.prompt), []).append(seq)
        joining = []
        for prompt, group in by_prompt.items():
            try:
                cache = KVCache(self.model.cfg.n_layers, len(prompt))
                ids = torch.tensor([prompt], device=self.device)  # (1, P)
                with self.lock:
                    logits = self.model(ids, cache=cache, logits_to_keep=1).logits[:, -1]  # (1, V)
                for seq in group:
                    seq.generator = torch.Generator(device=self.device)
                    if seq.options.seed is None:
                        seq.generator.seed()
                    else:
                        seq.generator.manual_seed(seq.options.seed)
                    self._choose(seq, logits)
                    if not seq.done:
                        joining.append((seq, cache))
            except Exception as err:  # a prompt that fails fails its own sequences only
                log.exception("prefill failed")
                self._fail(group, f"generation failed: {type(err).__name__}: {err}")
        return joining

    def _regroup(self, joining: list[tuple[Sequence, KVCache]]) -> None:
        keep = [i for i, seq in enumerate(self.rows) if not (seq.done or seq.cancelled)]
        if len(keep) == len(self.rows) and not joining:
            return
        rows = [self.rows[i] for i in keep] + [seq for seq, _ in joining]
        remaining = [seq.max_tokens - seq.generated for seq in rows]
        self.batch.regroup(keep, [cache for _, cache in joining], remaining)
        self.rows = rows

    def _step(self) -> None:
        """One forward over every row's newest token; each row chooses its next one."""
        mask = self.batch.grow()
        ids = torch.tensor([[seq.last_token] for seq in self.rows], device=self.device)  # (B, 1)
        with self.lock:
            logits = self.model(ids, mask, cache=self.batch.cache, logits_to_keep=1).logits[:, -1]  # (B, V)
        self.steps += 1
        self.largest_batch = max(self.largest_batch, len(self.rows))
        for row, seq in enumerate(self.rows):
            if not seq.cancelled:
                self._choose(seq, logits[row:row + 1])

    def _choose(self, seq: Sequence, logits: Tensor) -> None:
        """Sample `seq`'s next token from its (1, V) logits, as `generate` does for one prompt."""
        o = seq.options
        token = int(next_tokens(logits, o.temperature, o.top_k, o.top_p, seq.generator)[0])
        logprob, top = token_logprobs(logits[0], token, o) if o.top_logprobs is not None else (None, None)
        seq.generated += 1
        seq.last_token = token
        is_stop = token in seq.stop_ids
        stopped_by_text = seq.sink.token(token, logprob, top, is_stop)
        if is_stop or stopped_by_text:
            reason = "stop"
        elif seq.generated >= seq.max_tokens:
            reason = "length"
        else:
            return
        seq.done = True
        seq.sink.finish(reason)


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


__all__ = ["BatchEngine", "SamplingOptions", "Sequence", "TokenSink", "sampled_distribution",
           "token_logprobs"]
