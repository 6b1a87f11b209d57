"""Runner for a decoder-only model with a KV cache: `model(idx, cache)` returns the logits of the new
tokens and keeps their keys and values in `cache` (an object of the learner's cache class, or one made
by a method of the model), so that the next call sees them.

The probe is data: SCHEDULE feeds one sequence as a prefill, then one token at a time, then a chunk;
the logits of every call must equal the logits of the same model without a cache at those positions
(the model's own forward, `model(idx)`). Then the cache is filled to its limit and given one token
more: refusing it (an exception) or rolling the window (the logits of the last `max_len` tokens) is
what the learner's code says, and both pass; anything else fails.

The named mistakes are computed by a reference (plain functions, `handformer.check.reference.variants`) on the
learner's weights: MISTAKES. Caching the keys before the rotation and rotating all of them at their
positions on reading gives the cache-less logits and passes (a convention). A model without a cache
argument (Meta's `forward(tokens, start_pos)` with the caches inside the attention) is NOT CHECKED.

Shape legend: B batch, T new tokens, S cached + new tokens, D d_model, H heads, Hkv key/value heads,
Dh head dim, V vocabulary, L layers.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_names
from handformer.check.core.defaults import quietly, then
from handformer.check.core.discovery import Component, build, own_objects
from handformer.check.core.layer_map import outside
from handformer.check.core.result import NOT_CHECKED, Check, ComponentResult, Finding, LearnerError, text
from handformer.check.core.sizes import is_number
from handformer.check.core.source import locate, source_lines
from handformer.check.core.weights import (
    MappingError,
    Slot,
    attention_slots,
    ffn_slots,
    ffn_weights,
    leaves,
    mha_weights,
    norm_slots,
    norm_weights,
    of_kind,
    shapes_text,
)
from handformer.check.reference import variants as V

VOCAB, D, H, KV_HEADS, F_WIDTH, LAYERS, MAX_LEN, B = 29, 16, 4, 2, 40, 2, 16, 2
SIZES = {"src_vocab": VOCAB, "d_model": D, "n_heads": H, "n_kv_heads": KV_HEADS, "d_ff": F_WIDTH,
         "n_layers": LAYERS, "max_len": MAX_LEN, "dropout": 0.0, "d_head": D // H}
SCHEDULE = (5, 1, 1, 1, 3)  # the new tokens of each call: a prefill, three single tokens, a chunk
TOL = 1e-6
CACHE_ARGS = ("cache", "kv_cache", "caches", "kv_caches", "past_key_values", "past", "kv")
CACHE_CLASSES = ("KVCache", "KVCacheManager", "KeyValueCache", "Cache", "LayerCache", "StaticCache",
                 "DynamicCache")
CACHE_METHODS = ("new_cache", "make_cache", "init_cache", "empty_cache", "create_cache", "setup_cache")
LENGTH_ATTRS = ("length", "seq_len", "seqlen", "pos", "cur_pos", "n_tokens", "size", "offset", "start_pos",
                "position", "current_length", "cache_len")
# the mistakes, as flags of the reference below (variants' rope_no_offset rotates from 0)
MISTAKES = ("rope_no_offset", "kv_cache_not_advanced:overwrite", "kv_keys_rotated_twice")


@dataclass
class LlamaWeights:
    """The learner's model as the reference reads it."""

    embed: Tensor  # (V, D)
    layers: list[V.LayerWeights]
    norm: V.NormWeights
    head: Tensor  # (V, D)
    rope: str  # half | interleaved


# --- the reference ---------------------------------------------------------------------------------

def attend(w: V.MHAWeights, x: Tensor, start: int, cached: list[Tensor] | None, flags: V.Flags,
           store: list[Tensor], window: int | None = None) -> Tensor:
    """One attention of the reference over (B, T, D) new tokens at positions start.., after the
    cached [keys, values] (each (B, Hkv, S, Dh)) or none; what the cache then holds goes to store
    (its last `window` positions only, for a cache that rolls)."""
    B_, T, _ = x.shape
    q = V.split_heads(V.linear(x, w.q), w.n_heads, frozenset())  # (B, H, T, Dh)
    k = V.split_heads(V.linear(x, w.k), w.n_kv_heads, frozenset())  # (B, Hkv, T, Dh)
    v = V.split_heads(V.linear(x, w.v), w.n_kv_heads, frozenset())
    q, k = V.rotary(q, w.rope, start), V.rotary(k, w.rope, start)
    if cached is not None and V.has(flags, "kv_cache_not_advanced") is None:
        k, v = torch.cat([cached[0], k], 2), torch.cat([cached[1], v], 2)  # (B, Hkv, S, Dh)
    if window is not None:
        k, v = k[:, :, -window:], v[:, :, -window:]  # (B, Hkv, S <= window, Dh)
    store[:] = [k, v]  # not advanced: each call overwrites the cache from position 0
    if V.has(flags, "kv_keys_rotated_twice") is not None:
        k = V.rotary(k, w.rope, 0)  # the cached keys, rotated already, rotated again at 0 .. S-1 on reading
    S = k.size(2)
    keep = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # query t sees the keys up to its position
    n_rep = w.n_heads // w.n_kv_heads
    out, _ = V.attention(q, V.repeat_kv(k, n_rep), V.repeat_kv(v, n_rep), keep)  # (B, H, T, Dh)
    out = out.transpose(1, 2).reshape(B_, T, -1)  # (B, T, D)
    return V.linear(out, w.o)


