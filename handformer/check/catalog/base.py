"""A diagnosis: its name, what is wrong and how to fix it (English and Chinese), and the patterns
that find its likely line in the learner's source."""

from __future__ import annotations

from dataclasses import dataclass

# the name of a finding no catalogued mistake explains: where the learner's computation first parts
# from the reference (handformer.check.core.localize), its line and the form of the difference
DEPARTS = "departs"
# the name of a FAIL's finding where neither a catalogued mistake nor a departure was found: the failed
# check, at the line that defines the component (handformer.check.core.unlocated)
UNLOCATED = "unlocated"


@dataclass(frozen=True)
class Diagnosis:
    name: str
    title: dict[str, str]  # {"en": ..., "zh": ...}: what is wrong, in one line
    fix: dict[str, str]  # how to fix it
    patterns: tuple[str, ...]  # regexes matched against the learner's source lines, first hit wins


def d(name: str, en: str, zh: str, fix_en: str, fix_zh: str, *patterns: str) -> Diagnosis:
    return Diagnosis(name, {"en": en, "zh": zh}, {"en": fix_en, "zh": fix_zh}, patterns)
