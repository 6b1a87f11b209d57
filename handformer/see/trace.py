"""`handformer trace`: run a sample batch through a model and print, module by module, the shapes
going in and out and the parameter counts: the tutorials' shape comments, produced by the real code.

A module's shapes are recorded by a forward hook on every call. Tensor arguments are named after the
module's `forward` parameters when there is more than one (`x=(2, 5, 512), memory=(2, 10, 512)`);
a tuple of equal shapes, such as one attention map per layer, is written `6 x (2, 8, 10, 10)`.
A module called with different shapes (positions for the source, then the target) gets one line per
call. Parameters shared between modules (a tied output head) are marked and counted once in the
model's total.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from handformer.config import BlockConfig, CausalLMConfig, Seq2SeqConfig
from handformer.families import build_causal_lm
from handformer.families.gpt2 import GPT2
from handformer.families.llama import LLAMA
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.modes import eval_mode
from handformer.nn.masks import AttentionMask

PRESETS: dict[str, Callable[[], BlockConfig]] = {
    "paper-base": lambda: Seq2SeqConfig(),
    GPT2.model_type: lambda: CausalLMConfig.gpt2_style(),
    LLAMA.model_type: lambda: CausalLMConfig.llama_style(),
}


@dataclass
class Call:
    """The shapes of one call: one item per tensor argument and per tensor in the output."""

    inputs: list[str]
    outputs: list[str]


@dataclass
class TraceRow:
    name: str  # dotted module path, "" for the model itself
    kind: str  # class name
    calls: list[Call]  # distinct calls in the order they happened; empty if never called
    own_params: int  # parameters directly in this module
    total_params: int  # parameters in this module and its children (shared ones counted once)
    notes: list[str] = field(default_factory=list)  # sharing: "weight is tgt_embed.weight", ...

    @property
    def depth(self) -> int:
        return 0 if not self.name else self.name.count(".") + 1


# --- describing values -------------------------------------------------------------------------

def describe(value: Any) -> str | None:
    """Shape text of a value: '(2, 10, 512)' for a tensor; a tuple or list of equal shapes becomes
    '6 x (2, 8, 10, 10)' (also '1 x ...'), of mixed shapes '[(..), (..)]'. None when the value
    holds no tensor."""
    if isinstance(value, Tensor):
        return str(tuple(value.shape))
    if isinstance(value, AttentionMask):  # the mask object a model builds once per forward
        return "causal" if value.is_causal else describe(value.allowed)
    if isinstance(value, (tuple, list)):
        parts = [p for p in (describe(v) for v in value) if p]
        if not parts:
            return None
        if len(set(parts)) == 1:
            return f"{len(parts)} x {parts[0]}"
        return "[" + ", ".join(parts) + "]"
    return None


def describe_output(value: Any) -> list[str]:
    """One item per tensor-holding element: output dataclasses give 'field=shape' items, tuples
    one item per element, a tensor a single item."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        named = ((f.name, describe(getattr(value, f.name))) for f in dataclasses.fields(value))
        return [f"{name}={text}" for name, text in named if text]
    if isinstance(value, (tuple, list)):
        return [text for text in (describe(v) for v in value) if text]
    text = describe(value)
    return [text] if text else []


def describe_inputs(module: nn.Module, args: tuple, kwargs: dict) -> list[str]:
    """The tensor arguments of a call, named after `forward`'s parameters when there are several."""
    try:
        named = list(inspect.signature(module.forward).bind(*args, **kwargs).arguments.items())
    except (TypeError, ValueError):  # no usable signature: fall back to positions
        named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    items = [(name, text) for name, text in ((n, describe(v)) for n, v in named) if text]
    if len(items) == 1:
        return [items[0][1]]
    return [f"{name}={text}" for name, text in items]


# --- running the sample batch ------------------------------------------------------------------

def build_model(cfg: BlockConfig) -> nn.Module:
    if isinstance(cfg, Seq2SeqConfig):
        return Seq2SeqTransformer(cfg)
    if isinstance(cfg, CausalLMConfig):
        return build_causal_lm(cfg)
    raise TypeError(f"no model for config type {type(cfg).__name__}")


def _sample_ids(vocab_size: int, pad_id: int | None, shape: tuple[int, int],
                generator: torch.Generator) -> Tensor:
    ids = torch.randint(0, vocab_size, shape, generator=generator)
    if pad_id is not None and vocab_size > 1:
        ids[ids == pad_id] = (pad_id + 1) % vocab_size  # no padding in the sample batch
    return ids


def _run_sample(model: nn.Module, batch_size: int, src_length: int, tgt_length: int) -> None:
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    if isinstance(model, Seq2SeqTransformer):
        src = _sample_ids(cfg.src_vocab_size, cfg.pad_id, (batch_size, src_length), g)
        tgt = _sample_ids(cfg.tgt_vocab_size, cfg.pad_id, (batch_size, tgt_length), g)
        model(src, tgt, need_weights=True)
    elif isinstance(model, CausalLM):
        model(_sample_ids(cfg.vocab_size, None, (batch_size, src_length), g), need_weights=True)
    else:
        raise TypeError(f"trace supports Seq2SeqTransformer and CausalLM, not {type(model).__name__}")


