"""Runners for the components without attention: the causal mask function, the position-wise FFN
(ReLU, GELU, SwiGLU), LayerNorm and RMSNorm, and the sinusoidal positional encoding.

Shape legend: B batch, T length, D d_model, F FFN width.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.activations import file_activations
from handformer.check.core.context import (
    F_WIDTH,
    MAX_LEN,
    SEQUENCE_FIRST,
    Context,
    D,
    error_text,
    forward_parameters,
    grads_error,
    residual_handed_zero,
    shape_of,
)
from handformer.check.core.conventions import file_masks_where_true
from handformer.check.core.defaults import quietly, then
from handformer.check.core.discovery import Component, argument_keys, defined_here, own_objects
from handformer.check.core.localize import Departure
from handformer.check.core.localize_kinds import (
    localize_causal_mask,
    localize_ffn,
    localize_norm,
    localize_table,
)
from handformer.check.core.norm_inside import Around, norms_around, readings_around, take_out_leading_norm
from handformer.check.core.probe import Found, Probe, Subject, localize_step, name_findings, run_probe
from handformer.check.core.result import DEPARTS, DIFFERS, Check, ComponentResult, Finding, text
from handformer.check.core.signatures import DOCUMENT_ARGUMENT
from handformer.check.core.sizes import SIZES
from handformer.check.core.source import first_line, locate, source_lines, source_text
from handformer.check.core.unmapped import held_apart
from handformer.check.core.weights import (
    Gainless,
    Slot,
    copy_ffn,
    copy_weights,
    ffn_parameters,
    ffn_slots,
    ffn_weights,
    has_down_projection,
    held_eps,
    is_gated,
    leaves,
    measured_eps,
    norm_eps,
    norm_probe,
    norm_slots,
    of_kind,
)
from handformer.check.reference import variants as V
from handformer.check.reference.diagnoses import CATALOG
from handformer.nn.feed_forward import FeedForward
from handformer.nn.masks import causal_mask
from handformer.nn.norms import LayerNorm, RMSNorm
from handformer.nn.positions import sinusoidal_table

# how a (T, T) mask read in each convention says "may see"
READ_KEEP = {"torch": lambda m: m == 0, "bool": lambda m: m, "additive": lambda m: m > -1e3,
             "int": lambda m: m != 0}


def _convention(mask: Tensor, forced: str | None, where_true: bool) -> str:
    """The convention of the learner's mask, read from its largest one: at T = 1 an additive mask
    (0 and -inf, PyTorch's generate_square_subsequent_mask) is a single 0, which alone reads as an
    int mask that hides everything; 1 (or True) = masked when asked for, or when the file's attention
    fills where its mask is nonzero (`where_true`: the TensorFlow tutorial's `mask * -1e9`)."""
    if mask.is_floating_point() and (mask < -1e3).any() or torch.isinf(mask).any():
        return "additive"
    if forced == "torch" or where_true:
        return "torch"
    return "bool" if mask.dtype == torch.bool else "int"


CAUSAL_SIZES = (1, 5, 8)  # the lengths the mask is asked for
# the argument of a prefix-LM mask that says how long each row's bidirectional prefix is (GLM's sep, a
# prefix_len, a source length)
PREFIX_ARGUMENT = re.compile(r"prefix|^sep$|^sep_|bidirect|^n_?context|^context_len|^source_len|^src_len")
# what a causal mask function's required arguments are handed, by their names (any other: the length);
# Hugging Face's kin: make_causal_mask(bsz, tgt_len, dtype), OPT's make_causal_mask(attention_mask, dtype)
# a window (Gemma 2's make_masks(q_len, sliding_window, dtype, device)): the length itself, so that every
# mask it makes is the causal one; the windows are compared apart (_windows_compared)
MASK_ARGUMENTS = ((re.compile("window"), lambda T: T),
                  # the length of a cache before it (Hugging Face's past_key_values_length): none
                  (re.compile(r"past|cache|offset|start_pos"), lambda T: 0),
                  # a prefix-LM mask's prefix (GLM's build_mask_matrix(hidden_states, seq_length, sep)): none,
                  # so that it is the causal mask; a prefix is compared apart (_prefix_compared)
                  (PREFIX_ARGUMENT, lambda T: torch.tensor([0])),
                  # states whose sizes it reads (batch, length): (1, T, D)
                  (re.compile(r"hidden|states|embed"), lambda T: torch.zeros(1, T, D)),
                  (re.compile("dtype"), lambda T: torch.float32), (re.compile("device"), lambda T: "cpu"),
                  (re.compile(r"bsz|batch|^bs?$"), lambda T: 1),  # a batch of one
                  (re.compile(r"mask|ids|^(x|inputs?|tokens|idx|seq|tgt|trg|target)$"),
                   lambda T: torch.ones(1, T, dtype=torch.long)))  # (1, T): every token real


def mask_arguments(fn: Callable[..., Any], T: int, shaped: bool = False) -> list[Any]:
    """The arguments of a causal mask function for length T, read from their names (PyTorch's
    generate_square_subsequent_mask(sz): the length; a padding mask or ids: every one of T tokens real):
    the first and every one without a default. `shaped`: the length given as a tensor of T along every
    axis, for a function that reads it as a tensor's size (fairseq's buffered_future_mask(tensor):
    tensor.size(0), the stream being sequence-first)."""
    first, *others = forward_parameters(fn)
    handed = [first.name.lower()] + [p.name.lower() for p in others if p.default is p.empty]
    length = torch.zeros(T, T, T) if shaped else T
    return [next((fill(T) for name, fill in MASK_ARGUMENTS if name.search(p)), length) for p in handed]


def length_shaped(ctx: Context, fn: Callable[..., Any]) -> bool:
    """Whether the mask function takes its length as a tensor whose size it reads: it raises handed
    the length 3 and runs handed a tensor of 3 along every axis."""
    def runs(shaped: bool) -> bool:
        try:
            ctx.learner.call("forward", fn, *mask_arguments(fn, 3, shaped))
        except fp.LearnerFailure:
            return False
        return True
    return not runs(False) and runs(True)
CAUSAL_FLAGS = ("causal_off_by_one:no_self", "causal_off_by_one:sees_next", "mask_inverted")


def _build_causal(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's mask function as its masks (read as True = may see) for each length, one after
    the other (T * T entries each); the convention it was read in kept in facts, and whether it reads
    its length from a tensor's size (`length_shaped`, noted)."""
    facts: dict[str, Any] = {"shaped": length_shaped(ctx, comp.obj)}
    res.notes += [SHAPED_NOTE] * facts["shaped"]

    def run(sizes: tuple[int, ...]) -> Tensor:
        raws = [_causal_raw(ctx, comp, T, facts["shaped"]) for T in sizes]
        where_true = ctx.convention is None and file_masks_where_true(source_text(ctx.module))
        facts["convention"] = conv = _convention(max(raws, key=Tensor.numel), ctx.convention, where_true)
        return torch.cat([READ_KEEP[conv](raw).flatten() for raw in raws]).double()

    return Subject(run, [(None, None)], comp.obj, facts)


SHAPED_NOTE = text("it reads the length from a tensor's size (fairseq's buffered_future_mask(tensor)): "
                   "handed a tensor of that length along every axis",
                   "它从张量的尺寸读取长度（fairseq 的 buffered_future_mask(tensor)）："
                   "传入的张量每一维都是这个长度")


def _causal_raw(ctx: Context, comp: Component, T: int, shaped: bool) -> Tensor:
    """The learner's mask for length T as (T, T); a failure when it is not T * T entries."""
    raw = ctx.learner.call("forward", comp.obj, *mask_arguments(comp.obj, T, shaped))
    masks = _masks(raw, T)  # the first, where it returns several (Gemma 2's global and windowed ones)
    if masks:
        return masks[0].reshape(T, T)  # (T, T) or (1, T, T) -> (T, T)
    got = tuple(raw.shape) if isinstance(raw, Tensor) else type(raw).__name__
    raise ctx.learner.fail("forward", f"{comp.name}({T}) returned {got}, expected a ({T}, {T}) mask "
                           f"(or (1, {T}, {T}))",
                           f"{comp.name}({T}) 返回了 {got}，应当是 ({T}, {T}) 的掩码（或 (1, {T}, {T})）")


WINDOW, WINDOW_T = 3, 8


def _windows_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                      found: Found) -> None:
    """The step for a mask function that takes a window: handed WINDOW at length WINDOW_T, each mask
    it returns is the causal one or a window, query t seeing its last WINDOW keys (Gemma 2's
    `i - j < sliding_window`) or WINDOW + 1 (Hugging Face Mistral's), and one of them is windowed."""
    plain = mask_arguments(comp.obj, WINDOW_T, subject.facts["shaped"])
    params = forward_parameters(comp.obj)
    windowed = [WINDOW if "window" in p.name.lower() else a for p, a in zip(params, plain)]
    if windowed == plain or found.named:
        return
    raw = ctx.learner.call("forward", comp.obj, *windowed)
    read = READ_KEEP[subject.facts["convention"]]
    masks = [read(t.reshape(WINDOW_T, WINDOW_T)).bool() for t in _masks(raw, WINDOW_T)]
    seen = [int(m[-1].sum()) for m in masks]  # the keys the last query sees: T for the causal mask
    causal, least = V.causal_keep(WINDOW_T), min(seen, default=0)
    ok = all(torch.equal(m, causal & ~causal.tril(-w)) for m, w in zip(masks, seen)) and least in WINDOWS
    res.checks.append(Check(text(
        f"handed the window {WINDOW} at T = {WINDOW_T}: each mask is the causal one or a window (query t "
        "sees its last keys), and one is windowed",
        f"传入窗口 {WINDOW}、T = {WINDOW_T} 时：每个掩码要么是因果掩码，要么是滑动窗口（位置 t 只看最近的"
        "几个键），并且有一个是窗口掩码"), ok,
        text(f"the last query of each mask sees {seen} keys", f"各掩码最后一个查询看到的键数为 {seen}")))
    res.notes += [text(f"its window of {WINDOW} lets each query see {least} keys",
                       f"它的窗口 {WINDOW} 让每个查询看到 {least} 个键")] * ok


WINDOWS = (WINDOW, WINDOW + 1)  # the keys a query sees in a window of WINDOW, as either convention counts


# what tells a packed row's documents apart, by the argument's name: a document id for each token, or
# positions that restart at each document (0..2, then 0..1 for two documents of 3 and 2 tokens)
DOCUMENTS = ((DOCUMENT_ARGUMENT,
              lambda T: torch.tensor([[0] * 3 + [1] * (T - 3)])),
             (re.compile(r"^pos|position"), lambda T: torch.tensor([list(range(3)) + list(range(T - 3))])))
DOCS_T = 5


def _documents_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                        found: Found) -> None:
    """The step for a mask of packed documents (a document-causal mask): handed two documents of 3 and
    2 tokens (by document ids, or positions that restart), each query sees the keys of its own
    document up to itself."""
    plain = mask_arguments(comp.obj, DOCS_T, subject.facts["shaped"])
    names = [p.name.lower() for p in forward_parameters(comp.obj)]
    packed = [next((fill(DOCS_T) for words, fill in DOCUMENTS if words.search(n)), a)
              for n, a in zip(names, plain)]
    if all(a is b for a, b in zip(packed, plain)):
        return
    raw = ctx.learner.call("forward", comp.obj, *packed)
    masks = _masks(raw, DOCS_T)
    keep = READ_KEEP[subject.facts["convention"]](masks[0].reshape(DOCS_T, DOCS_T)).bool() if masks else None
    want = V.causal_keep(DOCS_T) & torch.block_diag(torch.ones(3, 3), torch.ones(2, 2)).bool()
    ok = keep is not None and torch.equal(keep, want)
    rows = "" if keep is None else _rows_shown(keep)
    res.checks.append(Check(text("two packed documents of 3 and 2 tokens: each query sees its own document's "
                                 "keys up to itself (a document-causal mask)",
                                 "两个打包在一起的文档（3 个和 2 个 token）：每个查询只看到自己文档里"
                                 "到它为止的键（文档因果掩码）"), ok, text(f"rows: {rows}", f"各行：{rows}")))


# a prefix-LM mask's rows: prefixes of 3 and 1 tokens at length PREFIX_T, in one batch (what each
# argument is handed, by its name), then a prefix of 3 alone (a prefix given as one number for the batch)
PREFIX_T, PREFIXES = 5, (3, 1)
PREFIX_ROWS = ((PREFIX_ARGUMENT, lambda rows: torch.tensor(rows)),
               (re.compile(r"hidden|states|embed"), lambda rows: torch.zeros(len(rows), PREFIX_T, D)),
               (re.compile(r"bsz|batch|^bs?$"), len),
               (re.compile(r"mask|ids|^(x|inputs?|tokens|idx|seq|tgt|trg|target)$"),
                lambda rows: torch.ones(len(rows), PREFIX_T, dtype=torch.long)))


def _prefix_keep(rows: tuple[int, ...]) -> Tensor:
    """The prefix-LM mask (B, T, T), True = may see: query t sees keys 0..t and every key of its row's
    prefix."""
    columns = torch.arange(PREFIX_T)
    return torch.stack([V.causal_keep(PREFIX_T) | (columns < n)[None, :] for n in rows])


def _prefixed_mask(ctx: Context, comp: Component, subject: Subject, rows: tuple[int, ...]) -> Tensor:
    """The learner's mask (B, T, T) read as True = may see, handed the prefixes `rows`; none seen where it
    raises or gives no mask of that size (a prefix given as one number is handed a batch of one)."""
    plain = mask_arguments(comp.obj, PREFIX_T, subject.facts["shaped"])
    handed = [next((fill(list(rows)) for words, fill in PREFIX_ROWS if words.search(p.name.lower())), a)
              for p, a in zip(forward_parameters(comp.obj), plain)]
    masks = quietly(lambda: _masks(ctx.learner.call("forward", comp.obj, *handed), PREFIX_T, len(rows)),
                    fp.LearnerFailure, [])
    read = READ_KEEP[subject.facts["convention"]]
    none = torch.zeros(len(rows), PREFIX_T, PREFIX_T, dtype=torch.bool)  # no query sees anything
    return next((read(m.reshape(len(rows), PREFIX_T, PREFIX_T)).bool() for m in masks), none)


def _prefix_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                     found: Found) -> None:
    """The step for a prefix-LM mask (an argument names the prefix): handed prefixes of 3 and 1 tokens in
    one batch (or 3 alone, as one number), each query sees every key of its row's prefix and the keys
    up to itself; else the line that bounds the prefix is quoted."""
    prefix = [p.name for p in forward_parameters(comp.obj) if PREFIX_ARGUMENT.search(p.name.lower())]
    if not prefix or found.named:
        return
    rows, keep = PREFIXES, _prefixed_mask(ctx, comp, subject, PREFIXES)
    if not keep.any():  # a prefix of one number for the batch (every causal mask shows its diagonal)
        rows, keep = PREFIXES[:1], _prefixed_mask(ctx, comp, subject, PREFIXES[:1])
    want = _prefix_keep(rows)
    shown = " | ".join(map(_rows_shown, keep))
    res.checks.append(Check(text(
        f"prefixes of {rows} tokens at T = {PREFIX_T}: each query sees its row's whole prefix and the keys "
        "up to itself (a prefix-LM mask)",
        f"前缀长 {rows}、T = {PREFIX_T} 时：每个查询看到自己这一行的整个前缀，"
        "以及到它为止的键（前缀 LM 掩码）"),
        torch.equal(keep, want), text(f"rows: {shown}", f"各行：{shown}")))
    name = re.escape(prefix[0])  # compared with positions, or the end of a slice of columns
    where = rf"\b{name}\b.*[<>]|[<>].*\b{name}\b|:\s*{name}\b"
    res.findings += [Finding(DEPARTS, text(
        "the prefix's keys are not what its rows see: the line that bounds the prefix",
        "前缀里的键与各行看到的不一致：限定前缀的那一行"),
        *first_line([where], source_lines([comp.obj])))] * (not torch.equal(keep, want))


