"""The position arguments a Llama-style forward is handed, in the form that runs, kept once found: the
rotary table of forward(x, freqs_cis, ...), Meta's complex (T, Dh/2) or gpt-fast's, the same numbers
as real pairs (T, Dh/2, 2) (cos, sin); and forward(x, start_pos, ...)'s start, 0 or one a batch row."""

from __future__ import annotations

import inspect
import itertools
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.rotary import cos_sin
from handformer.check.core.source import source_text
from handformer.check.reference import variants as V


def either_form(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool], key: str,
                second: Callable[[dict[str, Any]], dict[str, Any]], keep_first: bool = False) -> Any:
    """fn(*args, **kwargs), else fn(*args, **second(kwargs)) when the first form is refused; the
    second form, once it ran, is kept (layout[key] True). keep_first: the first form, once it ran, is
    kept too (layout[key] False: a later error is theirs). When neither runs, the first one's error
    is raised."""
    if layout.get(key) is not None:
        return fn(*args, **(second(kwargs) if layout[key] else kwargs))
    try:
        out = fn(*args, **kwargs)
    except Exception as first:  # noqa: BLE001 - theirs, unless the second form runs
        try:
            out = fn(*args, **second(kwargs))
        except Exception:  # noqa: BLE001
            raise first from None
        layout[key] = True
        return out
    layout.update({key: False} if keep_first else {})
    return out


def either_table(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any], B: int) -> Any:
    """fn(*args, **kwargs) with kwargs["freqs_cis"] complex or as real pairs (_complex_or_real), else as
    the angles themselves (lucidrains' rotary_pos_emb, its cos and sin taken inside: either_angles) where
    neither form ever ran; when none runs, the complex one's error."""
    if layout.get("angle_pairs") is not None:
        return either_angles(fn, args, kwargs, layout)
    try:
        return _complex_or_real(fn, args, kwargs, layout, B)
    except Exception as first:  # noqa: BLE001 - theirs, unless the angles run
        if layout.get("real_table") is not None:  # a form of the table ran before: the error is theirs
            raise
        try:
            return either_angles(fn, args, kwargs, layout)
        except Exception:  # noqa: BLE001
            raise first from None


def either_angles(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any]) -> Any:
    """fn(*args, **kwargs), its table the rotary angles (T, Dh) (lucidrains' RotaryEmbedding returns
    them, apply_rotary_pos_emb takes their cos and sin), in the pairing it rotates by (PAIRINGS), read
    once as paired_tables reads it: moving every position by SHIFT leaves the output as it was in the
    pairing the code rotates by. Not read at one position, where either pairing keeps the output."""
    pairs = layout.get("angle_pairs")
    if pairs is None:
        pairs = next((p for p in (False, True) if not _angles_moved(fn, args, kwargs, p)), False)
        layout.update({"angle_pairs": pairs} if kwargs["freqs_cis"].size(-2) > 1 else {})
    return fn(*args, **_angled(kwargs, 0, pairs))


def _angles_moved(fn: Any, args: list[Any], kwargs: dict[str, Any], pairs: bool) -> bool:
    a, b = (fp.first_tensor(fn(*args, **_angled(kwargs, shift, pairs))) for shift in (0, SHIFT))
    return fp.max_error(a, b) > 1e-9


def _angled(kwargs: dict[str, Any], shift: int, pairs: bool) -> dict[str, Any]:
    """kwargs with the complex table (T, Dh/2) as its angles (T, Dh) for positions shift .. shift + T - 1."""
    table = kwargs["freqs_cis"]
    angles = V.rope_angles(table.size(-2), 2 * table.size(-1), offset=shift)  # (T, Dh/2)
    return {**kwargs, "freqs_cis": PAIRINGS[pairs](angles).to(table.real.dtype)}  # (T, Dh)