def reference(w: LlamaWeights, idx: Tensor, schedule: tuple[int, ...], flags: V.Flags = frozenset(),
              window: int | None = None) -> Tensor:
    """The logits (B, sum(schedule), V) of the reference fed idx in calls of schedule's sizes, with a
    cache and these mistakes (rolled to its last `window` tokens); a schedule of one call is the model
    without a cache."""
    caches: list[list[Tensor]] = [[] for _ in w.layers]  # [keys, values] of each layer, once fed
    fed, length, outs = 0, 0, []
    for n in schedule:
        start = 0 if V.has(flags, "rope_no_offset") is not None else length
        x = w.embed[idx[:, fed:fed + n]]  # (B, T, D)
        for layer, cache in zip(w.layers, caches):
            x = x + attend(layer.self_attn, V.norm(layer.norms[0], x), start, cache or None, flags, cache,
                           window)
            x = x + V.feed_forward(layer.ffn, V.norm(layer.norms[1], x))
        outs.append(V.norm(w.norm, x) @ w.head.T)  # (B, T, V)
        fed += n
        if V.has(flags, "kv_cache_not_advanced") is None:
            length += n
    return torch.cat(outs, 1)


# --- the learner's weights as the reference reads them ---------------------------------------------

def _blocks(module: nn.Module) -> nn.ModuleList:
    for sub in module.modules():
        if isinstance(sub, nn.ModuleList) and len(sub) == LAYERS:
            return sub
    raise MappingError(f"expected the {LAYERS} blocks in an nn.ModuleList",
                       zh=f"应当把 {LAYERS} 个块放在一个 nn.ModuleList 里")


