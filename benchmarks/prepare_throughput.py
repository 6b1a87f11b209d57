"""`handformer prepare` at scale: throughput (MB/s of text, tokens/s) and peak memory for a corpus
of 100 MB and one of about 1 GB, built under /tmp from the data at hand (tiny Shakespeare, the
pydoc corpus, Multi30k's English and German training sides; one document per paragraph or
sentence), repeated. Each size runs `python -m handformer prepare` in a fresh process and reads
its peak RSS (the child's own resource.getrusage); the corpus files are hard links to one 100 MB file,
so the 1 GB corpus costs 100 MB of disk (its pages are read ten times, from the page cache).

    python benchmarks/prepare_throughput.py --tokenizer bpe:8000
    python benchmarks/prepare_throughput.py --tokenizer char
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_corpus(work: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from handformer.data.lookup import locate
    from handformer.data.text import pydoc_corpus

    small, large = work / "c100", work / "c1000"
    if (large / "part09.txt").exists():
        return small, large
    parts = [locate("tinyshakespeare", "input.txt").read_text(), pydoc_corpus()]
    for side in ("en", "de"):  # one sentence a line: a document each
        parts.append(gzip.open(locate("multi30k", f"train.{side}.gz"), "rt").read().replace("\n", "\n\n"))
    block = "\n\n".join(parts) + "\n\n"
    small.mkdir(parents=True, exist_ok=True)
    large.mkdir(parents=True, exist_ok=True)
    (small / "part00.txt").write_text(block * (int(100e6 / len(block.encode())) + 1))
    for i in range(10):
        if not (large / f"part{i:02d}.txt").exists():
            os.link(small / "part00.txt", large / f"part{i:02d}.txt")
    return small, large


def run(source: Path, out: Path, tokenizer: str, sample_mb: float) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    argv = ["prepare", str(source), str(out), "--tokenizer", tokenizer, "--sample-mb", str(sample_mb),
            "--no-progress"]
    code = ("import resource; from handformer.cli import main; rc = main(%r); "
            "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); raise SystemExit(rc)")
    proc = subprocess.run([sys.executable, "-c", code % argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(proc.stderr)
    peak = int(proc.stdout.split("peak_rss_kb")[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    text = sum(p.stat().st_size for p in source.iterdir())
    tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "val"))
    print(proc.stdout.split("peak_rss_kb")[0].strip())
    shutil.rmtree(out, ignore_errors=True)
    return {"text_mb": text / 1e6, "tokens": tokens, "wall_s": wall, "mb_s": text / 1e6 / wall,
            "tokens_s": tokens / wall, "peak_rss_mb": peak / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default="bpe:8000")
    parser.add_argument("--sample-mb", type=float, default=64.0)
    parser.add_argument("--work", default="/tmp/handformer_prepare_bench")
    parser.add_argument("--sizes", default="100,1000", help="corpora to run, in MB: 100 and/or 1000")
    args = parser.parse_args()
    small, large = build_corpus(Path(args.work))
    rows = []
    for source in [{"100": small, "1000": large}[size] for size in args.sizes.split(",")]:
        row = run(source, Path(args.work) / "out", args.tokenizer, args.sample_mb)
        rows.append(row)
        print(f"{row['text_mb']:,.0f} MB of text: {row['wall_s']:.1f} s wall, {row['mb_s']:.2f} MB/s, "
              f"{row['tokens_s']:,.0f} tokens/s, {row['tokens']:,} tokens, peak RSS "
              f"{row['peak_rss_mb']:,.0f} MB", flush=True)


if __name__ == "__main__":
    main()
