"""The runner of a distillation loss (Hinton et al. 2015; the token-level KL of MiniLLM and of LM
distillation recipes): a student's and a teacher's logits, softened by a temperature T, compared
with a KL divergence summed over the classes, optionally beside the cross-entropy of hard labels.

Two shapes of input, by what the loss takes: (B, C) logits with (B,) labels (a classifier's KD), or
(B, L, V) logits with a (B, L) mask of the real tokens (an LM's), padding left out. The loss is read
at two temperatures and weights and compared with the formulas under each convention a tutorial
writes: the forward KL(p_teacher || p_student) or, where the name says reverse, KL(p_student ||
p_teacher); summed over the classes, averaged over the rows (batchmean) or the real tokens; the soft
term times T^2 (Hinton's: it keeps its gradients on the hard term's scale; required where a hard
term is added, noted where the divergence is returned alone); the two terms weighted alpha and 1 -
alpha either way round. Where none matches, the first line that departs is quoted.

Shape legend: B batch, C classes, L tokens, V vocabulary.
"""

from __future__ import annotations

import inspect
import itertools
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import call_parameters, names_of
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import View, latest_departure, over_axes, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, text

B, C, L = 3, 7, 5  # T^2 = 4 is no size: a factor of 1/T^2 reads as itself
LENGTHS = (5, 3, 4)  # real tokens of each row of an LM's batch
SETTINGS = ((2.0, 0.3), (4.0, 0.7))  # (T, alpha) the loss is read at
# each role: the pattern of the names that play it, T first (case-sensitive: t is a teacher)
ROLES: dict[str, str] = {
    "T": r"^(T|temperature|temp|tau|Temperature|kd_T|T_kd|kd_temperature|temperature_kd|t_kd)$",
    "teacher": r"(?i)teacher|^tea|^t_|_t$|^t$|^tch|_tch$|^soft_?targets?$",
    "student": r"(?i)student|^stu|^s_|_s$|^s$|^outputs?$|^logits$|^y_?pred|^preds?$|^y_hat$",
    "labels": r"(?i)(^|_)(labels?|targets?)$|^(y|y_true|gt|gold)$",  # DistilBERT's lm_labels too
    "alpha": r"(?i)^(alpha|kd_alpha|alpha_kd|kd_weight|soft_weight|lambda_kd|kd_ratio|distill_weight)$",
    "mask": r"(?i)mask",
}
DIRECTIONS = {"forward": r"(?i)forward|fkl", "reverse": r"(?i)reverse|rkl|backward"}


def _roles(names: list[str]) -> dict[str, str | None]:
    """Each role -> the first argument whose name plays it (an argument plays one role)."""
    out: dict[str, str | None] = {}
    for role, pattern in ROLES.items():
        out[role] = next((n for n in names if re.search(pattern, n) and n not in out.values()), None)
    return out


def _directions(name: str) -> tuple[str, ...]:
    """The KL's direction(s) its name allows: the one it says, else either."""
    said = tuple(d for d, pattern in DIRECTIONS.items() if re.search(pattern, name))
    return said or tuple(DIRECTIONS)


