"""Token shards: `handformer prepare` (round trip, splits, resume after a crash, memory), the three
formats read as published (handformer, llm.c GPT-2 and Llama 3, nanoGPT), windows (shard
boundaries, ranks, resume), clear errors for malformed files, and training from shards."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import handformer.data.prepare as prep
from handformer.cli import main
from handformer.config import CausalLMConfig
from handformer.data import documents as docs
from handformer.data.documents import documents
from handformer.data.prepare import is_validation, prepare
from handformer.data.shards import ShardSet, ShardWindows, Windows, shard_validation_batches
from handformer.data.tokenizer import Tokenizer
from handformer.models.causal_lm import CausalLM
from handformer.tasks.job_file import apply_overrides, load_job_file
from handformer.tasks.lm.job import LMJob
from handformer.training.distributed import Shard

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hum "
         "kings and queens of england ride north über café").split()


def random_text(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(rng.choice(WORDS, n_words))


def corpus(root: Path, seed: int = 0, docs_per_file: int = 30) -> Path:
    """A folder with every source kind: plain text (documents between blank lines), .gz, .jsonl,
    .jsonl.gz, in a subfolder too; a hidden file that must be skipped."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)

    def paragraphs() -> list[str]:
        return ["\n".join(random_text(rng, int(rng.integers(3, 12))) for _ in range(rng.integers(1, 4)))
                for _ in range(docs_per_file)]

    (root / "a.txt").write_text("\n\n".join(paragraphs()) + "\n")
    with gzip.open(root / "b.txt.gz", "wt") as f:
        f.write("\n\n  \n\n".join(paragraphs()))
    lines = [json.dumps({"text": p, "id": i}) for i, p in enumerate(paragraphs())]
    (root / "c.jsonl").write_text("\n".join(lines) + "\n")
    (root / "sub").mkdir(exist_ok=True)
    with gzip.open(root / "sub" / "d.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps({"text": p}) for p in paragraphs()))
    (root / ".hidden.txt").write_text("never read")
    return root


def read_split(out: Path, split: str) -> np.ndarray:
    shards = ShardSet.open(out).split(split)
    return np.concatenate([np.asarray(s.tokens) for s in shards]) if shards else np.zeros(0, int)


def expected_split(tok: Tokenizer, docs: list[str], split: str, val_fraction: float) -> list[int]:
    ids = []
    for i, doc in enumerate(docs):
        if is_validation(i, val_fraction) == (split == "val"):
            ids += tok.encode(doc) + [tok.eos_id]
    return ids


# --- prepare ----------------------------------------------------------------------------------

def test_documents_are_files_records_and_chunks_between_blank_lines(tmp_path):
    (tmp_path / "x.txt").write_text("\ufeffone\n  two\n\n\n  \nthree\n\nfour\n")
    (tmp_path / "y.jsonl").write_text('{"text": "five\\n\\nstill five"}\n\n{"text": ""}\n')
    assert list(documents(tmp_path)) == ["one\n  two", "three", "four", "five\n\nstill five", ""]


@pytest.mark.parametrize("spec", ["char", "bpe:300"])
def test_round_trip_tokens_read_back_equal_the_tokenizers_output(tmp_path, spec):
    src = corpus(tmp_path / "src")
    out = tmp_path / "out"
    prepare(src, out, spec, val_fraction=0.1, shard_tokens=700, progress=False, log=lambda *_: None)
    tok = Tokenizer.load(out / "tokenizer.json")
    docs = list(documents(src))
    assert len(docs) == 120
    for split in ("train", "val"):
        assert read_split(out, split).tolist() == expected_split(tok, docs, split, 0.1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["dtype"] == "uint16"
    assert manifest["splits"]["val"]["documents"] == 12  # every tenth document, at boundaries
    assert manifest["splits"]["train"]["documents"] == 108
    for split in ("train", "val"):
        for entry in manifest["splits"][split]["shards"]:
            tokens = np.asarray(ShardSet.open(out).split(split)[int(entry["file"][-10:-4])].tokens)
            assert entry["tokens"] == len(tokens) <= 700
            assert entry["max_id"] == tokens.max()
            assert entry["sha256"] == hashlib.sha256(tokens.tobytes()).hexdigest()
            assert entry["documents"] == int((tokens == tok.eos_id).sum())


def test_a_long_document_is_tokenized_in_pieces_without_an_eos_between_them(tmp_path, monkeypatch):
    monkeypatch.setattr(docs, "MAX_PIECE_CHARS", 50)
    text = "\n".join(f"line {i} of a single long document" for i in range(40))
    (tmp_path / "long.txt").write_text(text)
    assert list(documents(tmp_path / "long.txt")) == [text]
    prepare(tmp_path / "long.txt", tmp_path / "out", "char", val_fraction=0, progress=False,
            log=lambda *_: None)
    tok = Tokenizer.load(tmp_path / "out" / "tokenizer.json")
    assert read_split(tmp_path / "out", "train").tolist() == tok.encode(text) + [tok.eos_id]


def test_bpe_is_trained_on_a_bounded_sample_of_the_training_documents(tmp_path, monkeypatch):
    src = corpus(tmp_path / "src")
    seen = []
    real = Tokenizer.train_bpe

    def spy(texts, vocab_size):
        texts = list(texts)
        seen.extend(texts)
        return real(texts, vocab_size)

    monkeypatch.setattr(Tokenizer, "train_bpe", spy)
    prepare(src, tmp_path / "out", "bpe:300", sample_mb=0.002, progress=False, log=lambda *_: None)
    docs = [d for i, d in enumerate(documents(src)) if not is_validation(i, 0.1)]
    assert 2000 <= sum(map(len, seen)) < 2000 + max(map(len, docs))
    assert seen == docs[: len(seen)]


def test_an_interrupted_prepare_keeps_finished_shards_and_redoes_the_rest(tmp_path, monkeypatch):
    src = corpus(tmp_path / "src", docs_per_file=60)
    args = dict(tokenizer="bpe:300", val_fraction=0.2, shard_tokens=300, progress=False,
                log=lambda *_: None)
    prepare(src, tmp_path / "straight", **args)
    real_finish, finished = prep.ShardWriter._finish, []

    def crash_on_the_fifth(self, next_position):
        if len(finished) == 4:
            raise KeyboardInterrupt
        real_finish(self, next_position)
        finished.append(self.shards[-1]["file"])

    with monkeypatch.context() as m:
        m.setattr(prep.ShardWriter, "_finish", crash_on_the_fifth)
        with pytest.raises(KeyboardInterrupt):
            prepare(src, tmp_path / "crashed", **args)
    crashed = tmp_path / "crashed"
    assert not json.loads((crashed / "manifest.json").read_text())["complete"]
    with pytest.raises(ValueError, match="unfinished"):
        ShardSet.open(crashed)
    kept = {name: (crashed / name).stat().st_mtime_ns for name in finished}
    (crashed / ".train_000009.bin.tmp").write_bytes(b"half a shard")
    result = prepare(src, crashed, **args)
    assert result.kept_shards == 4
    assert {name: (crashed / name).stat().st_mtime_ns for name in finished} == kept  # not rewritten
    assert not list(crashed.glob(".*.tmp"))
    straight = json.loads((tmp_path / "straight" / "manifest.json").read_text())
    again = json.loads((crashed / "manifest.json").read_text())
    assert again["splits"] == straight["splits"]
    for path in (tmp_path / "straight").glob("*.bin"):
        assert (crashed / path.name).read_bytes() == path.read_bytes()
    assert prepare(src, crashed, **args).tokens == 0  # complete: nothing to do


def test_prepare_errors_are_one_clear_line(tmp_path, capsys):
    src = corpus(tmp_path / "src")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    cases = [
        ([str(tmp_path / "nope"), str(tmp_path / "o1"), "--tokenizer", "char"], "no such file or folder"),
        ([str(src), str(tmp_path / "o2"), "--tokenizer", "bpe:lots"], "bpe:N"),
        ([str(src), str(tmp_path / "o3"), "--tokenizer", str(tmp_path / "nowhere")], "run directory"),
        ([str(tmp_path / "bad.jsonl"), str(tmp_path / "o4"), "--tokenizer", "char"], "bad.jsonl:2 has no text field 'text'"),
        ([str(tmp_path / "latin1.txt"), str(tmp_path / "o5"), "--tokenizer", "char"], "is not UTF-8"),
        ([str(src), str(tmp_path / "o6"), "--tokenizer", "char", "--val-fraction", "1"], "--val-fraction 1.0 is invalid"),
    ]
    for argv, message in cases:
        assert main(["prepare", *argv, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert main(["prepare", str(src), str(tmp_path / "o7"), "--tokenizer", "char", "--no-progress"]) == 0
    assert main(["prepare", str(src), str(tmp_path / "o7"), "--tokenizer", "bpe:300", "--no-progress"]) == 2
    assert "prepared with other options (tokenizer" in capsys.readouterr().err


def test_a_run_directorys_tokenizer_and_its_eos_are_used(tmp_path):
    src = corpus(tmp_path / "src")
    prepare(src, tmp_path / "first", "bpe:300", progress=False, log=lambda *_: None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer.json").write_bytes((tmp_path / "first" / "tokenizer.json").read_bytes())
    (run / "config.json").write_text(json.dumps({"tokens": {"eos_id": 7}}))
    prepare(src, tmp_path / "second", str(run), progress=False, log=lambda *_: None)
    manifest = json.loads((tmp_path / "second" / "manifest.json").read_text())
    assert manifest["tokenizer"]["eos_id"] == 7
    assert manifest["splits"]["train"]["documents"] == int((read_split(tmp_path / "second", "train") == 7).sum())


# --- peak memory --------------------------------------------------------------------------------

def big_text_file(path: Path, megabytes: float) -> Path:
    rng = np.random.default_rng(0)
    paragraph = "\n\n".join(random_text(rng, 40) for _ in range(200))
    with open(path, "w") as f:
        for _ in range(int(megabytes * 1e6 / len(paragraph)) + 1):
            f.write(paragraph + "\n\n")
    return path


def test_prepare_memory_does_not_grow_with_the_corpus_fast(tmp_path, monkeypatch):
    """Python-level peak (tracemalloc: strings, lists, numpy buffers) for 1 MB vs 10 MB, with
    the read block and the batch shrunk from megabytes to 64 KB, so that 1 MB is already far past
    them and the reader thread's queue (4 batches)."""
    monkeypatch.setattr(docs, "READ_BYTES", 1 << 16)
    monkeypatch.setattr(prep, "BATCH_CHARS", 1 << 16)
    peaks = []
    for mb in (1, 10):
        src = big_text_file(tmp_path / f"c{mb}.txt", mb)
        tracemalloc.start()
        prepare(src, tmp_path / f"o{mb}", "char", shard_tokens=1_000_000, sample_mb=0.5,
                progress=False, log=lambda *_: None)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] + 1.5e6, peaks  # ~2 MB either way; the corpus grows by 9 MB


@pytest.mark.slow
def test_prepare_peak_rss_does_not_grow_with_the_corpus(tmp_path):
    """Whole-process peak RSS (Rust tokenizer included) for a 10x larger corpus, BPE."""
    rss = []
    for mb in (10, 100):
        src = big_text_file(tmp_path / f"c{mb}.txt", mb)
        code = ("import resource, sys; from handformer.data.prepare import prepare; "
                f"prepare({str(src)!r}, {str(tmp_path / f'o{mb}')!r}, 'bpe:2000', sample_mb=5, "
                "progress=False, log=lambda *_: None); "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        rss.append(int(out.stdout.split()[-1]) * 1024)
    assert rss[1] < rss[0] + 100e6, rss  # the corpus grows by 90 MB


# --- the formats ----------------------------------------------------------------------------------

def write_llmc(path: Path, tokens, magic: int = 20240520, version: int = 1, dtype="<u2",
               count: int | None = None) -> None:
    """llm.c's dev/data/data_common.py layout: 256 int32 (magic, version, count), then tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=dtype).tobytes())


def test_llmc_gpt2_and_llama3_shards_are_read_as_published(tmp_path):
    rng = np.random.default_rng(0)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    parts = [rng.integers(0, 50257, n) for n in (500, 300, 200)]
    write_llmc(gpt2 / "fineweb_val_000000.bin", parts[0])
    write_llmc(gpt2 / "fineweb_train_000001.bin", parts[1])
    write_llmc(gpt2 / "fineweb_train_000002.bin", parts[2])
    shards = ShardSet.open(gpt2)
    assert shards.format == "llmc" and shards.dtype == np.uint16
    assert [np.asarray(s.tokens).tolist() for s in shards.train] == [parts[1].tolist(), parts[2].tolist()]
    assert np.asarray(shards.val[0].tokens).tolist() == parts[0].tolist()

    llama = tmp_path / "llama"
    llama.mkdir()
    ids = rng.integers(0, 128256, 400)
    write_llmc(llama / "train_000000.bin", ids, magic=20240801, version=7, dtype="<u4")
    shards = ShardSet.open(llama)
    assert shards.dtype == np.uint32 and np.asarray(shards.train[0].tokens).tolist() == ids.tolist()
    assert shards.val == []


def test_nanogpt_train_and_val_bin_are_read_as_published(tmp_path):
    train, val = np.arange(1000) % 65, np.arange(200) % 65
    # nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile("train.bin")
    train.astype(np.uint16).tofile(tmp_path / "train.bin")
    val.astype(np.uint16).tofile(tmp_path / "val.bin")
    shards = ShardSet.open(tmp_path)
    assert shards.format == "nanogpt"
    (tmp_path / "llmc").mkdir()
    write_llmc(tmp_path / "llmc" / "train.bin", train)  # an llm.c shard by nanoGPT's name
    assert ShardSet.open(tmp_path / "llmc").format == "llmc"
    assert np.asarray(shards.train[0].tokens).tolist() == train.tolist()
    assert np.asarray(shards.val[0].tokens).tolist() == val.tolist()


# --- windows --------------------------------------------------------------------------------------

def numbered_shards(tmp_path: Path, sizes=(50, 7, 33, 120)) -> ShardSet:
    """Shards whose tokens are their global positions, so a window shows where it came from."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    start = 0
    for k, n in enumerate(sizes):
        write_llmc(tmp_path / f"x_train_{k:06d}.bin", np.arange(start, start + n))
        start += n
    write_llmc(tmp_path / "x_val_000000.bin", np.arange(1000, 1100))
    return ShardSet.open(tmp_path)


def shard_of(token: int, sizes=(50, 7, 33, 120)) -> int:
    return int(np.searchsorted(np.cumsum(sizes), token, side="right"))


@pytest.mark.parametrize("sampling", ["random", "sequential"])
def test_windows_are_contiguous_slices_that_never_cross_a_shard_boundary(tmp_path, sampling):
    shards = numbered_shards(tmp_path)
    source = ShardWindows(shards.train, 8, 4, 2000, sampling, batches_per_epoch=200, seed=3)
    seen_shards, starts = set(), []
    for batch in source.epoch(0):
        chunk = torch.cat([batch.x, batch.y[:, -1:]], dim=1)  # (B, T + 1)
        assert torch.equal(batch.y[:, :-1], batch.x[:, 1:])
        for row in chunk.tolist():
            assert row == list(range(row[0], row[0] + 9))  # consecutive tokens
            assert shard_of(row[0]) == shard_of(row[-1])  # inside one shard
            seen_shards.add(shard_of(row[0]))
            starts.append(row[0])
    assert seen_shards == {0, 2, 3}  # shard 1 (7 tokens) is too short for a window of 9
    if sampling == "sequential":  # every non-overlapping window of each shard once, in order
        expected = [s + 8 * k for s, n in ((0, 50), (57, 33), (90, 120)) for k in range((n - 1) // 8)]
        assert starts == expected[: len(expected) // 4 * 4]
    else:  # both ends of every shard are reachable
        assert {0, 41, 57, 81, 90, 201} <= set(starts)


def test_validation_batches_are_fixed_non_overlapping_windows_of_the_val_shards(tmp_path):
    shards = numbered_shards(tmp_path)
    every = shard_validation_batches(shards.val, 8, 4, 2000)
    assert [b.x[:, 0].tolist() for b in every] == [[1000, 1008, 1016, 1024], [1032, 1040, 1048, 1056],
                                                  [1064, 1072, 1080, 1088]]
    spaced = shard_validation_batches(shards.val, 8, 2, 2000, max_batches=1)
    assert [b.x[:, 0].tolist() for b in spaced] == [[1000, 1088]]
    assert [b.x[:, 0].tolist() for b in every[1::2]] == [[1032, 1040, 1048, 1056]]


def test_every_rank_draws_different_windows_and_together_the_global_stream(tmp_path):
    shards = numbered_shards(tmp_path)
    source = ShardWindows(shards.train, 8, 4, 2000, "random", batches_per_epoch=10, seed=0)
    epoch = source.epoch(0)
    ranks = [Shard(epoch, r, 2) for r in range(2)]
    for i in range(5):
        assert not torch.equal(ranks[0][i].x, ranks[1][i].x)
        assert torch.equal(ranks[0][i].x, epoch[2 * i].x) and torch.equal(ranks[1][i].x, epoch[2 * i + 1].x)


@pytest.mark.parametrize("sampling", ["random", "sequential"])
def test_the_window_stream_is_a_pure_function_of_seed_epoch_and_position(tmp_path, sampling):
    shards = numbered_shards(tmp_path)

    def stream(seed):
        return ShardWindows(shards.train, 8, 4, 2000, sampling, batches_per_epoch=6, seed=seed)

    a, b = stream(1), stream(1)
    for e in (0, 3):
        assert [x.x.tolist() for x in a.epoch(e)[2:]] == [x.x.tolist() for x in b.epoch(e)][2:]
    if sampling == "random":
        assert a.epoch(0)[0].x.tolist() != a.epoch(1)[0].x.tolist()
        assert a.epoch(0)[0].x.tolist() != stream(2).epoch(0)[0].x.tolist()


def test_windows_read_only_the_rows_they_need(tmp_path):
    """Memory independent of corpus size: the sampler keeps window indices, never tokens."""
    shards = numbered_shards(tmp_path)
    source = ShardWindows(shards.train, 8, 4, 2000, "random", batches_per_epoch=1000, seed=0)
    assert all(isinstance(s.tokens, np.memmap) for s in shards.train)
    assert source.epoch(0)[999].x.shape == (4, 8)
    assert len(Windows(shards.train, 8, 1, 2000)) == (50 - 8) + (33 - 8) + (120 - 8)


# --- malformed files: one clear error line ----------------------------------------------------------

def lm_train(out: Path, shards: Path, *pairs: str) -> int:
    argv = ["train", "--config", str(ROOT / "configs" / "tiny_lm.toml"), "--out", str(out),
            "--set", f"data.shards={shards}", "--set", "data.block_size=8", "--set", "data.batch_size=2",
            "--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "train.progress=false"]
    for pair in pairs:
        argv += ["--set", pair]
    return main(argv)


def malformed(tmp_path: Path, kind: str) -> tuple[Path, list[str], str]:
    d = tmp_path / kind
    d.mkdir()
    ok = np.arange(100) % 50
    vocab = ["data.shard_vocab_size=64"]
    if kind == "magic":
        write_llmc(d / "a_train_0.bin", ok, magic=12345)
        return d, vocab, "has magic number 12345, not an llm.c token shard"
    if kind == "version":
        write_llmc(d / "a_train_0.bin", ok, version=3)
        return d, vocab, "has version 3 for magic 20240520"
    if kind == "truncated":
        write_llmc(d / "a_train_0.bin", ok, count=150)
        return d, vocab, "is truncated or damaged: its header promises 150 tokens"
    if kind == "header":
        (d / "a_train_0.bin").write_bytes(b"\x00" * 100)
        return d, vocab, "is truncated: 100 bytes, shorter than llm.c's 1024-byte header"
    if kind == "odd":
        (d / "train.bin").write_bytes(b"\x01\x00\x02")
        return d, vocab, "has 3 bytes; a nanoGPT .bin file holds uint16 tokens"
    if kind == "vocab":
        write_llmc(d / "a_train_0.bin", np.full(100, 70))
        return d, vocab, "holds token id 70, outside the vocabulary of 64 tokens"
    if kind == "no_tokenizer":
        write_llmc(d / "a_train_0.bin", ok)
        return d, [], "holds llmc files, which carry no tokenizer: set data.tokenizer"
    if kind == "empty":
        return d, vocab, "holds no shards"
    if kind == "manifest_vocab":
        prepare(corpus(tmp_path / "src"), d, "char", progress=False, log=lambda *_: None)
        return d, ["data.shard_vocab_size=5"], "shard_vocab_size=5 is invalid: it must be at least"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["magic", "version", "truncated", "header", "odd", "vocab",
                                  "no_tokenizer", "empty", "manifest_vocab"])
def test_every_malformed_shard_folder_is_one_clear_error_line(tmp_path, capsys, kind):
    folder, pairs, message = malformed(tmp_path, kind)
    assert lm_train(tmp_path / "run", folder, *pairs) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_a_manifest_max_id_beyond_the_vocabulary_is_caught_before_training(tmp_path):
    out = tmp_path / "out"
    prepare(corpus(tmp_path / "src"), out, "char", progress=False, log=lambda *_: None)
    shards = ShardSet.open(out)
    top = max(s.max_id for s in shards.train)
    with pytest.raises(ValueError, match=f"holds token id {top}, outside the vocabulary of {top} tokens"):
        shards.check_vocab(top)


# --- training from shards -----------------------------------------------------------------------------

def metric_rows(run: Path) -> list[dict]:
    """metrics.jsonl without the timings."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def test_training_from_prepared_shards_writes_a_complete_run(tmp_path, capsys):
    out = tmp_path / "shards"
    prepare(corpus(tmp_path / "src"), out, "char", shard_tokens=2000, progress=False, log=lambda *_: None)
    assert lm_train(tmp_path / "run", out, "data.sampling=sequential", "train.steps=4") == 0
    run = tmp_path / "run"
    assert (run / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["shards"] == str(out) and config["tokens"]["eos_id"] == 2
    assert "val_loss" in metric_rows(run)[-1]
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "3"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--data", "val"]) == 2
    assert "trained on token shards" in capsys.readouterr().err


def test_resume_from_shards_continues_the_identical_stream(tmp_path, monkeypatch):
    import functools

    import handformer.training.loop as loop

    out = tmp_path / "shards"
    prepare(corpus(tmp_path / "src"), out, "char", shard_tokens=1500, progress=False, log=lambda *_: None)
    pairs = ("train.steps=10", "train.eval_every=3", "train.checkpoint_every=4", "train.log_every=1",
             "data.batches_per_epoch=3", "model.dropout=0.1")
    assert lm_train(tmp_path / "straight", out, *pairs) == 0

    class Crash(Exception):
        pass

    def crash(step, val_loss):
        if step == 9:
            raise Crash

    with monkeypatch.context() as m:
        m.setattr(loop, "train", functools.partial(loop.train, on_eval=crash))
        with pytest.raises(Crash):
            lm_train(tmp_path / "crashed", out, *pairs)
    assert main(["train", "--resume", str(tmp_path / "crashed")]) == 0
    rows = metric_rows(tmp_path / "straight")
    assert len(rows) == 10 and len({r["epoch"] for r in rows if "epoch" in r}) == 4  # crosses epochs
    assert metric_rows(tmp_path / "crashed") == rows


def test_training_on_llmc_and_nanogpt_files_with_a_stated_vocabulary(tmp_path):
    rng = np.random.default_rng(0)
    llmc = tmp_path / "llmc"
    llmc.mkdir()
    write_llmc(llmc / "t_train_000001.bin", rng.integers(0, 60, 3000))
    write_llmc(llmc / "t_val_000000.bin", rng.integers(0, 60, 400))
    assert ShardSet.open(llmc).format == "llmc"  # trained on in the GPT-2 smoke test below
    tok = Tokenizer.train_char(["abcdefghij" * 5])  # 14 ids: the shards' ids < 60 are outside it
    run = tmp_path / "gpt2like"
    run.mkdir()
    tok.save(run / "tokenizer.json")
    assert lm_train(tmp_path / "r1", llmc, "train.steps=1") == 2  # no tokenizer, no vocabulary
    assert main(["train", "--config", str(ROOT / "configs" / "tiny_lm.toml"), "--out", str(tmp_path / "r1"),
                 "--set", f"data.shards={llmc}", "--tokenizer", str(run), "--set", "train.steps=1"]) == 2
    assert main(["train", "--config", str(ROOT / "configs" / "tiny_lm.toml"), "--out", str(tmp_path / "r1"),
                 "--set", f"data.shards={llmc}", "--tokenizer", str(run), "--set", "data.shard_vocab_size=64",
                 "--set", "train.steps=1", "--set", "train.progress=false"]) == 0
    assert (tmp_path / "r1" / "tokenizer.json").read_bytes() == (run / "tokenizer.json").read_bytes()
    nano = tmp_path / "nano"
    nano.mkdir()
    rng.integers(0, 60, 3000).astype(np.uint16).tofile(nano / "train.bin")
    rng.integers(0, 60, 400).astype(np.uint16).tofile(nano / "val.bin")
    assert lm_train(tmp_path / "r2", nano, "data.shard_vocab_size=60", "data.sampling=sequential") == 0
    config = json.loads((tmp_path / "r2" / "config.json").read_text())
    assert config["model"]["vocab_size"] == 60 and not (tmp_path / "r2" / "tokenizer.json").exists()


# --- the GPT-2 (124M) config ----------------------------------------------------------------------

def test_the_gpt2_124m_config_is_llmcs_recipe():
    job = LMJob.from_dict({k: v for k, v in load_job_file(ROOT / "configs" / "gpt2_124m.toml").items()
                           if k != "task"})
    cfg = job.model_config(job.data.shard_vocab_size)
    with torch.device("meta"):
        model = CausalLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == 124_475_904  # llm.c's count (padded vocab)
    assert cfg == CausalLMConfig.from_dict({**CausalLMConfig.gpt2_style().to_dict(), "vocab_size": 50304,
                                            "max_positions": 1024, "dropout": 0.0}, "model")
    t = job.train
    assert (t.lr, t.warmup, t.min_lr, t.weight_decay, t.beta1, t.beta2, t.clip_grad) == (
        6e-4, 700, 0.0, 0.1, 0.9, 0.95, 1.0)
    assert 8 * job.data.batch_size * job.data.block_size * t.accumulation == 524_288
    assert t.steps == 18865 and t.bf16 and job.data.sampling == "sequential"


def test_the_gpt2_124m_config_smoke_runs_on_cpu(tmp_path):
    """The real config, shrunk (2 layers, 64 wide, 32-token windows), on llm.c-format shards."""
    rng = np.random.default_rng(0)
    data = tmp_path / "fineweb10B"
    data.mkdir()
    write_llmc(data / "fineweb_train_000001.bin", rng.integers(0, 50257, 5000))
    write_llmc(data / "fineweb_val_000000.bin", rng.integers(0, 50257, 1000))
    job = apply_overrides(load_job_file(ROOT / "configs" / "gpt2_124m.toml"), {
        "data.shards": str(data), "data.tokenizer": "char", "data.shard_vocab_size": 50304,
        "data.block_size": 32, "data.batch_size": 2, "data.eval_batches": 2, "model.d_model": 64,
        "model.n_heads": 2, "model.d_ff": 128, "model.n_layers": 2, "train.steps": 3, "train.warmup": 1,
        "train.eval_every": 3, "train.bf16": False, "train.compile": False, "train.progress": False})
    from handformer.tasks.lm.train import run_train_lm

    _, result = run_train_lm(LMJob.from_dict({k: v for k, v in job.items() if k != "task"}),
                             tmp_path / "run", log=lambda *_: None)
    assert result.step == 3 and result.last_val_loss is not None


# --- torchrun: two ranks on shards, resumed in one process -------------------------------------------

def _shard_data(folder: str) -> tuple[ShardWindows, object]:
    shards = ShardSet.open(folder)
    return (ShardWindows(shards.train, 8, 4, 23, "random", batches_per_epoch=100, seed=0),
            shard_validation_batches(shards.val, 8, 4, 23))


def _shard_worker(rank: int, port: int, folder: str, run_dir: str) -> None:
    from test_distributed import _cfg, _join, _model

    from handformer.tasks.lm.train import lm_loss
    from handformer.training.loop import train as train_loop

    _join(rank, port)
    windows, val = _shard_data(folder)
    train_loop(_model(), _cfg(steps=3, schedule="constant"), windows, val, lm_loss, run_dir)
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # spawns 2 processes; the fast versions: the rank and resume tests above
def test_two_ranks_on_shards_resume_in_one_process_with_the_same_global_batch(tmp_path):
    """Steps 1-3 under DDP on 2 gloo ranks (each its own windows), steps 4-6 resumed in one
    process with accumulation 2: the curve of one uninterrupted single-process run."""
    from test_distributed import _cfg, _curve, _model, _spawn

    from handformer.tasks.lm.train import lm_loss
    from handformer.training.loop import train as train_loop

    rng = np.random.default_rng(0)
    folder = tmp_path / "shards"
    folder.mkdir()
    for k in range(3):
        write_llmc(folder / f"s_train_{k:06d}.bin", rng.integers(0, 23, 600))
    write_llmc(folder / "s_val_000000.bin", rng.integers(0, 23, 200))
    windows, val = _shard_data(str(folder))
    reference = tmp_path / "reference"
    train_loop(_model(), _cfg(schedule="constant", accumulation=2), windows, val, lm_loss, reference)
    resumed = tmp_path / "resumed"
    _spawn(_shard_worker, str(folder), str(resumed))
    train_loop(_model(), _cfg(schedule="constant", accumulation=2), windows, val, lm_loss, resumed,
               resume=True)
    for (e_train, e_val), (g_train, g_val) in zip(_curve(reference), _curve(resumed), strict=True):
        assert g_train == pytest.approx(e_train, rel=1e-5)
        assert g_val == pytest.approx(e_val, rel=1e-5) if e_val is not None else g_val is None
