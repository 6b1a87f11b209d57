"""A C kernel for int8 matrix-vector products (Int8Linear's "c-fp32"), built at first use.

int8_matvec.c widens each int8 weight to fp32 in AVX-512 registers and sums in fp32: no bf16
rounding of the activations, and at one row it streams the weights 1.5x to 2.8x as fast as
`_weight_int8pack_mm` on this project's 2-core AVX-512 machine (docs/benchmarks.md). It is built
with gcc into ~/.cache/handformer (HANDFORMER_CACHE overrides) the first time a process asks for
it, the file named by a hash of the source, written under a temporary name and renamed into
place. `kernel()` gives None, and Int8Linear falls back to its default kernel, where torch sees no
AVX-512, gcc is missing or the build fails (`why_not()` says which): `pip install handformer`
needs no compiler.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("int8_matvec.c")
K_MULTIPLE = 16  # the kernel reads K in steps of 16 weights
_why: list[str] = []


def cache_dir() -> Path:
    return Path(os.environ.get("HANDFORMER_CACHE", Path.home() / ".cache" / "handformer"))


def _build(target: Path) -> str | None:
    """Compile SOURCE to `target` (atomically); the error, or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        done = subprocess.run(["gcc", "-O3", "-mavx512f", "-fopenmp", "-shared", "-fPIC", "-o", str(built),
                               str(SOURCE)], capture_output=True, text=True)
        if done.returncode:
            return f"gcc failed: {done.stderr.strip()[:200]}"
        os.replace(built, target)
    return None


@functools.cache
def kernel() -> Callable[..., None] | None:
    """The loaded C function int8_linear(x, q, scale, y, M, N, K, threads), or None (see why_not)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        _why.append("torch sees no AVX-512 on this CPU")
        return None
    if shutil.which("gcc") is None:
        _why.append("no gcc on the PATH")
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = cache_dir() / f"int8_matvec-{digest}.so"
    if not target.exists() and (error := _build(target)) is not None:
        _why.append(error)
        return None
    fn = ctypes.CDLL(str(target)).int8_linear
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fn.restype = None
    return fn


def why_not() -> str | None:
    """Why kernel() is None (after a call), or None when it loaded."""
    return _why[-1] if kernel() is None else None


def int8_linear(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """(M, K) fp32 rows times the (N, K) int8 weight, scaled per output: (M, N) fp32. kernel() must
    not be None; K a multiple of K_MULTIPLE; every tensor contiguous on the CPU."""
    y = torch.empty(x.shape[0], q.shape[0])  # (M, N)
    kernel()(x.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), x.shape[0], q.shape[0], q.shape[1],
             torch.get_num_threads())
    return y


__all__ = ["K_MULTIPLE", "int8_linear", "kernel", "why_not"]