class Loss:
    """The learner's loss called by its roles: a function, or a module built with (T, alpha)."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx, self.is_class = comp, ctx, isinstance(comp.obj, type)
        init = call_parameters(comp.obj.__init__, ("self",)) if self.is_class else []
        call = call_parameters(comp.obj.forward if self.is_class else comp.obj, ("self",))
        (self.init, init_required), (names, required) = names_of(init), names_of(call)
        self.roles = _roles(self.init + names)
        found = self.roles["student"] is not None and self.roles["teacher"] is not None
        cannot_fill(
            comp.name,
            required + init_required,
            set(self.roles.values()),
            found,
            "teacher",
            (
                "a distillation loss takes the student's and the teacher's logits (student_logits, "
                "teacher_logits, ...), optionally labels, a mask, a temperature (T, temperature) and a "
                "weight (alpha)",
                "蒸馏损失接受学生和教师的 logits（student_logits、teacher_logits 等），"
                "还可以有标签、掩码、温度（T、temperature）和权重（alpha）",
            ),
        )

    def T(self, given: float) -> float:
        """The temperature the loss softens by: the one given, 1 where it takes none."""
        return given if self.roles["T"] else 1.0

    def __call__(self, given: dict[str, Any]) -> Tensor:
        kwargs = {self.roles[r]: v for r, v in given.items() if self.roles.get(r)}
        init = {k: v for k, v in kwargs.items() if k in self.init}
        fn = (
            self.ctx.learner.call("__init__", lambda: self.comp.obj(**init))
            if self.is_class
            else self.comp.obj
        )
        call = {k: v for k, v in kwargs.items() if k not in init}
        out = fp.first_tensor(self.ctx.learner.call("forward", fn, **call))
        if out is None or out.numel() != 1:
            raise self.ctx.learner.fail(
                "forward", f"{self.comp.name} gave no single number", f"{self.comp.name} 没有返回一个数"
            )
        return out.reshape(())


def _inputs(tokens: bool) -> dict[str, Tensor]:
    """The student's and the teacher's logits, labels and the real-token mask: (B, C) and (B,), or
    (B, L, V) and (B, L) with each row padded after its length (labels -100 there)."""
    g = torch.Generator().manual_seed(4)
    shape = (len(LENGTHS), L) if tokens else (B,)
    s, t = (torch.randn(*shape, C, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    labels = torch.randint(0, C, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    for b, n in enumerate(LENGTHS if tokens else ()):
        mask[b, n:], labels[b, n:] = 0, -100
    return {"student": s, "teacher": t, "labels": labels, "mask": mask}


# the soft and the hard term's weights, by which of labels and alpha the loss takes: (en, zh, weights)
WEIGHTS = {
    (True, True): [
        ("alpha * soft + (1 - alpha) * hard", lambda a: (a, 1 - a)),
        ("(1 - alpha) * soft + alpha * hard", lambda a: (1 - a, a)),
        ("soft + alpha * hard", lambda a: (1, a)),
        ("alpha * soft + hard", lambda a: (a, 1)),
    ],
    (True, False): [("soft + hard", lambda a: (1, 1)), ("(soft + hard) / 2", lambda a: (0.5, 0.5))],
    (False, True): [("the soft term", lambda a: (1, 0)), ("alpha * the soft term", lambda a: (a, 0))],
    (False, False): [("the soft term", lambda a: (1, 0))],
}
Reading = tuple[str, bool, str, Any]  # direction, times T^2, the weights' words, the weights


def _readings(roles: dict[str, str | None], name: str) -> list[Reading]:
    """Every convention its arguments allow: T^2 required in a distillation loss (Hinton's), either in a
    divergence returned alone (`forward_kl(student, teacher, mask, T)`, scaled by its caller)."""
    labels = roles["labels"] is not None
    alone = roles["T"] is not None and not labels and not re.search(r"(?i)distill|kd", name)  # a divergence
    squares = (True, False) if alone else (True,)
    weights = WEIGHTS[labels, roles["alpha"] is not None]
    return [(d, sq, w, f) for d, sq, (w, f) in itertools.product(_directions(name), squares, weights)]


def views(x: dict[str, Tensor], T: float, alpha: float, reading: Reading) -> list[View]:
    """The reference's steps in one convention, the loss last."""
    direction, squared, _, weights = reading
    s, t, labels, real = x["student"], x["teacher"], x["labels"], x["mask"].double()
    ls, lt = F.log_softmax(s / T, -1), F.log_softmax(t / T, -1)
    lp, lq = (lt, ls) if direction == "forward" else (ls, lt)  # KL(p || q)
    each = lp.exp() * (lp - lq)  # (..., C)
    kl = each.sum(-1)  # (B,) or (B, L)
    soft = (kl * real).sum() / real.sum()
    scaled = soft * T**2 if squared else soft
    hard = F.cross_entropy(s.reshape(-1, C), labels.reshape(-1), ignore_index=-100)
    ws, wh = weights(alpha)
    out = [
        ("the student's logits", s),
        ("the teacher's logits", t),
        ("the student's logits / T", s / T),
        ("the teacher's logits / T", t / T),
        ("the teacher's softmax", lt.exp()),
        ("the teacher's log-softmax", lt),
        ("the student's softmax", ls.exp()),
        ("the student's log-softmax", ls),
        ("the KL's terms p (log p - log q)", each),
        ("the KL of each row", kl), ("the real-token mask", real),
        ("the KL, padding zeroed", kl * real),
        ("the KL summed", (kl * real).sum()),
    ]
    out += [("the KL averaged", soft)] * (not squared or wh == 0)  # beside a hard term: only times T^2
    return out + [
        ("the soft term", scaled),
        ("the hard labels' cross-entropy", hard),
        ("the soft term weighted", ws * scaled),
        ("the hard term weighted", wh * hard),
        ("the loss", ws * scaled + wh * hard),
    ]


def _given(x: dict[str, Tensor], T: float, alpha: float) -> dict[str, Any]:
    return {**{k: v.clone() for k, v in x.items()}, "T": T, "alpha": alpha}


def check_distill(comp: Component, ctx: Context) -> ComponentResult:
    """The loss at two (T, alpha) against every convention its arguments allow."""
    res = ctx.result(comp)
    loss = Loss(comp, ctx)
    x = _inputs(loss.roles["mask"] is not None)
    got = torch.stack([loss(_given(x, T, a)).double() for T, a in SETTINGS])
    want = lambda r: torch.stack([views(x, loss.T(T), a, r)[-1][1] for T, a in SETTINGS])  # noqa: E731
    errors = [(fp.relative_error(got, want(r)), r) for r in _readings(loss.roles, comp.name)]
    err, reading = min(errors, key=lambda e: e[0])
    ok = err < fp.REL_TOL
    res.max_abs_error = float((got - want(reading)).abs().max()) if ok else None
    direction, squared, weights, _ = reading
    said = (
        f"{direction} KL{' times T^2' if squared else ''}; {weights}",
        f"{'正向' if direction == 'forward' else '反向'} KL{'乘以 T^2' if squared else ''}；{weights}",
    )
    res.convention = text(*said) if ok else None
    at = ", ".join(f"T={T:g} alpha={a:g}" for T, a in SETTINGS)
    res.checks.append(
        Check(
            text(
                f"at {at}, the loss equals the KL of the softened distributions (summed over "
                "the classes, averaged over the rows or real tokens) in some convention",
                f"{at} 时，损失等于软化分布的 KL（对类别求和，对行或真实 token 求平均）在某种约定下的值",
            ),
            ok,
            None
            if ok
            else text(
                f"yours {_shown(got)}, nearest {_shown(want(reading))} ({said[0]})",
                f"你的 {_shown(got)}，最接近的 {_shown(want(reading))}（{said[1]}）",
            ),
        )
    )
    if not ok:
        note_departure(res, lambda: _localize(comp, loss, x, [r for _, r in errors]))
    return finish(res)


def _shown(values: Tensor) -> str:
    return ", ".join(f"{v:.5g}" for v in values.tolist())


def _localize(comp: Component, loss: Loss, x: dict[str, Tensor], readings: list[Reading]) -> Any:
    """The first line no convention explains, on the first setting, the logits traced."""
    T, alpha = SETTINGS[0]
    fn = comp.obj.forward if loss.is_class else comp.obj
    filename = inspect.getsourcefile(fn)
    traced = {**_given(x, T, alpha), **{k: x[k].clone().requires_grad_() for k in ("student", "teacher")}}
    steps = trace_steps(lambda: loss(traced), filename, None, (), constants=True)
    T = loss.T(T)
    z_dim = x["student"].dim()
    forms = [
        (form | {"mistake": "softmax_wrong_dim"}, r)
        for logits in (x["teacher"], x["student"])
        for op in (F.softmax, F.log_softmax)
        for form, r in over_axes("the softmax", "softmax", lambda d, op=op, z=logits: op(z / T, d), z_dim)
    ]
    sizes = {"T": T, "T^2": T * T, "alpha": alpha, "C": C, "B": x["mask"].size(0)}
    return latest_departure(
        steps, [views(x, T, alpha, r) for r in readings], filename, sizes, forms=forms, ends=True
    )
