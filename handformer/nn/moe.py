"""A mixture of experts (Shazeer et al. 2017; Switch Transformer, Mixtral): many feed-forward
networks in a layer, of which each token goes through a few.

    router logits = x W_r^T                                    (N, E): a score for every expert
    p             = softmax(router logits)                     (N, E), in float32
    w, e          = top-k of p                                 (N, k): the chosen experts and weights
    w             = w / sum(w)                                 (when `normalize`: Mixtral, Qwen3-MoE)
    y             = sum over the chosen j of w_j * expert_{e_j}(x)   (+ a shared expert, Qwen2-MoE)

Each expert is an ordinary gated feed-forward network (SwiGLU). A token reads only k of the E
experts, so the layer holds E times the weights of one FFN but costs about k FFNs a token. Nothing
forces the router to use every expert: training adds the load-balancing loss of
handformer.training.moe_loss, computed from the router's logits.

Shape legend: B batch, T length, D d_model, N tokens (B * T), E experts, k experts per token,
F expert width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from handformer.nn.feed_forward import GatedFeedForward


class SharedExpert(nn.Module):
    """An expert every token goes through, scaled by a sigmoid gate of its own (Qwen2-MoE)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "swiglu") -> None:
        super().__init__()
        self.expert = GatedFeedForward(d_model, d_ff, activation, bias=False)
        self.gate = nn.Linear(d_model, 1, bias=False)  # (N, D) -> (N, 1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.gate(x)) * self.expert(x)  # (N, D)


class NoSharedExpert(nn.Module):
    """No shared expert: the routed experts' outputs are added to zeros."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)  # (N, D)


class MixtureOfExperts(nn.Module):
    """Router, experts and the weighted sum of the chosen experts' outputs (see the module docstring)."""

    def __init__(self, d_model: int, n_experts: int, top_k: int, d_expert: int, activation: str = "swiglu",
                 normalize: bool = True, d_shared: int = 0) -> None:
        """n_experts: E; top_k: k; d_expert: each expert's hidden width F; normalize: rescale the
        k weights to sum to 1; d_shared: the width of a shared expert (0: none)."""
        super().__init__()
        self.top_k, self.normalize = top_k, normalize
        self.router = nn.Linear(d_model, n_experts, bias=False)  # W_r: (N, D) -> (N, E)
        self.experts = nn.ModuleList(GatedFeedForward(d_model, d_expert, activation, bias=False)
                                     for _ in range(n_experts))
        self.shared_expert = SharedExpert(d_model, d_shared, activation) if d_shared else NoSharedExpert()

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(N, D) tokens -> (weights (N, k) float32, experts (N, k)): each token's top_k experts."""
        probs = torch.softmax(self.router(x).float(), dim=-1)  # (N, E)
        weights, experts = probs.topk(self.top_k, dim=-1)  # (N, k) each, the best first
        if self.normalize:  # the chosen weights sum to 1 (Mixtral); else they keep their softmax share
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        x = x.reshape(B * T, D)  # (N, D): the router sees tokens, not sequences
        weights, experts = self.route(x)  # (N, k) each
        out = self.shared_expert(x)  # (N, D)
        for e in experts.unique().tolist():  # only the experts some token chose
            token, slot = torch.where(experts == e)  # the tokens routed to expert e, and in which slot
            y = self.experts[e](x[token]) * weights[token, slot, None]  # (n_e, D), weighted
            out = out.index_add(0, token, y.to(out.dtype))
        return out.view(B, T, D)
