"""The runner of the mask helpers of the model-assembly chapter: `make_src_mask(src, pad_idx)` (the
source's padding, over the keys), `make_tgt_mask(tgt, pad_idx)` (the target's padding and the causal
part, combined) and `create_masks(src, tgt, pad_idx)` (both, as a tuple).

The helper is called on token ids padded with the pad id 1 (not 0, so a helper that assumes 0 shows
it), and its output is read as a mask that may be (B, 1, 1, S), (B, 1, S) or (B, S) for the source
and (B, 1, T, T) or (B, T, T) for the target, in the polarity it uses (True or 1 = keep, or True =
masked, as torch.nn's; an additive 0 / -inf mask). Compared with what the attention is meant to
see; when it differs, the variants with one or two named mistakes are tried: padding from the wrong
sequence or a pad id of 0 assumed, padding and the causal part combined with | instead of & (in the
keep polarity; & instead of | in the masked one), the causal part off by one. A target mask that is
causal only is a convention: with padding at the end, causality already hides it from every real
query.

Shape legend: B batch, S source length, T target length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, finish, forward_parameters, named, names_of
from handformer.check.core.conventions import file_masks_where_true, is_lengths_name
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.helper_use import helper_use
from handformer.check.core.probe import Found, Probe, Subject, drive
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import locate, source_lines, source_text

PAD = 1  # the pad id handed to a helper that takes one (a helper without one is given ids padded with 0)


def src_ids(pad: int) -> Tensor:
    return torch.tensor([[5, 6, 7, pad, pad], [2, 3, 4, 8, 9]])  # (B, S): row 0 padded after 3 tokens


def tgt_ids(pad: int) -> Tensor:
    return torch.tensor([[3, 5, pad, pad, pad], [2, 4, 6, 8, pad]])  # (B, T), T = S: a swap still runs


SRC, TGT = src_ids(PAD), tgt_ids(PAD)
SRC_NAMES = ("src", "source", "src_seq", "x", "src_ids", "input_ids", "inp", "enc_input", "seq", "tokens",
             "seq_k", "k_seq", "key_seq", "keys")
# graykode's get_attn_pad_mask(seq_q, seq_k): the queries' ids beside the keys' (the source's padding,
# one row a query): given the source ids too, as the encoder's self-attention has them
QUERY_NAMES = ("seq_q", "q_seq", "query_seq", "queries")
TGT_NAMES = ("tgt", "trg", "target", "tgt_seq", "tgt_ids", "dec_input", "y", "tgt_input")
PAD_NAMES = ("pad_idx", "pad_id", "pad", "padding_idx", "pad_token_id", "pad_index", "src_pad_idx",
             "tgt_pad_idx", "trg_pad_idx", "blank")
# Hugging Face's attention_mask, T5's extended mask helper's `mask`: the padding as a mask (1 = token,
# 0 = pad) where ids would be: handed (ids != pad).long()
PADDING_NAMES = ("mask", "attention_mask", "attn_mask", "padding_mask", "pad_mask", "input_mask")
# the number of queries a decoder-only helper is handed beside the padding (Hugging Face's
# build_4d_mask(attention_mask, q_len): the last q_len of the S positions ask): the ids' length
LENGTH_NAMES = ("q_len", "query_len", "query_length", "tgt_len", "seq_len", "length")
# what the helper is handed in place of ids: the ids, (where it takes a padding mask) 1 = token, or
# (where it takes lengths, WeNet's make_pad_mask(lengths)) the number of tokens of each row
# (takes a padding mask, takes lengths) -> what it is handed
GIVEN = {(False, False): lambda ids, pad: ids, (True, False): lambda ids, pad: (ids != pad).long(),
         (True, True): lambda ids, pad: (ids != pad).long(),
         (False, True): lambda ids, pad: (ids != pad).sum(-1)}
TGT_HINTS = ("tgt", "trg", "target", "std", "decoder", "dec", "look_ahead", "subsequent")
BOTH_HINTS = ("create_masks", "make_masks", "create_mask", "build_masks", "get_masks", "masks")
FLAGS = ("mask_pad_wrong_sequence", "mask_pad_id", "mask_combined_with_or", "causal_off_by_one:no_self",
         "causal_off_by_one:sees_next")
POLARITIES: dict[str, Text] = {
    "keep": text("True (or 1) = may be seen", "True（或 1）= 可以看"),
    "masked": text("True = masked (torch.nn's)", "True = 屏蔽（torch.nn 的约定）"),
    "additive": text("additive: 0 = seen, -inf (or a large negative) = masked",
                     "加性掩码：0 = 可以看，-inf（或很大的负数）= 屏蔽"),
}


def _causal(T: int, flags: frozenset[str]) -> Tensor:
    diagonal = {"causal_off_by_one:no_self": -1, "causal_off_by_one:sees_next": 1}.get(
        next((f for f in flags if f.startswith("causal_off_by_one")), ""), 0)
    return torch.ones(T, T, dtype=torch.bool).tril(diagonal)


def _padding(ids: Tensor, pad: int, flags: frozenset[str]) -> Tensor:
    """(B, 1, 1, L) keep: the real tokens of ids, the pad id 0 assumed with mask_pad_id."""
    return (ids != (0 if "mask_pad_id" in flags else pad))[:, None, None, :]


def expected_src(pad: int, flags: frozenset[str] = frozenset()) -> Tensor:
    """(B, 1, 1, S) keep: the source's real tokens, as each variant computes them."""
    src, tgt = src_ids(pad), tgt_ids(pad)
    return _padding(tgt if "mask_pad_wrong_sequence" in flags else src, pad, flags)


