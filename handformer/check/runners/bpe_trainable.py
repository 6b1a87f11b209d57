"""The runner of a tokenizer class that trains itself (minbpe's `RegexTokenizer`: built with no
vocabulary, `train(text, vocab_size, special_tokens)`, then `encode` and `decode`), found by what it
has, whatever its name.

It is trained on the fixture corpus with two special tokens (one inside the other); its merges
(read from the attribute that holds them: a dict of id pairs, or a list of pairs) are compared with
the reference trained under the learner's own split pattern (read from the instance: a compiled
regex or a pattern string); a pattern one alternative away from GPT-2's or GPT-4's is reported at
the line that writes it. Then its encode and decode run on the texts of bpe_codec.py against the
reference's encoding with the learner's own vocabulary and merges.
"""

from __future__ import annotations

import inspect
from typing import Any

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, trains_itself
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.source import source_lines
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import CORPUS, SPECIAL, VOCAB_SIZE
from handformer.check.runners import bpe, bpe_codec, bpe_pieces

SPECIALS = [SPECIAL, bpe_codec.OVERLAP]  # in this order: the shorter first, so longest-first must be chosen


def trainable(obj: Any) -> bool:
    """A class with train, encode and decode methods that is built without a vocabulary."""
    return trains_itself(obj) and all(p.default is not p.empty for p in call_parameters(obj.__init__)[1:])


def check_tokenizer(comp: Component, ctx: Context) -> ComponentResult:
    """The kind's runner: a class that trains itself is trained first; any other encoder and decoder
    is handed the reference's vocabulary and merges (bpe_codec.py)."""
    return (check_trainable if trainable(comp.obj) else bpe_codec.check_bpe_tokenizer)(comp, ctx)


def check_trainable(comp: Component, ctx: Context) -> ComponentResult:
    """Train, compare the merges under its own pattern, then encode and decode."""
    res = ctx.result(comp)
    tok = ctx.learner.call("__init__", comp.obj)
    kwargs = _train_kwargs(tok.train)
    with bpe.deadline(bpe.FIXTURE_LIMIT):
        ctx.learner.call("train", tok.train, **kwargs)
    vocab, merges = _learnt(tok)
    if bpe_pieces.character_merges(merges):  # SentencePiece's BPE on characters: no byte-level reference
        bpe_pieces.check_pieces(res, ctx, lambda lines: _trained_on(comp, ctx, kwargs, lines), merges)
        return finish(res)
    pattern = _pattern(tok)
    lines = source_lines(ctx.objects(comp))
    _check_pattern(res, ctx, pattern)
    names = {p: (f"{name}'s", name) for name, p in R.KNOWN_PATTERNS.items()}
    known = names.get(pattern, ("your own", "你自己的"))
    res.notes.append(text(f"trained and graded with your split pattern ({known[0]})",
                          f"用你的切分正则训练和评判（{known[1]}）"))
    specials = SPECIALS[:2 * ("special" in _roles(tok.train).values())]
    with R.split_by(pattern):
        _, ref_merges = R.train(CORPUS, kwargs.get("vocab_size", VOCAB_SIZE + 1), specials)
        bpe.compare_merges(res, merges, ref_merges, specials, lines)
        if merges == ref_merges and set(map(str.encode, specials)) <= set(vocab.values()):
            codec = bpe_codec.Codec.__new__(bpe_codec.Codec)
            codec.comp, codec.ctx, codec.encode_fn, codec.decode_fn = comp, ctx, tok.encode, tok.decode
            bpe_codec.grade_codec(res, codec, vocab, merges, specials, lines)
    return finish(res)


def _trained_on(comp: Component, ctx: Context, kwargs: dict[str, Any], corpus: Any) -> tuple[Any, list[Any]]:
    """A fresh instance trained on `corpus` (handed where the text was) with `kwargs`, and its merges."""
    tok = ctx.learner.call("__init__", comp.obj)
    name = next(n for n, role in _roles(tok.train).items() if role == "text")
    with bpe.deadline(bpe.FIXTURE_LIMIT):
        ctx.learner.call("train", tok.train, **{**kwargs, name: corpus})
    return tok, _learnt(tok)[1]


