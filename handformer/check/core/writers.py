"""The lines of a learner's file that change a value: a method that writes a weight in place
(`self.base.weight.data += ...`) returns nothing to trace, so the line that wrote it is found by
watching the value after each line of their file that runs.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def written_at(run: Callable[[], Any], fn: Any, watch: Callable[[], Tensor]) -> list[tuple[int, str]]:
    """Run `run()` once; (line, code) of each line of fn's file after which `watch()` changed, in
    order (the learner's code raising is raised on: a method that raises on what it accepts fails)."""
    filename = inspect.getsourcefile(fn)
    lines = open(filename, encoding="utf-8").read().splitlines() if filename else []
    seen = [watch().detach().clone()]
    found: list[tuple[int, str]] = []

    def changed(line: int) -> None:
        now = watch().detach()
        if now.shape != seen[0].shape or not torch.equal(now, seen[0]):
            found.append((line, lines[line - 1].strip()))
            seen[0] = now.clone()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != filename:
            return None
        last = [frame.f_lineno]

        def step(frame: Any, event: str, arg: Any) -> Any:
            if event in ("line", "return"):
                changed(last[0])  # a line event comes before its line runs: the one before ran
                last[0] = frame.f_lineno
            return step

        return step

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(old)
    return found
