"""WordPiece written by hand for `handformer check`: the trainer as the Hugging Face course teaches it
(BERT's vocabulary), BERT's greedy longest-match-first encoder, and the decoder.

Training cuts the corpus into words (runs of letters and digits, each punctuation mark its own word),
spells each word as its first character and the others prefixed with "##", then merges the pair of
best score freq(ab) / (freq(a) * freq(b)) (each frequency counted with its word's frequency), in
exact fractions; a tie goes to the pair counted first (the words in the order they first occur, the
pairs of each left to right: the course's `if max_score < score`). The mistakes are flags: the cut
(`whitespace`: split on spaces only; `text`: each text one word), the score (`frequency`,
`first_only`, `second_only`, `sum`), no "##" (`no_prefix`); in encode `shortest`, `no_prefix`, `unk_piece`
(the pieces found, then [UNK]), `unk_skip` ([UNK] for one character, then on); in
decode `spaced` (every piece a word), `kept` (the pieces joined by spaces as they are), `glued_kept`
(glued on with their "##").
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable
from fractions import Fraction

PREFIX = "##"
UNK = "[UNK]"
WORD = re.compile(r"\w+|[^\w\s]")
CUTS: dict[str, Callable[[str], list[str]]] = {"words": WORD.findall, "whitespace": str.split,
                                               "text": lambda t: [t]}
SCORES: dict[str, Callable[[int, int, int], Fraction]] = {
    "score": lambda f, fa, fb: Fraction(f, fa * fb),
    "frequency": lambda f, fa, fb: Fraction(f),
    "first_only": lambda f, fa, fb: Fraction(f, fa),
    "second_only": lambda f, fa, fb: Fraction(f, fb),
    "sum": lambda f, fa, fb: Fraction(f, fa + fb),
}
Pair = tuple[str, str]


def word_freqs(texts: Iterable[str], cut: str = "words") -> dict[str, int]:
    """Each word of the texts with how often it occurs, in the order the words first occur."""
    return dict(Counter(itertools.chain.from_iterable(map(CUTS[cut], texts))))


def spell(word: str, prefix: bool = True) -> list[str]:
    """The word as its characters, all but the first prefixed with "##" (none with `prefix` off)."""
    return [word[0], *(PREFIX * prefix + c for c in word[1:])]


def joined(a: str, b: str) -> str:
    """The token a merge of a and b makes: b's "##" dropped."""
    return a + b.removeprefix(PREFIX)


def scores(splits: dict[str, list[str]], freqs: dict[str, int], rule: str = "score") -> dict[Pair, Fraction]:
    """Each adjacent pair's score, in the order the pairs are first counted."""
    single: dict[str, int] = {}
    pairs: dict[Pair, int] = {}
    for word, f in freqs.items():
        split = splits[word]
        for s in split:
            single[s] = single.get(s, 0) + f
        for pair in zip(split, split[1:]):
            pairs[pair] = pairs.get(pair, 0) + f
    return {p: SCORES[rule](f, single[p[0]], single[p[1]]) for p, f in pairs.items()}


def merge(splits: dict[str, list[str]], pair: Pair) -> None:
    """Every occurrence of the pair merged into one token, in place."""
    for word, split in splits.items():
        out, i = [], 0
        while i < len(split):
            if tuple(split[i:i + 2]) == pair:
                out.append(joined(*pair))
                i += 2
            else:
                out.append(split[i])
                i += 1
        splits[word] = out


def train(texts: Iterable[str], merges: int, cut: str = "words", rule: str = "score",
          prefix: bool = True) -> list[Pair]:
    """The first `merges` merges, ties to the pair counted first."""
    freqs = word_freqs(texts, cut)
    splits = {w: spell(w, prefix) for w in freqs}
    out: list[Pair] = []
    for _ in range(merges):
        scored = scores(splits, freqs, rule)
        pair = max(scored, key=scored.__getitem__, default=None)  # the first of the best: counted first
        if pair is None:
            break
        merge(splits, pair)
        out.append(pair)
    return out


def replay(texts: Iterable[str], learnt: list[str], cut: str = "words", rule: str = "score",
           prefix: bool = True) -> int | None:
    """The position of the first learnt token (in the order learnt) that no best-scoring pair makes
    once the ones before it are merged (ties within float rounding, in any order; a best pair whose
    token was learnt already is merged unseen, as a trainer that adds a token once does); None when
    every one is."""
    freqs = word_freqs(texts, cut)
    splits = {w: spell(w, prefix) for w in freqs}
    seen: set[str] = set()
    i = 0
    while i < len(learnt):
        scored = scores(splits, freqs, rule)
        best = max(scored.values(), default=Fraction(0))
        top = [p for p, s in scored.items() if float(s) >= float(best) * (1 - 1e-9)]
        made = [p for p in top if joined(*p) in {learnt[i], *seen}]
        if not made:
            return i
        pair = min(made, key=lambda p: joined(*p) != learnt[i])  # the token learnt next, if one makes it
        seen.add(joined(*pair))
        i += joined(*pair) == learnt[i]
        merge(splits, pair)
    return None


def encode_word(word: str, vocab: set[str], flags: frozenset[str] = frozenset(), max_chars: int = 100,
                unk: str = UNK) -> list[str]:
    """BERT's greedy longest-match-first: the longest piece of the vocabulary at each start ("##"
    before a piece that does not start the word); a word with a start no piece matches is [UNK]
    whole, as is a word longer than `max_chars`."""
    if len(word) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        piece = _longest(word, start, vocab, flags)
        if piece is None:
            if "unk_skip" in flags:
                pieces.append(unk)
                start += 1
                continue
            return pieces + [unk] if "unk_piece" in flags else [unk]
        pieces.append(piece)
        start += len(piece.removeprefix(PREFIX))
    return pieces


def _longest(word: str, start: int, vocab: set[str], flags: frozenset[str]) -> str | None:
    """The piece matched at `start`: the longest (the shortest with `shortest`)."""
    ends = range(start + 1, len(word) + 1) if "shortest" in flags else range(len(word), start, -1)
    mark = PREFIX * bool(start and "no_prefix" not in flags)
    return next((mark + word[start:end] for end in ends if mark + word[start:end] in vocab), None)


def tokenize(text: str, vocab: set[str], flags: frozenset[str] = frozenset(), unk: str = UNK) -> list[str]:
    """Each word of the text encoded (`whitespace`: the text cut by spaces alone)."""
    words = CUTS["whitespace" if "whitespace" in flags else "words"](text)
    return [p for w in words for p in encode_word(w, vocab, flags, unk=unk)]


# the pieces joined by spaces, then each "##" after a space: glued on (BERT's), or with a mistake
DECODES: dict[str, Callable[[str], str]] = {
    "": lambda text: text.replace(" " + PREFIX, ""),
    "spaced": lambda text: text.replace(" " + PREFIX, " "),  # every piece a word
    "kept": lambda text: text,  # the pieces as they are
    "glued_kept": lambda text: text.replace(" " + PREFIX, PREFIX),  # glued on with their "##"
}


def decode(pieces: list[str], flags: frozenset[str] = frozenset()) -> str:
    """The pieces as text: a piece with "##" glued onto the word before it, words between spaces (one
    mistake of DECODES at most)."""
    return DECODES[next(iter(flags), "")](" ".join(pieces))
