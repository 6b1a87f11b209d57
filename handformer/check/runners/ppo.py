"""Runners of PPO's two computations as RLHF trainers write them (TRL's PPOTrainer, OpenRLHF's
loss functions, CleanRL's loop): generalized advantage estimation, `compute_gae(values, rewards, mask,
gamma, lam)` returning the advantages (maybe whitened) and the returns, and the clipped surrogate
policy loss, `ppo_policy_loss(logprobs, old_logprobs, advantages, mask, cliprange)`.

Each is handed random inputs by the roles its parameters' names say (every token real where it takes
a mask, so that no masking convention matters) and compared with the formulas: GAE's backward
recursion A_t = delta_t + gamma * lam * A_{t+1}, delta_t = r_t + gamma * V_{t+1} - V_t (no value after
the last token), returns A + V; the loss max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)) averaged,
ratio = exp(logprobs - old_logprobs); a loss that takes two ranges (DAPO's clip-higher) is handed two
different ones, clip(ratio, 1 - low, 1 + high). Where they differ, the first line whose value is none of the
reference's steps is quoted. A parameter whose role its name does not say leaves it NOT CHECKED.

Shape legend: B rows (sequences), T tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.localize import View, first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, Text, text
from handformer.check.core.settings_argument import role_of as _role
from handformer.check.core.settings_argument import roles_held, settings_note, settings_object

B, T, TOL = 3, 6, 1e-5
GAMMA, LAM, CLIP = 0.9, 0.8, 0.2
CLIPS = (0.2, 0.1, 0.3)  # the ranges tried where the loss takes none: the ones trainers default to
# a parameter's role by the words of its name, tried in order (old before the new log-probabilities)
GAE_ROLES = {"gamma": "gamma|discount", "lam": "lam|lmbda|lambd", "mask": "mask", "values": "value|vpred",
             "rewards": "reward"}
LOSS_ROLES = {"clip_low": "(clip|eps).*low|low.*(clip|eps)", "clip_high": "(clip|eps).*high|high.*(clip|eps)",
              "clip": "clip|eps", "mask": "mask", "old": "old", "advantages": "adv",
              "logprobs": "logp|log_p|logprob|log_prob"}
SETTINGS = "settings "  # the key in `given` of an object handed an argument that settings are read off
CLIP_HIGH = 0.3  # the upper range handed where the loss takes two (DAPO's clip-higher: 1 - low to 1 + high)


def arguments_by_role(comp: Component, roles: dict[str, str], given: dict[str, Any], needed: tuple[str, ...],
               ) -> dict[str, str]:
    """The role of each argument check hands, by the parameter's name; a required parameter of no
    role leaves the function NOT CHECKED (check cannot say what to hand it), and so does one that takes
    no parameter for a role `needed` (GAE's gamma: the value it uses is written inside it)."""
    out, said, held = {}, ", ".join(roles), set()
    for p in forward_parameters(comp.obj):
        role = _role(p.name, roles)
        settings = settings_object(comp.obj, p.name, roles, given)
        if role in given:
            out[p.name] = role
        elif settings is not None:  # cfg.group_size: an object answering what it reads (settings_argument.py)
            out[p.name], given[SETTINGS + p.name] = SETTINGS + p.name, settings
            held |= roles_held(comp.obj, p.name, roles)
        elif p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise DiscoveryError(
                f"{comp.name}: cannot fill the argument '{p.name}'; it takes, by their names, {said}",
                f"{comp.name}：无法填写参数 '{p.name}'；它按参数名接受 {said}")
    missing = ", ".join(sorted(set(needed) - set(out.values()) - held))
    if missing:
        raise DiscoveryError(f"{comp.name}: it takes no {missing}: check cannot know what it uses",
                             f"{comp.name}：它不接受 {missing} 参数：check 无法知道它用的值")
    return out


def settings_notes(comp: Component, roles: dict[str, str], table: dict[str, str], given: dict[str, Any],
                   ) -> list[Text]:
    """What each argument handed a settings object (`arguments_by_role`) was handed."""
    return [settings_note(comp.obj, name, given[role], table, given) for name, role in roles.items()
            if role.startswith(SETTINGS)]


def called_by_role(ctx: Context, comp: Component, roles: dict[str, str], given: dict[str, Any],
            layout: Callable[[Tensor], Tensor] = lambda x: x) -> Callable[..., Any]:
    """Their function called with each argument by its role, the tensors copied and laid out; roles
    given as keywords replace the inputs (the ones the localizer traces)."""
    def call(**over: Tensor) -> Any:
        handed = {**given, **over}
        laid = {r: layout(x.clone()) if isinstance(x, Tensor) else x for r, x in handed.items()}
        return ctx.learner.call("forward", comp.obj, **{n: laid[r] for n, r in roles.items()})
    return call


def tensors_of(out: Any) -> list[Tensor]:
    items = fp.outputs(out)
    return [t.detach().double() for t in items if isinstance(t, Tensor)]


def gae_steps(values: Tensor, rewards: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """The TD errors delta (B, T) and GAE's advantages (B, T), by the backward recursion."""
    nxt = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)  # no value after the last
    deltas = rewards + gamma * nxt - values
    adv, last = torch.zeros_like(deltas), torch.zeros_like(deltas[:, 0])
    for t in reversed(range(deltas.size(1))):
        last = deltas[:, t] + gamma * lam * last
        adv[:, t] = last
    return deltas, adv


def whitened(x: Tensor) -> list[Tensor]:
    """x less its mean over its variance's square root, the variance unbiased (TRL's masked_whiten) or not."""
    return [(x - x.mean()) / (x.var(unbiased=u) + 1e-8).sqrt() for u in (True, False)]


def gae_views(values: Tensor, rewards: Tensor, gamma: float, lam: float) -> list[View]:
    deltas, adv = gae_steps(values, rewards, gamma, lam)
    columns = [(f"{name} at token {t}", x[:, t]) for t in range(T) for name, x in
               (("the value", values), ("the reward", rewards), ("delta", deltas), ("the advantage", adv))]
    # the advantages filled in place from the last token back (CleanRL's `advantages[t] = lastgaelam`)
    filled = [(f"the advantages from token {t} on", adv * (torch.arange(T) >= t)) for t in range(T)]
    return [("the values", values), ("the rewards", rewards), ("the next values", deltas - rewards + values),
            ("the TD errors", deltas), *columns, *filled, ("the returns", adv + values),
            *zip(["the whitened advantages"] * 2, whitened(adv))]


def _gae_inputs() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    return {"values": torch.randn(B, T, generator=g, dtype=torch.float64),
            "rewards": torch.randn(B, T, generator=g, dtype=torch.float64),
            "mask": torch.ones(B, T, dtype=torch.float64), "gamma": GAMMA, "lam": LAM}


def _gae_error(outs: list[Tensor], values: Tensor, rewards: Tensor, gamma: float, lam: float) -> float:
    """How far the outputs are from the advantages (plain or whitened) and, where it returns a second
    tensor, from the returns A + V too."""
    adv = gae_steps(values, rewards, gamma, lam)[1]
    wanted = [[adv, *whitened(adv)], [adv + values]][:len(outs[:2])]
    return max((min(apart(t, w) for t in outs for w in forms) for forms in wanted), default=float("inf"))


def apart(got: Tensor, want: Tensor) -> float:
    """The largest difference of two tensors of one shape; inf for two shapes."""
    return (got - want).abs().max().item() if got.shape == want.shape else float("inf")


def check_gae(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    given = _gae_inputs()
    roles = arguments_by_role(comp, GAE_ROLES, given, ("gamma", "lam", "values", "rewards"))
    values, rewards = given["values"], given["rewards"]
    calls = {layout: called_by_role(ctx, comp, roles, given, layout) for layout in (_same, _time_major)}
    errors = {layout: _gae_error(list(map(layout, tensors_of(out))), values, rewards, GAMMA, LAM)
              for layout, out in _outputs(calls).items()}
    layout = min(errors, key=errors.get)  # its layout: the one that explains it best
    res.max_abs_error = err = errors[layout]
    res.notes += [TIME_MAJOR] * (layout is _time_major)
    res.checks.append(Check(GAE_CHECK, err < TOL, error_text(err)))
    if err >= TOL:
        views = [(what, layout(v)) for what, v in gae_views(values, rewards, GAMMA, LAM)]
        traced = {"values": values, "rewards": rewards}
        note_departure(res, lambda: _localize(comp, calls[layout], traced, views))
    return finish(res)


def _outputs(calls: dict[Callable[[Tensor], Tensor], Callable[..., Any]]) -> dict[Any, Any]:
    """What it returns in each layout its code runs in; the learner's exception where it runs in none."""
    outs = {layout: out for layout, out in ((layout, fp.quietly(call)) for layout, call in calls.items())
            if out is not None}
    return outs or {_same: next(iter(calls.values()))()}  # raises again, as their error


GAE_CHECK = text(
    f"gamma={GAMMA:g}, lam={LAM:g}: the advantages (plain or whitened) and the returns equal GAE's "
    "backward recursion A_t = delta_t + gamma * lam * A_(t+1), delta_t = r_t + gamma * V_(t+1) - V_t, "
    "returns A + V",
    f"gamma={GAMMA:g}，lam={LAM:g}：优势（原样或白化后）与回报和 GAE 的反向递推一致："
    "A_t = delta_t + gamma * lam * A_(t+1)，delta_t = r_t + gamma * V_(t+1) - V_t，回报 A + V")


TIME_MAJOR = text("it takes its inputs time first, (T, B): compared so",
                  "它的输入时间维在前，(T, B)：按此比较")


def _same(x: Tensor) -> Tensor:
    return x


def _time_major(x: Tensor) -> Tensor:
    return x.T if x.dim() == 2 else x


def policy_views(logprobs: Tensor, old: Tensor, adv: Tensor, clip: tuple[float, float]) -> list[View]:
    """The reference's steps, the ratio clipped to 1 - low .. 1 + high (clip: (low, high))."""
    ratio = (logprobs - old).exp()
    clipped = ratio.clamp(1 - clip[0], 1 + clip[1])
    per = torch.max(-adv * ratio, -adv * clipped)
    return [("the log-ratio", logprobs - old), ("the ratio", ratio), ("the clipped ratio", clipped),
            ("ratio * A", ratio * adv), ("clipped ratio * A", clipped * adv), ("-A * ratio", -adv * ratio),
            ("-A * clipped ratio", -adv * clipped), ("the smaller surrogate", -per),
            ("the token losses", per), ("each row's mean", per.mean(-1)), ("the loss", per.mean())]


def _loss_inputs() -> dict[str, Any]:
    g = torch.Generator().manual_seed(11)
    logprobs = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logprobs + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)  # ratios of 0.6 to 1.6
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    return {"logprobs": logprobs, "old": old, "advantages": adv, "mask": mask, "clip": CLIP,
            "clip_low": CLIP, "clip_high": CLIP_HIGH}


def _ranges(roles: set[str]) -> list[tuple[float, float]]:
    """The (low, high) ranges compared: the two it is handed, the one, or (none handed) each of CLIPS."""
    if {"clip_low", "clip_high"} <= roles:
        return [(CLIP, CLIP_HIGH)]
    return [(CLIP, CLIP)] if roles & {"clip", "clip_low", "clip_high"} else [(c, c) for c in CLIPS]


def _eps(clip: tuple[float, float]) -> str:
    return f"eps={clip[0]:g}" if clip[0] == clip[1] else f"eps low={clip[0]:g}, high={clip[1]:g}"


def check_policy_loss(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    given = _loss_inputs()
    roles = arguments_by_role(comp, LOSS_ROLES, given, ("logprobs", "old", "advantages"))
    clips = _ranges(set(roles.values()))
    lp, old = given["logprobs"], given["old"]
    tried = [(clip, spread, _policy_error(ctx, comp, roles, {**given, "advantages": adv}, spread, clip))
             for adv, spread in _advantage_forms(given["advantages"]) for clip in clips]
    clip, adv, (err, call) = min(tried, key=lambda t: t[2][0])
    if err == float("inf"):  # it raises on every form: the token form again, their error
        tried[0][2][1]()
    res.max_abs_error = err
    res.notes += [PER_SEQUENCE] * (tried[0][1] is not adv)
    res.checks.append(Check(text(
        f"{_eps(clip)}: the loss equals PPO's clipped surrogate, max(-A * ratio, -A * clip(ratio, 1 - eps, "
        "1 + eps)) averaged, ratio = exp(logprobs - old_logprobs)",
        f"{_eps(clip)}：损失与 PPO 的裁剪代理目标一致：max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)) "
        "取平均，ratio = exp(logprobs - old_logprobs)"), err < TOL, error_text(err)))
    if err >= TOL:
        views = policy_views(lp, old, adv, clip)
        note_departure(res, lambda: _localize(comp, call, {"logprobs": lp}, views))
    return finish(res)


PER_SEQUENCE = text("it takes one advantage a sequence (B,), spread over its tokens: compared so",
                    "它的优势是每个序列一个 (B,)，铺到序列的每个 token 上：按此比较")


# one advantage a sequence (B,), of the signs at which both ends of the range show on _loss_inputs'
# ratios: negative on row 0 (ratios under 1 - eps), positive on row 2 (ratios over 1 + eps)
SEQUENCE_ADVANTAGES = (-0.8, 0.5, 1.1)


def _advantage_forms(adv: Tensor) -> list[tuple[Tensor, Tensor]]:
    """(handed, as each token sees them): the advantages a token (B, T), then one a sequence (B,)
    (GRPO's, spread over its tokens)."""
    each = torch.tensor(SEQUENCE_ADVANTAGES, dtype=adv.dtype)  # (B,)
    return [(adv, adv), (each, each[:, None].expand_as(adv))]


def _policy_error(ctx: Context, comp: Component, roles: dict[str, str], given: dict[str, Any], spread: Tensor,
                  clip: tuple[float, float]) -> tuple[float, Callable[..., Any]]:
    """How far its loss is from the reference's (its loss, token losses or rows' means) with these
    inputs and range, and the call that gave it; inf where it raises on them (a loss that broadcasts
    one advantage a sequence itself, `advantages.unsqueeze(-1)`, raises on the token form)."""
    call = called_by_role(ctx, comp, roles, given)
    out = fp.quietly(call)
    views = policy_views(given["logprobs"], given["old"], spread, clip)
    errors = [apart(g.reshape(v.shape) if g.numel() == v.numel() else g, v)
              for g in tensors_of(out)[:1] for _, v in views[-3:]]
    return min(errors, default=float("inf")), call


def _localize(comp: Component, call: Callable[..., Any], inputs: dict[str, Tensor], views: list[View]) -> Any:
    """The first line whose value is none of the reference's steps, the inputs traced."""
    filename = inspect.getsourcefile(comp.obj)
    steps = trace_steps(lambda: call(**{r: x.clone().requires_grad_() for r, x in inputs.items()}), filename)
    return first_departure(steps, views, filename, {"B": B, "T": T})