def _rows_shown(keep: Tensor) -> str:
    """A (T, T) mask's rows as 1s (may see) and 0s: "100 110 111"."""
    return " ".join("".join(map(str, r.tolist())) for r in keep.int())


def _masks(raw: Any, T: int, rows: int = 1) -> list[Tensor]:
    """The (T, T) masks (or (1, T, T), ...; `rows` of them in a batch) among what a mask function returns:
    it, or each of a tuple."""
    items = fp.outputs(raw)
    return [t for t in items if isinstance(t, Tensor) and t.numel() == rows * T * T]


def _causal_reference(w: None, sizes: tuple[int, ...], flags: frozenset[str]) -> Tensor:
    """The masks for each length, one after the other, as each mistake makes them."""
    keeps = [~causal_mask(T) if "mask_inverted" in flags else V.causal_keep(T, flags) for T in sizes]
    return torch.cat([keep.flatten() for keep in keeps]).double()


def _causal_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                     found: Found) -> None:
    """The step that compares each length's mask with handformer's and names the mistake found at
    the first length that differs."""
    res.convention = fp.describe_convention(subject.facts["convention"])
    sizes, right = found.x, found.reference(frozenset())
    pairs = zip(sizes, *(t.bool().split([T * T for T in sizes]) for t in (found.out, right)))
    wrong = [(T, float((mine != want).sum()), mine.reshape(T, T))  # each length's (T * T,) -> (T, T)
             for T, mine, want in pairs if not torch.equal(mine, want)]
    worst = max((count for _, count, _ in wrong), default=0.0)
    if found.named and wrong:  # shown at the first length with a row 2 that differs (T = 1 has none)
        (T, _, keep) = next((w for w in wrong if w[0] > 2), wrong[0])
        name, _, form = next(iter(found.flags)).partition(":")
        number, code = locate(name, source_lines(ctx.objects(comp)))
        res.findings.append(Finding(name, _mask_observed(name, form, T, keep), number, code, form))
    res.max_abs_error = worst
    res.checks.append(Check(text("equals handformer's causal_mask for T = 1, 5, 8 (query t sees keys 0..t)",
                                 "T = 1, 5, 8 时与 handformer 的 causal_mask 一致（位置 t 看到 0..t）"),
                            worst == 0, text(f"{int(worst)} entries differ", f"{int(worst)} 个位置不同")))


