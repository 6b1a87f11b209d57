"""A sparse mixture of experts in a learner's block (Mixtral's SparseMoE, Switch's, Qwen-MoE's), found by
what it builds, not by its name: a router nn.Linear(D, E) beside an nn.ModuleList of E experts, each a
gated feed-forward network. How it routes is read from what it computes on its own (one call of the
module): how many experts a token goes through (top_k), whether their weights are rescaled to sum to 1,
and which of each expert's two up projections is the gate, the one setting of those whose output is
the learner's. handformer's MixtureOfExperts (handformer.nn.moe) is the reference.

Shape legend: B batch, T length, D d_model, E experts, F expert width.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import Text, text
from handformer.check.core.sizes import D
from handformer.check.core.weights import (
    Leaf,
    MappingError,
    RouterSlot,
    Slot,
    ffn_slots,
    ffn_weights,
    in_call_order,
    is_gated,
    leaves,
    of_kind,
    shared_slots,
)
from handformer.check.reference import variants as V
from handformer.config import MoEConfig

GATED = ("silu", "gelu", "gelu_tanh")  # the experts' activations tried (SwiGLU, GeGLU)


def moe_parts(module: nn.Module) -> tuple[Leaf, str, nn.ModuleList] | None:
    """The router (a child nn.Linear(D, E), or a gate module of its own that holds one (E, D) weight:
    DeepSeek's MoEGate) and the name and list of the E experts beside it; None for a module that
    holds no such pair."""
    children = dict(module.named_children())
    found_routers = ((n, router_linears(c)) for n, c in children.items())
    routers = {tuple(r[0][1].weight.shape): (n, r[0]) for n, r in found_routers if r}
    found = [(routers[(len(c), D)], n, c) for n, c in children.items()
             if isinstance(c, nn.ModuleList) and (len(c), D) in routers]
    router, name, experts = (found or [(None, "", None)])[0]
    if router is None:
        return None
    path, linear = _joined(router[0], router[1][0]), router[1][1]
    return Leaf(path, "linear", linear, linear.weight, getattr(linear, "bias", None)), name, experts


def router_linears(child: nn.Module) -> list[tuple[str, nn.Module]]:
    """The routers a child may be, with their paths inside it: itself where it is an nn.Linear or a
    module of the learner's (no torch.nn layer: an nn.Embedding is none) whose parameters are one
    matrix `weight` and at most a bias beside it; else, for a router of the learner's made of
    nn.Linear(D, E) layers alone (makeMoE's noisy top-k router: a routing linear and a noise linear
    that only training reads), each of them; none for anything else."""
    ranks = {name: p.dim() for name, p in child.named_parameters()}
    own = not type(child).__module__.startswith("torch.")
    if isinstance(child, nn.Linear) or own and ranks in ({"weight": 2}, {"weight": 2, "bias": 1}):
        return [("", child)]
    kinds = set(map(type, child.children()))  # nn.Linear alone, all of one shape, nothing held beside
    shapes = {tuple(p.shape) for p in child.parameters() if p.dim() == 2}
    alone = own and kinds == {nn.Linear} and len(shapes) == 1 and not list(child.parameters(recurse=False))
    return list(child.named_children()) * alone


def find_moe(module: nn.Module) -> tuple[str, nn.Module] | None:
    """The first mixture of experts inside `module` (itself included), with its dotted path."""
    return next(((path, sub) for path, sub in module.named_modules() if moe_parts(sub) is not None), None)


def outside_moe(module: nn.Module, linears: list[Leaf]) -> list[Leaf]:
    """The linears that are no part of the module's mixture of experts (its router, a Linear(D, E),
    is as wide as a grouped key projection where E = n_kv_heads * head_dim): the attention's candidates."""
    found = find_moe(module)
    inside = set() if found is None else set(map(id, found[1].modules()))
    return [leaf for leaf in linears if id(leaf.module) not in inside]


def ffn_readings(module: nn.Module, linears: list[Leaf], F: int | None, what: str, label: str = "",
                 ) -> list[list[Slot]]:
    """The readings of a layer's FFN: its mixture of experts' (one), else its FFN's (ffn_slots)."""
    found = find_moe(module)
    return ffn_slots(in_call_order(module, linears), D, F, what) if found is None else [
        moe_slots(*found, what, label)]


