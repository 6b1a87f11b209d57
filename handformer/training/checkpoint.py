"""Weights and training state on disk, as safetensors (never pickle), always written atomically.

- `model.safetensors`: the model's weights. Tied weights are stored once.
- A model with LoRA adapters stores only what trains: its frozen weights belong to the base run it
  was built from, and loading leaves them as they are.
- `checkpoint.safetensors`: everything needed to resume: weights, optimizer moments, the RNG state,
  and the loop's counters (step, epoch, position, best validation loss) as JSON metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save
from torch import Tensor, nn

from handformer.io import atomic_write_bytes


def trainable_names(model: nn.Module) -> set[str] | None:
    """In a model with adapters over a frozen base (LoRA: a module whose class sets `frozen_base =
    True`): the names of its trainable parameters, the only tensors such a run saves (its frozen
    weights are its base run's). None otherwise: every tensor of the state dict is the model's own
    (frozen ones too, e.g. quantized weights)."""
    if not any(getattr(m, "frozen_base", False) for m in model.modules()):
        return None
    return {name for name, p in model.named_parameters() if p.requires_grad}


def unique_state_dict(model: nn.Module, full_state: dict[str, Tensor] | None = None,
                      ) -> dict[str, Tensor]:
    """The model's state dict with each shared tensor (tied embeddings) kept under its first name,
    and without frozen weights when some are frozen (`trainable_names`).
    `full_state`: weights gathered from a sharded (FSDP) model, to store under the names that
    `model.state_dict()` would keep."""
    keep = trainable_names(model)
    if full_state is not None:
        return {k: full_state[k].detach().cpu().contiguous() for k in _unique_names(model)
                if keep is None or k in keep}
    seen: set[object] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        if keep is not None and name not in keep:
            continue
        # A tied weight is the same tensor under two names; distinct views of one storage (e.g.
        # q/k/v split from a fused checkpoint matrix) share the storage but not the data.
        key = (tensor.data_ptr(), tensor.shape, tensor.stride()) if tensor.numel() else id(tensor)
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().cpu().contiguous()
    return out


def _unique_names(model: nn.Module) -> list[str]:
    """The state-dict names that remain after dropping tied copies (parameters shared by object)."""
    seen: set[int] = set()
    names = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            names.append(name)
    return names


def load_into(model: nn.Module, tensors: dict[str, Tensor], source: str) -> None:
    """Load weights strictly: the only keys allowed to be missing are tied copies of present ones
    and, in a model with frozen weights (LoRA), the frozen ones."""
    expected = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (model: {tuple(expected[k].shape)})" for k, v in tensors.items()
             if k in expected and v.shape != expected[k].shape]
    if wrong:  # load_state_dict would raise a RuntimeError listing every tensor
        raise ValueError(f"{source} does not match the model: shape mismatch for {', '.join(wrong)}")
    result = model.load_state_dict(tensors, strict=False)
    state = model.state_dict()
    tied = {name for name, t in state.items()
            if any(t.data_ptr() == state[k].data_ptr() for k in tensors if k != name and k in state)}
    keep = trainable_names(model)
    missing = [k for k in result.missing_keys if k not in tied and (keep is None or k in keep)]
    if missing or result.unexpected_keys:
        raise ValueError(f"{source} does not match the model: missing {missing or 'none'}, "
                         f"unexpected {result.unexpected_keys or 'none'}")


def save_weights(model: nn.Module, path: str | os.PathLike,
                 full_state: dict[str, Tensor] | None = None) -> None:
    atomic_write_bytes(path, st_save(unique_state_dict(model, full_state)))


def safetensors_problem(path: Path, error: Exception | None = None) -> str:
    """What is wrong with a file that safetensors cannot read, in words."""
    if path.is_dir():
        return "it is a directory, not a file"
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:1] == b"\x80" or head[:4] == b"PK\x03\x04":  # pickle protocol 2+, or torch.save's zip
        return ("it is a pickle (torch.save) file, not safetensors; handformer never unpickles: "
                "convert it with safetensors.torch.save_file")
    if size < 8:
        return f"the file is truncated ({size} bytes, shorter than the 8-byte header length)"
    header = int.from_bytes(head, "little")
    if 8 + header > size:
        return (f"the file is truncated or not safetensors (its header claims {header:,} bytes; "
                f"the file holds {size:,})")
    return f"the file is truncated or corrupt ({error})" if error else "the file is corrupt"


def read_safetensors(path: str | os.PathLike, fix: str = "replace it with an intact copy",
                     ) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every tensor and the metadata of a safetensors file. A missing, empty, truncated, corrupt or
    pickle file, or a directory in its place, raises one line naming it, what is wrong and `fix`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no weights file at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})
    except Exception as err:  # safetensors raises its own error types, and OSError for a directory
        raise ValueError(f"{path} is not a readable safetensors file: "
                         f"{safetensors_problem(path, err)}; {fix}") from None


def readable_safetensors(path: str | os.PathLike) -> bool:
    """Whether `path` is a whole safetensors file (its header and every tensor's bytes are there)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception:  # missing, truncated, corrupt: safetensors raises its own error types
        return False
    return True


def load_weights(model: nn.Module, path: str | os.PathLike,
                 fix: str = "replace it with an intact copy") -> None:
    tensors, _ = read_safetensors(path, fix)
    load_into(model, tensors, str(path))


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], full_state: dict[str, Tensor] | None = None,
                    full_optimizer_state: dict | None = None) -> None:
    """Weights + optimizer + RNG + loop state (`state`, JSON-serializable) in one atomic file.
    The full_* arguments carry what a sharded (FSDP) model gathered on this rank."""
    tensors = {f"model/{k}": v for k, v in unique_state_dict(model, full_state).items()}
    opt = full_optimizer_state if full_optimizer_state is not None else optimizer.state_dict()
    for idx, param_state in opt["state"].items():
        for key, value in param_state.items():
            value = value if isinstance(value, Tensor) else torch.tensor(value)
            tensors[f"optim/{idx}/{key}"] = value.detach().cpu().contiguous()
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng/cuda"] = torch.cuda.get_rng_state()
    metadata = {"state": json.dumps(state), "param_groups": json.dumps(opt["param_groups"])}
    atomic_write_bytes(path, st_save(tensors, metadata=metadata))


def load_checkpoint(path: str | os.PathLike, model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore what `save_checkpoint` wrote; returns the loop state."""
    fix = ("this run cannot be resumed from it; start the run over (`handformer train --config ... "
           "--overwrite`) or restore the file from a copy")
    tensors, metadata = read_safetensors(path, fix)
    if "state" not in metadata:
        raise ValueError(f"{path} is not a handformer training checkpoint (no loop state); {fix}")
    try:
        state, param_groups = json.loads(metadata["state"]), json.loads(metadata["param_groups"])
    except (KeyError, ValueError):
        raise ValueError(f"{path} has unreadable loop state in its metadata; {fix}") from None
    load_into(model, {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")},
              str(path))
    opt_state: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim/"):
            _, idx, name = key.split("/", 2)
            opt_state.setdefault(int(idx), {})[name] = value
    try:
        optimizer.load_state_dict({"state": opt_state, "param_groups": param_groups})
        torch.set_rng_state(tensors["rng/torch"])
    except (KeyError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path} does not hold this run's optimizer and RNG state ({err}); "
                         f"{fix}") from None
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])
    return state
