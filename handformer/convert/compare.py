"""Where a port departs from transformers: the largest difference at each stage of the forward.

    found = first_divergence(ours, hf_model, input_ids)
    print(found.report())      # embeddings, each block's attention, FFN and output, final norm, logits
    found.first                # "layers.3.ffn": the first stage past the tolerance, or None

Both models run the same token ids once (no cache, no padding); forward hooks catch what each
stage hands on: the embeddings as the first block sees them, each block's attention output and FFN
output (before their residual sums) and the block's output, the final norm's output (the head's
input) and the logits. The parity tests compare the logits only; this names the first layer that
departs, so a wrong tensor map or a wrong variant is found where it is.

Shape legend: B batch, T length, D d_model, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.models.causal_lm import CausalLM

# the attention module of a block: transformers' Llama-like and GPT-2, Meta's and llama2.c's `attention`
_ATTENTION = ("self_attn", "attn", "attention")
_FFN = ("mlp", "block_sparse_moe", "ffn", "feed_forward")  # the FFN: dense, Mixtral, ours, Meta


@dataclass
class Divergence:
    stages: list[tuple[str, float]]  # (stage, max |ours - transformers|), in forward order
    atol: float
    first: str | None  # the first stage whose difference passes atol; None: the two agree

    def report(self) -> str:
        mark = f"  <- the first past {self.atol:.0e}"
        rows = [f"{name:<22} {diff:.2e}{mark if name == self.first else ''}" for name, diff in self.stages]
        verdict = (f"first divergence: {self.first}" if self.first
                   else f"agree within {self.atol:.0e} at every stage")
        return "\n".join([*rows, verdict])


def _first_tensor(value: Any) -> Tensor:
    return value if isinstance(value, Tensor) else next(v for v in value if isinstance(v, Tensor))


def _child(module: nn.Module, names: tuple[str, ...]) -> nn.Module:
    for name in names:
        if hasattr(module, name):
            return getattr(module, name)
    raise ValueError(f"{type(module).__name__} has none of {', '.join(names)}; compare reads Llama-like and "
                     "GPT-2-like blocks")


def _hf_parts(hf_model: nn.Module) -> tuple[nn.ModuleList, nn.Module]:
    """The transformers model's blocks and output head."""
    base = getattr(hf_model, "model", None) or getattr(hf_model, "transformer", None)
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise ValueError(f"{type(hf_model).__name__} has no model.layers or transformer.h")
    return layers, hf_model.get_output_embeddings()


def _record(layers: nn.ModuleList, head: nn.Module) -> tuple[dict[str, Tensor], list[Any]]:
    """Hooks that fill {stage: tensor (B, T, D)} during one forward; the handles to remove."""
    seen: dict[str, Tensor] = {}

    def keep(name: str, pre: bool = False) -> Any:
        def hook(module: nn.Module, args: Any, kwargs_or_out: Any, out: Any = None) -> None:
            if pre:
                seen[name] = args[0] if args else kwargs_or_out["hidden_states"]
            else:
                seen[name] = _first_tensor(out if out is not None else kwargs_or_out)
        return hook

    handles = [layers[0].register_forward_pre_hook(keep("embeddings", pre=True), with_kwargs=True),
               head.register_forward_pre_hook(keep("final norm", pre=True), with_kwargs=True)]
    for i, layer in enumerate(layers):
        for part, module in (("attention", _child(layer, _ATTENTION)), ("ffn", _child(layer, _FFN)),
                             ("output", layer)):
            handles.append(module.register_forward_hook(keep(f"layers.{i}.{part}"), with_kwargs=True))
    return seen, handles


@torch.no_grad()
def _run(model: nn.Module, layers: nn.ModuleList, head: nn.Module, input_ids: Tensor) -> dict[str, Tensor]:
    seen, handles = _record(layers, head)
    try:
        out = model(input_ids)
        seen["logits"] = out.logits if hasattr(out, "logits") else _first_tensor(out)  # (B, T, V)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def first_divergence(ours: CausalLM, hf_model: nn.Module, input_ids: Tensor,
                     atol: float = 1e-4) -> Divergence:
    """Run `input_ids` (B, T) through handformer's model and transformers' (both in eval mode) and
    compare stage by stage: the largest absolute difference of each, and the first past `atol`.
    The other model may be any Llama-like module with `model.layers` (or `transformer.h`) and
    `get_output_embeddings()`, returning `.logits` or a logits tensor (a course learner's, wrapped)."""
    ours.eval()
    hf_model.eval()
    mine = _run(ours, ours.layers, ours.lm_head, input_ids)
    theirs = _run(hf_model, *_hf_parts(hf_model), input_ids)
    order = ["embeddings", *[f"layers.{i}.{part}" for i in range(len(ours.layers))
                             for part in ("attention", "ffn", "output")], "final norm", "logits"]
    stages = [(name, float((mine[name].float() - theirs[name].float()).abs().max()))
              for name in order if name in mine and name in theirs]
    first = next((name for name, diff in stages if not diff <= atol), None)  # NaN counts as past
    return Divergence(stages, atol, first)


__all__ = ["Divergence", "first_divergence"]
