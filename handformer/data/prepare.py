"""`handformer prepare`: tokenize a corpus once into memory-mappable shards (see shards.py).

The corpus streams through in pieces of at most a megabyte, so memory does not grow with it:

1. **Documents** (documents.py): files, JSONL records, or chunks between blank lines, read in
   blocks; a very long document comes in pieces cut at line ends.
2. **Splits.** Document i goes to validation when floor((i + 1) f) > floor(i f), f the validation
   fraction: exactly that fraction of the documents, spread evenly over the corpus, split at
   document boundaries.
3. **Tokenizer.** A run directory's or a tokenizer.json file, `char`, or `bpe:N` trained on the
   first `sample_mb` megabytes of the training documents (a bounded sample).
4. **Tokens.** Batches of about a megabyte of text go through `tokenizers`' batch encoding (Rust,
   on every core) while a reader thread reads the next batch; each document ends with the
   tokenizer's EOS. A character tokenizer maps code points through a lookup table instead.
5. **Shards.** Each split fills shards of `shard_tokens` tokens (uint16, or uint32 when the
   vocabulary needs it) in llm.c's layout. A shard is written to a temporary file and renamed
   when full; manifest.json is rewritten atomically after every finished shard with where the
   next shard starts in the document stream, so an interrupted run, re-run with the same
   arguments, keeps its finished shards (checked against their SHA-256) and redoes the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from handformer.data import documents as docs
from handformer.data.documents import Piece, read_pieces, source_files
from handformer.data.shards import MANIFEST, MANIFEST_FORMAT, llmc_header
from handformer.data.tokenizer import Tokenizer
from handformer.io import atomic_write_text, stale_temporary_files

BATCH_CHARS = 1 << 20  # text per batch-encoding call
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")


def is_validation(doc_index: int, val_fraction: float) -> bool:
    """Whether document `doc_index` belongs to the validation split (evenly spread)."""
    return int((doc_index + 1) * val_fraction) > int(doc_index * val_fraction)


def _prefetch(iterator: Iterator, depth: int = 4) -> Iterator:
    """Run `iterator` in a background thread, `depth` items ahead (reading overlaps encoding,
    which releases the GIL). Exceptions reach the consumer; when the consumer stops early (an
    error, an interrupt), the thread stops too."""
    q: queue.Queue = queue.Queue(depth)
    done, stop = object(), threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in iterator:
                if not put(item):
                    return
            put(done)
        except BaseException as err:  # noqa: B036 - handed to the consumer
            put(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


# --- tokenizing -------------------------------------------------------------------------------

@dataclass
class PrepTokenizer:
    tokenizer: Tokenizer
    eos_id: int
    spec: str
    char_table: np.ndarray | None = None  # code point -> id, for a character tokenizer

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.tokenizer.vocab_size <= 1 << 16 else np.dtype("<u4")

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids one after another, (P,) ids per text): no EOS, no special tokens."""
        if self.char_table is not None:  # one lookup for the whole batch
            points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype="<u4")
            flat = self.char_table[np.minimum(points, len(self.char_table) - 1)]
            return flat, np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        hf = self.tokenizer.hf  # encode_batch_fast (tokenizers >= 0.21) skips the offsets
        encodings = getattr(hf, "encode_batch_fast", hf.encode_batch)(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64,
                           count=int(lengths.sum()))
        return flat, lengths


def _char_table(tokenizer: Tokenizer) -> np.ndarray | None:
    chars = tokenizer._char_ids
    if chars is None:
        return None
    size = max((ord(c) for c in chars), default=0) + 2  # the last entry: every larger code point
    table = np.full(size, tokenizer.unk_id, dtype=np.int64)
    for c, i in chars.items():
        table[ord(c)] = i
    return table


