"""The FFN activations a file shows in its code, beyond those check always tries.

check tries ReLU, exact and tanh GELU, squared ReLU and SiLU on every FFN (gated: SiLU and both
GELUs). An activation that is a convention of some families alone is tried only on a file whose code
writes it, so that its reference is the learner's activation and the report notes it: CLIP's and
OpenAI's quick_gelu, x * sigmoid(1.702 * x), as a function or module they define (its constant 1.702)
or call by name (`quick_gelu`, `QuickGELU`). A file that declares one activation and computes another
still departs: the reading it is compared on is what its code computes, one of those tried.
"""

from __future__ import annotations

import re
from pathlib import Path

# activation -> what its code looks like in a learner's file
SHOWN = {"quick_gelu": re.compile(r"1\.702|quick_?gelu", re.IGNORECASE)}
_shown: dict[str, tuple[str, ...]] = {"file": ()}  # the activations the file being checked shows


def shown_in(source: str) -> tuple[str, ...]:
    """The activations of SHOWN whose code `source` writes."""
    return tuple(name for name, form in SHOWN.items() if form.search(source))


def file_activations() -> tuple[str, ...]:
    """The activations of SHOWN the file being checked (the last one check_file began) writes."""
    return _shown["file"]


def read_activations(path: str) -> None:
    """Read what the file about to be checked shows: file_activations() until the next file."""
    _shown["file"] = shown_in(Path(path).read_text(errors="replace"))
