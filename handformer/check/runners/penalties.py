"""Runners of three logits processors of Hugging Face's `generation/logits_process.py` and OpenAI's
penalties, as a class (`__call__(input_ids, scores)`, built with its settings) or a function of the
scores, the ids so far and the settings:

- the frequency and presence penalties (OpenAI's): each token's logit less its count in the ids times
  the frequency penalty, less the presence penalty once where its count is above 0;
- no-repeat-ngram (fairseq's, Hugging Face's): a token that would complete an n-gram the row already
  holds, its last n - 1 tokens followed by it earlier, is banned (-inf);
- min-length: the end-of-sequence token banned while the row is shorter than the minimum length.

Each is read at several settings on ids that repeat tokens and n-grams, and compared with the rule;
where it departs, the first line whose value is none of the rule's steps is quoted.

Shape legend: B rows, L ids so far, V vocabulary.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import call_parameters, named, names_of
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import View, latest_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.processors import SCORES_NAMES
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.runners.repetition import IDS_NAMES

V = 8
IDS_GIVEN = torch.tensor([[1, 2, 3, 1, 2, 2], [4, 5, 4, 5, 0, 4]])  # (B, L): repeats, repeated n-grams
ROLES: dict[str, tuple[str, ...]] = {
    "frequency": ("frequency_penalty", "freq_penalty", "alpha_frequency", "frequency", "freq_pen"),
    "presence": ("presence_penalty", "pres_penalty", "alpha_presence", "presence", "pres_pen"),
    "n": ("ngram_size", "no_repeat_ngram_size", "n", "ngram", "n_gram", "ngram_n", "n_gram_size"),
    "min": ("min_length", "min_len", "min_tokens", "minimum_length", "min_seq_len"),
    "eos": ("eos_token_id", "eos_id", "eos", "eos_token", "end_id", "eos_idx", "eos_token_idx"),
}


def frequency_presence(ids: Tensor, scores: Tensor, s: dict[str, Any]) -> Tensor:
    counts = torch.zeros_like(scores).scatter_add_(1, ids, torch.ones_like(ids, dtype=scores.dtype))  # (B, V)
    return scores - counts * s.get("frequency", 0.0) - (counts > 0).to(scores.dtype) * s.get("presence", 0.0)


def no_repeat_ngram(ids: Tensor, scores: Tensor, s: dict[str, Any]) -> Tensor:
    n, out = s["n"], scores.clone()
    for b, row in enumerate(ids.tolist()):
        last = tuple(row[len(row) - n + 1 :]) if n > 1 else ()
        banned = [row[i + n - 1] for i in range(len(row) - n + 1) if tuple(row[i : i + n - 1]) == last]
        out[b, banned] = -float("inf")
    return out


def min_length(ids: Tensor, scores: Tensor, s: dict[str, Any]) -> Tensor:
    out = scores.clone()
    if ids.size(-1) < s["min"]:
        out[:, s["eos"]] = -float("inf")
    return out


@dataclass(frozen=True)
class Rule:
    rule: Callable[[Tensor, Tensor, dict[str, Any]], Tensor]
    needs: tuple[str, ...]  # the roles it must take (one of them, for the penalties)
    settings: tuple[dict[str, Any], ...]
    said: Text
    # where a departure is looked for: "trace", the values its lines assign; a role, the line that
    # compares that setting (a branch: no value to trace); "", nowhere (an n-gram table of lists)
    departs: str = "trace"


L = IDS_GIVEN.size(1)
RULES = {
    "penalties": Rule(
        frequency_presence,
        ("frequency", "presence"),
        (
            {"frequency": 0.5, "presence": 0.0},
            {"frequency": 0.0, "presence": 0.7},
            {"frequency": 0.3, "presence": 0.4},
        ),
        text(
            "each logit less count * frequency_penalty and presence_penalty once where the count is above 0",
            "每个 logit 减去 次数 * frequency_penalty，出现过的再减一次 presence_penalty",
        ),
    ),
    "no_repeat_ngram": Rule(
        no_repeat_ngram,
        ("n",),
        ({"n": 2}, {"n": 3}),
        text(
            "at n = 2 and 3, a token that completes an n-gram the row already holds is -inf",
            "n = 2 和 3 时，会凑出行里已有 n-gram 的 token 被设成 -inf",
        ),
        "",
    ),
    "min_length": Rule(
        min_length,
        ("min", "eos"),
        tuple({"min": m, "eos": 3} for m in (L + 1, L, L - 1)),
        text(
            f"with {L} ids, EOS is -inf at min_length {L + 1} only, not at {L} or {L - 1}",
            f"已有 {L} 个 id 时，只有 min_length = {L + 1} 时 EOS 为 -inf，{L} 和 {L - 1} 时不是",
        ),
        "min",
    ),
}


def _caller(comp: Component, ctx: Context, rule: Rule) -> tuple[Callable[..., Any], dict[str, str | None]]:
    """The learner's processor as a function of (ids, scores, settings), and its roles: a class built
    with the settings its constructor takes, called on (input_ids, scores); a function called so."""
    is_class = isinstance(comp.obj, type)
    init = names_of(call_parameters(comp.obj.__init__, ("self",))) if is_class else ([], [])
    call = names_of(call_parameters(comp.obj.__call__ if is_class else comp.obj, ("self",)))
    roles = {r: named(init[0] + call[0], aliases) for r, aliases in ROLES.items()}
    ids, scores = named(call[0], IDS_NAMES + ("prev_output_tokens",)), named(call[0], SCORES_NAMES)
    found = ids and scores and (any if rule.needs[0] == "frequency" else all)(roles[r] for r in rule.needs)
    cannot_fill(
        comp.name,
        init[1] + call[1],
        {ids, scores, *roles.values()},
        found,
        "scores",
        (
            "a logits processor takes the ids so far (input_ids) and the scores (scores, logits), and its "
            "settings by their names",
            "logits 处理器接受已有的 id（input_ids）和分数（scores、logits），以及按名字给出的设置",
        ),
    )

    def run(given_ids: Tensor, given: Tensor, s: dict[str, Any]) -> Tensor:
        kwargs = {roles[r]: v for r, v in s.items() if roles[r]}
        built = {k: v for k, v in kwargs.items() if k in init[0]}
        fn = comp.obj(**built) if is_class else comp.obj
        out = fn(
            **{ids: given_ids.clone(), scores: given, **{k: v for k, v in kwargs.items() if k not in built}}
        )
        return torch.as_tensor(out).double()

    return run, roles


def check_processor(comp: Component, ctx: Context) -> ComponentResult:
    """The processor at each setting it takes, against the rule of its kind."""
    res = ctx.result(comp)
    rule = RULES[comp.kind]
    run, roles = _caller(comp, ctx, rule)
    settings = [s for s in rule.settings if all(roles[r] or not v for r, v in s.items())]
    scores = torch.randn(
        IDS_GIVEN.size(0), V, generator=torch.Generator().manual_seed(6), dtype=torch.float64
    )
    outs = [ctx.learner.call("forward", run, IDS_GIVEN, scores.clone(), s) for s in settings]
    wants = [rule.rule(IDS_GIVEN, scores, s) for s in settings]
    errors = [_error(o, w) for o, w in zip(outs, wants)]
    res.max_abs_error = max(errors)
    ok = res.max_abs_error < fp.TOL
    shown = "; ".join(", ".join(f"{k}={v:g}" for k, v in s.items()) for s in settings)
    res.checks.append(Check(text(f"{rule.said['en']} ({shown})", f"{rule.said['zh']}（{shown}）"), ok))
    s = settings[errors.index(res.max_abs_error)]
    if not ok and rule.departs == "trace":
        note_departure(res, lambda: _departs(comp, run, scores, s, rule))
    elif not ok and rule.departs:
        res.findings += _compared_at(comp, roles[rule.departs], s)
    return finish(res)


def _compared_at(comp: Component, name: str | None, s: dict[str, Any]) -> list[Finding]:
    """The finding at the line of its own code that compares the setting `name` (a length against
    min_length: a branch, no value to trace); none where no line does."""
    fn = comp.obj.__call__ if isinstance(comp.obj, type) else comp.obj
    lines, start = inspect.getsourcelines(fn)
    said = ", ".join(f"{k}={v:g}" for k, v in s.items())
    at = [
        (start + i, c.strip())
        for i, c in enumerate(lines)
        if name and re.search(rf"\b{name}\b", c) and re.search(r"[<>]=?", c) and not c.strip().startswith("#")
    ]
    return [Finding(DEPARTS, text(f"at {said} it differs from the rule", f"{said} 时与规则不同"), *at[0])][
        : len(at)
    ]


def _error(out: Tensor, want: Tensor) -> float:
    """The largest difference, a -inf where the rule has one counting as equal."""
    if out.shape != want.shape:
        return float("inf")
    same = out == want  # -inf == -inf
    return fp.max_error(out.masked_fill(same, 0.0), want.masked_fill(same, 0.0))


def _departs(comp: Component, run: Callable[..., Any], scores: Tensor, s: dict[str, Any], rule: Rule) -> Any:
    """The first line whose value is neither the scores, the rule's steps nor its result."""
    filename = inspect.getsourcefile(comp.obj)
    steps = trace_steps(
        lambda: run(IDS_GIVEN, scores.clone().requires_grad_(), s), filename, None, (), constants=True
    )
    counts = torch.zeros_like(scores).scatter_add_(
        1, IDS_GIVEN, torch.ones_like(IDS_GIVEN, dtype=scores.dtype)
    )
    views: list[View] = [
        ("the scores", scores),
        ("the counts", counts),
        ("present (count > 0)", (counts > 0).double()),
        ("the frequency part", scores - counts * s.get("frequency", 0.0)),
        ("the result", rule.rule(IDS_GIVEN, scores, s)),
    ]
    return latest_departure(steps, [views], filename, {"V": V}, ends=True)
