"""A limit on the CPU seconds a learner's trainer may run (a BPE or WordPiece trainer that never ends
is stopped and reported, not waited for)."""

import contextlib

from handformer.time_limit import cpu_limit


class TrainerTimeout(BaseException):  # noqa: N818  (not an Exception: their `except Exception` cannot eat it)
    """The learner's trainer ran past its limit."""


def deadline(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Raise TrainerTimeout in the learner's code after `seconds` of CPU time, keeping a timer the
    caller runs (handformer/time_limit.py). In a thread other than the main one there is no timer, and the
    sandbox's limit of the whole step is what stops a runaway trainer."""
    return cpu_limit(seconds, TrainerTimeout)
