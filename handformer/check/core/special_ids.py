"""What a decoding loop is handed only to read from: the tokenizer or vocabulary it asks for its special
ids (Umar Jamil's `greedy_decode(model, source, source_mask, tokenizer_src, tokenizer_tgt, max_len,
device)` reads `tokenizer_tgt.token_to_id('[SOS]')`), and the device it moves its tensors to.

A loop's runner hands such arguments a `SpecialIds` that knows the runner's start, end and padding
ids under every name tokenizers give them, and "cpu" for the device.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

from handformer.check.core.argument_names import names_of
from handformer.check.core.source import source_text

# a tokenizer or a vocabulary (tokenizer_tgt, src_vocab), not its size (vocab_size, tgt_vocab_len)
TOKENIZER_ARGUMENT = re.compile(r"(?i)tokeni[sz]er|vocab(?!\w*(size|len|num))")
DEVICE_NAMES = ("device", "dev")
# the special token a looked-up string names, the first that matches: '[EOS]', '</s>', '<sos>', '<pad>'
SPECIALS = (("eos", re.compile(r"(?i)eos|</s>|<end>|\bend\b")), ("bos", re.compile(r"(?i)sos|bos|<s>|start")),
            ("pad", re.compile(r"(?i)pad")))
READS_END = re.compile(r"(?i)eos|</s>|<end>")


@dataclass(frozen=True)
class SpecialIds:
    """A tokenizer or vocabulary that knows its special tokens only, looked up as tokenizers do:
    token_to_id (Hugging Face tokenizers), convert_tokens_to_ids (transformers), [token] and get (a
    dict, torchtext's vocab), stoi, bos_id() (sentencepiece), bos_token_id; any other token is `unk`."""

    bos: int
    eos: int
    pad: int
    unk: int

    def token_to_id(self, token: Any) -> int:
        word = next((name for name, pattern in SPECIALS if pattern.search(str(token))), "unk")
        return int(getattr(self, word))

    def get(self, token: Any, default: Any = None) -> int:
        return self.token_to_id(token)

    convert_tokens_to_ids = __getitem__ = token_to_id

    @property
    def stoi(self) -> SpecialIds:
        return self

    def get_stoi(self) -> SpecialIds:
        return self

    def bos_id(self) -> int:
        return self.bos

    def eos_id(self) -> int:
        return self.eos

    def pad_id(self) -> int:
        return self.pad

    @property
    def bos_token_id(self) -> int:
        return self.bos

    @property
    def eos_token_id(self) -> int:
        return self.eos

    @property
    def pad_token_id(self) -> int:
        return self.pad


def loop_extras(params: list[inspect.Parameter], ids: SpecialIds) -> dict[str, Any]:
    """The loop's required arguments that are a tokenizer or vocabulary (given `ids`) or a device
    (given "cpu"), by name."""
    required = names_of(params)[1]
    return {**{n: "cpu" for n in required if n.lower() in DEVICE_NAMES},
            **{n: ids for n in required if TOKENIZER_ARGUMENT.search(n)}}


def reads_end(fn: Any, extras: dict[str, Any]) -> bool:
    """Whether a loop handed a tokenizer asks it for an end token (`token_to_id('[EOS]')`)."""
    return SpecialIds in map(type, extras.values()) and bool(READS_END.search(source_text(fn)))
