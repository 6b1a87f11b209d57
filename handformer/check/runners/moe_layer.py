"""The sparse mixture of experts of the MoE chapter, checked as its own component (minimind's
MOEFeedForward with its MoEGate, Mixtral's SparseMoeBlock, DeepSeek's MoE with shared experts):
each token is scored by a router, softmax over the E experts, sent through its top k, their weights
renormalized to sum to 1 where the layer's setting says so (norm_topk_prob), and the weighted sum of
their outputs taken, plus the output of any shared expert.

The experts are the learner's own modules, called as they are (each is checked as an FFN where its
class is found); what is compared is the routing and the sum, against a reference written from the
router's weight (E, D): that of an nn.Linear(D, E) or of a gate module holding a (E, D) parameter.
How many experts a token takes and whether their weights are renormalized are read from the layer's
settings (top_k, num_experts_per_tok; norm_topk_prob, normalize); a setting it does not name is
read from its output, the reading nearest to it.

Shape legend: N tokens (B * T), D d_model, E experts, K experts a token.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, D, check_determinism, error_text, finish
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.moe import moe_parts, moe_slots, router_linears
from handformer.check.core.result import (
    Check,
    ComponentResult,
    Finding,
    Text,
    text,
)
from handformer.check.core.source import locate, source_lines
from handformer.check.core.weights import expert_slots
from handformer.check.runners.localize_moe import localize_moe, moe_views
from handformer.check.runners.pieces import built_ffn, check_ffn, wrong_branch_findings

TOP_K_SETTINGS = ("top_k", "num_experts_per_tok", "n_activated_experts", "experts_per_token", "k")
TOL = 1e-6
NORMS = {None: (True, False), True: (True,), False: (False,)}  # the readings a setting allows (None: unnamed)
NORM_SETTINGS = ("norm_topk_prob", "normalize", "renormalize", "norm_topk", "route_norm")
# the factor the routed experts' weights are multiplied by (DeepSeek's route_scale, Hugging Face's
# routed_scaling_factor); 1 where none is named
SCALE_SETTINGS = ("route_scale", "routed_scaling_factor", "routing_scale")


def _parts(module: nn.Module) -> tuple[nn.ModuleList, list[tuple[Tensor, Tensor | None]], list[nn.Module]]:
    """Its experts (the child nn.ModuleList), the weights (E, D) its router may route by, and its
    other children with parameters: the shared experts."""
    children = dict(module.named_children())
    experts = next(c for c in children.values() if isinstance(c, nn.ModuleList))
    E = len(experts)
    gate = next(c for c in children.values() if _routers(c, E))
    rest = [c for c in children.values()
            if c is not experts and c is not gate and next(c.parameters(), None) is not None]
    scale = [c for c in rest if isinstance(c, nn.Linear) and c.out_features == 1][:1]  # shared_expert_gate
    return experts, _routers(gate, E), [ScaledShared(c, *scale) for c in rest if c not in scale]


class ScaledShared(nn.Module):
    """A shared expert, scaled by sigmoid(g x) where the mixture holds a Linear(D, 1) g beside it
    (Qwen2-MoE's shared_expert_gate); as it is where it holds none (DeepSeek's)."""

    def __init__(self, expert: nn.Module, gate: nn.Module | None = None) -> None:
        super().__init__()
        self.expert, self.gate = expert, gate

    def forward(self, x: Tensor) -> Tensor:
        return self.expert(x) * (1.0 if self.gate is None else torch.sigmoid(self.gate(x)))  # (B, T, D)


def _routers(child: nn.Module, E: int) -> list[tuple[Tensor, Tensor | None]]:
    """The router weights (E, D), each with its bias, a child holds: its own parameter (MoEGate's), or
    an nn.Linear(D, E)'s, itself or one of those a router of the learner's is made of (makeMoE's noisy
    router: its routing linear, and a noise linear that eval mode does not read)."""
    # its own parameters read without a bias (DeepSeek's gate bias only picks experts), its linears' with
    found = [(p, None) for p in child.parameters(recurse=False)] + [
        (m.weight, getattr(m, "bias", None)) for _, m in router_linears(child)]
    return [(w, b) for w, b in found if tuple(w.shape) == (E, D)]


def _unmapped(ctx: Context, module: nn.Module, parts: tuple[nn.ModuleList, list[Any], list[nn.Module]],
              x: Tensor) -> list[Text]:
    """The parameters and buffers of the mixture that no expert or shared expert holds and that are no
    router parameter (a buffer is no weight: DeepSeek-V3's selection-only expert bias), where its
    output on x reads them: set to noise, they change it (a running count that training alone writes
    does not). What the reference has no place for, named (unmapped.py)."""
    experts, routers, shared = parts
    held = nn.ModuleList([experts, *shared])
    mapped = set(map(id, [*held.parameters(), *held.buffers(), *filter(_weight, itertools.chain(*routers))]))
    run = lambda: fp.first_tensor(ctx.learner.call("forward", module, x), 3)  # noqa: E731
    read = [f"{name} {tuple(t.shape)}" for name, t in [*module.named_parameters(), *module.named_buffers()]
            if id(t) not in mapped and t.is_floating_point() and _read(t, run)]
    return [text(f"it holds {', '.join(read)}, which no expert, router or shared expert of the reference "
                 "holds", f"它有 {', '.join(read)}，参考实现的专家、路由和共享专家里都没有对应的东西"),
            ] * bool(read)


def _weight(t: Tensor | None) -> bool:
    return isinstance(t, nn.Parameter)


def _read(t: Tensor, run: Any) -> bool:
    """Whether the output `run` gives changes with `t` set to noise (put back after; the check runs
    without gradients)."""
    kept, before = t.detach().clone(), run()
    t.copy_(fp.randn(*t.shape, seed=9).to(t.dtype))
    changed = fp.max_error(run(), before) > TOL
    t.copy_(kept)
    return changed


def _setting(module: nn.Module, names: tuple[str, ...], kinds: tuple[type, ...] = (bool, int),
             default: Any = None) -> Any:
    """The first of the settings its modules or their config hold, `default` where none does."""
    holders = [*module.modules(), *(getattr(m, "config", None) for m in module.modules())]
    found = (getattr(h, n) for n in names for h in holders if isinstance(getattr(h, n, None), kinds))
    return next(found, default)


def mixture(x: Tensor, router: tuple[Tensor, Tensor | None], experts: list[Any], shared: list[Any], k: int,
            normalize: bool, scale: float = 1.0) -> Tensor:
    """The reference: softmax(x W_r^T + b_r) over the experts, the top k of each token, renormalized
    when `normalize`, times the routing scale, weighting the experts' outputs; plus each shared
    expert's. x (B, T, D); the router's bias b_r where it has one."""
    scores = torch.softmax(torch.nn.functional.linear(x, *router), dim=-1)  # (B, T, E)
    weights, chosen = scores.topk(k, dim=-1)  # (B, T, K)
    weights = (weights / weights.sum(-1, keepdim=True) if normalize else weights) * scale
    outs = torch.stack([expert(x) for expert in experts], dim=-2)  # (B, T, E, D)
    picked = outs.gather(-2, chosen[..., None].expand(*chosen.shape, outs.size(-1)))  # (B, T, K, D)
    return (weights[..., None] * picked).sum(-2) + sum(s(x) for s in shared)


def check_ffn_or_moe(comp: Component, ctx: Context) -> ComponentResult:
    """A module found as an FFN: a mixture of experts where it is built as one, whatever its own source
    reads (a router beside a list of experts: Switch's SparseMLP, its routing in a router class or a
    helper of its own), so never an FFN without a down projection; else the FFN probe."""
    moe = moe_parts(built_ffn(comp, ctx)) is not None
    return check_moe(dataclasses.replace(comp, kind="moe"), ctx) if moe else check_ffn(comp, ctx)


def check_moe(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp)
    experts, routers, shared = ctx.learner.call("__init__", _parts, module)
    x = fp.randn(2, 5, D, seed=4)  # (B, T, D)
    ctx.unmapped[comp.name] = _unmapped(ctx, module, (experts, routers, shared), x)
    k, normalize = _setting(module, TOP_K_SETTINGS), _setting(module, NORM_SETTINGS)
    if not experts or (k or 0) > len(experts):  # check's sizes gave it no experts, or fewer than its k
        n = len(experts)  # a dict config's num_experts = 0 (its model's one FFN); DeepSeek's 6 of 4
        raise DiscoveryError(f"built at check's sizes it has {n} experts for a top-{k}: no mixture to "
                             "compare; give its config the experts it needs (an adapter)",
                             zh=f"按 check 的尺寸构造时它只有 {n} 个专家，却要选前 {k} 个：没有可比较的混合；"
                             "请在配置里给它足够的专家（写一个适配函数）")
    with torch.no_grad():
        out = fp.first_tensor(ctx.learner.call("forward", module, x), 3)
        scale = float(_setting(module, SCALE_SETTINGS, (int, float), 1.0))
        settings = itertools.product([k] if k else range(1, len(experts) + 1), (True, False))
        readings = {(kk, norm): min((mixture(x, r, list(experts), shared, kk, norm, scale) for r in routers),
                                    key=lambda ref: fp.max_error(out, ref)) for kk, norm in settings}
    errors = {key: fp.max_error(out, ref) for key, ref in readings.items()}
    allowed = [key for key in errors if key[1] in NORMS[normalize]]
    k, norm = min(allowed, key=errors.get)
    err = res.max_abs_error = errors[k, norm]
    res.notes += _read_as(len(experts), k, norm, len(shared), scale) + _capacity_note(module, len(experts))
    res.checks.append(Check(text("each token through its top experts by the router's softmax, their outputs "
                                 "weighted and summed (plus the shared experts')",
                                 "每个 token 经过路由 softmax 得分最高的专家，输出加权求和"
                                 "（再加上共享专家的输出）"),
                            err < TOL, error_text(err)))
    if err >= TOL and norm and errors[k, False] < TOL:
        number, code = locate("moe_weights_not_renormalized", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("moe_weights_not_renormalized", text(
            f"your output is the top-{k} weights as the softmax gave them (to {errors[k, False]:.1e}), "
            "though its setting says they are renormalized",
            f"你的输出用的是 softmax 给出的前 {k} 个权重（误差 {errors[k, False]:.1e}），"
            "而它的设置要求重新归一化"),
            number, code))
    res.findings += _branch_findings(ctx, comp, module, err)
    _localized(res, ctx, comp, module, x, (experts, routers, shared), allowed, scale)
    return finish(res)


def _localized(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module, x: Tensor,
               parts: tuple[Any, list[Any], list[Any]], settings: list[tuple[int, bool]], scale: float,
               ) -> None:
    """Eval mode is deterministic (a noisy router's draw left on in eval: dropout_in_eval, at its
    line); where the mixture differs, the line where it first parts from the reference, read with
    each router and each setting its own allow (localize_moe.py)."""
    check_determinism(res, ctx, comp, lambda: fp.first_tensor(ctx.learner.call("forward", module, x), 3))
    experts, routers, shared = parts

    def localize() -> Any:
        with torch.no_grad():
            readings = [moe_views(x, r, list(experts), shared, k, norm, scale)
                        for r, (k, norm) in itertools.product(routers, settings)]
        return localize_moe(module, x, readings, {k for k, _ in settings} - {len(experts)})
    if res.max_abs_error >= TOL:
        note_departure(res, localize)


def _branch_findings(ctx: Context, comp: Component, module: nn.Module, err: float) -> list[Finding]:
    """gated_activation_wrong_branch in its first expert, as a single FFN is judged (pieces.py): which
    projection it activates read from what it computes, which one is named the gate from its names."""
    slots = fp.quietly(lambda: moe_slots("", module, "", ""))
    return wrong_branch_findings(ctx, comp, expert_slots(slots)[0], err) if slots and err < TOL else []


CAPACITY_SETTINGS = ("capacity_factor", "eval_capacity_factor", "train_capacity_factor")


def _capacity_note(module: nn.Module, E: int) -> list[Text]:
    """The note on a mixture with a capacity (Switch's capacity_factor): built with one at which no
    token is dropped (discovery's FIXED), so that the routing is compared and the dropping is not;
    none where it has none, or one at which tokens may be dropped (an adapter's)."""
    factor = _setting(module, CAPACITY_SETTINGS, (int, float))
    if factor is None or factor < E:
        return []
    return [text(f"its experts have a capacity, built at capacity_factor = {factor:g}: no token is dropped, "
                 "so each token's routing is compared; which tokens a full expert drops is not",
                 f"它的专家有容量上限，按 capacity_factor = {factor:g} 构造：没有 token 被丢弃，"
                 "所以比较的是每个 token 的路由；专家满了丢哪些 token 不比较")]


def _read_as(E: int, k: int, normalize: bool, shared: int, scale: float) -> list[Text]:
    """The notes on how the mixture was read: its experts, top k, renormalization, shared experts, and
    its routing scale where it is not 1."""
    renorm = ("their weights renormalized to sum to 1", "权重重新归一化到和为 1") if normalize else (
        "their weights as the softmax gave them", "权重保持 softmax 给出的值")
    return [text(f"{E} experts, each token through its top {k}, {renorm[0]}; {shared} shared expert(s)",
                 f"{E} 个专家，每个 token 经过得分最高的 {k} 个，{renorm[1]}；共享专家 {shared} 个")] + [
        text(f"the routed experts' weights times {scale:g} (its routing scale)",
             f"路由专家的权重乘以 {scale:g}（它的路由缩放系数）")] * (scale != 1.0)
