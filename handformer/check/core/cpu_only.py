"""A learner's file written for a GPU runs on this machine's CPU: where CUDA is not available,
`tensor.cuda()` and `module.cuda()` return the tensor or module as it is (Meta's Llama attention
builds its KV cache with `.cuda()`), and in a file that names the device in its calls
(`torch.full(..., device="cuda")`, Meta's `Llama.generate`) a device "cuda" is read as the CPU.
What the code computes does not depend on the device."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from handformer.check.core.defaults import quietly

NAMES_CUDA = re.compile(r"""device\s*=\s*["']cuda|\.to\(\s*["']cuda""")


def cuda_as_cpu(path: str | None = None) -> None:
    """Make `.cuda()` the identity for tensors and modules when CUDA is not available; where the file
    at `path` names "cuda" as a device, every torch call of the process reads it as the CPU."""
    if torch.cuda.is_available():
        return

    def same(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self

    torch.Tensor.cuda = same  # type: ignore[method-assign]
    nn.Module.cuda = same  # type: ignore[method-assign]
    read = lambda: path is not None and bool(NAMES_CUDA.search(Path(path).read_text(errors="replace")))  # noqa: E731
    named = quietly(read, OSError, False)
    if named:  # only then: the mode costs every torch call a Python hop
        CudaAsCpu().__enter__()


def _cpu(value: Any) -> Any:
    """A device named "cuda" (a string, or a torch.device of type cuda) as the CPU; any other value as
    it is."""
    if isinstance(value, (str, torch.device)) and str(value).startswith("cuda"):
        return torch.device("cpu")
    return value


class CudaAsCpu(TorchFunctionMode):
    """Every torch call with a device "cuda" (a keyword or an argument, as `tensor.to("cuda")`) made on
    the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return func(*map(_cpu, args), **{k: _cpu(v) for k, v in (kwargs or {}).items()})
