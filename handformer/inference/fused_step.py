"""A decoder-only model's decoding step at batch 1 as one C function (decoder_step.c), the default
where it applies: the eager step is ~900 (a tiny Llama) to ~1,000 (GPT-2-124M) PyTorch operator calls,
each with Python and dispatch around it. For a tiny model that overhead is the whole step; for
GPT-2-124M, whose step reads 0.5 GB of weights, it is still a fifth of the step at one thread.

`FusedStep` keeps `StaticStep`'s protocol (inference/static_step.py): the engine calls it for a
one-token step when `usable(cache, mask)` says so, and it returns the (B, V) logits and advances the
cache. It reads the prepared model's own weights (no copy: a small model's plain `nn.Linear`
weights, a large one's `PackedLinear` one-row copies, c_kernels.block_rows' layout, in huge pages, or
an `Int8Linear`'s copy laid out for its VNNI kernel, c_kernels.block_int8's)
and writes the new key and value into the model's own KV cache, so the engine can step eagerly and
fused in any order (prefill and batches stay eager). A step may feed up to MAX_ROWS tokens at once:
speculative decoding's check of its newest token and guesses, which reads each weight once for all
of them and gives each the logits of a one-token step, bit for bit. The C code computes what
CausalLM.forward computes, in fp32, up to the order of the sums (greedy tokens equal in
tests/test_fused_step.py). Its products of large weights run on torch's intra-op thread count
(`generate`'s threads), split as PackedLinear's C kernel splits them; on one thread while a team of
them decodes slower than one (a shared machine: threads.StepThreads).

It applies (`fused_reason` is None) to a prepared `CausalLM` built of the lesson's pre-norm blocks
with either
  - Llama's parts: RMSNorm, Q/K/V (fused or not) without q/k norms, half-split RoPE over the whole
    head, a SwiGLU feed-forward (fused or not), no added positions; or
  - GPT-2's parts: LayerNorm, learned positions added to the embedding, no RoPE, a plain
    feed-forward with GELU (tanh or erf);
biases or none, plain softmax attention, an unscaled embedding, no family settings, no window, no
experts, fp32 activations on the CPU, and every linear layer one the C code reads as the layer's own
one-row forward computes it: a plain `nn.Linear`, a `PackedLinear` with its one-row copy, or (where
the CPU has AVX-512 VNNI) an `Int8Linear` or `Int4Linear` whose kernel "auto" or "vnni" runs
vnni_matvec.c at one row. The quantized layers are dotted by vnni_matvec.c's own one-row functions,
called from inside the C step (their addresses handed over): the activation row is quantized once for
every matrix that reads it, and each output is what the layer gives eagerly (the same machine code),
so an int8 or int4 model's greedy tokens are its eager step's. Everything else decodes eagerly.
Built by gcc at first use (c_kernels.py's cache); without gcc, AVX-512 or with
HANDFORMER_NO_C_KERNELS=1 the model decodes eagerly; without VNNI, so does an int8 or int4 model
(through the kernels its layers run without it).
Shape legend: B rows (1 here), D width, H / Hkv query / key-value heads, Dh head dim, F FFN width,
V vocabulary, C cache capacity.
"""

from __future__ import annotations

import ctypes
import time
import weakref

import torch
from torch import Tensor, nn

from handformer.config import FamilyConfig
from handformer.inference import c_kernels
from handformer.inference.fuse import FusedGatedFeedForward, FusedSelfAttention
from handformer.inference.norms import DecodingLayerNorm, DecodingRMSNorm
from handformer.inference.packed_linear import PackedLinear
from handformer.inference.quant import Int8Linear
from handformer.inference.quant_int4 import Int4Linear
from handformer.inference.threads import StepThreads
from handformer.models.causal_lm import CausalLM
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.feed_forward import FeedForward, GatedFeedForward
from handformer.nn.kv_cache import KVCache
from handformer.nn.norms import NoNorm
from handformer.nn.positions import LearnedPositions, NoPositions, NoRotary, RotaryEmbedding

P = ctypes.POINTER


class _Shape(ctypes.Structure):
    _fields_ = ([(name, ctypes.c_int64) for name in ("n_layers", "D", "H", "Hkv", "Dh", "F", "V", "slots",
                                                     "pos")]
                + [("eps", ctypes.c_float)]
                + [(name, ctypes.c_int32) for name in ("layer_norm", "activation", "rope", "threads",
                                                       "split_heads", "rows")])


