"""C kernels for decoding's thin matrix products, built by gcc at first use and called through ctypes.

- int8_matvec.c (`int8_linear`, Int8Linear's "c-fp32"): each int8 weight widened to fp32 in AVX-512
  registers, fp32 activations and sums (no bf16 rounding of the activations); at one row it streams
  the weights 1.5x to 2.8x as fast as `_weight_int8pack_mm` on this project's 2-core AVX-512 machine.
- f32_matvec.c (`f32_linear`, PackedLinear's one-row path): fp32 weights in blocks of four rows
  interleaved (`block_rows`: one contiguous stream a block), dotted with AVX-512 FMAs; at one row it
  streamed GPT-2-124M's weights (every layer and the head once) 1.65x as fast as oneDNN's packed
  layers at one thread (docs/benchmarks.md).
- vnni_matvec.c (`int8_vnni_linear`, Int8Linear's "vnni"; `int4_vnni_linear`, Int4Linear's): the
  activation row quantized to int8 in blocks of 32 (as llama.cpp's Q8_0), the weights read as
  int8 (`block_int8`'s layout: four rows interleaved 64 bytes at a time) or as stored (4-bit
  nibbles with float16 scales), dotted in integers by AVX-512 VNNI
  (vpdpbusd), scaled back in fp32, the bias added. Where the CPU has no VNNI (the library asks the
  CPU itself: `vnni_supported()`), kernel() gives None and the layers fall back.

f32_matvec.c and decoder_step.c share one block's dot loop (dot4.h); decoder_step.c calls
vnni_matvec.c's one-row functions through the addresses `address` gives (inference/fused_step.py).
Each is built with gcc into ~/.cache/handformer (HANDFORMER_CACHE overrides) the first time a process
asks for it, the file named by a hash of the source and the headers beside it, written under a
temporary name and renamed into place. `kernel(name)` gives None, and the layers run their torch
kernels instead, where torch sees no AVX-512 (an AVX2-only CPU), gcc is missing or the build fails
(`why_not(name)` says which), or the environment sets HANDFORMER_NO_C_KERNELS=1: `pip install
handformer` needs no compiler.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

SOURCES = {"int8_linear": Path(__file__).with_name("int8_matvec.c"),
           "f32_linear": Path(__file__).with_name("f32_matvec.c"),
           "decoder_step": Path(__file__).with_name("decoder_step.c"),  # fused_step.py's, its own argtypes
           "int8_vnni_linear": Path(__file__).with_name("vnni_matvec.c"),
           "int4_vnni_linear": Path(__file__).with_name("vnni_matvec.c")}
VNNI = ("int8_vnni_linear", "int4_vnni_linear")  # built for any x86-64, run only where the CPU has VNNI
# decoder_step: scalar loops gcc vectorizes (-ffast-math lets it reorder sums; -lm: glibc's vector expf)
# beside the AVX-512 products of f32_matvec.c, threaded by OpenMP
FLAGS = {"decoder_step": ["-O3", "-march=native", "-ffast-math", "-fopenmp"],
         # the file names its own instruction sets (#pragma GCC target), all but vnni_supported()
         "int8_vnni_linear": ["-O3", "-fopenmp"], "int4_vnni_linear": ["-O3", "-fopenmp"]}
MATVEC_FLAGS = ["-O3", "-mavx512f", "-fopenmp"]
K_MULTIPLE = 16  # int8_linear and f32_linear read K in steps of 16 numbers
VNNI_K_MULTIPLE = 32  # the VNNI kernels quantize the activations in blocks of 32
# The layers call them for this many rows of activations at most (decoding at batch 1 or 2); more rows
# go to torch's kernels, which share each weight read among the rows better (docs/benchmarks.md).
MAX_ROWS = 2
HUGE_PAGE = 2 << 20  # bytes in one of Linux's transparent huge pages (x86-64)
MADV_HUGEPAGE = 14  # Linux's madvise advice: back this range with huge pages
OFF_ENV = "HANDFORMER_NO_C_KERNELS"  # set to 1 to run the torch kernels only
_why: dict[str, str] = {}
_libraries: dict[str, ctypes.CDLL] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("HANDFORMER_CACHE", Path.home() / ".cache" / "handformer"))


def _build(source: Path, target: Path, flags: list[str]) -> str | None:
    """Compile `source` to `target` with `flags` (the libraries last; atomically); the error, or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        libraries = [f for f in flags if f.startswith("-l")]
        options = [f for f in flags if f not in libraries]
        objects = Path(tmp) / f"{target.stem}.o"
        # Compiled and linked in two steps: linked with -ffast-math, gcc adds crtfastmath.o, which turns
        # on flush-to-zero for the whole process when the library loads (every subnormal float becomes 0).
        for command in (["gcc", *options, "-fPIC", "-c", "-o", str(objects), str(source)],
                        ["gcc", "-shared", *(f for f in options if f == "-fopenmp"), "-o", str(built),
                         str(objects), *libraries]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                return f"gcc failed: {done.stderr.strip()[:200]}"
        os.replace(built, target)
    return None


def _unavailable() -> str | None:
    """Why no C kernel can run in this process, or None."""
    if os.environ.get(OFF_ENV, "") in ("1", "true", "yes"):
        return f"{OFF_ENV} is set"
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return "torch sees no AVX-512 on this CPU"
    if shutil.which("gcc") is None:
        return "no gcc on the PATH"
    return None


@functools.cache
def kernel(name: str = "int8_linear") -> Callable[..., None] | None:
    """The loaded C function `name` (int8_linear(x, q, scale, y, M, N, K, threads),
    f32_linear(x, w, bias, y, M, N, K, threads), int8_vnni_linear(x, q, scale, bias, y, M, N, K,
    threads), int4_vnni_linear(x, nibbles, d, bias, y, M, N, K, threads), or decoder_step, whose caller
    sets its argtypes), or None (see why_not)."""
    if (reason := _unavailable()) is not None:
        _why[name] = reason
        return None
    source = SOURCES[name]
    flags = FLAGS.get(name, MATVEC_FLAGS) + ["-lm"]
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what the sources include
    recipe = source.read_bytes() + headers + " ".join(flags).encode() + b" compiled, then linked"
    digest = hashlib.sha256(recipe).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{digest}.so"
    if not target.exists() and (error := _build(source, target, flags)) is not None:
        _why[name] = error
        return None
    library = _libraries[name] = ctypes.CDLL(str(target))
    if name in VNNI and not library.vnni_supported():
        _why[name] = "this CPU has no AVX-512 VNNI (or no AVX-512 BW, VL or F16C)"
        return None
    fn = getattr(library, name)
    if name in ("int8_linear", "f32_linear"):
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    if name in VNNI:
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fn.restype = None
    return fn


def address(name: str, function: str) -> int:
    """The address of C function `function` in kernel `name`'s library (kernel(name) must not be
    None): what decoder_step.c calls vnni_matvec.c's one-row functions through."""
    kernel(name)
    return ctypes.cast(getattr(_libraries[name], function), ctypes.c_void_p).value


def usable(name: str, x: Tensor, in_features: int, max_rows: int | None = MAX_ROWS) -> bool:
    """Whether the layers may hand `x` (..., K) to kernel `name` now: fp32 on the CPU, at most
    `max_rows` rows (None: any), K a multiple of K_MULTIPLE (VNNI_K_MULTIPLE for the VNNI
    kernels), no gradient wanted, not inside
    torch.compile's tracing (a ctypes call cannot be traced), and the kernel built."""
    few = max_rows is None or x.numel() <= max_rows * in_features
    multiple = VNNI_K_MULTIPLE if name in VNNI else K_MULTIPLE
    return (x.is_cpu and x.dtype == torch.float32 and few
            and in_features % multiple == 0 and not (x.requires_grad and torch.is_grad_enabled())
            and not torch.compiler.is_compiling() and kernel(name) is not None)


def why_not(name: str = "int8_linear") -> str | None:
    """Why kernel(name) is None (after a call), or None when it loaded."""
    return _why.get(name) if kernel(name) is None else None


def int8_linear(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """(M, K) fp32 rows times the (N, K) int8 weight, scaled per output: (M, N) fp32. kernel() must
    not be None; K a multiple of K_MULTIPLE; every tensor contiguous on the CPU."""
    y = torch.empty(x.shape[0], q.shape[0])  # (M, N)
    kernel("int8_linear")(x.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), x.shape[0], q.shape[0],
                          q.shape[1], torch.get_num_threads())
    return y


def huge_page_empty(numel: int) -> Tensor:
    """An uninitialized fp32 tensor of `numel` numbers whose memory the kernel is asked to back with
    2 MiB pages (Linux's transparent huge pages, `madvise`) before anything touches it. A matrix-vector
    product reads its weight once a token, so each 4 KiB page is a TLB miss; with 2 MiB pages one core
    streamed a blocked weight about 1.5x as fast on this project's machine (docs/benchmarks.md). Where
    the call fails (another OS, huge pages off) the memory is ordinary."""
    size = numel * 4
    if size < HUGE_PAGE or _libc() is None:
        return torch.empty(numel)
    whole = -(-size // HUGE_PAGE) * HUGE_PAGE  # the last page too: up to 2 MiB more resident memory
    raw = torch.empty(whole + HUGE_PAGE, dtype=torch.uint8)  # untouched: allocated lazily by the kernel
    start = -raw.data_ptr() % HUGE_PAGE  # the first 2 MiB boundary
    _libc().madvise(ctypes.c_void_p(raw.data_ptr() + start), ctypes.c_size_t(whole), MADV_HUGEPAGE)
    return raw[start:start + size].view(torch.float32)  # the view keeps `raw` alive


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def pointers(*tensors: Tensor | None) -> tuple[int | None, ...]:
    """Each tensor's address (None for None): what a layer keeps to call vnni_linear."""
    return tuple(None if t is None else t.data_ptr() for t in tensors)


def vnni_linear(name: str, x: Tensor, weights: tuple[int | None, ...], n: int) -> Tensor:
    """(M, K) fp32 rows times the weight VNNI kernel `name` reads at `weights` (its addresses:
    int8_vnni_linear's (N, K) int8 values, (N,) fp32 scales and bias or None; int4_vnni_linear's
    (N, K/2) nibbles, input 2j in byte j's low nibble and 2j + 1 in its high one, (N, K/32) float16
    scales d of w = d * (q - 8), bias or None), plus the bias: (M, n) fp32, the activations rounded
    to int8 in blocks of 32 on the way. kernel(name) must not be None; K a multiple of 32; x
    contiguous on the CPU. The addresses come from `pointers`: the layer keeps them (and the tensors)
    because reading four tensors' addresses costs more than a small layer's product."""
    y = torch.empty(x.shape[0], n)  # (M, N)
    kernel(name)(x.data_ptr(), *weights, y.data_ptr(), x.shape[0], n, x.shape[1], torch.get_num_threads())
    return y


def block_rows(weight: Tensor) -> Tensor:
    """The (N, K) weight as f32_linear reads it: (ceil(N/4), K/16, 4, 16), each block's four rows
    interleaved 16 numbers at a time (rows past N zero), in memory asked for huge pages
    (`huge_page_empty`). K a multiple of K_MULTIPLE."""
    N, K = weight.shape
    padded = torch.zeros(-(-N // 4) * 4, K, dtype=torch.float32)
    padded[:N] = weight.detach()
    blocked = huge_page_empty(padded.numel()).view(-1, K // K_MULTIPLE, 4, K_MULTIPLE)  # (N/4, K/16, 4, 16)
    return blocked.copy_(padded.view(-1, 4, K // K_MULTIPLE, K_MULTIPLE).transpose(1, 2))


def block_int8(q: Tensor) -> Tensor:
    """The (N, K) int8 weight as int8_vnni_linear reads it: (ceil(N/4), ceil(K/64), 4, 64) bytes w + 128,
    each block's four rows interleaved 64 numbers at a time (one contiguous stream a block; rows past N
    and inputs past K are w = 0), in memory asked for huge pages (`huge_page_empty`)."""
    N, K = q.shape
    rows, width = -(-N // 4) * 4, -(-K // 64) * 64
    padded = torch.zeros(rows, width, dtype=torch.int8)
    padded[:N, :K] = q.detach()
    flipped = padded.view(torch.uint8) ^ 0x80  # (N', K') the unsigned bytes vpdpbusd multiplies
    blocked = huge_page_empty(rows * width // 4).view(torch.uint8).view(-1, width // 64, 4, 64)
    return blocked.copy_(flipped.view(-1, 4, width // 64, 64).transpose(1, 2))  # (N'/4, K'/64, 4, 64)


def unblock_rows(blocked: Tensor, n: int) -> Tensor:
    """`block_rows` undone: the (n, K) weight."""
    rows4, chunks, _, width = blocked.shape
    return blocked.transpose(1, 2).reshape(rows4 * 4, chunks * width)[:n].clone()  # (N, K)


def f32_linear(x: Tensor, blocked: Tensor, n: int, bias: Tensor | None) -> Tensor:
    """(M, K) fp32 rows times the (n, K) fp32 weight given as `block_rows(weight)`, plus the bias:
    (M, n). kernel("f32_linear") must not be None; every tensor contiguous on the CPU."""
    y = torch.empty(x.shape[0], n)  # (M, N)
    kernel("f32_linear")(x.data_ptr(), blocked.data_ptr(), None if bias is None else bias.data_ptr(),
                         y.data_ptr(), x.shape[0], n, x.shape[1], torch.get_num_threads())
    return y


__all__ = ["K_MULTIPLE", "MAX_ROWS", "OFF_ENV", "VNNI", "VNNI_K_MULTIPLE", "address", "block_int8",
           "block_rows", "f32_linear", "int8_linear", "kernel", "pointers", "unblock_rows", "usable",
           "vnni_linear", "why_not"]


def stamp(t: Tensor) -> tuple[int, int]:
    """Where `t` lives and how often it was written in place (an inference tensor keeps no count):
    a key for copies of it kept until it changes."""
    return t.data_ptr(), -1 if t.is_inference() else t._version
