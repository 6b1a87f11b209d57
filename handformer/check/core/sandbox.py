"""The learner's code runs in a child process with a time limit and a memory limit.

The parent has the fork server of zygote.py fork the child (torch and the grader already imported;
where there is none, it starts `python -m handformer.check.core.sandbox_child REQUEST`); the child caps
its address space (RLIMIT_AS), imports torch and handformer where it has not, then imports the
learner's file and checks one component after another. The parent counts each step's CPU time (the
child's threads' and its reaped children's, from /proc), so a loaded machine, which slows a step's
wall clock, does not stop it: past the limit, or past WALL_FACTOR times it on the wall clock less the
time the child waited for a CPU (a child that sleeps or waits), the parent has the child dump its
stack (faulthandler, on DUMP_SIGNAL), so an
infinite loop ends with the stack of where it was looping, then kills its process group. Results
stream back one JSON line per component, so when a component hangs, crashes or runs out of memory
the ones before it are kept and a new child checks the ones after it. A huge allocation fails
inside the limit (MemoryError, or torch's "can't allocate memory") and is reported as such.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from handformer.check.core import zygote
from handformer.check.core.defaults import quietly
from handformer.check.core.result import ERROR, NOT_CHECKED, ComponentResult, FileResult, LearnerError
from handformer.check.core.sandbox_child import DUMP_SIGNAL

TIME_LIMIT = 20.0  # seconds of CPU time for each step (the import of the learner's file, each component)
WALL_FACTOR = 6.0  # a step's wall-clock backstop (less its wait for a CPU), in multiples of its limit
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's clock ticks a second
PROC = Path("/proc/self/stat").is_file()  # where there is none (not Linux), CPU time is the wall clock's
STOPPED = ("timeout", "waited")  # why the parent stopped a step: its CPU time, or its wall clock
MEMORY_LIMIT = 4096  # MiB of address space for the child (torch itself needs ~1 GiB of it)
STARTUP_LIMIT = 120.0  # seconds for the child to import torch and handformer on a busy machine
DUMP_GRACE = 3.0  # seconds for a child told to dump its stack to do so on a busy machine


def check_in_child(path: str, overrides: dict[str, str] | None = None, only: list[str] | None = None,
                   convention: str | None = None, time_limit: float = TIME_LIMIT,
                   memory_limit: int = MEMORY_LIMIT, adapters: str | None = None) -> FileResult:
    """Check the learner's file in child processes; never hangs, never raises for their code. A file
    whose top level outlives the time limit (a training loop at module level) has its definitions
    checked without it."""
    path = str(Path(path).resolve())
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if adapters is not None and not Path(adapters).is_file():
        raise FileNotFoundError(f"--adapters {adapters}: no such file")
    result, skip, definitions_only = FileResult(path), [], False
    while True:
        lines, phase, stack, reason = _run_child(
            {"path": path, "overrides": overrides, "only": only, "convention": convention,
             "memory_limit": memory_limit, "skip": skip,
             "adapters": str(Path(adapters).resolve()) if adapters else None,
             "definitions_only": definitions_only}, time_limit)
        for line in lines:
            if "component" in line:
                result.components.append(ComponentResult.from_dict(line["component"]))
                skip.append(line["component"]["name"])
            elif "file_error" in line:
                result.error = LearnerError(**line["file_error"])
            elif "skipped" in line:
                result.skipped = line["skipped"]
        if _done(lines):
            return result
        step, kind = phase if phase else (None, "")
        if step in skip:  # it ended as it was stopped: a new child checks the rest
            continue
        error = _stopped(reason, step, stack, path, time_limit, memory_limit, kind)
        if step == "import" and reason in STOPPED and not definitions_only:
            definitions_only = True  # their top level runs too long: the definitions without it
            continue
        if step in (None, "ready", "import"):
            result.error = error
            return result
        result.components.append(_stopped_component(kind, step, error, reason, stack, path, time_limit))
        skip.append(step)


def _run_child(request: dict[str, Any], time_limit: float,
               ) -> tuple[list[dict[str, Any]], tuple[str, str] | None, str, str]:
    """Run one child; returns (result lines, the step it was in when it stopped and the kind that
    component was checked as, the stack it dumped, why it stopped: done | timeout (its CPU time) |
    waited (its wall clock) | exit N | signal N)."""
    with tempfile.TemporaryDirectory(prefix="handformer-check-") as tmp:
        files = {k: Path(tmp) / k for k in ("results", "progress", "stack", "stderr")}
        request = {**request, **{k: str(v) for k, v in files.items()}}
        proc = _started(request)
        try:
            reason, seen = _watched(proc, files, time_limit)
        finally:
            if proc.poll() is None:  # the parent was interrupted (Ctrl-C): so is the child
                _kill(proc)
        stderr = _read(files["stderr"])
        phase = seen if reason in STOPPED else _progress(files["progress"])  # the step it timed
        stack = _read(files["stack"])
        lines = [json.loads(line) for line in _read(files["results"]).splitlines() if line.strip()]
        if reason not in STOPPED:
            code = proc.returncode
            finished = code == 0 and _done(lines)
            reason = "done" if finished else f"signal {-code}" if code < 0 else f"exit {code}"
        if reason not in ("done", *STOPPED) and not stack:
            stack = stderr[-2000:]
        return lines, phase, stack, reason


def _started(request: dict[str, Any]) -> Any:
    """The child, forked by this process's fork server (zygote.py: torch is imported there once) in
    this process's folder and environment; a fresh interpreter where there is no server free (not
    Linux, a server that could not start or found fork unsafe, another thread's check running)."""
    server = zygote.server()
    forked = server and server.fork({**request, "cwd": os.getcwd(), "env": dict(os.environ)})
    if forked:
        return forked
    with open(request["stderr"], "wb") as err:  # a file, not a pipe: a chatty learner cannot block
        command = [sys.executable, "-m", "handformer.check.core.sandbox_child", json.dumps(request)]
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)


