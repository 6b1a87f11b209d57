"""The runner of a LoRA layer (Hu et al. 2021; loralib, PEFT, Raschka's LinearWithLoRA): a Linear of
weight W (out, in) and bias b, with low-rank factors A (r, in) and B (out, r), whose output is
b + x W^T + s * x A^T B^T, s the scaling (alpha / r in the paper).

The layer is built around a random Linear (handed to it, or built by it from in/out features), its
factors set to random values (B is zero at init: the update would be invisible), and compared with
that formula under each scaling a tutorial writes (alpha / r; alpha, Raschka's; alpha / sqrt(r),
rsLoRA's; the scale it is handed; 1 where it takes none). Then, where it has them, merge() must
leave its output as it was, and unmerge() must give back W. A layer that computes the update alone
(Raschka's LoRALayer, added outside) is read so. What departs is quoted: the line holding a wrong
scaling, or the line of merge() / unmerge() that wrote the weight.

Shape legend: N tokens, I in features, O out features, r rank.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import call_parameters, named, names_of
from handformer.check.core.context import Context, check_determinism, error_text, finish
from handformer.check.core.defaults import then
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.writers import written_at

I, O, R, ALPHA, SCALE = 6, 5, 2, 6.0, 3.0  # alpha / r = 3, alpha / sqrt(r) = 4.24, r / alpha = 1 / 3
ROLES: dict[str, tuple[str, ...]] = {
    "base": (
        "base",
        "base_layer",
        "linear",
        "layer",
        "original",
        "original_layer",
        "orig",
        "module",
        "base_linear",
        "pretrained",
        "fc",
        "original_linear",
        "wrapped",
        "proj",
        "linear_layer",
    ),
    "in": ("in_features", "in_dim", "d_in", "input_dim", "fan_in", "in_dims", "in_channels", "dim_in"),
    "out": (
        "out_features",
        "out_dim",
        "d_out",
        "output_dim",
        "fan_out",
        "out_dims",
        "out_channels",
        "dim_out",
    ),
    "r": ("r", "rank", "lora_r", "lora_rank", "lora_dim", "rank_r"),
    "alpha": ("alpha", "lora_alpha"),
    "scale": ("scale", "scaling", "lora_scale", "lora_scaling"),
    "dropout": ("dropout", "lora_dropout", "p", "dropout_p", "drop", "dropout_rate"),
}
VALUES = {"in": I, "out": O, "r": R, "alpha": ALPHA, "scale": SCALE, "dropout": 0.5}  # dropout graded in eval
# the scalings a tutorial writes, by the argument that says it: (en, zh, s)
SCALINGS: dict[str, list[tuple[str, str, float]]] = {
    "alpha": [
        (
            "alpha / r (the LoRA paper's, loralib's, PEFT's)",
            "alpha / r（LoRA 论文、loralib、PEFT 的写法）",
            ALPHA / R,
        ),
        ("alpha (Raschka's LinearWithLoRA)", "alpha（Raschka 的 LinearWithLoRA）", ALPHA),
        ("alpha / sqrt(r) (rsLoRA's)", "alpha / sqrt(r)（rsLoRA 的写法）", ALPHA / math.sqrt(R)),
    ],
    "scale": [("the scale it is handed", "传入的 scale", SCALE)],
    "": [("1 (it takes no alpha and no scale)", "1（它不接受 alpha 也不接受 scale）", 1.0)],
}
MERGES = ("merge", "merge_weights", "merge_lora", "fuse", "merge_lora_weights", "merge_weight")
UNMERGES = ("unmerge", "unmerge_weights", "unmerge_lora", "unfuse", "unmerge_lora_weights", "unmerge_weight")
TOL = 1e-5


def _roles(cls: type) -> dict[str, str | None]:
    """Each role -> the constructor's argument that takes it; cannot_fill where one it requires
    plays none, or where it takes neither a Linear nor its sizes."""
    names, required = names_of(call_parameters(cls.__init__, ("self",)))
    roles = {role: named(names, aliases) for role, aliases in ROLES.items()}
    found = roles["base"] is not None or (roles["in"] is not None and roles["out"] is not None)
    cannot_fill(
        cls.__name__,
        required,
        set(roles.values()),
        found,
        "base",
        (
            "a LoRA layer takes the Linear it wraps (base, linear, ...) or its sizes (in_features, "
            "out_features), a rank (r, rank) and optionally alpha (alpha, lora_alpha) and dropout",
            "LoRA 层接受它包装的 Linear（base、linear 等）或它的大小（in_features、out_features），"
            "秩（r、rank），还可以有 alpha（alpha、lora_alpha）和 dropout",
        ),
    )
    return roles


def _build(comp: Component, ctx: Context, roles: dict[str, str | None]) -> tuple[nn.Module, nn.Module | None]:
    """The layer around a random Linear (I -> O), and that Linear (None: the layer holds none of
    that shape, it computes the update alone)."""
    torch.manual_seed(0)
    given = nn.Linear(I, O)
    kwargs = {name: (given if role == "base" else VALUES[role]) for role, name in roles.items() if name}
    layer = ctx.learner.call("__init__", lambda: comp.obj(**kwargs))
    bases = [m for m in [layer, *layer.modules()] if isinstance(m, nn.Linear) and m.weight.shape == (O, I)]
    return layer, (bases or [None])[0]


def _factors(layer: nn.Module, base: nn.Module | None) -> tuple[Tensor, Tensor, bool] | None:
    """The low-rank factors (A, B) it holds, set to random values in place, and whether they are laid
    out (I, r), (r, O) (x @ A @ B) rather than (r, I), (O, r); None where no two such parameters are."""
    own = {id(p) for p in (base.weight, base.bias) if p is not None} if base is not None else set()
    mats = [p for p in layer.parameters() if p.dim() == 2 and id(p) not in own]
    for a, b, flipped in ((a, b, f) for a in mats for b in mats for f in (False, True)):
        if (a.shape, b.shape) == (((R, I), (O, R)), ((I, R), (R, O)))[flipped]:
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for p in (a, b):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            return a, b, flipped
    return None


def _update(a: Tensor, b: Tensor, flipped: bool) -> Tensor:
    """(O, I) the unscaled update B A."""
    return (a @ b).T.detach() if flipped else (b @ a).detach()


def check_lora(comp: Component, ctx: Context) -> ComponentResult:
    """Its output against the formula under each scaling, then merge() and unmerge() where it has them."""
    res = ctx.result(comp)
    roles = _roles(comp.obj)
    layer, base = _build(comp, ctx, roles)
    factors = _factors(layer, base) if isinstance(layer, nn.Module) else None
    if factors is None:
        return _unread(res, comp)
    x = torch.randn(4, I, generator=torch.Generator().manual_seed(2))  # (N, I)
    weight = then(base, lambda b: b.weight.detach().clone())
    plain = torch.zeros(4, O) if base is None else F.linear(x, base.weight, base.bias).detach()  # (N, O)
    layer.eval()  # built with dropout 0.5: two eval runs that differ leave it on (dropout_in_eval)
    check_determinism(res, ctx, comp, lambda: _out(ctx, layer, x), "lora")
    with torch.no_grad(), fp.dropout_off():
        y = _out(ctx, layer, x)
        update = x @ _update(*factors).T  # (N, O) unscaled
        _scaling(res, layer, y - plain, update, roles)
        for check in (_merged, _unmerged):  # unmerge() is judged after a merge() that held
            check(res, ctx, layer, base, x, y, weight) if not res.findings else None
    return finish(res)


def _out(ctx: Context, layer: nn.Module, x: Tensor) -> Tensor:
    out = fp.first_tensor(ctx.learner.call("forward", layer, x.clone()))
    if out is None or tuple(out.shape) != (x.size(0), O):
        raise ctx.learner.fail(
            "forward",
            f"a LoRA layer maps (N, {I}) to (N, {O}); it gave {then(out, lambda o: tuple(o.shape))}",
            f"LoRA 层把 (N, {I}) 映射到 (N, {O})；它给出了 {then(out, lambda o: tuple(o.shape))}",
        )
    return out.detach().float()


def _unread(res: ComponentResult, comp: Component) -> ComponentResult:
    from handformer.check.core.result import NOT_CHECKED, LearnerError

    res.status = NOT_CHECKED
    res.error = LearnerError(
        "cannot_call",
        f"{comp.name}: no two low-rank factors of shapes (r, in) and "
        "(out, r), or (in, r) and (r, out), found beside the Linear it wraps",
        "__init__",
        message_zh=f"{comp.name}：在它包装的 Linear 之外没有找到形状为 "
        "(r, in) 和 (out, r)（或 (in, r) 和 (r, out)）的两个低秩因子",
    )
    return res


def _scaling(
    res: ComponentResult, layer: nn.Module, delta: Tensor, update: Tensor, roles: dict[str, str | None]
) -> None:
    """The update it adds against the unscaled one under each scaling its arguments allow; a wrong
    scaling quoted at the line that holds it."""
    which = "alpha" if roles["alpha"] else "scale" if roles["scale"] else ""
    errors = [(en, zh, s, fp.relative_error(delta, s * update)) for en, zh, s in SCALINGS[which]]
    en, zh, s, err = min(errors, key=lambda e: e[3])
    ok = err < TOL
    res.max_abs_error = float((delta - s * update).abs().max())
    if ok:
        res.convention = text(f"the update scaled by {en}", f"更新量乘以 {zh}")
    res.checks.append(
        Check(
            text(
                f"with the factors set to random values, the output equals the Linear's "
                f"plus s * x A^T B^T, s = {en} = {s:g}",
                f"低秩因子设为随机值时，输出等于 Linear 的输出加上 s * x A^T B^T，s = {zh} = {s:g}",
            ),
            ok,
            None if ok else error_text(res.max_abs_error),
        )
    )
    if not ok:
        seen = float((delta * update).sum() / (update * update).sum())  # the scaling it applies, if any
        held = fp.relative_error(delta, seen * update) < TOL
        res.findings += [_held_at(layer, seen, s)] if held else []


def _held_at(layer: nn.Module, seen: float, want: float) -> Finding:
    """The finding of a wrong scaling: the line that sets the attribute holding it (else none)."""
    attr = next(
        (
            k
            for k, v in vars(layer).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isclose(v, seen, rel_tol=1e-4)
        ),
        None,
    )
    lines, start = inspect.getsourcelines(type(layer))
    at = next(
        (
            (start + i, c.strip())
            for i, c in enumerate(lines)
            if attr and f"self.{attr} =" in c.replace(f"self.{attr}=", f"self.{attr} =")
        ),
        (None, None),
    )
    return Finding(
        DEPARTS,
        text(f"the update is scaled by {seen:.4g}, not {want:g}", f"更新量乘的是 {seen:.4g}，不是 {want:g}"),
        *at,
    )


def _method(layer: nn.Module, names: tuple[str, ...]) -> Any:
    """Its first method of these names that a call with no arguments fills (None: it has none)."""
    for name in names:
        fn = getattr(layer, name, None)
        if callable(fn) and not names_of(call_parameters(fn))[1]:
            return fn
    return None


def _merged(
    res: ComponentResult,
    ctx: Context,
    layer: nn.Module,
    base: nn.Module | None,
    x: Tensor,
    y: Tensor,
    weight: Tensor | None,
) -> None:
    """merge(), then forward: the output it gave unmerged (on the layer, or on the module merge returns)."""
    merge = _method(layer, MERGES)
    if merge is None:
        return
    given: list[Any] = []
    wrote = _writes(ctx, lambda: given.append(merge()), merge, base)
    after = given[0] if given and isinstance(given[0], nn.Module) else layer
    _same(
        res,
        ctx,
        after,
        x,
        y,
        merge,
        wrote,
        text(
            f"after {merge.__name__}(), the output is the unmerged one (W + s B A folded in)",
            f"{merge.__name__}() 之后输出与合并前相同（W + s B A 合进了权重）",
        ),
    )


def _unmerged(
    res: ComponentResult,
    ctx: Context,
    layer: nn.Module,
    base: nn.Module | None,
    x: Tensor,
    y: Tensor,
    weight: Tensor | None,
) -> None:
    """unmerge() after merge(): W given back, and the output unmerged."""
    unmerge = _method(layer, UNMERGES)
    if unmerge is None or _method(layer, MERGES) is None or base is None:
        return
    wrote, name = _writes(ctx, unmerge, unmerge, base), unmerge.__name__
    err = float((base.weight.detach() - weight).abs().max())
    res.max_abs_error = max(res.max_abs_error or 0.0, err)
    said = text(f"after {name}(), the Linear's weight is W again", f"{name}() 之后 Linear 的权重回到 W")
    res.checks.append(Check(said, err < TOL, None if err < TOL else error_text(err)))
    if err >= TOL:
        left = text(f"{name}() leaves the weight {err:.3g} from W", f"{name}() 之后权重与 W 相差 {err:.3g}")
        res.findings.append(_at(unmerge, wrote, left))
        return
    said = text(f"after {name}(), the output is the unmerged one", f"{name}() 之后输出与合并前相同")
    _same(res, ctx, layer, x, y, unmerge, wrote, said)


def _writes(ctx: Context, run: Any, fn: Any, base: nn.Module | None) -> list[tuple[int, str]]:
    """Run the method; the lines of the learner's file that changed the Linear's weight."""
    watch = (lambda: base.weight) if base is not None else (lambda: torch.zeros(()))
    own = inspect.unwrap(getattr(fn, "__func__", fn))  # a method under @torch.no_grad(): its own file
    return written_at(lambda: ctx.learner.call(own.__name__, run), own, watch)


def _same(
    res: ComponentResult,
    ctx: Context,
    module: nn.Module,
    x: Tensor,
    y: Tensor,
    fn: Any,
    wrote: list[tuple[int, str]],
    said: Text,
) -> None:
    err = float((_out(ctx, module, x) - y).abs().max())
    res.max_abs_error = max(res.max_abs_error or 0.0, err)
    res.checks.append(Check(said, err < TOL * 10, None if err < TOL * 10 else error_text(err)))
    if err >= TOL * 10:
        res.findings.append(_at(fn, wrote, text(f"the output moved by {err:.3g}", f"输出变了 {err:.3g}")))


def _at(fn: Any, wrote: list[tuple[int, str]], observed: Text) -> Finding:
    """A finding at the last line of fn's run that wrote the weight, else at fn's first line."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))  # a method under @torch.no_grad(): its own lines
    lines, start = inspect.getsourcelines(fn)
    body = [
        (start + i, c.strip()) for i, c in enumerate(lines) if c.strip() and not c.strip().startswith("@")
    ]
    line, code = (wrote or body[:1] or [(None, None)])[-1]
    return Finding(DEPARTS, observed, line, code)
