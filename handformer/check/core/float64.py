"""The grader runs a learner's model in float64 (its comparisons need the digits); a float mask the
learner's code builds stays float32 (`torch.full((T, T), float("-inf"))`,
`nn.Transformer.generate_square_subsequent_mask(T)`). Handed to a float64 attention, torch's
`scaled_dot_product_attention` gives wrong numbers from 16 keys on (torch 2.x on the CPU), and
nn.MultiheadAttention's weights path raises: neither happens in the float32 the code is written for.
So, in the child process, a float mask reaches a float64 attention as float64: what the code computes in
float32, to float64's digits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _as_query(mask: Any, query: Tensor) -> Any:
    """A float mask in the query's dtype when the query is float64; any other mask as it is."""
    if isinstance(mask, Tensor) and mask.is_floating_point() and query.dtype == torch.float64:
        return mask.to(query.dtype)
    return mask


def _masks_cast(fn: Callable[..., Any], masks: set[int | str]) -> Callable[..., Any]:
    """fn with its mask arguments (by position after the query, 1 the first, or by name) in its query's
    dtype."""

    @functools.wraps(fn)
    def call(query: Tensor, *args: Any, **kwargs: Any) -> Any:
        given = dict(enumerate(args, 1)) | kwargs  # positions and names in one table
        given.update({key: _as_query(given[key], query) for key in masks & given.keys()})
        return fn(query, *map(given.pop, range(1, len(args) + 1)), **given)

    return call


def float_masks_as_queries() -> None:
    """Patch torch.nn.functional's two attentions (nn.MultiheadAttention calls the second, which calls
    the first) so that a float mask takes a float64 query's dtype."""
    F.scaled_dot_product_attention = _masks_cast(F.scaled_dot_product_attention, {3, "attn_mask"})
    masks: set[int | str] = {"attn_mask", "key_padding_mask"}
    F.multi_head_attention_forward = _masks_cast(F.multi_head_attention_forward, masks)
