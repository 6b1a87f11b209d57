"""Sections of a head that the learner's file ties to its head width: a list of whole numbers named
for sections (Qwen2-VL's `mrope_section = [16, 24, 24]`, the frequencies of each half of a head
cut among three position streams) whose sum is half the head width the file's own sizes give.

Check builds heads narrower than the file's; such a list, as written, cannot cut them (torch raises
`split_with_sizes expects split_sizes to sum exactly to ...`). It is fitted to check's half head width
in the same proportions (the largest remainders first; a section may be empty). With the position
streams equal, as for text, the cut changes no output: every section reads the same positions."""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

SECTION = re.compile(r"(?i)section")


def is_sections(name: str, value: Any) -> bool:
    """A list of whole numbers (not bools), two or more, under a name that says section."""
    return (bool(SECTION.search(name)) and isinstance(value, list) and len(value) > 1
            and all(type(v) is int and v >= 0 for v in value) and sum(value) > 0)


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
    fitted), fitted in place to `half`; the names fitted."""
    found = [(held, n) for n, v in held.items() if is_sections(n, v)]
    found += [(v, k) for v in held.values() if isinstance(v, dict) for k, w in v.items() if is_sections(k, w)]
    tied = [(place, n) for place, n in found if half > 0 and sum(_written(place[n])) == own_half]
    for place, name in tied:  # in place: a default argument bound to the same list follows
        place[name][:] = fitted(_written(place[name]), half)
    return [name for _, name in tied]


def own_half_head(values: Mapping[str, Any]) -> int | None:
    """Half the head width that the file's values (a config's defaults, a module's constants) give by
    their names: a head width, or a width over heads; None where they do not say."""
    from handformer.check.core.discovery import size_of

    sizes = {size_of(n): v for n, v in values.items() if type(v) is int and v > 0}
    heads = sizes.get("n_heads")
    head = sizes.get("d_head") or (sizes.get("d_model", 0) // heads if heads else 0)
    return head // 2 or None
