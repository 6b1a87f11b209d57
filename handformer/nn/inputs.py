"""Checks at the models' edge, so bad input fails with a clear message instead of an index error
deep inside torch or a silently wrong result."""

from __future__ import annotations

import torch
from torch import Tensor


def check_token_ids(ids: Tensor, vocab_size: int, name: str = "input_ids") -> None:
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype in (torch.bool,) or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}; "
                        "tokenize text first and pass the ids")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(ids.shape)}; "
                         "use ids[None] for a single sequence")
    if ids.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(ids.shape)}); give at least one token")
    # Reading the ids is a graph break (and a device sync) in a torch.compile graph: compiled
    # training skips the range check, eager runs keep it.
    if not torch.compiler.is_compiling() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} contains token id "
                         f"{int(ids.min()) if int(ids.min()) < 0 else int(ids.max())}, outside the "
                         f"vocabulary [0, {vocab_size}); check the tokenizer matches the model")


def check_length(length: int, max_positions: int, name: str = "sequence") -> None:
    if length > max_positions:
        raise ValueError(_length_message(length, max_positions, name))


def check_positions_fit(position_ids: Tensor, max_positions: int) -> None:
    """The largest position id must be below max_positions (not checked inside torch.compile:
    reading the values is a graph break)."""
    if not torch.compiler.is_compiling() and int(position_ids.max()) >= max_positions:
        raise ValueError(_length_message(int(position_ids.max()) + 1, max_positions, "sequence"))


def _length_message(length: int, max_positions: int, name: str) -> str:
    return (f"{name} needs {length} positions but the model has max_positions={max_positions}; "
            "truncate the input or build the model with a larger max_positions")


def check_mask(mask: Tensor | None, shape: tuple[int, ...], name: str) -> None:
    """A (batch, length) mask of 1/True for real tokens and 0/False for padding, or None."""
    if mask is not None and not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask is not None and tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (batch, length), got "
                         f"{tuple(mask.shape)}")
    if mask is not None and mask.is_floating_point():
        raise TypeError(f"{name} must be bool or integer 0/1 (True = real token), got {mask.dtype}")


def check_position_ids(position_ids: Tensor, batch: int, length: int) -> None:
    """Position ids given by the caller: (batch, length) or (1, length) integers >= 0."""
    if position_ids.shape not in ((batch, length), (1, length)):
        raise ValueError(f"position_ids must have shape ({batch}, {length}) or (1, {length}), "
                         f"got {tuple(position_ids.shape)}")
    if position_ids.is_floating_point() or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must hold integer positions, got dtype {position_ids.dtype}")
    if not torch.compiler.is_compiling() and int(position_ids.min()) < 0:  # a graph break to read
        raise ValueError(f"position_ids must be >= 0, got {int(position_ids.min())}")
