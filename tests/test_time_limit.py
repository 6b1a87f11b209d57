"""handformer's own time limits (check's BPE trainer deadline, GRPO's reward limit, both through
handformer/time_limit.py) keep the real-time timer their caller runs: pytest-timeout's limit on a
test, here an outer alarm of the test's own, still fires after an inner limit ran, and fires on
time when it is due inside the limit. check's own limits inside its child (a trainer's deadline, the
search for a departure, a probe) count CPU time, as the sandbox's step limit does: a block that sleeps
is not stopped by them, one that computes is, so a loaded machine does not change a verdict."""

from __future__ import annotations

import signal
import time

import pytest

from handformer.check.core.deadline import TrainerTimeout, deadline
from handformer.tasks.post.rewards import RewardTimeout
from handformer.tasks.post.rewards import time_limit as reward_limit
from handformer.time_limit import cpu_limit, time_limit


class Outer(Exception):
    pass


@pytest.fixture
def outer_alarm():
    """Arm an outer alarm that raises Outer (in place of pytest-timeout's, which comes back after)."""
    def ring(signum, frame):
        raise Outer

    handler = signal.signal(signal.SIGALRM, ring)
    kept = signal.getitimer(signal.ITIMER_REAL)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, *kept)
    signal.signal(signal.SIGALRM, handler)


def spin(seconds: float) -> None:
    """Busy for `seconds` (a signal interrupts Python code between bytecodes)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.parametrize("limit, error", [(deadline, TrainerTimeout), (reward_limit, RewardTimeout)])
def test_an_outer_alarm_still_fires_after_the_inner_limit_ran(outer_alarm, limit, error):
    outer_alarm(1.0)  # past the CPU deadline's wall-clock backstop (6 x 0.05 s) on a loaded machine too
    with pytest.raises(error), limit(0.05):  # the inner limit stops its block ...
        spin(5)
    with limit(0.05):  # ... or its block ends first
        pass
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < left < 1.0  # the outer alarm is armed again with the time it had left
    with pytest.raises(Outer):
        spin(5)


def test_an_outer_alarm_due_inside_the_limit_fires_on_time(outer_alarm):
    outer_alarm(0.05)
    start = time.monotonic()
    with pytest.raises(Outer), time_limit(5, TrainerTimeout):
        spin(5)
    assert time.monotonic() - start < 2
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # the limit's own timer went with it


def test_an_outer_handler_that_returns_leaves_the_limit_running():
    rang = []
    handler = signal.signal(signal.SIGALRM, lambda signum, frame: rang.append(signum))
    kept = signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        with pytest.raises(RewardTimeout), time_limit(0.2, RewardTimeout):
            spin(5)
        assert rang == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, *kept)
        signal.signal(signal.SIGALRM, handler)


class Spent(Exception):
    pass


def test_a_cpu_limit_stops_a_block_that_computes_not_one_that_sleeps():
    with pytest.raises(Spent), cpu_limit(0.1, Spent):
        spin(5)
    start = time.monotonic()
    with cpu_limit(0.1, Spent):  # 0.3 s on the clock, almost no CPU time: not cut off
        time.sleep(0.3)
    assert time.monotonic() - start >= 0.3
    assert signal.getitimer(signal.ITIMER_PROF)[0] == 0  # its timer went with it


def sleeper(seconds: float):
    """A step of the learner's that waits (as on a machine loaded by others) and spends no CPU time."""
    def wait():
        time.sleep(seconds)
        return "done"
    return wait


def test_checks_own_limits_count_cpu_time(monkeypatch):
    from handformer.check.core import behaviour, localize_kinds

    monkeypatch.setattr(localize_kinds, "LOCALIZE_LIMIT", 0.1)
    monkeypatch.setattr(behaviour, "PROBE_SECONDS", 0.1)
    with deadline(0.1):  # a trainer's
        assert sleeper(0.3)() == "done"
    assert localize_kinds._within(sleeper(0.3)) == "done"  # the search for where a layer departs
    assert behaviour._quietly(sleeper(0.3)) == "done"  # a probe of what a function is
    with pytest.raises(TrainerTimeout), deadline(0.1):
        spin(5)
    assert behaviour._quietly(lambda: spin(5)) is False
