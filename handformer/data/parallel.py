"""Reading parallel text: a TSV file (source TAB target) or a pair of aligned files, plain or .gz.

Bad lines (no tab, an empty side) are skipped and counted, with the first few line numbers kept
for the report; a pair of files with different line counts is an error. Nothing is dropped silently.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path

from handformer.paths import refuse_non_file


def open_text(path: str | os.PathLike):
    path = Path(path)
    if not path.is_file():
        refuse_non_file(path, "a data file", "give a TSV file (source<TAB>target a line), or two aligned "
                        "files (source, then target)")
        raise FileNotFoundError(f"no such data file: {path}")
    # Lines end at "\n" only: universal newlines would also split at a stray "\r" inside a
    # sentence, cutting it silently and shifting aligned files. read_lines drops CRLF's "\r".
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def read_lines(path: str | os.PathLike) -> list[str]:
    with open_text(path) as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


@dataclass
class ParallelData:
    pairs: list[tuple[str, str]]
    source: str  # where the pairs came from, for messages
    skipped: int = 0  # bad lines skipped
    skipped_lines: list[int] = field(default_factory=list)  # first few 1-based line numbers

    def report(self) -> str:
        msg = f"{len(self.pairs):,} pairs from {self.source}"
        if self.skipped:
            shown = ", ".join(map(str, self.skipped_lines))
            more = ", ..." if self.skipped > len(self.skipped_lines) else ""
            msg += f"; skipped {self.skipped} bad line(s) (line {shown}{more})"
        return msg


def _collect(rows, source: str, max_reported: int = 5) -> ParallelData:
    data, blank = ParallelData([], source), True  # blank: no line holds any text
    for number, src, tgt in rows:
        src, tgt = (src or "").strip(), (tgt or "").strip()
        blank = blank and not src and not tgt
        if not src or not tgt:
            data.skipped += 1
            if len(data.skipped_lines) < max_reported:
                data.skipped_lines.append(number)
            continue
        data.pairs.append((src, tgt))
    if not data.pairs:
        found = "is empty" if blank else f"holds no usable pairs ({data.skipped} bad lines)"
        raise ValueError(f"{source} {found}: give a TSV file, "
                         "one `source<TAB>target` pair a line, or two aligned files (source, then target)")
    return data


def read_tsv(path: str | os.PathLike) -> ParallelData:
    """One pair a line: source TAB target. A line without a tab or with an empty side is skipped."""
    def rows():
        for i, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                yield i, "", ""
                continue
            parts = line.split("\t")
            if len(parts) < 2:
                yield i, line, ""  # text without a tab: one side only, skipped
            else:
                yield i, parts[0], parts[1]
    return _collect(rows(), str(path))


def read_pair(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> ParallelData:
    """Two aligned files, line i of one translating line i of the other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"misaligned parallel files: {src_path} has {len(src):,} lines but "
                         f"{tgt_path} has {len(tgt):,}; they must be aligned line by line")
    return _collect(((i + 1, s, t) for i, (s, t) in enumerate(zip(src, tgt))),
                    f"{src_path} + {tgt_path}")


def read_parallel(spec: str | os.PathLike | tuple[str, str] | list[str]) -> ParallelData:
    """A TSV path, or a (source path, target path) pair."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ValueError(f"expected a TSV path or [source, target] paths, got {spec!r}")
        return read_pair(spec[0], spec[1])
    return read_tsv(spec)
