"""A time limit on a block of code that keeps the timer its caller already runs.

    with time_limit(2.0, RewardTimeout):   # RewardTimeout() is raised in the block after 2 s
        rewards = fn(...)

The limit is the process's real-time timer (SIGALRM), of which there is one. A timer already
running when the block starts (pytest-timeout's limit on the whole test, an outer time_limit) is
kept, never reset:

- due before the limit, it fires on time: its handler runs (if it returns, the limit goes on; a
  default or ignored action, having no handler to run, acts when the block ends);
- due after, it is re-armed when the block ends with the time it has left (at once if none).

Outside the main thread, or where there is no such timer (Windows), there is no limit: a caller
that needs one there has its own (check's sandbox limits its whole child process).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SOON = 1e-6  # seconds: a timer whose time is up fires this soon (0 would turn it off)


@contextmanager
def time_limit(seconds: float, error: Callable[[], BaseException]) -> Iterator[None]:
    """Raise `error()` in the block after `seconds`; the caller's own timer is kept (module doc)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    start = time.monotonic()
    outer = signal.getsignal(signal.SIGALRM)
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    outer_due, due = (start + left if left > 0 else math.inf), start + seconds
    state = {"armed_for_outer": outer_due < due, "outer_ran": False}

    def expire(signum: int, frame: Any) -> None:
        if not state["armed_for_outer"]:
            raise error()
        state["armed_for_outer"] = False
        signal.setitimer(signal.ITIMER_REAL, max(due - time.monotonic(), SOON))  # ours, from here
        if callable(outer):  # not SIG_DFL or SIG_IGN: those act when the block ends
            state["outer_ran"] = True
            outer(signum, frame)

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(min(outer_due, due) - start, SOON))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer)
        if state["outer_ran"] and interval > 0:
            signal.setitimer(signal.ITIMER_REAL, interval, interval)
        elif outer_due < math.inf and not state["outer_ran"]:
            signal.setitimer(signal.ITIMER_REAL, max(outer_due - time.monotonic(), SOON), interval)

__all__ = ["time_limit"]
