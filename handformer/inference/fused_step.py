"""A small Llama-style model's decoding step at batch 1 as one C function (llama_step.c), the default
where it applies: the eager step of a model like llama2.c's stories260K (5 layers, 64 wide) is ~900
PyTorch operator calls, each with Python and dispatch around it, for about 1 MFLOP of work.

`FusedStep` keeps `StaticStep`'s protocol (inference/static_step.py): the engine calls it for a
one-token step when `usable(cache, mask)` says so, and it returns the (B, V) logits and advances the
cache. It reads the prepared model's own weights (no copy) and writes the new key and value into the
model's own KV cache, so the engine can step eagerly and fused in any order (prefill, speculation and
batches stay eager). The C code computes what CausalLM.forward computes, in fp32, up to the order of
the sums (greedy tokens equal in tests/test_fused_step.py).

It applies (`fused_reason` is None) to a prepared `CausalLM` whose every weight matrix is small
(`default_threads` gives 1: one thread, as llama2.c's run.c), built of the lesson's pre-norm
blocks with exactly: RMSNorm, fused Q/K/V without biases or q/k norms, half-split RoPE over the
whole head, plain softmax attention, a fused SwiGLU feed-forward without biases, no added
positions, an unscaled embedding, no family settings, no window, no experts, fp32 on the CPU.
Everything else decodes eagerly. Built by gcc at first use (c_kernels.py's cache); without gcc,
AVX-512 or with HANDFORMER_NO_C_KERNELS=1 the model decodes eagerly.
Shape legend: B rows (1 here), D width, H / Hkv query / key-value heads, Dh head dim, F FFN width,
V vocabulary, C cache capacity.
"""

from __future__ import annotations

import ctypes
import weakref

import torch
from torch import Tensor, nn

from handformer.config import FamilyConfig
from handformer.inference import c_kernels
from handformer.inference.fuse import FusedGatedFeedForward, FusedSelfAttention
from handformer.inference.norms import DecodingRMSNorm
from handformer.inference.threads import default_threads
from handformer.models.causal_lm import CausalLM
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.kv_cache import KVCache
from handformer.nn.norms import NoNorm
from handformer.nn.positions import NoPositions, RotaryEmbedding

P = ctypes.POINTER


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("n_layers", "D", "H", "Hkv", "Dh", "F", "V", "slots",
                                                    "pos")] + [("eps", ctypes.c_float)]


class _Layers(ctypes.Structure):
    _fields_ = [(name, P(ctypes.c_void_p))
                for name in ("attn_norm", "qkv", "o", "ffn_norm", "gate_up", "down", "keys", "values")]


def _plain_linear(m: nn.Module) -> bool:
    return type(m) is nn.Linear and m.bias is None


def _layer_reason(layer: nn.Module) -> str | None:
    """Why this block is not the fused step's, or None."""
    if type(layer) is not DecoderOnlyBlock or not layer.pre_norm or layer.sliding:
        return "a block other than the lesson's pre-norm one"
    attn, ffn = layer.self_attn, layer.ffn
    if (type(attn) is not FusedSelfAttention or "attend" in vars(attn) or not isinstance(attn.q_norm, NoNorm)
            or not (_plain_linear(attn.qkv_proj) and _plain_linear(attn.o_proj))):
        return "an attention other than fused Q/K/V without biases or q/k norms"
    if type(ffn) is not FusedGatedFeedForward or ffn.activation != "swiglu" \
            or not (_plain_linear(ffn.gate_up_proj) and _plain_linear(ffn.down_proj)):
        return "a feed-forward other than a fused SwiGLU without biases"
    if not (type(layer.attn_norm) is type(layer.ffn_norm) is DecodingRMSNorm):
        return "norms other than RMSNorm"
    return None


def fused_reason(model: nn.Module) -> str | None:
    """Why `model` does not decode through the fused C step, or None when it does."""
    if type(model) is not CausalLM:
        return "not a plain CausalLM"
    cfg = model.cfg
    if cfg.sliding_window is not None or cfg.moe is not None or cfg.mla is not None or cfg.linear_layers \
            or cfg.family != FamilyConfig() or getattr(cfg, "query_scale_beta", None) is not None:
        return "a window, experts, latent attention, linear attention or a family setting"
    if default_threads(model) != 1:
        return "large weight matrices (the products want threads and vector kernels)"
    if any(p.dtype != torch.float32 or not p.is_cpu for p in model.parameters()):
        return "weights other than fp32 on the CPU"
    if not (type(model.embed) is TokenEmbedding and float(model.embed.scale) == 1.0
            and type(model.positions) is NoPositions and type(model.rotary) is RotaryEmbedding
            and model.rotary.cos.size(-1) == model.layers[0].self_attn.head_dim
            and type(model.norm) is DecodingRMSNorm and _plain_linear(model.lm_head)):
        return "an embedding, positions, RoPE, final norm or head other than Llama's"
    if MultiHeadAttention.attend is not FusedSelfAttention.attend:
        return "attention scored otherwise"
    if any(not (layer.attn_norm.eps == layer.ffn_norm.eps == model.norm.eps) for layer in model.layers
           if type(layer.attn_norm) is DecodingRMSNorm):
        return "norms with different epsilons"
    return next((r for r in map(_layer_reason, model.layers) if r is not None), None)


