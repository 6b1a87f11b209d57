"""Map a learner's parameters to the roles of handformer's (W_Q, W_K, W_V, W_O, the FFN's two or
three matrices, one norm a sublayer), by shape and definition order, and copy them into handformer.

The learner's weights are first set to random values of unit-ish gain (`scramble_`): default inits
(norm weights of 1, biases of 0) would hide mistakes such as a swapped norm.

Shape legend: D d_model, F FFN width.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from handformer.check.core import sizes
from handformer.check.core.defaults import given, then
from handformer.check.core.fingerprint import quietly
from handformer.check.core.position_tables import position_tables
from handformer.check.core.qkv_layouts import FOUND, LAYOUTS, STATED, ffn_ups, fused_before_output, kv_width
from handformer.check.core.sizes import H, is_number
from handformer.check.core.stacked import described, multiplied_whole, multiplies, stacked_names, stacked_part
from handformer.check.reference import variants as V


class MappingError(ValueError):
    """The learner's parameters do not fit the component; the message says what was found (`zh`:
    in Chinese)."""

    def __init__(self, message: str, zh: str = "") -> None:
        super().__init__(message)
        self.zh = zh


@dataclass
class Leaf:
    """One of the learner's parameterised submodules: a linear layer, a norm or an embedding."""

    name: str  # dotted path inside the learner's module, e.g. "self_attention.w_q"
    kind: str  # linear | norm | embedding | scalar | gain (a per-channel gain on an output, gains.py)
    module: nn.Module
    weight: nn.Parameter
    bias: nn.Parameter | None
    parts: list[nn.Parameter] | None = None  # heads kept as a list of single heads: one per head

    def tensors(self) -> list[nn.Parameter]:
        """The weights that hold it: one per head for heads kept one by one, else its weight."""
        return self.parts or [self.weight]


@dataclass
class Slot:
    """A role in handformer's component filled by (part of) one learner leaf."""

    role: str  # "W_Q", "FFN W_1", "norm 1", ...
    leaf: Leaf
    rows: slice | Tensor | None = None  # the part of a fused projection (e.g. one third of a qkv Linear)
    part: str = ""  # rows that are not one slice, in words (each head's first Dh rows of its q | k | v)

    def weight(self) -> Tensor:
        return self._part(self.leaf.weight)

    def bias(self) -> Tensor | None:
        return self._part(self.leaf.bias)

    def _part(self, t: Tensor | None) -> Tensor | None:
        """The slot's rows of the leaf's weight or bias (all of it for a whole leaf; no bias: None)."""
        return t if t is None or self.rows is None else t[self.rows]

    def linear(self) -> V.Linear:
        return self.weight(), self.bias()

    def describe(self) -> str:
        part = "" if self.rows is None else f"[{self.rows.start}:{self.rows.stop}]" if isinstance(
            self.rows, slice) else f"[{self.part}]"
        stored = ".T" * parametrize.is_parametrized(self.leaf.module)  # Conv1D's (in, out), read transposed
        path, _, name = self.leaf.name.rpartition(".")
        stack = stacked_part(self.leaf.module, name, self.rows)  # qkv_w[0]: one matrix of a stack
        return f"{path}.{stack}".lstrip(".") + f" -> {self.role}" if stack else \
            f"{self.leaf.name}{stored}{part} -> {self.role}"



@dataclass
class RouterSlot(Slot):
    """A mixture of experts' router, last in its FFN's slots (after each expert's), with the routing
    its output showed (check/core/moe.py)."""

    n_experts: int = 0
    top_k: int = 0
    normalize: bool = True
    n_shared: int = 0  # shared experts (DeepSeek's), their slots after the routed experts'
    shared_gate: Leaf | None = None  # a Linear(D, 1) whose sigmoid scales the shared expert (Qwen2-MoE's)

    def describe(self) -> str:
        gate = self.shared_gate
        return super().describe() + ("" if gate is None else f", {gate.name} -> shared expert's gate")


BIAS_NAME = re.compile(r"b.*|shift|offset")  # bias, beta, b_2, ...


def _norm_parameters(params: dict[str, nn.Parameter]) -> tuple[nn.Parameter, nn.Parameter | None]:
    """A norm's gain and its additive parameter (bias, beta, shift, b_2, ...; else the second one); a
    norm of one parameter: its gain alone."""
    gain, *bias = sorted(params, key=lambda name: bool(BIAS_NAME.fullmatch(name.lower())))  # bias last
    return params[gain], params[bias[0]] if bias else None


# a projection's name (q_proj, W_query, key, ...) less proj and w_ -> its role
ROLE_WORDS = {"query": "q", "q": "q", "wq": "q", "key": "k", "k": "k", "wk": "k", "value": "v", "v": "v",
              "wv": "v"}


def _role(name: str) -> str | None:
    """q, k or v from a projection's name (q_proj, W_query, key, ...); None for any other name."""
    return ROLE_WORDS.get(name.lower().replace("_proj", "").replace("proj", "").removeprefix("w_").strip("_"))


def of_kind(found: list[Leaf], kind: str) -> list[Leaf]:
    """The leaves of one kind ("linear", "norm", "embedding"), in definition order."""
    return [leaf for leaf in found if leaf.kind == kind]


def outside_ffn(linears: list[Leaf]) -> list[Leaf]:
    """The linears but an FFN's up projections (qkv_layouts.ffn_ups: followed by their down projection)."""
    ups = ffn_ups([tuple(leaf.weight.shape) for leaf in linears])
    return [leaf for i, leaf in enumerate(linears) if i not in ups]


def with_shape(found: list[Leaf], shape: tuple[int, ...]) -> list[Leaf]:
    """The leaves whose weight has this shape, in definition order."""
    return [leaf for leaf in found if tuple(leaf.weight.shape) == shape]


# a layer's FFN by the attribute that holds it (self.mlp, self.ffn, self.feed_forward, happy-llm's self.fnn)
FFN_PATH = re.compile(r"(^|\.)(mlp|ffn|fnn|ff|feed_?forward|pos_ffn)\w*\.", re.I)


def square_ffn(linears: list[Leaf], D: int) -> list[Leaf]:
    """The (D, D) linears inside the layer's FFN (happy-llm's MLP(args.dim, args.dim, ...): an FFN as
    wide as the model): no attention's projections."""
    return with_shape([leaf for leaf in linears if FFN_PATH.search(leaf.name)], (D, D))


def in_call_order(module: nn.Module, linears: list[Leaf]) -> list[Leaf]:
    """The linears with those inside the FFN in the order their calls end in their owner's forward: the
    down projection last, whichever line holds it (`self.w2(F.silu(self.w1(x)) * self.w3(x))`, Meta's, or
    `h = ...` then `return self.w2(h)`), where each is called there; as they are otherwise (an FFN as
    wide as the model has only the calls to tell its down projection: square_ffn)."""
    inside = [leaf for leaf in linears if FFN_PATH.search(leaf.name)]
    ends = {id(leaf): _call_end(module, leaf) for leaf in inside}
    ordered = sorted(inside, key=lambda leaf: ends[id(leaf)]) if None not in ends.values() else inside
    by_place = dict(zip(map(id, inside), ordered))
    return [by_place.get(id(leaf), leaf) for leaf in linears]


