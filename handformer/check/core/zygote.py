"""A fork server for the sandbox: one process that has imported torch and the grader forks a child
for each check, so no child pays torch's import (2.5-4.5 s on a busy 2-core machine).

The server is a fresh interpreter (`python -m handformer.check.core.zygote`) started at the first
check of a process, or a copy of the `handformer check` command itself (`fork_here`: it has imported
torch and parsed its arguments, nothing else). It reads one JSON request a line, forks, answers the
child's pid, then its exit code once it ends (negative for a signal, as Popen's returncode). The
child starts a session of its own (the parent kills its process group at the time limit), takes the
parent's working folder, environment and thread count, writes its stdout to /dev/null and its stderr
to the request's file, then runs the sandbox's child side: a crash of the learner's code ends the
child, never the server. The server ends when its request pipe closes (the parent exited or was
killed), and takes a running child with it.

Fork after torch's import is safe while the server has computed nothing: torch's OpenMP pool starts
at the first parallel operation, and a child forked after it hangs in its first parallel operation.
(CUDA, once initialized, cannot be used in a forked child at all.) The server never computes; it
counts its threads after its imports and, should that number grow or CUDA be initialized, answers
"unsafe" and ends: the sandbox then starts a fresh interpreter for each check, as it does
where there is no fork (not Linux) or the server cannot start.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
from typing import Any, BinaryIO

from handformer.check.core.defaults import quietly

READY_LIMIT = 120.0  # seconds for a fresh server to import torch and the grader on a busy machine


class Forked:
    """A child of the server, as the sandbox drives it: its pid, poll(), wait() and returncode."""

    def __init__(self, server: Server, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None and self.server.answered(0):
            self.returncode = self.server.answer()["code"]
            self.server.lock.release()  # the server may fork the next child
        return self.returncode

    def wait(self) -> int:
        self.server.answered(None)
        return self.poll()


class Server:
    """The parent's end of a fork server: its request and answer pipes, and its process (a Popen, or
    the pid of a fork)."""

    def __init__(self, requests: BinaryIO, answers: BinaryIO, pid: int, popen: subprocess.Popen | None):
        self.requests, self.answers, self.pid, self.popen = requests, answers, pid, popen
        self.lock, self.gone = threading.Lock(), False

    def answered(self, timeout: float | None) -> bool:
        return bool(select.select([self.answers], [], [], timeout)[0])

    def answer(self) -> dict[str, Any]:
        line = self.answers.readline()  # unbuffered: one line, nothing read past it
        if not line:  # the server ended: its child, if any, is taken as killed
            self.gone = True
        return json.loads(line) if line else {"code": -signal.SIGKILL}

    def fork(self, request: dict[str, Any]) -> Forked | None:
        """A child running the request (the server's lock held until it ends), or None when the
        server is busy, gone or refuses."""
        if self.gone or not self.lock.acquire(blocking=False):
            return None
        try:
            self.requests.write((json.dumps(request) + "\n").encode())
            answer = self.answer()
        except OSError:
            answer = {}
        if "pid" not in answer:
            self.gone = True
            self.lock.release()
            return None
        return Forked(self, answer["pid"])

    def close(self, kill: bool = False) -> None:
        """End the server (its pipe closes; `kill`: at once) and reap it."""
        self.requests.close()
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
        else:
            os.waitpid(self.pid, 0)


_servers: dict[int, Server | None] = {}  # by the pid of the process that started it; None: no fork here


def server() -> Server | None:
    """This process's fork server, started at the first call; None where fork is not to be had."""
    if os.getpid() not in _servers:
        _servers[os.getpid()] = _started(_spawn_server) if sys.platform == "linux" else None
    return _servers[os.getpid()]


def fork_here() -> None:
    """Make this process's fork server a copy of this process: for a command that has imported torch
    and nothing of the learner's, so that the check pays torch's import once, not twice."""
    if sys.platform == "linux" and os.getpid() not in _servers:
        _servers[os.getpid()] = _started(_fork_server)


def _started(start) -> Server | None:
    """A server that said it is ready, or None (it could not import, it is unsafe, it took too long)."""
    srv = start()
    ready = srv.answered(READY_LIMIT) and srv.answer().get("ready")
    if not ready:
        srv.close(kill=True)
        return None
    atexit.register(srv.close)
    return srv


def _spawn_server() -> Server:
    proc = subprocess.Popen([sys.executable, "-m", "handformer.check.core.zygote"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                            start_new_session=True)
    return Server(proc.stdin, proc.stdout, proc.pid, proc)


def _fork_server() -> Server:
    (request_r, request_w), (answer_r, answer_w) = os.pipe(), os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()  # what the command wrote so far is not written again by the copy
    pid = os.fork()
    if pid == 0:
        try:  # the copy never returns into the command
            os.setsid()  # the terminal's Ctrl-C goes to the command, which then closes the pipe
            os.close(request_w)
            os.close(answer_r)
            _quiet()
            _serve(os.fdopen(request_r, "rb", buffering=0), os.fdopen(answer_w, "wb", buffering=0))
        finally:
            os._exit(1)
    os.close(request_r)
    os.close(answer_w)
    return Server(os.fdopen(request_w, "wb", buffering=0), os.fdopen(answer_r, "rb", buffering=0), pid, None)


def _quiet() -> None:
    """stdin, stdout and stderr on /dev/null: the server writes its answers on a pipe of its own."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The server's loop: import, say ready, then a child for each request; ends with the pipe (and
    never returns: in a copy of the command, nothing of the command runs after it)."""
    try:
        _loop(requests, answers)
    finally:
        os._exit(0)


def _loop(requests: BinaryIO, answers: BinaryIO) -> None:
    import torch

    from handformer.check.core.engine import import_runners

    import_runners()
    threads, default_threads = _threads(), torch.get_num_threads()
    answers.write(b'{"ready": true}\n')
    for line in requests:
        if _threads() > threads or torch.cuda.is_initialized():  # a fork could hang (see above)
            answers.write(b'{"unsafe": true}\n')
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, (requests, answers), default_threads)
        answers.write((json.dumps({"pid": pid}) + "\n").encode())
        answers.write((json.dumps({"code": _reaped(pid, requests)}) + "\n").encode())


def _reaped(pid: int, requests: BinaryIO) -> int:
    """The child's exit code once it ends; if the parent goes first, the child is killed, then the
    server ends."""
    ended = _pidfd(pid)
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done:
        if requests in select.select([requests, *ended], [], [], None if ended else 0.05)[0]:
            _kill_group(pid)  # end of file: the parent is gone
            os.waitpid(pid, 0)
            os._exit(0)
        done, status = os.waitpid(pid, os.WNOHANG)
    for fd in ended:
        os.close(fd)
    return os.waitstatus_to_exitcode(status)


def _pidfd(pid: int) -> list[int]:
    """A descriptor that becomes readable when the child ends ([] on a kernel without pidfd: poll)."""
    return quietly(lambda: [os.pidfd_open(pid)], (AttributeError, OSError), [])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _child(request: dict[str, Any], pipes: tuple[BinaryIO, ...], default_threads: int) -> None:
    """The forked child: the parent's folder, environment and threads, its own session and output,
    then the sandbox's child side; its exit code as a fresh interpreter's would be."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        for pipe in pipes:
            os.close(pipe.fileno())
        _quiet()
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(err, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # as `python -m` puts the folder it is started in
        _threads_as_fresh(default_threads)
        from handformer.check.core.sandbox_child import child

        child(request)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # as an interpreter ends on an exception: the traceback on stderr
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _threads_as_fresh(default_threads: int) -> None:
    """The thread count a fresh interpreter would start with: OMP_NUM_THREADS, else the server's."""
    import torch

    given = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(given) if given.isdigit() and int(given) > 0 else default_threads)


def main() -> None:
    """The spawned server: its answers on a copy of stdout, its requests on a copy of stdin."""
    requests, answers = os.fdopen(os.dup(0), "rb", buffering=0), os.fdopen(os.dup(1), "wb", buffering=0)
    _quiet()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends it by closing the pipe
    _serve(requests, answers)


if __name__ == "__main__":
    main()