CAUSAL_MASK = Probe(
    build=_build_causal,                    # the function, called for each length
    inputs=lambda s: CAUSAL_SIZES,
    shape=lambda ctx, comp, s, x, out: None,  # each mask's size is checked as it is read
    reference=_causal_reference,
    universe=lambda s: CAUSAL_FLAGS,
    steps=(_causal_compared, _windows_compared, _documents_compared, _prefix_compared, localize_step(
        lambda s, found: localize_causal_mask(s.module, mask_arguments(s.module, 5, s.facts["shaped"]), 5))),
    depth=1, deterministic=False,
)


def check_causal_mask(comp: Component, ctx: Context) -> ComponentResult:
    """The causal mask function, as the CAUSAL_MASK probe states it."""
    return run_probe(CAUSAL_MASK, comp, ctx)


def _mask_observed(name: str, form: str, T: int, keep: Tensor) -> dict[str, str]:
    row = "".join(map(str, keep[min(2, T - 1)].int().tolist()))  # 1 = may see
    en, zh = MASK_OBSERVED[name, form]
    shown = {"row": row, "T": T, "want": "111" + "0" * (T - 3)}
    return text(en.format(**shown), zh.format(**shown))


# what a causal mask's mistake (its name, its form) shows, at row 2 of the mask of length T
MASK_OBSERVED = {
    ("mask_inverted", ""): (
        "your mask marks the future as visible and the past as hidden (row 2 reads {row})",
        "你的掩码把未来标成可见、过去标成屏蔽（行 2 为 {row}）"),
    ("causal_off_by_one", "no_self"): (
        "token t sees only 0..t-1, not itself (row 2 of the T={T} mask reads {row}, expected {want})",
        "位置 t 只看到 0..t-1，看不到自己（T={T} 时行 2 为 {row}，应为 {want}）"),
    ("causal_off_by_one", "sees_next"): (
        "token t sees 0..t+1, one position of the future (row 2 of the T={T} mask reads {row}, "
        "expected {want})",
        "位置 t 看到了 0..t+1，多看了一个未来位置（T={T} 时行 2 为 {row}，应为 {want}）")}


FFN_ACTIVATIONS = {False: ("relu", "gelu", "gelu_tanh", "relu2", "silu"), True: ("silu", "gelu", "gelu_tanh")}
HF_NAME = {(False, "relu"): "relu", (False, "gelu"): "gelu", (False, "gelu_tanh"): "gelu_tanh",
           (True, "silu"): "swiglu", (True, "gelu"): "geglu", (True, "gelu_tanh"): "geglu_tanh",
           (False, "relu2"): "relu2", (False, "silu"): "silu", (False, "quick_gelu"): "quick_gelu"}
# the plain activations handformer's FeedForward has not (BART's and Marian's swish, SiLU without a
# gate): the reference is built with the one named here, then handed the learner's (plain_activation_)
BUILT_AS = {"silu": "gelu", "quick_gelu": "gelu"}


def ffn_activations(gated: bool) -> tuple[str, ...]:
    """The activations tried on a FFN: those every file gets, then those its code shows (a plain FFN)."""
    return FFN_ACTIVATIONS[gated] + file_activations() * (not gated)


def built_activation(name: str) -> str:
    """The activation handformer's reference is built with for `name` (an HF_NAME value)."""
    return BUILT_AS.get(name, name)


