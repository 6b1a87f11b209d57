"""Runner for rotary position embeddings (RoPE), in the three shapes learners write them:

- a table function: Meta's `precompute_freqs_cis(dim, end, theta)` (complex, (end, dim/2)), or one
  returning (cos, sin);
- an apply function: Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin)`, Meta's
  `apply_rotary_emb(xq, xk, freqs_cis)`, or `apply_rotary(x, cos, sin)`;
- a module, `RotaryEmbedding(dim, max_seq_len, base)`, whose forward returns the table (cos, sin)
  or the rotated input.

Pairs are either half-split (dimension j with j + d/2: Hugging Face, handformer) or interleaved (2j
with 2j + 1: Meta's complex numbers): a convention, reported as such. Named mistakes: a wrong base or
exponent of the frequencies, positions that ignore the offset, the rotation the wrong way.

Shape legend: B batch, H heads, T length, Dh head dim (d), P positions of a table.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_names, shape_of
from handformer.check.core.defaults import then
from handformer.check.core.discovery import Component, DiscoveryError, argument_keys
from handformer.check.core.localize_kinds import localize_rope_table, localize_rotation, note_departure
from handformer.check.core.result import DEPARTS, DIFFERS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.rope_tables import COMPLEX_TABLE_NAMES
from handformer.check.core.rotary import geometric_base, stated_base
from handformer.check.core.shared_permutation import shared_permutation
from handformer.check.core.source import first_line, locate, source_lines, source_text
from handformer.check.core.weights import MappingError
from handformer.check.reference import variants as V
from handformer.check.runners.rope_scaling import (
    SCHEDULES,
    band_departs,
    frequency_buffer,
    named_schedule,
    schedule_words,
    scheduled,
)
from handformer.config import Llama3RopeScaling

B, H, T, DH, P, THETA, OFFSET = 2, 3, 5, 16, 64, 10000.0, 3
TOL = 1e-5  # float32 tables: angles up to P rad
LENGTH_NAMES = ("end", "seq_len", "seqlen", "max_len", "max_seq_len", "length", "n", "t",
                "max_position_embeddings", "max_positions", "n_positions", "context_length", "block_size",
                "max_seq_length", "T")
OFFSET_NAMES = ("offset", "start_pos", "start", "pos_offset", "past_length", "cache_len", "seqlen_offset",
                "past_key_values_length", "position_offset")
DIM_NAMES = ("dim", "head_dim", "d", "d_head", "rotary_dim", "dims", "head_size", "d_k",
             "n_elem")  # gpt-fast's
THETA_NAMES = ("theta", "base", "rope_theta", "rope_base")
# the positions a rotary module's forward takes, (B, T) or (T,): Hugging Face's position_ids, or named so
ID_NAMES = ("position_ids", "positions", "pos_ids")
OFFSET_ARGS = (*OFFSET_NAMES, "position_ids")  # a module told where its positions start
TENSOR_NAMES = ("x", "q", "k", "xq", "xk", "query", "key", "input", "hidden", "tensor", "queries", "keys",
                "hidden_states", "query_layer", "key_layer")  # the last two: Hugging Face BERT's


def _takes(names: list[str], aliases: tuple[str, ...]) -> bool:
    """Whether one of the argument names is one of the aliases."""
    return not set(names).isdisjoint(aliases)


def _filled(names: list[str], values: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a call: each of the argument names that `values` has a value for."""
    return {n: values[n] for n in names if n in values}


# a table of angles (lucidrains': RotaryEmbedding returns cat(freqs, freqs), apply_rotary_pos_emb(pos, t)
# takes their cos and sin itself), beside a tensor that may then be called t
ANGLE_NAMES = ("pos", "freqs", "angles", "pos_emb", "rotary_pos_emb",
               "sinusoidal_pos")  # RoFormer's


def _tensor_names(names: list[str]) -> list[str]:
    """The (at most two) argument names that take the queries and keys (t beside a table of angles, or
    beside cos and sin: Qwen's apply_rotary_pos_emb(t, cos, sin))."""
    allowed = TENSOR_NAMES + ("t",) * (_takes(names, ANGLE_NAMES) or {"cos", "sin"} <= set(names))
    return [n for n in names if n in allowed][:2]


def reference_tables(length: int, layout: str, offset: int = 0, theta: float = THETA,
                     flags: V.Flags = frozenset()) -> tuple[Tensor, Tensor]:
    """(cos, sin), each (length, Dh): every pair's angle written where that layout puts the pair."""
    angles = V.rope_angles(length, DH, theta, offset, flags)  # (length, Dh/2)
    half = layout in ("half", "swapped")
    full = torch.cat([angles, angles], -1) if half else angles.repeat_interleave(2, -1)
    return full.cos(), full.sin()


def check_rope(comp: Component, ctx: Context) -> ComponentResult:
    if inspect.isclass(comp.obj):
        return _agreeing(_check_module(comp, ctx), ctx, comp)
    names = forward_names(comp.obj)
    if _takes(names[:1], DIM_NAMES) or not _tensor_names(names):
        return _agreeing(_check_table_function(comp, ctx), ctx, comp)
    return _agreeing(_check_apply(comp, ctx, *_positions_by_use(*_unsuffixed(comp.obj, names))), ctx, comp)


def _unsuffixed(fn: Callable[..., Any], names: list[str]) -> tuple[Callable[..., Any], list[str]]:
    """fn and its argument names, one written with a trailing underscore (Baichuan's
    apply_rotary_pos_emb(q, k, cos_, sin_, position_ids)) called by its plain name."""
    plain = {n.rstrip("_"): n for n in names if n.endswith("_") and n.rstrip("_") not in names}
    if not plain:  # fn itself, which the localizer traces
        return fn, names

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{plain.get(k, k): v for k, v in kwargs.items()})
    return call, [n.rstrip("_") if n.rstrip("_") in plain else n for n in names]


# what an apply function may take its table as: with none of them, it builds its angles from its positions
HANDED_TABLES = ("cos", "sin", "freqs_cos", "freqs_sin", *COMPLEX_TABLE_NAMES)
TABLE_ARGS = (*HANDED_TABLES, *ANGLE_NAMES)
POSITION_ROLES = ("position_ids", "offset")  # (T,) or (B, T) int positions, or where they start


def _positions_by_use(fn: Callable[..., Any], names: list[str]) -> tuple[Callable[..., Any], list[str]]:
    """fn and its argument names, its one required argument beside its tensors and base taken as its
    positions whatever its name (apply_rope(x, pos, base), rotate(x, positions), rope(x, shift)) where it
    takes no table: handed position_ids where a call gives them, else the angles its name may stand for
    (lucidrains' pos), else the offset, so that the attempts find which it accepts (an int tensor of
    positions, the angles, or an int offset)."""
    params = inspect.signature(fn).parameters
    params = {n.rstrip("_"): p for n, p in params.items()} | dict(params)  # cos_ as _unsuffixed names it
    said = (*_tensor_names(names), *THETA_NAMES, *OFFSET_ARGS, *LENGTH_NAMES, *DIM_NAMES)  # no positions
    rest = [n for n in names if n not in said and params[n].default is inspect.Parameter.empty]
    if len(rest) != 1 or _takes([n for n in names if n != rest[0]], TABLE_ARGS):
        return fn, names
    own = rest[0]

    roles = (POSITION_ROLES[0], own, POSITION_ROLES[1])  # its own name: the angles it may be named for

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        given = [kwargs.pop(role) for role in roles if role in kwargs]
        return fn(*args, **kwargs, **{own: given[0]})
    return call, [*names, *POSITION_ROLES]