def expected_tgt(pad: int, flags: frozenset[str] = frozenset()) -> Tensor:
    """(B, 1, T, T) keep: the target's real keys and the causal part, as each variant computes them
    (`causal_only`: the causal part alone)."""
    src, tgt = src_ids(pad), tgt_ids(pad)
    T = tgt.size(1)
    padding = _padding(src if "mask_pad_wrong_sequence" in flags else tgt, pad, flags)
    causal = _causal(T, flags)[None, None]
    if "causal_only" in flags:
        return causal.expand(tgt.size(0), 1, T, T)
    return padding | causal if "mask_combined_with_or" in flags else padding & causal


CAUSAL_ONLY = frozenset({"causal_only"})  # a convention, not a mistake: the source mask ignores it


@dataclass(frozen=True)
class Side:
    """What differs between the source mask and the target mask."""

    what: str
    zh: str  # 源 / 目标, before 端掩码
    shapes: str  # the shapes it may be read in
    queries: tuple[int, ...]  # the query rows it may have (a source mask: one, or one per query)
    flags: tuple[str, ...]  # the named mistakes it can carry
    expected: Callable[[int, frozenset[str]], Tensor]


SIDES = {"src": Side("source", "源", "(B, 1, 1, S), (B, 1, S) or (B, S)", (1, SRC.size(1)), FLAGS[:2],
                     expected_src),
         "tgt": Side("target", "目标", "(B, 1, T, T) or (B, T, T)", (TGT.size(1),), FLAGS, expected_tgt)}