def _call_end(module: nn.Module, leaf: Leaf) -> tuple[int, int] | None:
    """Where the last call `self.<its name>(...)` of its owner's forward ends (line, column); None: none.
    (The attribute `self.<name>` itself ends inside its call, so the call's end is the largest.)"""
    owner, _, attr = leaf.name.rpartition(".")
    forward = getattr(type(quietly(lambda: module.get_submodule(owner))), "forward", None)
    empty = ast.Module([], [])  # no source: no call
    tree = quietly(lambda: ast.parse(textwrap.dedent(inspect.getsource(forward))), otherwise=empty)
    ends = [(node.end_lineno, node.end_col_offset) for node in ast.walk(tree)
            if ast.unparse(getattr(node, "func", node)) == f"self.{attr}"]
    return max(ends, default=None)


def single_heads(label: str, sub: nn.Module) -> list[Leaf] | None:
    """Heads kept as an nn.ModuleList of single-head modules (Karpathy's `Head(head_size)`, each with
    its own key, query and value nn.Linear(n_embd, head_size)): three leaves, W_Q, W_K and W_V, each
    the heads' weights stacked in head order (what one (d_model, d_model) projection split into heads
    holds), named by their roles; None for any other module."""
    heads = list(sub.children()) if isinstance(sub, nn.ModuleList) else []
    if len(set(map(type, heads))) != 1:  # none, or heads of two classes
        return None
    per = [[(n, m) for n, m in h.named_children() if isinstance(m, nn.Linear)] for h in heads]
    if any(len(p) != 3 or len(list(h.parameters())) != sum(len(list(m.parameters())) for _, m in p)
           for p, h in zip(per, heads)):
        return None
    by_role = {_role(n): n for n, _ in per[0]}  # three names of three roles (the roles never overlap)
    if by_role.keys() != set("qkv"):
        return None
    out = []
    for r in "qkv":
        mods = [dict(p)[by_role[r]] for p in per]
        weight = torch.cat([m.weight for m in mods]).detach()  # (H * Dh, D)
        bias = torch.cat([m.bias for m in mods]).detach() if mods[0].bias is not None else None
        out.append(Leaf(f"{label}[*].{by_role[r]}", "linear", sub, weight, bias, [m.weight for m in mods]))
    return out


def _one_matrix(params: dict[str, nn.Parameter]) -> bool:
    """One 2-D parameter and at most one 1-D one: a linear layer however it is named (a weight and
    bias of a module of the learner's own, nn.MultiheadAttention's packed in_proj_weight (3D, D) and
    in_proj_bias: its Q, K, V projections fused, as a qkv nn.Linear(D, 3D) is)."""
    dims = sorted(p.dim() for p in params.values())
    return dims in ([2], [1, 2])


def _unknown(label: str, sub: nn.Module, params: dict[str, nn.Parameter]) -> MappingError:
    """What a module of parameters handformer does not map is, said from its form (stacked.described:
    a convolution, stacked experts, stacked projections, per-channel vectors)."""
    shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in params.items())
    held, held_zh = f"{label} ({type(sub).__name__}: {shapes})", f"{label}（{type(sub).__name__}：{shapes}）"
    en, zh = given(described(sub, params), (None, None))
    return MappingError((f"{held} is {en}" if en else f"cannot tell what {held} is")
                        + "; handformer maps nn.Linear layers, norms (1-D weight and bias) and embeddings",
                        zh=(f"{held_zh}是{zh}" if zh else f"看不出 {held_zh} 是什么")
                        + "；handformer 能对应的是 nn.Linear 层、归一化（一维的 weight 和 bias）和嵌入")


def _looks_up(sub: nn.Module, params: dict[str, nn.Parameter]) -> bool:
    """A module of the learner's own with one matrix whose forward picks its rows by token id
    (DeepSeek's ParallelEmbedding: F.embedding on its weight): an embedding."""
    if list(map(torch.Tensor.dim, params.values())) != [2]:
        return False
    (weight,) = params.values()
    return bool(quietly(lambda: torch.equal(sub(torch.tensor([[1, 0]]))[0], weight[[1, 0]])))


def _matrix_and_vector(params: dict[str, nn.Parameter]) -> tuple[nn.Parameter, nn.Parameter | None]:
    by_dim = {p.dim(): p for p in params.values()}
    return by_dim[2], by_dim.get(1)


class Transposed(nn.Module):
    """The parametrization of a weight stored (in, out), as Hugging Face's Conv1D keeps GPT-2's
    (`x @ weight + bias`): the parameter is held (out, in), as nn.Linear's, and handed over transposed."""

    def forward(self, weight: Tensor) -> Tensor:
        return weight.t()

    def right_inverse(self, weight: Tensor) -> Tensor:
        return weight.t()


@torch.no_grad()
def _stored_transposed(sub: nn.Module) -> str | None:
    """The name of the weight of a linear layer of the learner's own that computes x @ weight + bias
    (the weight (in, out), Conv1D's), found by what it does on a random input; None for any other (a
    layer already reparametrized has no 2-D parameter of its own left), and for a weight that reads the
    same either way (modded-nanogpt's CastedLinear, zero-initialized: nn.Linear's reading)."""
    params = dict(sub.named_parameters(recurse=False))
    if not _one_matrix(params):
        return None
    w, b = _matrix_and_vector(params)
    x = torch.randn(2, w.size(0), generator=torch.Generator().manual_seed(0), dtype=w.dtype)
    # (2, out) against x @ w + b; None where their forward takes another layout
    same = quietly(lambda: torch.allclose(sub(x), F.linear(x, w.t(), b), atol=1e-5))
    return max(params, key=lambda n: params[n].dim()) if same and not torch.equal(w, w.t()) else None


def untranspose_(module: nn.Module) -> list[str]:
    """Each linear layer of the learner's own that stores its weight (in, out) reparametrized so that
    its parameter is (out, in), as nn.Linear's (the layer computes what it did), and each loose matrix
    its forward multiplies from the right (`x @ self.W_query`, Raschka's SelfAttention_v1); their
    names."""
    found = []
    for name, sub in list(module.named_modules()):
        for weight in filter(None, [_stored_transposed(sub), *_right_multiplied(sub)]):
            parametrize.register_parametrization(sub, weight, Transposed(), unsafe=True)
            found.append(name)
    return found


def loose_matrices(params: dict[str, nn.Parameter], sub: nn.Module) -> bool:
    """Two or more 2-D parameters and nothing else, in a module with no layers of its own: each a
    projection (Raschka's SelfAttention_v1: W_query, W_key, W_value as nn.Parameter(torch.rand(d_in,
    d_out)))."""
    alone = set(dict(sub.named_children())) <= {"parametrizations"}  # its own, reparametrized
    return len(params) >= 2 and {p.dim() for p in params.values()} == {2} and alone


def _right_multiplied(sub: nn.Module) -> list[str]:
    """The loose matrices (`loose_matrices`) its forward's source multiplies from the right, x @
    self.W: stored (in, out)."""
    params = dict(sub.named_parameters(recurse=False))
    if not loose_matrices(params, sub):
        return []
    source = quietly(lambda: inspect.getsource(type(sub).forward)) or ""
    return [n for n in params if re.search(rf"@\s*self\.{re.escape(n)}\b(?!\s*\.\s*T\b)", source)]


