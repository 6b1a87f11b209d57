"""Tokenizers: byte-level BPE and characters, both built on the Hugging Face `tokenizers` library
and saved as a standard `tokenizer.json`.

Every tokenizer handformer trains has the same four special tokens at the same ids:
<pad> = 0, <s> (BOS) = 1, </s> (EOS) = 2, <unk> = 3.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from handformer.io import atomic_write_text

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]


def show_characters(chars: Sequence[str], limit: int = 10) -> str:
    """Characters for a message: the first `limit` quoted, then "..." when there are more."""
    return ", ".join(repr(c) for c in chars[:limit]) + (", ..." if len(chars) > limit else "")


class Tokenizer:
    """Text <-> ids. `encode` adds no special tokens; callers add BOS/EOS where the model needs them."""

    def __init__(self, hf: HFTokenizer) -> None:
        self.hf = hf
        # Text is only text: a literal "</s>" or "<pad>" in the data must not become a control id.
        self.hf.encode_special_tokens = True
        self.pad_id = hf.token_to_id(PAD)
        self.bos_id = hf.token_to_id(BOS)
        self.eos_id = hf.token_to_id(EOS)
        self.unk_id = hf.token_to_id(UNK)
        self.special_ids = {i for i in (self.pad_id, self.bos_id, self.eos_id, self.unk_id)
                            if i is not None}
        self.skip_ids = {i for i in (self.pad_id, self.bos_id) if i is not None}
        self._char_ids = _char_vocab(hf)  # a character tokenizer encodes with a dict lookup

    @property
    def is_char(self) -> bool:
        return self._char_ids is not None

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    # --- training -------------------------------------------------------------------------
    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
        """Byte-level BPE: any text encodes (no unknown characters) and decodes back exactly."""
        if vocab_size <= len(SPECIAL_TOKENS) + 256:
            raise ValueError(f"BPE vocab_size={vocab_size} is too small: byte-level BPE needs more "
                             f"than {len(SPECIAL_TOKENS) + 256} (4 specials + 256 bytes)")
        hf = HFTokenizer(models.BPE(unk_token=UNK))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=SPECIAL_TOKENS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf)

    @classmethod
    def train_char(cls, texts: Iterable[str]) -> Tokenizer:
        """One token per character seen in `texts`; unseen characters map to <unk>."""
        seen: set[str] = set()
        for text in texts:
            seen.update(text)  # in C, character by character
        chars = sorted(seen)
        vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
        for c in chars:
            vocab.setdefault(c, len(vocab))
        hf = HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        hf.add_special_tokens(SPECIAL_TOKENS)
        return cls(hf)

    @classmethod
    def train(cls, kind: str, texts: Sequence[str], vocab_size: int = 8000) -> Tokenizer:
        if kind == "bpe":
            return cls.train_bpe(texts, vocab_size)
        if kind == "char":
            return cls.train_char(texts)
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose bpe or char")

    # --- use ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self._char_ids is not None:  # the same ids as the library's, 30x faster on 1 MB
            get, unk = self._char_ids.get, self.unk_id
            return [get(c, unk) for c in text]
        return self.hf.encode(text, add_special_tokens=False).ids

    def unseen_characters(self, text: str) -> list[str]:
        """The characters of `text` a character tokenizer never saw (each encodes as <unk>), in
        order of first use; none for other tokenizers (byte-level BPE encodes any text)."""
        if self._char_ids is None:
            return []
        return [c for c in dict.fromkeys(text) if c not in self._char_ids]

    def unseen_note(self, text: str) -> str | None:
        """One sentence naming the characters of `text` this character tokenizer never saw (the
        first ten), which the model reads as <unk>; None when it knows them all."""
        unseen = self.unseen_characters(text)
        if not unseen:
            return None
        return (f"the run's character tokenizer never saw {show_characters(unseen)}; the model reads <unk> "
                "for each (it knows the characters of its training text only)")

    def encode_with_special_tokens(self, text: str) -> list[int]:
        """Like `encode`, but a special token's text ("<|im_start|>") becomes its id: for prompts a
        chat template wrote, where that text is markup, not data."""
        self.hf.encode_special_tokens = False
        try:
            return self.hf.encode(text, add_special_tokens=False).ids
        finally:
            self.hf.encode_special_tokens = True

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`encode_with_special_tokens`, and the (start, end) characters of `text` that each token
        came from: what tells which tokens a span of rendered text (an assistant's reply) holds."""
        self.hf.encode_special_tokens = False
        try:
            encoding = self.hf.encode(text, add_special_tokens=False)
        finally:
            self.hf.encode_special_tokens = True
        return encoding.ids, encoding.offsets

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._char_ids is not None:
            return [self.encode(text) for text in texts]
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; stops at the first EOS, drops padding and BOS, shows <unk>."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in self.skip_ids:
                out.append(i)
        return self.hf.decode(out, skip_special_tokens=False)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable token strings (for attention plots): byte-level BPE's 'Ġ' shown as a space."""
        pieces = []
        for i in ids:
            piece = self.hf.id_to_token(int(i)) or "?"
            if int(i) not in self.special_ids and isinstance(self.hf.decoder, decoders.ByteLevel):
                piece = self.hf.decode([int(i)]) or piece
            pieces.append(piece)
        return pieces

    # --- files ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, self.hf.to_str(pretty=False))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer at {path}")
        try:
            return cls(HFTokenizer.from_file(str(path)))
        except Exception as err:  # the library raises a bare Exception on malformed files
            raise ValueError(f"{path} is not a valid tokenizer.json: {err}") from None


def is_tokenizer_file(path: str | os.PathLike) -> bool:
    try:
        return "model" in json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False


def _char_vocab(hf: HFTokenizer) -> dict[str, int] | None:
    """The character -> id map when `hf` is exactly a character tokenizer as `train_char` builds
    it (word-level vocabulary over single characters, split before every character, no
    normalizer), else None. Encoding such a tokenizer is one dict lookup per character."""
    if not isinstance(hf.model, models.WordLevel):  # BPE and imported tokenizers: skip serializing
        return None
    spec = json.loads(hf.to_str())
    split = spec.get("pre_tokenizer") or {}
    if (spec.get("model", {}).get("type") != "WordLevel" or spec.get("normalizer") is not None
            or split.get("type") != "Split" or split.get("pattern") != {"Regex": "[\\s\\S]"}
            or split.get("behavior") != "Isolated" or split.get("invert")):
        return None
    return {tok: i for tok, i in spec["model"]["vocab"].items() if len(tok) == 1}