def _complex_or_real(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any], B: int) -> Any:
    """fn(*args, **kwargs) with kwargs["freqs_cis"] complex, or as real pairs when the complex one is
    refused (once the complex one ran, an error is theirs): (T, Dh/2, 2), else with a batch axis in
    front, (1, T, Dh/2, 2) (GLM-4's apply function views its rope_cache (-1, 1, T, Dh/2, 2)); when none
    runs, the complex one's."""
    def run(*a: Any, **k: Any) -> Any:
        if k["freqs_cis"].is_complex():
            return fn(*a, **k)
        return either_form(fn, list(a), k, layout, "batched_table",
                           lambda k: {**k, "freqs_cis": k["freqs_cis"][None]})  # (1, T, Dh/2, 2)
    return either_form(run, args, kwargs, layout, "real_table",
                       lambda k: {**k, "freqs_cis": torch.view_as_real(k["freqs_cis"])}, keep_first=True)


def either_start(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool], B: int) -> Any:
    """fn(*args, **kwargs) with start_pos 0, else one start per batch row, a (B,) tensor (Raschka's
    batched KV cache); the form that runs is kept. When neither runs, the first one's error is raised."""
    return either_form(fn, args, kwargs, layout, "per_row",
                       lambda k: {**k, "start_pos": torch.zeros(B, dtype=torch.long)})


def either_cos_sin(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool], B: int) -> Any:
    """fn(*args, **kwargs) with nanochat's kwargs["cos_sin"], (cos, sin) each (1, T, 1, Dh/2) for
    queries (B, T, H, Dh) split in halves, else each (1, T, 1, Dh), the angles repeated over the two
    halves (rotate_half's); the form that runs is kept. When neither runs, the first one's error is raised."""
    return either_form(fn, args, kwargs, layout, "full_cos_sin",
                       lambda k: {**k, "cos_sin": tuple(torch.cat([t, t], dim=-1) for t in k["cos_sin"])})


Shaping = Callable[[dict[str, Any]], dict[str, Any]]  # the tables (T, Dh) of kwargs as a forward takes them
SHIFT = 3  # positions every token is moved by in the test of a rotary table's pairing
# a table's angles (T, Dh/2) over a head: repeated over the two halves (rotate_half's, handformer's), or
# each repeated in place for pairs (2j, 2j+1) (Cohere's and GPT-J's repeat_interleave)
PAIRINGS = {False: lambda angles: torch.cat([angles, angles], -1), True: lambda a: a.repeat_interleave(2, -1)}
TRIG = {"cos": torch.cos, "sin": torch.sin}


def paired_tables(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any],
                  names: tuple[str, ...], shaped: Shaping) -> dict[str, Any]:
    """kwargs with the (cos, sin) tables (T, Dh) under `names` in the pairing the forward rotates by
    (PAIRINGS), then `shaped` as it takes them; the pairing read once (layout["pairs"]) from what RoPE
    keeps: q·k depends on positions only through their difference, so moving every position by SHIFT
    leaves the output as it was in the pairing the code rotates by, and moves it in the other. The
    halves' unless only pairs keep it; unread (the halves') while the forward refuses that shape."""
    if "pairs" not in layout:
        halves, pairs = (_moved(fn, args, kwargs, names, p, shaped) for p in (False, True))
        if {halves, pairs} == {None}:
            return shaped(_retabled(kwargs, names, 0, False))
        layout["pairs"] = halves is not False and pairs is False
    return shaped(_retabled(kwargs, names, 0, layout["pairs"]))


def _moved(fn: Any, args: list[Any], kwargs: dict[str, Any], names: tuple[str, ...], pairs: bool,
           shaped: Shaping) -> bool | None:
    """Whether moving every position by SHIFT moves the output, in this pairing; None where the
    forward refuses the tables so shaped."""
    try:
        a, b = (fp.first_tensor(fn(*args, **shaped(_retabled(kwargs, names, shift, pairs))))
                for shift in (0, SHIFT))
    except Exception:  # noqa: BLE001 - a form it refuses: its own tries report it
        return None
    return fp.max_error(a, b) > 1e-9