# the lines that write each pairing: a table repeated pair by pair, or two halves side by side
PAIRING_LINES = {"interleaved": r"repeat_interleave|stack\(.*flatten|view_as_complex|polar\(",
                 "half": r"cat\(\s*[(\[]?\s*\w+\s*,\s*\w+|rotate_half|\[\.\.\.,\s*:\s*\w+\s*//\s*2\]"}


def _agreeing(res: ComponentResult, ctx: Context, comp: Component) -> ComponentResult:
    """A file's RoPE pieces (the table and what applies it) pair the same dimensions: each convention
    alone is right, a table of interleaved pairs applied as halves (or the other way) is not."""
    pairing = {id(LAYOUTS[k]): v for k, v in PAIRINGS.items()}
    mine = pairing.get(id(res.convention))
    other = next((r for r in list(ctx.results.values()) * bool(mine)  # none when its own is unknown
                  if pairing.get(id(r.convention), mine) != mine), None)  # another kind's: no layout
    if other is None:
        return res
    theirs, at = pairing[id(other.convention)], _first_line(PAIRING_LINES[mine], comp)
    said = text(f"yours {PAIRING_WORDS[mine][0]}, {other.name}'s {PAIRING_WORDS[theirs][0]}, so together "
                "they rotate the wrong pairs",
                f"你的是{PAIRING_WORDS[mine][1]}，{other.name} 的是{PAIRING_WORDS[theirs][1]}，"
                "合在一起旋转的维度对不上")
    res.checks.append(Check(text(f"pairs the same dimensions as your {other.name}: {said['en']}{at['en']}",
                                 f"与你的 {other.name} 配对方式一致：{said['zh']}{at['zh']}"), False))
    number, code = _first_number(PAIRING_LINES[mine], comp)
    # one finding a line: where the localized first departure already quotes it, that one says it
    quoted = {None, *(f.line for f in res.findings)}
    res.findings += [Finding(DEPARTS, said, number, code)] * (number not in quoted)
    return finish(res)


PAIRINGS = {"half": "half", "swapped": "half", "interleaved": "interleaved"}  # "pairs": none (see LAYOUTS)
PAIRING_WORDS = {"half": ("(j, j + d/2), half-split", " (j, j + d/2) 对半配对"),
                 "interleaved": ("(2j, 2j+1), interleaved", " (2j, 2j+1) 交错配对")}


def _first_number(pattern: str, comp: Component) -> tuple[int | None, str | None]:
    """The number and text of the component's first line that matches; (None, None) when none."""
    return next(((n, line.strip()) for n, line in source_lines([comp.obj]) if re.search(pattern, line)),
                (None, None))


def _first_line(pattern: str, comp: Component) -> Text:
    """ " (line N: code)" of the component's first line that matches, in both languages; "" when none."""
    number, code = _first_number(pattern, comp)
    return text(f" (line {number}: {code})", f"（第 {number} 行：{code}）") if number else text("", "")


# --- tables ------------------------------------------------------------------------------------

@dataclass
class Table:
    """A rotary table read back from the learner's output: cos and sin of each pair's angle
    (P, Dh/2), and the layout the pairs were written in."""

    cos: Tensor
    sin: Tensor
    layout: str  # half | interleaved | pairs (only one value a pair, as Meta's complex table)


