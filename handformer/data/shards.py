"""Token shards on disk: reading the three formats, memory-mapped, and drawing training windows.

Formats (every integer little-endian):

- **handformer** (`handformer prepare`): a folder with `manifest.json`, `tokenizer.json` and shards
  `train_000000.bin`, `val_000000.bin`, ... Each shard uses llm.c's layout below (so llm.c can read
  it too); the manifest adds the tokenizer, token and document counts, a SHA-256 and the largest
  token id of every shard.
- **llm.c** (`dev/data/data_common.py: write_datafile`): a header of 256 int32 (magic, version,
  token count, zeros), then the tokens: magic 20240520, version 1, uint16 (GPT-2); magic 20240801,
  version 7, uint32 (Llama 3). A folder holds `*train*.bin` and `*val*.bin` shards.
- **nanoGPT** (`data/*/prepare.py`): `train.bin` and `val.bin`, raw uint16 tokens, no header.

llm.c and nanoGPT files carry no tokenizer; the caller states the vocabulary (`ShardSet.open`'s
`vocab_size`). Shards are opened with `numpy.memmap`: the operating system pages in the windows a
batch reads, so memory does not grow with the corpus.

Shape legend: B batch, T block size (window length).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from handformer.data.text import LazyBatches, LMBatch, random_windows

HEADER_INTS = 256  # llm.c: the header is 256 int32
HEADER_BYTES = HEADER_INTS * 4
LLMC_GPT2 = (20240520, 1, np.dtype("<u2"))  # (magic, version, token dtype)
LLMC_LLAMA3 = (20240801, 7, np.dtype("<u4"))
LLMC_FORMATS = {LLMC_GPT2[0]: LLMC_GPT2, LLMC_LLAMA3[0]: LLMC_LLAMA3}
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "handformer-shards"
SAMPLING = ("random", "sequential")


# --- one shard --------------------------------------------------------------------------------

@dataclass
class Shard:
    path: Path
    tokens: np.ndarray  # (N,) memory-mapped token ids, uint16 or uint32
    max_id: int | None = None  # the largest id, when a manifest records it

    def __len__(self) -> int:
        return len(self.tokens)


def llmc_header(n_tokens: int, dtype: np.dtype) -> bytes:
    """The 1,024-byte llm.c header for `n_tokens` tokens of `dtype` (uint16 or uint32)."""
    magic, version, _ = LLMC_GPT2 if np.dtype(dtype).itemsize == 2 else LLMC_LLAMA3
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, n_tokens
    return header.tobytes()


def open_llmc(path: str | os.PathLike) -> Shard:
    """An llm.c shard (also what `handformer prepare` writes), checked against its header."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ValueError(f"{path} is truncated: {size} bytes, shorter than llm.c's {HEADER_BYTES}-byte "
                         "header; re-create the file")
    header = np.fromfile(path, dtype="<i4", count=3)
    magic, version, n_tokens = (int(v) for v in header)
    if magic not in LLMC_FORMATS:
        raise ValueError(f"{path} has magic number {magic}, not an llm.c token shard (20240520 for "
                         "GPT-2, 20240801 for Llama 3); give llm.c .bin shards, or nanoGPT's "
                         "train.bin/val.bin by those names")
    _, want_version, dtype = LLMC_FORMATS[magic]
    if version != want_version:
        raise ValueError(f"{path} has version {version} for magic {magic}; llm.c writes version "
                         f"{want_version}; re-create the file with llm.c's data scripts")
    expected = HEADER_BYTES + n_tokens * dtype.itemsize
    if n_tokens <= 0 or size != expected:
        raise ValueError(f"{path} is truncated or damaged: its header promises {n_tokens:,} tokens "
                         f"({expected:,} bytes) but the file has {size:,} bytes; re-create it")
    return Shard(path, np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n_tokens,)))