def _retabled(kwargs: dict[str, Any], names: tuple[str, ...], shift: int, pairs: bool) -> dict[str, Any]:
    """kwargs with each table (T, Dh) under `names` rebuilt for positions shift .. shift + T - 1."""
    return {**kwargs, **{name: _table(kwargs[name], name, shift, pairs) for name in names}}


def _table(t: Any, name: str, shift: int, pairs: bool) -> Any:
    """A cos or sin table (T, Dh), or Hugging Face's (cos, sin) pair, rebuilt so."""
    if name == "position_embeddings":
        return _table(t[0], "cos", shift, pairs), _table(t[1], "sin", shift, pairs)
    angles = PAIRINGS[pairs](V.rope_angles(t.size(-2), t.size(-1), offset=shift))  # (T, Dh)
    return TRIG[name](angles).to(t.dtype).expand(t.shape)


def either_shape(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any],
                 names: tuple[str, ...], shapes: tuple[Shaping, ...]) -> Any:
    """fn(*args, **kwargs), its (cos, sin) tables (T, Dh) under `names` paired as it rotates
    (paired_tables) in the first of `shapes` it takes; the shape that ran is kept (layout["shape"]: a
    later error is theirs; not at one position, where every shape broadcasts and either pairing
    keeps the output). When none runs, the first one's error is raised."""
    layout = layout if fp.first_tensor(kwargs[names[0]]).size(-2) > 1 else dict(layout)
    shapes = shapes[:layout.get("upto") or len(shapes)]  # the plain shapes alone (either_width)
    if layout.get("shape") is not None:
        return fn(*args, **paired_tables(fn, args, kwargs, layout, names, shapes[layout["shape"]]))
    first = None
    for i, shaped in enumerate(shapes):
        try:
            out = fn(*args, **paired_tables(fn, args, kwargs, layout, names, shaped))
        except Exception as err:  # noqa: BLE001 - theirs, unless a later shape runs
            first = first or err
            continue
        layout["shape"] = i
        return out
    raise first  # type: ignore[misc]


def _shaped(names: tuple[str, ...], form: Callable[[Tensor], Tensor], order: int = 1) -> Shaping:
    """The kwargs with each table (T, Dh) under `names` (or in the (cos, sin) pair there) reshaped by
    `form`; order -1: the pair handed as (sin, cos) (GPT-J's)."""
    def shaped(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**kwargs, **{name: tuple(map(form, kwargs[name][::order])) if isinstance(kwargs[name], tuple)
                             else form(kwargs[name]) for name in names}}
    return shaped


STREAMS = 3  # M-RoPE's position streams: time, height, width


def _cos_sin_shapes(names: tuple[str, ...], B: int) -> tuple[Shaping, ...]:
    """The shapes a forward may take its (cos, sin) tables (T, Dh) in: minimind's and Raschka's
    (T, Dh); Hugging Face's (B, T, Dh) (the heads' axis unsqueezed inside); Qwen's (1, T, 1, Dh) for
    queries (B, T, H, Dh); Qwen2-VL's (3, B, T, Dh), a table for each of three position streams
    (M-RoPE), all equal as for text; GPT-J's (sin, cos) of one angle a pair, (B, T, Dh/2) each."""
    return (_shaped(names, lambda t: t), _shaped(names, lambda t: t[None].expand(B, -1, -1)),
            _shaped(names, lambda t: t[None, :, None]),
            _shaped(names, lambda t: t.expand(STREAMS, B, -1, -1)),
            _shaped(names, lambda t: t[None, :, :t.size(-1) // 2].expand(B, -1, -1), order=-1))


def either_cos_sin_layout(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any],
                          B: int) -> Any:
    """A forward handed (cos, sin) as position_embeddings, in the shape it takes (_cos_sin_shapes)."""
    names = ("position_embeddings",)
    return either_shape(fn, args, kwargs, layout, names, _cos_sin_shapes(names, B))


def either_cos_sin_tables(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any],
                          B: int) -> Any:
    """A forward handed cos and sin as two arguments (Raschka's; Gemma's forward(x, cos, sin, mask)),
    in the shape it takes (_cos_sin_shapes; the pair's order as its names say)."""
    names = tuple(sorted({"cos", "sin"} & kwargs.keys()))
    return either_shape(fn, args, kwargs, layout, names, _cos_sin_shapes(names, B)[:PLAIN_SHAPES])


def alibi_argument(B: int, H: int, S: int, dtype: torch.dtype) -> Tensor:
    """ALiBi's term as BLOOM's model hands it to each attention: (B * H, 1, S), each head's slope times
    the key's position (the same for every query)."""
    alibi = V.alibi_slopes(H)[:, None, None] * torch.arange(S, dtype=torch.float64)  # (H, 1, S)
    return alibi.repeat(B, 1, 1).to(dtype)  # (B * H, 1, S)


def either_alibi(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool], B: int) -> Any:
    """fn(*args, **kwargs) with kwargs["alibi"] (B * H, 1, S) for baddbmm, else (B, H, 1, S) for scores
    of (B, H, T, S); the form that runs is kept. When neither runs, the first one's error is raised."""
    return either_form(fn, args, kwargs, layout, "alibi_4d",
                       lambda k: {**k, "alibi": k["alibi"].view(B, -1, 1, k["alibi"].size(-1))})