def _layer_candidates(name: str, block: nn.Module) -> list[tuple[list[Any], list[V.NormWeights]]]:
    """(attention slots, FFN slots) of one block for each order of a gated FFN's two matrices, and
    its norms."""
    found = leaves(block)
    linears = of_kind(found, "linear")
    attn = attention_slots(linears, D, 1, name, KV_HEADS * (D // H))[0]
    norms = norm_slots(of_kind(found, "norm"), 2, ["attention", "FFN"], name)
    return [(attn, ffn) for ffn in ffn_slots(linears, D, F_WIDTH, name)], list(map(norm_weights, norms))


def llama_weights(module: nn.Module) -> list[LlamaWeights]:
    """The learner's model read as the reference, once for each way to read it (the rotary layout,
    the order of a gated FFN's matrices); MappingError when it is not a Llama-like model."""
    blocks = _blocks(module)
    outer = outside(module, [blocks])
    first = {(x.kind, tuple(x.weight.shape)): x for x in reversed(outer)}  # the first of each kind and shape
    embed = first.get(("embedding", (VOCAB, D)))
    head = first.get(("linear", (VOCAB, D)), embed)
    norm = next(iter(of_kind(outer, "norm")), None)  # the first norm outside the blocks
    if embed is None or head is None or norm is None:
        found = shapes_text(outer)
        raise MappingError(f"expected nn.Embedding({VOCAB}, {D}), a final norm and an output head outside "
                           f"the blocks; found {found}",
                           zh=f"应当在 Block 之外有 nn.Embedding({VOCAB}, {D})、最后的归一化和输出层；"
                              f"实际找到 {found}")
    layers = [_layer_candidates(f"layers.{i}", b) for i, b in enumerate(blocks)]
    out = []
    for rope in ("interleaved", "half"):
        for order in range(len(layers[0][0])):
            ws = [V.LayerWeights(mha_weights(c[order][0], H, KV_HEADS, rope),
                                 ffn_weights(c[order][1], "silu" if len(c) == 2 else "gelu"), norms,
                                 placement="pre") for c, norms in layers]
            final = norm_weights(Slot("final norm", norm))
            out.append(LlamaWeights(embed.weight, ws, final, head.weight, rope))
    return out



# --- driving the learner's model -------------------------------------------------------------------

class Driver:
    """Calls the learner's model with and without its cache: `model(idx)`, `model(idx, cache)`;
    a forward that returns (logits, cache) hands the next call that cache."""

    def __init__(self, comp: Component, ctx: Context, module: nn.Module) -> None:
        self.comp, self.ctx, self.module = comp, ctx, module
        names = forward_names(module)
        self.arg = next((n for n in names if n in CACHE_ARGS), None)
        own = own_objects(ctx.module)
        self.cache_class = next((own[n] for n in CACHE_CLASSES if inspect.isclass(own.get(n))), None)
        self.method = next((m for m in CACHE_METHODS if callable(getattr(module, m, None))), None)

    def missing(self) -> str | None:
        """Why the model cannot be driven with a cache, or None."""
        if self.arg is None:
            return (f"{self.comp.name}.forward has no cache argument ({', '.join(CACHE_ARGS[:3])}): the "
                    "cache must be an object passed into forward (caches kept inside the attention, as "
                    "Meta's "
                    "forward(tokens, start_pos), are not driven here)")
        if self.cache_class is None and self.method is None:
            return (f"no cache to pass: define a class {CACHE_CLASSES[0]} (built with n_layers and max_len) "
                    f"or a method {self.comp.name}.{CACHE_METHODS[0]}()")
        return None

    def new_cache(self) -> Any:
        sizes = {"n_layers": LAYERS, "max_len": MAX_LEN, "n_kv_heads": KV_HEADS, "d_head": D // H,
                 "n_heads": H, "d_model": D}
        if self.method is not None:
            fn = getattr(self.module, self.method)
            return self.ctx.learner.call("__init__", build, fn, sizes)
        return self.ctx.learner.call("__init__", build, self.cache_class, sizes)

    def __call__(self, idx: Tensor, cache: Any = None) -> tuple[Tensor | None, Any]:
        kwargs = {self.arg: cache} if cache is not None and self.arg else {}
        raw = self.ctx.learner.call("forward", self.module, idx, **kwargs)
        pair = isinstance(raw, (tuple, list)) and len(raw) == 2
        if pair and raw[1] is not None and not isinstance(raw[1], Tensor):
            cache = raw[1]  # functional style: (logits, the new cache)
        logits = fp.first_tensor(raw, 3)
        return then(logits, Tensor.double), cache

    def run(self, idx: Tensor, schedule: tuple[int, ...]) -> tuple[Tensor | None, list[int | None]]:
        """The logits (B, sum(schedule), V) of the calls with one cache, and the cache's length
        attribute after each call (None when it has none)."""
        cache, fed, outs, lengths = self.new_cache(), 0, [], []
        for n in schedule:
            out, cache = self(idx[:, fed:fed + n], cache)
            if out is None or tuple(out.shape) != (idx.size(0), n, VOCAB):
                return None, lengths
            outs.append(out)
            lengths.append(cache_length(cache))
            fed += n
        return torch.cat(outs, 1), lengths


def cache_length(cache: Any) -> int | None:
    for name in LENGTH_ATTRS:
        value = getattr(cache, name, None)
        if is_number(value, int):
            return value
    if isinstance(cache, (list, tuple, dict)):
        return None  # a list of layers: its length is not the tokens'
    return quietly(lambda: len(cache), TypeError)


# --- the runner ------------------------------------------------------------------------------------

PHASES = (("the prefill", "预填充", 0, SCHEDULE[0]),
          ("one token at a time", "逐个 token", SCHEDULE[0], sum(SCHEDULE[:-1])),
          ("a chunk", "一次一段", sum(SCHEDULE[:-1]), sum(SCHEDULE)))


def check_kv_cache(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp, SIZES)
    drive = Driver(comp, ctx, module)
    why = drive.missing()
    if why is not None:
        res.status = NOT_CHECKED
        res.error = LearnerError("mapping", why, "forward")
        return finish(res)
    N = sum(SCHEDULE)
    idx = torch.randint(0, VOCAB, (B, MAX_LEN + 1), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), fp.dropout_off():
        plain, _ = drive(idx[:, :N])
        cached, lengths = drive.run(idx, SCHEDULE)
        if plain is None or cached is None:
            raise ctx.learner.fail("forward", f"{comp.name} returned no logits of shape (B, T, vocab_size) = "
                                   f"({B}, T, {VOCAB}) for T new tokens, with and without its cache",
                                   f"输入 T 个新 token 时，不论用不用缓存，{comp.name} 都应当返回形状为 (B, "
                                   f"T, vocab_size) = ({B}, T, {VOCAB}) 的 logits，但它没有")
        for en, zh, a, b in PHASES:
            err = fp.max_error(cached[:, a:b], plain[:, a:b])
            res.checks.append(Check(text(f"with the cache, {en} (positions {a}..{b - 1}): the logits "
                                         "without it",
                                         f"用缓存{zh}（位置 {a}..{b - 1}）：logits 与不用缓存时相同"),
                                    err < TOL, error_text(err)))
        res.max_abs_error = fp.max_error(cached, plain)
        w = _diagnose(res, ctx, comp, module, idx[:, :N], plain, cached, lengths)
        _limit(res, drive, idx, w)
    return finish(res)


def _reader(module: nn.Module, idx: Tensor, plain: Tensor) -> tuple[LlamaWeights | None, V.Flags]:
    """The reading of the learner's weights whose reference computes their logits without a cache
    (keys rotated twice show there too), or None."""
    for w in llama_weights(module):
        for flags in (frozenset(), frozenset({"kv_keys_rotated_twice"})):
            if fp.max_error(plain, reference(w, idx, (idx.size(1),), flags)) < TOL:
                return w, flags
    return None, frozenset()


def _diagnose(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module, idx: Tensor,
              plain: Tensor, cached: Tensor, lengths: list[int | None]) -> LlamaWeights | None:
    """The model without the cache against the reference on the learner's weights, then the named
    mistakes that reproduce the cached logits; returns the reference's reading of the weights."""
    try:
        w, base = _reader(module, idx, plain)
    except MappingError as err:
        res.notes.append(text(f"not compared with handformer's reference (a Llama with RoPE): {err}",
                              f"没有与 handformer 的参考实现（带 RoPE 的 Llama）比较：{err.zh or err}"))
        return None
    res.checks.append(Check(text("without the cache, the logits of handformer's reference on your weights",
                                 "不用缓存时，logits 与 handformer 的参考实现（用你的权重）一致"),
                            w is not None and not base, text("no reading of your weights gives them",
                                                             "换哪种方式读你的权重都对不上")))
    if w is None:
        return None
    res.convention = text(f"rotary pairs {w.rope}", f"旋转配对方式：{w.rope}")
    correct = reference(w, idx, SCHEDULE)
    found = fp.search(cached, lambda fl: reference(w, idx, SCHEDULE, fl | base), MISTAKES, None, 2) or (
        frozenset(), 0.0)  # none: the mistakes of the reading alone
    flags = set(base) | found[0]
    if "rope_no_offset" in flags and lengths and lengths[0] == 0:
        flags = (flags - {"rope_no_offset"}) | {"kv_cache_not_advanced:append"}  # its length never moved
    lines, matched = source_lines(ctx.objects(comp)), found[1]
    for flag in sorted(flags):
        name, _, form = flag.partition(":")
        number, code = locate(name, lines)
        res.findings.append(Finding(name, text(
            f"your cached logits equal the reference's with this mistake (max abs difference "
            f"{matched:.1e}); they differ from the correct ones by "
            f"{fp.max_error(cached, correct):.3g}",
            f"你用缓存算出的 logits 与带这个错误的参考实现一致（最大绝对误差 {matched:.1e}），"
            f"与正确结果相差 {fp.max_error(cached, correct):.3g}"), number, code, form))
    return w


def _limit(res: ComponentResult, drive: Driver, idx: Tensor, w: LlamaWeights | None) -> None:
    """Filled to max_len, then one token more: refused (an exception) or rolled (the reference's
    logits with a cache that keeps the last max_len tokens, positions going on) both pass."""
    cache = drive.new_cache()
    for a, b in ((0, MAX_LEN - 4), (MAX_LEN - 4, MAX_LEN)):
        _, cache = drive(idx[:, a:b], cache)
    try:
        raw = drive.module(idx[:, MAX_LEN:], **{drive.arg: cache})
    except Exception as err:  # their code refuses the token past the limit: what it should do
        why = f"{type(err).__name__}: {str(err)[:120]}"
        res.notes.append(text(f"token {MAX_LEN} past the cache's {MAX_LEN}: refused ({why})",
                              f"缓存满 {MAX_LEN} 个之后再给位置 {MAX_LEN} 的 token：被拒绝（{why}）"))
        return
    out = fp.first_tensor(raw, 3)
    if w is None:
        res.notes.append(text(f"token {MAX_LEN} past the cache's {MAX_LEN} was taken: not compared (no "
                              "reference)",
                              f"缓存满了之后位置 {MAX_LEN} 的 token 被收下了：没有参考实现，没有比较"))
        return
    rolled = reference(w, idx, (MAX_LEN - 4, 4, 1), window=MAX_LEN)[:, -1:]  # (B, 1, V)
    err = fp.max_error(out, rolled)
    res.checks.append(Check(text(f"past the limit ({MAX_LEN} tokens): refused, or rolled (the cache keeps "
                                 f"the last {MAX_LEN} tokens)",
                                 f"超过上限（{MAX_LEN} 个 token）：拒绝，"
                                 f"或者滚动（缓存只留最后 {MAX_LEN} 个 token）"),
                            err < TOL, error_text(err)))
