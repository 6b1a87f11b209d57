"""The reference computations of each component, written as plain functions, with every mistake of
`handformer.check.reference.diagnoses` available as a flag.

With no flags each function computes what handformer's own module computes (tests pin it); with a
flag it computes what a learner's code with that mistake computes, from the same weights. A flag is
"name" or "name:form", e.g. "softmax_wrong_dim:-2" or "no_residual:ffn". Masks are bool, True = may
attend, and are applied as the tutorials do (`masked_fill(-1e9)`), so a query with no visible key
gets uniform weights here, as in the learner's code.

Shape legend: B batch, T query length, S key length, D d_model, H heads, Dh head dim, F FFN width.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.reference.remembered import remembered

Linear = tuple[Tensor, Tensor | None]  # (weight (out, in), bias (out,) or None)
Flags = frozenset[str]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu2": lambda x: F.relu(x).square(),  # ReLU squared (Primer's, nanochat's): an activation
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's (core/activations.py)
}


def has(flags: Flags, name: str) -> str | None:
    """The form of flag `name` in `flags` ("" for a flag without a form), or None."""
    return _forms(frozenset(flags)).get(name)


@functools.lru_cache(maxsize=4096)
def _forms(flags: Flags) -> dict[str, str]:
    """Each flag's name -> its form; a search asks hundreds of thousands of times of the few sets of
    flags it tries, each set read once. Its callers only read the answer."""
    forms: dict[str, str] = {}
    for flag in flags:
        head, _, form = flag.partition(":")
        forms.setdefault(head, form)
    return forms


WARMUP_SHIFT = {"early": -1, "late": 1}  # schedule_warmup_off_by_one's forms: the warmup's shift


def warmup_with(warmup: float, flags: Flags) -> float:
    """The warmup a schedule uses: its own, or one step shorter or longer (schedule_warmup_off_by_one)."""
    return warmup + WARMUP_SHIFT.get(has(flags, "schedule_warmup_off_by_one"), 0)


def linear(x: Tensor, w: Linear) -> Tensor:
    return F.linear(x, w[0], w[1])


MASK_TRANSFORMS = frozenset({"mask_not_applied", "mask_hides_queries", "mask_repeat_order", "mask_inverted"})


def applied_keep(keep: Tensor | None, flags: Flags, n_heads: int = 1) -> Tensor | None:
    """The mask as the attention with these mistakes applies it (True = may attend): inverted,
    ignored, transposed (a (B, 1, 1, S) key mask turned into (B, 1, S, 1): queries hidden instead of
    keys), or repeated over the heads in the wrong order (d2l's (B * H) layout with `repeat` where
    `repeat_interleave` is meant: the mask of batch row (b * H + h) % B for head h of row b)."""
    if keep is None or has(flags, "mask_not_applied") is not None:
        return None
    if has(flags, "mask_hides_queries") is not None:
        keep = keep.transpose(-2, -1)
    if has(flags, "mask_repeat_order") is not None and keep.size(0) > 1:
        B = keep.size(0)
        order = torch.arange(B * n_heads) % B  # flat row b * H + h gets the mask of batch row ...
        keep = keep[order].reshape(B, n_heads, *keep.shape[2:])  # (B, H, T|1, S)
    if has(flags, "mask_inverted") not in (None, "causal"):  # causal: the causal mask alone (causal_keep)
        return ~keep
    return keep


def attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, flags: Flags = frozenset(),
              bias: Tensor | None = None, scaled: bool = True, softcap: float | None = None,
              scale: float | None = None, sinks: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(Dh) + bias) v for (B, H, T, Dh) queries; returns (out (B, H, T, Dh),
    weights). bias: a positional term added to the scores after the scale (ALiBi's, T5's), broadcasting
    to (B, H, T, S); scaled=False: no 1/sqrt(Dh) by design (T5's); softcap c: the scores soft-capped,
    c * tanh(scores / c), before the mask (Gemma 2's); scale: the scores times this configured value in
    place of 1/sqrt(Dh) (Granite's attention_multiplier, Gemma 2's query_pre_attn_scalar ** -0.5);
    sinks (H,): one more logit a head joins each softmax and is dropped after it (gpt-oss's)."""
    scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
    if scaled and has(flags, "no_scaling") is None:
        dk = q.size(-1)
        default = 1 / (dk if has(flags, "scale_by_dk") is not None else math.sqrt(dk))
        scores = scores * (scale or default)
    if bias is not None:
        scores = scores + bias
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    weights = (masked_softmax(scores, keep, flags) if sinks is None
               else sink_softmax(scores, keep, sinks, flags))  # (B, H, T, S)
    return weights @ v, weights  # (B, H, T, Dh)


