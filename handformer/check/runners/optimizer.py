"""The runner of an optimizer written by hand: AdamW (the moments m and v, their bias correction, the
weight decay decoupled from the gradient), as a class built on the parameters with a `step()`
(a subclass of torch.optim.Optimizer as CS336 asks for it, or a plain class holding the parameters).

It is built with SETTINGS (each under the name its constructor gives it), stepped STEPS times on two
float64 parameters whose gradients are set before each step, and the parameters after each step are
compared with AdamW's under each convention: the decay before the Adam update (torch's AdamW) or
after it (the order CS336's algorithm writes), eps added after the bias correction (torch) or before
it (Kingma and Ba's efficient form: lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)).
When none matches, the named mistakes and their pairs are tried.

Shape legend: two parameters, (3, 4) and (4,).
"""

from __future__ import annotations

import inspect
import itertools
import math
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.argument_names import LR_NAMES, MODEL_NAMES, named, names_of, readable_parameters
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.neutral_settings import BY_WORD, settings_read
from handformer.check.core.result import (
    NOT_CHECKED,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.source import locate, source_lines
from handformer.check.runners import lion

# each apart, so a swap shows; eps large beside sqrt(v), so where it is added shows
SETTINGS = {"lr": 0.1, "beta1": 0.8, "beta2": 0.9, "eps": 0.05, "weight_decay": 0.5}
ALIASES = {"lr": LR_NAMES + ("alpha",), "beta1": ("beta1", "b1", "beta_1"),
           "beta2": ("beta2", "b2", "beta_2"),
           "eps": ("eps", "epsilon"),
           "weight_decay": ("weight_decay", "wd", "decay", "weight_decay_rate", "lambda_", "lam", "lmbda")}
STEPS = 3
FLAGS = ("adamw_no_bias_correction", "adamw_coupled_weight_decay", "adamw_eps_inside_sqrt",
         "adamw_beta2_for_m")
TOL = 1e-9
TRIED = [frozenset(c) for n in range(3) for c in itertools.combinations(FLAGS, n)]  # none, one, two mistakes
# (the decay after the Adam update, eps before the bias correction): what the report says
CONVENTIONS: dict[tuple[bool, bool], Text] = {
    (False, False): text("the decay before the update, eps after the bias correction (torch.optim.AdamW)",
                         "先衰减再更新，eps 加在偏差校正之后（torch.optim.AdamW）"),
    (True, False): text("the decay after the Adam update, eps after the bias correction",
                        "先做 Adam 更新再衰减，eps 加在偏差校正之后"),
    (False, True): text("the decay before the update, eps before the bias correction (Kingma and Ba's "
                        "efficient form: lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps))",
                        "先衰减再更新，eps 加在偏差校正之前（Kingma 和 Ba 的高效写法："
                        "lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)）"),
    (True, True): text("the decay after the Adam update, eps before the bias correction (CS336's algorithm)",
                       "先做 Adam 更新再衰减，eps 加在偏差校正之前（CS336 的算法）"),
}


def adamw(start: list[Tensor], grads: list[list[Tensor]], convention: tuple[bool, bool],
          flags: frozenset[str] = frozenset(), settings: dict[str, float] = SETTINGS) -> Tensor:
    """The parameters after each step of AdamW at `settings`, (STEPS, N) flattened, counted as
    `convention` counts, with the named mistakes."""
    params, moments = list(start), [(0.0, 0.0)] * len(start)
    out = []
    for t, step_grads in enumerate(grads, 1):
        for i, g in enumerate(step_grads):
            params[i], moments[i] = adamw_update(params[i], g, moments[i], t, convention, flags, settings)
        out.append(torch.cat([p.flatten() for p in params]))
    return torch.stack(out)  # (STEPS, N)


def adamw_update(p: Tensor, g: Tensor, moments: tuple[Any, Any], t: int, convention: tuple[bool, bool],
                 flags: frozenset[str], settings: dict[str, float]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One parameter's AdamW update at step t (from 1): the new parameter and moments (m, v), with the
    named mistakes (each a switch of 0 or 1 in the arithmetic)."""
    lr, b1, b2, eps, wd = settings.values()
    after, raw = convention
    on = dict.fromkeys(FLAGS, False) | dict.fromkeys(flags, True)
    coupled, bias = on["adamw_coupled_weight_decay"], not on["adamw_no_bias_correction"]
    beta, inside = b1 + on["adamw_beta2_for_m"] * (b2 - b1), on["adamw_eps_inside_sqrt"]
    g = g + coupled * wd * p  # Adam with L2: the decay inside the gradient
    m, v = beta * moments[0] + (1 - beta) * g, b2 * moments[1] + (1 - b2) * g * g
    c1, c2 = 1 - bias * b1 ** t, 1 - bias * b2 ** t
    vv = v / c2 ** (not raw)  # raw: eps before the correction, folded into the step size
    update = lr * c2 ** (0.5 * raw) / c1 * m / ((vv + inside * eps).sqrt() + (not inside) * eps)
    decay = lr * wd * (not coupled)
    return p * (1 - decay) - update * (1 - decay * after), (m, v)  # after: (p - update) * (1 - decay)


def settings_arguments(cls: Any) -> dict[str, Any]:
    """The constructor's settings, each under its name (betas as a pair); a DiscoveryError naming the
    first it does not take (its value is then a constant of its own, not one check can set)."""
    names = names_of(readable_parameters(cls))[0]
    lowered = {n.lower(): n for n in names[1:]}
    betas = lowered.get("betas")
    default = next((q.default for q in readable_parameters(cls) if q.name == betas), None)
    extra = tuple(default)[2:] if isinstance(default, tuple | list) else ()  # a third beta (AdEMAMix's): kept
    out: dict[Any, Any] = {betas: (SETTINGS["beta1"], SETTINGS["beta2"], *extra)}
    for key, aliases in ALIASES.items():
        name = next((lowered[a] for a in aliases if a in lowered), None)
        if name is None and key not in OPTIONAL[betas is not None]:
            raise _untaken(cls, key)
        out[name] = SETTINGS[key]
    out.pop(None, None)  # no betas taken, or a setting taken under no name of its own
    return out


# the settings a constructor may leave out, by whether it takes betas (beta1 and beta2 given as a pair)
OPTIONAL = {False: ("weight_decay",), True: ("weight_decay", "beta1", "beta2")}


def settings_taken(cls: Any) -> dict[str, float]:
    """SETTINGS, with no weight decay where the constructor takes none (Adam)."""
    names = {n.lower() for n in names_of(readable_parameters(cls))[0]}
    return SETTINGS | {"weight_decay": SETTINGS["weight_decay"] * bool(names & set(ALIASES["weight_decay"]))}


def _untaken(cls: Any, key: str) -> DiscoveryError:
    name = getattr(cls, "__name__", "optimizer")
    return DiscoveryError(
        f"{name}: it takes no {key} (nor betas for beta1 and beta2): check sets lr, betas, eps "
        "and weight_decay to tell AdamW's mistakes apart; take them as arguments, as "
        "torch.optim.AdamW(params, lr, betas, eps, weight_decay) does",
        zh=f"{name}：它不接受 {key}（beta1 和 beta2 也没有以 betas 给出）：check 要设置 lr、betas、"
           "eps 和 weight_decay 才能区分 AdamW 的错误；请像 torch.optim.AdamW(params, lr, betas, eps, "
           "weight_decay) 那样把它们作为参数")


def _data() -> tuple[list[Tensor], list[list[Tensor]]]:
    """Two parameters and their gradients at each step (seeded, float64)."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in ((3, 4), (4,))]
    grads = [[0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in start]
             for _ in range(STEPS)]
    return start, grads


def _stepped(comp: Component, ctx: Context, start: list[Tensor], grads: list[list[Tensor]]) -> Tensor:
    """The learner's optimizer built on copies of `start`, stepped once for each step's gradients: the
    parameters after each step, (STEPS, N)."""
    params = [nn.Parameter(p.clone()) for p in start]
    holder = nn.Module()  # a constructor that takes the model (`AdamW(model, lr)`) reads its parameters
    holder.params = nn.ParameterList(params)
    first = names_of(readable_parameters(comp.obj))[0][:1]
    given = holder if named(first, MODEL_NAMES) else params
    opt = ctx.learner.call("__init__", comp.obj, given, **settings_arguments(comp.obj))
    out = []
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        ctx.learner.call("forward", opt.step)
        out.append(torch.cat([p.detach().flatten() for p in params]))
    return torch.stack(out)


def check_optimizer(comp: Component, ctx: Context) -> ComponentResult:
    """A hand-written AdamW against AdamW's update under each convention; the mistakes that reproduce it
    named at their line."""
    if lion.takes_lion(comp.obj):
        settings = lion.settings_arguments(comp.obj)
        return lion.check_lion(comp, ctx, lambda ps: ctx.learner.call("__init__", comp.obj, ps, **settings))
    res = ComponentResult(comp.kind, comp.name)
    start, grads = _data()
    got, settings = _stepped(comp, ctx, start, grads), settings_taken(comp.obj)
    found = _search(got, start, grads, settings)
    convention, flags = found or ((False, False), frozenset())
    res.max_abs_error = _error(got, adamw(start, grads, convention, settings=settings))
    shown = ", ".join(f"{k} {v:g}" for k, v in settings.items())
    res.checks.append(Check(
        text(f"the parameters after each of {STEPS} steps equal AdamW's ({shown})",
             f"{STEPS} 步中每一步之后的参数都等于 AdamW 的（{shown}）"),
        res.max_abs_error < TOL,
        text(f"largest difference {res.max_abs_error:.3g}", f"最大误差 {res.max_abs_error:.3g}")))
    res.findings += [adamw_finding(ctx, comp, flag, res.max_abs_error) for flag in sorted(flags)]
    if found is not None:
        res.convention = CONVENTIONS[convention]
        return finish(res)
    marks = beyond_adamw(comp.obj)
    if marks or not settings_read(comp.obj):
        return _other_algorithm(res, marks, _departure(got, start, grads, settings))
    # graded again with its settings at their neutral values (core/neutral_settings.py)
    res.notes.append(text("no known mistake (or pair of them) reproduces your update",
                          "没有任何已知错误（或两个错误的组合）能复现你的更新"))
    return finish(res)


# what torch.optim.AdamW's constructor takes besides its settings
TORCH_FLAGS = ("params", "amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused")


def beyond_adamw(cls: Any) -> list[str]:
    """The settings its constructor takes and the methods it defines that AdamW has not (Schedule-Free's
    warmup_steps and train() / eval(), a third beta, a rank): the marks of another algorithm. A setting
    whose name has a neutral value (an update interval of 1) is not one: it is graded there
    (neutral_settings.py)."""
    known = {a for aliases in ALIASES.values() for a in aliases} | {"betas", *TORCH_FLAGS}
    names = names_of(readable_parameters(cls))[0][1:]
    settings = [n for n in names if n.lower() not in known and not set(n.lower().split("_")) & BY_WORD.keys()]
    return settings + [f"{m}()" for m in ("train", "eval") if m in vars(cls)]


def _other_algorithm(res: ComponentResult, marks: list[str], departure: Text) -> ComponentResult:
    """NOT CHECKED: an update no AdamW reading gives, under any convention or known mistake (ADOPT, a new
    optimizer): what check has no reference for, said by the form of its departure and the settings or
    methods AdamW has not."""
    shown = ", ".join(marks)
    takes = {True: f"it takes or defines what AdamW has not ({shown}), and "}.get(bool(marks), "")
    takes_zh = {True: f"它有 AdamW 没有的设置或方法（{shown}），"}.get(bool(marks), "")
    res.checks, res.findings, res.max_abs_error, res.status = [], [], None, NOT_CHECKED
    res.error = LearnerError(
        "mapping", f"{res.name} is not AdamW: {takes}its update is none of AdamW's under any convention or "
        f"known mistake ({departure['en']}); check has no reference for this optimizer (an adapter that "
        "builds it as plain AdamW, or a reference of your own, lets check grade it)", "",
        message_zh=f"{res.name} 不是 AdamW：{takes_zh}它的更新在任何约定、任何已知错误下都不等于 AdamW 的"
        f"（{departure['zh']}）；检查程序没有这个优化器的参考实现（写一个适配函数把它构造成普通的 AdamW，"
        "或者给出你自己的参考实现，检查程序就能判断）")
    return res


def _departure(got: Tensor, start: list[Tensor], grads: list[list[Tensor]], settings: dict[str, float],
               ) -> Text:
    """The form of an update's departure from AdamW's (torch's convention): the first step at which
    it parts, and whether its first step leaves the parameters where they were (a state filled from
    the first gradient alone, as ADOPT's is)."""
    right = adamw(start, grads, (False, False), settings=settings)  # (STEPS, P)
    step = next(i for i in range(STEPS) if _error(got[i:i + 1], right[i:i + 1]) >= TOL) + 1
    held = torch.equal(got[0], torch.cat([p.detach().flatten() for p in start]))
    still = ("; its first step leaves the parameters where they were: its state is filled from the first "
             "gradient alone", "；第一步没有移动参数：它的状态只用第一个梯度填充")
    return text(f"it parts from AdamW's at step {step} of {STEPS}" + still[0] * held,
                f"共 {STEPS} 步，从步骤 {step} 起与 AdamW 不同" + still[1] * held)


def _error(got: Tensor, right: Tensor) -> float:
    """The largest difference of the parameters after any step (a NaN or an infinity: inf)."""
    return float((got - right).abs().max().nan_to_num(math.inf, posinf=math.inf))


Found = tuple[tuple[bool, bool], frozenset[str]]  # (the convention, the mistakes)


def _search(got: Tensor, start: list[Tensor], grads: list[list[Tensor]], settings: dict[str, float],
            ) -> Found | None:
    """The convention and the mistakes (none first, then one, then two) that give the learner's
    parameters; None when none does."""
    readings = itertools.product(TRIED, CONVENTIONS)
    return next(((convention, flags) for flags, convention in readings
                 if _error(got, adamw(start, grads, convention, flags, settings)) < TOL), None)


def adamw_finding(ctx: Context, comp: Component, name: str, error: float, steps: int = STEPS) -> Finding:
    number, code = locate(name, source_lines(_own_code(comp.obj)))
    observed = text(f"your parameters after each of {steps} steps equal AdamW's with this mistake (to 1e-9); "
                    f"they differ from AdamW's by up to {error:.3g}",
                    f"你的参数在 {steps} 步中的每一步之后都等于带这个错误的 AdamW 的（误差 < 1e-9）；"
                    f"与正确的 AdamW 最多相差 {error:.3g}")
    return Finding(name, observed, number, code)


def _own_code(cls: Any) -> list[Any]:
    """The optimizer's step, then the rest of its class (the line of a mistake is in its update)."""
    step = inspect.getattr_static(cls, "step", None)
    return [f for f in (getattr(step, "__wrapped__", step), cls) if f is not None]
