"""The embedded default translation task: dates written out in words -> ISO dates.

    "the twenty-third of march, nineteen ninety-seven"  ->  "1997-03-23"
    "march 23, 1997"                                    ->  "1997-03-23"

It behaves like translation: sources vary in length and wording, and the target reorders the
source (year first, day last), so cross-attention has something to show. Generated
deterministically from a seed; held-out dates never appear in training.
"""

from __future__ import annotations

import datetime
import random

MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december"]
ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ORDINAL_ONES = ["", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
                "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth",
                "sixteenth", "seventeenth", "eighteenth", "nineteenth"]
ORDINAL_TENS = {20: "twentieth", 30: "thirtieth"}


def number_words(n: int) -> str:
    """0 < n < 100 in words: 42 -> 'forty-two'."""
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[ones]}" if ones else "")


def ordinal_words(n: int) -> str:
    """1..31 -> 'first' .. 'thirty-first'."""
    if n < 20:
        return ORDINAL_ONES[n]
    tens, ones = divmod(n, 10)
    return ORDINAL_TENS[n] if not ones else f"{TENS[tens]}-{ORDINAL_ONES[ones]}"


def year_words(year: int) -> str:
    """1997 -> 'nineteen ninety-seven', 1905 -> 'nineteen oh five', 2004 -> 'two thousand four'."""
    century, rest = divmod(year, 100)
    if 2000 <= year < 2010:
        return "two thousand" + (f" {ONES[rest]}" if rest else "")
    if rest == 0:
        return f"{number_words(century)} hundred"
    if rest < 10:
        return f"{number_words(century)} oh {ONES[rest]}"
    return f"{number_words(century)} {number_words(rest)}"


def render(date: datetime.date, style: int) -> str:
    month, day, year = MONTHS[date.month - 1], date.day, date.year
    styles = [
        f"the {ordinal_words(day)} of {month}, {year_words(year)}",
        f"{month} {ordinal_words(day)}, {year_words(year)}",
        f"{ordinal_words(day)} {month} {year_words(year)}",
        f"{month} {day}, {year}",
        f"{day} {month} {year}",
        f"the {ordinal_words(day)} of {month} {year}",
    ]
    return styles[style % len(styles)]


N_STYLES = 6
FIRST = datetime.date(1900, 1, 1)
N_DAYS = (datetime.date(2099, 12, 31) - FIRST).days + 1


def date_pairs(n_train: int = 20000, n_heldout: int = 500, seed: int = 0,
               ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out) lists of (source, target) pairs; no held-out date is in train."""
    rng = random.Random(seed)
    heldout_days = set(rng.sample(range(N_DAYS), n_heldout))
    heldout = []
    for d in sorted(heldout_days):
        date = FIRST + datetime.timedelta(days=d)
        heldout.append((render(date, rng.randrange(N_STYLES)), date.isoformat()))
    rng.shuffle(heldout)
    train = []
    while len(train) < n_train:
        d = rng.randrange(N_DAYS)
        if d in heldout_days:
            continue
        date = FIRST + datetime.timedelta(days=d)
        train.append((render(date, rng.randrange(N_STYLES)), date.isoformat()))
    return train, heldout