def _weights(model: CausalLM) -> tuple[tuple[Tensor, ...], list[tuple[Tensor, ...]]]:
    """The tensors the step reads: (embedding, cos, sin, final norm, head) and each layer's six."""
    whole = (model.embed.weight, model.rotary.cos, model.rotary.sin, model.norm.weight, model.lm_head.weight)
    per_layer = [(layer.attn_norm.weight, layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                  layer.ffn_norm.weight, layer.ffn.gate_up_proj.weight, layer.ffn.down_proj.weight)
                 for layer in model.layers]
    return whole, per_layer


def _pointers(tensors: list[Tensor]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


class FusedStep:
    """The fused C decoding step of one model (see the module's docstring)."""

    def __init__(self, model: CausalLM, fn: ctypes._CFuncPtr) -> None:
        fn.argtypes = [ctypes.c_void_p, P(_Shape), P(_Layers)] + [ctypes.c_void_p] * 6
        self.model, self.fn = model, fn
        attn0 = model.layers[0].self_attn
        self.whole, per_layer = _weights(model)
        self.weights = [t.detach().contiguous() for t in self.whole]
        self.layer_weights = [[t.detach().contiguous() for t in column] for column in zip(*per_layer)]
        self.per_layer = per_layer
        self.eps = float(model.norm.eps)
        cfg = model.cfg
        self.shape = _Shape(cfg.n_layers, cfg.d_model, attn0.n_heads, attn0.n_kv_heads, attn0.head_dim,
                            model.layers[0].ffn.down_proj.in_features, cfg.vocab_size, 0, 0, self.eps)
        self.layers = _Layers(*[_pointers(column) for column in self.layer_weights], None, None)
        self._held: tuple[Tensor, ...] = ()  # the cache buffers self.layers points at
        self.x = torch.empty(cfg.d_model)

    def usable(self, cache: KVCache, mask: Tensor | None) -> bool:
        """A plain cache of one row, its fp32 buffers contiguous, room for the new position, no mask."""
        if mask is not None or type(cache) is not KVCache or cache.length >= cache.slots:
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
        self.layers.keys, self.layers.values = _pointers(cache.keys), _pointers(cache.values)
        self._held = buffers  # kept alive while self.layers points at them
        return True

    def __call__(self, ids: Tensor, cache: KVCache) -> Tensor:
        """ids (1, 1) -> (1, V) logits; the key and value written at cache.length, which advances.
        `usable(cache, None)` must have said yes."""
        token = int(ids[0, 0])
        embed, cos, sin, norm, head = self.weights
        if not 0 <= token < embed.size(0):
            raise ValueError(f"token id {token} is outside the vocabulary [0, {embed.size(0)})")
        s = self.shape
        s.slots, s.pos = cache.keys[0].size(2), cache.length
        self.x.copy_(embed[token])
        Dh = s.Dh
        work = torch.empty(2 * s.D + 2 * (s.H + 2 * s.Hkv) * Dh + 2 * s.F + s.slots)
        logits = torch.empty(1, s.V)  # (B, V)
        table = 4 * Dh * s.pos  # bytes to this position's row of cos and sin
        self.fn(self.x.data_ptr(), ctypes.byref(s), ctypes.byref(self.layers), cos.data_ptr() + table,
                sin.data_ptr() + table, norm.data_ptr(), head.data_ptr(), work.data_ptr(), logits.data_ptr())
        cache.advance(1)
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
    whole, per_layer = _weights(model)
    same = step is not None and all(a is b for a, b in zip((*whole, *sum(per_layer, ())),
                                                          (*step.whole, *sum(step.per_layer, ()))))
    if not same:
        fn = c_kernels.kernel("llama_step")
        step = _STEPS[model] = None if fn is None else FusedStep(model, fn)
    return step


__all__ = ["FusedStep", "fused_reason", "fused_step_for"]