def moe_slots(path: str, moe: nn.Module, what: str, label: str) -> list[Slot]:
    """The FFN slots of the mixture of experts `moe` at `path` (its leaves named from `label`): each
    expert's, then the router (a RouterSlot with the routing its output shows); MappingError for
    experts handformer's have not (not gated, or with biases)."""
    router, list_name, experts = moe_parts(moe)  # type: ignore[misc]  (found by find_moe)
    named = [[Leaf(_joined(label, path, list_name, str(i), leaf.name), leaf.kind, leaf.module, leaf.weight,
                   leaf.bias) for leaf in of_kind(leaves(e), "linear")] for i, e in enumerate(experts)]
    readings = [ffn_slots(own, D, None, what) for own in named]
    if any(not is_gated(r[0]) or r[0][0].bias() is not None for r in readings):
        raise MappingError(f"{what}: its experts are not gated feed-forward networks without biases, as "
                           "handformer's MixtureOfExperts has (SwiGLU experts, Mixtral's)",
                           zh=f"{what}：它的专家不是无偏置的门控前馈网络，而 handformer 的 MixtureOfExperts "
                              "用的是这种专家（SwiGLU，Mixtral 的写法）")
    child = router.name.split(".")[0]
    shared = _shared(path, moe, (list_name, child), what, label)
    linears = router_linears(getattr(moe, child))
    routers = [Leaf(_joined(label, path, child, name), "linear", m, m.weight, getattr(m, "bias", None))
               for name, m in linears]
    gates = [Leaf(_joined(label, path, name), "linear", c, c.weight, c.bias)  # Qwen2-MoE's shared_expert_gate
             for name, c in moe.named_children()
             if isinstance(c, nn.Linear) and (c.out_features, c.in_features) == (1, D)]
    slots = _routed(moe, readings, routers, shared, gates[:1] if shared else [])
    if isinstance(slots, str):  # no reading computes its output, and it holds parts none reads
        raise MappingError(f"{what}: {UNREAD[0]} ({slots})", zh=f"{what}：{UNREAD[1]}（{slots}）")
    return slots


# a mixture of experts with parts handformer's reading leaves out (Qwen2-MoE's shared_expert_gate, a
# sigmoid scaling the shared expert) whose output no reading gives: a mistake, or those parts
UNREAD = ("its mixture of experts holds parts handformer's reading of it (router, experts, an unweighted "
          "shared expert) leaves out, and no reading without them gives its output: not compared",
          "它的混合专家里有 handformer 的读法（路由、专家、不加权的共享专家）没有用到的部分，"
          "不用这些部分的读法都给不出它的输出：不比较")


def _shared(path: str, moe: nn.Module, taken: tuple[str, str], what: str, label: str) -> list[list[Slot]]:
    """The readings of its shared expert (DeepSeek's, added to every token's output unweighted): a
    child beside the router and the experts that is a gated FFN without biases; none where it has none
    (another child is no expert); MappingError for more than one, which handformer's has not."""
    own = [[Leaf(_joined(label, path, name, leaf.name), leaf.kind, leaf.module, leaf.weight, leaf.bias)
            for leaf in of_kind(leaves(child), "linear")] for name, child in moe.named_children()
           if name not in taken]  # (its experts' list, its router)
    found = (fp.quietly(lambda o=o: ffn_slots(o, D, None, what)) for o in own)
    readings = [r for r in found if r and is_gated(r[0]) and r[0][0].bias() is None]
    if len(readings) > 1:
        raise MappingError(f"{what}: {len(readings)} shared experts; handformer's MixtureOfExperts has one",
                           zh=f"{what}：有 {len(readings)} 个共享专家；"
                              "handformer 的 MixtureOfExperts 只有一个")
    return readings


def _joined(*parts: str) -> str:
    """A dotted path from its parts, the empty ones left out."""
    return ".".join(filter(None, parts))


def moe_config(slots: list[Slot]) -> MoEConfig | None:
    """handformer's MoEConfig for a layer's FFN slots: None for one FFN."""
    r = slots[-1]
    if not isinstance(r, RouterSlot):
        return None
    shared = shared_slots(slots)  # one, or none
    d_shared = shared[0][0].weight().size(0) if shared else 0
    return MoEConfig(n_experts=r.n_experts, top_k=r.top_k, d_expert=slots[0].weight().size(0),
                     normalize=r.normalize, d_shared=d_shared)