class _Part(ctypes.Structure):  # decoder_step.c's Part: a matrix, or one of a product's stacked ones
    _fields_ = [("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("rows", ctypes.c_int64), ("kind", ctypes.c_int32)]


class _Layer(ctypes.Structure):  # decoder_step.c's Layer
    _fields_ = ([(name, ctypes.c_void_p) for name in ("attn_norm", "attn_norm_bias", "ffn_norm",
                                                      "ffn_norm_bias")]
                + [("qkv", _Part * 3), ("o", _Part), ("up", _Part * 2), ("down", _Part)]
                + [("keys", ctypes.c_void_p), ("values", ctypes.c_void_p)])


class _Vnni(ctypes.Structure):  # decoder_step.c's Vnni: vnni_matvec.c's one-row functions
    _fields_ = ([(name, ctypes.c_void_p) for name in ("prepare", "int8_rows", "int4_rows", "row8", "row4")]
                + [("stride", ctypes.c_int64)])


ACTIVATIONS = {"swiglu": 0, "gelu_tanh": 1, "gelu": 2}  # decoder_step.c's codes
PLAIN, BLOCKED, INT8, INT4 = range(4)  # decoder_step.c's kinds of Part
MAX_ROWS = 8  # decoder_step.c's: tokens one step feeds at most (speculation's newest token and guesses)
VNNI_KERNELS = ("auto", "vnni")  # the quantized layers' kernels that run vnni_matvec.c at one row
# A part as the C code reads it: (kind, weight, scale, bias), the tensors the pointers point into.
PartTensors = tuple[int, Tensor, Tensor | None, Tensor | None]


def _part(linear: nn.Module) -> PartTensors | None:
    """What decoder_step.c reads for `linear` to compute what its own one-row forward computes, or
    None where it cannot."""
    if type(linear) is nn.Linear:
        return PLAIN, linear.weight, None, linear.bias
    if type(linear) is PackedLinear and linear.blocked is not None:
        return BLOCKED, linear.blocked, None, linear.bias
    vnni = (getattr(linear, "kernel", None) in VNNI_KERNELS
            and linear.in_features % c_kernels.VNNI_K_MULTIPLE == 0)
    if (type(linear) is Int8Linear and vnni and linear.scales.dtype == torch.float32
            and c_kernels.kernel("int8_vnni_linear") is not None):
        return INT8, linear.vnni_blocked(), linear.scales, linear.bias
    if (type(linear) is Int4Linear and vnni and c_kernels.kernel("int4_vnni_linear") is not None
            and (d := linear.vnni_scales()) is not None):
        return INT4, linear.weight, d, linear.bias
    return None


def _projections(layer: nn.Module) -> tuple[list[nn.Module], nn.Module, list[nn.Module], nn.Module]:
    """A block's linear layers as decoder_step.c's Layer holds them: ([qkv] or [q, k, v], o,
    [gate_up] or [gate, up] or [up], down)."""
    attn, ffn = layer.self_attn, layer.ffn
    qkv = [attn.qkv_proj] if type(attn) is FusedSelfAttention else [attn.q_proj, attn.k_proj, attn.v_proj]
    up = ([ffn.gate_up_proj] if type(ffn) is FusedGatedFeedForward
          else [ffn.gate_proj, ffn.up_proj] if type(ffn) is GatedFeedForward else [ffn.up_proj])
    return qkv, attn.o_proj, up, ffn.down_proj


def _linears(model: CausalLM) -> list[nn.Module]:
    return [m for layer in model.layers for group in _projections(layer)
            for m in (group if isinstance(group, list) else [group])] + [model.lm_head]


def _layer_reason(layer: nn.Module, llama: bool) -> str | None:
    """Why this block is not the fused step's, or None. llama: RMSNorm and SwiGLU, else LayerNorm
    and GELU."""
    if type(layer) is not DecoderOnlyBlock or not layer.pre_norm or layer.sliding:
        return "a block other than the lesson's pre-norm one"
    attn, ffn = layer.self_attn, layer.ffn
    if (type(attn) not in (FusedSelfAttention, MultiHeadAttention) or "attend" in vars(attn)
            or not isinstance(attn.q_norm, NoNorm)):
        return "an attention other than Q/K/V without q/k norms"
    gated = type(ffn) in (FusedGatedFeedForward, GatedFeedForward)
    if (not gated or ffn.activation != "swiglu") if llama else \
            (type(ffn) is not FeedForward or ffn.activation not in ("gelu", "gelu_tanh")):
        return "a feed-forward other than a SwiGLU (with RoPE) or a plain GELU (with learned positions)"
    norm = DecodingRMSNorm if llama else DecodingLayerNorm
    if not (type(layer.attn_norm) is type(layer.ffn_norm) is norm):
        return "norms other than RMSNorm (with RoPE) or LayerNorm (with learned positions)"
    return None


def _model_reason(model: CausalLM) -> str | None:
    """Why the model's whole (config, embedding, positions, final norm, head) is not the fused
    step's, or None."""
    cfg = model.cfg
    if cfg.sliding_window is not None or cfg.moe is not None or cfg.mla is not None or cfg.linear_layers \
            or cfg.family != FamilyConfig() or getattr(cfg, "query_scale_beta", None) is not None:
        return "a window, experts, latent attention, linear attention or a family setting"
    if any(p.dtype != torch.float32 or not p.is_cpu for p in model.parameters()):
        return "weights other than fp32 on the CPU"
    llama = (type(model.positions) is NoPositions and type(model.rotary) is RotaryEmbedding
             and model.rotary.cos.size(-1) == model.layers[0].self_attn.head_dim
             and type(model.norm) is DecodingRMSNorm)
    gpt2 = (type(model.positions) is LearnedPositions and type(model.rotary) is NoRotary
            and type(model.norm) is DecodingLayerNorm)
    if not (type(model.embed) is TokenEmbedding and float(model.embed.scale) == 1.0 and (llama or gpt2)
            and getattr(model.lm_head, "bias", None) is None):
        return "an embedding, positions, final norm or head other than Llama's or GPT-2's"
    if MultiHeadAttention.attend is not FusedSelfAttention.attend:
        return "attention scored otherwise"
    return None


def fused_reason(model: nn.Module) -> str | None:
    """Why `model` does not decode through the fused C step, or None when it does."""
    if type(model) is not CausalLM:
        return "not a plain CausalLM"
    if (reason := _model_reason(model)) is not None:
        return reason
    llama = type(model.norm) is DecodingRMSNorm
    if (reason := next((r for r in (_layer_reason(layer, llama) for layer in model.layers) if r), None)):
        return reason
    if any(not (layer.attn_norm.eps == layer.ffn_norm.eps == model.norm.eps) for layer in model.layers):
        return "norms with different epsilons"
    if any(_part(m) is None for m in _linears(model)):
        return ("a linear layer other than nn.Linear, PackedLinear with its one-row copy, or Int8Linear / "
                "Int4Linear through the VNNI kernel")
    return None


def _weights(model: CausalLM) -> tuple[tuple[Tensor | None, ...], list[tuple[Tensor | None, ...]]]:
    """The tensors the step reads: (embedding, learned positions, cos, sin, final norm and bias)
    and each layer's four norm tensors; None where a bias or table is absent."""
    rope = type(model.rotary) is RotaryEmbedding
    whole = (model.embed.weight, None if rope else model.positions.weight,
             model.rotary.cos if rope else None, model.rotary.sin if rope else None,
             model.norm.weight, getattr(model.norm, "bias", None))
    per_layer = [(layer.attn_norm.weight, getattr(layer.attn_norm, "bias", None), layer.ffn_norm.weight,
                  getattr(layer.ffn_norm, "bias", None)) for layer in model.layers]
    return whole, per_layer


def _read(model: CausalLM) -> tuple[Tensor | None, ...]:
    """Every tensor the step reads (its weights and each linear layer's part, in order): the step is
    made again when any of them is another tensor object."""
    whole, per_layer = _weights(model)
    parts = [t for m in _linears(model) for t in _part(m)[1:]]
    return (*whole, *sum(per_layer, ()), *parts)


def _address(t: Tensor | None, offset: int = 0) -> int | None:
    return None if t is None else t.data_ptr() + offset


def _detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().contiguous()


def _offsets(kind: int, w: Tensor, in_features: int, row: int) -> tuple[int, int]:
    """Bytes from a part's weight and scales to its output `row` (a multiple of 4 for BLOCKED and INT8)."""
    if kind == INT8:  # block_int8's (N/4, K'/64, 4, 64) bytes: K' bytes a row
        return row * w.shape[1] * w.shape[3], row * 4
    if kind == INT4:  # (N, K/2) nibbles, (N, K/32) float16 scales
        return row * (in_features // 2), row * (in_features // 32) * 2
    return row * in_features * 4, 0  # PLAIN, BLOCKED (blocks of four rows, 4 K numbers a block)


def _parts(linears: list[nn.Module], slots: int, held: list[Tensor | None], split: tuple[int, ...] = (),
           ) -> ctypes.Array:
    """`slots` Parts for these layers (the rest unused), their tensors appended to `held`. `split`: the
    row counts one fused layer is handed over as (q, k, v or gate, up), where every boundary falls on
    a block of four rows (or the kind has no blocks), so that each thread can compute the rows it reads."""
    pieces = []
    for linear in linears:
        kind, *tensors = _part(linear)
        w, scale, bias = (_detached(t) for t in tensors)
        held.extend((w, scale, bias))
        bounds = [sum(split[:i]) for i in range(1, len(split))]
        fits = (len(linears) == 1 and sum(split) == linear.out_features
                and (kind in (PLAIN, INT4) or all(b % 4 == 0 for b in bounds)))
        start = 0
        for rows in split if fits else (linear.out_features,):
            weight_at, scale_at = _offsets(kind, w, linear.in_features, start)
            pieces.append(_Part(_address(w, weight_at), _address(scale, scale_at), _address(bias, 4 * start),
                                rows, kind))
            start += rows
    return (_Part * slots)(*pieces)


def _vnni(widest: int, kinds: set[int], threads: int) -> tuple[_Vnni, Tensor | None]:
    """vnni_matvec.c's one-row functions and scratch for each of `threads` threads' quantized rows
    (64-byte aligned), where some part is INT8 or INT4."""
    if not kinds & {INT8, INT4}:
        return _Vnni(), None
    name = "int8_vnni_linear" if INT8 in kinds else "int4_vnni_linear"
    size = 3 * -(-widest // 128) * 128  # vnni_row_bytes for either kind: a multiple of 64
    scratch = torch.zeros(threads * 2 * size + 64, dtype=torch.uint8)
    start = scratch.data_ptr() + (-scratch.data_ptr() % 64)
    return _Vnni(*(c_kernels.address(name, f) for f in ("vnni_prepare", "int8_vnni_rows", "int4_vnni_rows")),
                 start, start + size, 2 * size), scratch


def _layers(model: CausalLM, per_layer: list[tuple[Tensor | None, ...]], held: list[Tensor | None],
            ) -> ctypes.Array:
    """decoder_step.c's Layers (their cache pointers unset), the tensors they point into appended to
    `held`: a fused Q/K/V handed over as its q, k and v rows, a fused gate/up as its gate and up rows."""
    attn0 = model.layers[0].self_attn
    H, Hkv, Dh = attn0.n_heads, attn0.n_kv_heads, attn0.head_dim
    F = model.layers[0].ffn.down_proj.in_features
    layers = (_Layer * len(model.layers))()
    for i, (layer, norms) in enumerate(zip(model.layers, per_layer)):
        norms = [_detached(t) for t in norms]
        held.extend(norms)
        qkv, o, up, down = _projections(layer)
        layers[i] = _Layer(*map(_address, norms), _parts(qkv, 3, held, (H * Dh, Hkv * Dh, Hkv * Dh)),
                           _parts([o], 1, held)[0], _parts(up, 2, held, (F, F)), _parts([down], 1, held)[0])
    return layers


class FusedStep:
    """The fused C decoding step of one model (see the module's docstring)."""

    def __init__(self, model: CausalLM, fn: ctypes._CFuncPtr) -> None:
        fn.argtypes = ([ctypes.c_void_p, P(_Shape), P(_Layer)] + [ctypes.c_void_p] * 4
                       + [P(_Part), P(_Vnni), ctypes.c_void_p, ctypes.c_void_p])
        self.model, self.fn = model, fn
        attn0, ffn0 = model.layers[0].self_attn, model.layers[0].ffn
        self.read = _read(model)
        whole, per_layer = _weights(model)
        self.weights = [_detached(t) for t in whole]
        self.held: list[Tensor | None] = []  # every tensor the C code points into
        self.layers = _layers(model, per_layer, self.held)
        H, Hkv, Dh, F = attn0.n_heads, attn0.n_kv_heads, attn0.head_dim, ffn0.down_proj.in_features
        self.head = _parts([model.lm_head], 1, self.held)
        self.kinds = [_part(m)[0] for m in _linears(model)]
        cfg = model.cfg
        self.widest, self.threads = max(cfg.d_model, F), 0  # the threads self.vnni has rows for
        split_heads = Dh % 4 == 0 and all(layer.qkv[2].rows for layer in self.layers)
        self.shape = _Shape(cfg.n_layers, cfg.d_model, H, Hkv, Dh, F, cfg.vocab_size, 0, 0,
                            float(model.norm.eps), type(model.norm) is DecodingLayerNorm,
                            ACTIVATIONS[ffn0.activation], type(model.rotary) is RotaryEmbedding, 1,
                            split_heads, 1)
        library = c_kernels.address("decoder_step", "decoder_step_work")
        self.work_floats = ctypes.CFUNCTYPE(ctypes.c_int64, P(_Shape))(library)
        self._held: tuple[Tensor, ...] = ()  # the cache buffers self.layers points at
        self.pace = StepThreads()  # torch's thread count, or one thread while a team is slower

    def usable(self, cache: KVCache, mask: Tensor | None, tokens: int = 1) -> bool:
        """A plain cache of one row, its fp32 buffers contiguous, room for the `tokens` new positions
        (at most MAX_ROWS), no mask."""
        if (mask is not None or type(cache) is not KVCache or not 1 <= tokens <= MAX_ROWS
                or cache.length + tokens > cache.slots):
            return False
        keys = cache.keys[0]
        if keys is None:
            return False
        buffers = (*cache.keys, *cache.values)
        if len(buffers) == len(self._held) and all(a is b for a, b in zip(buffers, self._held)):
            return True  # the buffers self.layers points at, checked at an earlier step
        if not (keys.size(0) == 1 and keys.dtype == torch.float32
                and all(t.is_contiguous() for t in buffers)):
            return False
        for layer, keys, values in zip(self.layers, cache.keys, cache.values):
            layer.keys, layer.values = keys.data_ptr(), values.data_ptr()
        self._held = buffers  # kept alive while self.layers points at them
        return True

    def __call__(self, ids: Tensor, cache: KVCache) -> Tensor:
        """ids (1, T) -> (T, V) the logits after each of the T tokens (T <= MAX_ROWS; one token: (1, V),
        the engine's (B, V)); their keys and values written from cache.length on, which advances by T.
        Each row's logits are those of T one-token steps, bit for bit (decoder_step.c). A cache other
        than the one `usable` last approved, or one without room, is a ValueError, never a read past
        the C step's buffers (an O(1) check: `usable` already compared the buffers)."""
        held = self._held[0] if self._held else None
        T = ids.size(-1)
        if (held is None or type(cache) is not KVCache or cache.keys[0] is not held
                or cache.length + T > cache.slots or not 1 <= T <= MAX_ROWS or ids.size(0) != 1):
            raise ValueError(f"the fused step needs a plain one-row fp32 KVCache with room for the new "
                             f"positions (1 to {MAX_ROWS} of them); decode this step with the model's own "
                             f"forward")
        tokens = ids[0].tolist()
        embed, positions, cos, sin, norm, norm_bias = self.weights
        if not all(0 <= t < embed.size(0) for t in tokens):
            raise ValueError(f"token ids {tokens} reach outside the vocabulary [0, {embed.size(0)})")
        s = self.shape
        s.slots, s.pos, s.rows = cache.keys[0].size(2), cache.length, T
        s.threads = self.pace.choose(torch.get_num_threads())  # torch's count, or one while a team is slow
        if s.threads > self.threads:  # each thread quantizes the rows it reads into its own scratch
            self.vnni, self._scratch = _vnni(self.widest, set(self.kinds), s.threads)
            self.threads = s.threads
        x = embed[ids[0]]  # (T, D), a copy
        if positions is not None:
            x += positions[s.pos:s.pos + T]
        work = torch.empty(self.work_floats(ctypes.byref(s)))  # 64-byte aligned, as torch allocates
        logits = torch.empty(T, s.V)  # (T, V)
        table = 4 * s.Dh * s.pos  # bytes to this position's row of cos and sin
        start = time.perf_counter()
        self.fn(x.data_ptr(), ctypes.byref(s), self.layers, _address(cos, table), _address(sin, table),
                norm.data_ptr(), _address(norm_bias), self.head, ctypes.byref(self.vnni), work.data_ptr(),
                logits.data_ptr())
        if T == 1:  # the pace of one-token steps picks the threads
            self.pace.record(s.threads, time.perf_counter() - start)
        cache.advance(T)
        return logits


_STEPS: weakref.WeakKeyDictionary[nn.Module, FusedStep | None] = weakref.WeakKeyDictionary()


def fused_step_for(model: nn.Module) -> FusedStep | None:
    """The model's fused step, or None where it does not apply or the C code cannot be built. Kept
    per model and made again when the model's modules or weight tensors were replaced since (a
    model prepared, quantized or given adapters afterwards); weights updated in place are read as
    they are."""
    if fused_reason(model) is not None:
        _STEPS.pop(model, None)
        return None
    step = _STEPS.get(model)
    read = _read(model)
    same = step is not None and len(read) == len(step.read) and all(a is b for a, b in zip(read, step.read))
    if not same:
        fn = c_kernels.kernel("decoder_step")
        step = _STEPS[model] = None if fn is None else FusedStep(model, fn)
    return step


__all__ = ["ACTIVATIONS", "MAX_ROWS", "FusedStep", "fused_reason", "fused_step_for"]
