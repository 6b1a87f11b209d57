"""A class that raised on check's input, which the file's own demo runs. Check builds a model or block at
its own sizes and drives it with inputs of its choosing; a class may take other sizes or forms (a rotary
width fixed in its config beside the model's width, a residual stream of n copies (B, T, n, C), a
sequence a whole number of blocks). Where the file's `if __name__ == "__main__":` block calls the class's
forward and that call returns, the class runs on the inputs its own code gives it: the exception was
check's choice of sizes or forms, not the learner's mistake, so NOT CHECKED, the demo's call said. Where
the demo's call raises too, or the demo never calls it, the exception stays the learner's.

The demo runs in a copy of the file's namespace (its assignments stay there), quietly, with the torch
random state put back, for DEMO_LIMIT seconds of CPU time at most, and stops at the first call that returns.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from handformer.check.core.accepted import shown
from handformer.check.core.result import LearnerError
from handformer.time_limit import cpu_limit

DEMO_LIMIT = 6.0  # CPU seconds the demo may run before its first call of the class returns (cpu_limit)


class _Returned(BaseException):  # noqa: N818  (not an Exception: the demo's `except Exception` cannot eat it)
    """The class's forward returned in the demo: enough seen, the demo stops here."""


class _Timeout(BaseException):  # noqa: N818
    """The demo ran past DEMO_LIMIT before it called the class."""


def demo_body(path: str) -> tuple[ast.Module, int] | None:
    """The statements of the file's `if __name__ == "__main__":` block and its line; None: it has none."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    found = [node for node in tree.body if "__name__" in ast.unparse(getattr(node, "test", ast.Constant("")))]
    return (ast.Module(found[0].body, []), found[0].lineno) if found else None


@contextlib.contextmanager
def recorded(cls: type, calls: list[list[str]]) -> Iterator[None]:
    """The class's forward, while the block runs, records each call's arguments (shown) and stops the
    demo as it returns; put back after."""
    original = inspect.getattr_static(cls, "forward")  # its own, or one it inherits: set back as its own

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(list(map(shown, (*args, *kwargs.values()))))
        original(self, *args, **kwargs)
        raise _Returned

    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = original


def demo_runs(comp_obj: Any, module: Any, path: str, why: LearnerError) -> LearnerError:
    """`why`, the learner's exception (kind "exception") on check's input, turned into a cannot_call
    saying the file's demo runs the class `comp_obj` (module docstring); `why` as it is where it is no
    exception, the file has no demo, its demo never calls the class, or its call raises."""
    body = demo_body(path) if isinstance(comp_obj, type) and why.kind == "exception" else None
    if body is None:
        return why
    calls: list[list[str]] = []
    code = compile(body[0], path, "exec")
    space = {**vars(module), "__name__": "__main__"}
    quiet, argv = io.StringIO(), sys.argv
    sys.argv = [path]
    try:
        with (recorded(comp_obj, calls), torch.random.fork_rng(), contextlib.redirect_stdout(quiet),
              contextlib.redirect_stderr(quiet), cpu_limit(DEMO_LIMIT, _Timeout)):
            exec(code, space)  # noqa: S102  (the learner's own demo, as running their file would)
    except _Returned:
        return _why(comp_obj.__name__, body[1], calls[-1])
    except (Exception, SystemExit, _Timeout):  # noqa: BLE001  (it raised, or ran long: no evidence)
        return why
    finally:
        sys.argv = argv
    return why


def _why(name: str, line: int, args: list[str]) -> LearnerError:
    given = ", ".join(args)
    return LearnerError(
        "cannot_call", f"your own demo (the `if __name__ == \"__main__\":` block, line {line}) builds {name} "
        f"and runs it on ({given}); built at check's sizes and driven with check's input it raised: check's "
        "sizes or the form of its input are not your code's, so the exception is not charged (an adapter "
        "that builds it as your demo does lets check grade it)", "forward", [],
        f"你自己的演示代码（`if __name__ == \"__main__\":` 块，第 {line} 行）构建了 {name}，并在 ({given}) 上"
        "运行成功；按检查程序的大小构建、用检查程序的输入驱动时它出错了：检查程序选的大小或输入形式不是你的代码"
        "接受的，所以这个异常不算你的错误（写一个按你的演示那样构建它的适配函数，检查程序就能判断）")