SHARED_WORDS = {False: ("", ""), True: (" and a shared expert every token goes through",
                                       "，另有一个所有 token 都经过的共享专家"),
                "gated": (" and a shared expert every token goes through, scaled by the sigmoid of its own "
                          "gate Linear(D, 1) (Qwen2-MoE's)", "，另有一个所有 token 都经过的共享专家，"
                          "乘以它自己的门 Linear(D, 1) 的 sigmoid（Qwen2-MoE 的写法）")}


@torch.no_grad()
def moe_note(slots: list[Slot]) -> list[Text]:
    """What a layer's mixture of experts was read as, for the report; none for one FFN."""
    r = slots[-1]
    if not isinstance(r, RouterSlot):
        return []
    renorm = ("their weights renormalized to sum to 1", "权重重新归一化到和为 1") if r.normalize else (
        "their weights as the softmax gave them", "权重保持 softmax 给出的值")
    shared = SHARED_WORDS["gated" if r.shared_gate is not None else bool(r.n_shared)]
    return [text(f"its feed-forward network is a sparse mixture of {r.n_experts} experts, each token "
                 f"through its top {r.top_k}, {renorm[0]}{shared[0]}: compared with handformer's "
                 "MixtureOfExperts", f"它的前馈网络是 {r.n_experts} 个专家的稀疏混合，"
                 f"每个 token 经过得分最高的 {r.top_k} 个专家，{renorm[1]}{shared[1]}："
                 "与 handformer 的 MixtureOfExperts 比较")]


def _routed(moe: nn.Module, readings: list[list[list[Slot]]], routers: list[Leaf],
            shared: list[list[list[Slot]]], gates: list[Leaf]) -> list[Slot] | str:
    """The slots in the reading (router, gate order, top_k, renormalized or not, the shared expert
    behind its sigmoid gate or not where it holds one) that computes the learner's output, a shared
    expert's after the routed ones'; where none does (a mistake), the first router and gate order, 2
    experts a token, renormalized, the shared gate read; where none does and it holds parameters no
    reading holds, their modules' names (not compared)."""
    x = fp.randn(2, 5, D, seed=4)  # (B, T, D)
    # (None where the learner's module raises: its block's check runs it and says so)
    out = fp.first_tensor(fp.quietly(lambda: moe(x)), 3)
    E, scaled = len(readings), [*gates, None]
    settings = itertools.product(routers, range(len(readings[0])), GATED, range(1, E + 1), (True, False),
                                 scaled)
    tried = [([*itertools.chain(*(r[order] for r in readings + shared)),
               RouterSlot("router", router, None, "", E, k, norm, len(shared), gate)], act)
             for router, order, act, k, norm, gate in settings]
    found = [slots for slots, act in tried
             if fp.max_error(out, V.feed_forward(ffn_weights(slots, act), x)) < 1e-6]
    if not found and not isinstance(routers[0].module, nn.Linear):
        raise MappingError(OWN_GATE[0], zh=OWN_GATE[1])  # (its own MoE check names what departs)
    if not found and (unread := _unread(moe, readings, routers + gates, shared)):
        return ", ".join(unread)
    # else: order 0, silu, k = 2, renormalized, the shared gate read
    return [*found, tried[2 * (min(2, E) - 1) * len(scaled)][0]][0]


def _unread(moe: nn.Module, readings: list[list[list[Slot]]], routers: list[Leaf],
            shared: list[list[list[Slot]]]) -> list[str]:
    """The modules (dotted names) holding parameters of the mixture that no expert, shared expert or
    router reading holds (Qwen2-MoE's shared_expert_gate)."""
    leaves_read = [slot.leaf for group in readings + shared for order in group for slot in order] + routers
    held = {id(t) for leaf in leaves_read for t in (leaf.weight, leaf.bias) if t is not None}
    unread = (name.rpartition(".")[0] or name for name, p in moe.named_parameters() if id(p) not in held)
    return sorted(set(unread))


# a gate module of its own (DeepSeek's Gate, MoEGate) whose output no reading of handformer's gives
OWN_GATE = ("its mixture of experts routes through a gate of its own whose output no routing handformer's "
            "MixtureOfExperts has gives (a score function, a scale or groups of experts besides the "
            "softmax's top k): not compared on its blocks; the mixture of experts is checked on its own",
            "它的混合专家经过它自己的门控模块，输出不是 handformer 的 MixtureOfExperts 的任何一种路由"
            "（softmax 前 k 个之外，还有别的得分函数、缩放系数或专家分组）："
            "不在 Block 上比较；混合专家单独检查")
