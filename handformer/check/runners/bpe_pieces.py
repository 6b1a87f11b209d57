"""A tokenizer that trains itself on characters, not bytes: SentencePiece's BPE as courses write it (a ▁
in front of each line and in place of each space, the line cut before each ▁, each word a sequence of
characters). Its merges are pairs of strings, so the byte-level reference's merges cannot be compared
with them; instead its merges are replayed on the fixture's lines cut so: each must be a most frequent
pair (counted with each word's frequency) once the ones before it are applied, whatever rule breaks
its ties. Then decode(encode(line)) must give the line back, in as many ids as the merges make pieces.
A character-level tokenizer whose merges show no ▁ cuts its words at spaces: bpe_words.py grades it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from handformer.check.core.context import Context
from handformer.check.core.result import DEPARTS, ComponentResult, Finding, failed_check, text
from handformer.check.core.source import first_line, locate, locate_form, source_lines
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import DOCUMENTS, VOCAB_SIZE
from handformer.check.runners import bpe, bpe_words
from handformer.check.runners.bpe_codec import ORDER_FORMS

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
                 merges: list[tuple[str, str]], lines: list[tuple[int, str]]) -> None:
    """A tokenizer whose `merges` (learnt from the fixture's text) are pairs of characters: a fresh one
    trained on the fixture's lines (`train`), its merges replayed on them, then its encode and decode
    on each line."""
    if not any(SPACE in a + b for a, b in merges):  # words cut at spaces, not SentencePiece's
        tok = train(bpe_words.LINES)[0]
        merges = bpe_words.held_merges(tok)
        cut = bpe_words.check_words(res, merges, bpe_words.LINES, lines)
        if cut:
            bpe_words.check_codec(res, ctx, tok.encode, tok.decode, merges, cut, bpe_words.LINES, lines,
                                  _piece_of(tok))
        return
    tok, merges = train(LINES)
    if scored_table(tok):  # a table of the pieces merges make: each cut where its training made it
        merges = cut_as_made(merges, sentencepiece_words(LINES))
    bpe_words.most_frequent_merges(res, merges, sentencepiece_words(LINES), (
        "lines (cut as SentencePiece cuts them: ▁ for each space)", "",
        "各行上（按 SentencePiece 的方式切开：空格写作 ▁）", ""))
    _round_trip(res, ctx, tok, merges, lines)
    byte_fallback(res, ctx, tok, lines)


def _round_trip(res: ComponentResult, ctx: Context, tok: Any, merges: list[tuple[str, str]],
                lines: list[tuple[int, str]]) -> None:
    """decode(encode(line)) == line, in as many ids as the merges applied by rank make pieces; where its
    pieces (or their counts, without a vocabulary to read them by) are those of another order of the
    merges on every line, that mistake named."""
    ranks = {pair: r for r, pair in enumerate(merges)}
    made = {order: [_pieces(line, ranks, order) for line in LINES] for order in ORDERS}
    ours = [list(ctx.learner.call("encode", tok.encode, line)) for line in LINES]
    backs = [ctx.learner.call("decode", tok.decode, ids) for ids in ours]
    bad = [(line, len(ids), len(want)) for line, ids, want, back in zip(LINES, ours, made["rank"], backs)
           if (back, len(ids)) != (line, len(want))]
    res.checks.append(failed_check(text(
        f"decode(encode(line)) gives each of the {len(LINES)} lines back, in as many ids as its merges "
        "(the earliest learnt first) make pieces", f"decode(encode(line)) 还原 {len(LINES)} 行中的每一行，"
        "id 数等于按合并（先学到的先用）切出的片段数"), not bad, lambda: text(
        f"{bad[0][0][:40]!r}: {bad[0][1]} ids, {bad[0][2]} pieces", f"{bad[0][0][:40]!r}：{bad[0][1]} 个 id，"
        f"{bad[0][2]} 个片段")))
    _order_finding(res, made, ours, _piece_of(tok), lines)
    if backs == [f" {line}" for line in LINES]:  # the ▁ put in front of the text, kept
        res.findings.append(Finding(DEPARTS, KEPT_SPACE, *first_line([r"^\s*return\b"], source_lines(
            [tok.decode])[::-1])))


def scored_table(tok: Any) -> bool:
    """Whether the tokenizer keeps its merges as the pieces they make, each with a score (SentencePiece's
    BPE, `bpe_words.scored_merges`): it merges any two pieces that join into one of them."""
    return any(map(bpe_words.scored_merges, vars(tok).values()))


def cut_as_made(merges: list[tuple[str, str]], words: Counter[tuple[str, ...]]) -> list[tuple[str, str]]:
    """Each merged piece cut where training made it: of the adjacent pairs of `words` (the merges before
    it applied) that join into it, the most frequent; the table alone cannot tell "▁" + "on" from "▁o" +
    "n"."""
    cut = []
    for a, b in merges:
        counts = R.pair_counts(words)
        pair = max((p for p in counts if p[0] + p[1] == a + b), key=counts.__getitem__, default=(a, b))
        cut.append(pair)
        words = Counter({R.merge_word(w, pair): n for w, n in words.items()})
    return cut


KEPT_SPACE = text("decode gives each line back with a space in front: the ▁ put before the text is not "
                  "taken off", "decode 还原的每一行前面都多了一个空格：加在文本前面的 ▁ 没有去掉")


def _order_finding(res: ComponentResult, made: dict[str, list[list[str]]], ours: list[list[int]],
                   piece_of: dict[str, int], lines: list[tuple[int, str]]) -> None:
    """bpe_encode_merge_order where the encode's pieces (its ids read by `piece_of`) on every line are
    another order's, not the reference's."""
    ids = {o: [list(map(piece_of.get, pieces)) for pieces in made[o]] for o in ORDERS}
    order = next((o for o in ORDERS[1:] if ids[o] == ours != ids["rank"]), None)
    if order is not None:
        order = order.removesuffix("_one")
        en, zh = ORDER_FORMS[order]
        res.findings.append(Finding("bpe_encode_merge_order", text(
            f"on each of the {len(LINES)} lines your encode gives the pieces the merges make when {en}",
            f"在全部 {len(LINES)} 行上，你的 encode 给出的片段都是这样合并切出的：{zh}"),
            *locate_form("bpe_encode_merge_order", order, lines)[1:], order))


def _piece_of(tok: Any) -> dict[str, int]:
    """piece -> id, the largest dict of pieces to ids the tokenizer holds; empty where it holds none."""
    return max(filter(lambda v: bpe.typed(v, str, int), vars(tok).values()), key=len, default={})


def _pieces(line: str, ranks: dict[tuple[str, str], int], order: str) -> list[str]:
    """The line's pieces, its words merged in `order` (ORDERS)."""
    encode = ENCODERS.get(order, R.encode_word)
    return [piece for word in _words_of(line) for piece in encode(word, ranks, order)]


# the reference's order first, then the mistakes': latest_one is latest one occurrence at a time, the
# rightmost first (max over (rank, position))
ORDERS = ("rank", "leftmost", "latest", "latest_one", "reversed")


def _latest_one(word: tuple[str, ...], ranks: dict[tuple[str, str], int], order: str) -> list[str]:
    """The word's pieces with the pair of highest rank merged first, at its rightmost place, again
    until no pair has a rank."""
    pieces = list(word)
    while found := [(ranks[p], i) for i, p in enumerate(zip(pieces, pieces[1:])) if p in ranks]:
        _, i = max(found)
        pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
    return pieces


ENCODERS = {"latest_one": _latest_one}
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's byte-fallback pieces, <0x00> .. <0xFF>
UNSEEN = "Ω ✓ 한국 Ωmega ✓✓"  # characters the fixture's lines never hold: each must fall back to bytes
PER_BYTE = re.sub(r"[^ mega]", lambda c: "\ufffd" * len(c[0].encode()), UNSEEN)  # each byte decoded alone


def byte_fallback(res: ComponentResult, ctx: Context, tok: Any, lines: list[tuple[int, str]]) -> None:
    """A tokenizer that holds the 256 byte pieces: a text of characters it never saw comes back from
    decode(encode(text)); each piece decoded on its own (U+FFFD for each byte) is bpe_decode_per_token."""
    if not any(len(BYTE_PIECE.findall(repr(v))) >= 256 for v in vars(tok).values()):
        return
    back = ctx.learner.call("decode", tok.decode, ctx.learner.call("encode", tok.encode, UNSEEN))
    res.checks.append(failed_check(text(
        f"characters never seen in training come back through the byte pieces: decode(encode({UNSEEN!r}))",
        f"训练时没见过的字经字节片段还原：decode(encode({UNSEEN!r}))"), back == UNSEEN,
        lambda: text(f"{back!r}", f"得到 {back!r}")))
    if back == PER_BYTE:
        res.findings.append(Finding("bpe_decode_per_token", text(
            f"your decode gives {back!r}: one U+FFFD for each byte of each character never seen, each byte "
            "piece turned into text on its own",
            f"你的 decode 得到 {back!r}：没见过的字每个字节一个 U+FFFD，每个字节片段被单独转成了文本"),
            *locate("bpe_decode_per_token", lines)))


def _words_of(line: str) -> list[tuple[str, ...]]:
    """The line's words as SentencePiece cuts them, in order."""
    return [tuple(w) for w in re.split(f"(?={SPACE})", SPACE + line.replace(" ", SPACE)) if w]

