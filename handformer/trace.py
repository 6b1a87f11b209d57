"""`handformer trace`: run a sample batch through a model and print, module by module, the input
and output shapes and the parameter counts: the tutorials' shape comments, produced by the real code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.causal_lm import CausalLM
from handformer.config import BlockConfig, CausalLMConfig, Seq2SeqConfig
from handformer.seq2seq import Seq2SeqTransformer

PRESETS: dict[str, Any] = {
    "paper-base": lambda: Seq2SeqConfig(),
    "gpt2": lambda: CausalLMConfig.gpt2_style(),
    "llama": lambda: CausalLMConfig.llama_style(),
}


@dataclass
class TraceRow:
    name: str  # dotted module path, "" for the model itself
    kind: str  # class name
    inputs: str
    outputs: str
    own_params: int  # parameters directly in this module
    total_params: int  # parameters in this module and its children (shared ones counted once)


def describe(value: Any) -> str:
    """Shapes of the tensors in a (possibly nested) value, e.g. '(2, 10, 512)'."""
    if isinstance(value, Tensor):
        return str(tuple(value.shape))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = tuple(getattr(value, f.name) for f in dataclasses.fields(value))
    if isinstance(value, (tuple, list)):
        parts = [describe(v) for v in value if v is not None]
        parts = [p for p in parts if p]
        return ", ".join(parts) if len(parts) <= 3 else f"{parts[0]}, ... x{len(parts)}"
    return ""


def build_model(cfg: BlockConfig) -> nn.Module:
    if isinstance(cfg, Seq2SeqConfig):
        return Seq2SeqTransformer(cfg)
    if isinstance(cfg, CausalLMConfig):
        return CausalLM(cfg)
    raise TypeError(f"no model for config type {type(cfg).__name__}")


def trace(model: nn.Module, batch_size: int = 2, src_length: int = 10, tgt_length: int = 5,
          ) -> list[TraceRow]:
    """Run one sample batch (weights requested) and record every module's shapes."""
    cfg = model.cfg
    seen: dict[str, tuple[str, str]] = {}
    hooks = []
    for name, module in model.named_modules():
        def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any, name: str = name) -> None:
            if name not in seen:  # the first call (tied modules may run twice)
                seen[name] = (describe(list(args) + list(kwargs.values())), describe(out))
        hooks.append(module.register_forward_hook(hook, with_kwargs=True))
    g = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            model.eval()
            if isinstance(model, Seq2SeqTransformer):
                src = torch.randint(1, cfg.src_vocab_size, (batch_size, src_length), generator=g)
                tgt = torch.randint(1, cfg.tgt_vocab_size, (batch_size, tgt_length), generator=g)
                model(src, tgt, need_weights=True)
            else:
                ids = torch.randint(0, cfg.vocab_size, (batch_size, src_length), generator=g)
                model(ids, need_weights=True)
    finally:
        for h in hooks:
            h.remove()

    rows = []
    for name, module in model.named_modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        total = sum(p.numel() for p in module.parameters())
        inputs, outputs = seen.get(name, ("(not called)", ""))
        rows.append(TraceRow(name, type(module).__name__, inputs, outputs, own, total))
    return rows


def format_trace(rows: list[TraceRow], max_depth: int | None = None) -> str:
    lines = [f"{'module':<44} {'type':<20} {'input shapes':<30} {'output shapes':<30} {'params':>12}"]
    for r in rows:
        depth = 0 if not r.name else r.name.count(".") + 1
        if max_depth is not None and depth > max_depth:
            continue
        label = ("  " * depth + (r.name.rsplit(".", 1)[-1] if r.name else "(model)"))[:44]
        lines.append(f"{label:<44} {r.kind:<20} {r.inputs[:30]:<30} {r.outputs[:30]:<30} "
                     f"{r.total_params:>12,}")
    return "\n".join(lines)