# the rotary tables (and ALiBi's term) a forward may take in two forms, and the call that tries both
TABLE_FORMS = {"freqs_cis": either_table, "cos_sin": either_cos_sin,
               "position_embeddings": either_cos_sin_layout, "cos": either_cos_sin_tables,
               "alibi": either_alibi}


def with_tables(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, Any], B: int) -> Any:
    """fn(*args, **kwargs), its rotary table (kwargs' freqs_cis, cos_sin or position_embeddings) in
    the form it takes (TABLE_FORMS); (cos, sin) tables at a narrower width where it turns only part of
    each head (either_width)."""
    form = next((TABLE_FORMS[name] for name in TABLE_FORMS if name in kwargs), None)
    if form in NARROWED:
        return either_width(form, fn, list(args), kwargs, layout, B)
    return form(fn, list(args), kwargs, layout, B) if form else fn(*args, **kwargs)


def _narrow(t: Tensor, width: int, sine: bool) -> Tensor:
    """A cos (or sin) table (..., T, Dh) rebuilt for a rotary width below the head's, (..., T, width)."""
    return cos_sin(t.size(-2), width)[sine].to(t.dtype).expand(*t.shape[:-1], width)


# the (cos, sin) tables of a form, rebuilt for the part of each head that turns (partial rotary: Phi's
# partial_rotary_factor, GPT-NeoX's rotary_pct): the kwargs handed, and that width
NARROWED: dict[Callable[..., Any], Callable[[dict[str, Any], int], dict[str, Any]]] = {
    either_cos_sin_layout: lambda k, w: {**k, "position_embeddings": (
        _narrow(k["position_embeddings"][0], w, False), _narrow(k["position_embeddings"][1], w, True))},
    either_cos_sin_tables: lambda k, w: {**k, **{n: _narrow(k[n], w, n == "sin")
                                                 for n in {"cos", "sin"} & k.keys()}},
}


def either_width(form: Callable[..., Any], fn: Any, args: list[Any], kwargs: dict[str, Any],
                 layout: dict[str, Any], B: int) -> Any:
    """form(fn, ...) with (cos, sin) tables as wide as a head, else as wide as the part of it that
    turns (2, 4, ... below the head's width: partial rotary); the share of the head that runs is kept
    (layout["share"], 1 for the whole head) for later calls at other widths. Every width is tried in
    the plain shapes before any in GPT-J's (sin, cos) of half the width: a (cos, sin) pair for the
    first dims of a head also runs so, read the other way round. When none runs, the first error is
    raised."""
    head = kwargs.get("cos", kwargs.get("position_embeddings", [None])[0]).size(-1)  # a head's width
    if layout.get("share") is not None:
        return form(fn, args, NARROWED[form](kwargs, round(layout["share"] * head)), layout, B)
    first = None
    for upto, width in itertools.product(SHAPES_FIRST[_sin_first(fn)], (head, *range(2, head, 2))):
        layout["upto"] = upto
        try:
            out = form(fn, args, kwargs if width == head else NARROWED[form](kwargs, width), layout, B)
        except Exception as err:  # noqa: BLE001 - theirs, unless another width or shape runs
            first = first or err
            continue
        finally:
            layout.pop("upto")
        layout["share"] = width / head
        return out
    raise first  # type: ignore[misc]


