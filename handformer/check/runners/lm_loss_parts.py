"""Runners of a language model's loss parts, each compared with its formula on random logits with
ignored targets (the ignore id the function defaults to, else -100; real targets of id 0 among them):

- a chunked cross-entropy (Liger's, torchtune's: the rows a chunk at a time, to save memory) against
  F.cross_entropy of all rows at once, at smoothing 0 and 0.1 where it takes one;
- PaLM's auxiliary z-loss, coef * mean over the real targets of logsumexp(logits)^2 (ST-MoE's router
  z-loss, with no targets, over every row); a coefficient it does not take is read on one batch
  and must hold on a second;
- the causal LM's shift (Hugging Face's): logits[:, :-1] scored against labels[:, 1:], flattened;
- the perplexity, exp of the mean cross-entropy (the labels shifted, or scored where they stand).

Where one departs, the first line whose value is none of the formula's steps is quoted.

Shape legend: B batch, T length, N = B * T rows, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import call_parameters, named, names_of
from handformer.check.core.context import Context, finish
from handformer.check.core.defaults import keyword
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import View, latest_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, Text, text
from handformer.check.runners.loss import INPUT_NAMES, SMOOTHING_NAMES, TARGET_NAMES

B, T, V, CHUNK = 3, 5, 7, 4  # N = 15 rows: chunks of 4, the last one short
IGNORED = (0, 1, 2, 13, 14)  # the flat rows whose target is ignored (the first chunk's, the last's)
ROLES: dict[str, tuple[str, ...]] = {
    "logits": INPUT_NAMES,
    "targets": TARGET_NAMES + ("shift_labels",),
    "ignore": ("ignore_index", "ignore_idx", "ignore_id", "pad_id", "pad_idx", "ignore", "pad_token_id"),
    "smoothing": SMOOTHING_NAMES,
    "coef": (
        "z_loss_coef",
        "coef",
        "z_coef",
        "z_loss_weight",
        "z_weight",
        "z_loss_scale",
        "weight",
        "z_loss_alpha",
        "zloss_coef",
        "coeff",
        "z_loss",
        "scale",
    ),
    "chunk": ("chunk_size", "chunk", "chunk_len", "chunk_rows", "rows_per_chunk", "block_size"),
}
# a z-loss's coefficient beside a chunked cross-entropy (one function returning both): 0 there
ROLES["z_coef"] = tuple(alias for alias in ROLES["coef"] if alias.startswith("z"))
CHUNKED = {"chunk": CHUNK, "z_coef": 0.0}  # a chunked cross-entropy's chunk, a z-loss beside it off
COEFS = (1e-3, 0.5)  # a coefficient it takes: read at two


def _roles(comp: Component, needs: tuple[str, ...]) -> tuple[dict[str, str | None], int]:
    """Each role -> the argument that takes it, and the ignore id it defaults to (-100 where none)."""
    params = call_parameters(comp.obj)
    names, required = names_of(params)
    roles = {role: named(names, aliases) for role, aliases in ROLES.items()}
    roles["logits"] = roles["logits"] or next(iter(names), None)
    cannot_fill(
        comp.name,
        required,
        set(roles.values()),
        all(roles[r] for r in needs),
        needs[-1],
        (
            "it takes logits and targets (logits, targets / labels), optionally ignore_index, "
            "label_smoothing, a coefficient and a chunk size",
            "它接受 logits 和目标（logits、targets / labels），还可以有 ignore_index、label_smoothing、"
            "系数和块大小",
        ),
    )
    default = next((p.default for p in params if p.name == roles["ignore"]), None)
    return roles, default if isinstance(default, int) and not isinstance(default, bool) else -100


def _batch(ignore: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(N, V) logits and (N,) targets, IGNORED rows set to the ignore id, real 0s among the rest."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B * T, V, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, V, (B * T,), generator=g)
    targets[3:6] = 0
    targets[list(IGNORED)] = ignore
    return logits, targets


def _call(ctx: Context, comp: Component, roles: dict[str, str | None], **given: Any) -> Any:
    """The function called with the values of the roles it takes, (N, V) rows first, (B, T, V) if
    those raise."""
    kwargs = {roles[r]: v for r, v in given.items() if roles.get(r)}
    try:
        return ctx.learner.call("forward", comp.obj, **kwargs)
    except fp.LearnerFailure:
        shaped = {
            k: (v.reshape(B, T, *v.shape[1:]) if isinstance(v, Tensor) else v) for k, v in kwargs.items()
        }
        return ctx.learner.call("forward", comp.obj, **shaped)


def _number(out: Any) -> float:
    out = out[0] if isinstance(out, (tuple, list)) and out else out
    return float(out.double().reshape(())) if isinstance(out, Tensor) and out.numel() == 1 else float(out)


def _judge(
    res: ComponentResult,
    comp: Component,
    got: Tensor,
    want: Tensor,
    said: Text,
    localize: Callable[[], Any],
    mistakes: dict[str, Tensor] | None = None,
) -> ComponentResult:
    """The check that its values are the formula's; on a difference, the line that departs, named
    as the catalogued mistake (`mistakes`: name -> the values with it) whose values it has."""
    err = fp.relative_error(got, want)
    ok = err < fp.REL_TOL
    res.max_abs_error = float((got - want).abs().max())
    shown = ", ".join(f"{g:.6g} (formula {w:.6g})" for g, w in zip(got.tolist(), want.tolist()))
    res.checks.append(Check(said, ok, None if ok else text(f"yours: {shown}", f"你的：{shown}")))
    if not ok:
        note_departure(res, localize)
        name = next((n for n, v in (mistakes or {}).items() if fp.relative_error(got, v) < fp.REL_TOL), None)
        res.findings = [dataclasses.replace(f, name=name or f.name) for f in res.findings]
    return finish(res)


def _departs(
    comp: Component, call: Callable[[Tensor], Any], x: Tensor, readings: list[list[View]], **sizes: float
) -> Any:
    """The first line no reading explains, x traced, the numbers it binds too (a count)."""
    filename = inspect.getsourcefile(comp.obj)
    steps = trace_steps(
        lambda: call(x.clone().requires_grad_()), filename, None, (), constants=True, scalars=True
    )
    return latest_departure(steps, readings, filename, sizes, ends=True)


def ce_views(logits: Tensor, targets: Tensor, ignore: int, eps: float) -> list[View]:
    """Cross-entropy's steps over the rows, and the running sums and counts of the chunks."""
    real = targets != ignore
    lse = torch.logsumexp(logits, -1)  # (N,)
    nll = lse - logits.gather(-1, targets.masked_fill(~real, 0)[:, None])[:, 0]
    each = ((1 - eps) * nll + eps * (lse - logits.mean(-1))) * real
    # chunks of rows, and chunks of positions (B, CHUNK) where the rows are (B, T): a loss over
    # hidden states that makes the logits of CHUNK positions at a time
    # (a z-loss beside it, at coefficient 0, sums log Z squared over the real targets the same way)
    z = lse.pow(2) * real
    chunked = (("", each.split(CHUNK), real.split(CHUNK), z.split(CHUNK)),
               (" of positions", each.reshape(B, T).split(CHUNK, 1), real.reshape(B, T).split(CHUNK, 1),
                z.reshape(B, T).split(CHUNK, 1)))
    running = [
        (f"the {what} of the first {i + 1} chunks{of}", sum(s.sum() for s in sums[: i + 1]).double())
        for of, losses, counts, zs in chunked
        for what, sums in (("loss", losses), ("real targets", counts), ("z-loss", zs))
        for i in range(len(sums))
    ]
    return [
        ("the logits", logits),
        ("nothing yet", torch.zeros((), dtype=torch.float64)),
        ("log Z = logsumexp", lse),
        ("-log p of the target", nll),
        ("the real targets", real),
        ("the per-row loss, ignored rows 0", each),
        *running,
        ("the mean over the real targets", each.sum() / real.sum()),
    ]