def _own_parameters(sub: nn.Module) -> dict[str, nn.Parameter]:
    """A module's own parameters, a reparametrized weight by its (out, in) original."""
    changed = getattr(sub, "parametrizations", {})
    return dict(sub.named_parameters(recurse=False)) | {n: held.original for n, held in changed.items()}


def _holds_layers(sub: nn.Module) -> bool:
    """Whether a module holds parameterised parts of its own: then its loose scalars and vectors
    (per-layer residual scales, gates) are not a norm's gain and bias."""
    return len(list(sub.parameters())) > len(list(sub.parameters(recurse=False)))


class Gainless(Leaf):
    """A norm the learner computes with no parameters (nanochat's norm(x) = F.rms_norm(x, (x.size(-1),)),
    OLMo's non-parametric LayerNorm module): a gain of ones (and a bias of zeros) stands for it; it has
    no gradient of its own in the learner's graph, and nothing of it is scrambled."""


def _parameterless_norm(label: str, sub: nn.Module, params: dict[str, nn.Parameter]) -> list[Gainless]:
    """A norm module with no parameters, named as a norm, that keeps its width as nn.LayerNorm does
    (OLMo's LayerNorm: (x - mean) / sqrt(var + eps), self.normalized_shape = (d_model,)): itself with a
    gain of ones, and a bias of zeros unless it is an RMSNorm; none for any other module."""
    name, shape = type(sub).__name__.lower(), getattr(sub, "normalized_shape", ())
    if params or "norm" not in name or not isinstance(shape, (tuple, list)) or len(shape) != 1:
        return []
    gain = nn.Parameter(torch.ones(shape[0], dtype=torch.float64))
    bias = None if "rms" in name else nn.Parameter(torch.zeros_like(gain))
    return [Gainless(f"{label} (no weight)", "norm", sub, gain, bias)]


def leaves(module: nn.Module, stack_heads: bool = True) -> list[Leaf]:
    """The learner's linear layers, norms and embeddings in definition order; heads kept as a list of
    single heads are stacked into W_Q, W_K, W_V (`single_heads`) unless `stack_heads` is False."""
    found: list[Leaf] = []
    inside: set[int] = set()
    for name, sub in module.named_modules():
        if id(sub) in inside:
            continue
        label = name or "(self)"
        stacked = single_heads(label, sub) if stack_heads else None
        if stacked:
            found += stacked
            inside |= set(map(id, sub.modules()))
            continue
        params = _own_parameters(sub)
        found += _parameterless_norm(label, sub, params)
        tables = position_tables(sub, params)  # nanoGPT's pos_emb (1, T, D) as a bare nn.Parameter
        found += [Leaf(_dotted(label, n), "embedding", sub, t, None) for n, t in tables.items()]
        params = {n: p for n, p in params.items() if n not in tables}
        if not params or isinstance(sub, parametrize.ParametrizationList):
            continue
        if isinstance(sub, nn.Embedding) or _looks_up(sub, params):
            found.append(Leaf(label, "embedding", sub, _matrix_and_vector(params)[0], None))
        elif names := stacked_names(sub):
            found += _stacked_leaves(label, sub, params, names)
        elif isinstance(sub, nn.Linear) or _one_matrix(params):
            found.append(Leaf(label, "linear", sub, *_matrix_and_vector(params)))
        elif loose_matrices(params, sub):
            found += [Leaf(f"{label}.{n}".removeprefix("(self)."), "linear", sub, p, None)
                      for n, p in params.items()]
        elif all(p.dim() <= 1 for p in params.values()) and _holds_layers(sub):  # nanochat's resid_lambdas
            found += [Leaf(_dotted(label, n), "gain" if multiplied_whole(sub, n) else "scalar", sub, p, None)
                      for n, p in params.items()]
        elif all(p.dim() == 1 for p in params.values()) and len(params) <= 2:
            kind = "gain" if multiplies(sub, params) else "norm"  # timm's LayerScale: x * gamma
            found.append(Leaf(label, kind, sub, *_norm_parameters(params)))
        else:
            raise _unknown(label, sub, params)
    return found


def _dotted(label: str, name: str) -> str:
    return f"{label}.{name}".removeprefix("(self).")


def _stacked_leaves(label: str, sub: nn.Module, params: dict[str, nn.Parameter], names: list[str],
                    ) -> list[Leaf]:
    """A module's stacked projections (stacked.unstack_: each held as one (n * out, in) matrix) as
    linear leaves, the vectors and scalars beside them as scalars (modded-nanogpt's lambdas); a module
    with any other parameter beside them is not mapped."""
    rest = {n: p for n, p in params.items() if n not in names}
    if any(p.dim() > 1 for p in rest.values()):
        raise _unknown(label, sub, params)
    return ([Leaf(_dotted(label, n), "linear", sub, params[n], None) for n in names]
            + [Leaf(_dotted(label, n), "scalar", sub, p, None) for n, p in rest.items()])


SCRAMBLED = {"norm": lambda noise, w: 1.0 + 0.2 * noise, "gain": lambda noise, w: 1.0 + 0.2 * noise,
             "embedding": lambda noise, w: noise,
             "scalar": lambda noise, w: w,  # as built: a residual scale of one, a gate of zero
             "linear": lambda noise, w: noise / math.sqrt(w.size(1))}  # a leaf's random weight, by its kind


@torch.no_grad()
def scramble_(module: nn.Module, seed: int = 0) -> None:
    """Random weights everywhere: linear weights ~ N(0, 1/in), norm weights 1 + N(0, 0.2^2),
    biases N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    for leaf in leaves(module, stack_heads=False):
        w = leaf.weight
        noise = torch.randn(w.shape, generator=g, dtype=torch.float64).to(w.dtype)
        w.copy_(SCRAMBLED[leaf.kind](noise, w))
        if leaf.bias is not None:
            leaf.bias.copy_(0.2 * torch.randn(leaf.bias.shape, generator=g,
                                              dtype=torch.float64).to(leaf.bias.dtype))


def shapes_text(found: list[Leaf]) -> str:
    """Each leaf's name and weight shape ("w_q (32, 32), w_k (32, 32)"); "none" for no leaf."""
    return ", ".join(f"{leaf.name} {tuple(leaf.weight.shape)}" for leaf in found) or "none"


def one_head_width(shapes: list[tuple[int, ...]], D: int) -> int:
    """The width of W_K and W_V read from the weights' shapes where they are narrower than d_model (a
    multi-query attention's k_proj and v_proj of one head, (Dh, D)): two alike, (k, D) with k dividing
    D; D where there are no such two."""
    narrow = tuple(s[0] for s in shapes if s[1] == D and s[0] < D and D % s[0] == 0)
    return {(w, w): w for w in narrow}.get(narrow, D)


