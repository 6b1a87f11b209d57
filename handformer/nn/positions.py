"""Position information: sinusoidal (the paper, section 3.5), learned (GPT-2) and rotary (RoPE, Llama).

Sinusoidal and learned encodings are added to the token embeddings; rotary embeddings rotate the
queries and keys inside attention instead. All take explicit position ids, so cached decoding and
left-padded batches get the right positions. Long-context variants of RoPE change its frequencies
(Llama 3.1's scaling, linear interpolation, LongRoPE, YaRN); partial RoPE (Phi-4-mini) turns only the
first dims of each head.

Shape legend: B batch, T length, D d_model, Dh head dim, P max positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.config import (
    BlockConfig,
    LinearRopeScaling,
    Llama3RopeScaling,
    LongRopeScaling,
    YarnRopeScaling,
)


def sinusoidal_table(max_positions: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(pos / 10000^(2i/D)); (P, D)."""
    position = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (P, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)
                    * (-math.log(10000.0) / d_model))  # (D/2,)
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table  # (P, D)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings; no parameters."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model), persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.table[position_ids]  # (B, T) -> (B, T, D)


class LearnedPositions(nn.Module):
    """One trained vector per position (GPT-2's `wpe`)."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_positions, d_model) * 0.02)

    def forward(self, position_ids: Tensor) -> Tensor:
        return F.embedding(position_ids, self.weight)  # (B, T) -> (B, T, D)


class NoPositions(nn.Module):
    """Nothing added to the embeddings: models with rotary positions (applied inside attention)
    or none at all."""

    def forward(self, position_ids: Tensor) -> float:
        return 0.0

    __call__ = forward  # a plain call, without nn.Module's hooks: nothing to add costs nothing


def llama3_inv_freq(inv_freq: Tensor, scaling: Llama3RopeScaling) -> Tensor:
    """Llama 3.1's frequency-dependent scaling of the rotary frequencies (Dh/2,).

    Long wavelengths (> original_max_positions / low_freq_factor) turn `factor` times slower, short
    ones (< original_max_positions / high_freq_factor) are kept, and in between the two are blended
    linearly in original_max_positions / wavelength. Same float32 arithmetic as Hugging Face's
    rope_type "llama3", so imported Llama 3.x models give the same angles.
    """
    context = scaling.original_max_positions
    low_freq_wavelen = context / scaling.low_freq_factor
    high_freq_wavelen = context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq  # (Dh/2,)
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((context / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))  # 0 at the long end, 1 at the short
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


# Each kind of long-context scaling of the rotary frequencies, by the type of its settings
# (LongRoPE has two sets of frequencies: LongRotaryEmbedding).
ROPE_SCALING = {type(None): lambda inv_freq, scaling: inv_freq, Llama3RopeScaling: llama3_inv_freq,
                LinearRopeScaling: lambda inv_freq, scaling: inv_freq / scaling.factor}


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, half-split convention (as Hugging Face and litgpt).

    Dimension j of the first half pairs with dimension j + Dh/2 and that pair is rotated by angle
    pos * theta^(-2j/Dh). Queries and keys rotated this way make q.k depend on their distance only.
    `scaling` (Llama 3.1) stretches the low frequencies for long contexts.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float = 10000.0,
                 scaling: Llama3RopeScaling | LinearRopeScaling | None = None) -> None:
        """head_dim: the dims turned (all of each head's, or the first rope_fraction of them)."""
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        inv_freq = ROPE_SCALING[type(scaling)](inv_freq, scaling)  # (Dh/2,)
        self.register_tables("", inv_freq, max_positions)

    def register_tables(self, prefix: str, inv_freq: Tensor, positions: int, factor: float = 1.0) -> None:
        """cos and sin of every position's angles, (P, Dh) each, times `factor` (LongRoPE's)."""
        angles = torch.outer(torch.arange(positions).float(), inv_freq)  # (P, Dh/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, Dh)
        self.register_buffer(prefix + "cos", angles.cos() * factor, persistent=False)
        self.register_buffer(prefix + "sin", angles.sin() * factor, persistent=False)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T) position ids -> (cos, sin), each (B, 1, T, Dh), broadcast over heads."""
        return self.cos[position_ids][:, None], self.sin[position_ids][:, None]


class LongRotaryEmbedding(RotaryEmbedding):
    """LongRoPE (Phi-3.5, Phi-4-mini): frequency j is theta^(-2j/Dh) / factor_j, with the short
    factors while every position of a forward is within original_max_positions and the long
    factors once one is past it (transformers chooses so, per forward, by the largest position
    id); cos and sin are multiplied by the attention factor. Same float32 arithmetic as
    transformers' rope_type "longrope", so the angles are its own."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: LongRopeScaling) -> None:
        nn.Module.__init__(self)
        self.original = scaling.original_max_positions
        attention_factor = scaling.cos_sin_factor(max_positions)
        shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # (Dh/2,)
        short = 1.0 / (torch.tensor(scaling.short_factor, dtype=torch.float32) * theta ** shape)
        long = 1.0 / (torch.tensor(scaling.long_factor, dtype=torch.float32) * theta ** shape)
        self.register_tables("", short, min(self.original, max_positions), attention_factor)
        self.register_tables("long_", long, max_positions, attention_factor)

    def factor_set(self, positions: int) -> int:
        """Which factors a forward whose longest row has `positions` positions turns queries and
        keys with: 0 short, 1 long. Keys cached under the other set are stale (a decoding engine
        asks, before it reuses them)."""
        return int(positions > self.original)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T) position ids -> (cos, sin), each (B, 1, T, Dh), of the short or long factors."""
        if int(position_ids.max()) >= self.original:  # past the pre-training context: the long set
            return self.long_cos[position_ids][:, None], self.long_sin[position_ids][:, None]
        return self.cos[position_ids][:, None], self.sin[position_ids][:, None]


def yarn_inv_freq(head_dim: int, theta: float, scaling: YarnRopeScaling) -> Tensor:
    """YaRN's rotary frequencies (Dh/2,) (Peng et al. 2023, "NTK-by-parts"): a frequency that turns
    more than beta_fast times over the original context is kept (extrapolated), one that turns
    fewer than beta_slow times is divided by factor (interpolated), and a linear ramp over the
    dims between blends the two. Same float32 arithmetic as transformers' rope_type "yarn"."""
    periods = theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)  # (Dh/2,)

    def dim_of(rotations: float) -> float:  # the dim whose frequency turns `rotations` times
        context = scaling.original_max_positions
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling.beta_fast), dim_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = (torch.arange(head_dim // 2, dtype=torch.float32) - low) / max(high - low, 0.001)  # (Dh/2,)
    kept = 1 - ramp.clamp(0, 1)  # (Dh/2,): 1 = kept, 0 = divided by factor
    return 1.0 / (scaling.factor * periods) * (1 - kept) + 1.0 / periods * kept


class YarnRotaryEmbedding(RotaryEmbedding):
    """RoPE with YaRN's frequencies (`yarn_inv_freq`), cos and sin times its attention factor."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: YarnRopeScaling) -> None:
        nn.Module.__init__(self)
        inv_freq = yarn_inv_freq(head_dim, theta, scaling)  # (Dh/2,)
        self.register_tables("", inv_freq, max_positions, scaling.cos_sin_factor())


class NoRotary(nn.Module):
    """No rotation of queries and keys: models whose positions are added to the embeddings, or
    that have none."""

    def forward(self, position_ids: Tensor) -> None:
        return None

    __call__ = forward  # a plain call, without nn.Module's hooks


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # (..., Dh/2) each
    return torch.cat([-x2, x1], dim=-1)  # (..., Dh)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, H, T, Dh) queries or keys by their positions' angles; tables narrower than Dh
    (partial RoPE, Phi-4-mini) turn the first cos.size(-1) dims and leave the others as they are."""
    return rotate(x, cos.type_as(x), sin.type_as(x))  # float32 tables; bf16 queries and keys under autocast


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`apply_rotary` with tables already in x's dtype."""
    turned = cos.size(-1)
    if turned < x.size(-1):  # partial RoPE: the first dims turn, the rest pass through
        return torch.cat([rotate(x[..., :turned], cos, sin), x[..., turned:]], dim=-1)
    return (x * cos) + (rotate_half(x) * sin)


ADDED_POSITIONS = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}


def make_positions(cfg: BlockConfig) -> nn.Module:
    """The position encoding added to the embeddings (`NoPositions` for rotary and "none")."""
    return ADDED_POSITIONS.get(cfg.position, lambda *_: NoPositions())(cfg.max_positions, cfg.d_model)


# RoPE of a config, by its kind of scaling: LongRoPE has two sets of tables, the others one.
ROTARY_CLASSES = {LongRopeScaling: LongRotaryEmbedding, YarnRopeScaling: YarnRotaryEmbedding}
ROTARY = {"rope": lambda c: ROTARY_CLASSES.get(type(c.rope_scaling), RotaryEmbedding)(
    c.rotary_dim, c.max_positions, c.rope_theta, c.rope_scaling)}


def make_rotary(cfg: BlockConfig) -> nn.Module:
    """The rotary embedding of a position="rope" config (`NoRotary` for the others)."""
    return ROTARY.get(cfg.position, lambda cfg: NoRotary())(cfg)