def check_chunked_ce(comp: Component, ctx: Context) -> ComponentResult:
    """The chunked loss against F.cross_entropy of every row at once."""
    res = ctx.result(comp)
    roles, ignore = _roles(comp, ("logits", "targets"))
    logits, targets = _batch(ignore)
    eps_all = (0.0, 0.1) if roles["smoothing"] else (0.0,)

    def run(x: Tensor, eps: float) -> Any:
        given = {"targets": targets.clone(), "ignore": ignore, "smoothing": eps, **CHUNKED}
        return _call(ctx, comp, roles, logits=x, **given)

    got = torch.tensor([_number(run(logits.clone(), e)) for e in eps_all], dtype=torch.float64)
    want = torch.stack(
        [F.cross_entropy(logits, targets, ignore_index=ignore, label_smoothing=e) for e in eps_all]
    )
    at = ", ".join(f"{e:g}" for e in eps_all)
    said = text(
        f"in chunks of {CHUNK} rows, at smoothing {at}, with {len(IGNORED)} of {B * T} targets "
        f"ignored ({ignore}), the loss equals F.cross_entropy of all rows at once",
        f"每块 {CHUNK} 行、平滑 {at}、{B * T} 个目标里 {len(IGNORED)} 个被忽略（{ignore}）时，"
        "损失等于一次算全部行的 F.cross_entropy",
    )
    eps = eps_all[-1]
    every = torch.stack(
        [
            F.cross_entropy(logits, targets, ignore_index=ignore, label_smoothing=e, reduction="sum")
            for e in eps_all
        ]
    ) / (B * T)  # divided by every target, the ignored too
    return _judge(
        res,
        comp,
        got,
        want,
        said,
        lambda: _departs(
            comp, lambda x: run(x, eps), logits, [ce_views(logits, targets, ignore, eps)], V=V, N=B * T
        ),
        {"loss_counts_padding": every},
    )