def plain_activation_(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """`module` (a reference built with built_activation(name)) with `name` in each plain FeedForward."""
    for ffn in filter(lambda m: type(m) is FeedForward and name in BUILT_AS, module.modules()):
        ffn.act, ffn.activation = V.ACTIVATIONS[name], name
    return module
# what a gated FFN's class name promises: SwiGLU is SiLU-gated, GEGLU GELU-gated
NAMED_ACTIVATION = (("swiglu", "silu"), ("silu", "silu"), ("swish", "silu"), ("geglu", "gelu"),
                    ("gelu", "gelu"))


def _build_ffn(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's FFN and every reading of its linears (which is the gate, up and down) with each
    activation its form allows, inside the residual and norm it holds (norm_inside), if it holds one."""
    x = fp.randn(2, 5, D, seed=1)
    module = residual_handed_zero(ctx.build(comp, warmup=lambda m: residual_handed_zero(m)(x.float())))
    take_out_leading_norm(res, module, D, lambda h: fp.first_tensor(module(h), 3))  # vit-pytorch's
    # jadore801120's FFN adds its input back and normalizes: the sublayer norm(x + FFN(x)), compared so
    around = norms_around(comp.name, of_kind(leaves(module), "norm"), D, text(
        "handformer's reference FFN has neither (its layer check covers them)",
        "handformer 的参考 FFN 两者都没有（层的检查会覆盖它们）"))
    candidates = ffn_slots(of_kind(leaves(module), "linear"), D, F_WIDTH,
                           comp.name)
    gated = is_gated(candidates[0])
    ctx.unmapped[comp.name] = held_apart(module, itertools.chain(*candidates), FFN_NAME)  # unnamed: unchecked
    readings = readings_around([((slots, act), ffn_weights(slots, act)) for slots in candidates
                                for act in ffn_activations(gated)], around)

    def run(x: Tensor) -> Tensor | None:
        return fp.first_tensor(ctx.learner.call("forward", module, x), 3)

    facts = {"x": x, "gated": gated, "has_down": has_down_projection(candidates[0]),
             "width": candidates[0][0].weight().size(0)}  # F (a fused gate and up: half its rows)
    return Subject(run, readings, module, facts)


def _ffn_shape(ctx: Context, comp: Component, subject: Subject, x: Tensor, out: Tensor | None,
               ) -> tuple[str, str] | None:
    if out is not None and out.shape[:-1] == x.shape[:-1] and out.size(-1) in (D, subject.facts["width"]):
        return None
    return (f"{comp.name} returned {getattr(out, 'shape', out)} for an input of shape {tuple(x.shape)}; "
            "a FFN keeps the shape (B, T, d_model)",
            f"输入形状为 {tuple(x.shape)} 时，{comp.name} 返回了 {getattr(out, 'shape', out)}；"
            "FFN 不改变形状 (B, T, d_model)")


def _ffn_universe(subject: Subject) -> tuple[str, ...]:
    return ("ffn_no_activation",) + (("gated_act_after_product",) if subject.facts["gated"] else ()) + (
        ("ffn_no_down_projection",) if subject.facts["has_down"] else ())


def _ffn_named(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """The step that maps the FFN as found and names a missing down projection, the mistakes the
    search found and those its names tell; otherwise notes the activation."""
    slots, act = found.key
    res.mapping = [s.describe() for s in slots]
    if not subject.facts["has_down"]:
        number, code = locate("ffn_no_down_projection", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("ffn_no_down_projection", text(
            f"{comp.name} has no nn.Linear(d_ff, d_model): its output is (B, T, d_ff) = "
            f"{tuple(found.out.shape)}", f"{comp.name} 没有 nn.Linear(d_ff, d_model)：输出是 (B, T, d_ff) = "
            f"{tuple(found.out.shape)}"),
            number, code))
    name_findings(res, ctx, comp, subject, found)
    if found.matched is not None:
        res.findings += ffn_name_findings(ctx, comp, type(subject.module).__name__, slots, act, found.matched,
                                          activated="ffn_no_activation" not in found.flags)
    if not found.named:
        res.notes.append(text(f"activation: {HF_NAME[(is_gated(slots), act)]}",
                              f"激活函数：{HF_NAME[(is_gated(slots), act)]}"))


def _ffn_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                  found: Found) -> None:
    """The step that compares a FFN that has its down projection with handformer's FeedForward."""
    if subject.facts["has_down"]:
        slots, act = found.key
        _compare_ffn(res, ctx, subject.run, slots, HF_NAME[(subject.facts["gated"], act)],
                     subject.facts["width"], found.weights)


def _ffn_departure(subject: Subject, found: Found) -> Departure | None:
    if not subject.facts["has_down"]:
        return None
    return localize_ffn(subject.module, [w.inner for _, w in subject.readings], found.x)


FFN_NAME = text("FFN", " FFN ")
FFN = Probe(
    build=_build_ffn,
    inputs=lambda s: s.facts["x"],
    shape=_ffn_shape,
    reference=lambda w, x, flags: w.apply(x, lambda t: V.feed_forward(w.inner, t, flags)),
    universe=_ffn_universe,
    steps=(_ffn_named, _ffn_compared, localize_step(_ffn_departure),
           lambda res, ctx, comp, s, found: _position_wise(res, s.run, found.x, found.out)),
)


def check_ffn(comp: Component, ctx: Context) -> ComponentResult:
    """The position-wise FFN (ReLU, GELU, SwiGLU, GEGLU), as the FFN probe states it; one with no
    parameters (OLMo's SwiGLU module) as its activation alone, the ACTIVATION probe."""
    return run_probe(FFN if _has_weights(comp, ctx) else ACTIVATION, comp, ctx)


def _has_weights(comp: Component, ctx: Context) -> bool:
    return next(built_ffn(comp, ctx).parameters(), None) is not None


def built_ffn(comp: Component, ctx: Context) -> torch.nn.Module:
    """The learner's FFN as check builds it (its residual handed zero where it adds one)."""
    return ctx.build(comp, checked=False,
                     warmup=lambda m: residual_handed_zero(m)(fp.randn(2, 5, D, seed=1).float()))


ACTIVATIONS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "relu": torch.relu,
               "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
HALVES = ("first half", "second half")
# what an activation without weights may compute from x (B, T, 2F): act(x), or a gated act(gate) * up
# with the gate either half of x (which half is the gate is the projection's layout, a convention)
ACTIVATION_READINGS = {f"{name}({HALVES[g]}) * {HALVES[1 - g]}": (
    lambda x, act=act, g=g: act(x.chunk(2, dim=-1)[g]) * x.chunk(2, dim=-1)[1 - g])
    for name, act in ACTIVATIONS.items() for g in (1, 0)}
ACTIVATION_READINGS |= {f"{name}(x)": act for name, act in ACTIVATIONS.items()}


def _build_activation(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    module = ctx.build(comp)
    return Subject(lambda x: fp.first_tensor(ctx.learner.call("forward", module, x), 3),
                   list(ACTIVATION_READINGS.items()), module, {})


def _activation_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                         found: Found) -> None:
    err = res.max_abs_error = fp.max_error(found.out, found.reference(frozenset()))
    res.notes += [text(f"no parameters: an activation, {found.key} (the projections around it are checked "
                       "in the block that uses it)",
                       f"没有参数：是一个激活函数 {found.key}（它前后的投影在使用它的块里检查）",
                       )] * (err < 1e-5)
    res.checks.append(Check(text(f"matches an activation (silu, gelu, relu), plain or gated, on (2, 5, "
                                 f"{2 * F_WIDTH})", f"在 (2, 5, {2 * F_WIDTH}) 上与某个激活函数"
                                 "（silu、gelu、relu，门控或不门控）一致"), err < 1e-5, error_text(err)))


ACTIVATION = Probe(
    build=_build_activation,                # a FFN-named module with no parameters, and each activation
    inputs=lambda s: fp.randn(2, 5, 2 * F_WIDTH, seed=1),
    shape=lambda ctx, comp, s, x, out: None if out is not None and out.shape[:-1] == x.shape[:-1] else (
        f"{comp.name} returned {shape_of(out)} for x of shape {tuple(x.shape)}",
        f"x 的形状为 {tuple(x.shape)} 时，{comp.name} 返回了 {shape_of(out)}"),
    reference=lambda act, x, flags: act(x),
    universe=lambda s: (),
    steps=(_activation_compared,),
)


def _position_wise(res: ComponentResult, run: Callable[[Tensor], Tensor | None], x: Tensor,
                   out: Tensor) -> None:
    bumped = x.clone()
    bumped[:, 2] += 1.0
    moved = _position_moved(run(bumped), out)
    res.checks.append(Check(text("position-wise: changing one position changes no other",
                                 "逐位置：改变一个位置不影响其他位置"), moved < 1e-12,
                            text(f"other positions moved by {moved:.3g}", f"其他位置变化了 {moved:.3g}")))


def _position_moved(bumped: Tensor | None, out: Tensor) -> float:
    if bumped is None or bumped.shape != out.shape:
        return float("inf")
    moved = (bumped - out).abs().amax(-1)
    moved[:, 2] = 0
    return moved.max().item()


def _compare_ffn(res: ComponentResult, ctx: Context, run: Callable[[Tensor], Tensor | None],
                 slots: list[Slot], name: str, width: int, reading: Around) -> None:
    hf = plain_activation_(FeedForward(D, width, built_activation(name)).double(), name)
    copy_ffn(hf, slots)
    reference = reading.module(hf)  # with the residual and norm a sublayer holds (jadore801120's)
    res.notes += reading.notes()
    errors, grad_err = [], 0.0
    params = [s.leaf.weight.requires_grad_() for s in slots]  # frozen ones too (gemma_pytorch's Linear)
    for i, (B, T) in enumerate([(2, 5), (1, 1), (3, 9)]):
        xi = fp.randn(B, T, D, seed=10 + i).requires_grad_()
        with torch.enable_grad():
            mine, ref = run(xi), reference(xi)
            errors.append(fp.max_error(mine, ref))
            if i == 0 and mine is not None and mine.shape == ref.shape:
                g = fp.randn(*ref.shape, seed=5)
                a = _slot_grads((mine * g).sum(), xi, slots, params)
                hf_params = [ffn_parameters(hf)[s.role].weight for s in slots]
                b = torch.autograd.grad((ref * g).sum(), [xi] + hf_params)
                grad_err = grads_error(list(zip(a, b)))
    res.max_abs_error = max(errors)
    res.checks.append(Check(text(f"matches handformer's FeedForward ({name}) on 3 shapes",
                                 f"在 3 种形状上与 handformer 的 FeedForward（{name}）一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))
    res.checks.append(Check(text("gradients match handformer's", "梯度与 handformer 一致"),
                            grad_err < 1e-5, error_text(grad_err)))


def _slot_grads(loss: Tensor, x: Tensor, slots: list[Slot], params: list[Tensor]) -> list[Tensor | None]:
    """The gradients of `loss` for `x` and each slot's part of its layer (`params`, the slots' layers'
    weights: a fused gate and up each its half of the one layer's gradient; a layer never used: None,
    compared to fail)."""
    weights = list({id(w): w for w in params}.values())  # each layer once
    grads = torch.autograd.grad(loss, [x, *weights], allow_unused=True)
    by_layer = {id(w): g for w, g in zip(weights, grads[1:])}
    own = [(s.rows, by_layer[id(s.leaf.weight)]) for s in slots]
    return [grads[0], *(g if rows is None or g is None else g[rows] for rows, g in own)]


# the FFN's mistakes only names tell (ffn_name_findings): the outputs of a block or a model that uses the
# FFN cannot show them either, so such a finding of a part is the whole's too
NAMES_TELL = ("ffn_wrong_activation", "gated_activation_wrong_branch")


def ffn_name_findings(ctx: Context, comp: Component, class_name: str, slots: list[Slot], act: str,
                      matched: float, activated: bool = True) -> list[Finding]:
    """The FFN's mistakes that only names tell: an activation other than the one the code promises
    (PROMISES; none when the FFN applies no activation at all), and in a gated FFN the activation on
    the branch named up (or Meta's w3) while the one named gate (w1) is not activated."""
    out = _promise_findings(ctx, comp, class_name, slots, act, matched) if activated else []
    if is_gated(slots):
        out += wrong_branch_findings(ctx, comp, slots, matched)
    return out


# an activation's family, as the search names it and as code names it (an attribute, a class)
ACT_FAMILY = {"relu": "relu", "relu2": "relu", "gelu": "gelu", "gelu_tanh": "gelu", "quick_gelu": "gelu",
              "silu": "silu",
              "swish": "silu"}
ACT_ATTRIBUTE = re.compile(r"self\.\w*?(gelu|relu|silu|swish)\w*\s*=", re.IGNORECASE)  # self.gelu = ...
# code that is GPT-2's (not a comment that names it): its vocabulary size, its checkpoints, its classes
GPT2 = re.compile(r"\b50257\b|[\"']gpt2(-medium|-large|-xl)?[\"']|GPT2LMHeadModel|GPT2Config")
DECODER_ONLY, ENCODER_DECODER = {"gpt", "block"}, {"transformer", "encoder_layer", "decoder_layer"}


def _by_class_name(ctx: Context, class_name: str, gated: bool) -> str | None:
    return next((a for word, a in NAMED_ACTIVATION if word in class_name.lower()), None)


def _by_attribute(ctx: Context, class_name: str, gated: bool) -> str | None:
    """The activation the attribute holding it is named for (`self.gelu = nn.GELU()`), in the FFN's
    own class."""
    return _one_named(ctx, class_name, ACT_ATTRIBUTE, lambda m: ACT_FAMILY[m.lower()])


def _one_named(ctx: Context, class_name: str, pattern: re.Pattern[str], family: Callable[[str], str],
               ) -> str | None:
    """The one activation (`family` of what `pattern` finds) the lines of the FFN's own class name; none
    for none or several."""
    cls = own_objects(ctx.module).get(class_name)
    found = {family(m) for _, line in source_lines(filter(None, [cls])) for m in pattern.findall(line)}
    return found.pop() if len(found) == 1 else None


def _by_gpt2(ctx: Context, class_name: str, gated: bool) -> str | None:
    """GELU, for a two-layer FFN in a decoder-only file whose code is GPT-2's (its 50,257-token
    vocabulary, its checkpoints' names), comments left out."""
    kinds = set(ctx.components)
    decoder_only = not gated and kinds & DECODER_ONLY and not kinds & ENCODER_DECODER
    lines = Path(ctx.path).read_text(encoding="utf-8").splitlines() if decoder_only else []
    return "gelu" if any(GPT2.search(line.split("#")[0]) for line in lines) else None


def _by_gemma(ctx: Context, class_name: str, gated: bool) -> str | None:
    """The tanh GELU, for an FFN in a file whose code is Gemma's (a class named Gemma..., a
    GemmaConfig): Gemma's MLP is GeGLU with the tanh GELU (its checkpoints' gelu_pytorch_tanh)."""
    code = re.sub(r"#.*", "", Path(ctx.path).read_text(encoding="utf-8"))  # comments left out
    return "gelu_tanh" if GEMMA.search(code) else None


def _by_own_tanh_gelu(ctx: Context, class_name: str, gated: bool) -> str | None:
    """The tanh GELU, for an FFN in a file that writes the tanh GELU out itself (GPT-2's `gelu_new`:
    tanh and its 0.044715) as a function or class that no line of the file uses: the GELU the file
    meant, left unused."""
    code = re.sub(r"#.*", "", Path(ctx.path).read_text(encoding="utf-8"))  # comments left out
    unused = [name for name, obj in defined_here(ctx.module).items() if "gelu" in name.lower()
              and TANH_GELU.search(source_text(obj))
              and len(re.findall(rf"\b{name}\b", code)) == 1]  # named once: its `def`
    return {True: "gelu_tanh"}.get(bool(unused))


def _by_held_class(ctx: Context, class_name: str, gated: bool) -> str | None:
    """The activation the module it builds is named for (`self.act = QuickGELUActivation()`,
    `self.act_fn = nn.SiLU()`), in the FFN's own class: one name, else none."""
    return _one_named(ctx, class_name, HELD_ACTIVATION,
                      lambda m: HELD_FAMILY.get(m.lower().replace("_", ""), m.lower()))


HELD_ACTIVATION = re.compile(r"self\.\w+\s*=\s*(?:nn\.)?[A-Za-z]*?(quick_?gelu|gelu|relu|silu|swish)\w*\(",
                             re.IGNORECASE)
HELD_FAMILY = {"quickgelu": "quick_gelu", "swish": "silu"}
TANH_GELU = re.compile(r"tanh[\s\S]*0\.044715|0\.044715[\s\S]*tanh")
GEMMA = re.compile(r"\bclass\s+Gemma|\bGemma\w*Config\b")
# where the code promises an FFN's activation, the first that speaks: a Gemma model's GeGLU (the tanh
# GELU), its class name (SwiGLU: SiLU, GEGLU: GELU), the attribute that holds it, a GPT-2 model's
# two-layer MLP (GELU), and last the activation module it builds (a GPT-2 MLP holding nn.ReLU() still
# fails); an activation promises itself, a family (silu, gelu) any of its members
PROMISES = ((_by_gemma, "the file's Gemma model (Gemma's MLP uses the tanh GELU)",
             "文件里的 Gemma 模型（Gemma 的 MLP 用 tanh 近似的 GELU）"),
            (_by_class_name, "its class name", "它的类名"),
            (_by_attribute, "the attribute that holds it", "存放它的属性名"),
            (_by_own_tanh_gelu, "the tanh GELU your file writes out and never uses",
             "你的文件自己写了却没用上的 tanh 近似 GELU"),
            (_by_gpt2, "the file's GPT-2 model (GPT-2's MLP uses GELU)",
             "文件里的 GPT-2 模型（GPT-2 的 MLP 用 GELU）"),
            (_by_held_class, "the activation module it builds", "它构造的激活函数模块"))


def _promise_findings(ctx: Context, comp: Component, class_name: str, slots: list[Slot], act: str,
                      matched: float) -> list[Finding]:
    gated = is_gated(slots)
    promise = next(((a, en, zh) for rule, en, zh in PROMISES if (a := rule(ctx, class_name, gated))), None)
    if promise is None or promise[0] in (act, ACT_FAMILY[act]):
        return []
    promised, en, zh = promise
    # the line of its forward that applies the activation it computes (`x = torch.relu(x)`), else of its
    # class (`self.act = nn.ReLU()`), else where the diagnosis' patterns find it
    lines = source_lines([getattr(comp.obj, "forward", comp.obj), comp.obj, *ctx.objects(comp, "ffn")])
    number, code = first_line((ACT_WORDS[ACT_FAMILY[act]], *CATALOG["ffn_wrong_activation"].patterns), lines)
    shown = FFN_FORM[gated].format(act=act)
    return [Finding("ffn_wrong_activation", text(
        f"{class_name} computes {act.upper()}: your output equals {shown} (to {matched:.1e}), where {en} "
        f"promises {promised.upper()}",
        f"{class_name} 用的是 {act.upper()}：你的输出等于 {shown}（误差 {matched:.1e}），而{zh}意味着 "
        f"{promised.upper()}"), number, code, f"{act}_for_{promised}")]


FFN_FORM = {True: "down({act}(gate(x)) * up(x))", False: "down({act}(up(x)))"}
# how code names an activation of each family: a call (F.relu, torch.relu, gelu_new) or a module (nn.ReLU)
ACT_WORDS = {"relu": r"(?i)relu", "gelu": r"(?i)gelu", "silu": r"(?i)silu|swish|sigmoid"}



def wrong_branch_findings(ctx: Context, comp: Component, slots: list[Slot], matched: float) -> list[Finding]:
    """A gated FFN's activation on the branch named up, the one named gate unactivated; or, of two
    projections numbered alike, on the later one (Meta's w3, Raschka's fc2): the first is the gate, as
    the GLU paper's W before V, Llama's w1, T5's wi_0; the later one where the checkpoint's names say
    so (LATER_GATE: Qwen's w2). Never for two halves of one projection (`a, b = proj(x).chunk(2)`):
    which half is activated is a convention there (ModernBERT activates its `input` half, x-transformers
    its `gate` half), the same function with the projection's rows swapped."""
    if fused_halves(slots):
        return []
    lines = source_lines(ctx.objects(comp, "ffn"))
    by = {s.role: s.leaf.name.split(".")[-1].lower() for s in slots}
    gate, up = by["FFN W_gate"], by["FFN W_up"]
    swapped = "gate" not in gate and ("up" in gate or "gate" in up)
    numbered = NUMBERED.fullmatch(f"{gate} {up}")  # one stem, two numbers
    later_gate = set(by.values()) in LATER_GATE
    if not (swapped or numbered and (int(numbered[2]) > int(numbered[3])) != later_gate):
        return []
    number, code = locate("gated_activation_wrong_branch", lines)
    return [Finding("gated_activation_wrong_branch", text(
        f"your output equals down(act({gate}(x)) * {up}(x)) (to {matched:.1e}): the activation is on "
        f"{gate}, the branch named as the up projection, and {up} (named as the gate) is not activated",
        f"你的输出等于 down(act({gate}(x)) * {up}(x))（误差 {matched:.1e}）：激活函数作用在了 {gate}"
        f"（名字表明它是 up 投影）上，而名为门控的 {up} 没有经过激活"), number, code)]


# the projections of a checkpoint whose numbered pair gates with the later one: Qwen's (first
# generation) MLP, c_proj(w1(x) * F.silu(w2(x)))
LATER_GATE = ({"w1", "w2", "c_proj"},)


def fused_halves(slots: list[Slot]) -> bool:
    """Whether gate and up are two slices of one projection (a fused Linear chunked or split in two)."""
    by = {s.role: s for s in slots}
    gate, up = by["FFN W_gate"], by["FFN W_up"]
    return gate.leaf is up.leaf and gate.rows is not None


NUMBERED = re.compile(r"(?P<stem>\D*?)_?(\d+) (?P=stem)_?(\d+)")  # two projections named by number: w3 w1
# what a norm's mapping names, by (without parameters, with a bias)
NORM_PARTS = {(False, True): ": weight, bias", (False, False): ": weight",
              (True, True): "", (True, False): ""}


def _build_norm(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's norm, its one norm read as the reference's weights (eps read from it, noted)."""
    module = ctx.build(comp)
    norms = of_kind(leaves(module), "norm")
    slot = norm_slots(norms, 1, [comp.kind], comp.name)[0]
    res.mapping = [slot.leaf.name + NORM_PARTS[isinstance(slot.leaf, Gainless), slot.leaf.bias is not None]]
    bias = slot.bias() if comp.kind == "layernorm" else None
    w = V.NormWeights(slot.weight(), bias, norm_eps(slot.leaf.module, comp.kind), comp.kind)
    held = held_eps(slot.leaf.module) is not None
    res.notes += [text(f"eps = {w.eps:g} (read from your module)",
                       f"eps = {w.eps:g}（从你的模块读取）")] * held

    def run(x: Tensor) -> Tensor | None:
        return fp.first_tensor(ctx.learner.call("forward", module, x), x.dim())

    measured = None if held else measured_eps(run, w)
    eps_readings = [(slot, dataclasses.replace(w, eps=measured))] * (measured is not None)

    # Gemma's RMSNorm keeps its gain as an offset from one, x̂ · (1 + weight), its weight built at zero:
    # read so when the plain reading explains nothing (a 1 + weight built at one is a gain of two)
    offset = dataclasses.replace(w, weight=w.weight + 1)
    fresh = ctx.build(comp, checked=False)
    at_zero = not isinstance(slot.leaf, Gainless) and not any(p.detach().any() for p in fresh.parameters())
    return Subject(run, [(slot, w)] + eps_readings + [(slot, offset)] * at_zero, module,
                   {"offset": offset, "fresh": fresh, "held": held, "default": w.eps})


def _norm_shape(ctx: Context, comp: Component, subject: Subject, x: Tensor, out: Tensor | None,
                ) -> tuple[str, str] | None:
    if out is not None and out.shape == x.shape:
        return None
    got = shape_of(ctx.learner.call("forward", subject.module, x))
    return (f"{comp.name} returned {got} for x of shape {tuple(x.shape)}; a norm keeps the shape",
            f"x 的形状为 {tuple(x.shape)} 时，{comp.name} 返回了 {got}；归一化不改变形状")


def _norm_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                   found: Found) -> None:
    """The step that compares the norm with handformer's on 4 inputs and their gradients."""
    w = found.weights
    if w is subject.facts["offset"]:
        res.status = DIFFERS
        res.notes.append(OFFSET_NOTE)
    if not subject.facts["held"]:
        res.notes.append(EPS_NOTES[w.eps != subject.facts["default"]](w.eps))
    grad_err = _compare_norm(res, subject.run, found.key, w)
    label = NORM_LABELS[w.kind]
    res.checks.append(Check(text(f"matches handformer's {label} on 4 inputs (scales 1, 3, 0.1, sqrt(eps))",
                                 f"在 4 组输入（尺度 1、3、0.1、sqrt(eps)）上与 handformer 的 {label} 一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))
    res.checks.append(Check(text("gradients match handformer's", "梯度与 handformer 一致"), grad_err < 1e-5,
                            error_text(grad_err)))


def _norm_as_built(res: ComponentResult, ctx: Context, comp: Component, subject: Subject,
                   found: Found) -> None:
    """The step that runs the norm as built on two inputs: a norm whose output does not depend on its
    input (a gain built at zero that multiplies x̂ as it is: Gemma's gain kept as an offset from one
    but applied as the gain itself) gives each layer it feeds nothing to learn from. The line of its
    forward that reads the parameter built at zero is quoted."""
    fresh = subject.facts["fresh"]
    a = fp.first_tensor(ctx.learner.call("forward", fresh, fp.randn(2, 3, D, seed=1).float()), 3)
    b = fp.first_tensor(ctx.learner.call("forward", fresh, fp.randn(2, 3, D, seed=2).float()), 3)
    if fp.max_error(a, b) > 0:
        return
    zero = "|".join(n.rpartition(".")[2] for n, p in fresh.named_parameters())  # a norm's gain (and bias)
    number, code = next(((n, t.strip()) for n, t in source_lines([type(fresh).forward])
                         if re.search(rf"self\.({zero})\b", t)), (None, ""))
    most, gain = fp.max_error(a, a * 0), zero.replace("|", ", ")
    en, zh = (f"; line {number} multiplies by it: {code}", f"；第 {number} 行乘以它：{code}") if number else (
        "", "")
    said = text(
        f"built as {comp.name}(...) is, it gives the same output ({most:.3g} at most) for any input: its "
        f"gain ({gain}) starts at zero{en} (a gain kept as an offset from one is applied as 1 + weight)",
        f"按 {comp.name}(...) 刚构建的样子，任何输入的输出都相同（最大 {most:.3g}）：增益（{gain}）初始为 0"
        f"{zh}（按相对 1 的偏移存放的增益应当以 1 + weight 使用）")
    res.checks.append(Check(AS_BUILT, False, said))
    res.findings += [Finding(DEPARTS, said, number, code)] * bool(number)


# what the report says of the eps of a norm that keeps none: read from what it computes, or the default
EPS_NOTES = {
    True: lambda eps: text(f"eps = {eps:g}: your module keeps none, so it was read from what it computes",
                           f"eps = {eps:g}：你的模块没有保存 eps，这个值是从它的计算结果读出的"),
    False: lambda eps: text(f"eps = {eps:g}: your module keeps none, so the default of torch's norm of its "
                            "kind", f"eps = {eps:g}：你的模块没有保存 eps，按 torch 同类归一化的默认值")}
AS_BUILT = text("as built, its output depends on its input", "刚构建时，输出随输入变化")
OFFSET_NOTE = text("the gain is kept as an offset from one, x̂ · (1 + weight), as Gemma's RMSNorm (its weight "
                   "starts at zero): a convention, not an error; compared with handformer's gain 1 + weight",
                   "增益按相对 1 的偏移存放，x̂ · (1 + weight)，和 Gemma 的 RMSNorm 一样（权重从 0 开始）："
                   "这是约定，不是错误；与增益为 1 + weight 的 handformer 归一化比较")
NORM = Probe(
    build=_build_norm,                      # the module, its norm's weights and eps
    inputs=lambda s: norm_probe(D, s.readings[0][1].eps, torch.float64),
    shape=_norm_shape,                      # a norm keeps the shape
    reference=lambda w, x, flags: V.norm(w, x, flags),
    universe=lambda s: V.norm_flags(s.readings[0][1].kind, s.readings[0][1].bias is not None),
    steps=(name_findings, _norm_compared, _norm_as_built,
           localize_step(lambda s, found: localize_norm(s.module, found.weights, found.x))),
)


def check_norm(comp: Component, ctx: Context) -> ComponentResult:
    """LayerNorm or RMSNorm, as the NORM probe states it."""
    return run_probe(NORM, comp, ctx)


# handformer's norm of each kind, built of width D with eps and (a LayerNorm's) bias, and its name
HF_NORMS = {"layernorm": lambda eps, bias: LayerNorm(D, eps, bias=bias),
            "rmsnorm": lambda eps, bias: RMSNorm(D, eps)}
NORM_LABELS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


def _compare_norm(res: ComponentResult, run: Callable[[Tensor], Tensor | None], slot: Slot,
                  w: V.NormWeights) -> float:
    """The largest difference from handformer's norm on 4 inputs (relative to the output's size, at
    least 1) into res; returns the gradients' largest difference on the first."""
    bias = w.bias is not None
    hf = HF_NORMS[w.kind](w.eps, bias).double()
    copy_weights(hf, slot)
    hf.weight.data.copy_(w.weight)  # the reading's gain (1 + weight for a gain kept as an offset)
    errors, grad_err = [], 0.0
    cases = [(2, 5, 1.0), (1, 1, 3.0), (3, 7, 0.1), (2, 4, max(w.eps, 1e-12) ** 0.5)]
    for i, (B, T, scale) in enumerate(cases):
        x = (fp.randn(B, T, D, seed=10 + i) * scale + 0.5 * scale).requires_grad_()
        with torch.enable_grad():
            mine, ref = run(x), hf(x)
            errors.append(fp.max_error(mine, ref) / max(1.0, float(ref.detach().abs().max())))
            if i == 0 and mine is not None and mine.shape == ref.shape:
                g = fp.randn(*ref.shape, seed=5)
                gains = not isinstance(slot.leaf, Gainless)  # a norm without parameters: none to compare
                params = ([slot.leaf.weight] + ([slot.leaf.bias] if bias else [])) * gains
                hf_params = ([hf.weight] + ([hf.bias] if bias else [])) * gains
                grad_err = grads_error(list(zip(
                    torch.autograd.grad((mine * g).sum(), [x] + params, allow_unused=True),
                    torch.autograd.grad((ref * g).sum(), [x] + hf_params))))
    res.max_abs_error = max(errors)
    return grad_err


PE_FLAGS = ("pe_sin_cos_swapped", "pe_wrong_frequency:pair_index", "pe_wrong_frequency:dim_index",
            "pe_wrong_frequency:positive", "pe_wrong_frequency:not_divided", "pe_wrong_frequency:doubled")


PE_B, PE_T = 2, 12  # the batch and length the table is read at
PE_SIZES = {**SIZES, "pad_id": 0}  # an encoding of token ids may ask for the padding index (fairseq's)
PE_WORDS = {"paper": ("the paper's table", "论文的编码表"),
            "halves": ("sines and cosines in halves, [sin | cos], at the paper's frequencies (Marian's, "
                       "a torch.cat of the two)",
                       "正弦和余弦各占一半 [sin | cos]，频率与论文相同（Marian 的写法，torch.cat 两者）"),
            "t2t": ("tensor2tensor's timing signal (fairseq's, Whisper's): sines and cosines in halves, "
                    "[sin | cos], the timescales from 1 to 10000 over d_model/2 - 1 steps",
                    "tensor2tensor 的 timing signal（fairseq、Whisper 也这样写）：正弦和余弦各占一半 "
                    "[sin | cos]，时间尺度从 1 到 10000，分 d_model/2 - 1 步")}


def _build_pe(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's positional encoding as x -> x + PE[:T]: a module of x; a module that returns
    the table for token ids (hyunwoongko's; fairseq's, its positions after the padding index), noted;
    a function that makes the table, (length, d_model) in either order (the TensorFlow tutorial's
    positional_encoding, Whisper's sinusoids). No weights: the readings are the table's layouts
    (PE_LAYOUTS) and, for token ids after a padding index, the first position."""
    if not isinstance(comp.obj, type):
        return _pe_function(comp, ctx)
    module = ctx.build(comp, PE_SIZES)
    ids = _table_of_ids(res, module, PE_B, PE_T)
    first = ids is None and _sequence_first(res, ctx, module)

    def run(x: Tensor) -> Tensor | None:
        if ids is not None:
            table = fp.first_tensor(ctx.learner.call("forward", module, ids))
            return then(table, lambda t: x + t)
        if first:  # (T, B, D) in and out: PyTorch's tutorial
            return fp.first_tensor(ctx.learner.call("forward", module, x.transpose(0, 1))).transpose(0, 1)
        return fp.first_tensor(ctx.learner.call("forward", module, x))

    # an encoding of token ids built with a padding index counts its positions after it (fairseq's)
    padded = ids is not None and "pad_id" in argument_keys(comp.obj).values()
    offsets = (0, PE_SIZES["pad_id"] + 1) if padded else (0,)
    readings = [((layout, k), (layout, k)) for layout in V.PE_LAYOUTS for k in offsets]
    return Subject(run, readings, module, {"build": lambda: ctx.build(comp, PE_SIZES), "owner": type(module),
                                           "padded": padded})


def _pe_function(comp: Component, ctx: Context) -> Subject:
    """A function that makes the table: called with (length, d_model) or (d_model, length), whichever
    gives a (length, d_model) table (a batch axis of 1 allowed); else with (length, d_model), its
    error or its output the learner's."""
    fn = comp.obj
    made = [_table_from(fp.quietly(lambda order=order: fn(*order))) for order in ((MAX_LEN, D), (D, MAX_LEN))]
    table = next(filter(lambda t: t is not None, made), None)
    if table is None:
        out = ctx.learner.call("forward", fn, MAX_LEN, D)
        raise ctx.learner.fail("forward", f"{comp.name}({MAX_LEN}, {D}) returned {shape_of(out)}; expected "
                               f"the table ({MAX_LEN}, {D})", f"{comp.name}({MAX_LEN}, {D}) 返回了 "
                               f"{shape_of(out)}；应当返回编码表 ({MAX_LEN}, {D})")
    readings = [((layout, 0), (layout, 0)) for layout in V.PE_LAYOUTS]
    return Subject(lambda x: x + table[: x.size(1)], readings, None,
                   {"build": lambda: fn(MAX_LEN, D), "owner": fn})


PE_TABLE_SHAPES = {(MAX_LEN, D), (1, MAX_LEN, D), (MAX_LEN, 1, D)}


def _table_from(out: object) -> Tensor | None:
    """A (length, d_model) table from what a function returned (a tensor or an array, (L, D),
    (1, L, D) or (L, 1, D)); None for anything else."""
    # None, a tuple of tensors: no table (an empty one, of no table's shape)
    table = quietly(lambda: torch.as_tensor(out, dtype=torch.float64), (TypeError, ValueError, RuntimeError),
                    torch.zeros(0))
    return table.reshape(MAX_LEN, D) if tuple(table.shape) in PE_TABLE_SHAPES else None


def _sequence_first(res: ComponentResult, ctx: Context, module: object) -> bool:
    """Whether the encoding reads its input (T, B, D): on zeros (B, T, D) it returns rows that are
    one position each, equal along dim 1 (a table (max_len, 1, D) indexed by x.size(0)); noted."""
    zeros = torch.zeros(PE_B, PE_T, D, dtype=torch.float64)
    out = fp.first_tensor(ctx.learner.call("forward", module, zeros))
    first = out is not None and out.shape == zeros.shape and torch.allclose(out, out[:, :1].expand_as(out)) \
        and not torch.allclose(out[0], out[1])
    res.notes += [SEQUENCE_FIRST] * first
    return first


def _pe_shape(ctx: Context, comp: Component, subject: Subject, x: Tensor, table: Tensor | None,
              ) -> tuple[str, str] | None:
    if table is not None and table.shape[-2:] == (PE_T, D):
        return None
    shape = (PE_B, PE_T, D)
    return (f"{comp.name} returned {getattr(table, 'shape', table)} for x of shape {shape}; expected "
            f"x + PE[:T], shape {shape}",
            f"x 的形状为 {shape} 时，{comp.name} 返回了 {getattr(table, 'shape', table)}；应当是 x + PE[:T]，"
            f"形状 {shape}")


def _pe_compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                 ) -> None:
    """The step that compares the table with handformer's (or with its layout's, DIFFERS) and checks
    forward(x) = x + PE[:T] (a module's; a function's table is added here)."""
    pe, T = found.out, PE_T
    expected, (en, zh) = _pe_expected(res, found)
    x = fp.randn(PE_B, T, D, seed=3)
    out = subject.run(x)
    added = fp.max_error(out, x + pe)  # inf where it returned no tensor
    table_error = fp.max_error(pe, expected)
    same = text(f"the table equals {en} for {T} positions", f"前 {T} 个位置的编码表与{zh}一致")
    res.checks.append(Check(same, table_error < 1e-5, error_text(table_error)))
    res.max_abs_error = max(table_error, added)
    res.checks += [Check(text("forward(x) returns x + PE[:T]", "forward(x) 返回 x + PE[:T]"), added < 1e-5,
                         error_text(added))] * (subject.module is not None)


def _pe_expected(res: ComponentResult, found: Found) -> tuple[Tensor, tuple[str, str]]:
    """The table of the layout and first position the search read (handformer's sinusoidal_table
    for the paper's from position 0); another is a convention: DIFFERS, said in res."""
    layout, offset = found.key if found.matched is not None else ("paper", 0)
    if (layout, offset) == ("paper", 0):
        return sinusoidal_table(MAX_LEN, D).double()[:PE_T], ("handformer's sinusoidal_table",
                                                              " handformer 的 sinusoidal_table ")
    res.status = DIFFERS
    res.convention = text(*PE_WORDS[layout])
    res.notes += [text(f"its positions start at {offset} (fairseq's: after the padding index)",
                       f"它的位置从 {offset} 开始（fairseq 的写法：在填充下标之后）")] * (offset > 0)
    return V.sinusoidal(PE_T + offset, D, layout=layout)[offset:], ("the table of this convention",
                                                                     "这种写法的编码表")


def _pe_frequencies(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                    ) -> None:
    """The step that, for a table no variant explains whose columns are still the sines and cosines
    of the positions in one of the layouts, at frequencies of their own (a sign dropped, a divisor of
    another width), names the frequencies: the form the catalogue has no variant of."""
    unexplained = subject.readings * (found.matched is None)
    errors = [_sinusoid_error(found.out, layout) for (layout, _), _ in unexplained]
    if min(errors, default=float("inf")) < SINUSOID_TOL:
        correct = fp.max_error(found.out, found.reference(frozenset()))
        res.findings += ctx.findings(frozenset({"pe_wrong_frequency:own"}), min(errors), correct, comp)


# the learner's float32 angles drift by a few ulp of pos·freq (up to ~3e4 at 12 positions)
SINUSOID_TOL = 1e-2
# a (T, D) table's sines and cosines in a layout (the paper's interleaved, else in halves)
SPLITS = {"paper": lambda t: (t[:, 0::2], t[:, 1::2])}


def _halves_of(t: Tensor) -> tuple[Tensor, Tensor]:
    return t[:, : t.shape[1] // 2], t[:, t.shape[1] // 2:]


def _sinusoid_error(table: Tensor, layout: str) -> float:
    """How far a (T, D) table is from sin(pos·w) and cos(pos·w) in the layout, positions from 0, for
    the frequencies w its second row gives (each angle mod 2π: at whole positions that is the
    table)."""
    sines, cosines = SPLITS.get(layout, _halves_of)(table.double())
    w = torch.atan2(sines[1], cosines[1])
    angles = torch.arange(table.shape[0], dtype=torch.float64)[:, None] * w
    return max(fp.max_error(sines, angles.sin()), fp.max_error(cosines, angles.cos()))


POSITIONAL_ENCODING = Probe(
    build=_build_pe,
    inputs=lambda s: torch.zeros(PE_B, PE_T, D, dtype=torch.float64),
    shape=_pe_shape,
    observe=lambda table: table.reshape(-1, PE_T, D)[0],  # (T, D)
    reference=lambda w, x, flags: V.sinusoidal(PE_T + w[1], D, flags, layout=w[0])[w[1]:],
    universe=lambda s: PE_FLAGS,
    steps=(name_findings, _pe_frequencies, _pe_compared,
           # a table of positions counted after a padding index is read in the forward, which the
           # build's trace does not see: not localized
           localize_step(lambda s, found: None if s.facts.get("padded") else localize_table(
               s.facts["build"], s.facts["owner"], D))),
)


def check_positional_encoding(comp: Component, ctx: Context) -> ComponentResult:
    """The sinusoidal positional encoding, as the POSITIONAL_ENCODING probe states it."""
    return run_probe(POSITIONAL_ENCODING, comp, ctx)


def _table_of_ids(res: ComponentResult, module: torch.nn.Module, B: int, T: int) -> Tensor | None:
    """Token ids (B, T) when the module returns the table for ids, (T, D) (the style of hyunwoongko's
    PositionalEncoding, whose embedding adds it) or (B, T, D) (fairseq's), and refuses x (B, T, D) or
    gives it another shape; noted in res; else None."""
    of_x = fp.quietly(lambda: module(torch.zeros(B, T, D)))  # None where their forward refuses x
    ids = torch.full((B, T), 5, dtype=torch.long)  # no padding index (fairseq's counts positions past pads)
    out = fp.quietly(lambda: module(ids))  # None where it refuses ids too: the check reports the refusal of x
    if not isinstance(out, Tensor) or tuple(out.shape) not in ((T, D), (B, T, D)):
        return None
    if isinstance(of_x, Tensor) and of_x.shape == out.shape:  # x read as x (a table returned unadded: FAIL)
        return None
    res.notes.append(text("forward(ids) returns the table of the ids' positions, which the embedding adds "
                          "(hyunwoongko's, fairseq's): checked as x + forward(ids)",
                          "forward(ids) 返回这些 id 所在位置的编码表，由嵌入层相加"
                          "（hyunwoongko、fairseq 的写法）：按 x + forward(ids) 检查"))
    return ids