def _eos_id(tokenizer: Tokenizer, run_config: dict | None) -> int:
    eos = (run_config or {}).get("tokens", {}).get("eos_id")
    if eos is None:
        eos = tokenizer.eos_id
    for name in EOS_NAMES:
        if eos is None:
            eos = tokenizer.hf.token_to_id(name)
    if eos is None:
        raise ValueError("the tokenizer has no end-of-document token (none of "
                         f"{', '.join(EOS_NAMES)}); documents must be separated by one")
    return int(eos)


def load_prep_tokenizer(spec: str, train_texts: Callable[[], Iterator[str]],
                        log: Callable[[str], None] = print) -> PrepTokenizer:
    """`RUN_DIR` or `tokenizer.json`, `char`, or `bpe:N` (trained on `train_texts()`)."""
    path = Path(spec)
    if spec == "char" or spec.startswith("bpe:"):
        start = time.perf_counter()
        if spec == "char":
            tokenizer = Tokenizer.train_char(train_texts())
        else:
            try:
                size = int(spec[4:])
            except ValueError:
                raise ValueError(f"--tokenizer {spec}: write bpe:N with N the vocabulary size, e.g. "
                                 "bpe:8000") from None
            tokenizer = Tokenizer.train_bpe(train_texts(), size)
        log(f"trained a {spec} tokenizer: {tokenizer.vocab_size:,} tokens in "
            f"{time.perf_counter() - start:.1f} s")
        run_config = None
    elif path.is_dir():
        tokenizer = Tokenizer.load(path / "tokenizer.json")
        config = path / "config.json"
        run_config = json.loads(config.read_text()) if config.is_file() else None
    elif path.is_file():
        tokenizer, run_config = Tokenizer.load(path), None
    else:
        raise FileNotFoundError(f"--tokenizer {spec}: give a run directory, a tokenizer.json, char, "
                                "or bpe:N (e.g. bpe:8000)")
    return PrepTokenizer(tokenizer, _eos_id(tokenizer, run_config), spec, _char_table(tokenizer))


# --- writing shards ---------------------------------------------------------------------------

@dataclass
class ShardWriter:
    """One split's shards: train_000000.bin, ... Each is written to a temporary file and renamed
    into place when full (or at the end), so a shard file on disk is always complete."""

    out_dir: Path
    split: str
    dtype: np.dtype
    shard_tokens: int
    on_finish: Callable[[], None]
    shards: list[dict] = field(default_factory=list)  # finished shards (manifest entries)
    position: tuple[int, int] = (0, 0)  # (piece, token) in the stream where the open shard starts
    _file: Any = None
    _tmp: Path | None = None
    _count: int = 0
    _docs: int = 0
    _max: int = 0
    _hash: Any = None

    def _open(self) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        self._tmp = self.out_dir / f".{name}.tmp"
        self._file = open(self._tmp, "wb")
        self._file.write(llmc_header(0, self.dtype))  # the count is filled in when the shard closes
        self._count, self._docs, self._max, self._hash = 0, 0, 0, hashlib.sha256()

    def write(self, ids: np.ndarray, pieces: np.ndarray, starts: np.ndarray, eos_at: np.ndarray,
              skipped: int = 0) -> None:
        """Append `ids`: the tokens of pieces number `pieces` (P,), piece j's from `starts[j]` on,
        EOS at the positions `eos_at` (one per finished document). The first piece's first
        `skipped` tokens were written before (a resumed run)."""
        done = 0
        while True:
            if self._file is None:
                self.position = self._where(done, pieces, starts, skipped)
                self._open()
            room = self.shard_tokens - self._count
            if room == 0 and done < len(ids):  # full, and more to come: finish it, open the next
                self._finish(next_position=self._where(done, pieces, starts, skipped))
                continue
            chunk = ids[done: done + room].astype(self.dtype)
            if len(chunk):
                data = chunk.tobytes()
                self._file.write(data)
                self._hash.update(data)
                self._count += len(chunk)
                self._max = max(self._max, int(chunk.max()))
                self._docs += int(((eos_at >= done) & (eos_at < done + len(chunk))).sum())
                done += len(chunk)
            if done >= len(ids):
                break

    @staticmethod
    def _where(offset: int, pieces: np.ndarray, starts: np.ndarray, skipped: int) -> tuple[int, int]:
        """(piece, token within it) of position `offset` of a write."""
        j = int(np.searchsorted(starts, offset, side="right")) - 1
        if j < 0:
            return (int(pieces[0]), skipped) if len(pieces) else (0, 0)
        return int(pieces[j]), offset - int(starts[j]) + (skipped if j == 0 else 0)

    def _finish(self, next_position: tuple[int, int]) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        self._file.seek(0)
        self._file.write(llmc_header(self._count, self.dtype))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.out_dir / name)
        self.shards.append({"file": name, "tokens": self._count, "documents": self._docs,
                            "max_id": self._max, "sha256": self._hash.hexdigest(),
                            "next": list(next_position)})
        self._file, self._tmp = None, None
        self.on_finish()

    def close(self, end: tuple[int, int]) -> None:
        if self._file is not None and self._count:
            self._finish(next_position=end)
        elif self._file is not None:
            self._file.close()
            os.unlink(self._tmp)
            self._file = None

    def totals(self) -> dict:
        return {"tokens": sum(s["tokens"] for s in self.shards),
                "documents": sum(s["documents"] for s in self.shards), "shards": self.shards}