def z_views(logits: Tensor, real: Tensor, coef: float) -> list[View]:
    lse = torch.logsumexp(logits, -1)  # (N,)
    mean = (lse**2 * real).sum() / real.sum()
    return [
        ("the logits", logits),
        ("log Z = logsumexp", lse),
        ("log Z squared", lse**2),
        ("the real targets", real),
        ("log Z squared, ignored rows 0", lse**2 * real),
        ("summed", (lse**2 * real).sum()),
        ("the count of real targets", real.sum().double()),
        ("the mean", mean),
        ("times the coefficient", coef * mean),
    ]


def check_z_loss(comp: Component, ctx: Context) -> ComponentResult:
    """coef * mean(logsumexp(logits)^2) over the real targets (over every row where it takes none),
    at two coefficients it takes, or its own one read on one batch and held on a second."""
    res = ctx.result(comp)
    roles, ignore = _roles(comp, ("logits",))
    batches = [_batch(ignore, seed) for seed in (0, 1)]
    coefs = COEFS if roles["coef"] else (None, None)
    got = torch.tensor(
        [
            _number(_call(ctx, comp, roles, logits=x.clone(), targets=y.clone(), ignore=ignore, coef=c))
            for (x, y), c in zip(batches, coefs)
        ],
        dtype=torch.float64,
    )
    real = [
        (y != ignore if roles["targets"] else torch.ones_like(y, dtype=torch.bool)).double()
        for _, y in batches
    ]
    unit = torch.stack([z_views(x, r, 1.0)[-1][1] for (x, _), r in zip(batches, real)])
    own = float(got[0] / unit[0]) if not roles["coef"] else None
    scale = torch.tensor(COEFS if own is None else (own, own), dtype=torch.float64)
    summed = unit * torch.stack([r.sum() for r in real])  # a sum over the targets (Mesh TF's), not a mean
    how, unit = min((("mean", unit), ("sum", summed)), key=lambda u: fp.relative_error(got, scale * u[1]))
    said = _z_said(bool(roles["targets"]), own, how)
    (x, y), c = batches[-1], float(scale[-1])
    call = lambda t: _call(ctx, comp, roles, logits=t, targets=y.clone(), ignore=ignore, coef=coefs[-1])  # noqa: E731
    return _judge(
        res,
        comp,
        got,
        scale * unit,
        said,
        lambda: _departs(comp, call, x, [z_views(x, real[-1], c)], V=V, N=B * T),
    )


def _z_said(targets: bool, own: float | None, how: str) -> Text:
    over, over_zh = ("real targets", "真实目标") if targets else ("rows", "所有行")
    at, at_zh = (
        (f" at c = {COEFS[0]:g}, {COEFS[1]:g}", f"，c = {COEFS[0]:g}、{COEFS[1]:g}")
        if own is None
        else (f", c = {own:.4g} read on one batch, on a second",
              f"，c = {own:.4g} 在一批上读出，在第二批上成立")
    )
    return text(
        f"the z-loss equals c * {how}(logsumexp(logits)^2) over the {over}{at}",
        f"z-loss 等于 c * {how}(logsumexp(logits)^2)（对{over_zh}求{dict(mean='平均', sum='和')[how]}）"
        f"{at_zh}",
    )