def open_raw_uint16(path: str | os.PathLike) -> Shard:
    """A nanoGPT train.bin / val.bin: raw uint16 tokens."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0 or size % 2:
        raise ValueError(f"{path} has {size} bytes; a nanoGPT .bin file holds uint16 tokens (an "
                         "even, non-zero number of bytes): it is truncated or not a nanoGPT file")
    return Shard(path, np.memmap(path, dtype="<u2", mode="r"))


# --- a folder of shards -----------------------------------------------------------------------

@dataclass
class ShardSet:
    """The shards of a folder: training and validation splits, the format and vocabulary."""

    root: Path
    format: str  # handformer | llmc | nanogpt
    train: list[Shard]
    val: list[Shard]
    manifest: dict | None  # handformer only
    tokenizer_path: Path | None  # handformer only: the tokenizer the shards were made with

    @classmethod
    def open(cls, root: str | os.PathLike) -> ShardSet:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"no shard folder {root}; make one with `handformer prepare "
                                    "SOURCE OUT_DIR`, or give a folder of llm.c or nanoGPT .bin files")
        if (root / MANIFEST).is_file():
            return _open_handformer(root)
        if (root / "train.bin").is_file() and not _has_llmc_magic(root / "train.bin"):
            return cls(root, "nanogpt", [open_raw_uint16(root / "train.bin")],
                       [open_raw_uint16(root / "val.bin")] if (root / "val.bin").is_file() else [],
                       None, None)
        bins = sorted(root.glob("*.bin"))
        train = [open_llmc(p) for p in bins if "train" in p.name]
        val = [open_llmc(p) for p in bins if "val" in p.name]
        if not train:
            raise ValueError(f"{root} holds no shards: expected manifest.json (handformer prepare), "
                             "nanoGPT's train.bin, or llm.c shards named *train*.bin")
        return cls(root, "llmc", train, val, None, None)

    @property
    def dtype(self) -> np.dtype:
        return self.train[0].tokens.dtype

    def split(self, name: str) -> list[Shard]:
        return self.train if name == "train" else self.val

    def check_vocab(self, vocab_size: int) -> None:
        """Every recorded largest id must be below `vocab_size` (the manifest's max per shard: no
        token is read). Formats without a manifest are checked batch by batch as windows are read."""
        for shard in self.train + self.val:
            if shard.max_id is not None and shard.max_id >= vocab_size:
                raise ValueError(f"{shard.path} holds token id {shard.max_id}, outside the vocabulary "
                                 f"of {vocab_size:,} tokens; use the tokenizer the shards were made with")


def _has_llmc_magic(path: Path) -> bool:
    """Whether a file starts with an llm.c magic number (an llm.c shard named like nanoGPT's)."""
    first = np.fromfile(path, dtype="<i4", count=1)
    return len(first) == 1 and int(first[0]) in LLMC_FORMATS


def _open_handformer(root: Path) -> ShardSet:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except ValueError as err:
        raise ValueError(f"{root / MANIFEST} is not valid JSON ({err}); re-run handformer prepare") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{root / MANIFEST} is not a handformer shard manifest (format "
                         f"{manifest.get('format')!r})")
    if not manifest.get("complete"):
        raise ValueError(f"{root} is unfinished (handformer prepare was interrupted); run the same "
                         "prepare command again to finish it")
    splits = {}
    for name in ("train", "val"):
        shards = []
        for entry in manifest["splits"][name]["shards"]:
            path = root / entry["file"]
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: the manifest lists it; re-run handformer "
                                        "prepare to rebuild the shards")
            shard = open_llmc(path)
            if len(shard) != entry["tokens"]:
                raise ValueError(f"{path} holds {len(shard):,} tokens, the manifest says "
                                 f"{entry['tokens']:,}; re-run handformer prepare")
            shard.max_id = entry["max_id"]
            shards.append(shard)
        splits[name] = shards
    if not splits["train"]:
        raise ValueError(f"{root} has no training shards (its manifest lists none: the text it was prepared "
                         "from held none); prepare it again from text (`handformer prepare SOURCE OUT_DIR`)")
    return ShardSet(root, "handformer", splits["train"], splits["val"], manifest,
                    root / manifest["tokenizer"]["file"])


# --- windows ----------------------------------------------------------------------------------