PLAIN_SHAPES = 4  # the shapes of _cos_sin_shapes before GPT-J's (sin, cos)
# code that names sin before cos (GPT-J's `sin, cos = position_embeddings`) tries every shape at each
# width, GPT-J's included; else the plain shapes at every width come first
SHAPES_FIRST = {False: (PLAIN_SHAPES, None), True: (None,)}


def _sin_first(fn: Any) -> bool:
    """Whether `fn`'s code names `sin` before `cos` (the order it takes its tables in)."""
    names = re.findall(r"\b(sin|cos)\b", source_text(getattr(fn, "forward", fn)))  # (a module: its forward)
    return names[:1] == ["sin"]


def with_positions(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool], B: int) -> Any:
    """fn(*args, **kwargs), each position argument in the form it takes: start_pos 0 or one a batch
    row (either_start), the rotary table as with_tables; the forms that ran are kept in layout."""
    def tables(*a: Any, **k: Any) -> Any:
        return with_tables(fn, list(a), k, layout, B)
    if "start_pos" in kwargs:
        return either_start(tables, args, kwargs, layout, B)
    if POSITION_NAMES & kwargs.keys():
        return either_positions(tables, args, kwargs, layout, B)
    return tables(*args, **kwargs)


POSITION_NAMES = {"position_ids", "positions", "pos", "input_pos"}


def either_positions(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool],
                     B: int) -> Any:
    """fn(*args, **kwargs) with the positions (B, T), else one row of them, (T,) (Mistral's
    forward(x, freqs_cis, positions, mask, cache)); the form that runs is kept. When neither runs, the
    first one's error is raised."""
    names = {n for n in POSITION_NAMES & kwargs.keys() if getattr(kwargs[n], "dim", int)() > 1}  # (B, T)
    return either_form(fn, args, kwargs, layout, "one_row", lambda k: {**k, **{n: k[n][0] for n in names}})


def _meta_table(B: int, T: int, head_dim: int, dtype: torch.dtype, batched: bool) -> Tensor:
    """Meta's complex table (T, Dh/2), of the inputs' precision (its real pairs, gpt-fast's and
    ChatGLM's (T, Dh/2, 2), then in their dtype)."""
    angles = V.rope_angles(T, head_dim).to(dtype if dtype.is_floating_point else torch.float64)  # (T, Dh/2)
    return torch.polar(torch.ones_like(angles), angles)


def _hf_cos_sin(B: int, T: int, head_dim: int, dtype: torch.dtype, batched: bool) -> tuple[Tensor, ...]:
    """(cos, sin), each (T, Dh), or (B, T, Dh) as Hugging Face's rotary module returns them."""
    tables = cos_sin(T, head_dim)
    if batched:
        tables = tuple(t[None].expand(B, T, -1) for t in tables)  # (B, T, Dh) each
    return tuple(t.to(dtype) for t in tables)