def check_shift(comp: Component, ctx: Context) -> ComponentResult:
    """The shifted pair against logits[:, :-1] and labels[:, 1:] (flattened or not: their values)."""
    res = ctx.result(comp)
    roles, ignore = _roles(comp, ("logits", "targets"))
    x, y = _batch(ignore)
    logits, labels = x.reshape(B, T, V), y.reshape(B, T)
    out = ctx.learner.call(
        "forward", comp.obj, **{roles["logits"]: logits.clone(), roles["targets"]: labels.clone()}
    )
    parts = [t.detach() for t in out if isinstance(t, Tensor)] if isinstance(out, (tuple, list)) else []
    want = (logits[:, :-1].reshape(-1), labels[:, 1:].reshape(-1).double())
    got = [p.reshape(-1).double() for p in parts[:2]]
    apart = len(got) != 2 or any(g.shape != w.shape for g, w in zip(got, want))
    err = float("inf") if apart else max(float((g - w).abs().max()) for g, w in zip(got, want))
    res.max_abs_error = err
    res.checks.append(
        Check(
            text(
                "it gives logits[:, :-1] and labels[:, 1:] (position t scored on token t + 1)",
                "它给出 logits[:, :-1] 和 labels[:, 1:]（位置 t 对应 token t + 1）",
            ),
            err < 1e-6,
        )
    )
    if err >= 1e-6:
        note_departure(res, lambda: _shift_departs(comp, ctx, roles, logits, labels))
    return finish(res)


def _shift_departs(
    comp: Component, ctx: Context, roles: dict[str, str | None], logits: Tensor, labels: Tensor
) -> Any:
    filename = inspect.getsourcefile(comp.obj)
    steps = trace_steps(
        lambda: ctx.learner.call(
            "forward",
            comp.obj,
            # the labels as floats that need a gradient too: what is made of them is traced, a tuple's too
            **{roles["logits"]: logits.clone().requires_grad_(),
               roles["targets"]: labels.double().requires_grad_()},
        ),
        filename,
        None,
        (),
        constants=(torch.int64,),
    )
    labels = labels.double()  # the traced labels are read as float64
    views = [
        ("the logits", logits),
        ("the labels", labels),
        ("the logits but the last", logits[:, :-1]),
        ("the labels from position 1", labels[:, 1:]),
        ("flattened", logits[:, :-1].reshape(-1, V)),
        ("the labels flattened", labels[:, 1:].reshape(-1)),
    ]
    return latest_departure(steps, [views], filename, {"V": V, "T": T}, ends=False)


def check_perplexity(comp: Component, ctx: Context) -> ComponentResult:
    """exp of the mean cross-entropy over the real labels, the labels shifted or where they stand."""
    res = ctx.result(comp)
    roles, ignore = _roles(comp, ("logits", "targets"))
    x, y = _batch(ignore)
    logits, labels = x.reshape(B, T, V), y.reshape(B, T)
    got = torch.tensor(
        [
            _number(
                ctx.learner.call(
                    "forward",
                    comp.obj,
                    **{
                        roles["logits"]: logits.clone(),
                        roles["targets"]: labels.clone(),
                        **(keyword(roles["ignore"], ignore)),
                    },
                )
            )
        ],
        dtype=torch.float64,
    )
    forms = {"shifted": (logits[:, :-1], labels[:, 1:]), "where they stand": (logits, labels)}
    want = {
        k: F.cross_entropy(lg.reshape(-1, V), lb.reshape(-1), ignore_index=ignore).exp().reshape(1)
        for k, (lg, lb) in forms.items()
    }
    form = min(want, key=lambda k: fp.relative_error(got, want[k]))
    res.convention = text(f"the labels {form}", "标签" + ("错后一位" if form == "shifted" else "不移位"))
    said = text(
        "its log equals the mean cross-entropy over the real labels (it is exp of it)",
        "它的 log 等于真实标签上的平均交叉熵（它是后者的 exp）",
    )
    return _judge(res, comp, got.log(), want[form].log(), said, lambda: None)  # ~200: compared as logs
