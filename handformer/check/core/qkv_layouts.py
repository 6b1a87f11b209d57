"""The layouts a fused query/key/value projection's rows may have, as the learner's code splits them:

    blocks   [Q | K | V]: every query head, then the key heads, then the value heads (GPT-2's c_attn,
             Falcon's and SantaCoder's multi-query [q heads | k | v], Phi-3's qkv_proj)
    grouped  per key/value head g: [its query heads | k_g | v_g] (GPT-NeoX's per-head [q_h | k_h | v_h]
             when every head has its own key and value; Falcon's new architecture with groups)

and the layout found for each fused layer (check/core/fused_qkv.py finds it); either with its key and
value parts the other way round ("blocks_vk", "grouped_vk") where the file states that order for it
(CodeGen's shards, each holding [q | v | k]).

Shape legend: D d_model, Dh head width, kv = n_kv_heads * Dh, R = D + 2 * kv the fused rows.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

Rows = tuple[Tensor, Tensor, Tensor]  # the fused rows of W_Q, W_K, W_V


def _blocks(D: int, kv: int, head_dim: int) -> Rows:
    rows = torch.arange(D + 2 * kv)
    return rows[:D], rows[D:D + kv], rows[D + kv:]


def grouped(D: int, kv: int, head_dim: int) -> Rows:
    """Per key/value head: its n_rep query heads, its key head, its value head."""
    groups, n_rep = kv // head_dim, D // kv
    rows = torch.arange(D + 2 * kv).view(groups, n_rep + 2, head_dim)  # (groups, n_rep + 2, Dh)
    return rows[:, :n_rep].reshape(-1), rows[:, n_rep].reshape(-1), rows[:, n_rep + 1].reshape(-1)


def _value_first(layout: Callable[[int, int, int], Rows]) -> Callable[[int, int, int], Rows]:
    """The layout with its key and value parts the other way round: [q | v | k]."""
    def rows(D: int, kv: int, head_dim: int) -> Rows:
        q, first, second = layout(D, kv, head_dim)
        return q, second, first
    return rows


LAYOUTS: dict[str, Callable[[int, int, int], Rows]] = {"blocks": _blocks, "grouped": grouped}
STATED = {"blocks_vk": _value_first(_blocks), "grouped_vk": _value_first(grouped)}  # as the file says
FOUND: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()  # fused layer -> layout


def ffn_ups(shapes: list[tuple[int, ...]]) -> set[int]:
    """The positions of the (F, D) linears beside an FFN's down projection (D, F), F != D (a gated FFN's
    gate and up in a row, then its down; or Meta's w1, w2, w3: the up right after it): an FFN's up
    projection, never a fused q|k|v projection, whatever F (nn.TransformerEncoderLayer(dim_feedforward=
    2 * d_model): 2D; or 3D). A fused projection is followed by its attention's output (D, D)."""
    ups: set[int] = set()
    run: list[int] = []  # the linears of one shape in a row so far
    for i, shape in enumerate(shapes):
        if run and shape == shapes[run[0]][::-1] and shape[0] != shape[1]:  # the down projection
            ups |= set(run) | {j for j in (i + 1,) if j < len(shapes) and shapes[j] == shapes[run[0]]}
        run = [*run, i] if run and shape == shapes[run[0]] else [i]
    return ups


def fused_before_output(shapes: list[tuple[int, ...]], D: int, head_dim: int) -> set[int]:
    """The positions of the (D + 2 kv, D) linears that an attention's output projection (D, D)
    follows: a fused q|k|v projection (nanoGPT's c_attn then c_proj), never an FFN's up projection of
    that width."""
    return {i for i, (shape, after) in enumerate(zip(shapes, shapes[1:]))
            if shape[1:] == (D,) and kv_width(shape[0], D, head_dim) and after == (D, D)}


def kv_width(rows: int, D: int, head_dim: int) -> int:
    """kv of a fused (D + 2 kv, D) projection whose key/value heads are whole heads, at most D wide;
    0 for any other shape."""
    kv = (rows - D) / 2
    return int(kv) if kv in range(head_dim, D + 1, head_dim) and D % kv == 0 else 0
