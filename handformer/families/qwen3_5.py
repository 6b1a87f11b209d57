"""Qwen3.5: gated DeltaNet linear attention in three layers of four, gated softmax attention in the
fourth (Qwen3-Next's hybrid, dense; transformers' `qwen3_5_text`, Qwen3_5ForCausalLM).

Gated DeltaNet (`GatedDeltaNet`; Yang, Kautz and Hatamizadeh, "Gated Delta Networks", 2024) keeps,
for every value head, a state S of key_dim x value_dim numbers: a memory from keys to values. At
each position t it forgets a share of the whole memory, then corrects what it stores for k_t by
the delta rule (Widrow-Hoff), and the query reads it:

    S = exp(g_t) S                          g_t < 0: the decay (alpha_t = exp(g_t) in the paper)
    S = S + beta_t k_t (v_t - S^T k_t)^T    write v_t at k_t, minus what S already recalls there
    o_t = S^T q_t                           q, k L2-normed, q / sqrt(key_dim)

`delta_rule` writes that loop over time, one position a step, as the paper's recurrence; a prompt
runs `chunked_delta_rule`, the same sums a chunk of 64 positions at a time (tested equal). Before
it, q, k and v pass a causal depthwise convolution over the last conv_kernel positions (then
SiLU); after it, each head's output is RMS-normed and gated by SiLU(z) (`GatedRMSNorm`). A layer's
cache is therefore not keys and values but a fixed-size state per row: the convolution's last
conv_kernel - 1 inputs and S (`KVCache.states`). Left padding leaves both as they are: its
inputs are zero and its decay and write strength are nought.

The full-attention layers (`GatedAttention`) are Qwen3's (q/k RMSNorm per head) with two changes:
W_Q also projects a gate beside each head's query, [q_h ; gate_h], and the head's output is times
sigmoid(gate_h) before W_O; RoPE turns the first quarter of each head (rope_fraction 0.25).
Every RMSNorm but the gated one has the gain 1 + w (`rmsnorm_offset`, as Gemma's).

The released checkpoints are multimodal (`qwen3_5`, Qwen3_5ForConditionalGeneration): import-hf
reads their text model (convert/hf_import.py: text_config_of), and leaves the vision encoder and
the multi-token-prediction layer out.

Shape legend: B batch, T new positions, D d_model, C conv channels (2 Hk Dk + Hv Dv), K conv
kernel, Hk / Hv query-key / value heads, Dk / Dv their widths, H attention heads, Dh head dim.
"""

from __future__ import annotations

from typing import Any

import gguf
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, DeltaNetConfig, FamilyConfig
from handformer.families.adopt import adopt_attention
from handformer.families.hf_config import (
    no_attention_bias,
    require,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
)
from handformer.families.spec import Differences, FamilySpec, GgufCode, GgufEntry, to
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.kv_cache import LayerCache, as_cache
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.positions import apply_rotary
from handformer.replace import replace_layers
from handformer.settings import is_int

Mask = AttentionMask | Tensor | None  # see handformer.nn.masks
CHUNK = 64  # positions a chunk of `chunked_delta_rule` (transformers' and flash-linear-attention's)
L2_EPS = 1e-6  # inside the queries' and keys' L2 norms (as transformers and flash-linear-attention)


