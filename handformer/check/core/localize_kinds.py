"""The reference's sub-steps of each kind that `check` localizes, and the one call that localizes it.

    views = ffn_views(w, x)                  # [("up(x)", ...), ("act(up(x))", ...), ("the output", ...)]
    note_departure(res, lambda: localize_ffn(module, readings, x))

Each kind lists its sub-steps as named views (the FFN's projections and activation; the norm's mean,
centred input, variance, root and gain; a layer's sublayers, residual sums and norms; the loss's
log-probabilities, target distribution, per-token losses, mask and reduction). Where check does not
know which reading of the learner's weights is meant (which matrix is the gate, which activation,
pre- or post-norm, which loss convention), each reading is a list of views and the one that explains
the most of the learner's steps is judged (`localize.latest_departure`).

Shape legend: B batch, T length, D d_model, F FFN width, V vocabulary, N = B * T.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.defaults import given
from handformer.check.core.fingerprint import hooked, quietly
from handformer.check.core.localize import (
    NUMBERS,
    Departure,
    Form,
    View,
    add_departure,
    explained,
    first_departure,
    first_tensor,
    graded,
    latest_departure,
    over_axes,
    place_findings,
    rotate_every_two,
    rotate_half,
    same,
    statement,
    trace_steps,
    view_zh,
)
from handformer.check.core.result import ComponentResult, text
from handformer.check.core.source import functions_called, reachable, source_text
from handformer.check.reference import variants as V
from handformer.time_limit import cpu_limit

Localize = Callable[[], Departure | None]


def note_departure(res: ComponentResult, localize: Localize) -> None:
    """A FAIL (the caller judges it) that no catalogued mistake explains gets a note: where the
    learner's computation first parts from the reference, its line, and the form of the difference; a
    named mistake whose patterns found no line is placed there. Localizing is a help, never a
    verdict: when it cannot run (the learner's code raises), no note."""
    if explained(res):
        return place_findings(res, localize)
    found = quietly(lambda: _within(localize))
    if found is not None:
        add_departure(res, found)


class LocalizeTimeout(Exception):
    """Localizing ran past LOCALIZE_LIMIT."""


LOCALIZE_LIMIT = 10.0  # CPU seconds a departure is searched for: the verdict is kept within the step's limit


def _within(localize: Localize) -> Departure | None:
    """The departure `localize` finds within LOCALIZE_LIMIT (LocalizeTimeout after it: no note)."""
    with cpu_limit(LOCALIZE_LIMIT, LocalizeTimeout):
        return localize()


def traced_parts(module: nn.Module, prefix: str = "self") -> list[tuple[str, nn.Module]]:
    """The module's parts whose outputs are sub-steps: its children (and the items of a list or dict
    of them, nested too: litgpt's `transformer.h`), not dropout (the identity in eval mode)."""
    out = []
    for name, child in module.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += traced_parts(child, f"{prefix}.{name}")
        elif not isinstance(child, nn.Dropout):
            out.append((f"{prefix}.{name}", child))
    return out


def _source(obj: Any) -> tuple[str | None, Any]:
    """The learner's file and the code of its forward (a module's) or of the function."""
    fn = type(obj).forward if isinstance(obj, nn.Module) else obj
    return inspect.getsourcefile(fn), getattr(fn, "__code__", None)


# --- the FFN ------------------------------------------------------------------------------------

def ffn_views(w: V.FFNWeights, x: Tensor) -> list[View]:
    """down(act(up(x))), or down(act(gate(x)) * up(x)): each product and activation on its own."""
    act = V.ACTIVATIONS[w.activation]
    up = V.linear(x, w.up)  # (B, T, F)
    if w.gate is None:
        views = [("up(x), the first projection", up), (f"{w.activation}(up(x))", act(up))]
    else:
        gate = V.linear(x, w.gate)  # (B, T, F)
        views = [("gate(x)", gate), ("up(x)", up), (f"{w.activation}(gate(x))", act(gate)),
                 (f"{w.activation}(gate(x)) * up(x)", act(gate) * up)]
    if w.down is not None:
        views.append(("the output down(...)", V.linear(views[-1][1], w.down)))
    return views


def with_own_functions(code: Any, fn: Any) -> tuple[Any, ...]:
    """The code of `fn` and of the plain functions of its own file that it calls by name (GPT-2's
    `gelu_new(x)`, an activation written out), and those they call in turn: what they return is a
    step too, at their line."""
    return (code, *helper_codes([fn]))  # only those of its file are traced


def localize_ffn(module: nn.Module, readings: list[V.FFNWeights], x: Tensor) -> Departure | None:
    """Run the learner's FFN on x (B, T, D) traced (the functions of its file it calls too); the first
    step no reading explains."""
    filename, code = _source(module)
    code = with_own_functions(code, type(module).forward)
    x = x.detach().requires_grad_()
    steps = trace_steps(lambda: module(x), filename, code, _all_parts(module))
    sizes = {"d_model": x.size(-1), "d_ff": readings[0].up[0].size(0)}
    views = [ffn_views(w, x.detach()) for w in readings]
    return latest_departure(steps, views, filename, sizes, [("the input x", x.detach())])


def _all_parts(module: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(f"self.{n}", m) for n, m in list(module.named_modules())[1:] if not isinstance(m, nn.Dropout)]


# --- LayerNorm and RMSNorm ------------------------------------------------------------------------

def norm_views(w: V.NormWeights, x: Tensor) -> list[View]:
    """LayerNorm's mean, centred x, variance, root and gain; RMSNorm's mean square, root and gain."""
    if w.kind == "rmsnorm":
        ms = x.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
        normed = x * torch.rsqrt(ms + w.eps)
        views = [("x²", x.pow(2)), ("the mean of x² over d_model", ms), ("mean(x²) + eps", ms + w.eps),
                 ("the root sqrt(mean(x²) + eps)", (ms + w.eps).sqrt()),
                 ("1 / sqrt(mean(x²) + eps)", torch.rsqrt(ms + w.eps)), ("x / rms(x)", normed)]
    else:
        mean = x.mean(-1, keepdim=True)  # (B, T, 1)
        var = (x - mean).pow(2).mean(-1, keepdim=True)  # (B, T, 1), biased as torch's LayerNorm
        normed = (x - mean) / torch.sqrt(var + w.eps)
        views = [("the mean over d_model", mean), ("x - mean", x - mean), ("(x - mean)²", (x - mean) ** 2),
                 ("the variance (biased)", var), ("var + eps", var + w.eps),
                 ("the root sqrt(var + eps)", (var + w.eps).sqrt()), ("(x - mean) / sqrt(var + eps)", normed)]
    out = w.weight * normed
    views = [("the input x", x)] + views + [("the gain times the normalized x", out)]
    if w.bias is not None:
        views.append(("the output gain * x̂ + bias", out + w.bias))
    return views


def method_codes(cls: type) -> set[Any]:
    """The code objects of the functions a class defines (its forward and its own helper methods) and
    of the free functions of its file they call, in any number of steps (MiniCPM's RMSNorm computes in
    a module-level `rms_layernorm`): the frames a trace of its call keeps."""
    methods = [f for f in vars(cls).values() if inspect.isfunction(f)]
    return {f.__code__ for f in methods} | helper_codes(methods)


def helper_codes(fns: list[Any]) -> set[Any]:
    """The code of the plain functions of their own file that `fns` call by name, and of those they
    call in turn (a norm's helper that calls another): each frame of theirs is a step's."""
    reached = reachable(fns, lambda f: set(functions_called(inspect.unwrap(f))))
    return {inspect.unwrap(f).__code__ for f in reached - set(fns)}


def localize_norm(module: nn.Module, w: V.NormWeights, x: Tensor) -> Departure | None:
    """Traced in its forward and its own helper methods (Meta's RMSNorm computes in `_norm(x)`)."""
    filename, _ = _source(module)
    code = method_codes(type(module))
    x = x.detach().requires_grad_()
    steps = trace_steps(lambda: module(x), filename, code, _all_parts(module))
    views = norm_views(w, x.detach())
    return latest_departure(steps, [views], filename, {"d_model": x.size(-1)}, [("the input x", x.detach())])


# --- encoder layer, decoder layer, decoder-only block --------------------------------------------

LABELS = {"attn": "self-attention", "cross": "cross-attention", "ffn": "FFN"}
SIDES = {"pre": "before", "post": "after"}  # where a placement puts the norm
# a sublayer's own sub-steps that a layer's views show, on its input h (the FFN's activation: a part of
# theirs only the layer's check sees); the sublayer's output is the layer's view
INNER = {"ffn": lambda w, h: ffn_views(w.ffn, h)[:-1]}


def layer_views(w: V.LayerWeights, x: Tensor, memory: Tensor | None, keep: Tensor | None) -> list[View]:
    """Each sublayer's norm, output and residual sum, in the order the placement computes them; the
    FFN's own sub-steps too (its activation: a part of theirs the layer's check alone sees)."""
    views: list[View] = [("the input x", x)]
    if w.placement == "parallel":
        return views + _parallel_views(w, x, keep)
    for i, name in enumerate(w.sublayers):
        label, n = LABELS[name], w.norms[i]
        f = _sublayer(w, name, memory, keep)
        inner = INNER.get(name, lambda w, h: [])
        if w.placement == "pre":
            h = V.norm(n, x)
            y = f(h)
            x = x + y * w.residual  # Granite's residual_multiplier (1: none)
            scaled = [(f"the {label}'s output times {w.residual:g}", y * w.residual)] * (w.residual != 1)
            scaled += [(f"the {label}'s output before its per-channel gain", y / g) for g in _gain(w, i)]
            views += [(f"the norm before the {label}", h), *inner(w, h), (f"the {label}'s output", y),
                      *scaled, (f"x + {label} (the residual sum)", x)]
        else:
            y = f(x)
            views += [*inner(w, x), (f"the {label}'s output", y), (f"x + {label} (the residual sum)", x + y)]
            x = V.norm(n, x + y)
            views.append((f"the norm after the {label}", x))
    return views


def _gain(w: V.LayerWeights, i: int) -> list[Tensor]:
    """The per-channel gain folded into the i-th sublayer's output projection, where it has one."""
    return list(filter(lambda g: g is not None, w.gains[i:i + 1]))


def _parallel_views(w: V.LayerWeights, x: Tensor, keep: Tensor | None) -> list[View]:
    """GPT-J's block, x + attn(norm_1(x)) + ffn(norm_2(x)): each branch's norm and output, their sums."""
    h, g = V.norm(w.norms[0], x), V.norm(w.norms[-1], x)  # norm_2 is norm_1 where the block has one norm
    attn, ffn = _sublayer(w, "attn", None, keep)(h), _sublayer(w, "ffn", None, keep)(g)
    return [("the norm before the self-attention", h), ("the self-attention's output", attn),
            ("the norm before the FFN", g), ("the FFN's output", ffn),
            ("x + self-attention (the residual sum)", x + attn), ("the two branches' sum", attn + ffn),
            ("the output x + self-attention + FFN", x + attn + ffn)]


def _sublayer(w: V.LayerWeights, name: str, memory: Tensor | None, keep: Tensor | None,
              ) -> Callable[[Tensor], Tensor]:
    by_name = {"attn": lambda h: V.multi_head_attention(w.self_attn, h, h, h, keep)[0],
               "cross": lambda h: V.multi_head_attention(w.cross_attn, h, memory, memory, None)[0]}
    return by_name.get(name, lambda h: V.feed_forward(w.ffn, h))


def localize_layer(layer: Any, readings: list[V.LayerWeights]) -> Departure | None:
    """Run the learner's layer (no mask handed over; a block that builds its causal mask keeps it)
    traced on its own forward and its parts; the first step that no reading explains."""
    from handformer.check.core.fingerprint import randn

    if layer.stateful:  # d2l's decoder builds its causal mask from its state: not localized
        return None
    T = 1 if layer.stepwise else 5  # a block driven a token at a time (its own KV cache): one step's tensors
    x = randn(2, T, readings[0].self_attn.q[0].size(1), seed=43).requires_grad_()
    memory = randn(2, 6, x.size(-1), seed=44) if layer.decoder else None
    keep = V.causal_keep(T)[None, None] if layer.masks_itself else None
    filename, code = _source(layer.module)
    layer.call(x, memory, None, None)  # the forms its tables take found first, outside the trace
    steps = trace_steps(lambda: layer.call(x, memory, None, None), filename, code, traced_parts(layer.module))
    views = [layer_views(w, x.detach(), memory, keep) for w in readings]
    sizes = {"d_model": x.size(-1)}
    forms = [form for w, v in zip(readings, views) for form in layer_norm_forms(w, v)]
    return latest_departure(steps, views, filename, sizes, [("the input x", x.detach())], forms, ends=True)


def norm_forms(norm: Callable[[Tensor], Tensor], label: str, own: str, views: list[View]) -> list[Form]:
    """A norm applied to another of the reference's sub-steps than its own input `own`: a norm on
    the wrong branch (the sublayer's output normed before the residual sum, the input normed alone)."""
    return [(text(f"{label} applied to {what}; the reference applies it to {own}",
                  f"{view_zh(label)}作用在了 {view_zh(what)} 上；参考把它用在 {view_zh(own)} 上"), norm(t))
            for what, t in views if t.shape == views[0][1].shape]  # its own input's: the reference's step


def layer_norm_forms(w: V.LayerWeights, views: list[View]) -> list[Form]:
    """Each of the layer's norms (one a sublayer) applied to each of its sub-steps but its own input:
    pre-norm's the residual stream before the sublayer, post-norm's the residual sum after it, a
    reordered one's (OLMo 2's) the sublayer's output."""
    forms, stream = [], "the input x"
    for name, n in zip(w.sublayers, w.norms):
        total = f"x + {LABELS[name]} (the residual sum)"
        own, after = {"pre": (stream, total), "parallel": (stream, stream),
                      "post": (total, f"the norm after the {LABELS[name]}"),
                      "reordered": (f"the {LABELS[name]}'s output", total)}[w.placement]
        label = f"the norm {SIDES.get(w.placement, 'before')} the {LABELS[name]}"
        forms += norm_forms(lambda t, n=n: V.norm(n, t), label, own, views)
        stream = after
    return forms


def localize_add_norm(call: Callable[[Tensor, Tensor], Any], module: nn.Module, w: V.NormWeights, x: Tensor,
                      y: Tensor) -> Departure | None:
    """Run d2l's AddNorm (`call(X, Y)`) traced on its forward and its norm: the first step that is
    not X, Y, their sum or its norm; a norm of X or of Y alone named as such."""
    filename, code = _source(module)
    x, y = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    steps = trace_steps(lambda: call(x, y), filename, code, _all_parts(module))
    x, y = x.detach(), y.detach()
    views = [("the input X", x), ("Y, the sublayer's output", y), ("X + Y (the residual sum)", x + y)]
    forms = norm_forms(lambda t: V.norm(w, t), "the norm", "X + Y (the residual sum)", views[:2])
    views.append(("the norm of X + Y", V.norm(w, x + y)))
    return first_departure(steps, views, filename, {"d_model": x.size(-1)}, forms=forms)


# a layout -> its quarter turn within the pairs (named as the tutorials name it) and each dimension's
# angle (T, Dh) from the pairs' (T, Dh/2); RoFormer's turn: stack([-x[..., 1::2], x[..., ::2]], -1)
TURNS = {"half": ("rotate_half", rotate_half, lambda a: torch.cat([a, a], -1)),
         "interleaved": ("rotate_every_two", rotate_every_two, lambda a: a.repeat_interleave(2, -1))}
# the tables an interleaved rotation's code builds on the way, from the pairs' angles (T, Dh/2)
TABLE_VIEWS = {"interleaved": lambda a: [
    ("cos, each angle twice in a row", a.repeat_interleave(2, -1).cos()),
    ("sin, each angle twice in a row", a.repeat_interleave(2, -1).sin()),
    ("the table: the sines, then the cosines", torch.cat([a.sin(), a.cos()], -1))]}


def _turn_views(name: str, t: Tensor, angles: Tensor, layout: str) -> list[View]:
    """A rotation's sub-steps on t (B, H, T, Dh) at the pairs' angles (T, Dh/2): t turned a quarter
    within its pairs, t·cos and that turn·sin (none for a layout of no such steps)."""
    turn, turned, spread = TURNS.get(layout, ("", None, None))
    return [(f"{turn}({name})", turned(t)), (f"{name}·cos", t * spread(angles).cos()),
            (f"{turn}({name})·sin", turned(t) * spread(angles).sin())] if turned else []


def rotation_views(q: Tensor, k: Tensor, layout: str) -> list[View]:
    """The rotation's sub-steps on queries and keys (B, H, T, Dh) at positions 0 .. T-1: each
    input, its quarter turn within the pairs (rotate_half, rotate_every_two), it times cos, that turn
    times sin, and it rotated; each also in Meta's layout (B, T, H, Dh); then the tables an interleaved
    rotation builds (T, Dh)."""
    T, Dh = q.shape[-2:]
    angles = V.rope_angles(T, Dh)  # (T, Dh/2)
    views = []
    for name, t in (("q", q), ("k", k)):
        views.append((name, t))
        views += _turn_views(name, t, angles, layout)
        views.append((f"{name} rotated ({layout} pairs)", V.rotary(t, layout)))
    tables = TABLE_VIEWS.get(layout, lambda a: [])(angles)  # (T, Dh) each
    return views + [(f"{name} (B, T, H, Dh)", t.transpose(1, 2)) for name, t in views] + tables


def localize_rotation(run: Callable[[Tensor, Tensor], Any], fn: Any, q: Tensor, k: Tensor, layout: str,
                      ) -> Departure | None:
    """Run the learner's apply function (`run(q, k)`) traced on queries and keys that carry a
    gradient, and find where it parts from the rotation in this layout."""
    filename = inspect.getsourcefile(inspect.unwrap(fn))  # the learner's, not a renaming wrapper's
    if not filename:
        return None
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    # interleaved: the tables its code builds from the one handed are steps too (RoFormer's sin_pos)
    steps = trace_steps(lambda: run(q, k), filename, constants=layout == "interleaved")
    sizes = {"d_k": q.size(-1), "T": q.size(-2)}
    views = rotation_views(q.detach(), k.detach(), layout)
    ends = [(name, t) for name, t in views if " rotated " in name]
    return first_departure(steps, views, filename, sizes, ends=ends)


# --- d2l's masked softmax -------------------------------------------------------------------------

def localize_masked_softmax(call: Callable[[Tensor], Any], fn: Any, scores: Tensor, keep: Tensor,
                            ) -> Departure | None:
    """Run the learner's masked softmax (`call(scores)`, the mask bound) traced on scores (B, T, S)
    and keep (B, 1 or T, S); the first step that is not the keep mask, the scores, the masked scores
    (-inf where hidden) or the softmax over the keys."""
    filename, scores = inspect.getsourcefile(fn), scores.double()
    x = scores.float().requires_grad_()
    hidden = scores.masked_fill(~keep, float("-inf"))  # (B, T, S)
    views = [("the keep mask (1 = visible)", keep.expand_as(scores).double()), ("the scores X", scores),
             ("the masked scores", hidden), ("the attention weights", torch.softmax(hidden, dim=-1))]
    # x * 1: not a leaf, their code may write into it in place; the masks it builds are steps too
    steps = trace_steps(lambda: call(x * 1), filename, constants=(torch.bool,))
    return first_departure(steps, views, filename, {"S": scores.size(-1)}, pre=hidden)


# --- scaled dot-product attention ----------------------------------------------------------------

def localize_sdpa(call: Callable[[Tensor, Tensor, Tensor], Any], fn: Any, q: Tensor, k: Tensor, v: Tensor,
                  keep: Tensor) -> Departure | None:
    """Run the learner's attention function (`call(q, k, v)`, the mask bound) traced on q (1, H, T,
    Dh), k and v (1, H, S, Dh) with H, T, S and Dh apart; the first step that is not q·kᵀ,
    the scaled scores, the masked scores, the weights or weights·v."""
    filename = inspect.getsourcefile(fn)
    raw = q @ k.transpose(-2, -1)  # (1, 1, T, S)
    scaled = raw / math.sqrt(q.size(-1))
    hidden = scaled.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(hidden, dim=-1)
    views = [("q·kᵀ", raw), ("the scores q·kᵀ/sqrt(d_k), before the mask", scaled),
             ("the scores q·kᵀ/sqrt(d_k)", hidden), ("the attention weights", weights),
             ("weights·v", weights @ v)]
    traced = q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_()
    steps = trace_steps(lambda: call(*traced), filename)
    sizes = {"d_k": q.size(-1), "T": q.size(-2), "S": k.size(-2), "H": q.size(1)}
    return first_departure(steps, views, filename, sizes, pre=scaled)


# --- a filter of probabilities (top-k, top-p) ---------------------------------------------------------

def localize_filter(call: Callable[[Tensor], Any], fn: Any, logits: Tensor, keep: Tensor) -> Departure | None:
    """Run the learner's filter (`call(logits)`, which hands it softmax(logits) and its setting)
    traced; the first step that is neither the kept probabilities (the others 0) nor those
    renormalized over each row."""
    filename = inspect.getsourcefile(fn)
    x = logits.float().requires_grad_()
    given = torch.where(keep, torch.softmax(logits.double(), -1), 0.0)  # (rows, V)
    views = [("the kept probabilities (the others 0)", given),
             ("the kept probabilities renormalized over each row", given / given.sum(-1, keepdim=True))]
    steps = trace_steps(lambda: call(x), filename)
    return first_departure(steps, views, filename, {"V": logits.size(-1)}, pre=given)


# --- the causal mask ------------------------------------------------------------------------------

def causal_views(T: int) -> list[View]:
    """The causal mask's sub-steps in the forms learners write it: the positions, a square of ones,
    the visible (s <= t) or the hidden (s > t) keys as 1 or True, the additive 0 / -inf mask."""
    pos = torch.arange(T, dtype=torch.float64)
    keep = V.causal_keep(T).double()  # (T, T): 1 where query t may see key s
    return [("the positions 0 .. T-1", pos), ("the positions 0 .. T-1", pos[:, None]),
            ("the positions 0 .. T-1", pos[None]), ("a (T, T) square of ones", torch.ones(T, T)),
            ("the causal mask (1 where key s <= query t)", keep),
            ("the future keys (1 where key s > query t)", 1 - keep),
            ("the additive causal mask (0 where key s <= query t, -inf after)", (1 - keep) * -math.inf)]


def localize_causal_mask(fn: Any, args: list[Any], T: int) -> Departure | None:
    """Run the learner's causal mask function for length T (called with `args`) traced, each tensor
    it makes a step: the first step that is none of the mask's sub-steps."""
    filename = inspect.getsourcefile(fn)
    steps = trace_steps(lambda: fn(*args), filename, every=True)
    return first_departure(steps, causal_views(T), filename, {"T": T})


# --- the sinusoidal table -------------------------------------------------------------------------

def table_views(L: int, D: int) -> list[View]:
    """The sinusoidal table's sub-steps for positions 0 .. L-1: the positions (a column and a row),
    the even indices, the frequencies and their inverse, the angles, their sines and cosines, the
    table (L, D) and with a batch or a middle axis of 1; then those of the other layouts of
    PE_LAYOUTS (tensor2tensor's halves), so that a table right in its own layout departs nowhere."""
    pos = torch.arange(L, dtype=torch.float64)
    even = torch.arange(0, D, 2, dtype=torch.float64)  # (D/2,)
    freq = torch.exp(even * (-math.log(10000.0) / D))  # (D/2,)
    angles = pos[:, None] * freq  # (L, D/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (L, D): sin, cos interleaved
    return [("the positions 0 .. L-1", pos[:, None]), ("the positions 0 .. L-1", pos),
            ("the even indices 2i", even), ("the exponents -2i·ln(10000)/d_model", freq.log()),
            ("the frequencies 1/10000^(2i/d_model)", freq), ("10000^(2i/d_model)", 1 / freq),
            ("the angles pos·freq", angles), ("sin(angles)", angles.sin()), ("cos(angles)", angles.cos()),
            ("the table PE", table), ("the table PE (1, L, D)", table[None]),
            ("the table PE (L, 1, D)", table[:, None])] + sum((_layout_views(L, D, layout)
                                                               for layout in ("halves", "t2t")), [])


def _layout_views(L: int, D: int, layout: str) -> list[View]:
    """A [sin | cos] layout's frequencies, angles and table."""
    steps = V.PE_LAYOUTS[layout][1](D)
    freq = torch.exp(torch.arange(D // 2, dtype=torch.float64) * (-math.log(10000.0) / steps))  # (D/2,)
    angles = torch.arange(L, dtype=torch.float64)[:, None] * freq  # (L, D/2)
    table = V.sinusoidal(L, D, layout=layout)  # (L, D)
    return [(f"the frequencies ({layout})", freq), (f"the exponents ({layout})", freq.log()),
            (f"the angles ({layout})", angles), (f"sin(angles) ({layout})", angles.sin()),
            (f"cos(angles) ({layout})", angles.cos()), (f"the table PE ({layout})", table),
            (f"the table PE ({layout}, 1, L, D)", table[None])]


def localize_table(build: Callable[[], Any], owner: Any, D: int) -> Departure | None:
    """Build the learner's positional encoding once more (`owner`: its class, or the function that
    makes the table), traced with the constants it makes (positions in whole numbers too): the first
    that is none of the table's sub-steps, at the length it builds (its longest axis)."""
    filename = inspect.getsourcefile(owner)
    steps = trace_steps(build, filename, constants=NUMBERS)
    if not steps:
        return None
    L = max(max(s.value.shape, default=0) for s in steps)
    return first_departure(steps, table_views(L, D), filename, {"d_model": D, "L": L})


# --- a model, part by part ------------------------------------------------------------------------

def module_views(run: Callable[[], Any], module: nn.Module, words: dict[str, str], inputs: bool = False,
                 ) -> list[View]:
    """The output of each of the module's parts while `run()` runs it, in the order they run, named
    by `words` (a part's path -> its role), else by the path; and what each is given, with `inputs`
    (a block's input: the token embedding plus the positions)."""
    out: list[View] = []

    def hook(name: str) -> Callable[..., None]:
        def record(part: nn.Module, args: Any, value: Any = None) -> None:
            t = first_tensor(given(value, args))
            what = words.get(name, f"{name}(...)") if value is not None else f"the input of {name}"
            out.extend([(what, t.detach().double())] * (t is not None))
        return record

    parts = list(module.named_modules())[1:]  # the module itself ("") first
    handles = [m.register_forward_hook(hook(name)) for name, m in parts]
    handles += [m.register_forward_pre_hook(hook(name)) for name, m in parts] * inputs
    with hooked(handles), torch.no_grad():
        run()
    return out


def made_at(run: Callable[[], Any], module: nn.Module, value: Tensor) -> tuple[int, str] | None:
    """The line of the module's own code (its class's methods) that first made `value`, what `run()`
    returns from it (a model's logits): where the head is applied to the stream. None where no line of
    that code made it (a helper class of theirs made it: its calling line is the part's step)."""
    cls = type(module)
    filename = inspect.getsourcefile(cls)
    code = method_codes(cls)
    steps = trace_steps(run, filename, code, traced_parts(module))
    flat = value.detach().double().reshape(-1)  # (N,): the logits however the caller shaped them
    step = next((s for s in steps if not s.given and s.value.numel() == flat.numel()
                 and same(s.value.reshape(-1), flat)), None)
    return step and (step.line, statement(filename, step.line))


def localize_model(run: Callable[[], Any], module: nn.Module, readings: list[list[View]], depth: int = 4,
                   filename: str | None = None, constants: tuple[torch.dtype, ...] = (),
                   graded_part: bool = False) -> Departure | None:
    """Run the learner's model (`run()`) traced on its own methods and its parts' outputs (and the
    `constants` of those dtypes it makes: its positions); the first step that no reading (the
    reference model's parts, each set of choices) explains. Where that is a part's output, the part is
    run again on what it was given, traced so in the model's file, down `depth` parts (a wrapper's
    embedding, an MLP that passes its own check with its branches read the other way): the innermost
    step that departs. A part check grades on its own (`graded_part`) is gone into only where a step
    of it agrees first: one whose first step departs is applied where it should not be (a final norm
    inside the loop), and that line is the outer one."""
    cls = type(module)
    filename = filename or inspect.getsourcefile(cls)
    code = method_codes(cls)
    steps = trace_steps(run, filename, code, traced_parts(module), constants)
    steps[:] = [s for s in steps if s.value.flatten().diff().ne(0).any()]  # not one value (a mask of ones)
    D = next(t for _, t in readings[0] if t.dim() >= 3).size(-1)  # (B, T, D): not the positions (T,)
    found = latest_departure(steps, readings, filename, {"d_model": D})
    first = next((s.line for s in steps if not s.given), None)  # the first line of theirs that made a value
    if graded_part and getattr(found, "line", None) == first:
        return None
    if found is None or found.part is None or not depth:
        return found
    part, args, kwargs = found.part
    inner = quietly(lambda: localize_model(lambda: part(*args, **kwargs), part, readings, depth - 1,
                                           filename, constants, graded(part)))
    return inner if inner and inner.line else found  # line 0: a step in torch's part alone (nn.Sequential)


def top_p_views(logits: Tensor, p: float) -> list[View]:
    """Top-p's sub-steps on logits (rows, V): the probabilities, sorted largest first with their
    logits, the cumulative sums, the mass above each token, the tokens removed (the most likely always
    kept), the sorted logits filtered, and the filtered logits in the vocabulary's order."""
    probs = torch.softmax(logits, -1)  # (rows, V)
    ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (rows, V)
    sorted_probs = torch.softmax(ranked, -1)
    cum = sorted_probs.cumsum(-1)
    removed = cum - sorted_probs >= p
    removed[..., 0] = False
    filtered = ranked.masked_fill(removed, float("-inf"))
    unsorted = torch.full_like(logits, float("-inf")).scatter(-1, order, filtered)
    return [("the probabilities", probs), ("the logits sorted, largest first", ranked),
            ("the sorted probabilities", sorted_probs), ("the cumulative probabilities", cum),
            ("the mass above each token", cum - sorted_probs),
            ("cumulative > p (before the shift)", (cum > p).double()),
            ("the tokens removed (1 = removed)", removed.double()), ("the sorted logits filtered", filtered),
            ("the filtered logits", unsorted), ("the filtered probabilities", unsorted.softmax(-1))]


def _ascending_top_p(logits: Tensor, p: float) -> list[View]:
    """Top-p's sub-steps sorted least likely first (Hugging Face's TopPLogitsWarper): the sorted
    logits, the cumulative probabilities from the low end, the tail whose mass is at most 1 - p, and it
    with the most likely token kept."""
    ranked = torch.sort(logits, dim=-1, stable=True)[0]  # (rows, V) ascending
    cum = torch.softmax(ranked, -1).cumsum(-1)
    tail = cum <= 1 - p
    kept_top = tail.clone()
    kept_top[..., -1] = False
    return [("the logits sorted, least likely first", ranked),
            ("the cumulative probabilities from the least likely", cum),
            ("cumulative <= 1 - p from the least likely (before the guard)", tail.double()),
            ("the tokens removed, least likely first (1 = removed)", kept_top.double())]


def localize_count(call: Callable[[int], Any], fn: Any, counts: list[tuple[int, int]]) -> Departure | None:
    """Run the learner's top-k (`call(k)`) traced with the numbers it binds, for the first k of
    `counts` ((k asked, tokens kept)) that kept another number of tokens: the first line that binds
    that number (lucidrains' `k = ceil(thres * V)` for `ceil((1 - thres) * V)`); None when none does."""
    right, kept = next(((k, n) for k, n in counts if n != k), (0, 0))
    filename = inspect.getsourcefile(fn)
    steps = trace_steps(lambda: call(right), filename, scalars=True) if right else []
    step = next((s for s in steps if s.value.dim() == 0 and not s.given and float(s.value) == kept), None)
    if step is None:
        return None
    form = text(f"it binds {step.name} = {kept} where k = {right} tokens were asked for",
                f"这里得到 {step.name} = {kept}，而应当保留 {right} 个 token")
    return Departure(step.line, step.name, statement(filename, step.line), form)


def localize_top_p(call: Callable[[Tensor], Any], fn: Any, logits: Tensor, p: float) -> Departure | None:
    """Run the learner's top-p filter (`call(logits)`, which hands it logits or their softmax)
    traced, the masks it builds recorded; the first step that is none of top-p's sub-steps."""
    filename = inspect.getsourcefile(fn)
    x = logits.float().requires_grad_()
    steps = trace_steps(lambda: call(x), filename, constants=(torch.bool,))
    # a code that sorts least likely first (torch.sort's default: Hugging Face's TopPLogitsWarper)
    ascending = "descending=True" not in source_text(fn).replace(" ", "")
    views = top_p_views(logits.double(), p) + (_ascending_top_p(logits.double(), p) if ascending else [])
    return first_departure(steps, views, filename, {"V": logits.size(-1)}, forms=top_p_axes(logits.double()))


def localize_min_p(call: Callable[[Tensor], Any], fn: Any, logits: Tensor, min_p: float) -> Departure | None:
    """Run the learner's min-p filter (`call(logits)`) traced, the masks it builds recorded; the first
    step that is none of min-p's sub-steps: the probabilities, the largest of each row, the threshold
    min_p times it, the tokens removed or kept, the filtered logits."""
    filename = inspect.getsourcefile(fn)
    x = logits.float().requires_grad_()
    probs = torch.softmax(logits.double(), -1)  # (rows, V)
    top = probs.amax(-1, keepdim=True)  # (rows, 1)
    removed = probs < min_p * top
    views = [("the probabilities", probs), ("the largest probability of each row", top),
             ("the threshold min_p × the largest probability", min_p * top),
             ("the tokens removed (1 = removed)", removed.double()), ("the tokens kept", (~removed).double()),
             ("the filtered logits", logits.double().masked_fill(removed, -math.inf))]
    forms = over_axes("the largest probability", "最大概率", lambda d: probs.amax(d, keepdim=True),
                      logits.dim())
    steps = trace_steps(lambda: call(x), filename, constants=(torch.bool,))
    return first_departure(steps, views, filename, {"V": logits.size(-1)}, forms=forms)


def localize_truncation(call: Callable[[Tensor], Any], fn: Any, logits: Tensor, threshold: Tensor,
                        setting: dict[str, float]) -> Departure | None:
    """Run the learner's truncation filter (epsilon, eta, top-a: `call(logits)`) traced; the first step
    that is none of its sub-steps: the probabilities, the entropy and the largest probability of each
    row, the threshold (`threshold`, (rows, 1)), the tokens removed or kept, the filtered logits;
    `setting` its name and value, a factor a difference may be."""
    filename = inspect.getsourcefile(fn)
    x = logits.float().requires_grad_()
    probs = torch.softmax(logits.double(), -1)  # (rows, V)
    entropy = -(probs * probs.log()).sum(-1)  # (rows,)
    removed = probs < threshold
    views = [("the probabilities", probs), ("the log-probabilities", probs.log()),
             ("the entropy of each row (nats)", entropy),
             ("the largest probability of each row", probs.amax(-1, keepdim=True)),
             ("the threshold", threshold), ("the tokens removed (1 = removed)", removed.double()),
             ("the tokens kept", (~removed).double()),
             ("the filtered logits", logits.double().masked_fill(removed, -math.inf))]
    steps = trace_steps(lambda: call(x), filename, constants=(torch.bool,))
    return first_departure(steps, views, filename, {"V": logits.size(-1), **setting})


def localize_typical(call: Callable[[Tensor], Any], fn: Any, logits: Tensor, mass: float) -> Departure | None:
    """Run the learner's typical filter (`call(logits)`) traced; the first step that is none of its
    sub-steps: the log-probabilities, the entropy of each row, each surprisal's distance from it, those
    distances sorted, the probabilities in that order and their running sum, the tokens removed or kept,
    the filtered logits."""
    filename = inspect.getsourcefile(fn)
    x = logits.float().requires_grad_()
    logp = torch.log_softmax(logits.double(), -1)  # (rows, V)
    entropy = -(logp.exp() * logp).sum(-1, keepdim=True)  # (rows, 1)
    distance = (-logp - entropy).abs()
    ranked, order = distance.sort(-1)
    mass_so_far = logp.exp().gather(-1, order).cumsum(-1)
    last = (mass_so_far < mass).sum(-1, keepdim=True).clamp(max=logits.size(-1) - 1)
    removed = distance > ranked.gather(-1, last)
    views = [("the log-probabilities", logp), ("the probabilities", logp.exp()),
             ("the entropy of each row (nats)", entropy),
             ("each surprisal's distance from the entropy", distance), ("the distances sorted", ranked),
             ("the probabilities in that order", logp.exp().gather(-1, order)),
             ("their running sum", mass_so_far), ("the tokens removed (1 = removed)", removed.double()),
             ("the tokens kept", (~removed).double()),
             ("the filtered logits", logits.double().masked_fill(removed, -math.inf))]
    steps = trace_steps(lambda: call(x), filename, constants=(torch.bool,))
    return first_departure(steps, views, filename, {"V": logits.size(-1), "mass": mass})


def top_p_axes(logits: Tensor) -> list[Form]:
    """Top-p's sub-steps along the vocabulary (the sort, the softmax, the running sum) taken along
    another axis of logits (rows, V)."""
    ranked = torch.sort(logits, dim=-1, descending=True, stable=True)[0]  # (rows, V)
    probs = torch.softmax(ranked, -1)
    ops = (("the sort", "排序", lambda d: torch.sort(logits, dim=d, descending=True, stable=True)[0]),
           ("the softmax", "softmax", lambda d: torch.softmax(ranked, d)),
           ("the cumulative sum", "累加和", lambda d: probs.cumsum(d)),
           ("the cumulative sum (the mass above each token)", "累加和（每个 token 之上的概率和）",
            lambda d: probs.cumsum(d) - probs))
    return [form for en, zh, op in ops for form in over_axes(en, zh, op, logits.dim())]


def rope_table_views(L: int, D: int, theta: float) -> list[View]:
    """The rotary table's sub-steps for positions 0 .. L-1 and head size D: the even indices, the
    frequencies theta^(-2j/D), the positions, the angles (L, D/2), their cosines and sines, and both
    repeated to (L, D) as halves ([c, c], Hugging Face's) and as pairs (c0, c0, c1, c1, ...)."""
    even = torch.arange(0, D, 2, dtype=torch.float64)
    freq = 1.0 / theta ** (even / D)  # (D/2,)
    pos = torch.arange(L, dtype=torch.float64)
    angles = torch.outer(pos, freq)  # (L, D/2)
    views = [("the even indices 2j", even), ("the frequencies theta^(-2j/d)", freq),
             ("the positions 0 .. L-1", pos), ("the angles pos·freq", angles)]
    for name, f in (("cos", torch.cos), ("sin", torch.sin)):
        v = f(angles)
        views += [(f"{name}(angles)", v), (f"{name}(angles) as halves", torch.cat([v, v], -1)),
                  (f"{name}(angles) as pairs (each twice)", v.repeat_interleave(2, -1))]
    turns = torch.stack([angles.cos(), angles.sin()], -1)  # (L, D/2, 2): cos + i·sin as (real, imaginary)
    return views + [("cos(angles) + i·sin(angles), the complex table (real, imaginary)", turns)]


def localize_rope_table(call: Callable[[], Any], fn: Any, L: int, D: int, theta: float) -> Departure | None:
    """Run the learner's table function traced with the constants it makes (positions in whole
    numbers too): the first that is none of the table's sub-steps; the halves and the pairs layouts
    each a reading (a table that mixes them departs where it does)."""
    filename = inspect.getsourcefile(fn)
    steps = trace_steps(call, filename, constants=NUMBERS)
    views = rope_table_views(L, D, theta)
    readings = [[v for v in views if layout not in v[0]] for layout in ("as pairs", "as halves")]
    sizes = {"d_head": D, "L": L}
    found = [latest_departure(steps, [r], filename, sizes) for r in readings]  # halves', pairs'
    if None in found or found[0].line == found[1].line:
        return latest_departure(steps, readings, filename, sizes)
    a, b = sorted(found, key=lambda d: d.line)  # each layout explains the step the other departs at
    return replace(a, form=text(
        f"`{a.name}` and `{b.name}` (line {b.line}: {b.code}) are in different layouts, one as halves "
        "[c, c] and one as pairs (c0, c0, c1, c1, ...); the rotation uses one layout for both",
        f"`{a.name}` 和 `{b.name}`（第 {b.line} 行：{b.code}）的排布不同，一个按两半 [c, c]，一个按成对"
        "（c0, c0, c1, c1, ...）；旋转时两者要用同一种排布"))
