"""A time limit on a block of code that keeps the timer its caller already runs.

    with time_limit(2.0, RewardTimeout):   # RewardTimeout() is raised in the block after 2 s
        rewards = fn(...)

The limit is the process's real-time timer (SIGALRM), of which there is one. A timer already
running when the block starts (pytest-timeout's limit on the whole test, an outer time_limit) is
kept, never reset:

- due before the limit, it fires on time: its handler runs (if it returns, the limit goes on; a
  default or ignored action, having no handler to run, acts when the block ends);
- due after, it is re-armed when the block ends with the time it has left (at once if none).

`cpu_limit` is the same on the process's CPU time (its own timer, SIGPROF): what a loaded machine
does not move, and what check's limits inside its child count.

Outside the main thread, or where there is no such timer (Windows), there is no limit: a caller
that needs one there has its own (check's sandbox limits its whole child process).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

SOON = 1e-6  # seconds: a timer whose time is up fires this soon (0 would turn it off)


@dataclass(frozen=True)
class Clock:
    """A timer of the process's and the clock it counts: the wall clock (ITIMER_REAL, SIGALRM) or the
    process's CPU time, all its threads' (ITIMER_PROF, SIGPROF)."""

    timer: int
    signal: int
    now: Callable[[], float]


WALL = Clock(getattr(signal, "ITIMER_REAL", 0), getattr(signal, "SIGALRM", 0), time.monotonic)
CPU = Clock(getattr(signal, "ITIMER_PROF", 2), getattr(signal, "SIGPROF", 0), time.process_time)


def time_limit(seconds: float, error: Callable[[], BaseException]) -> AbstractContextManager[None]:
    """Raise `error()` in the block after `seconds` on the wall clock; the caller's own timer is kept
    (module doc)."""
    return _limited(seconds, error, WALL)


BACKSTOP = 6.0  # a CPU limit's wall-clock backstop, in multiples of it (check's sandbox's WALL_FACTOR)


@contextmanager
def cpu_limit(seconds: float, error: Callable[[], BaseException]) -> Iterator[None]:
    """Raise `error()` in the block once the process has spent `seconds` of CPU time in it: a loaded
    machine, which slows the work on the wall clock, moves it not. A block that sleeps or waits spends
    none: it is stopped at BACKSTOP times `seconds` on the wall clock. The timers already running are
    kept, as time_limit keeps the wall clock's."""
    with _limited(seconds * BACKSTOP, error, WALL), _limited(seconds, error, CPU):
        yield


@contextmanager
def _limited(seconds: float, error: Callable[[], BaseException], clock: Clock) -> Iterator[None]:
    """Raise `error()` in the block after `seconds` of `clock`; the caller's own timer is kept."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    start = clock.now()
    outer = signal.getsignal(clock.signal)
    left, interval = signal.getitimer(clock.timer)
    outer_due, due = (start + left if left > 0 else math.inf), start + seconds
    state = {"armed_for_outer": outer_due < due, "outer_ran": False}

    def expire(signum: int, frame: Any) -> None:
        if not state["armed_for_outer"]:
            raise error()
        state["armed_for_outer"] = False
        signal.setitimer(clock.timer, max(due - clock.now(), SOON))  # ours, from here
        if callable(outer):  # not SIG_DFL or SIG_IGN: those act when the block ends
            state["outer_ran"] = True
            outer(signum, frame)

    signal.signal(clock.signal, expire)
    signal.setitimer(clock.timer, max(min(outer_due, due) - start, SOON))
    try:
        yield
    finally:
        signal.setitimer(clock.timer, 0)
        signal.signal(clock.signal, outer)
        if state["outer_ran"] and interval > 0:
            signal.setitimer(clock.timer, interval, interval)
        elif outer_due < math.inf and not state["outer_ran"]:
            signal.setitimer(clock.timer, max(outer_due - clock.now(), SOON), interval)


__all__ = ["cpu_limit", "time_limit"]
