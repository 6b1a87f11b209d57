"""Sections of a head that the learner's file ties to its head width: a list of whole numbers named
for sections (Qwen2-VL's `mrope_section = [16, 24, 24]`, the frequencies of each half of a head
cut among three position streams) whose sum is half the head width the file's own sizes give.

Check builds heads narrower than the file's; such a list, as written, cannot cut them (torch raises
`split_with_sizes expects split_sizes to sum exactly to ...`). It is fitted to check's half head width
in the same proportions (the largest remainders first; a section may be empty). With the position
streams equal, as for text, the cut changes no output: every section reads the same positions."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

SECTION = re.compile(r"(?i)section")


def is_sections(name: str, value: Any) -> bool:
    """A list of whole numbers (not bools), two or more, none below 0, under a name that says section."""
    return (isinstance(value, list) and bool(SECTION.search(name)) and {type(v) for v in value} == {int}
            and len(value) > 1 and min(value) >= 0 < sum(value))


def fitted(sections: list[int], total: int) -> list[int]:
    """The sections scaled to sum to `total`, the largest remainders rounded up."""
    exact = [s * total / sum(sections) for s in sections]
    out = [int(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: out[i] - exact[i])[:total - sum(out)]:
        out[i] += 1
    return out


_WRITTEN: dict[int, tuple[list[int], list[int]]] = {}  # id -> (a list fitted, as the file wrote it)


def _written(value: list[int]) -> list[int]:
    """A section list as the learner's file wrote it, before any fitting."""
    return _WRITTEN.setdefault(id(value), (value, list(value)))[1]


def fit_sections_(held: MutableMapping[str, Any], own_half: int | None, half: int) -> list[str]:
    """Each section list among `held` (a config's fields or a module's names, a dict's keys one level
    down) whose written sum is `own_half` (the file's own half head width; None: not known, nothing
    fitted), fitted in place to `half` (none: no heads built); the names fitted."""
    places = [held, *filter(lambda v: isinstance(v, dict), held.values())]
    tied = [(place, n) for place in places for n, v in list(place.items())
            if is_sections(n, v) and (sum(_written(v)), half > 0) == (own_half, True)]
    for place, name in tied:  # in place: a default argument bound to the same list follows
        place[name][:] = fitted(_written(place[name]), half)
    return [name for _, name in tied]
