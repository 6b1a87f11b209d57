"""Keep freed CPU memory in the process during training (glibc malloc settings).

A training step on CPU allocates and frees the same large tensors every step (logits of
(tokens x vocabulary), their gradients, activations). glibc serves allocations above its mmap
threshold with fresh mmap()s and returns freed memory to the kernel, so every step pays page
faults on first touch of tens of megabytes (visible in a profile as slow `fill_`, `add` and
softmax kernels on the logits). Raising the mmap threshold and the trim threshold makes glibc keep
those pages for reuse, as PyTorch's CUDA caching allocator does on GPUs. The cost: the process
keeps its peak memory instead of giving it back. Measured with benchmarks/translation_step.py (see
the README).

Only glibc (Linux) is tuned; elsewhere this does nothing. Set `train.keep_cpu_memory = false` to
leave the allocator alone.

A server wants the opposite once a burst of requests is over: its batches' KV caches (megabytes
each, replaced whenever a request joins or leaves) were freed into the heap, and glibc keeps those
pages, so the process stays at the peak of its busiest moment. `give_back_freed_memory`
(malloc_trim) returns them; serve's engine calls it each time it has nothing left to decode.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # constants of glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
C_INT_MAX = 2**31 - 1  # mallopt(int param, int value): larger values would wrap around to negative
KEEP_BYTES = 1 << 30  # allocations up to 1 GiB come from the reusable heap
# Free memory at the top of the heap is returned to the kernel only above this: the most a C int
# holds (2 GiB - 1), so up to two 1 GiB blocks stay in the process.
TRIM_BYTES = C_INT_MAX
_done = False


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def give_back_freed_memory() -> bool:
    """Return the free pages glibc holds (in every arena, the heap's middle included) to the
    kernel: malloc_trim(0). Returns whether that was possible (False on non-glibc platforms)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def keep_freed_memory() -> bool:
    """Tell glibc malloc to reuse freed memory instead of unmapping it. Idempotent; returns whether
    the allocator was tuned (False on non-glibc platforms)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((M_MMAP_THRESHOLD, KEEP_BYTES), (M_TRIM_THRESHOLD, TRIM_BYTES))
    for _, value in settings:  # ctypes does not check: 2**31 would reach glibc as -2**31
        assert 0 < value <= C_INT_MAX, value
    _done = all([bool(mallopt(param, value)) for param, value in settings])
    return _done
