"""A run's special tokens: the ids a prompt starts with, a batch is padded with, and generation ends
at (config.json's "tokens" section of a language-model run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handformer.settings import is_int


@dataclass
class SpecialTokens:
    bos_id: int | None = None  # prepended to prompts when set
    eos_id: int | None = None  # the checkpoint's main end-of-sequence id (None: none)
    pad_id: int | None = None  # fills the left of shorter prompts in a batch
    # Every id that ends generation, eos_id first: Llama 3 instruct lists three and ends a turn
    # with <|eot_id|>, not with its eos_token. Filled from eos_id when not given.
    eos_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 0):
                raise ValueError(f"tokens.{name} must be a token id (an integer >= 0) or null, got {value!r}")
        if not isinstance(self.eos_ids, (list, tuple)) or any(
                not is_int(i) or i < 0 for i in self.eos_ids):
            raise ValueError("tokens.eos_ids must be a list of token ids (integers >= 0), "
                             f"got {self.eos_ids!r}")
        ids = ([self.eos_id] if self.eos_id is not None else []) + list(self.eos_ids)
        self.eos_ids = list(dict.fromkeys(ids))  # eos_id first, no repeats
        if self.eos_id is None and self.eos_ids:
            self.eos_id = self.eos_ids[0]

    @classmethod
    def from_dict(cls, data: Any) -> SpecialTokens:
        """config.json's "tokens" section; runs written before "eos_ids" existed have only eos_id."""
        if not isinstance(data, dict):
            raise ValueError(f"config.json's \"tokens\" must be an object, got {data!r}")
        unknown = sorted(set(data) - {"bos_id", "eos_id", "pad_id", "eos_ids"})
        if unknown:
            raise ValueError(f"config.json's \"tokens\" has unknown field(s) {', '.join(unknown)}; "
                             "expected bos_id, eos_id, pad_id, eos_ids")
        return cls(**data)


__all__ = ["SpecialTokens"]
