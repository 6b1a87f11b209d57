"""The load-balancing loss of a mixture of experts (Switch Transformer, Fedus et al. 2021, eq. 4-6;
the form transformers' `load_balancing_loss_func` computes for Mixtral, Qwen-MoE and OLMoE).

Nothing in the next-token loss asks the router to spread tokens over the experts: left alone it can
send most tokens to a few of them, which then learn while the others do not. The auxiliary loss
is smallest when the tokens spread evenly:

    loss = E * sum_e f_e * P_e

    f_e = (number of top-k choices of expert e) / N      the share of tokens routed to e (sums to k)
    P_e = mean over tokens of softmax(router logits)_e   the router's mean probability for e

over all N tokens of all layers (padding left out, with an attention mask). With tokens spread
evenly (f_e = k / E) or a router without preference (P_e = 1 / E) the loss is k; it grows as the
router crowds tokens onto a few experts and gives them most of its probability. Only P_e has a
gradient (f_e counts choices), which pushes probability away from the experts that get too many
tokens. Training adds `aux_loss_coef` times it (`MoEConfig`).

The router logits are taken with forward hooks on each `MixtureOfExperts.router` while the model
runs (`RouterLogits`): the model is unchanged, and returns its logits as before.

Shape legend: N tokens of a layer (B * T), E experts, k experts per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import torch
from torch import Tensor, nn

from handformer.nn.moe import MixtureOfExperts


def load_balancing_loss(router_logits: Sequence[Tensor], n_experts: int, top_k: int,
                        attention_mask: Tensor | None = None) -> Tensor:
    """E * sum_e f_e * P_e over every layer's (N, E) router logits (see the module docstring).
    attention_mask: (B, T), 1 = a real token; the same for every layer's N = B * T rows."""
    counts = torch.zeros(n_experts, device=router_logits[0].device)  # top-k choices of each expert
    probs = torch.zeros(n_experts, device=router_logits[0].device)  # summed router probabilities
    rows = torch.zeros((), device=router_logits[0].device)
    real = None if attention_mask is None else attention_mask.reshape(-1).float()  # (N,)
    for logits in router_logits:
        p = torch.softmax(logits, dim=-1)  # (N, E)
        chosen = p.topk(top_k, dim=-1).indices  # (N, k)
        weight = torch.ones_like(p[:, 0]) if real is None else real.to(p.device)  # (N,)
        counts = counts + torch.zeros_like(counts).index_add_(0, chosen.reshape(-1),
                                                              weight.repeat_interleave(top_k))
        probs = probs + (p.float() * weight[:, None]).sum(dim=0)  # (E,)
        rows = rows + weight.sum()
    return torch.sum((counts / rows) * (probs / rows)) * n_experts


class RouterLogits:
    """Collect the router logits of every mixture-of-experts layer of `model` while it runs:

        with RouterLogits(model) as routers:
            out = model(ids)
        aux = load_balancing_loss(routers.logits, E, k)

    `logits`: one (N, E) tensor a layer, in the order the layers ran (with their graph, so a loss
    of them trains the routers)."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = [m.router for m in model.modules() if isinstance(m, MixtureOfExperts)]
        self.logits: list[Tensor] = []
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> RouterLogits:
        def keep(_module: nn.Module, _inputs: tuple, logits: Tensor) -> None:
            self.logits.append(logits)  # (N, E)

        self._hooks = [r.register_forward_hook(keep) for r in self.routers]
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


__all__ = ["RouterLogits", "load_balancing_loss"]