# --- the whole job ----------------------------------------------------------------------------

@dataclass
class PrepareResult:
    manifest: dict
    elapsed_s: float
    text_bytes: int  # UTF-8 text read in this run (a resumed run skips what it kept)
    tokens: int  # tokens written in this run
    kept_shards: int  # finished shards kept from an interrupted run


def _verified(out_dir: Path, shards: list[dict]) -> list[dict]:
    """The leading shards whose file still matches its checksum."""
    kept = []
    for entry in shards:
        path = out_dir / entry["file"]
        if not path.is_file():
            break
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            f.seek(1024)
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        if digest.hexdigest() != entry["sha256"]:
            break
        kept.append(entry)
    return kept


def prepare(source: str | os.PathLike, out_dir: str | os.PathLike, tokenizer: str,
            val_fraction: float = 0.1, shard_tokens: int = 100_000_000, sample_mb: float = 64.0,
            text_field: str = "text", progress: bool = True,
            log: Callable[[str], None] = print) -> PrepareResult:
    """Tokenize `source` into shards in `out_dir` (see the module docstring). Re-running an
    interrupted job with the same arguments keeps its finished shards."""
    _check_arguments(tokenizer, val_fraction, shard_tokens, sample_mb)
    files = source_files(source)
    out_dir = Path(out_dir)
    options = {"source": str(Path(source).resolve()), "source_files": len(files),
               "source_bytes": sum(p.stat().st_size for p in files), "tokenizer": tokenizer,
               "val_fraction": val_fraction, "shard_tokens": shard_tokens, "text_field": text_field,
               "sample_mb": sample_mb, "max_piece_chars": docs.MAX_PIECE_CHARS}
    old = _read_manifest(out_dir, options)
    if old is not None and old.get("complete"):
        log(f"{out_dir} is already prepared (manifest.json complete); nothing to do")
        return PrepareResult(old, 0.0, 0, 0, sum(len(s["shards"]) for s in old["splits"].values()))
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in stale_temporary_files(out_dir):  # an interrupted shard
        stale.unlink()

    start = time.perf_counter()
    if old is not None:  # resume: the tokenizer is the one the kept shards were made with
        tok = load_prep_tokenizer(str(out_dir / "tokenizer.json"), iter, log)
        tok.spec, tok.eos_id = tokenizer, old["tokenizer"]["eos_id"]
    else:
        sample = int(sample_mb * 1e6)
        tok = load_prep_tokenizer(tokenizer, lambda: _sample(files, text_field, val_fraction, sample), log)
        tok.tokenizer.save(out_dir / "tokenizer.json")

    writers: dict[str, ShardWriter] = {}
    manifest = {"format": MANIFEST_FORMAT, "version": 1, "complete": False, "options": options,
                "tokenizer": {"file": "tokenizer.json", "spec": tokenizer,
                              "vocab_size": tok.tokenizer.vocab_size, "eos_id": tok.eos_id},
                "dtype": tok.dtype.name, "layout": "llm.c header (256 int32), then the tokens"}

    def save_manifest(**extra: Any) -> None:
        manifest["splits"] = {name: w.totals() for name, w in writers.items()}
        manifest.update(extra)
        atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")

    kept = 0
    for name in ("train", "val"):
        w = ShardWriter(out_dir, name, tok.dtype, shard_tokens, save_manifest)
        if old is not None:
            w.shards = _verified(out_dir, old["splits"][name]["shards"])
            kept += len(w.shards)
            if w.shards:
                w.position = tuple(w.shards[-1]["next"])
        writers[name] = w
    if old is not None:
        log(f"resuming: {kept} finished shard(s) kept")
    save_manifest()

    stats = _run(files, text_field, val_fraction, tok, writers, progress)
    save_manifest(complete=True, unknown_tokens=stats["unknown"])
    result = PrepareResult(manifest, time.perf_counter() - start, stats["text_bytes"], stats["tokens"], kept)
    _report(result, out_dir, stats["unknown"], log)
    return result


