"""The intra-op thread count for decoding: one thread for a model whose weight matrices are all
small, torch's setting otherwise (`handformer.generation.generate` asks for it with threads="auto")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from handformer.inference.packed_linear import PackedLinear

# A matrix this small (elements; 1 MiB in fp32) is read by one core in about a microsecond: splitting
# its product across threads costs more in fork/join than it saves, and on a shared machine a second
# thread waits for a core at every op. `generate` decodes models whose every weight matrix is smaller
# with one thread (the 5-layer, 64-wide Llama of benchmarks/decode_limit.py: see the README).
SMALL_MATRIX = 2**18


def default_threads(model: nn.Module) -> int | None:
    """The intra-op threads `generate` uses for `model`: 1 when every weight matrix is small, else
    None (torch's setting, unchanged)."""
    matrices = [p.numel() for p in model.parameters() if p.dim() == 2]
    # packed weights are no parameters (inference/packed_linear.py): count them by their layer's shape
    matrices += [m.in_features * m.out_features for m in model.modules() if isinstance(m, PackedLinear)]
    largest = max(matrices, default=0)
    return 1 if largest < SMALL_MATRIX else None


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run with `threads` torch intra-op threads (process-wide, as `torch.set_num_threads`), then
    restore the previous count; None changes nothing."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
