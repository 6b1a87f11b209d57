"""A fused query/key/value projection, its rows read in the layout the learner's code splits them:

    blocks   [Q | K | V]: every query head, then the key heads, then the value heads (GPT-2's c_attn,
             Falcon's and SantaCoder's multi-query [q heads | k | v], Phi-3's qkv_proj)
    grouped  per key/value head g: [its query heads | k_g | v_g] (GPT-NeoX's per-head [q_h | k_h | v_h]
             when every head has its own key and value; Falcon's new architecture with groups)

Which one a learner wrote is found by what the module does, not by names: on one token, attention's
output depends on the value rows alone (a softmax over one key is 1), so a layout is the learner's
when changing the rows it calls query and key leaves that output unchanged. Where the layouts would
split the rows the same way (one key/value head, or one head) nothing is run; where the output cannot
tell them apart, blocks (the common layout) is compared.

Shape legend: D d_model, Dh head width, kv = n_kv_heads * Dh, R = D + 2 * kv the fused rows.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.weights import FFN_PATH, Leaf, Slot, leaves, of_kind

Rows = tuple[Tensor, Tensor, Tensor]  # the fused rows of W_Q, W_K, W_V


def _blocks(D: int, kv: int, head_dim: int) -> Rows:
    rows = torch.arange(D + 2 * kv)
    return rows[:D], rows[D:D + kv], rows[D + kv:]


def _grouped(D: int, kv: int, head_dim: int) -> Rows:
    """Per key/value head: its n_rep query heads, its key head, its value head."""
    groups, n_rep = kv // head_dim, D // kv
    rows = torch.arange(D + 2 * kv).view(groups, n_rep + 2, head_dim)  # (groups, n_rep + 2, Dh)
    return rows[:, :n_rep].reshape(-1), rows[:, n_rep].reshape(-1), rows[:, n_rep + 1].reshape(-1)


LAYOUTS: dict[str, Callable[[int, int, int], Rows]] = {"blocks": _blocks, "grouped": _grouped}
FOUND: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()  # fused layer -> layout


def kv_width(rows: int, D: int, head_dim: int) -> int:
    """kv of a fused (D + 2 kv, D) projection whose key/value heads are whole heads, at most D wide;
    0 for any other shape."""
    kv = (rows - D) / 2
    return int(kv) if kv in range(head_dim, D + 1, head_dim) and D % kv == 0 else 0


def fused_among(linears: list[Leaf], D: int, head_dim: int, least: int = 0) -> list[Leaf]:
    """The fused query/key/value projections among these linears: (D + 2 kv, D) outside an FFN, kv
    wider than `least` (a head's width: those whose layouts part)."""
    return [leaf for leaf in linears if leaf.weight.shape[1] == D
            and kv_width(leaf.weight.shape[0], D, head_dim) > least and not FFN_PATH.search(f"{leaf.name}.")]


def fused_slots(prefix: str, leaf: Leaf, D: int, head_dim: int) -> list[Slot]:
    """W_Q, W_K, W_V as rows of the fused leaf, in the layout found for it (blocks: slices)."""
    kv = kv_width(leaf.weight.shape[0], D, head_dim)
    if FOUND.get(leaf.module, "blocks") == "blocks":
        edges = [0, D, D + kv, D + 2 * kv]
        return [Slot(f"{prefix}W_{r}", leaf, slice(a, b)) for r, a, b in zip("QKV", edges, edges[1:])]
    rows = _grouped(D, kv, head_dim)
    return [Slot(f"{prefix}W_{r}", leaf, rows[i], f"{r.lower()} of each [q | k | v] group")
            for i, r in enumerate("QKV")]


@torch.no_grad()
def find_layouts_(module: nn.Module, one_token: Callable[[], Tensor | None], D: int, head_dim: int) -> None:
    """Record the layout of every fused projection in `module` whose layouts part, found by
    `one_token` (the learner's module on a one-token input): grouped where it alone leaves that
    output unchanged as its query and key rows change; else (blocks alone does, or neither: a mistake
    elsewhere, or a module that does not run on one token) blocks, the common one."""
    fused = fused_among(of_kind(leaves(module), "linear"), D, head_dim, least=head_dim)
    before = _quiet(one_token) if fused else None  # (no fused projection: nothing run)
    kept = [name for name in LAYOUTS if fused and _unmoved(fused, name, D, head_dim, one_token, before)]
    found = "grouped" if kept == ["grouped"] else "blocks"
    FOUND.update(dict.fromkeys([leaf.module for leaf in fused], found))


def _quiet(one_token: Callable[[], Tensor | None]) -> Tensor | None:
    """The one-token output; None where the learner's code raises on it, or gives NaN or nothing."""
    try:
        out = one_token()
    except Exception:  # noqa: BLE001  (whatever it raised: the layout cannot be read from it)
        return None
    return out if fp.max_error(out, out) == 0.0 else None  # (inf for None or a NaN)


def _unmoved(fused: list[Leaf], name: str, D: int, head_dim: int, one_token: Callable[[], Tensor | None],
             before: Tensor | None) -> bool:
    """Whether the one-token output stays as it was while the rows this layout calls query and key
    change, and moves when its value rows change (the rows are read at all)."""
    return _moved(fused, name, (0, 1), D, head_dim, one_token, before) < 1e-9 < _moved(
        fused, name, (2,), D, head_dim, one_token, before)


def _moved(fused: list[Leaf], name: str, roles: tuple[int, ...], D: int, head_dim: int,
           one_token: Callable[[], Tensor | None], before: Tensor | None) -> float:
    """How far the output moves with these roles' rows of every fused leaf's weight changed; NaN when
    it cannot be told (no output before or after)."""
    held = [leaf.weight for leaf in fused]
    saved = [*map(torch.clone, held)]
    for w in held:
        split = LAYOUTS[name](D, kv_width(w.shape[0], D, head_dim), head_dim)
        w[torch.cat([split[r] for r in roles])] += 1.0
    after = _quiet(one_token)
    [*map(Tensor.copy_, held, saved)]  # the weights as they were
    moved = fp.max_error(before, after)  # (inf without an output)
    return moved if moved < math.inf else math.nan