def _check_arguments(tokenizer: str, val_fraction: float, shard_tokens: int, sample_mb: float) -> None:
    if not 0 <= val_fraction < 1:
        raise ValueError(f"--val-fraction {val_fraction} is invalid: it must be in [0, 1)")
    if shard_tokens < 1:
        raise ValueError(f"--shard-tokens {shard_tokens} is invalid: it must be a positive integer")
    if sample_mb <= 0:
        raise ValueError(f"--sample-mb {sample_mb} is invalid: it must be > 0")
    if tokenizer.startswith("bpe:") and not tokenizer[4:].isdigit():
        raise ValueError(f"--tokenizer {tokenizer}: write bpe:N with N the vocabulary size, e.g. bpe:8000")
    if tokenizer != "char" and not tokenizer.startswith("bpe:") and not Path(tokenizer).exists():
        raise FileNotFoundError(f"--tokenizer {tokenizer}: give a run directory, a tokenizer.json, "
                                "char, or bpe:N (e.g. bpe:8000)")


def _report(result: PrepareResult, out_dir: Path, unknown: int, log: Callable[[str], None]) -> None:
    train, val = result.manifest["splits"]["train"], result.manifest["splits"]["val"]
    log(f"{out_dir}: train {train['tokens']:,} tokens in {len(train['shards'])} shard(s) "
        f"({train['documents']:,} documents), val {val['tokens']:,} tokens in {len(val['shards'])} "
        f"shard(s) ({val['documents']:,} documents), {result.manifest['dtype']}")
    elapsed = max(result.elapsed_s, 1e-9)
    log(f"{result.text_bytes / 1e6:,.1f} MB of text in {elapsed:.1f} s: "
        f"{result.text_bytes / 1e6 / elapsed:,.2f} MB/s, {result.tokens / elapsed:,.0f} tokens/s")
    if unknown:
        log(f"warning: {unknown:,} characters were outside the tokenizer's vocabulary "
            "(written as <unk>); raise --sample-mb so the tokenizer sees more of the corpus")
    if not train["tokens"]:
        raise ValueError(f"no training tokens were written to {out_dir}: the source holds no documents")


def _read_manifest(out_dir: Path, options: dict) -> dict | None:
    """The manifest of an earlier run into `out_dir`, checked to have the same options."""
    path = out_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"{path} is damaged; delete {out_dir} and prepare again") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path} is not a handformer shard manifest; give another OUT_DIR")
    if manifest.get("options") != options:
        before = manifest.get("options") or {}
        changed = ", ".join(f"{k} {before.get(k)!r}" for k in options if before.get(k) != options[k])
        raise ValueError(f"{out_dir} holds shards prepared with other options ({changed}); give "
                         "another OUT_DIR, the same options to finish or keep it, or delete it")
    return manifest