def l2_normed(x: Tensor) -> Tensor:
    """x / |x| over the last dim, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) + L2_EPS)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
               state: Tensor | None) -> tuple[Tensor, Tensor]:
    """The gated delta rule, one position at a time (the module docstring's three lines).

    q, k (B, T, Hv, Dk) L2-normed, q already / sqrt(Dk); v (B, T, Hv, Dv); g (B, T, Hv) the log
    decay; beta (B, T, Hv) the write strength; state (B, Hv, Dk, Dv) or None (zeros), float32.
    Returns (outputs (B, T, Hv, Dv) float32, the state after the last position)."""
    B, T, Hv, Dk = k.shape
    if state is None:
        state = k.new_zeros(B, Hv, Dk, v.size(-1))  # (B, Hv, Dk, Dv)
    outputs = []
    for t in range(T):
        state = state * g[:, t].exp()[..., None, None]  # forget: (B, Hv, Dk, Dv)
        recalled = torch.einsum("bhkv,bhk->bhv", state, k[:, t])  # S^T k_t: (B, Hv, Dv)
        correction = beta[:, t, :, None] * (v[:, t] - recalled)  # (B, Hv, Dv)
        state = state + k[:, t, :, :, None] * correction[:, :, None, :]  # k_t correction^T
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))  # S^T q_t: (B, Hv, Dv)
    return torch.stack(outputs, dim=1), state  # (B, T, Hv, Dv)


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None,
                       chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """`delta_rule` a chunk of positions at a time: the same arguments and results (a test pins
    them equal), a loop over chunks instead of positions (DeltaNet's chunkwise form, as
    flash-linear-attention and transformers compute a prompt).

    Inside a chunk, position t's correction depends on the earlier ones' through the keys only,
    so all of them solve one unit lower-triangular system (the WY / UT form); the state then
    enters once per chunk, decayed to each position by exp(cumulated g)."""
    B, T, Hv, Dk = k.shape
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, Hv, T, Dk|Dv)
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # (B, Hv, T)
    pad = -T % chunk  # zeros after the last position fill the last chunk (g = 0: no decay)
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))  # (B, Hv, N * L, Dk|Dv)
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))  # (B, Hv, N * L)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    q, k, k_beta, v_beta = (t.reshape(B, Hv, -1, chunk, t.size(-1))  # (B, Hv, N, L, Dk|Dv)
                            for t in (q, k, k_beta, v_beta))
    cum = g.reshape(B, Hv, -1, chunk).cumsum(dim=-1)  # (B, Hv, N, L): log decay since the chunk's start
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # (L, L): key after query
    # decay[i, j] = exp(cum_i - cum_j) for j <= i: (B, Hv, N, L, L)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(later, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * decay  # its strictly lower part; the diagonal is taken as 1
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)  # (B, Hv, N, L, Dv)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay  # (B, Hv, N, L, L): within the chunk, causal
    # queries decayed from the chunk's start, keys to its end: where the carried state meets them
    q, k = q * cum.exp()[..., None], k * (cum[..., -1:] - cum).exp()[..., None]
    if state is None:
        state = q.new_zeros(B, Hv, Dk, v.size(-1))  # (B, Hv, Dk, Dv)
    out = torch.zeros_like(u)  # (B, Hv, N, L, Dv)
    for n in range(u.size(2)):
        corrected = u[:, :, n] - w[:, :, n] @ state  # (B, Hv, L, Dv): the writes, less what the state recalls
        out[:, :, n] = q[:, :, n] @ state + scores[:, :, n] @ corrected
        state = state * cum[:, :, n, -1, None, None].exp() + k[:, :, n].transpose(-1, -2) @ corrected
    out = out.reshape(B, Hv, -1, v.size(-1))[:, :, :T].transpose(1, 2)  # (B, T, Hv, Dv)
    return out.contiguous(), state


def real_positions(mask: Mask) -> Tensor | None:
    """(B|1, T, 1): 1 at the new positions that are tokens, 0 at left padding (the query rows that
    see no key); None when every position is a token."""
    visible = as_attention_mask(mask).visible_rows  # (B|1, H|1, T, 1) or None
    return None if visible is None else visible[:, 0].float()  # (B|1, T, 1)


class GatedRMSNorm(nn.Module):
    """RMSNorm (gain w, not 1 + w) of each head's output, then times SiLU(gate) in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet linear attention (see the module docstring); in a decoder-only block it takes
    the place of `MultiHeadAttention`, with the same call. It returns no weights (there are none)."""

    chunked = True  # several positions at once by `chunked_delta_rule`; False: `delta_rule`'s loop

    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        d: DeltaNetConfig = cfg.deltanet  # type: ignore[assignment]
        D, Hk, Hv = cfg.d_model, d.key_heads, d.value_heads
        self.key_heads, self.value_heads, self.key_dim, self.value_dim = Hk, Hv, d.key_dim, d.value_dim
        self.kernel = d.conv_kernel
        C = 2 * Hk * d.key_dim + Hv * d.value_dim
        self.qkv_proj = nn.Linear(D, C, bias=False)  # (B, T, D) -> (B, T, C): [q ; k ; v]
        self.conv = nn.Conv1d(C, C, d.conv_kernel, groups=C, bias=False)  # a filter per channel: (C, 1, K)
        self.z_proj = nn.Linear(D, Hv * d.value_dim, bias=False)  # the output gate z
        self.beta_proj = nn.Linear(D, Hv, bias=False)  # write strength, sigmoid(b)
        self.decay_proj = nn.Linear(D, Hv, bias=False)  # a: g = -exp(A_log) softplus(a + dt_bias)
        self.A_log = nn.Parameter(torch.empty(Hv).uniform_(1, 16).log())  # as transformers initializes
        self.dt_bias = nn.Parameter(torch.ones(Hv))
        self.out_norm = GatedRMSNorm(d.value_dim, cfg.norm_eps)
        self.out_proj = nn.Linear(Hv * d.value_dim, D, bias=False)  # W_O

    def forward(self, x: Tensor, mask: Mask = None, *, need_weights: bool = False,
                rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache | None = None) -> tuple[Tensor, None]:
        """x (B, T, D) -> (output (B, T, D), None). rope is not used (no positions but the order)."""
        cache = as_cache(cache)
        B, T, _ = x.shape
        real = real_positions(mask)  # (B|1, T, 1) or None
        if real is not None:
            x = x * real.to(x.dtype)  # padding's inputs are zero
        conv_state, state = cache.state or (None, None)
        qkv, conv_state = self.convolve(self.qkv_proj(x), conv_state)  # (B, T, C)
        q, k, v = qkv.split([self.key_heads * self.key_dim] * 2 + [self.value_heads * self.value_dim], dim=-1)
        q, k = (self.per_value_head(l2_normed(t.view(B, T, self.key_heads, -1)))  # (B, T, Hv, Dk)
                for t in (q, k))
        v = v.view(B, T, self.value_heads, self.value_dim).float()  # (B, T, Hv, Dv)
        beta = self.beta_proj(x).float().sigmoid()  # (B, T, Hv)
        g = -self.A_log.float().exp() * F.softplus(self.decay_proj(x).float() + self.dt_bias)  # (B, T, Hv)
        if real is not None:  # padding writes nothing (beta 0), and decays no state carried in (g 0);
            beta = beta * real  # a fresh state is zero, which no decay changes: g as transformers has it then
            g = g if state is None else g * real
        rule = chunked_delta_rule if self.chunked and T > 1 else delta_rule  # a prompt, or a decoding step
        out, state = rule(q * self.key_dim ** -0.5, k, v, g, beta, state)  # (B, T, Hv, Dv)
        cache.state = (conv_state, state)
        z = self.z_proj(x).view(B, T, self.value_heads, self.value_dim)  # (B, T, Hv, Dv)
        out = self.out_norm(out.to(x.dtype), z).reshape(B, T, -1)  # (B, T, Hv * Dv)
        return self.out_proj(out), None

    def per_value_head(self, x: Tensor) -> Tensor:
        """(B, T, Hk, Dk) -> (B, T, Hv, Dk): each query/key head serves Hv / Hk consecutive value heads."""
        return x.repeat_interleave(self.value_heads // self.key_heads, dim=2)

    def convolve(self, x: Tensor, past: Tensor | None) -> tuple[Tensor, Tensor]:
        """The causal depthwise convolution, then SiLU: (B, T, C) -> (B, T, C), and the last K - 1
        inputs (B, C, K - 1) for the next call; `past` holds the previous call's (None: zeros)."""
        x = x.transpose(1, 2)  # (B, C, T)
        T, K = x.size(-1), self.kernel
        if past is None:  # zeros before the first position: the convolution's own padding
            window = F.pad(x, (K - 1, 0))  # (B, C, K - 1 + T)
            out = F.conv1d(x, self.conv.weight, padding=K - 1, groups=x.size(1))[..., :T]  # (B, C, T)
        else:
            window = torch.cat([past.to(x.dtype), x], dim=-1)  # (B, C, K - 1 + T)
            out = F.conv1d(window, self.conv.weight, groups=x.size(1))  # (B, C, T)
        return F.silu(out).transpose(1, 2), window[:, :, window.size(-1) - (K - 1):]


class GatedAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose W_Q also projects a gate per head, [q_h ; gate_h], and whose heads'
    outputs are times sigmoid(gate) before W_O (Qwen3.5's full-attention layers)."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        adopt_attention(self, attn)  # k, v, o and the q/k norms as they are
        q = attn.q_proj
        self.q_proj = nn.Linear(q.in_features, 2 * q.out_features, bias=q.bias is not None)  # (B, T, 2 H Dh)

    def forward(self, x: Tensor, mask: Mask = None, *, need_weights: bool = False,
                rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache | None = None) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) -> (output (B, T, D), weights (B, H, T, S) or None)."""
        cache = as_cache(cache)
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.n_heads, 2 * self.head_dim)  # (B, T, H, 2 Dh): [q_h ; gate_h]
        q, gate = qg.chunk(2, dim=-1)  # (B, T, H, Dh) each
        q = self.q_norm(q.transpose(1, 2))  # (B, H, T, Dh)
        k = self.k_norm(self.split_heads(self.k_proj(x), self.n_kv_heads))  # (B, Hkv, T, Dh)
        v = self.split_heads(self.v_proj(x), self.n_kv_heads)  # (B, Hkv, T, Dh)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        k, v = cache.update(k, v)  # (B, Hkv, S, Dh)
        out, weights = self.attend(q, k, v, mask, need_weights)  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, -1) * gate.reshape(B, T, -1).sigmoid()  # (B, T, H * Dh)
        return self.o_proj(out), weights


def put_gated_attention(model: nn.Module, cfg: CausalLMConfig) -> None:
    """The softmax-attention layers (those not linear) get `GatedAttention`."""
    replace_layers(model, {f"layers.{i}.self_attn": layer.self_attn for i, layer in enumerate(model.layers)
                           if i not in cfg.linear_layers}, GatedAttention)


def put_deltanets(model: nn.Module, cfg: CausalLMConfig) -> None:
    """The linear-attention layers get `GatedDeltaNet` in place of attention."""
    linear = {f"layers.{i}.self_attn": model.layers[i].self_attn for i in sorted(cfg.linear_layers)}
    replace_layers(model, linear,
                   lambda attn: GatedDeltaNet(cfg).train(attn.training))


__all__ = ["GatedAttention", "GatedDeltaNet", "GatedRMSNorm", "QWEN3_5", "delta_rule", "put_deltanets",
           "put_gated_attention", "real_positions"]


# --- the family spec -----------------------------------------------------------------------------

def _layer_types(c: dict[str, Any]) -> list[str]:
    kinds = c.get("layer_types")
    if not kinds:  # every full_attention_interval-th layer is softmax attention (transformers' default 4)
        every = c.get("full_attention_interval", 4)
        kinds = ["linear_attention" if (i + 1) % every else "full_attention"
                 for i in range(require(c, "num_hidden_layers"))]
    unknown = sorted(set(kinds) - {"linear_attention", "full_attention"})
    if unknown:
        raise ValueError(f"{c.get('model_type')} config has layer_types with {unknown}: Qwen3.5 has "
                         "linear_attention and full_attention layers")
    return kinds


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen3.5 (text): the DeltaNet layers from layer_types, RoPE on a part of each head."""
    silu_only(c)
    no_attention_bias(c)
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    fraction = params.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
    deltanet = DeltaNetConfig(
        layers=[i for i, kind in enumerate(_layer_types(c)) if kind == "linear_attention"],
        key_heads=require(c, "linear_num_key_heads"), value_heads=require(c, "linear_num_value_heads"),
        key_dim=require(c, "linear_key_head_dim"), value_dim=require(c, "linear_value_head_dim"),
        conv_kernel=c.get("linear_conv_kernel_dim", 4))
    return rope_decoder(c, partial=True, norm="rmsnorm_offset", qk_norm="head", rope_fraction=float(fraction),
                        deltanet=deltanet, family=FamilyConfig(attn_output_gate=True))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    d = cfg.deltanet
    assert d is not None
    keys = rope_decoder_keys(cfg)
    keys["rope_parameters"] = {**keys["rope_parameters"], "partial_rotary_factor": cfg.rope_fraction}
    return {**keys, "attention_bias": False,
            "layer_types": ["linear_attention" if i in d.layers else "full_attention"
                            for i in range(cfg.n_layers)],
            "linear_num_key_heads": d.key_heads, "linear_num_value_heads": d.value_heads,
            "linear_key_head_dim": d.key_dim, "linear_value_head_dim": d.value_dim,
            "linear_conv_kernel_dim": d.conv_kernel}


def problems(cfg: CausalLMConfig) -> list[str]:
    found = [] if cfg.deltanet is not None else ["deltanet=None (Qwen3.5 has gated DeltaNet layers)"]
    if not cfg.family.attn_output_gate:
        found.append("attn_output_gate=False (Qwen3.5 gates its attention's output)")
    return found


_DELTANET = {  # Hugging Face's linear_attn -> handformer's self_attn (the block's token mixer)
    "in_proj_qkv.weight": "qkv_proj.weight",  # (C, D)
    "conv1d.weight": "conv.weight",  # (C, 1, K)
    "in_proj_z.weight": "z_proj.weight",  # (Hv*Dv, D)
    "in_proj_b.weight": "beta_proj.weight",  # (Hv, D)
    "in_proj_a.weight": "decay_proj.weight",  # (Hv, D)
    "A_log": "A_log", "dt_bias": "dt_bias",  # (Hv,)
    "norm.weight": "out_norm.weight",  # (Dv,)
    "out_proj.weight": "out_proj.weight",  # (D, Hv*Dv)
}
TENSORS = llama.llama_like(
    llama.linears({**llama.ATTENTION, **llama.MLP}), llama.QK_NORMS, llama.PRE_NORMS,  # q_proj (2 H Dh, D)
    {f"model.layers.{{i}}.linear_attn.{hf}": to(f"layers.{{i}}.self_attn.{ours}")
     for hf, ours in _DELTANET.items()})


# --- llama.cpp's qwen35 ----------------------------------------------------------------------------
# llama.cpp (its convert_hf_to_gguf.py and src/models/qwen35.cpp) names the DeltaNet tensors ssm_*
# and attn_qkv / attn_gate, and stores four things its own way (`_gguf_layout`):
# - A = -exp(A_log) (ssm_a) instead of A_log;
# - the convolution's filters (C, 1, K) as (C, K);
# - every RMSNorm's gain as 1 + w, but the gated norm's (ssm_norm), which is w;
# - the value heads tiled instead of grouped: handformer (and transformers) let value head j read
#   query/key head j // (Hv / Hk), llama.cpp j % Hk; so the value heads' rows of qkv (and of the
#   convolution), z, a, b, A and dt_bias, and the columns of out_proj, are reordered
#   [V0 V1 V2 | V3 V4 V5] -> [V0 V3 | V1 V4 | V2 V5] for Hk = 2, Hv = 6 (as llama.cpp's converter does).
# The block's second norm (before the FFN) is post_attention_norm; llama.cpp always turns RoPE with
# sections (M-RoPE, `mrope_sections`): for text every section has the token's position, plain RoPE.

GGUF_TENSORS = {
    **{name: keys for name, keys in llama.GGUF_TENSORS.items() if name != "blk.{i}.ffn_norm.weight"},
    **llama.GGUF_QK_NORMS,  # the full-attention layers; their attn_q holds [q_h ; gate_h]: (2 H Dh, D)
    "blk.{i}.post_attention_norm.weight": ("layers.{i}.ffn_norm.weight",),
    "blk.{i}.attn_qkv.weight": (f"{llama.ATTN}.qkv_proj.weight",),  # (C, D)
    "blk.{i}.attn_gate.weight": (f"{llama.ATTN}.z_proj.weight",),  # (Hv Dv, D)
    "blk.{i}.ssm_conv1d.weight": (f"{llama.ATTN}.conv.weight",),  # (C, K)
    "blk.{i}.ssm_alpha.weight": (f"{llama.ATTN}.decay_proj.weight",),  # (Hv, D)
    "blk.{i}.ssm_beta.weight": (f"{llama.ATTN}.beta_proj.weight",),  # (Hv, D)
    "blk.{i}.ssm_a": (f"{llama.ATTN}.A_log",),  # (Hv,): -exp(A_log)
    "blk.{i}.ssm_dt.bias": (f"{llama.ATTN}.dt_bias",),  # (Hv,)
    "blk.{i}.ssm_norm.weight": (f"{llama.ATTN}.out_norm.weight",),  # (Dv,)
    "blk.{i}.ssm_out.weight": (f"{llama.ATTN}.out_proj.weight",),  # (D, Hv Dv)
}
RECURRENT_LAYERS = "qwen35.attention.recurrent_layers"  # a bool a layer: True = DeltaNet


def mrope_sections(rotary_dim: int) -> list[int]:
    """qwen35.rope.dimension_sections: how M-RoPE shares the rotary frequencies among the time, height
    and width positions (one position for text: any split is plain RoPE). The released models'
    [11, 11, 10, 0] for their 32 frequencies, in thirds likewise for others (llama.cpp requires
    them to add up to at most the head width: the default breaks heads under 32 wide)."""
    n = rotary_dim // 2
    return [(n + 2) // 3, (n + 1) // 3, n // 3, 0]


def _value_heads(t: Tensor, dim: int, key_heads: int, width: int, to_tiled: bool) -> Tensor:
    """The value heads (each `width` along `dim`) from grouped to tiled order, or back."""
    per_key = t.size(dim) // width // key_heads
    t = t.unflatten(dim, (key_heads, per_key, width) if to_tiled else (per_key, key_heads, width))
    return t.transpose(dim, dim + 1).flatten(dim, dim + 2)  # (..., Hv * width, ...)


def _a_log(a: Tensor) -> Tensor:
    """A_log from llama.cpp's A = -exp(A_log): log(-A), moved by up to two float32 steps where that
    makes -exp(A_log) equal A bit for bit (the model computes with -exp(A_log))."""
    a = a.float()
    first = (-a.double()).log().float()
    inf = torch.full_like(first, float("inf"))
    candidates, up, down = [first], first, first
    for _ in range(2):
        up, down = torch.nextafter(up, inf), torch.nextafter(down, -inf)
        candidates += [up, down]
    out = first
    for c in reversed(candidates):  # the nearest that fits wins
        out = torch.where(-c.exp() == a, c, out)
    return out


# the tensors that hold value heads: name -> (dim, a head is value_dim wide (else 1), after the q and k rows)
_VALUE_HEADS = {"qkv_proj.weight": (0, True, True), "conv.weight": (0, True, True),
                "z_proj.weight": (0, True, False), "beta_proj.weight": (0, False, False),
                "decay_proj.weight": (0, False, False),
                "A_log": (0, False, False), "dt_bias": (0, False, False), "out_proj.weight": (1, True, False)}


def _gguf_layout(key: str, t: Tensor, cfg: CausalLMConfig, to_gguf: bool) -> Tensor:
    """One tensor of a Qwen3.5 run in llama.cpp's qwen35 layout (to_gguf), or back (see above)."""
    name = key.rsplit("self_attn.", 1)[-1]
    if name.endswith("norm.weight") and name != "out_norm.weight":
        return 1.0 + t.float() if to_gguf else t - 1.0  # 1 + w is exact in float32 both ways
    d = cfg.deltanet
    if d is None or name not in _VALUE_HEADS:
        return t
    if name == "conv.weight" and not to_gguf:
        t = t.unsqueeze(1)  # (C, K) -> (C, 1, K)
    if d.key_heads != d.value_heads:
        dim, wide, after_qk = _VALUE_HEADS[name]
        skip = 2 * d.key_heads * d.key_dim if after_qk else 0  # the q and k rows stay
        values = t.narrow(dim, skip, t.size(dim) - skip)
        values = _value_heads(values, dim, d.key_heads, d.value_dim if wide else 1, to_gguf)
        t = torch.cat([t.narrow(dim, 0, skip), values], dim=dim)
    if name == "A_log":
        return -t.exp() if to_gguf else _a_log(t)
    return t.squeeze(1) if name == "conv.weight" and to_gguf else t  # (C, 1, K) -> (C, K)


def _every(layers: list[int], n_layers: int) -> int | None:
    """n when the softmax-attention layers are every n-th (qwen35.full_attention_interval), else None."""
    full = [i for i in range(n_layers) if i not in layers]
    n = full[0] + 1 if full else None
    return n if n and layers == [i for i in range(n_layers) if (i + 1) % n] else None


def _write_gguf_keys(writer: Any, cfg: CausalLMConfig) -> None:
    """The DeltaNet's sizes in llama.cpp's ssm keys, which layers are DeltaNet, and M-RoPE's sections."""
    d = cfg.deltanet
    assert d is not None
    writer.add_ssm_conv_kernel(d.conv_kernel)
    writer.add_ssm_state_size(d.key_dim)
    writer.add_ssm_group_count(d.key_heads)
    writer.add_ssm_time_step_rank(d.value_heads)
    writer.add_ssm_inner_size(d.value_heads * d.value_dim)
    recurrent = [i in d.layers for i in range(cfg.n_layers)]  # (the gguf package 0.19 has no writer method)
    writer.add_key_value(RECURRENT_LAYERS, recurrent, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL)
    every = _every(sorted(d.layers), cfg.n_layers)
    if every is not None:
        writer.add_full_attention_interval(every)
    writer.add_rope_dimension_sections(mrope_sections(cfg.rotary_dim))


def _count(metadata: dict[str, Any], name: str, where: str, default: Any = ...) -> Any:
    value = metadata.get(f"qwen35.{name}", default)
    if value is ...:
        raise ValueError(f"{where} lacks qwen35.{name}, which a Qwen3.5 model needs")
    if not is_int(value) or value <= 0:
        raise ValueError(f"{where}: qwen35.{name}={value!r} must be a positive integer")
    return value


def _read_gguf_keys(metadata: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    """The DeltaNet's settings from llama.cpp's ssm keys (a value head as wide as inner_size says)."""
    if metadata.get("qwen35.nextn_predict_layers"):
        raise ValueError(f"{where} holds {metadata['qwen35.nextn_predict_layers']} multi-token prediction "
                         "layers, which import-gguf does not read; convert the checkpoint with "
                         "convert_hf_to_gguf.py --no-mtp")
    n_layers = _count(metadata, "block_count", where)
    value_heads = _count(metadata, "ssm.time_step_rank", where)
    inner = _count(metadata, "ssm.inner_size", where)
    if inner % value_heads:
        raise ValueError(f"{where}: qwen35.ssm.inner_size={inner} is not a multiple of "
                         f"qwen35.ssm.time_step_rank={value_heads} (the value heads)")
    recurrent = metadata.get(RECURRENT_LAYERS)
    if isinstance(recurrent, list):
        layers = [i for i, r in enumerate(recurrent[:n_layers]) if r]
    else:  # llama.cpp's rule without the list: every full_attention_interval-th layer is softmax
        every = _count(metadata, "full_attention_interval", where, 4)
        layers = [i for i in range(n_layers) if (i + 1) % every]
    deltanet = DeltaNetConfig(
        layers=layers, key_heads=_count(metadata, "ssm.group_count", where), value_heads=value_heads,
        key_dim=_count(metadata, "ssm.state_size", where), value_dim=inner // value_heads,
        conv_kernel=_count(metadata, "ssm.conv_kernel", where))
    return {"deltanet": deltanet, "family": FamilyConfig(attn_output_gate=True)}


def _gguf_problems(cfg: CausalLMConfig) -> list[str]:
    found = problems(cfg)
    d = cfg.deltanet
    if d is not None and d.value_dim != d.key_dim:
        found.append(f"deltanet.value_dim={d.value_dim} (llama.cpp's Qwen3.5 makes a DeltaNet value head as "
                     f"wide as a key head, key_dim={d.key_dim}; export-hf writes this run for transformers)")
    return found


GGUF = GgufEntry(
    "qwen35", "qwen3_5_text", "Qwen3.5", GGUF_TENSORS,
    {**llama.GGUF_BLOCK, **llama.NO_BIASES, "norm": ("rmsnorm_offset", "has RMSNorms of gain 1 + w"),
     "qk_norm": llama.HEAD_QK_NORM, "sliding_window": llama.NO_WINDOW_IN_LLAMA_CPP,
     "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP},
    biases=(), writes=frozenset({"qk_norm", "rope_fraction", "deltanet", "attn_output_gate"}),
    also_recorded=("qwen3_5",),
    code=GgufCode(write=_write_gguf_keys, read=_read_gguf_keys, problems=_gguf_problems, layout=_gguf_layout))

QWEN3_5 = FamilySpec(
    model_type="qwen3_5_text", name="Qwen3.5", hf_class="Qwen3_5ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES, "norm": ("rmsnorm_offset", "has RMSNorms of gain 1 + w"),
           "qk_norm": llama.HEAD_QK_NORM, "sliding_window": llama.NO_WINDOW,
           "rope_scaling": (None, "turns RoPE unscaled in handformer")},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    may_set=frozenset({"qk_norm", "rope_fraction", "attn_output_gate", "deltanet"}),
    hf_keys=frozenset({"partial_rotary_factor"}), problems=problems,
    claims=((4, lambda c: c.deltanet is not None),),
    variants=("GatedDeltaNet", "GatedAttention"),
    gguf=GGUF,
    look_alikes={"qwen3_next": "Qwen3-Next is Qwen3.5's hybrid with a mixture of experts, not implemented"},
    differences=Differences(
        norm="RMSNorm gain 1 + w", positions="RoPE on a quarter of each head",
        attention="gated DeltaNet (linear) in 3 layers of 4, gated attention in the 4th",
        cache="a convolution and a recurrent state per linear layer"))
