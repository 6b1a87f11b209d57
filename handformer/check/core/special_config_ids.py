"""A config's special token ids kept inside the vocabulary check builds it with.

A config class gives its special ids for its real vocabulary (ModernBERT's pad_token_id=50283,
cls_token_id=50281 beside vocab_size=50368). Built at check's small vocabulary, such an id is out of
range, and `nn.Embedding(vocab_size, d, padding_idx=config.pad_token_id)` refuses it: the model would
not build, for a size check chose. Each special id of the class's defaults at or past check's vocabulary
is moved to the vocabulary's last ids, in the order the defaults give them, so the config reads as one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# the names of a config's special ids: pad_token_id, cls_token_id, eos_id, padding_idx, ...
SPECIAL_ID = re.compile(r"(?i)(pad|bos|eos|cls|sep|mask|unk|start|end|decoder_start)_(token_)?id|padding_idx")


def special_ids_within(defaults: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, int]:
    """Each special id of `defaults` that `values`' vocab_size would not hold -> its place among the
    vocabulary's last ids, in the defaults' order; none where check sets no vocab_size."""
    vocab = values.get("vocab_size")
    past = sorted((v, n) for n, v in defaults.items()
                  if SPECIAL_ID.fullmatch(n) and type(v) is int and type(vocab) is int and v >= vocab)
    return {n: vocab - len(past) + rank for rank, (_, n) in enumerate(past)}
