"""An encoder-decoder model built from its two stacks, as bentrevett's notebook builds it:
Seq2Seq(encoder, decoder, src_pad_idx, trg_pad_idx, device), the file's own Encoder(input_dim,
hid_dim, ...) and Decoder(output_dim, ...) built first; input_dim is the source vocabulary there and
output_dim the target's."""

from __future__ import annotations

import inspect
import types
from typing import Any

from torch import nn

from handformer.check.core.discovery import FIXED, argument_keys, own_objects, with_head_size

VOCABULARIES = {"input_dim": "src_vocab", "output_dim": "tgt_vocab"}  # of a stack, not of a layer


def build_from_stacks(cls: type, module: types.ModuleType, sizes: dict[str, Any]) -> nn.Module | None:
    """cls(encoder=Encoder(...), decoder=Decoder(...), sizes by name); None when cls takes no
    (encoder, decoder), the file defines no Encoder and Decoder classes, or an argument has no value."""
    own = own_objects(module)
    params = inspect.signature(cls).parameters
    if not {"encoder", "decoder"} <= set(params) or not all(inspect.isclass(own.get(n)) for n in
                                                            ("Encoder", "Decoder")):
        return None
    sizes = with_head_size(sizes)
    parts = {}
    for name in ("encoder", "decoder"):
        stack = _arguments(own[name.title()], sizes, VOCABULARIES)
        if stack is None:
            return None
        parts[name] = own[name.title()](**stack)
    rest = _arguments(cls, sizes, {}, skip=set(parts))
    return None if rest is None else cls(**parts, **rest)


def _arguments(cls: type, sizes: dict[str, Any], extra: dict[str, str],
               skip: frozenset[str] | set[str] = frozenset()) -> dict[str, Any] | None:
    """cls's arguments matched by name (a size, or a fixed value); None when one has no value."""
    keys = argument_keys(cls)
    kwargs: dict[str, Any] = {}
    for name, p in inspect.signature(cls).parameters.items():
        key = extra.get(name) or keys.get(name)
        if name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if key in sizes:
            kwargs[name] = sizes[key]
        elif name.lower() in FIXED:
            kwargs[name] = FIXED[name.lower()]
        elif p.default is p.empty:
            return None
    return kwargs
