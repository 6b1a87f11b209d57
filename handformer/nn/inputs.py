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
    if torch.compiler.is_compiling():  # reading the ids is a graph break (and a device sync) in
        return  # a torch.compile graph: compiled training skips the range check, eager runs keep it
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size}); "
                         "check the tokenizer matches the model")


def check_length(length: int, max_positions: int, name: str = "sequence") -> None:
    if length > max_positions:
        raise ValueError(f"{name} needs {length} positions but the model has max_positions="
                         f"{max_positions}; truncate the input or build the model with a larger "
                         "max_positions")


def check_mask(mask: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
    """A (batch, length) mask of 1/True for real tokens and 0/False for padding, as bool."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (batch, length), got "
                         f"{tuple(mask.shape)}")
    if mask.is_floating_point():
        raise TypeError(f"{name} must be bool or integer 0/1 (True = real token), got {mask.dtype}")
    return mask.bool()