def _roles(fn: Any) -> dict[str, str]:
    return {p.name: bpe.argument_role(p.name, first=i == 0) for i, p in enumerate(call_parameters(fn))}


def _train_kwargs(fn: Any) -> dict[str, Any]:
    """train's arguments by name: the corpus, vocab_size (the bytes, 180 merges and two special
    tokens; without special tokens two less) or the number of merges, the special tokens."""
    roles = _roles(fn)
    without = 2 * ("special" not in roles.values())
    values = {"text": CORPUS, "vocab_size": VOCAB_SIZE + 1 - without, "merges": VOCAB_SIZE - 257,
              "special": list(SPECIALS)}
    return {name: values[role] for name, role in roles.items() if role in values}


def _learnt(tok: Any) -> tuple[dict[int, bytes], list[R.Pair]]:
    """(vocab id -> bytes, merges as pairs of bytes in the order learnt) read from the instance's
    attributes by what they hold: minbpe's merges {(id, id): id} and vocab {id: bytes}, or a list of
    pairs (of bytes or ids)."""
    held = list(vars(tok).values())
    vocab = next(filter(lambda v: bpe.typed(v, int, bytes), held), {})
    ranked = [sorted(v, key=v.__getitem__) for v in filter(lambda v: bpe.typed(v, tuple, int), held)]
    pairs = next(iter(ranked + list(filter(lambda v: bpe.typed(v, int, tuple), held))), [])
    if bpe_pieces.character_merges(pairs) and set("".join(map("".join, pairs))) <= R.BYTE_OF.keys():
        return _byte_level(held, pairs)
    return vocab, [(vocab.get(a, a), vocab.get(b, b)) for a, b in pairs]  # ids -> bytes


def _byte_level(held: list[Any], pairs: list[R.Pair]) -> tuple[dict[int, bytes], list[R.Pair]]:
    """A byte-level BPE written over GPT-2's printable characters (its encoder.py: merges of strings
    such as ("Ġ", "t"), an encoder {string: id}): merges and vocabulary back in bytes."""
    encoder = max(filter(lambda v: bpe.typed(v, str, int), held), key=len, default={})  # not its specials
    merges = [(bpe.gpt2_bytes(a), bpe.gpt2_bytes(b)) for a, b in pairs]
    return dict(zip(encoder.values(), map(bpe.gpt2_bytes, encoder))), merges


def _pattern(tok: Any) -> str:
    """The split pattern the instance holds (a compiled regex, or a string attribute named
    pattern); GPT-2's when it holds none."""
    held = vars(tok)
    found = [getattr(v, "pattern", None) for v in held.values()] + [held.get("pattern")]
    return next(filter(lambda p: isinstance(p, str), found), R.GPT2_PATTERN)


def _check_pattern(res: ComponentResult, ctx: Context, pattern: str) -> None:
    """A pattern that is a known one less (or plus) one alternative: the line that writes it."""
    mine = set(pattern.split("|"))  # the alternatives (inner ones too: both sides are cut alike)
    near = [(name, mine ^ set(known.split("|"))) for name, known in R.KNOWN_PATTERNS.items()]
    for name, (alt,) in [(name, d) for name, d in near if len(d) == 1]:
        en, zh = [("with", "多了"), ("without", "少了")][alt not in mine]
        lines = inspect.getsource(ctx.module).splitlines()
        at = next((f" (line {n + 1}: {ln.strip()})" for n, ln in enumerate(lines) if pattern[:30] in ln), "")
        said = text(f"the split pattern is {name}'s as written", f"切分正则与 {name} 的原文一致")
        res.checks.append(Check(said, False, text(f"it is {name}'s {en} the alternative {alt}{at}",
                                                  f"它是 {name} 的正则，但{zh}分支 {alt}{at}")))
