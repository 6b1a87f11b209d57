"""Problems that take several steps, with a checkable answer, where a worked scratchpad helps:
the reasoning tasks for `handformer speedrun chat`, generated here, deterministic from a seed.

    addition   What is 4817 + 2956?                                        7773
    countdown  Make 24 from 3, 6, 7 and 8 with +, - and *, each once.      (8 - 7 + 3) * 6
    days       What date is 45 days after 2023-03-17?                      2023-05-01

and `long_addition`, sums one digit longer than the mix's (`addition_digits` + 1 digits in at least
one number): the task GRPO targets, of which SFT sees a few worked examples (docs/benchmarks.md).

Each problem carries its worked solution (`thinking`), the steps a person writes down: addition
column by column with the carries, Countdown as the operations one at a time, a date by stepping
over the month ends. A reply with thinking is `<think>\\nSTEPS\\n</think>\\nANSWER`; without, just
`ANSWER`. `parse_reply` reads either and `is_right` checks the answer: addition and dates
exactly, Countdown by evaluating the expression (any expression that uses each given number once
and makes the target is right).

Splits: every problem has a key (the numbers, the date and the count). A hash of the key, fixed by
the seed, keeps 2 in 10 keys out of training (`train` is the other 8) and parts them in two: the
`search` split (the held-out questions a recipe search may look at) and the `report` split (the
held-out questions of the reported figures). The report split is drawn with another seed (the
seed + 1, REPORT_SEED_OFFSET), once, at the end: its questions come from a generator the search
never ran. No key is in two splits, so no stage's data holds a held-out question, and a search
cannot fit the reported figures.
"""

from __future__ import annotations

import ast
import calendar
import datetime
import hashlib
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

REASONING_KINDS = ("addition", "countdown", "days")
LONG_KIND = "long_addition"  # sums one digit longer than the mix's
SUM_KINDS = ("addition", LONG_KIND)
SPLITS = ("train", "search", "report")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FIRST_DAY, LAST_DAY = datetime.date(2000, 1, 1), datetime.date(2039, 12, 31)
MAX_MISSES = 100_000  # draws in a row without a new problem: the split is used up
REPORT_SEED_OFFSET = 1  # the report split is drawn with seed + 1, a seed no other split's draw uses


