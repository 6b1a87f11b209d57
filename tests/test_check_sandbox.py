"""The sandbox's promises with its children forked by the fork server (zygote.py): a looping child is
killed at its limit, a child that segfaults or calls os._exit is reported, and after each the next
check works in the same server; nothing of one check's module reaches the next; a forked child
computes with 1 and 2 threads as a fresh interpreter does; the server goes when its parent does."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from handformer.check.core import sandbox, zygote
from handformer.check.core.engine import check_file
from handformer.check.core.sandbox import check_in_child

TEMPERATURE = """
import torch


def apply_temperature(logits, temperature):
    return logits / temperature
"""

ENDS = """
import os
import signal

import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()

    def forward(self, x):
        while True:
            pass


class LayerNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGSEGV)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=64):
        super().__init__()

    def forward(self, x):
        os._exit(5)
"""


def statuses(result) -> dict[str, str]:
    return {c.name: c.status for c in result.components}


@pytest.fixture(scope="module")
def server():
    """This process's fork server (each pytest-xdist worker has its own, started at its first check)."""
    srv = zygote.server()
    assert srv is not None and not srv.gone, "no fork server on Linux"
    return srv


@pytest.fixture(scope="module")
def ended(server, tmp_path_factory):
    """A loop, a segfault and os._exit, one component each, then a correct file: four children."""
    folder = tmp_path_factory.mktemp("ends")
    (folder / "ends.py").write_text(ENDS)
    (folder / "temperature.py").write_text(TEMPERATURE)
    ends = check_in_child(str(folder / "ends.py"), time_limit=1)
    return {c.name: c for c in ends.components}, check_in_child(str(folder / "temperature.py"))


def test_a_looping_child_is_killed_at_its_limit(ended):
    comps, _ = ended
    err = comps["RMSNorm"].error
    assert err.kind == "timeout" and "stopped after 1 s of CPU time in RMSNorm" in err.message
    assert err.traceback[-1] in ("line 13, in forward: while True:", "line 14, in forward: pass")


def test_a_segfault_and_os_exit_are_reported_and_the_next_child_checks_the_rest(ended):
    comps, _ = ended
    segfault, exits = comps["LayerNorm"].error, comps["PositionalEncoding"].error
    assert segfault.kind == "crash" and "(signal 11) in LayerNorm" in segfault.message
    assert exits.kind == "crash" and "(exit 5) in PositionalEncoding" in exits.message


def test_the_server_outlives_its_children_and_checks_the_next_file(server, ended):
    _, after = ended
    assert statuses(after) == {"apply_temperature": "pass"}
    assert zygote.server() is server and not server.gone and server.popen.poll() is None


SLEEPS = """
import time

import torch.nn as nn

SLEPT = []


class RMSNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()

    def forward(self, x):
        while True:
            time.sleep(0.01)


def apply_temperature(logits, temperature):
    if not SLEPT:  # its first call waits a second, twice its limit of CPU time
        SLEPT.append(time.sleep(1.0))
    return logits / temperature
"""


@pytest.fixture(scope="module")
def slept(server, tmp_path_factory):
    """A loop that sleeps, and a correct function that waits once: 0.5 s of CPU time a step, so the
    wall-clock backstop is at 3 s."""
    folder = tmp_path_factory.mktemp("sleeps")
    (folder / "sleeps.py").write_text(SLEEPS)
    return {c.name: c for c in check_in_child(str(folder / "sleeps.py"), time_limit=0.5).components}


def test_a_step_is_limited_by_its_cpu_time_not_the_clock(slept):
    """Waiting (a sleep, a machine loaded many times over) spends no CPU time: a step that waits past
    its limit, and not past the backstop, is not stopped."""
    assert slept["apply_temperature"].status == "pass", slept["apply_temperature"].error


def test_a_child_that_sleeps_in_a_loop_is_stopped_by_the_wall_clock_backstop(slept):
    err = slept["RMSNorm"].error
    assert err.kind == "timeout" and "stopped after 3 s in RMSNorm: it sleeps or waits" in err.message
    assert err.traceback[-1] == "line 15, in forward: time.sleep(0.01)"


