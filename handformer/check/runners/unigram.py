"""A Unigram language-model tokenizer (SentencePiece's, Kudo 2018): trained, it holds pieces with
log-probabilities (an attribute mapping each piece to its score), encodes by Viterbi over the lattice
of pieces and decodes by joining them (▁ back to a space).

What is checked is what can be checked exactly whatever its training did: on texts check writes from
the learner's OWN pieces, encode's segmentation must have the highest total score under the learner's
own scores (check's Viterbi over the same string: ties are the learner's to break), and decode must give
the text back. Its EM training (expected counts, the M-step, pruning) is not compared: the report says
so.
"""

from __future__ import annotations

import math
import re
from typing import Any

from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import DiscoveryError
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.unlocated import header
from handformer.check.runners import bpe

SPACE = "\u2581"  # ▁: SentencePiece's word boundary
TEXTS, WORDS = 24, 6  # texts written from the pieces, of so many pieces each
TOLERANCE = 1e-9  # a segmentation's total score may be this far under the best (float sums)
SEARCH_WORDS = re.compile("viterbi|lattice|segment", re.I)


def unigram_pieces(tok: Any) -> dict[str, float] | None:
    """The attribute of a trained tokenizer that gives each piece (a string) its score (a float
    log-probability, none above 0): a dict, or a list of (piece, score) pairs (SentencePiece's
    `[("▁the", -2.3), ...]`), the largest such; None where it holds none of two pieces or more."""
    held = [_scored(v) for v in vars(tok).values()]
    return max(filter(None, held), key=len, default=None)


def _scored(value: Any) -> dict[str, float] | None:
    """A dict of piece -> score, or a list of (piece, score) pairs, as a dict; None where it is neither."""
    pieces = quietly(lambda: dict(value), Exception, {})  # (a string, a tensor, a number: none)
    return pieces if len(pieces) > 1 and bpe.typed(pieces, str, float) and max(pieces.values()) <= 0 else None


def best_score(string: str, pieces: dict[str, float]) -> float:
    """The highest total score of a segmentation of `string` into pieces (minus infinity: none)."""
    longest = max(map(len, pieces))
    best = [0.0] + [-math.inf] * len(string)
    for end in range(1, len(string) + 1):
        for start in range(max(0, end - longest), end):
            score = pieces.get(string[start:end])
            if score is not None:
                best[end] = max(best[end], best[start] + score)
    return best[-1]


def texts_from(pieces: dict[str, float]) -> list[str]:
    """TEXTS texts, each WORDS pieces (strided through them all, the likeliest first) joined, ▁ read
    as a space: every one segments under the pieces, most in more than one way."""
    ranked = sorted(pieces, key=lambda p: (-pieces[p], p)) or [""]  # (no pieces: no texts)
    stride = len(ranked) // WORDS + 1
    picked = [[ranked[(i * 7 + j * stride) % len(ranked)] for j in range(WORDS)] for i in range(TEXTS)]
    # one space between words: a tokenizer that splits on whitespace gives no other text back
    return [t for t in dict.fromkeys(" ".join("".join(w).replace(SPACE, " ").split()) for w in picked) if t]


def as_pieces(tok: Any, out: Any) -> list[str]:
    """encode's output as pieces: strings as they are, ids through the tokenizer's own id -> piece table
    (`_by_id`: the first that holds every id)."""
    ids = {int(t) for t in out if not isinstance(t, str)}
    table = next((t for t in map(_by_id, vars(tok).values()) if ids <= t.keys()), {})
    return [t if isinstance(t, str) else table.get(int(t), str(t)) for t in out]


def _by_id(value: Any) -> dict[int, str]:
    """id -> piece, read from a list of pieces or a dict either way (piece -> id, id -> piece)."""
    table = dict(enumerate(value)) if isinstance(value, list) else value if isinstance(value, dict) else {}
    flipped = quietly(lambda: {v: k for k, v in table.items()}, TypeError, {})
    pairs = [*table.items(), *flipped.items()]
    return dict(filter(lambda kv: type(kv[0]) is int and isinstance(kv[1], str), pairs))


def check_unigram(res: ComponentResult, ctx: Any, comp: Any, tok: Any, pieces: dict[str, float]) -> None:
    """Encode each text of `texts_from`: its pieces' total score against the best; decode back."""
    short, lost, compared = [], [], 0
    texts = texts_from(pieces)
    for said in texts:
        out = ctx.learner.call("encode", tok.encode, said)
        got = as_pieces(tok, out)
        best = best_score("".join(got), pieces)  # minus infinity: cut into what its pieces cannot cut
        score = sum(pieces.get(p, -math.inf) for p in got)
        compared += best > -math.inf
        short += [(said, got, score, best)] * (score < best - TOLERANCE)
        back = ctx.learner.call("decode", tok.decode, out)
        lost += [(said, back)] * (back != said)
    if not compared:  # nothing compared: not a pass
        raise DiscoveryError(UNCOMPARED[0], zh=UNCOMPARED[1])
    _report(res, comp, short, lost, len(pieces))


NOTE = text("a Unigram model (pieces with log-probabilities), trained on lines of words: its EM training "
            "(expected counts, the M-step, pruning) is not compared; what its pieces and scores encode is",
            "Unigram 模型（片段带对数概率），用几行单词训练：它的 EM 训练（期望次数、M 步、剪枝）"
            "不做比较；比较的是用它的片段和分数做的编码")
UNCOMPARED = ("check could compare none of its encodings: it holds no pieces, or encodes with pieces it "
              "does not hold", "检查程序一段编码都比较不了：它没有片段，或者编码用了它没有的片段")


SHOWN = ("{!r} -> {} scores {:.4f}, the best {:.4f}", "{!r} -> {} 总分 {:.4f}，最高 {:.4f}")


def _report(res: ComponentResult, comp: Any, short: list[Any], lost: list[Any], n: int) -> None:
    shown, shown_zh = ("; ".join(words.format(s, " ".join(g), sc, b) for s, g, sc, b in short[:2])
                       for words in SHOWN)
    res.checks.append(Check(text(f"by its own scores: encode cuts each text (written from your {n} pieces) "
                                 "into the pieces of the highest total score (Viterbi)",
                                 f"按它自己的分数：encode 把每段文本（用你的 {n} 个片段写成）都切成"
                                 "总分最高的片段（Viterbi）"), not short, text(shown, shown_zh)))
    back = "; ".join(f"{s!r} -> {b!r}" for s, b in lost[:2])
    res.checks.append(Check(text("round trip: decode(encode(text)) gives the text back",
                                 "往返：decode(encode(text)) 还原出原文"), not lost, text(back, back)))
    res.notes.append(NOTE)
    if short:
        number, code = _search_line(comp.obj)
        res.findings.append(Finding(DEPARTS, text(
            f"encode's segmentation is not the highest-scoring one: {shown}",
            f"encode 的切分不是总分最高的：{shown_zh}"), number, code))


def _search_line(cls: Any) -> tuple[int | None, str | None]:
    """The `def` line of the method that searches the lattice (its name says Viterbi, a lattice or a
    segmentation), else encode's."""
    return header(getattr(cls, next((n for n in dir(cls) if SEARCH_WORDS.search(n)), "encode")))
