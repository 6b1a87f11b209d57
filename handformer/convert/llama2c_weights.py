"""Read a llama2.c checkpoint (karpathy/llama2.c, `model.bin`) into `CausalLM` weights.

Two fp32 layouts exist, both written by llama2.c's export.py:

    legacy (v0)   7 int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
                  (vocab_size < 0: the classifier is NOT shared with the token embedding), then
                  token embedding, attention norms, wq, wk, wv, wo, FFN norms, w1, w2, w3 (each for
                  all layers in turn), final norm, the RoPE cos and sin tables (seq_len x Dh/2 each,
                  not needed: handformer computes them), and the classifier when not shared.
    version 1     a 256-byte header: uint32 magic "ak42" (0x616b3432), int32 version 1, the 7 int32
                  above (vocab_size positive), uint8 shared_classifier, zero padding; then attention
                  norms, FFN norms, final norm, token embedding, wq, wk, wv, wo, w1, w2, w3, and the
                  classifier when not shared.

Version 2 (int8-quantized, for runq.c) is refused with a clear error. The file size must be
exactly what the header implies, so a truncated or padded file is named, not half-read.

llama2.c's names map to handformer's: w1 = gate_proj, w3 = up_proj, w2 = down_proj (SwiGLU),
wq/wk/wv/wo = q/k/v/o_proj. RoPE: llama2.c rotates interleaved pairs (dims 2j, 2j+1 of a head),
handformer (like Hugging Face) rotates half-split pairs (j, j + Dh/2), so the rows of each head of
wq and wk are permuted: half-split row j takes interleaved row 2j, row j + Dh/2 takes row 2j + 1.
Then q.k is unchanged, because q and k are permuted alike and the dot product sums over all dims.

Shape legend: D dim, F hidden_dim, V vocab, H heads, Hkv key/value heads, Dh head dim, P seq_len.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.paths import refuse_non_file

MAGIC = 0x616B3432  # "ak42" read as a little-endian uint32
V1_HEADER_BYTES = 256
LEGACY_HEADER_BYTES = 7 * 4
NORM_EPS = 1e-5  # llama2.c's rmsnorm
ROPE_THETA = 10000.0  # llama2.c's run.c


@dataclass(frozen=True)
class Llama2cHeader:
    version: int  # 0 = legacy, 1 = version 1
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int  # always positive here; legacy's sign is `shared_classifier`
    seq_len: int
    shared_classifier: bool

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def format_name(self) -> str:
        return "llama2.c legacy (v0)" if self.version == 0 else f"llama2.c version {self.version}"

    def config(self) -> CausalLMConfig:
        """The handformer model: a Llama with llama2.c's RMSNorm eps and RoPE theta."""
        return CausalLMConfig.llama_style(
            vocab_size=self.vocab_size, d_model=self.dim, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
            d_ff=self.hidden_dim, n_layers=self.n_layers, max_positions=self.seq_len, norm_eps=NORM_EPS,
            rope_theta=ROPE_THETA, tie_embeddings=self.shared_classifier)

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(llama2.c name, shape) of every array in file order; `{i}` names are per layer."""
        D, F, V, L = self.dim, self.hidden_dim, self.vocab_size, self.n_layers
        kv_dim = self.n_kv_heads * self.head_dim
        per_layer = lambda name, shape: [(name.format(i=i), shape) for i in range(L)]  # noqa: E731
        attention = [*per_layer("wq.{i}", (D, D)), *per_layer("wk.{i}", (kv_dim, D)),
                     *per_layer("wv.{i}", (kv_dim, D)), *per_layer("wo.{i}", (D, D))]
        ffn = [*per_layer("w1.{i}", (F, D)), *per_layer("w2.{i}", (D, F)), *per_layer("w3.{i}", (F, D))]
        classifier = [] if self.shared_classifier else [("wcls", (V, D))]
        if self.version == 0:
            rope = [("freq_cis_real", (self.seq_len, self.head_dim // 2)),
                    ("freq_cis_imag", (self.seq_len, self.head_dim // 2))]
            return [("token_embedding", (V, D)), *per_layer("rms_att.{i}", (D,)), *attention,
                    *per_layer("rms_ffn.{i}", (D,)), *ffn, ("rms_final", (D,)), *rope, *classifier]
        return [*per_layer("rms_att.{i}", (D,)), *per_layer("rms_ffn.{i}", (D,)), ("rms_final", (D,)),
                ("token_embedding", (V, D)), *attention, *ffn, *classifier]

    def expected_bytes(self) -> int:
        header = LEGACY_HEADER_BYTES if self.version == 0 else V1_HEADER_BYTES
        return header + 4 * sum(int(np.prod(shape)) for _, shape in self.tensor_shapes())


def _check_header(h: Llama2cHeader, path: Path) -> None:
    fields = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    bad = [f"{f}={getattr(h, f)}" for f in fields if getattr(h, f) <= 0]
    if bad:
        raise ValueError(f"{path}: not a llama2.c checkpoint, or a corrupt one: the header has "
                         f"{', '.join(bad)} (each must be positive)")
    if h.dim % h.n_heads or h.n_heads % h.n_kv_heads or h.head_dim % 2:
        raise ValueError(f"{path}: corrupt llama2.c header: dim={h.dim}, n_heads={h.n_heads}, "
                         f"n_kv_heads={h.n_kv_heads} (n_heads must divide dim into an even head size, "
                         "and n_kv_heads must divide n_heads)")


def read_header(path: str | os.PathLike) -> Llama2cHeader:
    """The checkpoint's header, checked against the file's size."""
    path = Path(path)
    if not path.is_file():
        refuse_non_file(path, "a llama2.c checkpoint", "give the checkpoint file itself (model.bin, "
                        "stories15M.bin, ...)")
        raise FileNotFoundError(f"no llama2.c checkpoint at {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(V1_HEADER_BYTES)
    if len(head) < LEGACY_HEADER_BYTES:
        raise ValueError(f"{path} is {size} bytes: too short for a llama2.c checkpoint header "
                         f"({LEGACY_HEADER_BYTES} bytes at least); the file is truncated or not a checkpoint")
    magic, version = struct.unpack_from("<Ii", head)
    if magic == MAGIC:
        if len(head) < V1_HEADER_BYTES:
            raise ValueError(f"{path} is truncated: {size} bytes, less than the {V1_HEADER_BYTES}-byte "
                             "header of a versioned llama2.c checkpoint")
        if version != 1:
            hint = (" (int8-quantized, for runq.c); export fp32 with llama2.c's `export.py --version 1`"
                    if version == 2 else "")
            raise ValueError(f"{path}: llama2.c checkpoint version {version} is not supported{hint}; "
                             "handformer reads the legacy (v0) and version 1 formats")
        params = struct.unpack_from("<7i", head, 8)
        header = Llama2cHeader(1, *params, shared_classifier=bool(head[36]))
    else:
        params = struct.unpack_from("<7i", head)
        dim, hidden, layers, heads, kv_heads, vocab, seq_len = params
        header = Llama2cHeader(0, dim, hidden, layers, heads, kv_heads, abs(vocab), seq_len,
                               shared_classifier=vocab > 0)
    _check_header(header, path)
    expected = header.expected_bytes()
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise ValueError(
            f"{path} is {what}: {size:,} bytes, but a {header.format_name} checkpoint with dim "
            f"{header.dim}, hidden_dim {header.hidden_dim}, {header.n_layers} layers, {header.n_heads} "
            f"heads ({header.n_kv_heads} key/value), vocab {header.vocab_size}, seq_len "
            f"{header.seq_len} and a {'shared' if header.shared_classifier else 'separate'} classifier "
            f"is {expected:,} bytes; download it again")
    return header


def interleaved_to_half_split(w: Tensor, n_heads: int) -> Tensor:
    """(n_heads * Dh, D) rows of wq or wk from llama2.c's interleaved RoPE pairs to half-split."""
    rows, D = w.shape
    Dh = rows // n_heads
    w = w.view(n_heads, Dh // 2, 2, D)  # (H, Dh/2, 2, D): pair j = rows 2j, 2j+1
    return w.transpose(1, 2).reshape(rows, D)  # (H * Dh, D): evens of each head, then odds


def read_llama2c(path: str | os.PathLike) -> tuple[Llama2cHeader, dict[str, Tensor]]:
    """The header and the `CausalLM` state dict (handformer's names, half-split RoPE rows).
    A shared classifier has no "lm_head.weight" (the model ties it to "embed.weight")."""
    path = Path(path)
    h = read_header(path)
    offset = LEGACY_HEADER_BYTES if h.version == 0 else V1_HEADER_BYTES
    data = np.fromfile(path, dtype="<f4", offset=offset)
    arrays: dict[str, Tensor] = {}
    start = 0
    for name, shape in h.tensor_shapes():
        n = int(np.prod(shape))
        arrays[name] = torch.from_numpy(data[start:start + n].reshape(shape).astype(np.float32))
        start += n
    if not all(torch.isfinite(t).all() for t in arrays.values()):
        bad = [name for name, t in arrays.items() if not torch.isfinite(t).all()]
        raise ValueError(f"{path} is corrupt: {', '.join(bad[:5])} hold NaN or infinite values")

    state = {"embed.weight": arrays["token_embedding"], "norm.weight": arrays["rms_final"]}
    if not h.shared_classifier:
        state["lm_head.weight"] = arrays["wcls"]
    for i in range(h.n_layers):
        layer = f"layers.{i}."
        state[layer + "attn_norm.weight"] = arrays[f"rms_att.{i}"]
        state[layer + "self_attn.q_proj.weight"] = interleaved_to_half_split(arrays[f"wq.{i}"], h.n_heads)
        state[layer + "self_attn.k_proj.weight"] = interleaved_to_half_split(arrays[f"wk.{i}"], h.n_kv_heads)
        state[layer + "self_attn.v_proj.weight"] = arrays[f"wv.{i}"]
        state[layer + "self_attn.o_proj.weight"] = arrays[f"wo.{i}"]
        state[layer + "ffn_norm.weight"] = arrays[f"rms_ffn.{i}"]
        state[layer + "ffn.gate_proj.weight"] = arrays[f"w1.{i}"]
        state[layer + "ffn.down_proj.weight"] = arrays[f"w2.{i}"]
        state[layer + "ffn.up_proj.weight"] = arrays[f"w3.{i}"]
    return h, state


__all__ = ["Llama2cHeader", "interleaved_to_half_split", "read_header", "read_llama2c"]
