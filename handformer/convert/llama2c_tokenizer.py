"""Read a llama2.c tokenizer (`tokenizer.bin`) as a Hugging Face `tokenizers` BPE tokenizer.

The file (llama2.c's tokenizer.py export of a SentencePiece BPE model): int32 max_token_length,
then for every token: float32 score, int32 byte length, the piece's UTF-8 bytes. Pieces use a
space where SentencePiece writes U+2581 ("▁"); ids 0, 1, 2 are <unk>, <s> (BOS, written as
"\\n<s>\\n"), </s> (EOS); ids 3..258 are the byte-fallback tokens <0x00>..<0xFF>. The file does not
store the vocabulary size: it comes from the model's header.

How llama2.c's run.c encodes, and how the tokenizer built here does the same:
- a space is prepended to non-empty text (SentencePiece's dummy prefix): a `Prepend("▁")`
  normalizer, with spaces written as "▁" as the pieces are;
- each character is looked up; one that is not a piece becomes its UTF-8 bytes' tokens: BPE with
  `byte_fallback`;
- then, repeatedly, the adjacent pair whose concatenation is the piece with the highest score is
  merged: BPE merges ranked by that score (every split of a piece into two pieces is a merge).
  Where two different pairs give the same piece and overlap ("ab" "a" "ba" -> "aba" either way),
  run.c merges the leftmost, Hugging Face's BPE the pair listed first; no such case arises in
  TinyStories text (the tests compare ids with run.c's own encoder).
Decoding: "▁" back to spaces, byte tokens to bytes, and the first leading space stripped (run.c
strips it after BOS).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

from handformer.data.tokenizer import BOS, EOS, UNK, Tokenizer
from handformer.paths import refuse_non_file

SPACE = "\u2581"  # SentencePiece's visible space
BYTE_OFFSET = 3  # byte b is token 3 + b, after <unk>, <s>, </s>


def read_llama2c_pieces(path: str | os.PathLike, vocab_size: int) -> list[tuple[str, float]]:
    """(piece, score) for ids 0 .. vocab_size - 1, checked: the file must hold exactly that many."""
    path = Path(path)
    if not path.is_file():
        refuse_non_file(path, "a llama2.c tokenizer", "give the tokenizer file itself (tokenizer.bin, "
                        "tok512.bin, ...)")
        raise FileNotFoundError(f"no llama2.c tokenizer at {path}")
    data = path.read_bytes()
    if len(data) < 4:
        raise ValueError(f"{path} is {len(data)} bytes: too short for a llama2.c tokenizer (it is "
                         "truncated or not a tokenizer.bin)")
    (max_length,) = struct.unpack_from("<i", data)
    pieces: list[tuple[str, float]] = []
    offset = 4
    while offset < len(data) and len(pieces) <= vocab_size:
        if offset + 8 > len(data):
            raise ValueError(f"{path} is truncated: token {len(pieces)} stops inside its header")
        score, n = struct.unpack_from("<fi", data, offset)
        if not 0 <= n <= max(max_length, 0) or offset + 8 + n > len(data):
            raise ValueError(f"{path} is truncated or corrupt at token {len(pieces)}: it claims {n} "
                             f"bytes (max_token_length {max_length}, {len(data) - offset - 8} bytes left)")
        try:
            piece = data[offset + 8:offset + 8 + n].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} is corrupt: token {len(pieces)} is not UTF-8 text") from None
        pieces.append((piece, score))
        offset += 8 + n
    if len(pieces) != vocab_size or offset != len(data):
        more = "more" if offset != len(data) or len(pieces) > vocab_size else str(len(pieces))
        raise ValueError(f"{path} holds {more} tokens but the model's vocabulary has {vocab_size}; "
                         "the tokenizer and the checkpoint do not belong together (stories260K uses "
                         "tok512.bin; the larger tinyllamas use llama2.c's tokenizer.bin)")
    return pieces


def _check_layout(pieces: list[tuple[str, float]], path: Path) -> None:
    specials = [p.strip() for p, _ in pieces[:BYTE_OFFSET]]
    if specials != [UNK, BOS, EOS] or len(pieces) < BYTE_OFFSET + 256:
        raise ValueError(f"{path}: expected <unk>, <s>, </s> at ids 0-2 and byte tokens at 3-258 "
                         f"(llama2.c's layout), got {specials} first")
    for b in range(256):
        if pieces[BYTE_OFFSET + b][0] != f"<0x{b:02X}>":
            raise ValueError(f"{path}: token {BYTE_OFFSET + b} should be the byte token <0x{b:02X}>, "
                             f"got {pieces[BYTE_OFFSET + b][0]!r}")


def llama2c_tokenizer(path: str | os.PathLike, vocab_size: int) -> Tokenizer:
    """The tokenizer in `path` as a handformer `Tokenizer` (saved as a standard tokenizer.json)."""
    path = Path(path)
    pieces = read_llama2c_pieces(path, vocab_size)
    _check_layout(pieces, path)
    names = [UNK, BOS, EOS] + [p.replace(" ", SPACE) for p, _ in pieces[BYTE_OFFSET:]]
    vocab: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in vocab:
            raise ValueError(f"{path} is corrupt: tokens {vocab[name]} and {i} are both {name!r}")
        vocab[name] = i

    first_piece = BYTE_OFFSET + 256
    merges = []  # (score, piece id, left id) -> ranked best score first, as run.c picks
    for i in range(first_piece, len(names)):
        name, score = names[i], pieces[i][1]
        for k in range(1, len(name)):
            left, right = vocab.get(name[:k]), vocab.get(name[k:])
            if left is not None and right is not None and left >= first_piece and right >= first_piece:
                merges.append((-score, i, left, (name[:k], name[k:])))
    merges.sort(key=lambda m: m[:3])

    hf = HFTokenizer(models.BPE(vocab, [m[3] for m in merges], unk_token=UNK, byte_fallback=True,
                                fuse_unk=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (UNK, BOS, EOS)])
    return Tokenizer(hf)


__all__ = ["llama2c_tokenizer", "read_llama2c_pieces"]