def attention_slots(linears: list[Leaf], D: int, count: int, what: str, kv_width: int | None = None,
                    head_dim: int = sizes.D // H) -> list[list[Slot]]:
    """`count` attentions from linears in order W_Q, W_K, W_V, W_O (or a fused qkv projection then
    W_O). W_Q and W_O are (D, D); W_K and W_V (kv_width, D), kv_width < D for grouped-query
    attention. An attention of three projections and no W_O has 3 slots."""
    kv = kv_width or D
    ffn = square_ffn(linears, D)
    square = [leaf for leaf in with_shape(linears, (D, D)) if leaf not in ffn]
    # else multi-query (Falcon's n_head + 2 heads) or grouped: kv read from the shape
    prefixes = PREFIXES[count]
    if apart := keys_values_apart(linears, square, D, prefixes):
        return apart
    fused = with_shape(outside_ffn(linears), (D + 2 * kv, D)) or fused_among(linears, D, head_dim)
    if len(fused) == count:
        outs = square if len(square) == count else [None] * count
        return [fused_slots(p, f, D, head_dim) + ([Slot(f"{p}W_O", o)] if o is not None else [])
                for p, f, o in zip(prefixes, fused, outs)]
    widths = [tuple(x.weight.shape) for x in outside_ffn(linears)]
    kv = kv if kv != D or len(square) != 2 * count else one_head_width(widths, D)
    if kv != D:
        return _grouped_slots(linears, D, kv, count, prefixes, what)
    per = {4 * count: 4, 3 * count: 3}.get(len(square))  # W_O or none
    if not per:
        _queries_alone(linears, D, count, what)
        raise MappingError(
            f"{what}: expected {4 * count} nn.Linear(d_model, d_model) layers ({count} x W_Q, W_K, "
            f"W_V, W_O) with d_model={D}, found {len(square)}; its parameterised layers are: "
            f"{shapes_text(linears)}",
            zh=f"{what}：d_model={D} 时应当有 {4 * count} 个 nn.Linear(d_model, d_model) 层（{count} 组 "
               f"W_Q、W_K、W_V、W_O），实际找到 {len(square)} 个；它带参数的层是：{shapes_text(linears)}")
    groups = [_qkv_by_name(square[i * per:(i + 1) * per]) for i in range(count)]
    return [[Slot(f"{p}W_{r}", leaf) for r, leaf in zip("QKVO", group)]
            for p, group in zip(prefixes, groups)]


def _queries_alone(linears: list[Leaf], D: int, count: int, what: str) -> None:
    """MappingError naming an attention whose projections are W_Q and W_O alone, (D, D) each: its keys
    and values come from outside it (another layer's, as cross-layer KV sharing hands them)."""
    if [tuple(x.weight.shape) for x in linears] == [(D, D)] * 2 * count:
        raise MappingError(
            f"{what}: its projections are a query and an output projection alone ({shapes_text(linears)}): "
            "its keys and values come from outside it (another layer's, as cross-layer KV sharing hands "
            "them), which handformer's attention projects itself",
            zh=f"{what}：它的投影只有 query 投影和输出投影（{shapes_text(linears)}）：它的键和值来自外面"
               "（别的层的，就像跨层共享 KV 那样传进来），而 handformer 的注意力自己投影键和值")


KV_NAME = re.compile(r"(?i)(^|[._])(to_|w_)?kv(_proj)?$")  # lucidrains' to_kv: keys and values, no queries


def keys_values_apart(linears: list[Leaf], square: list[Leaf], D: int, prefixes: list[str],
                      ) -> list[list[Slot]]:
    """Each attention's W_Q, W_K, W_V, W_O where its keys and values are one projection named so,
    (2D, D) as [k | v], beside a query and an output projection (D, D) of their own, in that order
    (lucidrains' to_q, to_kv, to_out); none for any other set of layers."""
    kvs = [leaf for leaf in with_shape(outside_ffn(linears), (2 * D, D)) if KV_NAME.search(leaf.name)]
    if (len(kvs), len(square)) != (len(prefixes), 2 * len(prefixes)):
        return []
    return [[Slot(f"{p}W_Q", q), Slot(f"{p}W_K", kv, slice(0, D)), Slot(f"{p}W_V", kv, slice(D, 2 * D)),
             Slot(f"{p}W_O", o)] for p, q, kv, o in zip(prefixes, square[::2], kvs, square[1::2])]


def fused_among(linears: list[Leaf], D: int, head_dim: int, least: int = 0) -> list[Leaf]:
    """The fused query/key/value projections among these linears: (D + 2 kv, D) outside an FFN, kv
    wider than `least` (a head's width: those whose layouts part)."""
    return [leaf for leaf in outside_ffn(linears) if leaf.weight.shape[1] == D
            and kv_width(leaf.weight.shape[0], D, head_dim) > least and not FFN_PATH.search(f"{leaf.name}.")]


def split_attention_ffn(linears: list[Leaf], D: int, head_dim: int) -> list[Leaf]:
    """The linears with a projection fused across attention and FFN (PaLM's fused_attn_ff_proj: the
    queries, one key and one value head, then the FFN's 2F rows, of the one normed input) split in
    two leaves: its attention rows (D + 2 kv, a fused query/key/value projection) and its gated FFN's
    rows (2F). F is read from the FFN's down projection (D, F); a layer without one is left whole."""
    widths = {leaf.weight.size(1) for leaf in linears if leaf.weight.size(0) == D != leaf.weight.size(1)}
    ffns = sorted(2 * width for width in widths)  # gated: the FFN's up and gate rows
    return [part for leaf in linears for part in _attention_ffn_parts(leaf, D, head_dim, ffns)]


def _attention_ffn_parts(leaf: Leaf, D: int, head_dim: int, ffns: list[int]) -> list[Leaf]:
    """The leaf's attention rows and FFN rows, where its rows are D + 2 kv and then an FFN's (and no
    fused query/key/value projection alone); else the leaf itself."""
    rows = leaf.weight.size(0)
    edges = [rows - ffn for ffn in ffns if kv_width(rows - ffn, D, head_dim)]  # (0 for D rows or fewer)
    if leaf.weight.size(1) != D or kv_width(rows, D, head_dim) or not edges:
        return [leaf]
    return [_rows_of(leaf, 0, edges[0]), _rows_of(leaf, edges[0], rows)]


def _rows_of(leaf: Leaf, start: int, stop: int) -> Leaf:
    """A leaf of the rows start..stop of a linear leaf (views: the learner's parameters themselves)."""
    bias = then(leaf.bias, lambda b: b[start:stop])
    return Leaf(f"{leaf.name}[{start}:{stop}]", leaf.kind, leaf.module, leaf.weight[start:stop], bias)


def fused_slots(prefix: str, leaf: Leaf, D: int, head_dim: int) -> list[Slot]:
    """W_Q, W_K, W_V as rows of the fused leaf, in the layout found for it (blocks: slices)."""
    kv = kv_width(leaf.weight.shape[0], D, head_dim)
    if FOUND.get(leaf.module, "blocks") == "blocks":
        edges = [0, D, D + kv, D + 2 * kv]
        return [Slot(f"{prefix}W_{r}", leaf, slice(a, b)) for r, a, b in zip("QKV", edges, edges[1:])]
    layout = FOUND[leaf.module]
    rows, order = {**LAYOUTS, **STATED}[layout](D, kv, head_dim), GROUP_ORDER.get(layout, "[q | k | v]")
    return [Slot(f"{prefix}W_{r}", leaf, rows[i], f"{r.lower()} of {order}") for i, r in enumerate("QKV")]


# how the report says a layout's rows (blocks: slices, said by their edges)
GROUP_ORDER = {"grouped": "each [q | k | v] group", "grouped_vk": "each [q | v | k] group",
               "blocks_vk": "[q | v | k]"}


PREFIXES = {1: [""], 2: ["self-attention ", "cross-attention "]}  # by the count of attentions


def _qkv_by_name(group: list[Leaf]) -> list[Leaf]:
    """W_Q, W_K, W_V in the order their names say (Raschka's W_key and W_value defined before
    W_query, GPT-J's k_proj, v_proj, q_proj, Peter Bloem's tokeys, toqueries, tovalues), when each of
    the first three names one of them; else in definition order."""
    words = (("q", "quer"), ("k", "key"), ("v", "value"))  # quer: query, queries
    roles = [_role(leaf.name.rsplit(".", 1)[-1])  # GPT-J's k_proj, v_proj, q_proj: the name's role
             or next((r for r, w in words if w in leaf.name.lower()), None) for leaf in group[:3]]
    if set(roles) != {"q", "k", "v"}:
        return group
    return sorted(group[:3], key=lambda leaf: "qkv".index(roles[group.index(leaf)])) + group[3:]


def _grouped_slots(linears: list[Leaf], D: int, kv: int, count: int, prefixes: list[str], what: str,
                   ) -> list[list[Slot]]:
    """Grouped-query attention: (D, D) W_Q and W_O, (kv, D) W_K and W_V, in definition order."""
    square, narrow = with_shape(linears, (D, D)), with_shape(linears, (kv, D))
    _queries_alone(linears, D, count, what)
    if len(narrow) != 2 * count or len(square) not in (count, 2 * count):
        raise MappingError(
            f"{what}: expected W_Q and W_O as nn.Linear(d_model, d_model) and W_K, W_V as "
            f"nn.Linear(d_model, n_kv_heads * head_dim) (d_model={D}, n_kv_heads * head_dim={kv}); "
            f"its parameterised layers are: {shapes_text(linears)}",
            zh=f"{what}：W_Q 和 W_O 应当是 nn.Linear(d_model, d_model)，W_K、W_V 应当是 nn.Linear(d_model, "
               f"n_kv_heads * head_dim)（d_model={D}，n_kv_heads * head_dim={kv}）；它带参数的层是："
               f"{shapes_text(linears)}")
    per = len(square) // count
    return [[Slot(f"{p}W_Q", square[i * per]), Slot(f"{p}W_K", narrow[2 * i]),
             Slot(f"{p}W_V", narrow[2 * i + 1])]
            + ([Slot(f"{p}W_O", square[i * per + 1])] if per == 2 else [])
            for i, p in enumerate(prefixes)]


def mha_weights(slots: list[Slot], n_heads: int, n_kv_heads: int | None = None, rope: str | None = None,
                ) -> V.MHAWeights:
    by = by_role(slots)
    qk = (qk_norm_weights(by["q_norm"]), qk_norm_weights(by["k_norm"])) if "q_norm" in by else None
    n_kv_heads = n_kv_heads or kv_heads_of(slots, n_heads)
    table = by["bias"].weight() if "bias" in by else None  # RELATIVE_ROLE's last word
    return V.MHAWeights(by["W_Q"].linear(), by["W_K"].linear(), by["W_V"].linear(),
                        by["W_O"].linear() if "W_O" in by else None, n_heads, n_kv_heads, rope, qk, table,
                        sinks=by[SINKS_ROLE].weight() if SINKS_ROLE in by else None)


def by_role(slots: list[Slot]) -> dict[str, Slot]:
    """An attention's slots by the last word of their roles ("self-attention W_Q" -> "W_Q", "q_norm",
    RELATIVE_ROLE -> "bias")."""
    return {s.role.split(" ")[-1]: s for s in slots}


RELATIVE_ROLE = "relative position bias"  # T5's nn.Embedding(buckets, H): a learned score bias per head


def relative_bias_slots(extra: list[Leaf], n_heads: int) -> list[Slot]:
    """An attention's parameters besides its projections as T5's relative-position bias: exactly one
    embedding of one value a head for each bucket, (buckets, H); else none."""
    tables = [x for x in extra if x.kind == "embedding" and x.weight.size(-1) == n_heads]
    return [Slot(RELATIVE_ROLE, tables[0])] if len(extra) == 1 == len(tables) else []


RELATIVE_WORDS = re.compile(r"(?i)rel|pos|dist")  # a table's name that speaks of positions


def relative_tables(found: list[Leaf], head_dim: int) -> list[Leaf]:
    """Shaw et al.'s relative-position tables a^K, a^V among an attention's parameters: matrices of
    2k + 1 rows (one a distance j - i clipped to [-k, k]) and head_dim columns, named for positions
    (T5's bias has an even count of buckets, one value a head)."""
    return [x for x in found if x.weight.dim() == 2 and x.weight.size(0) % 2 == 1
            and x.weight.size(1) == head_dim and RELATIVE_WORDS.search(x.name)]


RELATIVE_TABLES = (
    "its attention holds relative-position tables ({}): a row for each distance j - i clipped to [-k, k], "
    "added to the keys (and the values) as Shaw et al.'s a_ij^K and a_ij^V; handformer's MultiHeadAttention "
    "has no such term, so it is not compared",
    "它的注意力里有相对位置表（{}）：每个截断到 [-k, k] 的距离 j - i 一行，按 Shaw 等人的 a_ij^K、a_ij^V "
    "加到键（和值）上；handformer 的 MultiHeadAttention 没有这一项，所以不比较")


# q_norm, k_layernorm, query_ln: a norm of queries or keys
QK_NORM_NAME = re.compile(r"(?i)(q|k|query|key)_?(norm|layernorm|ln)")


def per_head_norms(found: list[Leaf], head_dim: int) -> list[Leaf]:
    """q/k norms that hold a gain for each head, (heads, head_dim) (Command R+'s LayerNorm over
    (num_heads, head_dim))."""
    return [x for x in found if x.weight.dim() == 2 and x.weight.size(1) == head_dim
            and QK_NORM_NAME.fullmatch(x.name.split(".")[-1])]


PER_HEAD_GAINS = (
    "its query and key norms hold a gain for each head ({}), as Command R+'s per-head LayerNorm; "
    "handformer's QK-norm has one gain of head_dim shared by every head (or one as wide as all of them), "
    "so it is not compared",
    "它的 query、key 归一化每个头各有一组增益（{}），和 Command R+ 按头做的 LayerNorm 一样；handformer 的 "
    "QK-norm 所有头共用一组 head_dim 的增益（或者一组和所有头一样宽的），所以不比较")
# the parts of an attention no reference of handformer's holds: how each is found, and what is said
UNREFERENCED = ((relative_tables, RELATIVE_TABLES), (per_head_norms, PER_HEAD_GAINS))


def no_unreferenced_parts(found: list[Leaf], head_dim: int) -> list[Leaf]:
    """An attention's (or its layer's) leaves, where none is a part no reference has (`UNREFERENCED`:
    Shaw et al.'s relative-position tables, per-head q/k norm gains); else MappingError naming them,
    so it is not compared."""
    for find, (en, zh) in UNREFERENCED:
        if parts := find(found, head_dim):
            shown = shapes_text(parts)
            raise MappingError(en.format(shown), zh=zh.format(shown))
    return found


SINKS_ROLE = "sinks"  # gpt-oss's attention sinks: one learned logit a head, joined to each softmax
SINK_NAME = re.compile(r"(attn_|attention_)?sinks?")


def sink_slots(scalars: list[Leaf], n_heads: int) -> list[Slot]:
    """A layer's one parameter of one value a head named as gpt-oss's sinks (self.sinks), else none."""
    sinks = [x for x in scalars
             if x.weight.shape == (n_heads,) and SINK_NAME.fullmatch(x.name.split(".")[-1])]
    return [Slot(SINKS_ROLE, sinks[0])] if len(sinks) == 1 else []


def kv_heads_of(slots: list[Slot], n_heads: int) -> int | None:
    """The key/value heads W_K's rows hold beside W_Q's (a fused multi-query projection: 1); None
    when there are as many as query heads."""
    by = by_role(slots)
    narrow = by["W_K"].weight().size(0) * n_heads // by["W_Q"].weight().size(0)
    return narrow if narrow < n_heads else None


QK_NORM_ROLES = ("q_norm", "k_norm")  # QK-norm: each query and key head normed before RoPE (Qwen3)
_QK_NAMES = {"q_norm": re.compile(r"(q|query)_?(norm|layernorm|ln|rmsnorm)"),
             "k_norm": re.compile(r"(k|key)_?(norm|layernorm|ln|rmsnorm)")}


def qk_norm_slots(extra: list[Leaf], head_dim: int, width: int = 0) -> list[Slot]:
    """An attention's parameters besides its projections as QK-norm: exactly two norms named like
    q_norm and k_norm (q_layernorm, query_norm) of width head_dim, or as wide as all their heads
    together (OLMo-2's: the queries' `width`, the keys' Hkv * head_dim); else none."""
    kinds = {(x.kind, _qk_width(x.weight.numel(), head_dim, width)) for x in extra}  # numel: 0-d gains too
    if len(extra) != 2 or kinds != {("norm", True)}:
        return []
    slots = []
    for role, name in _QK_NAMES.items():
        hits = [x for x in extra if name.fullmatch(x.name.split(".")[-1].lower())]
        if len(hits) != 1:
            return []
        slots.append(Slot(role, hits[0]))
    return slots


def _qk_width(size: int, head_dim: int, width: int) -> bool:
    """A q/k norm's width: one head's, or a whole number of heads up to the queries' width."""
    return size in range(head_dim, max(width, head_dim) + 1, head_dim)


def qk_norm_weights(slot: Slot) -> V.NormWeights:
    """A q_norm or k_norm as it computes: its gain 1 + weight where kept as an offset (Gemma 3's)."""
    return dataclasses.replace(norm_weights(slot), flags=frozenset())


def ffn_slots(linears: list[Leaf], D: int, F: int | None, what: str) -> list[list[Slot]]:
    """The FFN's matrices: (F, D) up then (D, F) down; gated: two (F, D) (gate, up: both orders
    are returned, the runner keeps the one that matches) and (D, F) down. F is read from the shapes
    when None or when no layer has it (nanoGPT's MLP is 4 * n_embd wide whatever d_ff says). An FFN
    without a down projection gets slots without one."""
    fused = fused_before_output([tuple(leaf.weight.shape) for leaf in linears], D, D // H)
    linears = [leaf for i, leaf in enumerate(linears) if i not in fused]  # an attention's, no FFN's
    widths = [F] if F else []
    widths += sorted({leaf.weight.size(0) for leaf in linears if leaf.weight.size(1) == D
                      and leaf.weight.size(0) != D} - set(widths))
    for width in widths:
        ups, downs = with_shape(linears, (width, D)), with_shape(linears, (D, width))
        if len(downs) == 1 and len(ups) in (1, 2):
            return _ffn_orders(ups, downs)
    # gate and up fused in one (2F, D) layer (OLMo's ff_proj, Phi-3's gate_up_proj), then (D, F): twice the
    # width asked for first (a fused q | k | v of that many rows, and W_O, are no FFN)
    for width in [2 * w for w in widths[:1]] + widths:
        fused, downs = with_shape(linears, (width, D)), with_shape(linears, (D, width // 2))
        if len(fused) == 1 and len(downs) == 1 and width % 2 == 0:
            return _fused_orders(fused[0], width // 2, downs[0])
    for width in widths:  # no (D, F) layer at all: an FFN that forgot its down projection
        ups = with_shape(linears, (width, D))
        if len(ups) in (1, 2) and not any(leaf.weight.size(1) == width for leaf in linears):
            return _ffn_orders(ups, [])
    square = square_ffn(linears, D)
    if len(square) in (2, 3):  # an FFN as wide as the model: up (or gate and up), then down
        return _ffn_orders(square[:-1], square[-1:])
    raise MappingError(f"{what}: expected nn.Linear(d_model, d_ff) then nn.Linear(d_ff, d_model) "
                       f"(d_model={D}, d_ff={F}; gated FFNs have two nn.Linear(d_model, d_ff)), "
                       f"found: {shapes_text(linears)}",
                       zh=f"{what}：应当先是 nn.Linear(d_model, d_ff)，再是 nn.Linear(d_ff, "
                          f"d_model)（d_model={D}，d_ff={F}；门控 FFN 有两个 nn.Linear(d_model, d_ff)），"
                          f"实际找到：{shapes_text(linears)}")


def _ffn_orders(ups: list[Leaf], downs: list[Leaf]) -> list[list[Slot]]:
    """One up projection: W_1 then W_2; two: gate and up in both orders, then W_down (no down
    projection: none)."""
    if len(ups) == 1:
        return [[Slot("FFN W_1", ups[0])] + [Slot("FFN W_2", d) for d in downs]]
    a, b = ups
    return [[Slot("FFN W_gate", gate), Slot("FFN W_up", up)] + [Slot("FFN W_down", d) for d in downs]
            for gate, up in ((a, b), (b, a))]


def _fused_orders(fused: Leaf, F: int, down: Leaf) -> list[list[Slot]]:
    """Gate and up as the two halves of one layer, in both orders (which half is the gate is the
    layer's layout, a convention), then W_down."""
    first, second = Slot("", fused, slice(0, F)), Slot("", fused, slice(F, 2 * F))
    return [[dataclasses.replace(gate, role="FFN W_gate"), dataclasses.replace(up, role="FFN W_up"),
             Slot("FFN W_down", down)] for gate, up in ((first, second), (second, first))]


def is_gated(slots: list[Slot]) -> bool:
    return any(s.role == "FFN W_gate" for s in slots)


def has_down_projection(slots: list[Slot]) -> bool:
    return any(s.role in ("FFN W_2", "FFN W_down") for s in slots)


def ffn_weights(slots: list[Slot], activation: str) -> V.FFNWeights | V.MoEWeights:
    if isinstance(slots[-1], RouterSlot):  # a mixture of experts: each expert's slots, then the router
        r = slots[-1]
        gate = then(r.shared_gate, lambda g: (g.weight, g.bias))
        return V.MoEWeights(r.linear(), [ffn_weights(e, activation) for e in expert_slots(slots)], r.top_k,
                            r.normalize, [ffn_weights(s, activation) for s in shared_slots(slots)], gate)
    by = {FFN_PARTS[s.role]: s.linear() for s in slots}
    return V.FFNWeights(by["up"], by.get("down"), by.get("gate"), activation)


# an FFN slot's role -> the matrix of handformer's FFN it fills (W_1 and W_2 of an FFN without a gate)
FFN_PARTS = {"FFN W_1": "up", "FFN W_up": "up", "FFN W_2": "down", "FFN W_down": "down", "FFN W_gate": "gate"}


def norm_eps(module: nn.Module, kind: str) -> float:
    held = held_eps(module)
    # none held (nn.LayerNorm always has eps): the default of the kind, nn.RMSNorm's for RMSNorm
    return given(held, {"layernorm": 1e-5}.get(kind, torch.finfo(torch.float32).eps))


def positive_eps(eps: float) -> float:
    """A norm's eps as handformer's configs take it (> 0): a norm that adds none (F.normalize's, whose
    eps only guards a zero row) is built with one too small to move a float64 result."""
    return eps if eps > 0 else 1e-300


def held_eps(module: nn.Module) -> float | None:
    """The eps the norm module keeps as an attribute; None where it keeps none."""
    for name in ("eps", "variance_epsilon", "epsilon"):
        value = getattr(module, name, None)
        if is_number(value):
            return float(value)
    return None


def norm_kind(leaf: Leaf) -> str:
    name = type(leaf.module).__name__.lower()
    if "rms" in name or (leaf.bias is None and not isinstance(leaf.module, nn.LayerNorm)
                         and "layer" not in name):
        return "rmsnorm"
    return "layernorm"


def norm_probe(D: int, eps: float, dtype: torch.dtype) -> Tensor:
    """(2, 3, D) inputs off-centre at scales 1, 3 and sqrt(eps): where eps matters as much as the
    squares, so its place (inside or outside the square root) shows."""
    scales = torch.tensor([1.0, 3.0, max(eps, 1e-12) ** 0.5], dtype=dtype)[None, :, None]  # (1, 3, 1)
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0), dtype=dtype)
    return (x + 0.5) * scales


def measured_eps(run: Callable[[Tensor], Any], w: V.NormWeights) -> float | None:
    """The eps of a norm that keeps none as an attribute (a constant in its forward, or none at all:
    `F.normalize(x, dim=-1) * sqrt(d)` divides by the root mean square itself), measured from its
    output on the probe's rows at scale sqrt(w.eps), where eps shrinks each row by sqrt(s / (s + eps)),
    s the row's mean square (RMSNorm) or variance (LayerNorm); 0 below 1e-15; None where it does not run
    or gives no size to measure."""
    x = norm_probe(w.weight.numel(), w.eps, torch.float64)[:, 2:]  # (2, 1, D): the rows at scale sqrt(eps)
    y = quietly(lambda: run(x))
    if getattr(y, "shape", None) != x.shape:
        return None
    bare = V.norm(dataclasses.replace(w, eps=0.0), x, frozenset())
    shift = V.norm(dataclasses.replace(w, weight=w.weight * 0), x, frozenset())  # its bias (or zeros)
    shrunk = (y.double() - shift).norm(dim=-1) / (bare - shift).norm(dim=-1)  # (2, 1)
    eps = float((SPREAD[w.kind](x) * (shrunk.pow(-2) - 1)).median().nan_to_num(-1.0))
    return eps * (eps > 1e-15) if eps > -1e-15 else None


# what eps is added to, by the norm's kind: the mean square (RMSNorm), the variance (LayerNorm)
SPREAD = {"rmsnorm": lambda x: x.pow(2).mean(-1), "layernorm": lambda x: x.var(-1, unbiased=False)}


def norm_weights(slot: Slot) -> V.NormWeights:
    """The norm as the learner's module computes it: a hand-written norm is run alone on a probe and
    its mistakes (unbiased std, eps outside the root, RMSNorm's sum of squares, ...) are searched
    for, so that a layer built from it is compared with what it computes (the layer runners then
    name those mistakes on the layer too)."""
    from handformer.check.core import fingerprint as fp

    kind = norm_kind(slot.leaf)
    w = V.NormWeights(slot.weight(), slot.bias(), norm_eps(slot.leaf.module, kind), kind)
    if type(slot.leaf.module).__module__.startswith("torch."):  # nn.LayerNorm, nn.RMSNorm
        return w
    x = norm_probe(w.weight.numel(), w.eps, w.weight.dtype)
    out = quietly(lambda: slot.leaf.module(x))  # None where their code raises: the norm's own runner says so
    if not isinstance(out, Tensor) or out.shape != x.shape:
        return w
    # the gain as written, or kept as an offset from one (Gemma's x̂ · (1 + weight)); an eps it keeps
    # none of, the default and then the one it computes with (F.normalize's: none)
    for eps, most in _eps_readings(slot.leaf.module, w):
        for k, offset in ((kind, False), (OTHER_NORM[kind], False), (kind, True)):
            gain = w.weight + 1 if offset else w.weight
            base = V.NormWeights(gain, w.bias if k == "layernorm" else None, eps, k, offset=offset)
            found = fp.search(out, lambda fl, base=base: V.norm(base, x, fl),
                              V.norm_flags(k, base.bias is not None), None, most)
            if found is not None:
                return dataclasses.replace(base, flags=found[0])
    return w


@torch.no_grad()
def _eps_readings(module: nn.Module, w: V.NormWeights) -> list[tuple[float, int]]:
    """The eps a norm is read at, each with the most mistakes searched at it: the one it keeps; else
    the default, then (no mistake) the one measured from what it computes where that is another
    (F.normalize's: none)."""
    if held_eps(module) is not None:
        return [(w.eps, 2)]
    measured = measured_eps(lambda x: module(x.to(w.weight.dtype)), w)
    return [(w.eps, 2)] + [(measured, 0)] * (measured is not None and measured != w.eps)


OTHER_NORM = {"rmsnorm": "layernorm", "layernorm": "rmsnorm"}


def norm_slots(norms: list[Leaf], count: int, names: list[str], what: str,
               sandwich: bool = False) -> list[Slot]:
    """One norm a sublayer, in order; sandwich (a decoder-only block's): two a sublayer where it has them."""
    if sandwich and len(norms) == 2 * count == 4:
        return sandwich_slots(norms, names)
    if len(norms) != count:
        raise _norm_count_error(norms, count, names, what)
    if names[-1] == "FFN":  # gpt-fast defines ffn_norm before attention_norm: the FFN's norm goes last
        norms = sorted(norms, key=lambda leaf: bool(FFN_NORM_WORDS.search(leaf.name.lower())))
    return [Slot(f"norm {i + 1} ({n})", leaf) for i, (n, leaf) in enumerate(zip(names, norms))]


POST_NORM = re.compile(r"(?i)post|after|_out\b")  # a norm named for its place after a sublayer


def _norm_count_error(norms: list[Leaf], count: int, names: list[str], what: str) -> MappingError:
    """Norms that are not one a sublayer; those named for a place after a sublayer's output (a hybrid
    norm's norm1_post), where the others are one a sublayer, named as what the reference has not."""
    post = [n for n in norms if POST_NORM.search(n.name.split(".")[-1])]
    if len(norms) - len(post) == count:  # (len(norms) != count: some are named so)
        return MappingError(
            f"{what}: {shapes_text(post)}: a norm after a sublayer's output, which handformer's pre-norm "
            f"block has not (it has one before each sublayer, or Gemma's one before and one after each); "
            f"its norms: {shapes_text(norms)}",
            zh=f"{what}：{shapes_text(post)}：子层输出之后的归一化，handformer 的前置归一化块没有（它在"
               f"每个子层前有一个，或者像 Gemma 那样前后各一个）；它的归一化：{shapes_text(norms)}")
    return MappingError(f"{what}: expected {count} norms ({', '.join(names)}), found "
                        f"{len(norms)}: {shapes_text(norms)}",
                        zh=f"{what}：应当有 {count} 个归一化（{', '.join(names)}），实际找到 "
                           f"{len(norms)} 个：{shapes_text(norms)}")


def by_sublayer(norms: list[Leaf], sublayers: list[list[Slot]]) -> list[Leaf]:
    """A layer's norms in the order of the sublayers whose modules hold them, where one does (ALBERT's
    attention.LayerNorm, defined after the layer's own norm; BERT's attention.output.LayerNorm): a norm
    goes with the sublayer whose weights share the longest module path with it; the others keep their
    definition order in the places left. Unchanged where the counts differ or two claim one place."""
    owners = [_holder(n, sublayers) for n in norms]
    free = iter(i for i in range(len(sublayers)) if i not in owners)
    places = [next(free, -1) if i is None else i for i in owners]
    if sorted(places) != list(range(len(sublayers))):
        return norms
    return [norms[places.index(i)] for i in range(len(sublayers))]


def _holder(norm: Leaf, sublayers: list[list[Slot]]) -> int | None:
    """The one sublayer whose weights share the longest module path with the norm; None on a tie."""
    path = norm.name.split(".")[:-1]
    depths = [max(len(os.path.commonprefix([path, s.leaf.name.split(".")[:-1]])) for s in slots)
              for slots in sublayers]
    return depths.index(max(depths)) if depths.count(max(depths)) == 1 else None


FFN_NORM_WORDS = re.compile("ffn|mlp|feed_forward|feedforward|post_attention")
FFN_WORDS = re.compile("ffn|mlp|feed|ff_|_ff")


def sandwich_slots(norms: list[Leaf], names: list[str]) -> list[Slot]:
    """Gemma 2/3's four norms, one before and one after each sublayer (input_layernorm,
    post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm): by the sublayer
    and the place their names say where they tell the four apart, else in the order they are defined."""
    def place(leaf: Leaf) -> tuple[bool, bool]:
        name = leaf.name.lower()
        return bool(FFN_WORDS.search(name)), "post" in name or "after" in name
    if len(set(map(place, norms))) == len(norms):
        norms = sorted(norms, key=place)
    return [Slot(f"norm {i + 1} ({('before', 'after')[i % 2]} {names[i // 2]})", leaf)
            for i, leaf in enumerate(norms)]


@torch.no_grad()
def copy_weights(target: nn.Module, slot: Slot) -> None:
    """The slot's weight (and bias, zeros when the learner has none) into a handformer linear layer or
    norm."""
    target.weight.copy_(slot.weight())
    if getattr(target, "bias", None) is not None:
        b = slot.bias()
        target.bias.copy_(given(b, torch.zeros_like(target.bias)))


def attention_parameters(target: nn.Module) -> dict[str, nn.Module]:
    """Handformer's MultiHeadAttention by the roles of the learner's attention slots (its q/k norms
    where it has them)."""
    params = {"W_Q": target.q_proj, "W_K": target.k_proj, "W_V": target.v_proj, "W_O": target.o_proj}
    relative = {"bias": target.relative} if hasattr(target, "relative") else {}  # RELATIVE_ROLE's last word
    return params | relative | {role: getattr(target, role) for role in QK_NORM_ROLES
                                if getattr(getattr(target, role, None), "weight", None) is not None}


@torch.no_grad()
def copy_attention(target: nn.Module, slots: list[Slot]) -> None:
    """W_Q, W_K, W_V, W_O into handformer's MultiHeadAttention; no W_O: the identity, so handformer
    computes what a module without an output projection does."""
    by = by_role(slots)
    for role, proj in attention_parameters(target).items():
        if role in QK_NORM_ROLES:  # the gain as it computes (1 + weight, kept as an offset: Gemma 3's)
            copy_weights(proj, by[role])
            proj.weight.copy_(qk_norm_weights(by[role]).weight)
        elif role in by:
            copy_weights(proj, by[role])
        else:
            proj.weight.copy_(torch.eye(proj.weight.size(0), dtype=proj.weight.dtype))
            proj.bias.zero_()


def ffn_parameters(target: nn.Module) -> dict[str, nn.Linear]:
    """Handformer's FeedForward by the roles of the learner's FFN slots."""
    return {"FFN W_1": target.up_proj, "FFN W_up": target.up_proj, "FFN W_2": target.down_proj,
            "FFN W_down": target.down_proj, "FFN W_gate": getattr(target, "gate_proj", None)}


def expert_slots(slots: list[Slot]) -> list[list[Slot]]:
    """A mixture of experts' slots, one list a routed expert (the shared ones and the router left out)."""
    return _per_expert(slots)[:slots[-1].n_experts]  # type: ignore[attr-defined]  (a RouterSlot)


def shared_slots(slots: list[Slot]) -> list[list[Slot]]:
    """A mixture of experts' slots, one list a shared expert (after the routed experts')."""
    return _per_expert(slots)[slots[-1].n_experts:]  # type: ignore[attr-defined]  (a RouterSlot)


def _per_expert(slots: list[Slot]) -> list[list[Slot]]:
    router = slots[-1]
    assert isinstance(router, RouterSlot)
    per = (len(slots) - 1) // (router.n_experts + router.n_shared)
    return [slots[i * per:(i + 1) * per] for i in range(router.n_experts + router.n_shared)]


@torch.no_grad()
def _copy_shared_gate(target: nn.Module, gate: Leaf | None) -> None:
    """The learner's shared-expert gate into handformer's; where it has none (DeepSeek's expert added as
    is), a zero gate, whose sigmoid halves the expert, and its down projection doubled."""
    if gate is not None:
        target.gate.weight.copy_(gate.weight)
        return
    target.gate.weight.zero_()
    target.expert.down_proj.weight.mul_(2.0)


def copy_ffn(target: nn.Module, slots: list[Slot]) -> None:
    """The learner's FFN matrices (two, or three when gated) into handformer's FeedForward (a missing
    down projection stays as it is: that FFN is compared to fail); a mixture of experts' router and
    experts into handformer's MixtureOfExperts."""
    if isinstance(slots[-1], RouterSlot):
        copy_weights(target.router, slots[-1])
        for expert, own in zip(target.experts, expert_slots(slots), strict=True):
            copy_ffn(expert, own)
        for own in shared_slots(slots):  # handformer's sigmoid(gate x) * expert(x)
            copy_ffn(target.shared_expert.expert, own)
            _copy_shared_gate(target.shared_expert, slots[-1].shared_gate)
        return
    projections = ffn_parameters(target)
    for slot in slots:
        copy_weights(projections[slot.role], slot)