class Helper:
    """The learner's helper: which masks it makes (src, tgt or both) and how to call it."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        params = forward_parameters(comp.obj)
        names, required = names_of(params)
        first = (names + [None])[0]  # the ids of a helper whose argument has none of the names
        self.src, self.tgt, self.pad, self.queries, self.mask_arg, self.length = (
            named(names, table) for table in (SRC_NAMES, TGT_NAMES, PAD_NAMES, QUERY_NAMES, PADDING_NAMES,
                                              LENGTH_NAMES))
        self.lengths = next((n for n in names if is_lengths_name(n)), None)
        self.given = GIVEN[bool(self.mask_arg), bool(self.lengths)]
        if _mentions(comp.name, BOTH_HINTS) and self.src and self.tgt:
            self.makes = "both"
        elif self.tgt or _mentions(comp.name, TGT_HINTS):
            self.makes, self.tgt, self.src = "tgt", self.tgt or self.src or first, None
        else:
            self.makes, self.src = "src", self.src or first
        known = {self.src, self.tgt, self.pad, self.queries, self.mask_arg, self.length, self.lengths}
        if self.length and self.makes == "src" and _per_query(self()):  # its rows differ: the causal one
            self.makes, self.tgt, self.src = "tgt", self.src, None
        cannot_fill(comp.name, required, known, names, "src", (  # no names: no ids to hand it
            "a mask helper takes the token ids (src, tgt) and the pad id (pad_idx, pad_id, ...)",
            "掩码辅助函数接受 token id（src、tgt）和 pad id（pad_idx、pad_id 等）"))

    @property
    def pad_id(self) -> int:
        return PAD if self.pad else global_pad(self.comp.obj)[1]

    def __call__(self, layout: Callable[[Tensor], Tensor] = lambda ids: ids) -> Any:
        """Its masks for ids (B, S), or as `layout` gives them ((S, B): Tensor.t)."""
        src, tgt = (self.given(layout(ids(self.pad_id)), self.pad_id) for ids in (src_ids, tgt_ids))
        given = ((self.src, src), (self.tgt, tgt), (self.pad, PAD), (self.queries, src),  # (B, S) or (S, B)
                 (self.length, TGT.size(1)))
        kwargs = {name: value for name, value in given if name}
        return self.ctx.learner.call("forward", self.comp.obj, **kwargs)


def _per_query(out: Any) -> bool:
    """Whether a mask (..., queries, keys) gives its first query other keys than its last: a causal
    mask, not padding alone repeated a query; False for what is no such tensor."""
    return isinstance(out, Tensor) and out.dim() > 2 and not torch.equal(out[..., 0, :], out[..., -1, :])


def _mentions(name: str, words: tuple[str, ...]) -> bool:
    return any(w in name.lower() for w in words)


def _observed(out: Any, rows: int, queries: int, keys: int) -> tuple[Tensor, tuple[str, ...]] | None:
    """The learner's mask as (B, 1, queries, keys), 1 where it is nonzero (0 where an additive mask
    is, that is where it keeps), with the polarities it could mean; None when its shape is none of
    the mask shapes."""
    if not isinstance(out, Tensor):
        return None
    m = out.detach()
    if m.shape == (rows, keys):  # (B, S): a key padding mask
        m = m[:, None, None, :]
    elif m.dim() == 3 and m.size(0) == rows and m.size(-1) == keys:
        m = m[:, None]
    if m.dim() != 4 or m.size(0) not in (1, rows) or m.size(-1) != keys or m.size(-2) not in (1, queries):
        return None
    m = m.expand(rows, m.size(1), queries, keys)[:, :1]
    if m.is_floating_point() and bool((torch.isinf(m) | (m < -1e3)).any()):
        return (m == 0).double(), ("additive",)
    return (m != 0).double(), ("keep", "masked")


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "mask_helper", "causal_mask")))
    return Finding(name, observed, number, code, form)




class Impossible(RuntimeError):
    """A mistake with a mask that is causal only: not searched."""


Inputs = tuple[Side, int]  # the side, the pad id
Reading = tuple[str, frozenset[str], torch.Size]  # the polarity, CAUSAL_ONLY or nothing, the mask's shape


def _subject(ctx: Context, comp: Component, out: Any, side: Side, use: str | None) -> Subject:
    """One of the helper's masks as the probe reads it; a failure when its shape is none of the side's.
    `use`: the polarity the file's use of it says (core/helper_use.py), the one a bool or 0/1 mask is
    read in."""
    seen = next((o for q in side.queries if (o := _observed(out, SRC.size(0), q, SRC.size(1)))), None)
    if seen is None:
        raise _no_reading(ctx, comp, out, side)
    mask, polarities = seen
    polarities = tuple(p for p in polarities if p == use) or polarities
    readings = [((p, c), (p, c, mask.shape)) for p in polarities for c in (frozenset(), CAUSAL_ONLY)]
    return Subject(lambda x: mask, readings)


def _reference(reading: Reading, x: Inputs, flags: frozenset[str]) -> Tensor:
    """The mask as each variant computes it, in the reading's polarity (1 = nonzero)."""
    (polarity, convention, shape), (side, pad) = reading, x
    if convention and flags:
        raise Impossible(flags)
    keep = side.expected(pad, flags | convention).expand(shape) ^ ("mask_inverted" in flags)
    return (~keep if polarity == "masked" else keep).double()


