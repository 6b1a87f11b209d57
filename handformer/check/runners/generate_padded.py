"""A generation loop handed an attention mask and a padding id (Hugging Face's
generate(model, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id)) driven on a
left-padded batch: prompts of 4 and 2 tokens, the shorter padded on the left. Each row must give the
tokens it gives alone; then, with an EOS the first row reaches first, that row must hold only
padding (or EOS) after it while the other row goes on.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import torch

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import MASK_ARG_NAMES, PAD_NAMES
from handformer.check.core.context import Context, forward_names
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.source import source_lines
from handformer.check.runners.generate_loop import EOS_NAMES, NEVER, PAD_ID, SHORT, call_generate, new_tokens

ROWS = ([3, 17, 9, 5], [11, 2])  # the second is padded on the left
ROLES = (MASK_ARG_NAMES, PAD_NAMES, EOS_NAMES)


def _names(fn: Any) -> list[str | None]:
    """The loop's parameter names for the mask, the padding id and the EOS (None where it has none)."""
    names = forward_names(fn)
    return [next(filter(lambda n: n.lower() in role, names), None) for role in ROLES]


def padded(fn: Any) -> bool:
    """A loop that takes an attention mask and a padding id."""
    return None not in _names(fn)[:2]


def _generate(ctx: Context, comp: Component, driver: Any, style: str, rows: list[list[int]], pad: int,
              eos: int) -> list[list[int]]:
    """The new tokens of each row (left-padded with `pad`); LearnerFailure when the loop (or check's
    model) cannot run it, LookupError when it returns no ids."""
    lengths = torch.tensor(list(map(len, rows)))[:, None]  # (B, 1)
    width = int(lengths.max())
    mask = (torch.arange(width) >= width - lengths).long()  # (B, width): 1 = real token, on the right
    ids = torch.full(mask.shape, pad).masked_scatter(mask.bool(), torch.tensor(sum(rows, [])))
    model = driver.new_model(style, budget=SHORT + 3)
    given = dict(zip(_names(comp.obj), (mask, pad, eos)))
    given.pop(None, None)
    try:
        return new_tokens(call_generate(ctx, comp, model, ids.clone(), SHORT, given), ids, SHORT).tolist()
    except AttributeError:
        raise LookupError("no token ids") from None
    finally:
        getattr(model, "close", lambda: None)()


def check_padded(res: ComponentResult, ctx: Context, comp: Component, driver: Any, style: str) -> None:
    """The left-padded batch against each row alone (its padding id one that neither row makes);
    then again with an EOS that row 0 makes before row 1 does, where the loop takes an EOS. Nothing
    is said where a run cannot be made."""
    with contextlib.suppress(fp.LearnerFailure, LookupError):
        alone = [_generate(ctx, comp, driver, style, [row], PAD_ID, NEVER)[0] for row in ROWS]
        pad = min(set(range(1, 64)) - {t for row in alone + list(ROWS) for t in row})
        ends = [NEVER] + [_eos_of(*alone)] * bool(_names(comp.obj)[2])
        for eos in filter(lambda e: e is not None, ends):
            _judge(res, ctx, comp, driver, style, pad, eos)


def _judge(res: ComponentResult, ctx: Context, comp: Component, driver: Any, style: str, pad: int,
           eos: int) -> None:
    """One left-padded batch against each row alone, with this padding id and EOS."""
    alone = [_generate(ctx, comp, driver, style, [row], pad, eos)[0] for row in ROWS]
    batch = _generate(ctx, comp, driver, style, list(ROWS), pad, eos)
    ok = all(row[:len(own)] == own and set(row[len(own):]) <= {pad, eos} for row, own in zip(batch, alone))
    _, pad_name, eos_name = _names(comp.obj)
    label = [text("", ""), text(f"with {eos_name}={eos}, which row 0 makes first: ",
                                f"{eos_name}={eos}（行 0 先生成它）时：")][eos != NEVER]
    res.checks.append(Check(text(
        f"{label['en']}a left-padded batch (prompts of 4 and 2 tokens, {pad_name}={pad}) gives each row "
        f"its tokens alone {alone}, padding after a row's EOS",
        f"{label['zh']}左填充的一批（提示词 4 个和 2 个 token，{pad_name}={pad}）每行与单独生成相同 "
        f"{alone}，一行遇到 EOS 后只补填充"), ok, text(f"got {batch}", f"实际得到 {batch}")))
    after = batch[0][len(alone[0]):]  # row 0 after its EOS: padding, or tokens it went on to make
    resumed = batch[0][:len(alone[0])] == alone[0] and not set(after) <= {pad, eos}
    res.notes += [_resumed(ctx, comp, after, eos_name, eos)] * resumed


def _eos_of(first: list[int], other: list[int]) -> int | None:
    """The first token row 0 makes, before its last step, that it has not made before and row 1 has
    not made by then: row 0 ends there and row 1 goes on."""
    fresh = (t for i, t in enumerate(first[:-1]) if t not in first[:i] + other[:i + 1])
    return next(fresh, None)


def _resumed(ctx: Context, comp: Component, after: list[int], eos_name: str, eos: int) -> Any:
    """A note: row 0 made these tokens after its EOS; the line that compares with the EOS (where the
    loop decides which rows are finished)."""
    pattern = re.compile(rf"[!=]=\s*{eos_name}\b|\b{eos_name}\s*[!=]=")
    at = next((f"; the line that compares with the EOS, line {n}: {code.strip()}"
               for n, code in source_lines(ctx.objects(comp)) if pattern.search(code)), "")
    return text(f"row 0 ended at {eos_name}={eos}, then went on: {after} (a finished row must hold only "
                f"padding){at}",
                f"行 0 在 {eos_name}={eos} 结束，之后又接着生成：{after}（结束的行只能补填充）"
                + at.replace("; the line that compares with the EOS, ", "；与 EOS 比较的那一行，"))
