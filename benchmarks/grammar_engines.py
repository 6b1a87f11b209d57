"""Benchmark: the three grammar engines for JSON-schema decoding, side by side, on a GPT-2-sized
vocabulary: llguidance, xgrammar and outlines-core (whichever are installed).

The vocabulary: a byte-level BPE of 50,257 tokens (GPT-2's size) trained on
tiny Shakespeare and Multi30k (~7.5 M characters; docs/data.md: where they are looked for), its
tokens' bytes read by handformer/data/token_bytes.py, as serve wires a run's own tokenizer. For
each schema and each engine:

- compile: the time from the schema to a matcher ready for its first mask (the tokenizer itself
  is prepared once per engine, timed apart: `setup`);
- mask: the time of one next-token mask (the engine filling the bitmask of the vocabulary; reading
  it into token ids is not counted), the mean over every step
  of --walks constrained random walks (at each step a token drawn uniformly among the allowed
  ones, the end token as soon as it is allowed; a walk stops after --max-steps);
- correct: of the walks that ended, how many texts parse as JSON and validate against the schema
  (`jsonschema`). llguidance and xgrammar are set to the layout serve uses (", " and ": ", no
  other whitespace); outlines-core's regex takes a whitespace pattern only, so it writes none.

    python benchmarks/grammar_engines.py              # ~1 min on 2 shared cores
    python benchmarks/grammar_engines.py --walks 5    # a smoke run
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.data.lookup import folder, locate  # noqa: E402
from handformer.data.token_bytes import token_bytes  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                              "age": {"type": "integer", "minimum": 0, "maximum": 120}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {"id": {"type": "integer"}, "tag": {"enum": ["a", "b", "c"]}},
            "required": ["id", "tag"], "additionalProperties": False}},
        "ok": {"type": "boolean"}}, "required": ["items", "ok"], "additionalProperties": False},
    "anyOf": {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "number"}, {"type": "string", "maxLength": 8}, {"type": "null"}]}},
        "required": ["value"], "additionalProperties": False},
    "tool call": {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                       "unit": {"enum": ["c", "f"]}},
                      "required": ["city", "unit"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
}


def gpt2_sized_tokenizer() -> Tokenizer:
    texts = [locate("tinyshakespeare", "input.txt").read_text()]
    texts += [gzip.open(p, "rt", encoding="utf-8").read() for p in sorted(folder("multi30k").glob("*.gz"))]
    tok = Tokenizer.train_bpe(texts, 50257, min_frequency=1)
    assert tok.vocab_size == 50257, tok.vocab_size
    return tok


def allowed_ids(bitmask: torch.Tensor, vocab: int) -> list[int]:
    bits = (bitmask.view(-1, 1) >> torch.arange(32, dtype=torch.int32)) & 1  # (V/32, 32)
    return torch.nonzero(bits.view(-1)[:vocab]).view(-1).tolist()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Tokenizer, pieces: list[bytes | None]) -> None:
        import llguidance

        class Wrapper:
            eos_token_id, bos_token_id = tok.eos_id, tok.bos_id
            tokens = [p if p is not None else b"<special>" for p in pieces]
            special_token_ids = [i for i, p in enumerate(pieces) if p is None]

            def __call__(self, text):
                return tok.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

        self.lg = llguidance
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapper()))
        self.vocab = len(pieces)
        self.bitmask = torch.zeros((self.vocab + 31) // 32, dtype=torch.int32)

    def compile(self, schema: dict):
        grammar = self.lg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
        matcher = self.lg.LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def mask(self, matcher) -> torch.Tensor:
        matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        return self.bitmask

    def consume(self, matcher, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: Tokenizer, pieces: list[bytes | None]) -> None:
        import xgrammar

        self.xgr = xgrammar
        vocab = [p if p is not None else f"<special{i}>".encode() for i, p in enumerate(pieces)]
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=len(pieces),
                                      stop_token_ids=[tok.eos_id])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab = len(pieces)
        self.bitmask = xgrammar.allocate_token_bitmask(1, self.vocab)

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=(", ", ": "))
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher) -> torch.Tensor:
        matcher.fill_next_token_bitmask(self.bitmask)
        return self.bitmask

    def consume(self, matcher, token: int) -> None:
        assert matcher.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok: Tokenizer, pieces: list[bytes | None]) -> None:
        import outlines_core

        self.oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for i, p in enumerate(pieces):
            if p is not None and i != tok.eos_id:
                by_bytes.setdefault(p, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(tok.eos_id, by_bytes)
        self.vocab = len(pieces)
        self.bitmask = torch.zeros((self.vocab + 31) // 32, dtype=torch.int32)

    def compile(self, schema: dict):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def mask(self, guide) -> torch.Tensor:
        guide.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), 4)
        return self.bitmask

    def consume(self, guide, token: int) -> None:
        guide.advance(token, return_tokens=False)


def walk(engine, schema: dict, pieces: list, eos: int, rng: random.Random, max_steps: int):
    """One constrained random walk: (its text or None when cut at max_steps, the mask times)."""
    matcher, times, out = engine.compile(schema), [], []
    for _ in range(max_steps):
        t0 = time.perf_counter()
        bitmask = engine.mask(matcher)
        times.append(time.perf_counter() - t0)
        allowed = allowed_ids(bitmask, engine.vocab)
        if not allowed:
            raise AssertionError(f"{engine.name}: no token allowed after {b''.join(out)!r}")
        token = eos if eos in allowed else rng.choice(allowed)
        if token == eos:
            return b"".join(out).decode("utf-8"), times
        engine.consume(matcher, token)
        out.append(pieces[token])
    return None, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--walks", type=int, default=30)
    parser.add_argument("--max-steps", type=int, default=200)
    args = parser.parse_args()
    import jsonschema

    torch.set_num_threads(1)
    tok = gpt2_sized_tokenizer()
    pieces = token_bytes(tok)
    print(f"vocabulary: {tok.vocab_size} tokens (byte-level BPE); walks per schema: {args.walks}")
    print(f"{'engine':<14} {'setup s':>8} {'schema':<10} {'compile ms':>10} {'mask us':>9} {'p95 us':>8} "
          f"{'ended':>6} {'valid':>6}")
    for kind in (LLGuidance, XGrammar, OutlinesCore):
        try:
            t0 = time.perf_counter()
            engine = kind(tok, pieces)
            setup = time.perf_counter() - t0
        except ImportError as err:
            print(f"{kind.name:<14} not installed ({err})")
            continue
        for name, schema in SCHEMAS.items():
            rng = random.Random(0)
            t0 = time.perf_counter()
            engine.compile(schema)
            compile_ms = (time.perf_counter() - t0) * 1e3
            times, ended, valid = [], 0, 0
            for _ in range(args.walks):
                text, t = walk(engine, schema, pieces, tok.eos_id, rng, args.max_steps)
                times += t
                if text is not None:
                    ended += 1
                    try:
                        jsonschema.validate(json.loads(text), schema)
                        valid += 1
                    except (ValueError, jsonschema.ValidationError) as err:
                        print(f"  {kind.name} {name}: invalid {text!r}: {err}")
            times.sort()
            print(f"{kind.name:<14} {setup:>8.2f} {name:<10} {compile_ms:>10.1f} "
                  f"{statistics.mean(times) * 1e6:>9.0f} {times[int(0.95 * len(times))] * 1e6:>8.0f} "
                  f"{ended:>6} {valid:>6}")


if __name__ == "__main__":
    main()
