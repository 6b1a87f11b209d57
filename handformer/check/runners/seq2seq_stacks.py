"""An encoder-decoder model built from its two stacks, as bentrevett's notebook builds it:
Seq2Seq(encoder, decoder, src_pad_idx, trg_pad_idx, device), the file's own Encoder(input_dim,
hid_dim, ...) and Decoder(output_dim, ...) built first; input_dim is the source vocabulary there and
output_dim the target's. Where Encoder and Decoder are d2l's interfaces (a forward that raises
NotImplementedError), the stacks are the file's classes that implement them (d2l's
TransformerEncoder(Encoder) and TransformerDecoder(AttentionDecoder)), the decoder's vocabulary the
target's."""

from __future__ import annotations

import inspect
import types
from typing import Any

from torch import nn

from handformer.check.core.defaults import then
from handformer.check.core.discovery import ARGUMENTS, FIXED, argument_keys, own_objects, with_head_size
from handformer.check.core.source import source_text

VOCABULARIES = {"input_dim": "src_vocab", "output_dim": "tgt_vocab"}  # of a stack, not of a layer
# a decoder stack's vocabulary (d2l's TransformerDecoder(vocab_size, ...)) is the target's
TARGET_VOCABULARIES = {**VOCABULARIES, **dict.fromkeys(ARGUMENTS["src_vocab"], "tgt_vocab")}


def build_from_stacks(cls: type, module: types.ModuleType, sizes: dict[str, Any]) -> nn.Module | None:
    """cls(encoder=Encoder(...), decoder=Decoder(...), sizes by name); None when cls takes no
    (encoder, decoder), the file defines no Encoder and Decoder classes, or an argument has no value."""
    own = own_objects(module)
    params = inspect.signature(cls).parameters
    if not {"encoder", "decoder"} <= set(params):
        return None
    sizes = with_head_size(sizes)
    parts = {}
    for name, vocabularies in (("encoder", VOCABULARIES), ("decoder", TARGET_VOCABULARIES)):
        built = [(stack, kwargs) for stack in stacks(own, name.title())
                 if (kwargs := _arguments(stack, sizes, vocabularies)) is not None]
        if not built:
            return None
        parts[name] = built[0][0](**built[0][1])
    rest = _arguments(cls, sizes, {}, skip=set(parts))
    return then(rest, lambda rest: cls(**parts, **rest))


def stacks(own: dict[str, Any], role: str) -> list[type]:
    """The file's classes that can be its encoder (role "Encoder") or decoder: the one named so and
    those derived from it, the most derived first (d2l's TransformerEncoder before its Encoder, an
    interface whose forward only raises NotImplementedError); where the file has no such interface, a
    module whose name ends so and that embeds the tokens (d2l's TransformerEncoder written on nn.Module,
    not a PositionEncoder)."""
    found = [c for c in own.values() if role in {k.__name__ for k in getattr(c, "__mro__", ())}]
    return sorted(found, key=lambda c: -len(c.__mro__)) or [
        c for n, c in own.items() if "." not in n and n.endswith(role) and inspect.isclass(c)
        and issubclass(c, nn.Module) and "Embedding(" in source_text(vars(c).get("__init__", ""))]


def _arguments(cls: type, sizes: dict[str, Any], extra: dict[str, str],
               skip: frozenset[str] | set[str] = frozenset()) -> dict[str, Any] | None:
    """cls's arguments matched by name (a size, or a fixed value); None when one has no value."""
    keys = argument_keys(cls)
    kwargs: dict[str, Any] = {}
    for name, p in inspect.signature(cls).parameters.items():
        key = {**keys, **extra}.get(name)
        if name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if key in sizes:
            kwargs[name] = sizes[key]
        elif name.lower() in FIXED:
            kwargs[name] = FIXED[name.lower()]
        elif p.default is p.empty:
            return None
    return kwargs