def read_table(out: Any, rows: int, dh: int = DH) -> Table | None:
    """Meta's complex (P, Dh/2), a (cos, sin) pair of (P, Dh) or (P, Dh/2) tables, or (P, Dh/2, 2)
    [cos, sin]; leading axes (a batch, heads of 1) dropped, the first `rows` positions kept; None if
    it is none of these."""
    if isinstance(out, Tensor) and out.is_complex():
        t = out.reshape(-1, out.size(-1))[:rows]
        return Table(t.real.double(), t.imag.double(), "pairs") if t.size(-1) == dh // 2 else None
    if isinstance(out, Tensor) and out.dim() >= 2 and out.size(-1) == 2 and out.size(-2) == dh // 2:
        t = out.reshape(-1, dh // 2, 2).double()[:rows]
        return Table(t[..., 0], t[..., 1], "unknown")
    if _angles(out, dh):  # lucidrains' table of the angles themselves: 0 at position 0
        out = (out.cos(), out.sin())
    if isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, Tensor) for o in out):
        cos, sin = (o.double() for o in out)
        if cos.shape != sin.shape or cos.dim() == 0 or cos.size(-1) not in (dh, dh // 2):
            return None
        cos, sin = cos.reshape(-1, cos.size(-1))[:rows], sin.reshape(-1, sin.size(-1))[:rows]
        if cos.size(-1) == dh // 2:  # its halves equal: partial rotary, a half table of Dh/2
            return Table(cos[:, : dh // 4], sin[:, : dh // 4], "half") if _halves_equal(cos, sin) else Table(
                cos, sin, "unknown")
        if torch.allclose(cos[:, : dh // 2], cos[:, dh // 2:], atol=TOL):
            return Table(cos[:, : dh // 2], sin[:, : dh // 2], "half")
        return Table(cos[:, 0::2], sin[:, 0::2], "interleaved")
    return None


def _halves_equal(cos: Tensor, sin: Tensor) -> bool:
    """Whether a table's two halves hold the same angles past position 0 (Phi's partial rotary: a half
    table of the dims it turns, Dh/2 of them at a share of 0.5); a table of Dh/2 pairs has as many
    frequencies, so its halves differ."""
    both, w = torch.stack([cos, sin])[:, 1:], cos.size(-1) // 2  # (2, P - 1, Dh/2)
    return torch.allclose(both[..., :w], both[..., w:], atol=TOL)


def _angles(out: Any, dh: int) -> bool:
    """A real table (..., P, Dh) or (..., P, Dh/2) that holds angles: its first position's row is all 0
    (a cos table's is all 1)."""
    shaped = isinstance(out, Tensor) and out.dim() >= 2 and out.size(-1) in (dh, dh // 2)
    return shaped and out.is_floating_point() and bool((out[..., 0, :] == 0).all())


def _table_error(table: Table, offset: int = 0, theta: V.Frequencies = THETA, flags: V.Flags = frozenset(),
                 ) -> float:
    """The table against pos * theta^(-2j/d), d twice its pairs (the width it turns: Dh, or less)."""
    d = 2 * table.cos.size(-1)
    angles = V.rope_angles(table.cos.size(0), d, theta, offset, flags)  # (P, d/2)
    return max(fp.max_error(table.cos, angles.cos()), fp.max_error(table.sin, angles.sin()))


def _frequencies(table: Table) -> Tensor:
    """Each pair's angle at position 1 (every angle there is below pi, so it is read back exactly)."""
    return torch.atan2(table.sin[1], table.cos[1]) if table.cos.size(0) > 1 else table.cos[0] * math.nan


POSITIVE_TOL = 1e-2  # angles up to P * theta^(2j/d) in float32: their cos and sin only this close


def _base_finding(res: ComponentResult, ctx: Context, comp: Component, table: Table, theta: float) -> None:
    """rope_wrong_base when the angles are pos * f_j with f_j another frequency than theta^(-2j/d):
    the effective base b (from f_1 = b^(-2/d)), or the exponent j/d (pairs not doubled)."""
    got, d = _frequencies(table), 2 * table.cos.size(-1)  # d: the width the table turns
    j = torch.arange(d // 2, dtype=torch.float64)
    expected = theta ** (-2 * j / d)
    if fp.max_error(got, expected) < TOL:
        return
    base = float(got[1]) ** (-d / 2) if got[1] > 0 else math.nan
    if fp.max_error(got, theta ** (-j / d)) < 1e-4:  # before the base: theta^(-j/d) = sqrt(theta)^(-2j/d)
        form, en, zh = "exponent", "the exponent is j/d, not 2j/d", "指数用了 j/d，而不是 2j/d"
    elif math.isfinite(base) and fp.max_error(got, base ** (-2 * j / d)) < 1e-4:
        form, en, zh = "base", f"the base is {base:.6g}, not {theta:g}", f"底数是 {base:.6g}，不是 {theta:g}"
    elif _table_error(table, theta=theta, flags=frozenset({"rope_wrong_base:positive"})) < POSITIVE_TOL:
        form, en, zh = "positive", "theta^(2j/d), the reciprocal left out", "用了 theta^(2j/d)，漏了取倒数"
        got = theta ** (2 * j / d)  # its angles wrap past pi at position 1: these are what it computed
    else:
        return
    number, code = locate("rope_wrong_base", source_lines(ctx.objects(comp, "rope")))
    mine = ", ".join(f"{v:.4g}" for v in got[:3].tolist())
    right = ", ".join(f"{v:.4g}" for v in expected[:3].tolist())
    res.findings.append(Finding("rope_wrong_base", text(
        f"the frequencies of pairs 0, 1, 2 are {mine}, where theta^(-2j/d) gives {right}: {en}",
        f"配对 0、1、2 的频率是 {mine}，而 theta^(-2j/d) 给出 {right}：{zh}"), number, code, form))


def _sign_finding(res: ComponentResult, ctx: Context, comp: Component, table: Table, err: float) -> None:
    """rope_rotation_sign when the table holds the sines of the negated angles (its cosines right):
    whatever applies it rotates the other way. Its line is where the run parts (no pattern finds it)."""
    angles = V.rope_angles(table.cos.size(0), 2 * table.cos.size(-1), THETA)  # (P, d/2)
    flipped = max(fp.max_error(table.cos, angles.cos()), fp.max_error(table.sin, -angles.sin()))
    if not err >= TOL > flipped:  # wrong, and wrong so
        return
    res.findings.append(Finding("rope_rotation_sign", text(
        f"your table is that of the angles -pos * theta^(-2j/d): the cosines are right, every sine has "
        f"its sign flipped (max abs difference {flipped:.1e})",
        f"你的表是角度 -pos * theta^(-2j/d) 的表：余弦都对，每个正弦的符号都反了（最大绝对误差 "
        f"{flipped:.1e}）"), *locate("rope_rotation_sign", source_lines([comp.obj]))))


INTERLEAVED = text("pairs (2j, 2j+1), interleaved (Meta's complex freqs_cis): a convention, not an error",
                   "按 (2j, 2j+1) 交错配对（Meta 的复数 freqs_cis）：这是约定不同，不是错误")
LAYOUTS = {  # the convention each layout of the pairs reports ("unknown": none)
    "swapped": text("pairs (j, j + d/2) rotated the other way, (a cos + b sin, b cos - a sin), as "
                    "nanochat: a convention, not an error",
                    "按 (j, j + d/2) 配对、反方向旋转，(a cos + b sin, b cos - a sin)，与 nanochat "
                    "相同：这是约定不同，不是错误"),
    # a complex table (one value a pair) says the same, but pairs nothing: what applies it does (Gemma
    # applies Meta's complex table to halves), so it is a copy that _agreeing does not read as a pairing
    "interleaved": INTERLEAVED, "pairs": dict(INTERLEAVED),
    "half": text("pairs (j, j + d/2), half-split (Hugging Face, handformer)",
                 "按 (j, j + d/2) 对半配对（Hugging Face、handformer）"),
}


def _layout_convention(res: ComponentResult, layout: str) -> None:
    res.convention = LAYOUTS.get(layout, res.convention)


CONFIG_NAMES = ("args", "config", "cfg", "model_args", "params")
ROPE_WIDTH = re.compile("rope.*dim")  # the field of a config that holds the RoPE width: qk_rope_head_dim
# a config's head count: one, so a table of width dim // n_heads (DeepSeek's MTP example) is as wide as `dim`
HEAD_COUNT = re.compile(r"n_heads?|num_heads|num_attention_heads|n_head")


def _config(fn: Callable[..., Any], names: list[str], values: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek's precompute_freqs_cis(args: ModelArgs): its config argument, its dataclass built with
    its defaults and the table's sizes in the fields that name them (the RoPE width in a field that says
    rope and dim, qk_rope_head_dim); {} where it takes none (or one not built so)."""
    name = next(filter(CONFIG_NAMES.__contains__, names), None)
    hints = fp.quietly(lambda: typing.get_type_hints(fn)) or {}
    cfg = fp.quietly(lambda: _filled_config(hints[name], values))
    return {} if cfg is None else {name: cfg}


def _filled_config(cls: Any, values: dict[str, Any]) -> Any:
    """The dataclass `cls` with its defaults, the values of the fields `values` names, the RoPE width,
    a head count at one."""
    fields = {f.name for f in dataclasses.fields(cls)}
    return dataclasses.replace(cls(), **{f: values[f] for f in fields & values.keys()},
                               **dict.fromkeys(filter(ROPE_WIDTH.search, fields), DH),
                               **dict.fromkeys(filter(HEAD_COUNT.fullmatch, fields), 1))


def _no_table(comp: Component, ctx: Context, got: str, config: dict[str, Any]) -> Exception:
    """What a table function returned that reads as no table: theirs to fix where check passed its
    sizes by name; from a config check filled, check's guess of its fields is what does not fit (NOT
    CHECKED, the adapter named)."""
    if not config:
        return ctx.learner.fail("forward", f"{comp.name}(dim={DH}, end={P}) returned {got}; expected Meta's "
                                f"complex freqs_cis ({P}, {DH // 2}) or (cos, sin) of shape ({P}, {DH})",
                                f"{comp.name}(dim={DH}, end={P}) 返回了 {got}；应当是 Meta 的复数 freqs_cis "
                                f"({P}, {DH // 2})，或形状为 ({P}, {DH}) 的 (cos, sin)")
    return MappingError(
        f"{comp.name} takes a config object; built with check's guess of its fields it returned {got}, "
        f"not a table of {P} positions (the adapter below, which builds your config and rotates q and k "
        "with its table, lets check grade it)",
        zh=f"{comp.name} 接收一个配置对象；按检查程序猜的字段构建后它返回了 {got}，不是 {P} 个位置的表"
           "（写下面的适配函数，由它构建你的配置、用这张表旋转 q 和 k，检查程序就能判断）")


# Llama 3.1's switch of its frequency scaling (Meta's precompute_freqs_cis(..., use_scaled=...)): off,
# the table compared unscaled; the scaling is checked as apply_scaling (runners/rope_scaling.py)
SCALING_SWITCHES = ("use_scaled", "use_scaled_rope", "use_scaling", "scaled")


def _check_table_function(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    names = forward_names(comp.obj)

    def call(theta: float, length: int = P, offset: int | None = None) -> Any:
        # dtype: gpt-fast's precompute_freqs_cis(..., dtype=torch.bfloat16); an offset only when given
        values = {**dict.fromkeys(DIM_NAMES, DH), **dict.fromkeys(LENGTH_NAMES, length),
                  **dict.fromkeys(THETA_NAMES, theta), "dtype": torch.float64,
                  **dict.fromkeys(SCALING_SWITCHES, False)}
        if offset is not None:
            values |= dict.fromkeys(OFFSET_NAMES, offset)
        kwargs = _filled(names, values) | _config(comp.obj, names, values)
        return ctx.learner.call("forward", comp.obj, **kwargs)

    table = read_table(call(THETA), P)
    if table is None:
        raise _no_table(comp, ctx, shape_of(call(THETA)), _config(comp.obj, names, {}))
    _layout_convention(res, table.layout)
    _base_finding(res, ctx, comp, table, THETA)
    err = _table_error(table)
    _sign_finding(res, ctx, comp, table, err)
    res.checks.append(Check(text(f"angles pos * theta^(-2j/d) for {table.cos.size(0)} positions, d = {DH}",
                                 f"{table.cos.size(0)} 个位置、d = {DH} 时角度为 pos * theta^(-2j/d)"),
                            err < TOL, error_text(err)))
    if _takes(names, THETA_NAMES):
        _base_used(res, ctx, comp, call, err)
    res.max_abs_error = err
    if err >= TOL:
        note_departure(res, lambda: localize_rope_table(lambda: call(THETA), comp.obj, P, DH, THETA))
    return finish(res)


def _base_used(res: ComponentResult, ctx: Context, comp: Component, call: Callable[..., Any],
               err: float) -> None:
    """The table at Llama 3's base, 500000: different from 10000's, and right."""
    other = read_table(call(500000.0), P)
    err_theta = _table_error(other, theta=500000.0) if other else math.inf
    if other is not None and _table_error(other) < TOL and err < TOL:
        number, code = locate("rope_wrong_base", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("rope_wrong_base", text(
            "with theta = 500000 the table is the same as with 10000: the base argument is not used",
            "theta = 500000 时的表与 10000 时相同：没有用传进来的底数"), number, code, "ignored"))
    res.checks.append(Check(text("uses the base it is given (theta = 500000, Llama 3's)",
                                 "使用传入的底数（theta = 500000，Llama 3 的取值）"), err_theta < TOL,
                            error_text(err_theta)))


# --- applying the rotation ---------------------------------------------------------------------

def _apply_inputs() -> tuple[Tensor, Tensor]:
    return fp.randn(B, H, T, DH, seed=1), fp.randn(B, H, T, DH, seed=2)  # (B, H, T, Dh) each


META_INPUTS = text("inputs (B, T, H, Dh), as Meta's llama", "输入形状为 (B, T, H, Dh)，与 Meta 的 llama 相同")
INPUT_NOTES = {True: META_INPUTS, "first": text("inputs sequence-first (T, B, H, Dh), as ChatGLM's",
                                                "输入序列在前，形状为 (T, B, H, Dh)，与 ChatGLM 相同")}


def _check_apply(comp: Component, ctx: Context, fn: Callable[..., Any], names: list[str]) -> ComponentResult:
    """An apply function: the rotation it computes on given tables (cos, sin of both layouts, or
    Meta's complex table), against handformer's in that layout."""
    res = ctx.result(comp)
    q, k = _apply_inputs()
    tensors = _tensor_names(names)
    complex_table, offsets = _takes(names, COMPLEX_TABLE_NAMES), _takes(names, OFFSET_NAMES)
    attempts = _apply_attempts(names, complex_table, offsets)
    failure, best, first = _search_apply(ctx, fn, names, tensors, q, k, attempts)
    if best is None and first is None:
        raise failure or ctx.learner.fail(
            "forward", f"{comp.name} returned no rotated queries and keys of shape {tuple(q.shape)} for any "
            "layout of the rotary table",
            f"不论旋转表怎样排布，{comp.name} 都没有返回形状为 {tuple(q.shape)} 的旋转后的 query 和 key")
    if best is None and first[2] in ANGLE_VIEWS:  # the angles were a guess from an argument's name
        first = _stated_table(ctx, fn, names, tensors, q, k)  # unless its code says what the table holds
        if first is None:
            raise DiscoveryError(*GUESSED_ANGLES)
    layout, meta, shape, rot, out, found = best if best else (*first, None)
    _layout_convention(res, rot)
    res.notes += [INPUT_NOTES[meta]] if meta in INPUT_NOTES else []
    if found and found[0]:
        res.findings += _findings(ctx, comp, found, out, _rotated(q, k, len(tensors), rot, 0, frozenset()))
    # unmatched: a rotation its output holds up to one reorder of q's and k's dims (not a complex table's)
    err = fp.max_error(out, _rotated(q, k, len(tensors), rot))
    reorder = best is None and not complex_table and err >= TOL
    rot, order = _reordered(res, ctx, comp, out, q, k, len(tensors), rot) if reorder else (rot, ...)
    err = res.max_abs_error = fp.max_error(out, _rotated(q, k, len(tensors), rot)[..., order])
    res.checks.append(Check(text(f"rotates queries and keys as handformer's apply_rotary ({rot} pairs)",
                                 f"与 handformer 的 apply_rotary（{rot} 配对）旋转结果一致"), err < TOL,
                            error_text(err)))
    if offsets or shape in POSITION_IDS:
        _offset_check(res, ctx, comp,
                      lambda offset: _run_apply(ctx, fn, names, tensors, q, k, layout, meta, shape, offset),
                      lambda offset, fl: _rotated(q, k, len(tensors), rot, offset, fl)[..., order])
    if best is None and err >= TOL:  # no catalogued mistake: where it first parts from the rotation
        def run(qg: Tensor, kg: Tensor) -> Tensor | None:
            return _run_apply(ctx, fn, names, tensors, qg, kg, layout, meta, shape, 0)
        note_departure(res, lambda: localize_rotation(run, fn, q, k, rot))
    return finish(res)


REORDERED = ("the rotation of {rot} pairs, its output's head dims reordered alike in queries and keys (to "
             "{order}): every score q.k is the same, so the attention it feeds computes the same thing; "
             "a convention of the weights it is written for (DeepSeek's rope dims stored interleaved), "
             "not an error",
             "按{rot}配对的旋转，只是输出的 head 维在 query 和 key 上按同一顺序重排（成为 {order}）："
             "每个得分 q.k 都不变，所以它送入的注意力算的是同一件事；这是它所对应权重的约定"
             "（DeepSeek 把 rope 维交错存放），不是错误")


PAIRS_ZH = {"half": "对半", "interleaved": "交错"}
REORDER_FLAGS = (frozenset(), frozenset({"rope_rotation_sign"}))


def _reordered(res: ComponentResult, ctx: Context, comp: Component, out: Tensor, q: Tensor, k: Tensor,
               n: int, rot: str) -> tuple[str, Any]:
    """Where no rotation matched: a layout whose rotation it computes up to one order of the head dims
    shared by every output (shared_permutation.py), reported as a convention (DIFFERS); the rotation
    the other way so reordered stays rope_rotation_sign; else as it was."""
    for layout, flags in itertools.product(dict.fromkeys((rot, "half", "interleaved")), REORDER_FLAGS):
        order = shared_permutation(out, _rotated(q, k, n, layout, 0, flags), TOL)
        if order is not None and flags:
            res.findings += _findings(ctx, comp, (flags, 0.0), out, _rotated(q, k, n, layout)[..., order])
        if order is not None:
            res.status = DIFFERS
            shown = "[" + ", ".join(map(str, order[:8])) + ", ...]"
            res.convention = text(REORDERED[0].format(rot=layout, order=shown),
                                  REORDERED[1].format(rot=PAIRS_ZH.get(layout, layout), order=shown))
            return layout, order
    return rot, ...


def _apply_attempts(names: list[str], complex_table: bool, offsets: bool) -> list[tuple[str, bool, str]]:
    """The (layout, Meta's inputs, table shape) an apply function is tried with, in order."""
    from0 = ("from0",) if offsets else ()  # apply_rope(x, cos, sin, offset)
    shapes = ("4d", "btd", *from0, "td") + tuple(POSITION_IDS) * ("position_ids" in names)
    attempts = [(layout, meta, shape) for layout in (COMPLEX if complex_table else ("half", "interleaved"))
                for meta in (False, True, *["first"] * complex_table)  # ChatGLM's sequence-first
                for shape in (("4d", *REAL_TABLES) if layout in COMPLEX else shapes)]
    if not complex_table:  # nanochat's cos, sin (1, T, 1, Dh/2) on halves, rotated either way
        attempts += QUARTER + PAIR_TD + PAIR_BTD
    if _takes(names, ANGLE_NAMES):  # the angles themselves, (T, Dh) or (1, 1, T, Dh), either pairing
        attempts += [(layout, False, shape) for layout in ("half", "interleaved") for shape in ANGLE_VIEWS]
    return attempts


def _search_apply(ctx: Context, fn: Callable[..., Any], names: list[str], tensors: list[str], q: Tensor,
                  k: Tensor, attempts: list[tuple[str, bool, str]]) -> tuple[Any, Any, Any]:
    """The first (layout, Meta's inputs, table shape) whose rotation is right, else the first a
    catalogued mistake explains; the first that ran; the first failure."""
    failure, first, named = None, None, None  # named: the first a catalogued mistake explains
    for layout, meta, shape in attempts:
        try:
            out = _run_apply(ctx, fn, names, tensors, q, k, layout, meta, shape, offset=0)
        except fp.LearnerFailure as err:
            failure = failure or err
            continue
        if out is None:
            continue
        rot = COMPLEX.get(layout, layout)
        first = first or (layout, meta, shape, rot, out)
        own = () if _takes(names, HANDED_TABLES) else OWN_ANGLES  # angles it builds itself: their base too
        found = fp.search(out, lambda fl, rot=rot: _rotated(q, k, len(tensors), rot, 0, fl),
                          (*ROTATION_SIGNS[:1 + 2 * (len(tensors) > 1)], *own), None, 1)
        if found is not None and not found[0]:
            return failure, (layout, meta, shape, rot, out, found), first
        named = named or ((layout, meta, shape, rot, out, found) if found is not None else None)
    return failure, named, first


# the rotation turned the other way: both, or the queries or the keys alone (which of them turn back)
ONE_SIDE = {"rope_rotation_sign:q": (True, False), "rope_rotation_sign:k": (False, True)}
ROTATION_SIGNS = ("rope_rotation_sign", *ONE_SIDE)
OWN_ANGLES = ("rope_wrong_base:exponent", "rope_wrong_base:positive")  # of a function handed no table


def _rotated(q: Tensor, k: Tensor, n: int, layout: str, offset: int = 0, flags: V.Flags = frozenset(),
             theta: V.Frequencies = THETA) -> Tensor:
    """The expected output, stacked: (n, B, H, T, Dh). rope_rotation_sign:q (or :k) turns that one
    alone the other way (its own rotate_half's minus on the wrong element)."""
    side = next(iter(flags & ONE_SIDE.keys()), None)
    rest, turned = flags - {side}, ONE_SIDE.get(side, (False, False))
    return torch.stack([V.rotary(t, layout, offset, rest | {"rope_rotation_sign"} if back else rest, theta)
                        for t, back in zip((q, k)[:n], turned)])


# the positions handed as position_ids: (B, T), Hugging Face's; (T,), a function that builds its own table
POSITION_IDS = {"by_id": lambda ids: ids[None].expand(B, T), "by_id_t": lambda ids: ids,
                "by_id_4d": lambda ids: ids[None].expand(B, T)}  # Baichuan's cached (1, 1, P, Dh) tables
# a complex table -> the pairs it rotates: Meta's view_as_complex(x.reshape(..., -1, 2)) pairs 2j with
# 2j + 1; Gemma's view_as_complex(torch.stack(torch.chunk(x, 2, -1), -1)) pairs j with j + Dh/2
COMPLEX = {"pairs": "interleaved", "pairs_half": "half"}
# llama2.c's apply_rotary_emb(xq, xk, freqs_cos, freqs_sin) (any apply function of that table): one angle an
# interleaved pair, (T, Dh/2)
PAIR_TD = [("interleaved", True, "pair_td"), ("interleaved", False, "pair_td")]
QUARTER = [("half", True, "quarter"), ("swapped", True, "quarter")]  # nanochat's (1, T, 1, Dh/2), either way
# GPT-J's apply_rotary_pos_emb(tensor, sin, cos): sin and cos (B, T, Dh/2), one angle an interleaved pair,
# repeat_interleave'd by the function itself onto (B, T, H, Dh) inputs
PAIR_BTD = [("interleaved", True, "pair_btd"), ("interleaved", False, "pair_btd")]
TABLE_VIEWS = {  # a (T, Dh) table as each shape hands it (the others as it is)
    "4d": lambda t, meta: t.reshape((1, T, 1, DH) if meta else (1, 1, T, DH)),  # over batch and heads
    "quarter": lambda t, meta: t[:, : DH // 2].reshape(1, T, 1, DH // 2),  # nanochat's: one angle a pair
    "btd": lambda t, meta: t[None].expand(B, T, DH),
    "pair_td": lambda t, meta: t[:, ::2],  # llama2.c's freqs_cos (T, Dh/2): one angle an interleaved pair
    "pair_btd": lambda t, meta: t[None, :, ::2].expand(B, T, DH // 2),  # GPT-J's (B, T, Dh/2)
    "by_id_4d": lambda t, meta: t[None, None],  # (1, 1, P, Dh), indexed cos_[0, 0][position_ids]
}
GUESSED_ANGLES = (
    "check handed the rotary table argument the angles themselves (what its name most often holds) and no "
    "rotation matched; if it takes another table (sin and cos interleaved, cos and sin apart), write an "
    "adapter that hands it yours (docs/check.md, \"NOT CHECKED and adapters\")",
    "检查程序按参数名猜它是角度表，把角度本身传了进去，但结果和哪种旋转都对不上；如果它要的是别的表"
    "（sin、cos 交替排列，或者 cos、sin 分开），请写一个适配函数把你的表传进去"
    "（见 docs/zh/check.md 的“未检查与适配函数”）")
# what an argument named for the angles may hold, from the (T, Dh) angles of the rotation's layout: the
# angles, or a table of one sin and one cos per pair (RoFormer's: sin and cos interleaved, Su Jianlin's
# snippet; Hugging Face's RoFormer: the sines then the cosines)
ANGLE_VIEWS = {"angles": lambda t: t, "angles_4d": lambda t: t.reshape(1, 1, T, DH),
               "sin_cos_pairs": lambda t: torch.stack(_sin_cos(t), -1).flatten(1),
               "sin_cos_halves": lambda t: torch.cat(_sin_cos(t), -1)}


# a table its code splits into its sines and its cosines (Hugging Face's RoFormer: `sin, cos =
# sinusoidal_pos.chunk(2, dim=-1)`): the sines, then the cosines
SPLIT_TABLE = r"\w*sin\w*\s*,\s*\w*cos\w*\s*=\s*(?:torch\.chunk\(\s*{0}\s*,|{0}\.chunk\()\s*2\b"


def _stated_table(ctx: Context, fn: Callable[..., Any], names: list[str], tensors: list[str], q: Tensor,
                  k: Tensor) -> tuple[str, bool, str, str, Tensor] | None:
    """Where no rotation matched a table handed for an argument named for the angles: the table its own
    code says it takes (SPLIT_TABLE: the sines then the cosines), compared with the interleaved pairs
    (Hugging Face RoFormer's); None where its code says nothing of it (the table was a guess)."""
    code = source_text(fn)
    said = [n for n in names if n in ANGLE_NAMES and re.search(SPLIT_TABLE.format(re.escape(n)), code)]
    attempt = ("interleaved", False, "sin_cos_halves")
    out = _run_apply(ctx, fn, names, tensors, q, k, *attempt, 0) if said else None
    return then(out, lambda o: (*attempt, "interleaved", o))


def _sin_cos(angles: Tensor) -> tuple[Tensor, Tensor]:
    """The sin and cos (T, Dh/2) of each pair's angle, whichever dimensions a (T, Dh) table of angles
    pairs."""
    pair = angles[:, ::2] if torch.equal(angles[:, ::2], angles[:, 1::2]) else angles[:, : DH // 2]
    return pair.sin(), pair.cos()


def _run_apply(ctx: Context, fn: Callable[..., Any], names: list[str], tensors: list[str], q: Tensor,
               k: Tensor, layout: str, meta: bool | str, shape: str, offset: int) -> Tensor | None:
    """Call an apply function with tables of this layout and shape ("4d": (1, 1, T, Dh); "btd":
    (B, T, Dh), for Hugging Face's unsqueeze(1); "td": (T, Dh); "by_id": (P, Dh) indexed by
    position_ids; Meta: complex (T, Dh/2)), positions from `offset`; its output stacked as
    (n, B, H, T, Dh), None if it is not that."""
    given = [q.permute(*INPUT_AXES[meta]), k.permute(*INPUT_AXES[meta])]  # Meta's: (B, T, H, Dh)
    kwargs: dict[str, Any] = dict(zip(tensors, given))
    if layout in COMPLEX:
        angles = V.rope_angles(T, DH, THETA, offset)  # (T, Dh/2)
        table = torch.polar(torch.ones_like(angles), angles)  # (T, Dh/2) complex
        name = next(n for n in names if n in COMPLEX_TABLE_NAMES)
        kwargs[name] = REAL_TABLES.get(shape, lambda t: t)(table)
    else:
        whole = shape in ("from0", *POSITION_IDS)  # the table from position 0, indexed by their code
        cos, sin = reference_tables(P, layout) if whole else reference_tables(T, layout, offset)
        view = TABLE_VIEWS.get(shape, lambda t, meta: t)
        kwargs["cos"], kwargs["sin"] = view(cos, meta), view(sin, meta)
        kwargs["freqs_cos"], kwargs["freqs_sin"] = kwargs["cos"], kwargs["sin"]  # llama2.c's names
        if shape in ANGLE_VIEWS:  # the angles whose cos and sin these are (wrapped to (-pi, pi])
            kwargs |= dict.fromkeys(ANGLE_NAMES, ANGLE_VIEWS[shape](torch.atan2(sin, cos)))
    if shape in POSITION_IDS:
        kwargs["position_ids"] = POSITION_IDS[shape](torch.arange(T) + offset)
    kwargs |= dict.fromkeys(OFFSET_NAMES, offset) | dict.fromkeys(THETA_NAMES, THETA)  # those it takes
    raw = _call_offset(ctx, fn, {n: v for n, v in kwargs.items() if n in names})
    return _stacked(raw, len(tensors), q.shape, meta)


# the complex table (T, Dh/2) as real pairs (cos, sin): gpt-fast's (T, Dh/2, 2); GLM-4's, indexed by
# position ids, (1, T, Dh/2, 2)
REAL_TABLES = {"real": torch.view_as_real, "real_batched": lambda t: torch.view_as_real(t)[None]}


# the axes of the (B, H, T, Dh) inputs an apply function is handed, by its reading: as they are, Meta's
# (B, T, H, Dh) (True), ChatGLM's sequence-first (T, B, H, Dh) ("first"); and back
INPUT_AXES = {False: (0, 1, 2, 3), True: (0, 2, 1, 3), "first": (2, 0, 1, 3)}
OUTPUT_AXES = {False: (0, 1, 2, 3), True: (0, 2, 1, 3), "first": (1, 2, 0, 3)}


def _stacked(raw: Any, n: int, shape: torch.Size, meta: bool | str = False) -> Tensor | None:
    """The first n outputs (B, H, T, Dh) stacked (n, B, H, T, Dh) (Meta's (B, T, H, Dh) transposed,
    ChatGLM's (T, B, H, Dh) permuted back); None when they are not n tensors of that shape."""
    outs = fp.outputs(raw)
    outs = [o.permute(*OUTPUT_AXES[meta]) if o.dim() == 4 else o for o in outs[:n] if isinstance(o, Tensor)]
    if len(outs) < n or any(o.shape != shape for o in outs):
        return None
    return torch.stack([o.double() for o in outs])


def _call_offset(ctx: Context, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """fn(**kwargs) with its offset an int; when that raises, one offset per batch row (B,) (Raschka's
    batched apply_rope(x, cos, sin, offset) reads offset.shape[0]); their first error if both raise."""
    try:
        return ctx.learner.call("forward", fn, **kwargs)
    except fp.LearnerFailure as first:
        name = next((n for n, v in kwargs.items() if n in OFFSET_NAMES and isinstance(v, int)), None)
        if name is None:
            raise
        try:
            return ctx.learner.call("forward", fn, **{**kwargs, name: torch.full((B,), kwargs[name])})
        except fp.LearnerFailure:
            raise first from None


def _findings(ctx: Context, comp: Component, found: tuple[frozenset[str], float], out: Tensor,
              correct: Tensor) -> list[Finding]:
    return ctx.findings(found[0], found[1], fp.max_error(out, correct), comp, "rope")


def _offset_check(res: ComponentResult, ctx: Context, comp: Component, run: Callable[[int], Tensor | None],
                  compute: Callable[[int, V.Flags], Tensor]) -> None:
    """Positions offset .. offset + T - 1 when asked for an offset (a KV cache's length): named
    rope_no_offset when the output is that of positions 0 .. T - 1."""
    out = run(OFFSET)
    err = fp.max_error(out, compute(OFFSET, frozenset()))
    if err >= TOL and fp.max_error(out, compute(OFFSET, frozenset({"rope_no_offset"}))) < TOL:
        number, code = locate("rope_no_offset", source_lines(ctx.objects(comp, "rope")))
        res.findings.append(Finding("rope_no_offset", text(
            f"asked for positions {OFFSET}..{OFFSET + T - 1}, your code rotates by the angles of positions "
            f"0..{T - 1}", f"要求位置 {OFFSET}..{OFFSET + T - 1}，你的代码用的是位置 0..{T - 1} 的角度"),
            number, code))
    res.checks.append(Check(text(f"positions start at the offset ({OFFSET}: tokens already in a KV cache)",
                                 f"位置从偏移量开始（{OFFSET}：KV 缓存里已有的 token 数）"), err < TOL,
                            error_text(err)))


def _table_offset_check(res: ComponentResult, ctx: Context, comp: Component,
                        call: Callable[..., Any]) -> None:
    """A table asked for positions OFFSET .. OFFSET + T - 1 holds the rows of those positions of the
    table from 0 (whatever its angles): rope_no_offset when it holds those of 0 .. T - 1."""
    def rows(offset: int, length: int) -> Tensor | None:
        t = read_table(call(offset, length), length)
        return then(t, lambda t: torch.stack([t.cos, t.sin]))  # (2, length, Dh/2)

    shifted, start, longer = rows(OFFSET, T), rows(0, T), rows(0, OFFSET + T)
    err = fp.max_error(shifted, then(longer, lambda t: t[:, OFFSET:]))
    if err >= TOL and fp.max_error(shifted, start) < TOL:
        number, code = locate("rope_no_offset", source_lines(ctx.objects(comp, "rope")))
        res.findings.append(Finding("rope_no_offset", text(
            f"asked for positions {OFFSET}..{OFFSET + T - 1}, your table holds those of 0..{T - 1}",
            f"要求位置 {OFFSET}..{OFFSET + T - 1}，你的表给出的是位置 0..{T - 1}"), number, code))
    res.checks.append(Check(text(f"positions start at the offset ({OFFSET}: tokens already in a KV cache)",
                                 f"位置从偏移量开始（{OFFSET}：KV 缓存里已有的 token 数）"), err < TOL,
                            error_text(err)))


# --- RotaryEmbedding modules -------------------------------------------------------------------

def _check_module(comp: Component, ctx: Context) -> ComponentResult:
    """RotaryEmbedding(dim, max_seq_len, base): built for head dim 16; its forward returns the table
    (checked as a table) or the rotated input (checked as an apply function)."""
    res = ctx.result(comp)
    # head dim = d_model (Phi's PhiRotaryEmbedding(rotary_dim, ...): the width it turns)
    sizes = {"d_model": DH, "d_head": DH, "max_len": P, "theta": THETA, "n_heads": 1, "dropout": 0.0}
    module = ctx.build(comp, sizes, checked=False).double()
    names = forward_names(module)
    q, k = _apply_inputs()
    tensors = _tensor_names(names)
    ids: list[bool | str] = [True]  # position_ids (B, T), Hugging Face's; (T,) (False); (3, B, T) ("streams")

    def one(offset: int, length: int, given: tuple[Tensor, ...]) -> Any:
        values = _module_values(offset, length, ID_NAMES[:1 if tensors else None], ids[0])
        kwargs = dict(zip(tensors, given)) | _filled(names, values)
        return ctx.learner.call("forward", module, **kwargs)

    def call(offset: int = 0, length: int = T, reading: str = "") -> Any:
        # Meta's (B, T, H, Dh); gpt-oss's one sequence at a time, its tokens on dim 0, (T, H, Dh)
        # Falcon's and BLOOM's (B * H, T, Dh)
        pairs = {"": [(q, k)], "meta": [(q.transpose(1, 2), k.transpose(1, 2))],
                 "tokens": list(zip(q.transpose(1, 2), k.transpose(1, 2))),
                 "flat": [(q.flatten(0, 1), k.flatten(0, 1))]}[reading]
        outs = [one(offset, length, pair) for pair in pairs]
        return {"tokens": _per_sequence, "flat": _unflattened}.get(reading, lambda outs: outs[0])(outs)

    # (a rotation: other layouts below)
    raw = fp.quietly(lambda: _table_of(call, names, ids)) if tensors else _table_of(call, names, ids)
    table = read_table(raw, T)
    theta = _own_schedule(res, ctx, comp, module, _own_base(res, comp, module))
    # OLMo's forward(q, k) returns the rotated (q, k): shaped as its inputs, not a (cos, sin) table
    if table is not None and not (tensors and _stacked(raw, len(tensors), q.shape) is not None):
        return _module_table(res, ctx, comp, call, table, names, theta)
    if tensors:
        return _rotated_module(res, ctx, comp, call, len(tensors), q, k, names, theta)
    raise ctx.learner.fail("forward", f"{comp.name}'s forward returned {shape_of(raw)}: neither a rotary "
                           "table (cos, sin) nor the rotated input",
                           f"{comp.name} 的 forward 返回了 {shape_of(raw)}：既不是旋转表 (cos, sin)，"
                           "也不是旋转后的输入")


# the positions as a rotary module's forward takes them: (B, T), Hugging Face's; one row (T,); Qwen2-VL's
# three position streams (3, B, T) of M-RoPE (time, height, width), all equal as for text
POSITION_FORMS: dict[bool | str, Callable[[Tensor], Tensor]] = {
    True: lambda p: p[None].expand(B, -1), False: lambda p: p, "streams": lambda p: p.expand(3, B, -1)}


def _module_values(offset: int, length: int, id_names: tuple[str, ...], form: bool | str) -> dict[str, Any]:
    """What a rotary module's forward may take besides its tensors, by name: the length, the offset,
    the positions from it (in the form POSITION_FORMS says, under `id_names`: the names beside
    position_ids only for a table's module, forward(positions))."""
    positions = torch.arange(length) + offset
    return {**dict.fromkeys(LENGTH_NAMES, length), **dict.fromkeys(OFFSET_NAMES, offset),
            **dict.fromkeys(id_names, POSITION_FORMS[form](positions)),
            "token_positions": positions,  # CS336's forward(x, token_positions)
            "device": torch.device("cpu"), "dtype": torch.float64}  # Falcon's forward(seq_len, device, dtype)


def _table_of(call: Callable[[], Any], names: list[str], ids: list[bool | str]) -> Any:
    """The table a module's forward returns for positions (B, T) as Hugging Face hands them, else
    (T,) where it takes position_ids (or positions) as one row for the whole batch (a Hugging
    Face-style rotary module that builds its table with torch.outer(position_ids, inv_freq)), else
    three equal position streams (3, B, T) (Qwen2-VL's M-RoPE, its table (3, B, T, Dh) read from the
    first stream); `ids` keeps the form that ran.
    Raises the failure on (B, T) where none runs."""
    try:
        return call()
    except fp.LearnerFailure as failure:
        forms = (False, "streams")[:2 * _takes(names, ID_NAMES)]  # none where it takes no positions
        ids[0] = next((form for form in forms if _runs_in(call, ids, form)), True)
        return fp.quietly(call) if ids[0] is not True else _raise(failure)


def _runs_in(call: Callable[[], Any], ids: list[bool | str], form: bool | str) -> bool:
    """Whether the module's forward runs with its positions in `form` (POSITION_FORMS), kept in `ids`."""
    ids[0] = form
    return fp.quietly(call) is not None


def _raise(failure: Exception) -> Any:
    raise failure from None


def _own_base(res: ComponentResult, comp: Component, module: Any) -> float:
    """The base a module is compared at: the one check hands it (10000) where it takes one, else the
    one it names or writes in its file (a hard-coded 500000.0), noted; 10000 where it says none."""
    if "theta" in argument_keys(comp.obj).values():
        return THETA
    theta = stated_base(module, DH) or THETA
    res.notes += [text(f"it takes no base and uses its own, {theta:g}: compared at that base",
                       f"它不接收底数，用的是自己的 {theta:g}：按这个底数比较")] * (theta != THETA)
    return theta


def _own_schedule(res: ComponentResult, ctx: Context, comp: Component, module: Any, theta: float,
                  ) -> V.Frequencies:
    """The frequencies a module that holds its own (inv_freq) turns by: theta's plain ones, or one
    base's other ones or their reciprocals (rope_wrong_base, found on its table), compared at theta;
    else those it holds, checked apart against the known schedule they are (Llama 3.1's, linear, YaRN:
    runners/rope_scaling.py) or the one its file names (a departure found at its line).
    Raises the MappingError of frequencies neither explains (never compared with plain RoPE)."""
    got = frequency_buffer(module, DH)  # (its tables are what is checked)
    plain = 1.0 / theta ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH)  # (Dh/2,): pair j's
    one_base = then(got, lambda g: geometric_base(g) or geometric_base(1 / g))  # (or growing)
    if got is None or torch.allclose(got, plain.sort().values, rtol=1e-4) or one_base is not None:
        return theta
    schedule = scheduled(got, module, theta, DH) or named_schedule(module)
    if schedule is None:
        raise MappingError(OWN_UNEXPLAINED["en"], zh=OWN_UNEXPLAINED["zh"])
    held = got.flip(0)  # (Dh/2,): pair j's, the fastest first
    want = SCHEDULES[type(schedule)](plain, schedule, theta)
    err, said = fp.max_error(held / plain, want / plain), schedule_words(schedule)
    res.checks.append(Check(text(f"the frequencies it holds are base {theta:g}'s with {said['en']} (compared "
                                 "as the ratio to each)",
                                 f"它保存的频率是底数 {theta:g} 的频率经过{said['zh']}"
                                 "（按与原频率之比比较）"),
                            err < 1e-6, error_text(err)))
    if err >= 1e-6:
        res.findings += _schedule_departs(source_lines(ctx.objects(comp, "rope")), plain, held, schedule)
    return tuple(held.tolist())


def _schedule_departs(lines: list[tuple[int, str]], plain: Tensor, held: Tensor, schedule: Any,
                      ) -> list[Finding]:
    """Where the frequencies held part from their schedule's: Llama 3.1's by band of wavelengths, the
    others at the first line that writes a frequency."""
    if isinstance(schedule, Llama3RopeScaling):
        return band_departs(lines, plain, held, schedule)
    number, code = first_line([r"freq\w*\s*="], lines)
    return [Finding(DEPARTS, text("the frequencies it holds are not those of the schedule its config names",
                                  "它保存的频率与配置所写方案的频率不同"), number, code)]


OWN_UNEXPLAINED = text(
    "the frequencies it holds (inv_freq) are neither theta^(-2j/d) of one base nor a known scaling of them "
    "(linear, llama3, YaRN at the settings its config names), so its rotation is not compared; a config "
    "with rope_scaling {\"rope_type\": ..., \"factor\": ...} that names its schedule lets check read them",
    "它保存的频率（inv_freq）既不是某个底数的 theta^(-2j/d)，也不是已知的缩放（线性、llama3、按配置设置的 "
    "YaRN），所以不比较它的旋转；在配置里写上 rope_scaling {\"rope_type\": ..., \"factor\": ...} "
    "说明它的方案，check 就能读出")


def _angle_words(theta: V.Frequencies) -> tuple[str, str]:
    """The angles a table is compared with, as a check says them: of a base, or of the frequencies held."""
    return ("pos * f_j (f_j the frequencies it holds)", "pos * f_j（f_j 为它保存的频率）") if isinstance(
        theta, tuple) else ("pos * theta^(-2j/d)", "pos * theta^(-2j/d)")


def _module_table(res: ComponentResult, ctx: Context, comp: Component, call: Callable[..., Any], table: Any,
                  names: list[str], theta: V.Frequencies = THETA) -> ComponentResult:
    """A module whose forward returns the table: checked as a table, with its offset if it takes one."""
    _layout_convention(res, table.layout)
    if not isinstance(theta, tuple):  # (frequencies of a schedule: checked where they were read)
        _base_finding(res, ctx, comp, table, theta)
    err = _table_error(table, theta=theta)
    res.max_abs_error = err
    rows, (en, zh) = table.cos.size(0), _angle_words(theta)
    res.checks.append(Check(text(f"the table's angles are {en} for {rows} positions",
                                 f"表中 {rows} 个位置的角度为 {zh}"), err < TOL,
                            error_text(err)))
    if _takes(names, (*OFFSET_ARGS, *ID_NAMES)):  # (positions: a table's module alone is handed them)
        _table_offset_check(res, ctx, comp, call)
    return finish(res)


MODULE_MISTAKES = ("rope_rotation_sign", "rope_wrong_base:exponent")  # a module's base is its own or given


def _module_layout(out: Tensor | None, q: Tensor, k: Tensor, n: int, theta: V.Frequencies = THETA,
                   ) -> tuple[str, Any] | None:
    """The pairs' layout whose rotation (or its sign flipped) the module's output is, else None."""
    for layout in ("half", "interleaved"):
        found = fp.search(out, lambda fl, layout=layout: _rotated(q, k, n, layout, 0, fl, theta),
                          MODULE_MISTAKES, None, 1) if out is not None else None
        if found is not None:
            return layout, found
    return None


def _per_sequence(outs: list[Any]) -> Any:
    """The outputs of each sequence's call, (T, H, Dh) each, stacked as (B, T, H, Dh); None where they
    are not tensors of one shape."""
    return fp.quietly(lambda: tuple(map(torch.stack, zip(*outs))))  # each a (query, key) pair


def _unflattened(outs: list[Any]) -> Any:
    """The outputs of a call on (B * H, T, Dh), each viewed (B, T, H, Dh) as Meta's reading gives them;
    None where they are not tensors of that size."""
    return fp.quietly(lambda: tuple(o.view(B, H, *o.shape[1:]).transpose(1, 2) for o in outs[0]))


READINGS = {"": None, "meta": META_INPUTS,  # the inputs each reading hands the module, and its note
            "flat": text("inputs (B * H, T, Dh), the heads folded into the batch, as Falcon's and BLOOM's",
                         "输入形状为 (B * H, T, Dh)，头并入 batch 维，与 Falcon、BLOOM 相同"),
            "tokens": text("inputs (T, H, Dh), one sequence at a time, its tokens on dim 0, as gpt-oss's",
                           "输入形状为 (T, H, Dh)，一次一个序列，token 在 dim 0，与 gpt-oss 相同")}


def _module_reading(ctx: Context, call: Callable[..., Any], n: int, q: Tensor, k: Tensor,
                    theta: V.Frequencies) -> tuple[str, Tensor | None, tuple[str, Any] | None]:
    """(the reading of its inputs, the output, its layout): (B, H, T, Dh) first; Meta's (B, T, H, Dh)
    or one sequence (T, H, Dh) (gpt-oss's RotaryEmbedding reads its tokens from dim 0) where the
    first gives no rotation."""
    out = fp.quietly(lambda: _stacked(call(0), n, q.shape))
    best = _module_layout(out, q, k, n, theta)
    for reading in ("meta", "tokens", "flat") * (best is None):
        other = fp.quietly(lambda reading=reading: _stacked(call(0, reading=reading), n, q.shape, True))
        if _module_layout(other, q, k, n, theta) is not None:
            return reading, other, _module_layout(other, q, k, n, theta)
    return "", out if out is not None else _stacked(call(0), n, q.shape), best  # (raises its failure)


def _rotated_module(res: ComponentResult, ctx: Context, comp: Component, call: Callable[..., Any], n: int,
                    q: Tensor, k: Tensor, names: list[str], theta: V.Frequencies = THETA) -> ComponentResult:
    reading, out, best = _module_reading(ctx, call, n, q, k, theta)

    def run(offset: int) -> Tensor | None:
        return _stacked(call(offset, reading=reading), n, q.shape, bool(reading))

    layout, found = best if best else ("half", None)
    res.notes += [READINGS[reading]] * bool(reading)
    _layout_convention(res, layout)
    if found and found[0]:
        res.findings += _findings(ctx, comp, found, out, _rotated(q, k, n, layout, theta=theta))
    err = fp.max_error(out, _rotated(q, k, n, layout, theta=theta))
    res.max_abs_error = err
    res.checks.append(Check(text(f"rotates its input as handformer's apply_rotary ({layout} pairs)",
                                 f"与 handformer 的 apply_rotary（{layout} 配对）旋转结果一致"), err < TOL,
                            error_text(err)))
    if _takes(names, OFFSET_ARGS):
        _offset_check(res, ctx, comp, run, lambda offset, fl: _rotated(q, k, n, layout, offset, fl, theta))
    return finish(res)
