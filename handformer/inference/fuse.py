"""Inference-only fusion: projections that read the same input become one matrix product.

Self-attention multiplies its input by W_Q, W_K and W_V; a gated feed-forward network multiplies
its input by W_gate and W_up. Stacking those matrices row-wise computes the same products in one
call:

    [q | k | v] = x [W_Q; W_K; W_V]^T        (one (H + 2 Hkv) Dh x D matrix instead of three)
    [gate | up] = x [W_gate; W_up]^T         (one 2F x D matrix instead of two)

On a small model, where a decoding step is hundreds of tiny operator calls rather than reading
weights, fewer calls is what makes it faster (see the README, "Decoding against the bandwidth
bound"). The rotary embedding is then applied to the queries and keys together, in one call.

`fuse_projections(model)` swaps these modules in place. It is for inference only: the fused model's
state_dict has `qkv_proj` and `gate_up_proj` instead of the names every checkpoint uses, so train,
save, export, add LoRA adapters or quantize *before* fusing. Only plain `nn.Linear` projections are
fused; a layer already replaced by LoRA or by a quantized linear is left as it is. Cross-attention is
never fused (its queries and keys read different inputs). The unfused modules in
`handformer.nn.attention` and `handformer.nn.feed_forward` remain the reference that this matches
(tests/test_fuse.py: the same greedy tokens, logits within 1e-5).

Shape legend: B batch, T query length, S key length, D d_model, H query heads, Hkv key/value heads,
Dh head dim, F feed-forward width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from handformer.nn.attention import MultiHeadAttention
from handformer.nn.feed_forward import GatedFeedForward
from handformer.nn.kv_cache import NO_CACHE, LayerCache
from handformer.nn.norms import NoNorm
from handformer.nn.positions import apply_rotary, rotate


def stack_linears(*linears: nn.Linear) -> nn.Linear:
    """One nn.Linear whose output is the outputs of `linears`, concatenated in that order."""
    weight = torch.cat([lin.weight.detach() for lin in linears])  # (sum of outputs, D)
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot stack linear layers of which only some have a bias")
    fused = nn.Linear(weight.size(1), weight.size(0), bias=all(has_bias),
                      device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([lin.bias.detach() for lin in linears]))
    return fused.train(linears[0].training)


class FusedSelfAttention(MultiHeadAttention):
    """`MultiHeadAttention` for self-attention with W_Q, W_K, W_V stacked into one `qkv_proj`. Only
    `project` differs: one product, and the rotary embedding applied to queries and keys in one
    call; the forward is MultiHeadAttention's own."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        nn.Module.__init__(self)  # not MultiHeadAttention's: the projections come from `attn`
        self.n_heads, self.n_kv_heads, self.head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
        self.dropout = attn.dropout
        self.qkv_proj = stack_linears(attn.q_proj, attn.k_proj, attn.v_proj)  # (H + 2 Hkv) Dh x D
        self.o_proj = attn.o_proj
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm  # per-head q/k norms (Qwen3), or NoNorm
        self.train(attn.training)  # a new module starts in training mode; keep the model's mode

    def project(self, query: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache = NO_CACHE) -> tuple[Tensor, Tensor, Tensor]:
        """`MultiHeadAttention.project` for self-attention (key and value are the query)."""
        if key is not query or value is not query:
            raise ValueError("a fused self-attention cannot attend over a context (cross-attention "
                             "is never fused)")
        B, T, _ = query.shape
        H, Hkv, Dh = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv_proj(query).view(B, T, H + 2 * Hkv, Dh).transpose(1, 2)  # (B, H + 2 Hkv, T, Dh)
        qk = qkv[:, :H + Hkv]  # (B, H + Hkv, T, Dh): queries, then keys
        if not isinstance(self.q_norm, NoNorm):  # q/k norms per head (Qwen3): each its own weights
            qk = torch.cat([self.q_norm(qk[:, :H]), self.k_norm(qk[:, H:])], dim=1)
        if rope is not None:  # every query and key head in one call
            cos, sin = rope
            turn = rotate if cos.dtype == qk.dtype else apply_rotary  # no cast where there is none to do
            qk = turn(qk, cos, sin)
        return qk[:, :H], qk[:, H:], qkv[:, H + Hkv:]  # (B, H, T, Dh), (B, Hkv, T, Dh) twice


class FusedGatedFeedForward(nn.Module):
    """A gated `FeedForward` (SwiGLU, GEGLU) with W_gate and W_up stacked into one `gate_up_proj`."""

    def __init__(self, ffn: GatedFeedForward) -> None:
        super().__init__()
        self.activation, self.act = ffn.activation, ffn.act
        self.gate_up_proj = stack_linears(ffn.gate_proj, ffn.up_proj)  # 2F x D
        self.down_proj = ffn.down_proj
        self.train(ffn.training)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.down_proj(self.act(gate) * up)


def _plain(*layers: nn.Module | None) -> bool:
    return all(type(layer) is nn.Linear for layer in layers)


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse, in place, every self-attention's Q/K/V projections and every gated feed-forward
    network's gate/up projections of `model` whose layers are plain `nn.Linear`; returns `model`.

    Inference only (see the module docstring): the fused model computes the same outputs (up to
    float rounding) but its parameters have other names. Calling it twice changes nothing more.
    """
    for module in list(model.modules()):
        attn = getattr(module, "self_attn", None)
        if type(attn) is MultiHeadAttention and _plain(attn.q_proj, attn.k_proj, attn.v_proj):
            module.self_attn = FusedSelfAttention(attn)
        ffn = getattr(module, "ffn", None)
        if type(ffn) is GatedFeedForward and _plain(ffn.gate_proj, ffn.up_proj):
            module.ffn = FusedGatedFeedForward(ffn)
    return model