def sink_softmax(scores: Tensor, keep: Tensor | None, sinks: Tensor, flags: Flags = frozenset()) -> Tensor:
    """The (B, H, T, S) weights with each head's sink logit as one more key in the softmax, dropped
    after it (its value is zero); the mask as the attention with these mistakes applies it."""
    keep = applied_keep(keep, flags, scores.size(1))
    if keep is not None:
        scores = scores.masked_fill(~keep, -1e9)
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, T, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, T, S)


def masked_softmax(scores: Tensor, keep: Tensor | None, flags: Flags = frozenset(), fill: float = -1e9,
                   ) -> Tensor:
    """softmax over the keys of (B, H, T, S) scores with the hidden ones filled first; the mask and
    softmax mistakes on request."""
    keep = applied_keep(keep, flags, scores.size(1))
    after = has(flags, "mask_after_softmax")
    if keep is not None and after is None:  # -inf: a row (or, over the wrong dim, a column) of them is NaN
        scores = scores.masked_fill(~keep, -math.inf if has(flags, "nan_on_masked_rows") is not None else
                                    fill)
    dim = has(flags, "softmax_wrong_dim")
    weights = torch.softmax(scores, dim=int(dim) if dim else -1)
    if keep is not None and after is not None:
        weights = weights.masked_fill(~keep, 0.0 if after == "zero" else fill)
    return weights


