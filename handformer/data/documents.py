"""Reading a corpus as documents, streaming: what `handformer prepare` tokenizes.

A file is a document; a `.jsonl` file (plain or .gz) holds one per line (its `text` field); inside
a plain text file (or .gz) the chunks between blank lines are documents. Text files are read in
blocks of `READ_BYTES`, so memory does not grow with a file; a document longer than
`MAX_PIECE_CHARS` comes out in pieces cut at line ends (`Piece.ends` marks a document's last).
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from handformer.paths import refuse_non_file

MAX_PIECE_CHARS = 1 << 20  # a document longer than this is tokenized in pieces cut at line ends
READ_BYTES = 4 << 20  # text files are read in blocks of this size
BLANK_LINE = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")  # one or more blank lines: a document boundary


@dataclass
class Piece:
    text: str
    ends: bool  # the last piece of its document: EOS follows
    disk_bytes: int = 0  # source bytes on disk read up to here (progress)
    text_bytes: int = 0  # UTF-8 bytes of text read up to here


def source_files(source: str | os.PathLike) -> list[Path]:
    """A file, or every file in a folder (recursively, sorted, hidden files skipped)."""
    path = Path(source)
    if path.is_file():
        return [path]
    if not path.is_dir():
        refuse_non_file(path, "a text file or folder", "give a file of text, or a folder of them")
        raise FileNotFoundError(f"no such file or folder: {path}")
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise ValueError(f"the folder {path} holds no files")
    return files


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def _open_binary(path: Path):
    """(stream of uncompressed bytes, function giving the on-disk bytes read so far)."""
    raw = open(path, "rb")
    if path.suffix == ".gz":
        return gzip.GzipFile(fileobj=raw), raw.tell
    return raw, raw.tell


def _jsonl_pieces(path: Path, field_name: str) -> Iterator[tuple[str | None, bool, int, int]]:
    stream, disk = _open_binary(path)
    with stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}:{number} is not a JSON line ({err})") from None
            text = record.get(field_name) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number} has no text field {field_name!r}; name the field "
                                 "with --text-field")
            yield None, False, disk(), len(line)  # progress
            for i in range(0, max(len(text), 1), MAX_PIECE_CHARS):
                yield text[i: i + MAX_PIECE_CHARS], i + MAX_PIECE_CHARS >= len(text), disk(), 0


def _text_pieces(path: Path) -> Iterator[tuple[str | None, bool, int, int]]:
    """Chunks between blank lines, read in blocks: (text, ends, disk bytes, text bytes read), text
    None for a progress tick."""
    stream, disk = _open_binary(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry, first, open_doc = "", True, False
    with stream:
        while True:
            try:
                block = stream.read(READ_BYTES)
                text = decoder.decode(block, final=not block)
            except (OSError, EOFError) as err:
                raise ValueError(f"cannot read {path}: {err}") from None
            except UnicodeDecodeError as err:
                raise ValueError(f"{path} is not UTF-8 text ({err.reason}); convert it to UTF-8 "
                                 "first") from None
            if first:
                text, first = text.removeprefix("\ufeff"), False
            parts = BLANK_LINE.split(carry + text)
            carry = parts.pop() if block else parts.pop().rstrip("\n")
            for part in parts:
                if part.strip() or open_doc:
                    yield part, True, disk(), 0
                    open_doc = False
            while len(carry) > MAX_PIECE_CHARS:  # one very long document: cut it at a line end
                cut = carry.rfind("\n", 0, MAX_PIECE_CHARS) + 1 or MAX_PIECE_CHARS
                yield carry[:cut], False, disk(), 0
                carry, open_doc = carry[cut:], True
            yield None, False, disk(), len(block)
            if not block:
                break
        if carry.strip() or open_doc:
            yield carry, True, disk(), 0


def read_pieces(files: list[Path], text_field: str = "text",
                totals: dict[str, int] | None = None) -> Iterator[Piece]:
    """Every document of the corpus as pieces, in order (see the module docstring). A file always
    ends its last document. `totals["text_bytes"]` counts the bytes of text read so far."""
    totals = {} if totals is None else totals
    done_disk, text_bytes = 0, 0
    for path in files:
        pieces = _jsonl_pieces(path, text_field) if _is_jsonl(path) else _text_pieces(path)
        for text, ends, disk, n_bytes in pieces:
            text_bytes += n_bytes
            totals["text_bytes"] = text_bytes
            if text is not None:
                yield Piece(text, ends, done_disk + disk, text_bytes)
        done_disk += path.stat().st_size


def documents(source: str | os.PathLike, text_field: str = "text") -> Iterator[str]:
    """The documents `prepare` reads from `source`, whole (for tests and inspection)."""
    parts = []
    for piece in read_pieces(source_files(source), text_field):
        parts.append(piece.text)
        if piece.ends:
            yield "".join(parts)
            parts = []