def _nanochat_cos_sin(B: int, T: int, head_dim: int, dtype: torch.dtype, batched: bool,
                      ) -> tuple[Tensor, Tensor]:
    angles = V.rope_angles(T, head_dim)[None, :, None]  # (1, T, 1, Dh/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _one_table(name: str) -> Callable[..., Tensor]:
    """Raschka's cos or sin (T, Dh); llama2.c's freqs_cos or freqs_sin (T, Dh/2): one angle a pair."""
    pairs = 2 if name.startswith("freqs") else 1

    def table(B: int, T: int, head_dim: int, dtype: torch.dtype, batched: bool) -> Tensor:
        return cos_sin(T, head_dim)[name.endswith("sin")][:, :head_dim // pairs].to(dtype)
    return table


def _positions(B: int, T: int, head_dim: int, dtype: torch.dtype, batched: bool) -> Tensor:
    return torch.arange(T)[None].expand(B, T)  # (B, T)


# what a forward's position argument is handed, by its name, for a batch B of T tokens
POSITION_ARGUMENTS: dict[str, Callable[..., Any]] = {
    "freqs_cis": _meta_table, "position_embeddings": _hf_cos_sin,
    "cos_sin": _nanochat_cos_sin,  # nanochat's (cos, sin), each (1, T, 1, Dh/2); either_cos_sin
    **{name: _one_table(name) for name in ("cos", "sin", "freqs_cos", "freqs_sin")},
    "start_pos": lambda *sizes: 0,  # or one a batch row: either_start
    **dict.fromkeys(("position_ids", "positions", "pos", "input_pos"), _positions)}


def position_kwargs(names: set[str], B: int, T: int, head_dim: int, dtype: torch.dtype,
                    batched: bool = False) -> dict[str, Any]:
    """What a forward's position arguments are given: Meta's freqs_cis (T, Dh/2), Hugging Face's
    position_embeddings (batched: (B, T, Dh)), Raschka's cos and sin (T, Dh), start_pos 0, the
    positions (B, T)."""
    return {name: POSITION_ARGUMENTS[name](B, T, head_dim, dtype, batched) for name in names}


# the names a complex rotary table goes by besides check's freqs_cis: Umar Jamil's, minimind's
TABLE_ALIASES = ("freqs_complex", "pos_cis", "rotary_pos_emb")
# every name of a complex table (T, Dh/2) an apply function takes: Meta's and the aliases
COMPLEX_TABLE_NAMES = ("freqs_cis", "freqs", *TABLE_ALIASES, "rope_cache")  # ChatGLM's apply function's


# the names Qwen's (cos, sin) pair goes by besides Hugging Face's position_embeddings (a required argument)
PAIR_ALIASES = ("rotary_pos_emb",)


def renamed_table(fn: Any, params: list[inspect.Parameter], owner: Any = None,
                  ) -> tuple[Any, list[inspect.Parameter]]:
    """fn and its parameters, a rotary table named as in TABLE_ALIASES (Umar Jamil's freqs_complex,
    minimind's pos_cis, ChatGLM's rotary_pos_emb) called freqs_cis as check names it; where the file of
    `owner` (fn's own by default) unpacks that argument as a pair (Qwen's `cos, sin = rotary_pos_emb`), a
    required one is called position_embeddings instead; fn and params as they are otherwise."""
    module = sys.modules.get(getattr(owner or fn, "__module__", None) or "")
    pairs = {p.name for p in params if p.name in PAIR_ALIASES and re.search(
        rf"^\s*\w+\s*,\s*\w+\s*=\s*{p.name}\s*(#.*)?$", source_text(module), re.M)}
    alias = next((p.name for p in params if p.name in TABLE_ALIASES and p.name not in pairs), None)
    fn, params = renamed(fn, params, alias, "freqs_cis")
    pair = next((p.name for p in params if p.name in pairs and p.default is p.empty), None)
    return renamed(fn, params, pair if "position_embeddings" not in {p.name for p in params} else None,
                   "position_embeddings")


def renamed(fn: Any, params: list[inspect.Parameter], alias: str | None, name: str,
            ) -> tuple[Any, list[inspect.Parameter]]:
    """fn and its parameters, its argument `alias` called `name` as check names it (as they are where
    alias is None)."""
    if alias is None:
        return fn, params

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{(alias if n == name else n): v for n, v in kwargs.items()})
    return call, [p.replace(name=name) if p.name == alias else p for p in params]