def trace(model: nn.Module, batch_size: int = 2, src_length: int = 10, tgt_length: int = 5,
          ) -> list[TraceRow]:
    """Run one random batch (attention weights requested, no gradients, eval mode) and record every
    module's shapes. src_length is the prompt length for a CausalLM; tgt_length is unused there."""
    for name, value in (("batch_size", batch_size), ("src_length", src_length),
                        ("tgt_length", tgt_length)):
        if value <= 0:
            raise ValueError(f"trace {name} must be a positive integer, got {value}")
    calls: dict[int, list[Call]] = {}  # by module identity, so a shared module collects every call

    def record(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        call = Call(describe_inputs(module, args, kwargs), describe_output(out))
        seen = calls.setdefault(id(module), [])
        if call not in seen:
            seen.append(call)

    hooks = [m.register_forward_hook(record, with_kwargs=True) for m in model.modules()]
    try:
        with eval_mode(model), torch.no_grad():
            _run_sample(model, batch_size, src_length, tgt_length)
    finally:
        for h in hooks:
            h.remove()
    return _rows(model, calls)


def _rows(model: nn.Module, calls: dict[int, list[Call]]) -> list[TraceRow]:
    first_param_name = {id(p): name for name, p in reversed(list(model.named_parameters()))}
    first_module_name: dict[int, str] = {}
    rows = []
    for name, module in model.named_modules(remove_duplicate=False):
        notes = []
        if id(module) in first_module_name:
            notes.append(f"same module as {first_module_name[id(module)] or '(model)'}")
        else:
            first_module_name[id(module)] = name
            for pname, p in module.named_parameters(recurse=False):
                owner = first_param_name[id(p)]
                if owner != (f"{name}.{pname}" if name else pname):
                    notes.append(f"{pname} is {owner} (tied, counted once)")
        own = sum(p.numel() for p in module.parameters(recurse=False))
        total = sum(p.numel() for p in module.parameters())
        rows.append(TraceRow(name, type(module).__name__, calls.get(id(module), []), own, total, notes))
    return rows


# --- the table ---------------------------------------------------------------------------------

def _wrap(items: Sequence[str], width: int) -> list[str]:
    """Join items with ', ' into lines of at most `width` characters, breaking between items only
    (an item longer than the width gets a line of its own, never cut)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1] += ", " + item
        else:
            if lines:
                lines[-1] += ","
            lines.append(item)
    return lines or [""]


def _cells(row: TraceRow, width: int) -> list[tuple[str, str]]:
    """(input, output) text lines of one row: the calls one after another, each wrapped."""
    if not row.calls:
        return [("(container)" if row.kind in ("ModuleList", "ModuleDict") else "(not called)", "")]
    cells = []
    for i, call in enumerate(row.calls):
        prefix = f"call {i + 1}: " if len(row.calls) > 1 else ""
        ins = _wrap(call.inputs, width - len(prefix))
        ins = [prefix + ins[0]] + [" " * len(prefix) + line for line in ins[1:]]
        outs = _wrap(call.outputs, width)
        n = max(len(ins), len(outs))
        cells += list(zip(ins + [""] * (n - len(ins)), outs + [""] * (n - len(outs))))
    return cells


def format_trace(rows: list[TraceRow], max_depth: int | None = None, shape_width: int = 40) -> str:
    """The trace as a table: module, type, parameters, input shapes, output shapes.

    Shape lists longer than `shape_width` wrap between shapes; nothing is cut. Rows deeper than
    `max_depth` (0 = the model only) are left out. Shared parameters are marked with '*' and
    explained below the table.
    """
    shown = [r for r in rows if max_depth is None or r.depth <= max_depth]
    labels = ["  " * r.depth + (r.name.rsplit(".", 1)[-1] if r.name else "(model)") for r in shown]
    params = [f"{r.total_params:,}" + (" *" if r.notes else "  ") for r in shown]
    cells = [_cells(r, shape_width) for r in shown]
    w_mod = max(len("module"), *map(len, labels))
    w_type = max(len("type"), *(len(r.kind) for r in shown))
    w_par = max(len("params  "), *map(len, params))
    w_in = max(shape_width, *(len(i) for c in cells for i, _ in c))

    def line(a: str, b: str, c: str, d: str, e: str) -> str:
        return f"{a:<{w_mod}}  {b:<{w_type}}  {c:>{w_par}}  {d:<{w_in}}  {e}".rstrip()

    out = [line("module", "type", "params  ", "input shapes", "output shapes")]
    out.append(line("-" * w_mod, "-" * w_type, "-" * w_par, "-" * w_in, "-" * len("output shapes")))
    for label, row, par, row_cells in zip(labels, shown, params, cells):
        (first_in, first_out), *rest = row_cells
        out.append(line(label, row.kind, par, first_in, first_out))
        out += [line("", "", "", i, o) for i, o in rest]
    notes = [f"  {r.name or '(model)'}: {note}" for r in shown for note in r.notes]
    if notes:
        out += ["", "* shared with an earlier module:", *notes]
    return "\n".join(out)