@dataclass(frozen=True)
class Difficulty:
    """How hard the problems are: the preset's task difficulty mix."""

    addition_digits: int = 4  # each number of a sum has 2 to this many digits
    countdown_numbers: int = 4  # a Countdown problem gives 3 to this many numbers
    max_days: int = 120  # the largest count of days a date question adds

    def __post_init__(self) -> None:
        for name, low in (("addition_digits", 2), ("countdown_numbers", 3), ("max_days", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is invalid: it must be an integer >= {low}")


@dataclass(frozen=True)
class Task:
    kind: str
    question: str  # the user's message
    answer: str  # a right answer (Countdown: one of them)
    thinking: str  # the worked steps, one a line
    # what the split is decided on, and all `is_right` needs: "4817+2956", "3,6,7,8=24", "2023-03-17+45"
    key: str

    def reply(self, think: bool) -> str:
        """The assistant's reply, with the worked steps inside <think>...</think> or without."""
        return f"{THINK_OPEN}\n{self.thinking}\n{THINK_CLOSE}\n{self.answer}" if think else self.answer


def split_of(kind: str, key: str, seed: int) -> str:
    """train, search or report: a hash of the key, fixed by the seed."""
    bucket = hashlib.sha256(f"{seed}:{kind}:{key}".encode()).digest()[0] % 10
    return "search" if bucket == 0 else "report" if bucket == 1 else "train"


DEFAULT = Difficulty()


# --- the three kinds -----------------------------------------------------------------------------

def addition_steps(a: int, b: int) -> list[str]:
    """Column by column from the right: each column's digits and carry, the digit written, the carry."""
    steps, carry, column = [], 0, 0
    while a // 10 ** column or b // 10 ** column or carry:
        x, y = a // 10 ** column % 10, b // 10 ** column % 10
        if not (a // 10 ** column or b // 10 ** column):  # only the carry is left
            steps.append(f"carry {carry} is the first digit")
            break
        total = x + y + carry
        terms = f"{x}+{y}" + (f"+{carry}" if carry else "")
        carry = total // 10
        steps.append(f"{terms}={total}, write {total % 10}" + (", carry 1" if carry else ""))
        column += 1
    return steps


def _addition(rng: random.Random, level: Difficulty = DEFAULT) -> Task:
    top = 10 ** level.addition_digits - 1
    a, b = rng.randint(10, top), rng.randint(10, top)
    question = rng.choice([f"What is {a} + {b}?", f"Compute {a} + {b}.", f"Add {a} and {b}."])
    steps = [*addition_steps(a, b), f"so {a} + {b} = {a + b}"]
    return Task("addition", question, str(a + b), "\n".join(steps), f"{a}+{b}")


def _long_addition(rng: random.Random, level: Difficulty = DEFAULT) -> Task:
    """A sum one digit longer than the mix's: both numbers of 2 to addition_digits + 1 digits, at
    least one of them that long."""
    top, low = 10 ** (level.addition_digits + 1) - 1, 10 ** level.addition_digits
    while max(a := rng.randint(10, top), b := rng.randint(10, top)) < low:
        pass
    question = rng.choice([f"What is {a} + {b}?", f"Compute {a} + {b}.", f"Add {a} and {b}."])
    steps = [*addition_steps(a, b), f"so {a} + {b} = {a + b}"]
    return Task(LONG_KIND, question, str(a + b), "\n".join(steps), f"{a}+{b}")


def _chain(numbers: Sequence[int], rng: random.Random) -> tuple[int, str, list[str]]:
    """The numbers combined left to right with drawn operations (no step below 0): the value, the
    expression and the steps."""
    value, expr, last, steps = numbers[0], str(numbers[0]), "", []
    for n in numbers[1:]:
        op = rng.choice("+-*")
        if op == "-" and n > value:
            op = "+"
        new = value + n if op == "+" else value - n if op == "-" else value * n
        steps.append(f"{value} {op} {n} = {new}")
        expr = f"({expr}) * {n}" if op == "*" and last in "+-" and last else f"{expr} {op} {n}"
        value, last = new, op
    return value, expr, steps


def _countdown(rng: random.Random, level: Difficulty = DEFAULT) -> Task:
    """3 to `countdown_numbers` numbers from 1 to 12 combined left to right; the target is what
    that makes, 1 to 200."""
    while True:
        numbers = [rng.randint(1, 12) for _ in range(rng.randint(3, level.countdown_numbers))]
        value, expr, steps = _chain(numbers, rng)
        if 1 <= value <= 200:
            break
    given = sorted(numbers)
    listed = ", ".join(map(str, given[:-1])) + f" and {given[-1]}"
    question = rng.choice([f"Make {value} from {listed} with +, - and *, each once.",
                           f"Using {listed} once each and +, - or *, reach {value}."])
    steps.append(f"so {expr} = {value}")
    return Task("countdown", question, expr, "\n".join(steps), f"{','.join(map(str, given))}={value}")


def with_tries(task: Task, max_tries: int, max_chars: int = 100) -> Task:
    """A Countdown task whose worked steps first try 0 to `max_tries` other orders and operations
    that miss, each checked against the target ("9 + 8 = 17, not 13"), before the one that makes it: a
    scratchpad that checks and tries again, so a sampled reply can search. The tries are drawn
    from the key (the same each call) and stop before the steps pass `max_chars` characters.
    Other kinds are returned as they are."""
    if task.kind != "countdown" or max_tries <= 0:
        return task
    numbers, target = task.key.split("=")
    given, rng = [int(n) for n in numbers.split(",")], random.Random(f"tries:{task.key}")
    tries: list[str] = []
    for _ in range(rng.randint(0, max_tries)):
        value, _expr, steps = _chain(rng.sample(given, len(given)), rng)
        attempt = [*steps[:-1], f"{steps[-1]}, not {target}"]
        if value == int(target) or len("\n".join(tries + attempt + [task.thinking])) > max_chars:
            break
        tries += attempt
    return Task(task.kind, task.question, task.answer, "\n".join(tries + [task.thinking]), task.key)


def day_steps(start: datetime.date, days: int) -> list[str]:
    """The day of the month plus the days, then one month end at a time until the day fits."""
    day, year, month = start.day + days, start.year, start.month
    steps = [f"{start.day} + {days} = {day}"]
    while day > (length := calendar.monthrange(year, month)[1]):
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        steps.append(f"{calendar.month_name[month - 1 or 12]} has {length} days: {day} - {length} = "
                     f"{day - length}, into {calendar.month_name[month]} {year}")
        day -= length
    return steps


def _days(rng: random.Random, level: Difficulty = DEFAULT) -> Task:
    span = (LAST_DAY - FIRST_DAY).days - level.max_days
    start = FIRST_DAY + datetime.timedelta(days=rng.randrange(span))
    days = rng.randint(1, level.max_days)
    end = start + datetime.timedelta(days=days)
    question = rng.choice([f"What date is {days} days after {start.isoformat()}?",
                           f"Add {days} days to {start.isoformat()}."])
    steps = [*day_steps(start, days), f"so {end.isoformat()}"]
    return Task("days", question, end.isoformat(), "\n".join(steps), f"{start.isoformat()}+{days}")


DRAW = {"addition": _addition, "countdown": _countdown, "days": _days, LONG_KIND: _long_addition}


class ReasoningSet:
    """Deterministic problems of each kind, the three splits kept apart."""

    def __init__(self, seed: int = 0, level: Difficulty = DEFAULT) -> None:
        self.seed, self.level = seed, level

    def draw_seed(self, split: str) -> int:
        """The seed of a split's generator: the set's own, the report split's another."""
        return self.seed + REPORT_SEED_OFFSET if split == "report" else self.seed

    def sample(self, n: int, split: str, stream: str, kinds: Sequence[str] = REASONING_KINDS) -> list[Task]:
        """`n` distinct problems of `split`, the kinds in turn, from the named `stream` (each stage
        and each evaluation draws its own), generated with the split's `draw_seed`."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is invalid: choose {', '.join(SPLITS)}")
        rng = random.Random(f"{self.draw_seed(split)}:{split}:{stream}")
        out: list[Task] = []
        seen: set[tuple[str, str]] = set()
        misses = 0
        while len(out) < n:
            kind = kinds[len(out) % len(kinds)]
            task = DRAW[kind](rng, self.level)
            if split_of(kind, task.key, self.seed) != split or (kind, task.key) in seen:
                misses += 1
                if misses > MAX_MISSES:
                    raise ValueError(f"{kind}: fewer than {n // len(kinds)} distinct {split} problems "
                                     f"exist for seed {self.seed}; ask for fewer")
                continue
            misses = 0
            seen.add((kind, task.key))
            out.append(task)
        return out


# --- reading and checking a reply ---------------------------------------------------------------

@dataclass(frozen=True)
class Reading:
    """What a reply says: its answer (None when it gives none in the kind's form) and whether the
    thinking, if any, is closed."""

    answer: str | None
    well_formed: bool
    thought: bool  # it opened <think>


def parse_reply(reply: str, kind: str) -> Reading:
    """The answer after the thinking: the last non-empty line, without a final full stop; an answer
    only when it has the kind's form (a whole number, an expression, an ISO date)."""
    text = reply.strip()
    thought = text.startswith(THINK_OPEN)
    if thought:
        head, closed, text = text.partition(THINK_CLOSE)
        if not closed or THINK_OPEN in text:
            return Reading(None, False, True)
    elif THINK_CLOSE in text or THINK_OPEN in text:
        return Reading(None, False, False)
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    answer = lines[-1].rstrip(".").strip() if lines else ""
    return Reading(answer if _has_form(answer, kind) else None, True, thought)


def _has_form(answer: str, kind: str) -> bool:
    if kind in SUM_KINDS:
        return re.fullmatch(r"-?\d+", answer) is not None
    if kind == "days":
        try:
            datetime.date.fromisoformat(answer)
        except ValueError:
            return False
        return re.fullmatch(r"\d{4}-\d{2}-\d{2}", answer) is not None
    return _expression(answer) is not None


def _expression(text: str) -> tuple[int, list[int]] | None:
    """(value, the numbers it uses) of an expression of whole numbers, +, -, * and brackets."""
    if not re.fullmatch(r"[\d\s()+*-]+", text) or len(text) > 100:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    numbers: list[int] = []

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left - right if \
                isinstance(node.op, ast.Sub) else left * right
        raise ValueError("not an expression of +, - and *")

    try:
        return value(tree), numbers
    except ValueError:
        return None


def is_right(kind: str, key: str, answer: str | None) -> bool:
    """Whether `answer` (parse_reply's) answers the problem whose key is `key`."""
    if answer is None:
        return False
    if kind in SUM_KINDS:
        a, b = map(int, key.split("+"))
        return answer == str(a + b)
    if kind == "days":
        start, days = key.split("+")
        return answer == (datetime.date.fromisoformat(start) + datetime.timedelta(days=int(days))).isoformat()
    numbers, target = key.split("=")
    parsed = _expression(answer)
    return parsed is not None and parsed[0] == int(target) and \
        Counter(parsed[1]) == Counter(map(int, numbers.split(",")))


def reasoning_reward(prompts, completions, kind, key, max_chars=None, **columns) -> list[float]:
    """GRPO's reward (TRL's reward-function form): 1 for a right answer in a well-formed reply,
    0.1 for a well-formed reply with an answer in the kind's form that is wrong, 0 otherwise; a
    reply longer than `max_chars` (a column, optional) gets 0."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    limits = max_chars or [None] * len(texts)
    rewards = []
    for text, k, key_, limit in zip(texts, kind, key, limits):
        reading = parse_reply(text, k)
        if (limit is not None and len(text) > limit) or not reading.well_formed or reading.answer is None:
            rewards.append(0.0)
        else:
            rewards.append(1.0 if is_right(k, key_, reading.answer) else 0.1)
    return rewards


__all__ = ["LONG_KIND", "REASONING_KINDS", "REPORT_SEED_OFFSET", "SPLITS", "Difficulty", "ReasoningSet",
           "Reading", "Task", "is_right", "parse_reply", "reasoning_reward", "split_of", "with_tries"]
