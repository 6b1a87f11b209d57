"""Constrained decoding: a grammar (a JSON schema, or a tool call's layout around one) that a row's
tokens must follow, enforced token by token as a logit processor of the decoding engine
(generation/engine.py: Row.processors), so each row of a batch carries its own.

The grammar engine is llguidance (chosen against xgrammar and outlines-core by
benchmarks/grammar_engines.py; docs/serve.md gives the figures): it compiles a schema in about a
millisecond, computes a next-token mask over a GPT-2-sized vocabulary in tens to hundreds of microseconds,
enforces the most JSON Schema (number bounds included) and needs nothing but its own wheel.

    Vocabulary(tokenizer, vocab_size, end_ids)   the run's own tokens as bytes (data/token_bytes.py),
                                                 prepared once per model (~1 s for 50k tokens)
    Grammar.json_schema(vocabulary, schema)      checked (json_schema.py), compiled; or .lark(...)
    grammar.constraint(stop_ids)                 one row's processor: at every step the tokens that
                                                 keep the text a prefix the grammar accepts; the
                                                 row's stop tokens once the text is complete
    constraint.prepare(tokens)                   the engine's hook once the batch has chosen: the
                                                 next mask starts on the grammar thread

Replies are laid out compactly: ", " between items, ": " after keys, no other whitespace (an
untrained or small model given free whitespace tends to write it until max_tokens).

Shape legend: V vocabulary (the model's logits), W = ceil(V / 32) words of the bitmask.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor

from handformer.data.token_bytes import token_bytes
from handformer.data.tokenizer import Tokenizer
from handformer.generation.json_schema import SchemaError, check_schema

INSTALL = "pip install 'handformer[serve]' (or: pip install llguidance)"
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarEngineMissing(RuntimeError):
    """llguidance is not installed; the message says how to install it."""


def llguidance() -> Any:
    try:
        import llguidance  # not llguidance.torch: importing it compiles a kernel (seconds)
    except ImportError:
        raise GrammarEngineMissing(f"structured output needs the grammar engine llguidance: {INSTALL}") \
            from None
    return llguidance


def limits() -> Any:
    """Bounds on one grammar's size and the work its compile and each step may take. A schema
    over the size is refused when it compiles; one whose parsing needs more than a step may do
    ends its request with a 400 that says so. max_items_in_row: the parser's alternatives at one
    position (an object's properties, about 4 each): 10,000 lets the largest schema check_schema
    admits (2,000 subschemas) decode; llguidance's own default of 2,000 stops at ~500 properties."""
    return llguidance().LLParserLimits(**LIMITS, verbose_errors=False)


LIMITS = {"max_grammar_size": 200_000, "initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000,
          "max_lexer_states": 100_000, "max_items_in_row": 10_000}


class Vocabulary:
    """A run's tokens as the grammar engine sees them. `vocab_size`: the model's (its logits may be
    wider than the tokenizer: those ids are never allowed). `end_ids`: every id that may end a
    row (the run's EOS ids and the chat template's end-of-turn tokens)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, end_ids: Sequence[int]) -> None:
        lg = llguidance()
        pieces = token_bytes(tokenizer)[:vocab_size]
        pieces += [None] * (vocab_size - len(pieces))
        self.size = vocab_size
        self.is_text = torch.tensor([p is not None for p in pieces])  # (V,)
        self.text_words = pack_bits(self.is_text)  # (W,) the same, one bit a token
        self.end_ids = sorted({i for i in end_ids if 0 <= i < vocab_size})
        if not self.end_ids:
            raise ValueError("the run lists no end token, so a constrained reply could never end")

        class Tokens:  # what llguidance's TokenizerWrapper reads
            eos_token_id = self.end_ids[0]
            bos_token_id = tokenizer.bos_id
            # a special token writes no text: bytes that are not UTF-8 never match any
            tokens = [p if p is not None else b"\xff[special %d]" % i for i, p in enumerate(pieces)]
            special_token_ids = [i for i, p in enumerate(pieces) if p is None]

            def __call__(self, text: bytes | str) -> list[int]:
                text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
                return tokenizer.encode(text)

        self.tokenizer = lg.LLTokenizer(lg.TokenizerWrapper(Tokens()), n_vocab=vocab_size,
                                        eos_token=self.end_ids)
        self._stop_masks: dict[frozenset[int], tuple[Tensor, np.ndarray, np.ndarray]] = {}

    def stop_masks(self, stop_ids: frozenset[int]) -> tuple[Tensor, np.ndarray, np.ndarray]:
        """For a row's stop tokens: their ids, and as (W,) words themselves and the text tokens that
        are not among them; made once per set (every row of a request has the same)."""
        if stop_ids not in self._stop_masks:
            ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
            is_stop = torch.zeros(self.size, dtype=torch.bool)
            is_stop[ids] = True
            words = pack_bits(is_stop)  # (W,)
            if len(self._stop_masks) >= STOP_SETS_KEPT:
                self._stop_masks.clear()
            self._stop_masks[stop_ids] = (ids, words, self.text_words & ~words)
        return self._stop_masks[stop_ids]


class Grammar:
    """A compiled grammar over one vocabulary; `constraint()` gives each row its own matcher."""

    def __init__(self, vocabulary: Vocabulary, text: str) -> None:
        lg = llguidance()
        self.vocabulary = vocabulary
        self.matcher = lg.LLMatcher(vocabulary.tokenizer, text, log_level=0, limits=limits())
        if self.matcher.is_error():
            raise SchemaError(engine_message(self.matcher.get_error()))

    @classmethod
    def json_schema(cls, vocabulary: Vocabulary, schema: dict[str, Any],
                    where: str = "the schema") -> Grammar:
        """The grammar of JSON text that validates against `schema` (checked first)."""
        check_schema(schema, where)
        text = llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=LAYOUT)
        try:
            return cls(vocabulary, text)
        except SchemaError as err:
            raise SchemaError(f"{where} cannot be compiled: {err.message}") from None

    @classmethod
    def lark(cls, vocabulary: Vocabulary, text: str) -> Grammar:
        """A grammar in llguidance's Lark syntax (`%json {schema}` embeds a JSON schema)."""
        return cls(vocabulary, llguidance().LLMatcher.grammar_from_lark(text))

    def constraint(self, stop_ids: Sequence[int]) -> Constraint:
        return Constraint(self, self.matcher.deep_copy(), stop_ids)


STOP_SETS_KEPT = 16  # a vocabulary's rows rarely have more than a few sets of stop tokens
_grammar_thread: ThreadPoolExecutor | None = None
_grammar_thread_lock = threading.Lock()


def grammar_thread() -> ThreadPoolExecutor:
    """The one worker thread that computes prepared masks (Constraint.prepare), started on first use."""
    global _grammar_thread
    with _grammar_thread_lock:
        if _grammar_thread is None:
            _grammar_thread = ThreadPoolExecutor(1, thread_name_prefix="handformer-grammar")
        return _grammar_thread


def _forget_grammar_thread() -> None:
    """In a forked child: the parent's worker thread is not there, so a new one starts on first use."""
    global _grammar_thread, _grammar_thread_lock
    _grammar_thread, _grammar_thread_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_grammar_thread)


