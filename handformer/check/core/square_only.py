"""A self-attention core that takes queries and keys of one length only (the square form).

Check drives an attention core with fewer queries than keys (a padded cross case, T != S) by a choice
of its own; a core written for self-attention builds its causal mask from the query length
(ChatGLM's `torch.tril(torch.ones(sq, sq))`) and raises there. Such a case is run again in the form
the code takes, as many queries as keys; only a raise in that form too is the learner's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import ComponentResult, text

Out = TypeVar("Out")


def in_a_form_taken(run: Callable[[int, int], Out], t: int, s: int, square: list[str], label: str) -> Out:
    """`run(t, s)`; where it raises on T != S, `run(s, s)`, the case's label noted in `square`."""
    try:
        return run(t, s)
    except fp.LearnerFailure:
        if t == s:
            raise
    square.append(label)
    return run(s, s)


def square_note(res: ComponentResult, square: list[str]) -> None:
    """The note of the cases run as many queries as keys, where there are any."""
    if not square:
        return
    cases = ", ".join(square)
    res.notes.append(text(
        f"your attention raised when handed fewer queries than keys: it takes as many queries as keys (a "
        f"self-attention core, square), so those cases ({cases}) were run with T = S; T != S is a form of "
        "check's choosing, not one your code takes",
        f"查询少于键时你的注意力出错：它只接受查询数与键数相同的输入（自注意力的核心，方阵），所以这些情形"
        f"（{cases}）按 T = S 运行；T != S 是检查程序自己选的形式，不是你的代码接受的形式"))
