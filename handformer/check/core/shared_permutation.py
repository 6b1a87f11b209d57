"""A difference the use cannot see: outputs that are the reference's with their last dimension
reordered, the same order for every output (a rotary function that hands q and k on with their head
dims permuted alike: every score q.k is unchanged, so the attention it feeds computes the same thing).

Shape legend: N the outputs stacked (q, k), ... any leading dims, Dh the last (head) dim.
"""

from __future__ import annotations

import torch
from torch import Tensor


def shared_permutation(out: Tensor, ref: Tensor, tol: float) -> list[int] | None:
    """The order `perm` (not the identity) with out[..., j] == ref[..., perm[j]] for every output
    stacked in `out` (N, ..., Dh) at once, each column matched to within `tol`; None where there is none."""
    if out.shape != ref.shape or out.dim() < 2:
        return None
    dh = out.size(-1)
    cols, ref_cols = out.reshape(-1, dh).T.double(), ref.reshape(-1, dh).T.double()  # (Dh, N * ...)
    far = torch.cdist(cols, ref_cols, p=float("inf"))  # (Dh, Dh): the largest difference of two columns
    near, perm = far.min(dim=-1)
    order = perm.tolist()
    if not bool((near < tol).all()) or sorted(order) != list(range(dh)) or order == list(range(dh)):
        return None
    return order
