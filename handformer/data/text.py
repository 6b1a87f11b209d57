"""Text for language modelling: reading files, the embedded corpus, the validation split, and
nanoGPT-style batches of random contiguous windows.

- `read_text`: a file or a folder of files (plain or .gz), folders sorted and joined by a newline.
- `pydoc_corpus`: the embedded default corpus, Python's own reference documentation as shipped in
  the standard library (`pydoc_data.topics`, about 465k characters): no download needed. Its text
  follows the installed Python version, and is fixed for a given one.
- `split_text`: the last `val_fraction` of the text is the validation split (nanoGPT's 90/10).
- `LMWindows`: training batches; `validation_batches`: a fixed set of validation batches.

Token ids live in one flat tensor; a batch is one gather from a strided view of it (no Python loop
over tokens).

Shape legend: B batch, T block size (window length), N tokens in a split.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from handformer.paths import refuse_non_file

PYDOC = "pydoc"  # the name of the embedded corpus in configs


# --- reading text -----------------------------------------------------------------------------

def _read_file(path: Path) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError) as err:  # a truncated or non-gzip .gz file
        raise ValueError(f"cannot read {path}: {err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); convert it "
                         "to UTF-8 first") from None
    return text.removeprefix("\ufeff")  # a byte-order mark is not text


def read_text(path: str | os.PathLike) -> str:
    """The text of a file, or of every file in a folder (recursively, sorted by path, hidden files
    skipped) joined with a newline between files. Plain or gzipped UTF-8."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"the folder {path} holds no text files")
    else:
        refuse_non_file(path, "a text file or folder", "give a file of text, or a folder of them")
        raise FileNotFoundError(f"no such text file or folder: {path}")
    texts = []
    for file in files:
        text = _read_file(file)
        if not text.strip():
            raise ValueError(f"{file} is empty; remove it or give another file")
        texts.append(text)
    return "\n".join(texts)


def pydoc_corpus() -> str:
    """The embedded corpus: the standard library's pydoc topic texts, in sorted key order."""
    from pydoc_data.topics import topics

    return "\n".join(topics[key] for key in sorted(topics))


def load_text(source: str | os.PathLike) -> str:
    """`"pydoc"` for the embedded corpus, else a path for `read_text`."""
    return pydoc_corpus() if str(source) == PYDOC else read_text(source)


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, validation): the validation split is the last `val_fraction` of the characters.

    The text is split before tokenizing so the tokenizer is trained on the training split only;
    for a character tokenizer this is exactly the last `val_fraction` of the token stream.
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction!r} is invalid: it must be in [0, 1)")
    cut = len(text) - round(len(text) * val_fraction)
    return text[:cut], text[cut:]


def as_token_tensor(ids: Sequence[int], vocab_size: int) -> Tensor:
    """A flat tensor of ids, int32 when the vocabulary allows (half the memory of int64)."""
    dtype = torch.int32 if vocab_size <= torch.iinfo(torch.int32).max else torch.int64
    return torch.tensor(ids, dtype=dtype)


# --- batches ----------------------------------------------------------------------------------

@dataclass
class LMBatch:
    x: Tensor  # (B, T) input ids
    y: Tensor  # (B, T) targets: the next token at every position (x shifted left by one)
    n_tokens: int  # B * T: every target counts (no padding)

    def to(self, device: torch.device | str) -> LMBatch:
        return LMBatch(self.x.to(device, non_blocking=True), self.y.to(device, non_blocking=True),
                       self.n_tokens)


def _windows(ids: Tensor, block_size: int) -> Tensor:
    """(N - T, T + 1) view of every window of T + 1 consecutive tokens; no copy."""
    return ids.unfold(0, block_size + 1, 1)


def _gather(windows: Tensor, starts: Tensor) -> LMBatch:
    chunk = windows[starts].long()  # (B, T + 1): one gather, then x and y are views of it
    x, y = chunk[:, :-1], chunk[:, 1:]  # (B, T), (B, T)
    return LMBatch(x, y, y.numel())


class LazyBatches(Sequence):
    """The batches of one epoch (or a validation set), built when indexed: only what picks each
    batch's windows is kept, so an epoch of a thousand batches costs kilobytes, not a copy of each
    window; slicing gives another lazy view."""

    def __init__(self, n: int | range, build: Callable[[int], LMBatch]) -> None:
        self.indices = range(n) if isinstance(n, int) else n
        self.build = build

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyBatches(self.indices[i], self.build)
        return self.build(self.indices[i])


def random_windows(n_windows: int, batches: int, batch_size: int, seed: int, epoch: int) -> Tensor:
    """(batches, B) window indices drawn uniformly at random (nanoGPT's sampling), from a generator
    seeded with (seed, epoch): the data order is a pure function of them, so a resumed run sees
    exactly the batches of an uninterrupted one."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randint(n_windows, (batches, batch_size), generator=g)  # (batches, B)


class LMWindows:
    """Training batches as in nanoGPT: B windows at uniformly random offsets of the token stream,
    x = ids[i : i + T] and y = ids[i + 1 : i + T + 1].

    An "epoch" is `batches_per_epoch` batches whose offsets come from a generator seeded with
    (seed, epoch), so the data order is a pure function of (seed, epoch) and a resumed run sees
    exactly the batches of an uninterrupted one.
    """

    def __init__(self, ids: Tensor, block_size: int, batch_size: int, batches_per_epoch: int,
                 seed: int = 0) -> None:
        if len(ids) < block_size + 1:
            raise ValueError(f"the training split has {len(ids):,} tokens, fewer than "
                             f"block_size + 1 = {block_size + 1}; lower data.block_size or give more text")
        self.ids = ids  # (N,)
        self.block_size = block_size
        self.batch_size = batch_size
        self.batches_per_epoch = batches_per_epoch
        self.seed = seed
        self.windows = _windows(ids, block_size)  # (N - T, T + 1)

    def epoch(self, epoch: int) -> LazyBatches:
        starts = random_windows(len(self.windows), self.batches_per_epoch, self.batch_size, self.seed,
                                epoch)  # (batches, B)
        return LazyBatches(len(starts), lambda i: _gather(self.windows, starts[i]))


def validation_batches(ids: Tensor, block_size: int, batch_size: int, max_batches: int = 0,
                       ) -> list[LMBatch]:
    """A fixed validation set: non-overlapping contiguous windows (chunk k starts at k * T), so
    every validation token is scored at most once. When the split holds more than
    `max_batches * batch_size` chunks, that many are taken evenly spaced across the whole split;
    0 = all chunks. Deterministic: no randomness involved."""
    n_chunks = (len(ids) - 1) // block_size
    if n_chunks == 0:
        raise ValueError(f"the validation split has {len(ids):,} tokens, fewer than block_size + 1 "
                         f"= {block_size + 1}; raise data.val_fraction, lower data.block_size or give more "
                         "text")
    chunks = torch.arange(n_chunks)
    wanted = max_batches * batch_size
    if max_batches and n_chunks > wanted:
        chunks = torch.linspace(0, n_chunks - 1, wanted).round().long()
    windows = _windows(ids, block_size)
    return [_gather(windows, chunks[i: i + batch_size] * block_size)
            for i in range(0, len(chunks), batch_size)]