def _sample(files: list[Path], text_field: str, val_fraction: float, limit: int) -> Iterator[str]:
    """The first `limit` characters (about bytes) of training documents: the tokenizer's sample."""
    seen, doc = 0, 0
    for piece in read_pieces(files, text_field):
        if not is_validation(doc, val_fraction):
            yield piece.text
            seen += len(piece.text)
            if seen >= limit:
                return
        doc += piece.ends


def _batches(files: list[Path], text_field: str,
             totals: dict[str, int]) -> Iterator[list[tuple[int, int, Piece]]]:
    """(piece index, document index, piece) in batches of about BATCH_CHARS characters."""
    batch, chars, doc = [], 0, 0
    for i, piece in enumerate(read_pieces(files, text_field, totals)):
        batch.append((i, doc, piece))
        chars += len(piece.text)
        doc += piece.ends
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _run(files: list[Path], text_field: str, val_fraction: float, tok: PrepTokenizer,
         writers: dict[str, ShardWriter], progress: bool) -> dict[str, int]:
    """Tokenize the corpus into the writers, skipping what their positions say is written."""
    total_disk = sum(p.stat().st_size for p in files)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total_disk, unit="B", unit_scale=True, dynamic_ncols=True, file=sys.stderr,
                   desc="prepare")
    stats = {"text_bytes": 0, "tokens": 0, "unknown": 0}
    start, last_disk, last_piece = time.perf_counter(), 0, -1
    totals: dict[str, int] = {}
    for batch in _prefetch(_batches(files, text_field, totals)):
        index = np.array([i for i, _, _ in batch], dtype=np.int64)  # (P,) piece numbers
        is_val = np.array([is_validation(doc, val_fraction) for _, doc, _ in batch])
        ends = np.array([p.ends for _, _, p in batch])
        for name, writer in writers.items():
            keep = (is_val == (name == "val")) & (index >= writer.position[0])
            if keep.any():
                texts = [p.text for (_, _, p), k in zip(batch, keep) if k]
                stats["tokens"] += _write_pieces(writer, tok, texts, index[keep], ends[keep], stats)
        stats["text_bytes"] = batch[-1][2].text_bytes
        last_piece = int(index[-1])
        if bar is not None:
            disk = batch[-1][2].disk_bytes
            bar.update(disk - last_disk)
            last_disk = disk
            now = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(f"{stats['text_bytes'] / 1e6 / now:.2f} MB/s text, "
                                f"{stats['tokens'] / now:,.0f} tok/s")
    stats["text_bytes"] = totals.get("text_bytes", 0)
    for writer in writers.values():
        writer.close(end=(last_piece + 1, 0))
    if bar is not None:
        bar.update(total_disk - last_disk)
        bar.close()
    return stats


def _write_pieces(writer: ShardWriter, tok: PrepTokenizer, texts: list[str], pieces: np.ndarray,
                  ends: np.ndarray, stats: dict[str, int]) -> int:
    """Encode one split's pieces of a batch, add EOS after each finished document, drop what a
    resumed run wrote before, and hand the tokens to the writer. Returns the tokens written."""
    flat, lengths = tok.encode_batch(texts)  # (N,), (P,)
    if tok.char_table is not None:
        stats["unknown"] += int((flat == tok.tokenizer.unk_id).sum())
    piece_end = np.cumsum(lengths)  # (P,) where each piece's tokens end in `flat`
    ids = np.insert(flat, piece_end[ends], tok.eos_id)  # EOS after each document's last piece
    sizes = lengths + ends  # (P,) tokens per piece, EOS included
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)  # (P,)
    eos_at = (starts + sizes - 1)[ends]
    skipped = writer.position[1] if pieces[0] == writer.position[0] else 0
    if skipped:  # a resumed run: this piece's first tokens are in a kept shard
        ids, starts, eos_at = ids[skipped:], starts - skipped, eos_at - skipped
        starts[0] = 0
    writer.write(ids, pieces, starts, eos_at, skipped)
    return len(ids)
