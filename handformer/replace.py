"""Swapping layers of a built model in place, by their full names (`layers.0.self_attn.q_proj`):
how LoRA adapters, their merge and quantization put their own layers where plain ones were."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn


def replace_layers(model: nn.Module, layers: Mapping[str, nn.Module],
                   build: Callable[[nn.Module], nn.Module]) -> list[str]:
    """Put `build(layer)` in place of each module of `layers` (full name -> the module found
    under that name in `model`), in place. Returns the names replaced, in order."""
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, build(layer))  # get_submodule("") is the model
    return list(layers)