def test_the_backstop_does_not_count_a_wait_for_the_cpu():
    """Two spinners on one core, for a second: each waits for the CPU about half the time, and the
    clock of the backstop (the wall clock less that wait) moves about as far as its CPU time, not as
    far as the wall clock."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for proc in spinners:
            os.sched_setaffinity(proc.pid, {min(os.sched_getaffinity(0))})
        time.sleep(0.3)  # both started and spinning
        before, start = sandbox._clocks(spinners[0].pid, (0.0, 0.0)), time.monotonic()
        time.sleep(1.0)
        after, wall = sandbox._clocks(spinners[0].pid, (0.0, 0.0)), time.monotonic() - start
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    cpu, awake = after[0] - before[0], after[1] - before[1]
    assert awake < 0.8 * wall and abs(awake - cpu) < 0.25 * wall, (cpu, awake, wall)


LEAKS = """
import builtins
import os
import sys

import torch
from helper import SCALE  # a neighbour named like the other file's

assert not hasattr(builtins, "LEAKED") and "LEAKED" not in os.environ, "a check's module leaked"
assert torch.get_default_dtype() == torch.float32
assert sys.argv == [__file__], sys.argv
builtins.LEAKED = True
os.environ["LEAKED"] = "1"
os.chdir(os.path.dirname(__file__))
torch.set_default_dtype(torch.float16)


def apply_temperature(logits, temperature):
    return logits / temperature * SCALE
"""


def test_nothing_of_one_check_reaches_the_next(server, tmp_path):
    """Two files, each with a neighbour `helper` of its own, that leave marks in builtins, the
    environment, the working folder and torch's default dtype: each is checked as if it were alone."""
    results = []
    for scale in (1, 2):
        folder = tmp_path / f"learner{scale}"
        folder.mkdir()
        (folder / "helper.py").write_text(f"SCALE = {scale}\n")
        (folder / "model.py").write_text(LEAKS)
        results.append(statuses(check_in_child(str(folder / "model.py"))))
    assert results == [{"apply_temperature": "pass"}, {"apply_temperature": "fail"}]
    assert "LEAKED" not in os.environ and os.getcwd() != str(tmp_path / "learner2")


THREADED = """
import torch

# a top level that computes in parallel: a forked child's thread pool must work
WORK = (torch.randn(600, 600) @ torch.randn(600, 600)).softmax(-1).sum()
open(__file__ + ".threads", "w").write(str(torch.get_num_threads()))


def apply_temperature(logits, temperature):
    return logits / temperature
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_a_forked_child_computes_with_the_threads_a_fresh_one_has(server, tmp_path, monkeypatch, threads):
    """OMP_NUM_THREADS of the parent is the child's thread count, and a parallel operation there
    neither hangs (torch's OpenMP pool after fork) nor changes the verdict."""
    path = tmp_path / "threaded.py"
    path.write_text(THREADED)
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    result = check_in_child(str(path), time_limit=10)
    assert (tmp_path / "threaded.py.threads").read_text() == str(threads)
    assert statuses(result) == statuses(check_file(str(path))) == {"apply_temperature": "pass"}


def test_the_server_ends_with_its_parent_and_takes_its_child_along(tmp_path):
    """A parent killed (SIGKILL) while its child loops: the server and the child are gone soon after."""
    path = tmp_path / "loops.py"
    path.write_text("def apply_temperature(logits, temperature):\n    while True:\n        pass\n")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(path)], stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in parent.stdout.readline().split()]  # the server's, then the child's
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)


# the parent: its own fork server (a copy of itself), a check that loops, the two pids printed
PARENT = """
import sys, threading, time
from handformer.check.core import sandbox, zygote

zygote.fork_here()
server, forked = zygote.server(), []
fork = server.fork
server.fork = lambda request: forked.append(fork(request)) or forked[-1]
threading.Thread(target=sandbox.check_in_child, args=(sys.argv[1],), daemon=True).start()
while not forked:
    time.sleep(0.05)
print(server.pid, forked[0].pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except OSError:
        return False


def test_a_server_that_refuses_is_not_asked_again():
    """A server that found fork unsafe (a thread pool started in it) answers "unsafe": the sandbox
    gets no child from it, then or later, and starts fresh interpreters instead."""
    (request_r, request_w), (answer_r, answer_w) = os.pipe(), os.pipe()
    os.write(answer_w, b'{"unsafe": true}\n')
    refusing = zygote.Server(os.fdopen(request_w, "wb", buffering=0), os.fdopen(answer_r, "rb", buffering=0),
                             os.getpid(), None)
    assert refusing.fork({"path": "model.py"}) is None and refusing.gone
    assert refusing.fork({"path": "model.py"}) is None and os.read(request_r, 100).count(b"\n") == 1
    for fd in (request_r, answer_w):
        os.close(fd)