def _watched(proc: Any, files: dict[str, Path], time_limit: float) -> tuple[str, tuple[str, str] | None]:
    """Wait for the child; stop it when a step outlives its limit: "timeout" (its CPU time past the
    limit), "waited" (its wall clock, less the time it waited for a CPU, past WALL_FACTOR times the
    limit, or the startup's past STARTUP_LIMIT: it sleeps or waits), or "done" (the child ended by
    itself); and the step it was timing (the child may have gone on while it dumped its stack)."""
    phase, since = None, (0.0, time.monotonic())
    now = since
    while proc.poll() is None:
        time.sleep(0.05)
        current, now = _progress(files["progress"]), _clocks(proc.pid, now)
        if current != phase:
            phase, since = current, now
        reason = _past(phase is not None, now[0] - since[0], now[1] - since[1], time_limit)
        if reason:
            _dumped_and_killed(proc, files["stack"])
            return reason, phase
    return "done", phase


def _past(stepping: bool, cpu: float, awake: float, time_limit: float) -> str | None:
    """Why a step that has taken `cpu` seconds of CPU time, and `awake` seconds on the clock less its
    wait for a CPU, is to be stopped, or None. Before the first step (the child imports torch) only
    the clock counts."""
    backstop = time_limit * WALL_FACTOR if stepping else STARTUP_LIMIT
    return "timeout" if stepping and cpu > time_limit else "waited" if awake > backstop else None


def _clocks(pid: int, last: tuple[float, float]) -> tuple[float, float]:
    """The child's CPU seconds (its threads' and its reaped children's: utime, stime, cutime, cstime of
    /proc/PID/stat), and the wall clock less the time its main thread waited for a CPU (the second
    figure of /proc/PID/schedstat, in ns; 0 where the kernel keeps none): a loaded machine moves
    neither. `last` where the child cannot be read (it has just ended); the wall clock for both where
    there is no /proc."""
    if not PROC:
        return time.monotonic(), time.monotonic()
    fields = _read(Path(f"/proc/{pid}/stat")).rpartition(")")[2].split()
    queued = int([*_read(Path(f"/proc/{pid}/schedstat")).split(), "0", "0"][1]) / 1e9
    return (sum(map(int, fields[11:15])) / TICKS, time.monotonic() - queued) if len(fields) > 14 else last


def _dumped_and_killed(proc: Any, stack: Path) -> None:
    """Have the child dump its stack, wait for it (DUMP_GRACE seconds at most: a child stuck where no
    signal reaches it dumps none), then kill it."""
    quietly(lambda: os.kill(proc.pid, DUMP_SIGNAL), OSError, None)
    until = time.monotonic() + DUMP_GRACE
    while not _read(stack).strip() and proc.poll() is None and time.monotonic() < until:
        time.sleep(0.02)
    time.sleep(0.05)  # the rest of the dump (faulthandler writes it in pieces)
    if proc.poll() is None:
        _kill(proc)


def _kill(proc: Any) -> None:
    """Kill the child's whole process group (what the learner's code started too) and reap it."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _done(lines: list[dict[str, Any]]) -> bool:
    """Whether the child's result lines end its check (a "done" line: every component was run)."""
    return any("done" in line for line in lines)


def _read(path: Path) -> str:
    return quietly(lambda: path.read_text(), OSError, "")


def _progress(path: Path) -> tuple[str, str] | None:
    """(step, kind) the child last started: its first line is the step ("ready", "import" or a
    component's name), its second the kind that component is checked as."""
    step, kind, *_ = [*_read(path).splitlines(), "", ""]
    return (step, kind) if step else None


