"""A tokenizer that trains itself on characters, not bytes: SentencePiece's BPE as courses write it (a ▁
in front of each line and in place of each space, the line cut before each ▁, each word a sequence of
characters). Its merges are pairs of strings, so the byte-level reference's merges cannot be compared
with them; instead its merges are replayed on the fixture's lines cut so: each must be a most frequent
pair (counted with each word's frequency) once the ones before it are applied, whatever rule breaks
its ties. Then decode(encode(line)) must give the line back, in as many ids as the merges make pieces.
A character-level tokenizer whose merges show no ▁ cuts its words some other way: not checked.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from handformer.check.core.context import Context
from handformer.check.core.result import ComponentResult, failed_check, text
from handformer.check.core.weights import MappingError
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import DOCUMENTS, VOCAB_SIZE

SPACE = "\u2581"  # ▁: SentencePiece's mark of a space
LINES = "\n".join(DOCUMENTS).splitlines()
MERGES = VOCAB_SIZE - 257  # as many merges as the byte-level check asks for


def character_merges(merges: list[Any]) -> bool:
    """Merges learnt as pairs of strings (characters joined), not bytes or ids."""
    return bool(merges) and all(type(a) is type(b) is str for a, b in merges)


def sentencepiece_words(lines: list[str]) -> Counter[tuple[str, ...]]:
    """Each word of `lines` as SentencePiece cuts them (▁ + the line, spaces as ▁, cut before each ▁),
    a tuple of its characters, with how often it occurs."""
    words: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        marked = SPACE + line.replace(" ", SPACE)
        words.update(tuple(w) for w in re.split(f"(?={SPACE})", marked) if w)
    return words


def check_pieces(res: ComponentResult, ctx: Context, train: Callable[[list[str]], tuple[Any, list[Any]]],
                 merges: list[tuple[str, str]]) -> None:
    """A tokenizer whose `merges` (learnt from the fixture's text) are pairs of characters: a fresh one
    trained on the fixture's lines (`train`), its merges replayed on them, then its encode and decode
    on each line."""
    if not any(SPACE in a + b for a, b in merges):
        raise MappingError("its merges are pairs of characters with no ▁ in any: a character-level BPE "
                           "that cuts its words in a way check does not know (SentencePiece's ▁ is the one "
                           "it knows)", zh="它的合并是字符对，但没有一个含 ▁：这种字符级 BPE 的切词方式 "
                           "check 不认识（它只认识 SentencePiece 的 ▁）")
    tok, merges = train(LINES)
    step, _rule = R.replay(sentencepiece_words(LINES), merges)
    res.checks.append(failed_check(text(
        f"its {len(merges)} merges on the fixture's lines (cut as SentencePiece cuts them: ▁ for each "
        "space) are each a most frequent pair, counted with each word's frequency",
        f"在测试语料的各行上（按 SentencePiece 的方式切开：空格写作 ▁）学到的 {len(merges)} 次合并，"
        "每一次都是（按词频计数的）出现最多的一对"), step is None, lambda: text(
        f"merge {step}, {merges[step]}, is not a most frequent pair once the merges before it are applied",
        f"合并 {step}（从 0 数）{merges[step]} 在应用它之前的合并后，不是出现最多的一对")))
    _round_trip(res, ctx, tok, merges)


def _round_trip(res: ComponentResult, ctx: Context, tok: Any, merges: list[tuple[str, str]]) -> None:
    """decode(encode(line)) == line, in as many ids as the merges applied by rank make pieces."""
    ranks = {pair: r for r, pair in enumerate(merges)}
    bad = []
    for line in LINES:
        ids = ctx.learner.call("encode", tok.encode, line)
        pieces = sum(len(R.encode_word(w, ranks)) for w in _words_of(line))
        if (ctx.learner.call("decode", tok.decode, ids), len(ids)) != (line, pieces):
            bad.append((line, len(ids), pieces))
    res.checks.append(failed_check(text(
        f"decode(encode(line)) gives each of the {len(LINES)} lines back, in as many ids as its merges "
        "(the earliest learnt first) make pieces", f"decode(encode(line)) 还原 {len(LINES)} 行中的每一行，"
        "id 数等于按合并（先学到的先用）切出的片段数"), not bad, lambda: text(
        f"{bad[0][0][:40]!r}: {bad[0][1]} ids, {bad[0][2]} pieces", f"{bad[0][0][:40]!r}：{bad[0][1]} 个 id，"
        f"{bad[0][2]} 个片段")))


def _words_of(line: str) -> list[tuple[str, ...]]:
    return list(sentencepiece_words([line]).elements())
