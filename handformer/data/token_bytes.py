"""The bytes each token of a vocabulary writes: what a grammar engine needs to know which tokens
can continue a text (constrained decoding, generation/grammar.py).

A token's string in `tokenizer.json` is not always its text:
- byte-level BPE (GPT-2, Llama 3, Qwen, handformer's own BPE) writes each byte as one printable
  character (GPT-2's byte-to-unicode table: a space is "Ġ"), and a token may hold part of a
  multi-byte UTF-8 character;
- SentencePiece-style vocabularies (Llama 2, Gemma, Mistral) write a space as "▁" and single bytes
  as "<0x0A>" (byte fallback);
- a character tokenizer (handformer's "char") writes the character itself.
Special tokens (BOS, EOS, <|im_end|>, ...) write no text: they are None here.
"""

from __future__ import annotations

import json

from handformer.data.tokenizer import Tokenizer

SPACE_MARK = "\u2581"  # SentencePiece's "▁"


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: printable character -> the byte it stands for.
    Printable Latin-1 bytes stand for themselves; the other 68 bytes, in order, take the
    characters from U+0100 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in kept:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def decoder_kinds(tokenizer: Tokenizer) -> set[str]:
    """The decoder types of the tokenizer (a Sequence decoder's members), e.g. {"ByteLevel"}."""
    decoder = json.loads(tokenizer.hf.to_str()).get("decoder") or {}
    members = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return {d.get("type") for d in members if isinstance(d, dict)}


def token_bytes(tokenizer: Tokenizer) -> list[bytes | None]:
    """For every id of the vocabulary, the bytes it writes (None: a special token)."""
    hf = tokenizer.hf
    kinds = decoder_kinds(tokenizer)
    added = hf.get_added_tokens_decoder()
    alphabet = byte_level_alphabet() if "ByteLevel" in kinds else None
    out: list[bytes | None] = []
    for i in range(hf.get_vocab_size()):
        piece = hf.id_to_token(i)
        if i in added:
            out.append(None if added[i].special else added[i].content.encode("utf-8"))
        elif piece is None or i in tokenizer.special_ids:
            out.append(None)
        elif alphabet is not None and all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        elif "ByteFallback" in kinds and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif kinds & {"Metaspace", "Replace"}:
            out.append(piece.replace(SPACE_MARK, " ").encode("utf-8"))
        elif "WordPiece" in kinds and piece.startswith("##"):
            out.append(piece[2:].encode("utf-8"))
        else:
            out.append(piece.encode("utf-8"))
    return out


__all__ = ["byte_level_alphabet", "decoder_kinds", "token_bytes"]