def _compared(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """The step that checks the mask against the right one in the polarity found and names the
    mistakes found (a target mask that is causal only is noted, not counted)."""
    (polarity, convention), (side, pad) = found.key, found.x
    res.convention = POLARITIES[polarity]
    keep = found.out.bool() if polarity != "masked" else ~found.out.bool()
    right = side.expected(pad, frozenset()).expand_as(keep)
    wrong = int((keep != right).sum())
    if convention and found.matched is not None:
        res.notes.append(CAUSAL_ONLY_NOTE)
        wrong = 0
    res.checks.append(Check(text(f"the {side.what} mask hides what the attention must not see (pad id {pad})",
                                 f"{side.zh}端掩码屏蔽了注意力不该看到的位置（填充 id 为 {pad}）"),
                            wrong == 0, text(f"{wrong} entries differ", f"{wrong} 个位置不同")))
    if found.matched is None:
        res.notes.append(text(f"no known mistake (or pair of them) reproduces your {side.what} mask",
                              f"没有任何已知错误（或两个错误的组合）能复现你的{side.zh}端掩码"))
    row, good = ("".join(str(int(v)) for v in mask[0, 0, -1].tolist()) for mask in (keep, right))
    for flag in sorted(found.flags):
        name, _, form = flag.partition(":")
        form = ("and" if polarity == "masked" else "or") if name == "mask_combined_with_or" else form
        res.findings.append(_finding(ctx, comp, name, text(
            f"your {side.what} mask equals the one with this mistake ({wrong} entries differ from the right "
            f"one; the last query of row 0 sees {row} where {good} is right, 1 = seen)",
            f"你的{side.zh}端掩码与带这个错误的掩码一致（与正确的掩码有 {wrong} 个位置不同；"
            f"行 0 最后一个查询看到的是 {row}，应为 {good}，1 = 可以看）"), form))


CAUSAL_ONLY_NOTE = text("the target mask is causal only: with the padding at the end, causality already "
                        "hides it from every real query",
                        "目标端掩码只有因果部分：填充都在末尾，因果掩码已经对每个真实查询屏蔽了它")
MASK_HELPER = Probe(                        # built by check_mask_helper: one subject a mask it makes
    inputs=lambda s: s.facts["x"],
    shape=lambda ctx, comp, s, x, out: None,  # read by _subject, which refuses a shape of no mask
    reference=_reference,
    universe=lambda s: s.facts["universe"],
    steps=(_compared,),
    deterministic=False,
)


def _no_reading(ctx: Context, comp: Component, out: Any, side: Side) -> Exception:
    shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
    return ctx.learner.fail("forward", f"{comp.name} returned {shape} for the {side.what} mask; expected "
                            f"{side.shapes}", f"{comp.name} 给{side.zh}端掩码返回了 {shape}；"
                            f"应当是 {side.shapes}")


def global_pad(fn: Any) -> tuple[str | None, int]:
    """(name, value) of the module-level pad id a helper without a pad argument reads (PyTorch's
    translation tutorial's PAD_IDX = 1), else the one pad id its module holds (a helper that writes
    `src == 0` beside the module's PAD_IDX = 1 must mask 1: its data is padded so); (None, 0) when it
    reads none and its module holds no pad id, or pad ids that disagree."""
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    values = getattr(fn, "__globals__", {})
    held = {n: v for n, v in values.items() if n.lower() in PAD_NAMES and type(v) is int}
    reads = [n for n in names if n.lower() in PAD_NAMES]  # a pad id of its own: the module's, or an attribute
    alone = list(held)[:len(set(held.values())) == 1 and not reads]  # the module's one pad id, or none
    name = ([n for n in reads if n in held] + alone + [None])[0]
    return name, held.get(name, 0)


def _torch_form(out: Any) -> bool:
    """The four masks of PyTorch's translation tutorial's create_mask: (src_mask (S, S), tgt_mask
    (T, T), src_padding_mask (B, S), tgt_padding_mask (B, T)), torch.nn's True (or -inf) = masked."""
    items = out if isinstance(out, (tuple, list)) else ()
    shapes = [tuple(m.shape) if isinstance(m, Tensor) else None for m in items]
    (B, S), T = SRC.shape, TGT.size(1)
    return shapes == [(S, S), (T, T), (B, S), (B, T)]


def _from_torch(out: Any) -> tuple[Tensor, Tensor]:
    """Those four masks as two (B, 1, T|S, S) keeps, True = may attend: attention and padding together."""
    def keep(m: Tensor) -> Tensor:
        return m == 0 if m.is_floating_point() else ~m.bool()  # (T, S)

    src_attn, tgt_attn, src_pad, tgt_pad = out
    return (keep(src_attn)[None, None] & ~src_pad.bool()[:, None, None, :],  # (B, 1, S, S)
            keep(tgt_attn)[None, None] & ~tgt_pad.bool()[:, None, None, :])  # (B, 1, T, T)


TORCH_FORM_NOTE = text("read as torch.nn's four masks (src_mask, tgt_mask, src_padding_mask, "
                       "tgt_padding_mask; True or -inf = masked), each attention mask combined with its "
                       "padding mask",
                       "按 torch.nn 的四个掩码读取（src_mask、tgt_mask、src_padding_mask、tgt_padding_mask；"
                       "True 或 -inf = 屏蔽），每个注意力掩码与它的填充掩码合在一起")


SEQUENCE_FIRST_NOTE = text("it reads its ids sequence-first, (S, B), as nn.Transformer does by default "
                           "(PyTorch's translation tutorial): called so",
                           "它按序列维在前的 (S, B) 读取 id，和 nn.Transformer 的默认布局一样"
                           "（PyTorch 翻译教程的写法）：按这种布局调用")


def _sequence_first(helper: Helper) -> Any:
    """What the helper returns for ids given sequence-first, (S, B); None when it raises."""
    return quietly(lambda: helper(Tensor.t), fp.LearnerFailure)


def _pair(res: ComponentResult, ctx: Context, comp: Component, helper: Helper, out: Any) -> Any:
    """The (src_mask, tgt_mask) a helper of both masks returns: read sequence-first, or from torch.nn's
    form, where it gives them so (with a note)."""
    if not _torch_form(out) and _torch_form(flipped := _sequence_first(helper)):
        out = flipped
        res.notes.append(SEQUENCE_FIRST_NOTE)
    if _torch_form(out):
        out = _from_torch(out)
        res.notes.append(TORCH_FORM_NOTE)
    if not isinstance(out, (tuple, list)) or len(out) < 2:
        raise ctx.learner.fail("forward", f"{comp.name} returned {type(out).__name__}; expected "
                               "(src_mask, tgt_mask)",
                               f"{comp.name} 返回了 {type(out).__name__}；应当返回 (src_mask, tgt_mask)")
    return out


def _use(res: ComponentResult, ctx: Context, comp: Component) -> str | None:
    """The polarity the helper's masks are read in: what its file does with its result, else 'masked'
    where the file fills where its masks are True; none for torch.nn's four masks (read as keeps
    already). The reading the file's use says is noted."""
    source = source_text(ctx.module)
    said = None if TORCH_FORM_NOTE in res.notes else helper_use(source, comp.name)
    shown = POLARITIES.get(said or "keep")
    res.notes += [text(f"read as your file uses what {comp.name} returns: {shown['en']}",
                       f"按你的文件使用 {comp.name} 结果的方式读取：{shown['zh']}")] * bool(said)
    where_true = TORCH_FORM_NOTE not in res.notes and file_masks_where_true(source)
    return said or {True: "masked"}.get(where_true)


def check_mask_helper(comp: Component, ctx: Context) -> ComponentResult:
    """The mask helper, as the MASK_HELPER probe states it for each mask it makes."""
    res = ctx.result(comp)
    helper = Helper(comp, ctx)
    out = helper()
    masks = zip(("src", "tgt"), _pair(res, ctx, comp, helper, out)) if helper.makes == "both" else (
        (helper.makes, out),)
    use = _use(res, ctx, comp)
    for which, mask in masks:
        subject = _subject(ctx, comp, mask, SIDES[which], use)
        impossible = {"mask_pad_wrong_sequence": helper.makes != "both", "mask_pad_id": helper.pad_id == 0}
        subject.facts["x"] = (SIDES[which], helper.pad_id)
        subject.facts["universe"] = tuple(f for f in SIDES[which].flags if not impossible.get(f)) + (
            ("mask_inverted",) * (subject.readings[0][0][0] == "masked"))  # read in torch.nn's only
        drive(MASK_HELPER, res, ctx, comp, subject)
    if helper.lengths:
        res.notes.append(text(f"{comp.name} takes lengths ({helper.lengths}), not ids: handed the number of "
                              "tokens of each row", f"{comp.name} 接受的是长度（{helper.lengths}），不是 id："
                              "传入每一行的 token 数"))
    elif helper.mask_arg:
        res.notes.append(text(f"{comp.name} takes the padding as a mask ({helper.mask_arg}: 1 = token, 0 = "
                              "padding, Hugging Face's attention_mask), not ids: handed one",
                              f"{comp.name} 接受的是填充掩码（{helper.mask_arg}：1 = token，0 = 填充，"
                              "即 Hugging Face 的 attention_mask），不是 id：按这种方式传入"))
    elif helper.pad is None:
        name, pad = global_pad(comp.obj)
        en, zh = {None: ("", "")}.get(name, (f" (your module's {name})", f"（你的模块级 {name}）"))
        res.notes.append(text(f"{comp.name} takes no pad id: it was given ids padded with {pad}{en}",
                              f"{comp.name} 没有填充 id 参数：传入的 id 用 {pad} 填充{zh}"))
    return finish(res)
