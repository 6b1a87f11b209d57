"""State a learner's module keeps from call to call outside its parameters (a KV cache written in
place: Meta's cache_k and cache_v, a buffer or a plain tensor attribute), and handformer's attention
computed as such a cache holds its keys and values: detached (Meta's llama stores `xk` into a cache
that carries no gradient, so the keys and values of an inference attention take none).

The attention and block runners compare gradients with handformer's; where the learner's module
wrote its kept tensors in the call compared and its gradients depart, they compare them again with
handformer's keys and values held constant, and pass it so when they agree."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import ComponentResult, text

KV_PROJECTIONS = ("k_proj", "v_proj")  # handformer's MultiHeadAttention's key and value projections


def kept_tensors(module: nn.Module) -> dict[str, Tensor]:
    """The tensors a module and its children hold that are not parameters: buffers, and tensors set
    as plain attributes (`self.cache_k = torch.zeros(...)`), by their dotted names."""
    kept = dict(module.named_buffers())
    for prefix, child in module.named_modules():
        kept |= {f"{prefix}.{key}".lstrip("."): value for key, value in vars(child).items()
                 if isinstance(value, Tensor)}  # (parameters are held in child._parameters)
    return kept


def snapshot(module: Any) -> dict[str, Tensor]:
    """A copy of the module's kept tensors (none for a function)."""
    if not isinstance(module, nn.Module):
        return {}
    return {name: t.detach().clone() for name, t in kept_tensors(module).items()}


def written(module: Any, before: dict[str, Tensor]) -> bool:
    """Whether the module's kept tensors changed since `before` (a cache written, or set anew)."""
    now = snapshot(module)
    return not (now.keys() == before.keys() and all(torch.equal(now[k], before[k]) for k in now))


@contextlib.contextmanager
def keys_held(hf: nn.Module) -> Iterator[None]:
    """handformer's module with the outputs of every key and value projection detached, as a KV
    cache without gradients holds them."""
    with fp.hooked([m.register_forward_hook(lambda _m, _i, out: out.detach())
                    for name, m in hf.named_modules() if name.split(".")[-1] in KV_PROJECTIONS]):
        yield


def gradient_error(res: ComponentResult, grads: Callable[[bool], float], kept: bool, hf: nn.Module) -> float:
    """The gradients' largest difference from handformer's, `grads(retain)` (retain: the learner's
    graph kept for another comparison); where they depart and the module wrote the tensors it keeps in
    that call (`kept`: a KV cache), the difference from handformer's with its keys and values held
    constant (`keys_held`), noted when that is what agrees."""
    err = grads(kept)
    if err < 1e-5 or not kept:
        return err
    with keys_held(hf):
        held = grads(False)
    res.notes += [HELD_NOTE] * (held < 1e-5)
    return min(err, held)


HELD_NOTE = text("it writes its keys and values into a cache it keeps (a tensor of its own, written in "
                "place, without gradients): gradients compared with handformer's with its keys and values "
                "held constant, as such a cache holds them",
                 "它把键和值写进自己保存的缓存（原地写入的张量，不带梯度）：梯度与 handformer 比较时，"
                 "handformer 的键和值也保持不变（不求梯度），和这种缓存一样")
