"""A generation loop that pads its prompts itself (Meta's llama `generate(prompt_tokens, ...)`: a
list of prompts of different lengths, `tokens` filled with pad_id, each prompt at the start of its
row, decoding from the shortest prompt on, `input_text_mask` keeping the longer prompts' tokens)
driven on prompts of 4 and 2 tokens. Each row must give the tokens it gives alone; what the model was
fed says why not: a longer prompt overwritten by generated tokens, a shorter row fed padding. Then,
with an EOS that row 1 makes at once and that row 0's prompt holds where row 1 is already generating,
row 0 must still give its tokens (an EOS test without the prompt mask ends it there). A loop that
passes a start position its cache would move on from, but feeds the whole prefix from position 0 at
every step, is named too. Nothing is said where a run cannot be made.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import PAD_NAMES
from handformer.check.core.context import Context, forward_parameters
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.runners.generate_loop import (
    EOS_NAMES,
    NEVER,
    SHORT,
    Call,
    StandInTokenizer,
    call_generate,
    run_generate,
)
from handformer.check.runners.generate_padded import padded

ROWS = ([3, 17, 9, 5], [11, 2])  # the first longer: decoding starts at 2, inside it
# the model's start position passed as the start of the slice it is fed (Meta's
# `self.model.forward(tokens[:, prev_pos:cur_pos], prev_pos)`): a position meant to move on
MOVING_START = re.compile(r"\[\s*:\s*,\s*([A-Za-z_]\w*)\s*:\s*\w+\s*\]\s*,\s*\1\b")


def ragged(fn: Any) -> bool:
    """A loop that pads lists of prompts itself: it reads a padding id (an argument, or its tokenizer's
    pad_id) and takes no attention mask."""
    return not padded(fn) and bool(re.search(r"\bpad_(?:id|token_id|idx)\b", source_text(fn)))


@contextlib.contextmanager
def _ids(pad: int, eos: int) -> Iterator[None]:
    """The stand-in tokenizer of an engine class (Meta's `Llama`) with this padding id and EOS."""
    with mock.patch.multiple(StandInTokenizer, pad_id=pad, pad_token_id=pad, eos_id=eos, eos_token_id=eos,
                             stop_tokens=frozenset({eos})):
        yield


def _named_ids(fn: Any, pad: int, eos: int) -> dict[str, int]:
    """The loop's padding and EOS arguments, by name."""
    ids = {**dict.fromkeys(PAD_NAMES, pad), **dict.fromkeys(EOS_NAMES, eos)}
    return {p.name: ids[p.name.lower()] for p in forward_parameters(fn) if p.name.lower() in ids}


def _generate(ctx: Context, comp: Component, driver: Any, rows: list[list[int]], pad: int, eos: int,
              ) -> tuple[list[list[int]], list[Call]]:
    """The new tokens of each row and the model's calls; LearnerFailure when the loop cannot run it,
    LookupError when it returns no rows of ids."""
    model = driver.new_model(driver.styles(comp.obj)[0], budget=SHORT + 8)
    try:
        with _ids(pad, eos):
            named = _named_ids(comp.obj, pad, eos)
            out = call_generate(ctx, comp, model, list(map(list, rows)), SHORT, named)
    finally:
        getattr(model, "close", lambda: None)()
    return _rows_of(out, rows), model.calls


def _rows_of(out: Any, rows: list[list[int]]) -> list[list[int]]:
    """Each row's tokens after its prompt, from the ids a loop returns (new ones, or prompt and new;
    Meta's (tokens, None) without log-probabilities)."""
    out = out[0] if isinstance(out, tuple) and out[-1] is None else out
    try:
        got = [torch.as_tensor(row).reshape(-1).tolist() for row in out]
    except (TypeError, ValueError, RuntimeError):
        raise LookupError("no rows of token ids") from None
    if len(got) != len(rows):
        raise LookupError("not a row of token ids for each prompt")
    return [row[len(p):] if row[:len(p)] == p else row for row, p in zip(got, rows)]


def _fed(calls: list[Call], B: int) -> list[dict[int, int]]:
    """The token each row was fed at each position, the last call's where a position was fed twice."""
    fed: list[dict[int, int]] = [{} for _ in range(B)]
    for call in calls:
        for b, (positions, ids) in enumerate(zip(call.positions.tolist(), call.ids.tolist())):
            fed[b].update(zip(positions, ids))
    return fed


def check_ragged(res: ComponentResult, ctx: Context, comp: Component, driver: Any) -> None:
    """For a loop that pads its prompts itself, the batch of ROWS against each row alone, and again
    with an EOS in row 0's prompt (when nothing was found before); then the start position that never
    moves."""
    with contextlib.suppress(fp.LearnerFailure, LookupError):
        judged = ROWS[:2 * ragged(comp.obj) * (not res.findings)]  # none: not a loop that pads, or found
        alone = [_generate(ctx, comp, driver, [row], 0, NEVER)[0][0] for row in judged]
        pad = min(set(range(1, 24)) - set(sum(alone, ROWS[0] + ROWS[1])))
        if alone and _judge(res, ctx, comp, driver, (list(ROWS), alone), pad, NEVER):
            _eos_in_prompt(res, ctx, comp, driver, alone[1], pad)
    _start_never_moves(res, ctx, comp, driver)


def _same(row: list[int], own: list[int], pad: int, eos: int) -> bool:
    """A row of the batch gives the tokens it gives alone; after them, a row that ran its max_gen_len
    may go on (its batch ran longer), one that ended at EOS holds padding or EOS."""
    return row[:len(own)] == own and set(row[len(own):]) <= [{pad, eos}, set(row)][len(own) == SHORT]


# the check's words: plain, or with an EOS in row 0's prompt
LABELS = {False: text("", ""),
          True: text("with EOS {eos}, which row 0's prompt holds at position 2 and row 1 makes first: ",
                     "EOS 为 {eos}（行 0 的提示词在位置 2 有它，行 1 第一个就生成它）时：")}


def _judge(res: ComponentResult, ctx: Context, comp: Component, driver: Any,
           given: tuple[list[list[int]], list[list[int]]], pad: int, eos: int) -> bool:
    """The batch of rows against each alone (`given`: the rows, the tokens of each alone); a FAIL named
    by what the model was fed, where the tokens differ."""
    rows, alone = given
    batch, calls = _generate(ctx, comp, driver, rows, pad, eos)
    ok = all(map(_same, batch, alone, [pad] * 2, [eos] * 2))
    label = LABELS[eos != NEVER]
    res.checks.append(Check(text(
        f"{label['en'].format(eos=eos)}prompts of 4 and 2 tokens in one batch (padded with {pad}) give each "
        f"row its tokens alone {alone}",
        f"{label['zh'].format(eos=eos)}提示词 4 个和 2 个 token 放在一批（用 {pad} 填充），"
        f"每行与单独生成相同 {alone}"), ok, text(f"got {batch}", f"实际得到 {batch}")))
    if not ok:
        name, observed = _why(calls, rows, pad, eos != NEVER, batch[0])
        res.findings.append(Finding(name, observed, *locate(name, source_lines(ctx.objects(comp)))))
    return ok


def _why(calls: list[Call], rows: list[list[int]], pad: int, eos: bool, got: list[int]) -> tuple[str, Text]:
    """What the model was fed: row 0's prompt with a token replaced, or row 1 (the shorter) padding;
    with an EOS in row 0's prompt, row 0 ended there."""
    fed = _fed(calls, 2)
    prompt = [fed[0].get(p, t) for p, t in enumerate(rows[0])]
    tells = {"generate_eos_in_prompt": eos, "generate_prompt_overwritten": prompt != rows[0],
             "generate_reads_padding": pad in fed[1].values(), "departs": True}
    name = next(filter(tells.get, tells))
    en, zh = WHY[name]
    return name, text(en.format(prompt=rows[0], fed=prompt, pad=pad, got=got),
                      zh.format(prompt=rows[0], fed=prompt, pad=pad, got=got))


WHY = {"generate_prompt_overwritten": ("row 0's prompt {prompt} was fed as {fed}: generated tokens took the "
                                       "place of its own",
                                       "行 0 的提示词 {prompt} 送进模型的是 {fed}："
                                       "生成的 token 占了它自己的位置"),
       "generate_reads_padding": ("row 1, a prompt of 2 tokens, was fed the padding id {pad} as text",
                                  "行 1（提示词 2 个 token）把填充 id {pad} 当成文本送进了模型"),
       "generate_eos_in_prompt": ("row 0 stopped when row 1 reached EOS: it gave {got}; the EOS its prompt "
                                  "holds marked it finished", "行 1 遇到 EOS 时行 0 也停了：它给出 {got}；"
                                  "它提示词里的 EOS 把它标成了已结束"),
       "departs": ("the rows differ from the same prompts alone", "各行与单独生成时不同")}


def _eos_in_prompt(res: ComponentResult, ctx: Context, comp: Component, driver: Any, short: list[int],
                   pad: int) -> None:
    """With EOS = the first token row 1 makes, written into row 0's prompt at position 2 (where row 1 is
    generating): row 0 must go on. Not run when row 0 alone would end at once."""
    rows = [[*ROWS[0][:2], short[0], ROWS[0][3]], ROWS[1]]
    alone = [_generate(ctx, comp, driver, [row], pad, short[0])[0][0] for row in rows]
    if pad not in (alone[0] or [pad]):  # it goes on, and makes no padding
        _judge(res, ctx, comp, driver, (rows, alone), pad, short[0])


def _start_never_moves(res: ComponentResult, ctx: Context, comp: Component, driver: Any) -> None:
    """generate_prefix_refed: the loop hands its model a start position that is the start of the slice
    it feeds (Meta's `tokens[:, prev_pos:cur_pos], prev_pos`), yet every call starts at 0 with the
    whole prefix, one token longer each time: the position never moved on, the cache never served."""
    if not MOVING_START.search(source_text(comp.obj)):
        return
    calls = run_generate(ctx, comp, driver, SHORT, 2).model.calls
    lengths, starts = [c.ids.size(1) for c in calls], {c.start for c in calls}
    grows = starts == {0} and len(lengths) > 1 and lengths == list(range(lengths[0], lengths[0] + len(calls)))
    res.findings += [Finding("generate_prefix_refed", text(
        f"every call started at position 0 and fed the whole prefix again: {lengths} tokens",
        f"每次调用都从位置 0 开始，把整个前缀重新送进模型：{lengths} 个 token"),
        *_where_it_moves(comp.obj))] * grows


def _where_it_moves(fn: Any) -> tuple[int | None, str | None]:
    """The line where the loop should move its start position on: an assignment of it inside the loop
    that calls the model (`prev_pos = 0` there, or `# prev_pos = cur_pos` turned off), else that loop's
    last statement (Meta's `prev_pos = cur_pos` comes last, before the stop test) with the call that
    feeds from the start: two lines."""
    try:
        source, first = inspect.getsourcelines(inspect.unwrap(fn))
        tree = ast.parse(textwrap.dedent("".join(source)))
    except (OSError, TypeError, SyntaxError):
        return None, None
    at, var = next((i + 1, m[1]) for i, line in enumerate(source) if (m := MOVING_START.search(line)))
    loop = max((n for n in ast.walk(tree) if isinstance(n, ast.For) and n.lineno <= at <= n.end_lineno),
               key=lambda n: n.lineno)
    span = source[loop.lineno - 1:loop.end_lineno + 1]  # the loop, and the line after it
    # the start assigned in the loop (`prev_pos = 0` there), or turned off there (`# prev_pos = cur_pos`)
    moved = [loop.lineno + i for i, line in enumerate(span) if re.match(rf"\s*(#\s*)?{var}\s*=(?!=)", line)]
    if moved:
        return moved[0] + first - 1, source[moved[0] - 1].strip()
    last = loop.body[-1].lineno  # none: where moving it on belongs, and the call that feeds from the start
    return last + first - 1, f"{source[last - 1].strip()} / line {at + first - 1}: {source[at - 1].strip()}"
