"""The repetition penalty of the sampling chapter (CTRL's, as Hugging Face's
RepetitionPenaltyLogitsProcessor): `apply_repetition_penalty(logits, generated_ids, penalty)`.

Each token already generated has its logit moved toward less likely: a positive logit divided by the
penalty, a negative one multiplied by it; every other logit is left alone. The function is called
on logits with both signs and ids that repeat a token (a repeat is penalized once), at penalty 1.5
and at penalty 1 (nothing changes), and compared with that rule; when it differs, with the named
mistakes: the rule the wrong way round (repeats made likelier), and every seen logit divided (a
negative one made likelier). A function of one row, (V,) logits and a list of ids, is called one row
at a time.

Shape legend: B rows, V vocabulary, L ids generated so far.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import named
from handformer.check.core.context import Context, error_text, finish, forward_names
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines

PENALTY = 1.5
IDS_NAMES = ("generated_ids", "input_ids", "ids", "generated", "prev_tokens", "previous_tokens", "tokens",
             "token_ids", "history", "prev_ids", "seen", "seen_ids", "context", "idx", "output_ids")
PENALTY_NAMES = ("penalty", "repetition_penalty", "rep_penalty", "repeat_penalty", "theta", "alpha")


def test_inputs() -> tuple[Tensor, Tensor]:
    """(B, V) logits of both signs, and (B, L) ids: row 0 repeats token 1 (positive) and holds token 6
    (negative), row 1 holds tokens 0 (negative) and 3 (positive)."""
    logits = torch.tensor([[0.5, 2.0, -0.3, 1.1, 0.0, 0.7, -1.2, 0.2],
                           [-0.8, 0.4, 1.6, 0.9, -0.1, 0.3, 1.2, -2.0]], dtype=torch.float64)
    ids = torch.tensor([[1, 6, 1], [0, 3, 3]])
    return logits, ids


# CTRL's rule on a row's seen logits, and the named mistakes' forms of it
RULES = {"": lambda score, p: torch.where(score > 0, score / p, score * p),
         "inverted": lambda score, p: torch.where(score > 0, score * p, score / p),
         "divided": lambda score, p: score / p}


def penalized(logits: Tensor, ids: Tensor, penalty: float, form: str = "") -> Tensor:
    """The logits with each row's seen tokens penalized by RULES[form], each token once."""
    return logits.scatter(-1, ids, RULES[form](logits.gather(-1, ids), penalty))


FORMS = {"repetition_penalty_inverted": ("inverted", "positive logits multiplied, negative ones divided",
                                         "正的 logit 被乘、负的被除"),
         "repetition_penalty_sign_ignored": ("divided", "every seen logit divided by the penalty, the "
                                             "negative ones too", "见过的 logit 一律除以惩罚系数，负的也是")}


def _caller(comp: Component, ctx: Context) -> Callable[[Tensor, Tensor, float], Tensor]:
    """The learner's function called with logits, then ids and a penalty by their names (else its
    second and third arguments): on a batch, or one row at a time where a batch gives no logits of
    the batch's shape (a function of (V,) logits and a list of ids)."""
    rest = forward_names(comp.obj)[1:]
    cannot_fill(comp.name, [], [], rest[1:], "penalty", (
        "a repetition penalty takes the logits, the ids generated so far and the penalty",
        "重复惩罚接收 logits、已经生成的 id 和惩罚系数"))
    ids, pen = named(rest, IDS_NAMES) or rest[0], named(rest, PENALTY_NAMES) or rest[1]

    def call(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
        out = fp.quietly(lambda: comp.obj(logits.clone(), **{ids: seen.clone(), pen: penalty}))
        if isinstance(out, Tensor) and out.shape == logits.shape:
            return out
        return torch.stack([torch.as_tensor(comp.obj(row.clone(), **{ids: r.tolist(), pen: penalty}))
                            for row, r in zip(logits, seen)])
    return call


def check_repetition_penalty(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    call = _caller(comp, ctx)
    logits, ids = test_inputs()
    outs = {p: ctx.learner.call("forward", call, logits, ids, p).double() for p in (PENALTY, 1.0)}
    errors = {p: fp.max_error(out, penalized(logits, ids, p)) for p, out in outs.items()}
    res.max_abs_error = max(errors.values())
    res.checks.append(Check(text(f"penalty {PENALTY} divides each seen token's positive logit and multiplies "
                                 "its negative one, once per token, and leaves the others; penalty 1 "
                                 "changes nothing",
                                 f"惩罚系数 {PENALTY} 时，见过的 token 正 logit 被除、负 logit 被乘，每个 "
                                 "token 只罚一次，其余不变；惩罚系数 1 时什么都不变"),
                            res.max_abs_error < fp.TOL, error_text(res.max_abs_error)))
    found = [n for n, (form, _, _) in FORMS.items()
             if fp.max_error(outs[PENALTY], penalized(logits, ids, PENALTY, form)) < fp.TOL]
    for name in found[:1] * (errors[PENALTY] >= fp.TOL):
        _, en, zh = FORMS[name]
        number, code = locate(name, source_lines(ctx.objects(comp)))
        res.findings.append(Finding(name, text(f"at penalty {PENALTY}: {en}", f"惩罚系数 {PENALTY} 时：{zh}"),
                                    number, code))
    return finish(res)
