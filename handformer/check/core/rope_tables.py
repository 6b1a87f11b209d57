"""The position arguments a Llama-style forward is handed, in the form that runs, kept once found: the
rotary table of forward(x, freqs_cis, ...), Meta's complex (T, Dh/2) or gpt-fast's, the same numbers
as real pairs (T, Dh/2, 2) (cos, sin); and forward(x, start_pos, ...)'s start, 0 or one a batch row."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def either_table(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool]) -> Any:
    """fn(*args, **kwargs) with kwargs["freqs_cis"] complex, or as real pairs when the complex one is
    refused (or was refused before); when neither runs, the complex one's error is raised."""
    complex_table = kwargs["freqs_cis"]
    if layout.get("real_table"):
        return fn(*args, **{**kwargs, "freqs_cis": torch.view_as_real(complex_table)})
    try:
        out = fn(*args, **kwargs)
        layout["complex_ran"] = True
        return out
    except Exception as first:  # noqa: BLE001  (perhaps it takes the real pairs)
        if layout.get("complex_ran"):  # it ran on the complex table before: this error is theirs
            raise
        try:
            out = fn(*args, **{**kwargs, "freqs_cis": torch.view_as_real(complex_table)})
        except Exception:  # noqa: BLE001  (neither: the complex table's error is theirs)
            raise first from None
        layout["real_table"] = True
        return out


def either_start(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool], B: int) -> Any:
    """fn(*args, **kwargs) with start_pos 0, else one start per batch row, a (B,) tensor (Raschka's
    batched KV cache); the form that runs is kept. When neither runs, the first one's error is raised."""
    if layout.get("per_row"):
        return fn(*args, **{**kwargs, "start_pos": torch.zeros(B, dtype=torch.long)})
    try:
        return fn(*args, **kwargs)
    except Exception as first:  # noqa: BLE001 - theirs, unless a start per row runs
        try:
            out = fn(*args, **{**kwargs, "start_pos": torch.zeros(B, dtype=torch.long)})
        except Exception:  # noqa: BLE001
            raise first from None
        layout["per_row"] = True
        return out


def either_cos_sin(fn: Any, args: list[Any], kwargs: dict[str, Any], layout: dict[str, bool]) -> Any:
    """fn(*args, **kwargs) with nanochat's kwargs["cos_sin"], (cos, sin) each (1, T, 1, Dh/2) for
    queries (B, T, H, Dh) split in halves, else each (1, T, 1, Dh), the angles repeated over the two
    halves (rotate_half's); the form that runs is kept. When neither runs, the first one's error is raised."""
    def full(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t], dim=-1)  # (1, T, 1, Dh)

    if layout.get("full_cos_sin"):
        return fn(*args, **{**kwargs, "cos_sin": tuple(full(t) for t in kwargs["cos_sin"])})
    try:
        return fn(*args, **kwargs)
    except Exception as first:  # noqa: BLE001 - theirs, unless the other form runs
        try:
            out = fn(*args, **{**kwargs, "cos_sin": tuple(full(t) for t in kwargs["cos_sin"])})
        except Exception:  # noqa: BLE001
            raise first from None
        layout["full_cos_sin"] = True
        return out


def renamed_table(fn: Any, params: list[inspect.Parameter]) -> tuple[Any, list[inspect.Parameter]]:
    """fn and its parameters, a rotary table named freqs_complex (Umar Jamil's name) called freqs_cis
    as check names it; fn and params as they are otherwise."""
    if not any(p.name == "freqs_complex" for p in params):
        return fn, params

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{("freqs_complex" if n == "freqs_cis" else n): v for n, v in kwargs.items()})
    return call, [p.replace(name="freqs_cis") if p.name == "freqs_complex" else p for p in params]