LIMIT_WORDS = ("max is", "fuel", "too many", "limit")  # how llguidance words a limit it reached
OVER_LIMITS = "the schema is over the grammar engine's limits"


def engine_message(error: str) -> str:
    """llguidance's error, without its internal prefixes; its "Unimplemented keys" is named as
    check_schema names keywords it cannot enforce, a limit it reached as the schema's size."""
    error = error.strip().splitlines()[0] if error.strip() else "the grammar engine refused it"
    if "Unimplemented keys" in error:
        return f"it uses keyword(s) that structured output cannot enforce: {error.split(':', 1)[-1].strip()}"
    if any(word in error.lower() for word in LIMIT_WORDS):
        detail = error.removeprefix("Parser Error:").split(";")[0].strip()
        return (f"{OVER_LIMITS} ({detail}); send a smaller schema "
                "(fewer properties, anyOf branches or enum values)")
    return error


class Constraint:
    """One row's grammar state, and its logit processor (the engine calls it with the tokens the
    row has chosen and the (V,) logits before each choice).

    `complete`: no more text can follow (the row should end); `error`: set when no token of the
    vocabulary can continue the text (a schema asking for characters this vocabulary cannot
    write) or the parse needs more than the engine's limits allow: the step then leaves only the
    stop tokens, and the caller ends the row with the error.

    `prepare` (the engine calls it once every row of the batch has its token) gives the matcher
    the row's new token and starts the next mask on the grammar thread, where llguidance works
    without the GIL while the next forward runs; the next call collects it. The mask is the same
    as one computed in the call, so the tokens are too. While a mask is being computed nothing
    else touches the matcher (every method waits for it first)."""

    def __init__(self, grammar: Grammar, matcher: Any, stop_ids: Sequence[int]) -> None:
        self.vocabulary, self.matcher = grammar.vocabulary, matcher
        self.stop_set = frozenset(stop_ids)
        self.stop_ids, self.stop_words, self.text_not_stop = grammar.vocabulary.stop_masks(self.stop_set)
        self.consumed = 0  # tokens of the row given to the matcher
        self.bitmask = torch.zeros((grammar.vocabulary.size + 31) // 32, dtype=torch.int32)  # (W,)
        self.error: str | None = None
        self._next: Future[np.ndarray] | None = None  # the next mask, being computed by `prepare`

    def sync(self, tokens: Sequence[int]) -> None:
        """Give the matcher the tokens chosen since the last call (a stop token ends the text)."""
        if len(tokens) == self.consumed:
            return
        self._collect()  # a mask computed before these tokens is of no use
        for token in tokens[self.consumed:]:
            if self.error is None and token not in self.stop_set and not self.matcher.consume_token(token):
                message = engine_message(self.matcher.get_error())
                self.error = message if message.startswith(OVER_LIMITS) else \
                    f"the grammar refused token {token}: {message}"
        self.consumed = len(tokens)

    def prepare(self, tokens: Sequence[int]) -> None:
        """The row's tokens, its newest just chosen: the matcher takes it now, and the next mask
        is computed on the grammar thread (see the class docstring)."""
        self.sync(tokens)
        self._collect()
        if self.error is None and not self.matcher.is_stopped():
            self._next = grammar_thread().submit(self._words)

    def _collect(self) -> np.ndarray | None:
        """The mask `prepare` started (waited for), or None."""
        pending, self._next = self._next, None
        return None if pending is None else pending.result()

    @property
    def complete(self) -> bool:
        if self._next is not None:  # a mask is being computed: the matcher was not stopped when it
            return False  # began, and computing a mask consumes nothing
        return self.error is None and self.matcher.is_stopped()  # a matcher in error is stopped too

    def _words(self) -> np.ndarray:
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)  # (W,) int32
        words = self.bitmask.numpy() & self.text_not_stop  # (W,)
        return words | self.stop_words if self.matcher.is_accepting() else words

    def allowed_words(self) -> np.ndarray:
        """(W,) int32, bit j of word w set when token 32w + j may come next: llguidance's mask
        over the text tokens, and the row's stop tokens where its text may end."""
        words = self._collect()
        return self._words() if words is None else words

    def allowed(self) -> Tensor:
        """(V,) True for each token that may come next."""
        return torch.from_numpy(unpack_bits(self.allowed_words(), self.vocabulary.size))

    def __call__(self, tokens: Sequence[int], logits: Tensor) -> Tensor:
        self.sync(tokens)
        words = self.allowed_words() if self.error is None else None
        if words is not None and self.matcher.is_error():  # a limit reached while computing the mask
            self.error, words = engine_message(self.matcher.get_error()), None
        if words is not None and words.any():  # the usual case: one pass over the packed mask
            return refuse(logits, unpack_bits(~words, self.vocabulary.size))
        text = self.vocabulary.tokenizer.decode_str(list(tokens))
        self.error = self.error or (f"no token of this model's vocabulary can continue {text[-40:]!r} "
                                    "as the schema requires; the vocabulary cannot write what the "
                                    "schema asks for")
        allowed = torch.zeros(self.vocabulary.size, dtype=torch.bool)
        allowed[self.stop_ids] = True  # the row ends here; its caller reports the error
        if not len(self.stop_ids):
            allowed[:] = True
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def refuse(logits: Tensor, refused: np.ndarray) -> Tensor:
    """A copy of the (V,) logits with the `refused` tokens at -inf. On the CPU it is one numpy pass
    on one thread: torch splits an op over a vocabulary of 50k across its threads, and on a busy
    machine each split waits for a core (0.3 to 8 ms a call measured on 2 shared cores, against
    30 to 90 us for numpy)."""
    if logits.device.type == "cpu" and logits.dtype in NUMPY_DTYPES:
        return torch.from_numpy(np.where(refused, -np.inf, logits.detach().numpy()))  # (V,), logits' dtype
    return logits.masked_fill(torch.from_numpy(refused).to(logits.device), float("-inf"))


def pack_bits(flags: Tensor) -> np.ndarray:
    """(V,) bools -> (W,) int32 words, llguidance's layout: bit j of word w is token 32w + j."""
    padded = np.zeros(((flags.numel() + 31) // 32) * 32, dtype=bool)
    padded[:flags.numel()] = flags.numpy()
    return np.packbits(padded, bitorder="little").view("<i4").astype(np.int32)  # (W,)


def unpack_bits(words: np.ndarray, size: int) -> np.ndarray:
    """(W,) int32 words -> (V,) bools (the inverse of pack_bits)."""
    # as little-endian bytes, bit b of byte i is token 8i + b, whatever the machine's order
    return np.unpackbits(words.astype("<i4", copy=False).view(np.uint8), bitorder="little")[:size].view(bool)


def json_object_schema() -> dict[str, Any]:
    """What `response_format: {"type": "json_object"}` asks for: any JSON object."""
    return {"type": "object"}


def lark_string(text: str) -> str:
    """A Lark string literal for `text`."""
    return json.dumps(text)


__all__ = ["Constraint", "Grammar", "GrammarEngineMissing", "INSTALL", "LAYOUT", "Vocabulary",
           "json_object_schema", "lark_string", "llguidance"]
