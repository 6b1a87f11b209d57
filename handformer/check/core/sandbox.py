"""The learner's code runs in a child process with a time limit and a memory limit.

The parent has the fork server of zygote.py fork the child (torch and the grader already imported;
where there is none, it starts `python -m handformer.check.core.sandbox_child REQUEST`); the child caps
its address space (RLIMIT_AS), imports torch and handformer where it has not, then imports the
learner's file and checks one component after another. Before each step it arms
`faulthandler.dump_traceback_later`, so an infinite loop ends with the stack of where it was
looping; the parent also kills the whole process group when a step outlives the limit. Results
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

TIME_LIMIT = 20.0  # seconds for each step (the import of the learner's file, each component)
MEMORY_LIMIT = 4096  # MiB of address space for the child (torch itself needs ~1 GiB of it)
STARTUP_LIMIT = 120.0  # seconds for the child to import torch and handformer on a busy machine


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
             "memory_limit": memory_limit, "time_limit": time_limit, "skip": skip,
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
        error = _stopped(reason, step, stack, path, time_limit, memory_limit, kind)
        if step == "import" and reason == "timeout" and not definitions_only:
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
    component was checked as, the stack it dumped, why it stopped: done | timeout | exit N |
    signal N)."""
    with tempfile.TemporaryDirectory(prefix="handformer-check-") as tmp:
        files = {k: Path(tmp) / k for k in ("results", "progress", "stack", "stderr")}
        request = {**request, **{k: str(v) for k, v in files.items()}}
        proc = _started(request)
        try:
            reason = _watched(proc, files["progress"], time_limit)
        finally:
            if proc.poll() is None:  # the parent was interrupted (Ctrl-C): so is the child
                _kill(proc)
        stderr = _read(files["stderr"])
        phase = _progress(files["progress"])
        stack = _read(files["stack"])
        lines = [json.loads(line) for line in _read(files["results"]).splitlines() if line.strip()]
        if reason != "timeout":
            code = proc.returncode
            finished = code == 0 and _done(lines)
            reason = "done" if finished else f"signal {-code}" if code < 0 else f"exit {code}"
            if stack.strip():
                reason = "timeout"
        if reason not in ("done", "timeout") and not stack:
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


def _watched(proc: Any, progress: Path, time_limit: float) -> str:
    """Wait for the child; kill its process group when a step outlives its limit. "timeout" or
    "done" (the child ended by itself)."""
    phase, since = None, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.05)
        current = _progress(progress)
        if current != phase:
            phase, since = current, time.monotonic()
        limit = STARTUP_LIMIT if phase is None else time_limit + 5.0
        if time.monotonic() - since > limit:
            _kill(proc)
            return "timeout"
    return "done"


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


def _stopped(reason: str, phase: str | None, stack: str, path: str, time_limit: float,
             memory_limit: int, kind: str = "") -> LearnerError:
    where = phase or "startup"
    frames = _learner_frames(stack, path)
    if reason == "timeout":
        why, why_zh = TIMEOUT_WHY.get(kind, TIMEOUT_WHY[""])
        return LearnerError("timeout", f"stopped after {time_limit:g} s in {where}: {why} (raise the limit "
                            "with --time-limit)", where, frames,
                            f"在 {where} 运行 {time_limit:g} 秒后被停止：{why_zh}"
                            "（可以用 --time-limit 放宽限制）")
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


def _stopped_component(kind: str, step: str, error: LearnerError, reason: str, stack: str, path: str,
                       time_limit: float) -> ComponentResult:
    """The component whose check the child did not finish: an ERROR of the learner's code; NOT CHECKED
    where it ran past the time limit with none of the learner's code running (the stack holds no frame
    of their file: check's own comparison or search, between calls of theirs, took the time), since
    nothing showed that their component loops. A loop of theirs that calls check's stand-in model (a
    generate that never ends) has their frame below the stand-in's, and stays an ERROR."""
    files = {*map(os.path.abspath, re.findall(r'File "([^"]+)", line \d+ in', stack))}
    if reason != "timeout" or not files or path in files:
        return ComponentResult(kind, step, ERROR, error=error)
    seconds = f"{time_limit:g}"
    return ComponentResult(kind, step, NOT_CHECKED, error=LearnerError(
        "cannot_call", f"check's own comparison ran past the {seconds} s limit while none of your code was "
        "running: your component was not shown to loop; raise the limit with --time-limit", step, [],
        f"检查程序自己的比较超过了 {seconds} 秒的时间限制，当时并没有在运行你的代码："
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
