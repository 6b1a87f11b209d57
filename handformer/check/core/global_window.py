"""Longformer's attention (Beltagy et al., 2020): each token sees the w tokens on each side of it, and
the tokens its `global_attention_mask` marks see every token and are seen by every token.

The argument that marks the global tokens is handed all ones wherever check drives the attention as
any other (every token global: the whole sequence seen, so its projections, heads and scale are graded
as a full attention's). Then the window is read off its output with no global token (the w whose band
|i - j| <= w, computed densely with its own weights, gives that output), and its output with a few
global tokens is compared with the dense attention under band | global query | global key.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import DEPARTS, ComponentResult, Finding, failed_check, text
from handformer.check.core.source import first_line

T = 12  # tokens the window is read on: windows up to 5 on each side are told apart from a full one
# (B, T): the first token of each row, one more in one (a literal: the fork server computes nothing)
GLOBAL = torch.tensor([[True] + [False] * (T - 1), [True] + [False] * 6 + [True] + [False] * (T - 8)])
TOLERANCE = 1e-4
# the masks a mistake builds in place of band | global query | global key, and the lines that build them
FORMS = {"global keys only": (False, True), "global queries only": (True, False), "no global": (False, False)}
LINES = (r"global.*\|", r"\|.*global", r"global")
WINDOW_LINES = (r"window.*(<|>)", r"(<|>).*window", r"window")  # the line that compares with the window
# the marks broadcast over the keys' axis ((B, 1, T) or (B, 1, 1, T)) and over the queries'
KEY_SIDE, QUERY_SIDE = r"\[:,\s*None,\s*(None,\s*)?:\]", r"\[:,\s*(None,\s*)?:,\s*None\]"
SIDES = {"global keys only": KEY_SIDE, "global queries only": QUERY_SIDE}


def global_names(params: list[inspect.Parameter]) -> list[str]:
    """The forward's arguments that mark global tokens with a (B, T) mask (Longformer's
    global_attention_mask); not a list of their positions, which no mask fills."""
    return [p.name for p in params if {"global", "mask"} <= set(re.findall("[a-z]+", p.name.lower()))]


def global_inputs(names: list[str], B: int, T: int, marked: Tensor | None = None) -> dict[str, Tensor]:
    """{name: (B, T) 1 = a global token}: `marked`, else every token global."""
    marks = torch.ones(B, T, dtype=torch.long) if marked is None else marked.long()
    return dict.fromkeys(names, marks)


def keep(window: int, queries: bool = True, keys: bool = True, marked: Tensor = GLOBAL) -> Tensor:
    """(B, 1, T, T) True = may attend: the band |i - j| <= window, or a global query, or a global key."""
    pos = torch.arange(marked.size(1))
    band = (pos[:, None] - pos[None, :]).abs() <= window
    return (band | marked[:, :, None] & queries | marked[:, None, :] & keys)[:, None]


Run = Callable[[Tensor, Tensor], "Tensor | None"]  # (x, (B, T) global marks) -> the learner's output
Reference = Callable[[Tensor, Tensor], Tensor]  # (x, keep (B, 1, T, T)) -> the dense reference's output


def check_global(res: ComponentResult, run: Run, reference: Reference, width: int,
                 lines: list[tuple[int, str]]) -> None:
    """The learner's attention or layer (`run`) with global marks: its window read off its output with
    none marked, then its output with GLOBAL marked against the dense `reference` with the same mask."""
    x = fp.randn(2, T, width, seed=11)
    ref = {w: reference(x, keep(w, False, False)) for w in range(T)}
    alone = run(x, torch.zeros_like(GLOBAL))
    window = next((w for w, r in ref.items() if fp.max_error(alone, r) < TOLERANCE), None)
    res.checks.append(failed_check(text(
        "with no global token each token sees the w tokens on each side of it, |i - j| <= w, for some w",
        "没有全局 token 时，每个 token 看它两边各 w 个 token（|i - j| <= w），w 为某个值"),
        window is not None, lambda: text(f"no such band gives its output on {T} tokens",
                                         f"在 {T} 个 token 上，没有这样的窗口给出它的输出")))
    if window is None:
        res.findings.append(Finding(DEPARTS, text(
            "with no global token its output is no band |i - j| <= w's: the window differs on its two sides",
            "没有全局 token 时，它的输出不符合任何 |i - j| <= w 的窗口：两边的窗口不一样"),
            *first_line(WINDOW_LINES, lines)))
        return
    out = run(x, GLOBAL)
    want = reference(x, keep(window))
    error = fp.max_error(out, want)
    res.checks.append(failed_check(text(
        f"global tokens (positions 0, and 0 and 7) see every token and are seen by every token, the window "
        f"{window} on each side elsewhere (max abs error {error:.2g})",
        f"全局 token（位置 0，以及位置 0 和 7）看所有 token，也被所有 token 看到，其余位置窗口为两边各 "
        f"{window}（最大绝对误差 {error:.2g}）"), error < TOLERANCE,
        lambda: text("its output is not the dense attention's under band | global query | global key",
                     "它的输出和 窗口 | 全局查询 | 全局键 下的稠密注意力不同")))
    res.notes.append(text(f"Longformer's attention: a window of {window} on each side read off its output",
                          f"Longformer 的注意力：从输出读出窗口为两边各 {window}"))
    if error >= TOLERANCE:
        _form(res, out, x, reference, window, lines)


def _form(res: ComponentResult, out: Tensor | None, x: Tensor, reference: Reference, window: int,
          lines: list[tuple[int, str]]) -> None:
    """The mask a mistake builds that gives its output, named at the first line that writes the marks'
    side it keeps (the other side's is missing, or written as this one: then the first of the two), else
    the first line that speaks of global tokens."""
    form = next((f for f, (q, k) in FORMS.items()
                 if fp.max_error(out, reference(x, keep(window, q, k))) < TOLERANCE), None)
    said = {"global keys only": ("global tokens are seen by every token but do not see every token",
                                 "全局 token 被所有 token 看到，但它自己没有看所有 token"),
            "global queries only": ("global tokens see every token but are not seen by every token",
                                    "全局 token 看所有 token，但没有被所有 token 看到"),
            "no global": ("the global tokens are not attended globally at all", "全局 token 完全没有起作用")}
    en, zh = said.get(form or "", ("the output is none of band | global query | global key's readings",
                                   "输出不符合 窗口 | 全局查询 | 全局键 的任何一种读法"))
    side = SIDES.get(form or "")
    found = first_line([side], lines) if side else (None, None)
    res.findings.append(Finding(DEPARTS, text(en, zh), *(found if found[0] else first_line(LINES, lines))))
