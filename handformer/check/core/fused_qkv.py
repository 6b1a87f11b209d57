"""A fused query/key/value projection's layout (check/core/qkv_layouts.py), found for each fused layer.

Which one a learner wrote is found by what the module does, not by names: on one token, attention's
output depends on the value rows alone (a softmax over one key is 1), so a layout is the learner's
when changing the rows it calls query and key leaves that output unchanged. Where the layouts would
split the rows the same way (one key/value head, or one head) nothing is run; where the output cannot
tell them apart, blocks (the common layout) is compared.

Shape legend: D d_model, Dh head width.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.qkv_layouts import FOUND, LAYOUTS, kv_width
from handformer.check.core.source import source_text
from handformer.check.core.weights import Leaf, fused_among, leaves, of_kind


@torch.no_grad()
def find_layouts_(module: nn.Module, one_token: Callable[[], Tensor | None], D: int, head_dim: int) -> None:
    """Record the layout of every fused projection in `module` whose layouts part, found by
    `one_token` (the learner's module on a one-token input): grouped where it alone leaves that
    output unchanged as its query rows and its key (or, swapped, its value) rows change; else (blocks
    alone does, or neither: a mistake elsewhere, or a module that does not run on one token) blocks,
    the common one."""
    fused = fused_among(of_kind(leaves(module), "linear"), D, head_dim, least=head_dim)
    if not fused:  # nothing run
        return
    before = _quiet(one_token)
    kept = [name for name in LAYOUTS if _unmoved(fused, name, D, head_dim, one_token, before)]
    found = "grouped" if kept == ["grouped"] else "blocks"
    FOUND.update(dict.fromkeys([leaf.module for leaf in fused], found + "_vk" * states_value_first(module)))


# a comment that states a fused projection's parts as query, value, key: "[q | v | k]", "q, v, k"
VALUE_FIRST = re.compile(r"#[^\n]*\b(?:q|query)\s*[|,/]\s*(?:v|value)\s*[|,/]\s*(?:k|key)\b", re.I)


def states_value_first(module: nn.Module) -> bool:
    """Whether a class of the learner's in `module` states its fused projection's order as query, value,
    key in a comment (CodeGen's shards, each holding [q | v | k]): its rows are then read so, and split
    as [q | k | v] they are kv_swapped. Nothing else tells the two apart: either order computes an
    attention of random weights."""
    own = {type(sub) for sub in module.modules() if type(sub).__module__.startswith("learner_")}
    return any(VALUE_FIRST.search(source_text(cls)) for cls in own)


def _quiet(one_token: Callable[[], Tensor | None]) -> Tensor | None:
    """The one-token output; None where the learner's code raises on it, or gives NaN or nothing."""
    out = fp.quietly(one_token)  # (whatever it raised: the layout cannot be read from it)
    return out if fp.max_error(out, out) == 0.0 else None  # (inf for None or a NaN)


def _unmoved(fused: list[Leaf], name: str, D: int, head_dim: int, one_token: Callable[[], Tensor | None],
             before: Tensor | None) -> bool:
    """Whether the one-token output stays as it was while the rows this layout calls query change,
    and of the rows it calls key and value, one moves it and the other does not: the layout's, its
    key and value read as they are, or swapped (kv_swapped, a mistake the comparison then names)."""
    q, k, v = (_moved(fused, name, (role,), D, head_dim, one_token, before) for role in range(3))
    return q < 1e-9 and min(k, v) < 1e-9 < max(k, v)


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