# what a component that ran past the time limit most likely does, by its kind (en, zh)
TIMEOUT_WHY = {
    "generate": ("a generation loop that does not end (is it bounded by max_new_tokens?), or one far too "
                 "slow for a model of a few thousand weights",
                 "生成循环停不下来（它受 max_new_tokens 限制吗？），或者对只有几千个权重的模型来说慢得离谱"),
    "bpe": ("a BPE trainer that never ends (a merge that never makes the words shorter?)",
            "BPE 训练停不下来（某次合并没有让词变短？）"),
    "": ("an infinite loop, or far too slow for tensors of a few dozen numbers",
         "死循环，或者对只有几十个数的张量来说慢得离谱")}
# a step stopped on the wall clock, with its CPU time not spent: it sleeps or waits
WAITED_WHY = ("it sleeps or waits (for input, a lock, the network?) without computing; the limit of its "
              "CPU time was not reached", "它在睡眠或等待（输入、锁、网络？），没有在计算；"
              "CPU 时间的限制并没有用完")


def _stopped(reason: str, phase: str | None, stack: str, path: str, time_limit: float,
             memory_limit: int, kind: str = "") -> LearnerError:
    where = phase or "startup"
    frames = _learner_frames(stack, path)
    if reason in STOPPED:
        return _timed_out(reason, where, frames, time_limit, kind)
    if reason == "signal 9":
        return LearnerError("memory", f"killed in {where}, most likely for using more than the "
                            f"{memory_limit} MiB memory limit", where, frames,
                            f"在 {where} 被终止，很可能是用了超过 {memory_limit} MiB 的内存上限")
    last = ["", *stack.strip().splitlines()][-1]  # "" for no stack
    last_zh = last
    if reason.startswith("exit ") and not last:
        last = ("your code ended the process (os._exit, or a library it called that exits); a component "
                "returns its result, it does not end the program")
        last_zh = "你的代码结束了进程（os._exit，或者它调用的库退出了）；组件应该返回结果，而不是结束程序"
    return LearnerError("crash", f"the check process ended ({reason}) in {where}: {last or 'no message'}",
                        where, frames, f"检查进程在 {where} 结束了（{reason}）：{last_zh or '没有消息'}")


def _timed_out(reason: str, where: str, frames: list[str], time_limit: float, kind: str) -> LearnerError:
    """A step stopped by the parent: past its CPU time ("timeout"), or on the wall clock ("waited")."""
    why, why_zh = TIMEOUT_WHY.get(kind, TIMEOUT_WHY[""]) if reason == "timeout" else WAITED_WHY
    wall, cpu = f"{time_limit * WALL_FACTOR:g}", f"{time_limit:g}"
    spent, spent_zh = {"timeout": (f"{cpu} s of CPU time", f"用了 {cpu} 秒 CPU 时间"),
                       "waited": (f"{wall} s", f"等了 {wall} 秒")}[reason]
    return LearnerError("timeout", f"stopped after {spent} in {where}: {why} (raise the limit "
                        "with --time-limit)", where, frames,
                        f"在 {where} {spent_zh}后被停止：{why_zh}（可以用 --time-limit 放宽限制）")


def _stopped_component(kind: str, step: str, error: LearnerError, reason: str, stack: str, path: str,
                       time_limit: float) -> ComponentResult:
    """The component whose check the child did not finish: an ERROR of the learner's code; NOT CHECKED
    where it ran past the time limit with none of the learner's code running (the stack holds no frame
    of their file: check's own comparison or search, between calls of theirs, took the time), since
    nothing showed that their component loops. A loop of theirs that calls check's stand-in model (a
    generate that never ends) has their frame below the stand-in's, and stays an ERROR."""
    files = {*map(os.path.abspath, re.findall(r'File "([^"]+)", line \d+ in', stack))}
    if reason not in STOPPED or not files or path in files:
        return ComponentResult(kind, step, ERROR, error=error)
    seconds = f"{time_limit:g} s of CPU time"
    return ComponentResult(kind, step, NOT_CHECKED, error=LearnerError(
        "cannot_call", f"check's own comparison ran past the {seconds} limit while none of your code was "
        "running: your component was not shown to loop; raise the limit with --time-limit", step, [],
        f"检查程序自己的比较超过了 {time_limit:g} 秒 CPU 时间的限制，当时并没有在运行你的代码："
        "没有证据说明你的组件陷入了死循环；可以用 --time-limit 放宽限制"))


def _learner_frames(stack: str, path: str) -> list[str]:
    """'line N, in f: code' for the frames of a faulthandler dump that are in the learner's file,
    outermost first (faulthandler prints the innermost first)."""
    frames = []
    for file, line, func in re.findall(r'File "([^"]+)", line (\d+) in (\S+)', stack):
        if os.path.abspath(file) == path:
            code = linecache.getline(path, int(line)).strip()
            frames.append(f"line {line}, in {func}: {code}")
    return frames[::-1]