class Windows:
    """The windows of T + 1 tokens that fit inside each shard of a split. A window never crosses a
    shard boundary (shards are separate files; documents inside a shard are joined by EOS, so a
    window may span documents, as in nanoGPT and llm.c). Window positions are global indices:
    shard k holds indices starts[k] .. starts[k + 1] - 1."""

    def __init__(self, shards: list[Shard], block_size: int, stride: int, vocab_size: int) -> None:
        self.shards, self.block_size, self.vocab_size = shards, block_size, vocab_size
        self.stride = stride  # 1: every offset (random windows); T: non-overlapping (sequential)
        counts = [max(0, (len(s) - block_size - 1) // stride + 1) for s in shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (shards + 1,)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def gather(self, index: np.ndarray) -> LMBatch:
        """The batch of windows with these global indices: x = tokens[o : o + T], y one later."""
        which = np.searchsorted(self.starts, index, side="right") - 1  # (B,) shard of each window
        T = self.block_size
        chunk = np.empty((len(index), T + 1), dtype=np.int64)  # (B, T + 1)
        for row, (i, k) in enumerate(zip(index.tolist(), which.tolist())):
            offset = (i - int(self.starts[k])) * self.stride
            chunk[row] = self.shards[k].tokens[offset: offset + T + 1]
        top = int(chunk.max())
        if top >= self.vocab_size:  # cheap: B * (T + 1) ids already in memory
            k = int(which[int(chunk.max(axis=1).argmax())])
            raise ValueError(f"{self.shards[k].path} holds token id {top}, outside the vocabulary of "
                             f"{self.vocab_size:,} tokens; name the tokenizer the shards were made "
                             "with (data.tokenizer) or state data.shard_vocab_size")
        chunk_t = torch.from_numpy(chunk)
        x, y = chunk_t[:, :-1], chunk_t[:, 1:]  # (B, T), (B, T)
        return LMBatch(x, y, y.numel())


class ShardWindows:
    """Training batches from memory-mapped shards, a BatchSource for the training loop.

    - `random` (nanoGPT): each batch holds B windows at uniformly random offsets over every shard
      (each position equally likely); an "epoch" is `batches_per_epoch` batches drawn from a
      generator seeded with (seed, epoch).
    - `sequential` (llm.c): non-overlapping windows in shard order, window k of a shard starting at
      k * T; an epoch is one pass over the split; the order is the same every epoch.

    Either way epoch(e)[i] is a pure function of (seed, e, i): under torchrun rank r reads batches
    r, r + W, ... of it (distributed.Shard), and a resumed run reads exactly the batches it would
    have read. Only (batches, B) window indices are kept in memory, never tokens."""

    def __init__(self, shards: list[Shard], block_size: int, batch_size: int, vocab_size: int,
                 sampling: str = "random", batches_per_epoch: int = 1000, seed: int = 0) -> None:
        if sampling not in SAMPLING:
            raise ValueError(f"sampling={sampling!r} is invalid: choose random or sequential")
        stride = 1 if sampling == "random" else block_size
        self.windows = Windows(shards, block_size, stride, vocab_size)
        if len(self.windows) == 0 or (sampling == "sequential" and len(self.windows) < batch_size):
            longest = max(len(s) for s in shards)
            raise ValueError(f"the training shards are too short for block_size={block_size} and "
                             f"batch_size={batch_size} (the longest holds {longest:,} tokens; windows "
                             "never cross shards); lower data.block_size or data.batch_size")
        self.batch_size, self.sampling = batch_size, sampling
        self.batches_per_epoch, self.seed = batches_per_epoch, seed

    def epoch(self, epoch: int) -> LazyBatches:
        B = self.batch_size
        if self.sampling == "sequential":
            return LazyBatches(len(self.windows) // B,
                               lambda i: self.windows.gather(np.arange(i * B, (i + 1) * B)))
        index = random_windows(len(self.windows), self.batches_per_epoch, B, self.seed, epoch).numpy()
        return LazyBatches(self.batches_per_epoch, lambda i: self.windows.gather(index[i]))


def shard_validation_batches(shards: list[Shard], block_size: int, batch_size: int, vocab_size: int,
                             max_batches: int = 0) -> LazyBatches:
    """The fixed validation set: non-overlapping windows of the validation shards (each token
    scored at most once), evenly spaced when more than `max_batches * batch_size` exist; 0 = all.
    Lazy: a batch is read from the shards when evaluation asks for it."""
    windows = Windows(shards, block_size, block_size, vocab_size)
    n = len(windows)
    if n == 0:
        raise ValueError(f"the validation shards hold no window of block_size + 1 = {block_size + 1} "
                         "tokens; lower data.block_size or prepare with a larger --val-fraction")
    wanted = max_batches * batch_size
    index = np.arange(n)
    if max_batches and n > wanted:
        index = np.linspace(0, n - 1, wanted).round().astype(np.int64)
    return LazyBatches(math.ceil(len(index) / batch_size),
                       lambda i: windows.gather(index[i * batch_size: (i + 1) * batch_size]))