@dataclass
class MHAWeights:
    q: Linear
    k: Linear
    v: Linear
    o: Linear | None  # None: the learner's module has no output projection
    n_heads: int
    n_kv_heads: int | None = None  # grouped-query attention: fewer key/value heads than query heads
    rope: str | None = None  # positions inside: rotary "half", "interleaved", or a score bias (SCORE_BIASES)
    qk_norm: tuple[NormWeights, NormWeights] | None = None  # QK-norm: each query and key head normed
    table: Tensor | None = None  # T5's learned relative-position bias, (buckets, H)
    softcap: float | None = None  # the scores soft-capped, c * tanh(scores / c) (Gemma 2's)
    scale: float | None = None  # the scores' configured scale in place of 1/sqrt(Dh) (Granite's)
    sinks: Tensor | None = None  # (H,) gpt-oss's sink logits: a key of value zero in each head's softmax


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's slope of each head (Press et al.; BLOOM's build_alibi_tensor): 2^(-8 h / n) for h = 1..n
    with n the largest power of two <= n_heads, then every other slope of 2n for the heads left; (H,)."""
    n = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * h / n) for h in range(1, n + 1)]
    slopes += [2 ** (-8 * h / (2 * n)) for h in range(1, 2 * (n_heads - n), 2)]
    return torch.tensor(slopes, dtype=torch.float64)


def t5_buckets(relative: Tensor, bidirectional: bool, n_buckets: int, max_distance: int = 128) -> Tensor:
    """T5's bucket of each relative position (key - query): exact below half the buckets (of each
    direction when bidirectional), logarithmic up to max_distance, the last bucket beyond."""
    n_buckets //= 1 + bidirectional  # bidirectional: half the buckets for the keys after the query
    bucket = (relative > 0).long() * n_buckets * bidirectional
    distance = (-relative).clamp(min=0) + relative.clamp(min=0) * bidirectional  # one-way: after share 0
    exact = n_buckets // 2
    far = exact + (torch.log(distance.double().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (n_buckets - exact)).long()
    return bucket + torch.where(distance < exact, distance, far.clamp(max=n_buckets - 1))


def score_bias(w: MHAWeights, T: int, S: int) -> Tensor | None:
    """The positional term an attention with this scheme adds to its (B, H, T, S) scores, (1, H, T|1, S):
    ALiBi's slope times the key's position (the same for every query: softmax ignores a row's shift),
    T5's learned value of each relative position's bucket (bidirectional, or "t5_causal": a decoder's);
    None for any other scheme."""
    return BIAS_TERMS.get(w.rope, _no_term)(w, T, S)


def _alibi(w: MHAWeights, T: int, S: int) -> Tensor:
    slopes = alibi_slopes(w.n_heads)[:, None, None]  # (H, 1, 1)
    return (slopes * torch.arange(S, dtype=torch.float64))[None]  # (1, H, 1, S)


def _t5(w: MHAWeights, T: int, S: int) -> Tensor:
    assert w.table is not None  # a T5 reading is searched only where the attention holds the table
    relative = torch.arange(S)[None, :] - torch.arange(T)[:, None]  # (T, S): key - query
    buckets = t5_buckets(relative, w.rope == "t5", w.table.size(0))
    return w.table[buckets].permute(2, 0, 1)[None]  # (1, H, T, S)


def _no_term(w: MHAWeights, T: int, S: int) -> None:
    """The term of a scheme that adds none to the scores (a rotation, or no positions inside)."""


BIAS_TERMS: dict[str, Callable[[MHAWeights, int, int], Tensor]] = {"alibi": _alibi, "t5": _t5,
                                                                   "t5_causal": _t5}


SCORE_BIASES = ("alibi", "t5", "t5_causal", "unscaled")  # positions as a term on the scores, not a rotation
UNSCALED = ("t5", "t5_causal", "unscaled")  # no 1/sqrt(Dh) by design: T5's, whose bias is learned


def is_rotary(positions: str | None) -> bool:
    """Whether an attention's positions inside are a rotation of queries and keys (not a score bias)."""
    return positions is not None and positions not in SCORE_BIASES


def split_heads(x: Tensor, n_heads: int, flags: Flags) -> Tensor:
    B, T, width = x.shape
    if has(flags, "split_no_transpose") is not None:
        return x.view(B, n_heads, T, width // n_heads)  # (B, H, T, Dh) with positions mixed
    return x.view(B, T, n_heads, width // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def repeat_kv(x: Tensor, n_rep: int, flags: Flags = frozenset()) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, Hkv * n_rep, S, Dh): each key/value head shared by n_rep consecutive
    query heads; kv_repeat_order tiles them instead (head h gets kv head h % Hkv)."""
    if has(flags, "kv_repeat_order") is not None:
        return x.repeat(1, n_rep, 1, 1)  # (B, H, S, Dh): heads 0, 1, 0, 1, ...
    return x.repeat_interleave(n_rep, dim=1)  # (B, H, S, Dh): heads 0, 0, 1, 1, ...


# the mistakes an attention reads (multi_head_attention and what it calls; tests pin it from their code):
# a layer's other mistakes leave its answer as it is, so a search remembers one answer for all of them
ATTENTION_READS = frozenset({
    "kv_swapped", "split_no_transpose", "qk_norm_after_rope", "rope_no_offset", "rope_wrong_base",
    "rope_rotation_sign", "kv_repeat_order", "sink_not_in_softmax", "no_scaling", "scale_by_dk",
    "mask_not_applied", "mask_hides_queries", "mask_repeat_order", "mask_inverted", "mask_after_softmax",
    "nan_on_masked_rows", "softmax_wrong_dim", "concat_no_transpose", "no_output_projection"})


def multi_head_attention(w: MHAWeights, xq: Tensor, xk: Tensor, xv: Tensor, keep: Tensor | None,
                         flags: Flags = frozenset(), offset: int = 0) -> tuple[Tensor, Tensor]:
    """(B, T, D) queries, (B, S, D) keys and values -> ((B, T, D), weights (B, H, T, S)).
    offset: the position of the first query and key (for rotary positions)."""
    read = frozenset(f for f in flags if f.partition(":")[0] in ATTENTION_READS)
    return _multi_head_attention(w, xq, xk, xv, keep, read, offset)


@remembered
def _multi_head_attention(w: MHAWeights, xq: Tensor, xk: Tensor, xv: Tensor, keep: Tensor | None,
                          flags: Flags, offset: int) -> tuple[Tensor, Tensor]:
    B, T, _ = xq.shape
    wk, wv = (w.v, w.k) if has(flags, "kv_swapped") is not None else (w.k, w.v)
    n_kv = w.n_kv_heads or w.n_heads
    q = split_heads(linear(xq, w.q), w.n_heads, flags)  # (B, H, T, Dh)
    k = split_heads(linear(xk, wk), n_kv, flags)  # (B, Hkv, S, Dh)
    v = split_heads(linear(xv, wv), n_kv, flags)  # (B, Hkv, S, Dh)
    q, k = qk_positions(w, q, k, offset, flags)
    if n_kv != w.n_heads:
        k, v = repeat_kv(k, w.n_heads // n_kv, flags), repeat_kv(v, w.n_heads // n_kv, flags)  # (B, H, S, Dh)
    bias = score_bias(w, T, xk.size(1))
    sinks = w.sinks if has(flags, "sink_not_in_softmax") is None else None
    out, weights = attention(q, k, v, keep, flags, bias, w.rope not in UNSCALED, w.softcap,
                             w.scale, sinks)  # (B, H, T, Dh)
    width = out.size(1) * out.size(-1)
    if has(flags, "concat_no_transpose") is not None:
        out = out.contiguous().view(B, T, width)  # (B, T, H * Dh) from the raw (B, H, T, Dh) memory
    else:
        out = out.transpose(1, 2).contiguous().view(B, T, width)  # (B, T, H * Dh)
    if w.o is not None and has(flags, "no_output_projection") is None:
        out = linear(out, w.o)
    return out, weights


def qk_positions(w: MHAWeights, q: Tensor, k: Tensor, offset: int, flags: Flags) -> tuple[Tensor, Tensor]:
    """Queries (B, H, T, Dh) and keys (B, Hkv, S, Dh) with each head normed (QK-norm), then rotated
    by their positions; qk_norm_after_rope: rotated, then normed."""
    after = has(flags, "qk_norm_after_rope") is not None and is_rotary(w.rope)
    if w.qk_norm is not None and not after:
        q, k = heads_norm(w.qk_norm[0], q), heads_norm(w.qk_norm[1], k)
    if is_rotary(w.rope):
        q, k = rotary(q, w.rope, offset, flags), rotary(k, w.rope, offset, flags)
    if w.qk_norm is not None and after:
        q, k = heads_norm(w.qk_norm[0], q), heads_norm(w.qk_norm[1], k)
    return q, k


def heads_norm(w: NormWeights, x: Tensor) -> Tensor:
    """(B, H, T, Dh) normed over each head, or over all heads together where the norm is as wide as
    they are (OLMo-2's q_norm and k_norm, applied before the heads are split)."""
    if w.weight.numel() == x.size(-1):
        return norm(w, x, frozenset())
    B, heads, T, Dh = x.shape
    whole = norm(w, x.transpose(1, 2).reshape(B, T, heads * Dh), frozenset())  # (B, T, H * Dh)
    return whole.view(B, T, heads, Dh).transpose(1, 2)  # (B, H, T, Dh)


# a rotation's frequencies: those of a base, theta^(-2j/Dh), or the Dh/2 a module holds (a scaled schedule's)
Frequencies = float | tuple[float, ...]


def rope_angles(T: int, Dh: int, theta: Frequencies = 10000.0, offset: int = 0, flags: Flags = frozenset(),
                dtype: torch.dtype = torch.float64) -> Tensor:
    """(T, Dh/2) angles pos * theta^(-2j/Dh) of positions offset .. offset + T - 1 (pos * f_j where
    theta is the frequencies f_j themselves); the classic mistakes on request (positions from 0
    whatever the offset, a wrong exponent)."""
    start = 0 if has(flags, "rope_no_offset") is not None else offset
    pos = torch.arange(start, start + T, dtype=dtype)[:, None]  # (T, 1)
    two_j = torch.arange(0, Dh, 2, dtype=dtype)  # (Dh/2,): 2j
    j = two_j * EXPONENT_SCALE.get(has(flags, "rope_wrong_base"), 1)
    held = isinstance(theta, tuple)
    return pos * (torch.tensor(theta, dtype=dtype) if held else theta ** (-j / Dh))  # (T, Dh/2)


# rope_wrong_base's forms: theta^(-j/Dh), the pair index not doubled; theta^(2j/Dh), the reciprocal left out
EXPONENT_SCALE = {"exponent": 1 / 2, "positive": -1}


# the flags the rotary angles and their sign read, as the search writes them
ROPE_FORMS = frozenset({"rope_no_offset", "rope_wrong_base:exponent", "rope_wrong_base:positive",
                        "rope_rotation_sign"})


@functools.lru_cache(maxsize=256)
def _turns(T: int, Dh: int, theta: Frequencies, offset: int, flags: Flags, dtype: torch.dtype, swapped: bool,
           ) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, (T, Dh/2) each (never written to: remembered, since a search
    asks for the same ones under every set of mistakes). swapped: nanochat's halves rotated the
    other way, (a cos + b sin, b cos - a sin)."""
    angles = rope_angles(T, Dh, theta, offset, flags, dtype)  # (T, Dh/2)
    if has(flags, "rope_rotation_sign") is not None:
        angles = -angles
    cos, sin = angles.cos(), angles.sin()
    return cos, -sin if swapped else sin


def rotary(x: Tensor, layout: str, offset: int = 0, flags: Flags = frozenset(), theta: Frequencies = 10000.0,
           ) -> Tensor:
    """(B, H, T, Dh) queries or keys rotated by their positions' angles. "half": dimension j pairs
    with j + Dh/2 (Hugging Face, handformer); "interleaved": 2j with 2j + 1 (Meta's complex
    freqs_cis); "swapped": half pairs rotated the other way (nanochat's). rope_rotation_sign
    rotates the other way (rotate_half's minus on the wrong half). "half:W": the first W dims of each
    head turn, the rest pass through (partial rotary: GPT-NeoX's rotary_pct, Phi's)."""
    layout, _, part = layout.partition(":")  # "half:2": the first 2 dims of each head turn (partial rotary)
    if part:
        turned = rotary(x[..., :int(part)], layout, offset, flags, theta)
        return torch.cat([turned, x[..., int(part):]], dim=-1)  # (B, H, T, Dh)
    T, Dh = x.size(-2), x.size(-1)
    own = ROPE_FORMS.intersection(flags)  # the same angles for every other set of mistakes
    cos, sin = _turns(T, Dh, theta, offset, own, x.dtype, layout == "swapped")  # (T, Dh/2) each
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]  # (B, H, T, Dh/2) each
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)  # (B, H, T, Dh)
    a, b = x[..., : Dh // 2], x[..., Dh // 2:]  # (B, H, T, Dh/2) each
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (B, H, T, Dh)


@dataclass
class FFNWeights:
    up: Linear
    down: Linear | None  # None: the learner's FFN has no down projection
    gate: Linear | None = None
    activation: str = "relu"


@dataclass
class MoEWeights:
    """A sparse mixture of experts (Mixtral's): the router, one gated FFN an expert, top_k, and whether
    the chosen weights are rescaled to sum to 1."""

    router: Linear
    experts: list[FFNWeights]
    top_k: int
    normalize: bool
    shared: list[FFNWeights] = field(default_factory=list)  # experts every token goes through
    shared_gate: Linear | None = None  # sigmoid(x g^T) scales the shared expert (Qwen2-MoE's); None: as is


def mixture_of_experts(w: MoEWeights, x: Tensor, flags: Flags = frozenset()) -> Tensor:
    """(B, T, D) -> (B, T, D): softmax of the router's logits, each token's top_k experts, their
    weights renormalized (`normalize`), the weighted sum of those experts' outputs plus the shared
    expert's (scaled by its sigmoid gate where it has one), as
    handformer.nn.moe.MixtureOfExperts; the experts' own mistakes from `flags`."""
    probs = torch.softmax(linear(x, w.router), dim=-1)  # (B, T, E)
    weights, chosen = probs.topk(w.top_k, dim=-1)  # (B, T, k) each
    weights = weights / weights.sum(-1, keepdim=True) ** w.normalize  # (to the power False: divided by 1)
    outs = torch.stack([feed_forward(e, x, flags) for e in w.experts], dim=-2)  # (B, T, E, D)
    picked = outs.gather(-2, chosen[..., None].expand(*chosen.shape, outs.size(-1)))  # (B, T, k, D)
    shared = sum(feed_forward(s, x, flags) for s in w.shared)  # every token's (0: none)
    scale = 1.0 if w.shared_gate is None else torch.sigmoid(linear(x, w.shared_gate))  # (B, T, 1)
    return (weights[..., None] * picked).sum(-2) + scale * shared  # (B, T, D)


def feed_forward(w: FFNWeights | MoEWeights, x: Tensor, flags: Flags = frozenset()) -> Tensor:
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when gated; (B, T, D) -> (B, T, D).
    Mistakes: no activation, the activation after the gate's product, no down projection (the
    output is then (B, T, F)). A mixture of experts: `mixture_of_experts`."""
    if isinstance(w, MoEWeights):
        return mixture_of_experts(w, x, flags)
    act = (lambda h: h) if has(flags, "ffn_no_activation") is not None else ACTIVATIONS[w.activation]
    if w.gate is None:
        hidden = act(linear(x, w.up))  # (B, T, F)
    elif has(flags, "gated_act_after_product") is not None:
        hidden = act(linear(x, w.gate) * linear(x, w.up))  # (B, T, F)
    else:
        hidden = act(linear(x, w.gate)) * linear(x, w.up)  # (B, T, F)
    if has(flags, "ffn_no_down_projection") is not None or w.down is None:
        return hidden
    return linear(hidden, w.down)


@dataclass
class NormWeights:
    weight: Tensor
    bias: Tensor | None
    eps: float
    kind: str = "layernorm"  # layernorm | rmsnorm
    flags: Flags = frozenset()  # the learner's norm's own mistakes (found by running it alone)
    offset: bool = False  # the weight is 1 + the learner's (Gemma's gain kept as an offset from one)


@remembered
def norm(w: NormWeights, x: Tensor, flags: Flags | None = None) -> Tensor:
    """LayerNorm or RMSNorm over the last dimension, with the norm's mistakes: the Annotated
    Transformer's unbiased std + eps (or the unbiased variance inside the root), eps outside the
    square root, RMSNorm's sum instead of mean of the squares or no square root, the gain (or bias)
    not applied, the statistics over the wrong axis."""
    flags = w.flags if flags is None else flags
    wrong = has(flags, "norm_wrong_dim")
    dims = {"-2": (-2,), "all": tuple(range(x.dim()))}.get(wrong, (-1,))  # the axes its statistics take
    eps_out = has(flags, "norm_eps_outside_sqrt") is not None
    if w.kind == "rmsnorm":
        square = x.pow(2)
        ms = square.sum(dims, keepdim=True) if has(flags, "rmsnorm_sum_squares") is not None else (
            square.mean(dims, keepdim=True))
        if has(flags, "rmsnorm_no_sqrt") is not None:
            y = x / (ms + w.eps)
        else:
            y = x / (ms.sqrt() + w.eps) if eps_out else x * torch.rsqrt(ms + w.eps)
        out, bias = y, None
    else:
        centred = x - x.mean(dims, keepdim=True)
        unbiased = has(flags, "layernorm_unbiased_std")
        var = centred.pow(2).sum(dims, keepdim=True) / (
            math.prod(map(x.size, dims)) - (unbiased is not None))
        if unbiased == "std" or (unbiased is None and eps_out):
            out = centred / (var.sqrt() + w.eps)  # x.std() + eps: eps outside the root
        else:
            out = centred / torch.sqrt(var + w.eps)
        bias = w.bias
    gain = has(flags, "norm_no_gain")
    if gain != "gain":
        out = w.weight * out
    if bias is not None and gain != "bias":
        out = out + bias
    return out


RMS_FLAGS = ("rmsnorm_sum_squares", "rmsnorm_no_sqrt", "norm_eps_outside_sqrt", "norm_no_gain:gain",
             "norm_wrong_dim:-2", "norm_wrong_dim:all")
LN_FLAGS = ("layernorm_unbiased_std:std", "layernorm_unbiased_std:var", "norm_eps_outside_sqrt",
            "norm_no_gain:gain", "norm_no_gain:bias", "norm_wrong_dim:-2", "norm_wrong_dim:all")
LN_NO_BIAS_FLAGS = ("layernorm_unbiased_std:std", "layernorm_unbiased_std:var", "norm_eps_outside_sqrt",
                    "norm_no_gain:gain", "norm_wrong_dim:-2", "norm_wrong_dim:all")  # no bias to leave out
# the mistakes a norm can be searched for, by (its kind, whether it has a bias)
NORM_FLAGS = {("rmsnorm", False): RMS_FLAGS, ("rmsnorm", True): RMS_FLAGS,
              ("layernorm", False): LN_NO_BIAS_FLAGS, ("layernorm", True): LN_FLAGS}


def norm_flags(kind: str, has_bias: bool) -> tuple[str, ...]:
    """The mistakes a norm of this kind can be searched for."""
    return NORM_FLAGS[kind, has_bias]


@dataclass
class LayerWeights:
    """An encoder layer, decoder layer or decoder-only block: attentions, FFN, one norm a sublayer."""

    self_attn: MHAWeights
    ffn: FFNWeights
    norms: list[NormWeights]  # in sublayer order: self-attention, (cross-attention,) FFN
    cross_attn: MHAWeights | None = None
    placement: str = "post"  # the placement every sublayer uses unless a pre_norm flag flips one
    sublayers: list[str] = field(default_factory=lambda: ["attn", "ffn"])
    residual: float = 1.0  # pre-norm: each sublayer's output times this before the add (Granite's)
    gains: tuple[Tensor | None, ...] = ()  # a per-channel gain a sublayer, folded in its output (LayerScale)


class Unkept(list):
    """A trace no one reads, the layers' default: what is added to it is dropped."""

    def append(self, item: Tensor) -> None:
        """Drop the item."""

    def __iadd__(self, items: Iterable[Tensor]) -> Unkept:
        return self


UNKEPT = Unkept()


def sublayer(w: LayerWeights, x: Tensor, f: Callable[[Tensor], Tensor], name: str, flags: Flags,
             trace: list[Tensor] = UNKEPT) -> Tensor:
    """post: norm(x + f(x)); pre: x + f(norm(x)). Mistakes: no_residual drops the `x +`;
    residual_from_normed adds f to norm(x) instead of x (pre-norm: h = norm(x); x = h + f(h));
    shared_norm uses the first (or last) norm for every sublayer."""
    trace.append(x)  # the residual stream entering the sublayer
    if w.placement == "sandwich":
        return sandwich_sublayer(w, x, f, name, flags)
    shared = has(flags, "shared_norm")
    n = w.norms[{"first": 0, "last": -1}.get(shared, w.sublayers.index(name))]
    pre = (w.placement == "pre") != (has(flags, "pre_norm") == name)
    residual = has(flags, "no_residual") not in (name, "all")  # "all": a residual wrapper shared by all
    if w.placement == "reordered":  # OLMo 2's: the sublayer's output normed inside the residual
        return x + norm(n, f(x)) if residual else norm(n, f(x))
    if pre:
        h = norm(n, x)
        start = h if has(flags, "residual_from_normed") in (name, "all") else x
        return start + f(h) * w.residual if residual else f(h) * w.residual
    h = f(x)
    trace.append(x + h)  # the sum before the norm
    return norm(n, x + h if residual else h)


def sandwich_sublayer(w: LayerWeights, x: Tensor, f: Callable[[Tensor], Tensor], name: str,
                     flags: Flags) -> Tensor:
    """Gemma 2/3's: x + norm_after(f(norm_before(x))), two norms a sublayer. Mistakes: no_residual,
    residual_from_normed, and sandwich_norm_missing (the norm after the sublayer not applied)."""
    i = 2 * w.sublayers.index(name)
    h = norm(w.norms[i], x)
    out = f(h)
    if has(flags, "sandwich_norm_missing") != name:
        out = norm(w.norms[i + 1], out)
    if has(flags, "no_residual") in (name, "all"):
        return out
    return (h if has(flags, "residual_from_normed") in (name, "all") else x) + out


def encoder_layer(w: LayerWeights, x: Tensor, keep: Tensor | None, flags: Flags = frozenset(),
                  trace: list[Tensor] = UNKEPT) -> Tensor:
    """The encoder layer and the decoder-only block: self-attention, then FFN; (B, T, D). `trace`
    collects the residual stream between the sublayers (where dropout must not be)."""
    if w.placement == "parallel":
        return parallel_block(w, x, keep, flags, trace)
    x = sublayer(w, x, lambda h: multi_head_attention(w.self_attn, h, h, h, keep, flags)[0], "attn",
                 flags, trace)
    x = sublayer(w, x, lambda h: feed_forward(w.ffn, h, flags), "ffn", flags, trace)
    trace.append(x)
    return x


def parallel_block(w: LayerWeights, x: Tensor, keep: Tensor | None, flags: Flags = frozenset(),
                   trace: list[Tensor] = UNKEPT) -> Tensor:
    """GPT-J's, GPT-NeoX's, Falcon's and Phi's block: x + attn(norm_1(x)) + ffn(norm_2(x)), both
    sublayers reading the block's input (norm_2 is norm_1 where the block has one norm); (B, T, D)."""
    attn = multi_head_attention(w.self_attn, *[norm(w.norms[0], x)] * 3, keep, flags)[0]
    out = x + attn + feed_forward(w.ffn, norm(w.norms[-1], x), flags)
    trace += [x, out]
    return out


def decoder_layer(w: LayerWeights, x: Tensor, memory: Tensor, src_keep: Tensor | None,
                  tgt_keep: Tensor | None, flags: Flags = frozenset(), trace: list[Tensor] = UNKEPT,
                  ) -> Tensor:
    """Masked self-attention, cross-attention over `memory` (B, S, D), FFN; (B, T, D)."""
    assert w.cross_attn is not None
    if has(flags, "decoder_masks_swapped") is not None:
        src_keep, tgt_keep = tgt_keep, src_keep
    x = sublayer(w, x, lambda h: multi_head_attention(w.self_attn, h, h, h, tgt_keep, flags)[0],
                 "attn", flags, trace)
    x = sublayer(w, x, lambda h: multi_head_attention(w.cross_attn, h, memory, memory, src_keep,
                                                      flags)[0], "cross", flags, trace)
    x = sublayer(w, x, lambda h: feed_forward(w.ffn, h, flags), "ffn", flags, trace)
    trace.append(x)
    return x


def add_norm(w: NormWeights, x: Tensor, y: Tensor, flags: Flags = frozenset()) -> Tensor:
    """d2l's AddNorm(X, Y): norm(dropout(Y) + X); no_residual drops the X."""
    return norm(w, y if has(flags, "no_residual") is not None else x + y)


def causal_keep(T: int, flags: Flags = frozenset(), device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query t may see key s: s <= t; off by one, or inverted
    (mask_inverted:causal, an attention's own causal mask built the wrong way round), on request."""
    form = has(flags, "causal_off_by_one")
    diagonal = {"no_self": -1, "sees_next": 1}.get(form, 0)
    keep = torch.ones(T, T, dtype=torch.bool, device=device).tril(diagonal)
    return ~keep if has(flags, "mask_inverted") == "causal" else keep  # the mask's own inversion


def _interleaved(sines: Tensor, cosines: Tensor) -> Tensor:
    return torch.stack([sines, cosines], dim=-1).flatten(1)  # (T, D/2) twice -> (T, D): sin, cos, sin, ...


def _halves(sines: Tensor, cosines: Tensor) -> Tensor:
    return torch.cat([sines, cosines], dim=1)  # (T, D/2) twice -> (T, D): [sin | cos]


# the sinusoidal table's layouts: (how the sines and cosines make the table, the number of steps the
# D/2 exponents i / steps spread over): the paper's; halves with the paper's frequencies (Marian's,
# torch.cat tutorials'); tensor2tensor's timing signal (fairseq's, Whisper's), its D/2 timescales
# spread from 1 to 10000 over D/2 - 1 steps
PE_LAYOUTS: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[int], float]]] = {
    "paper": (_interleaved, lambda D: D / 2), "halves": (_halves, lambda D: D / 2),
    "t2t": (_halves, lambda D: D / 2 - 1)}


def sinusoidal(T: int, D: int, flags: Flags = frozenset(), dtype: torch.dtype = torch.float64,
               layout: str = "paper") -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(...); (T, D); in another layout of
    PE_LAYOUTS on request. Flags give the classic wrong versions."""
    join, steps = PE_LAYOUTS[layout]
    pos = torch.arange(T, dtype=dtype)[:, None]  # (T, 1)
    i = torch.arange(D // 2, dtype=dtype)  # (D/2,): the pair's index
    form = has(flags, "pe_wrong_frequency")
    if form == "dim_index":  # column j uses 10000^(j/D), not the pair's 2i
        angle = pos / 10000 ** (torch.arange(D, dtype=dtype) / D)  # (T, D)
        even, odd = angle[:, 0::2], angle[:, 1::2]
    else:
        exponent = {"pair_index": i / 2 / steps(D), "positive": -i / steps(D),
                    "not_divided": i / steps(D) * D,  # 10000^(2i), not 10000^(2i/D)
                    "doubled": 2 * i / steps(D)}.get(form, i / steps(D))  # 10000^(4i/D)
        even = odd = pos / 10000 ** exponent  # (T, D/2)
    sin, cos = (torch.cos, torch.sin) if has(flags, "pe_sin_cos_swapped") is not None else (
        torch.sin, torch.cos)
    return join(sin(even), cos(odd))  # (T, D)
