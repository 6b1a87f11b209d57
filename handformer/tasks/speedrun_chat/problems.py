"""The tasks a small assistant learns in `handformer speedrun chat`: questions with one checkable
answer, generated here, deterministic from a seed.

    dates       What is "the twenty-third of march, nineteen ninety-seven" as a date?   1997-03-23
    arithmetic  What is 37 plus 48?                                                       85
    spelling    Spell the word "garden".                                                  g a r d e n
    counting    How many times does the letter "r" appear in "strawberry"?               3

Held out: a fixed tenth of each task's keys (the date; the operation and numbers; the word; the
word and letter), chosen by a hash, is never drawn for training, pretraining or preferences, so the
held-out accuracy measures questions the model has not seen. Each problem also has a statement
(the fact in plain text, "37 plus 48 is 85.") for pretraining, and wrong answers near the right
one for preference pairs.
"""

from __future__ import annotations

import datetime
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from handformer.data.dates import FIRST, N_DAYS, N_STYLES, render

KINDS = ("dates", "arithmetic", "spelling", "counting")
MAX_MISSES = 100_000  # draws in a row without a new problem: the split is used up


@dataclass(frozen=True)
class Problem:
    kind: str
    question: str  # the user's message
    answer: str  # the exact reply
    statement: str  # the same fact as plain text (pretraining)
    prefix: str  # the statement up to the answer (how a base model is asked)
    key: str  # what the held-out split is decided on
    after: str = ""  # what follows the answer in the statement (" times"): cut from a base model's reply


def held_out(kind: str, key: str, seed: int) -> bool:
    """Whether a key belongs to the held-out tenth (fixed by the seed)."""
    digest = hashlib.sha256(f"{seed}:{kind}:{key}".encode()).digest()
    return digest[0] % 10 == 0


def _words() -> list[str]:
    """Lower-case words of 3 to 9 letters that the embedded pydoc corpus uses at least 5 times as
    words of their own (between spaces or punctuation), sorted: deterministic."""
    from collections import Counter

    from handformer.data.text import pydoc_corpus

    counts = Counter(re.findall(r"(?:^|(?<=[\s(\"']))([a-z]{3,9})(?=[\s.,;:)\"'])", pydoc_corpus()))
    return sorted(w for w, n in counts.items() if n >= 5)


def _date(rng: random.Random) -> Problem:
    date = FIRST + datetime.timedelta(days=rng.randrange(N_DAYS))
    words = render(date, rng.randrange(N_STYLES))
    ask = rng.choice([f'What is "{words}" as a date?', f'Write "{words}" as a date (year-month-day).',
                      f'Which date is "{words}"?'])
    return Problem("dates", ask, date.isoformat(), f'"{words}" is {date.isoformat()}.', f'"{words}" is',
                   date.isoformat())


def _arithmetic(rng: random.Random) -> Problem:
    op = rng.choice(["plus", "minus", "times"])
    if op == "times":
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        value = a * b
    else:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        a, b = (max(a, b), min(a, b)) if op == "minus" else (a, b)
        value = a + b if op == "plus" else a - b
    ask = rng.choice([f"What is {a} {op} {b}?", f"Compute {a} {op} {b}.", f"How much is {a} {op} {b}?"])
    return Problem("arithmetic", ask, str(value), f"{a} {op} {b} is {value}.", f"{a} {op} {b} is",
                   f"{op}:{a}:{b}")


def _spelling(rng: random.Random, words: Sequence[str]) -> Problem:
    word = rng.choice(words)
    spelled = " ".join(word)
    ask = rng.choice([f'Spell the word "{word}".', f'Spell "{word}" letter by letter.',
                      f'How do you spell "{word}"?'])
    return Problem("spelling", ask, spelled, f'"{word}" is spelled {spelled}.', f'"{word}" is spelled', word)


def _counting(rng: random.Random, words: Sequence[str]) -> Problem:
    word = rng.choice(words)
    letter = rng.choice(word) if rng.random() < 0.85 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    count = word.count(letter)
    ask = rng.choice([f'How many times does the letter "{letter}" appear in "{word}"?',
                      f'Count the letter "{letter}" in "{word}".',
                      f'How many "{letter}" are there in "{word}"?'])
    return Problem("counting", ask, str(count), f'"{word}" has the letter "{letter}" {count} times.',
                   f'"{word}" has the letter "{letter}"', f"{word}:{letter}", " times")


def draw(kind: str, rng: random.Random, words: Sequence[str]) -> Problem:
    if kind == "dates":
        return _date(rng)
    if kind == "arithmetic":
        return _arithmetic(rng)
    return _spelling(rng, words) if kind == "spelling" else _counting(rng, words)


class ProblemSet:
    """Deterministic problems of every kind, the training and held-out splits kept apart."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.words = _words()

    def sample(self, n: int, split: str, stream: str, kinds: Sequence[str] = KINDS) -> list[Problem]:
        """`n` problems of `split` ("train" | "held_out"), the kinds in turn, from the named
        `stream` (each stage draws its own). Held-out problems are distinct."""
        rng = random.Random(f"{self.seed}:{split}:{stream}")
        out, seen, misses = [], set(), 0
        while len(out) < n:
            kind = kinds[len(out) % len(kinds)]
            problem = draw(kind, rng, self.words)
            wrong_split = held_out(kind, problem.key, self.seed) != (split == "held_out")
            if wrong_split or (split == "held_out" and (kind, problem.key) in seen):
                misses += 1
                if misses > MAX_MISSES:
                    have = sum(p.kind == kind for p in out)
                    raise ValueError(f"{kind}: only {have} distinct held-out questions exist for seed "
                                     f"{self.seed}, fewer than the {n // len(kinds)} asked; ask for fewer "
                                     "(speedrun chat: lower eval_per_kind)")
                continue
            misses = 0
            seen.add((kind, problem.key))
            out.append(problem)
        return out


def wrong_answers(problem: Problem, rng: random.Random) -> str:
    """A plausible wrong answer: a near number, a misspelling, a shifted date."""
    if problem.kind in ("arithmetic", "counting"):
        value = int(problem.answer)
        return str(max(0, value + rng.choice([-2, -1, 1, 2, 10])) if value else rng.randint(1, 3))
    if problem.kind == "dates":
        date = datetime.date.fromisoformat(problem.answer)
        return (date + datetime.timedelta(days=rng.choice([-1, 1, 31, 365]))).isoformat()
    letters = problem.answer.split()
    i = rng.randrange(len(letters))
    letters[i] = rng.choice([c for c in "aeioulnrst" if c != letters[i]])
    return " ".join(letters)


def is_correct(reply: str, answer: str) -> bool:
    """Exact match, ignoring surrounding spaces and a final full stop."""
    return reply.strip().rstrip(".").strip() == answer


def exact_answer(prompts, completions, answer, **columns) -> list[float]:
    """GRPO's reward: 1 for the exact answer, else 0 (TRL's reward-function form)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if is_correct(t, a) else 0.0 for t, a in zip(texts, answer)]


__all__ = ["KINDS", "Problem", "ProblemSet", "exact_answer", "held_out", "is_correct", "wrong_answers"]
