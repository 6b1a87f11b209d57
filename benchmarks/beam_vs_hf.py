"""Benchmark: beam-5 translation, handformer's `beam_search` vs Hugging Face `generate(num_beams=5)`.

The run is exported with `handformer export-hf` (MarianMTModel, same weights) and both models get
the same source token ids, in the same batches (sorted by length, padded on the right). Prints
sentences/s of each (median of --rounds interleaved rounds), their ratio (target:
>= 1.5x), and how many outputs agree token for token. Where they differ, the two searches differ
by design: handformer scores a hypothesis as sum log p / length^lp and stops a sentence when no
live beam can still beat its best finished one; HF's default (`early_stopping=False`) stops with
a heuristic on the current best score.

    python benchmarks/beam_vs_hf.py RUN                     # a post-norm translation run (dates task)
    python benchmarks/beam_vs_hf.py RUN --source FILE --limit 200   # sentences from a file
    python benchmarks/beam_vs_hf.py RUN --baseline DIR --rounds 5   # and another checkout's search

With --baseline DIR (`git worktree add DIR <commit>`), DIR's own `Translator.load` and `beam_search`
run in a worker process that imports only from DIR (benchmarks/baseline.py), on the same batches in
the same interleaved rounds (every other round in reverse order); a table gives the two medians,
their ratio and whether every hypothesis is the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import BaselineWorker, Reply, comparison_table  # noqa: E402

from handformer.generation.decoding import beam_search  # noqa: E402
from handformer.tasks.translation.exports import export_marian  # noqa: E402
from handformer.tasks.translation.job import load_pairs  # noqa: E402
from handformer.tasks.translation.translator import Translator  # noqa: E402


def batches(src_ids: list[list[int]], pad_id: int, size: int) -> list[torch.Tensor]:
    """Sources sorted by length, in (B, S) right-padded batches, as the translator batches them."""
    ordered = sorted(src_ids, key=len)
    out = []
    for start in range(0, len(ordered), size):
        chunk = ordered[start: start + size]
        S = max(map(len, chunk))
        out.append(torch.tensor([ids + [pad_id] * (S - len(ids)) for ids in chunk]))  # (B, S)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a post-norm translation run")
    parser.add_argument("--source", type=Path, help="source sentences, one a line (default: the "
                        "run's held-out dates)")
    parser.add_argument("--limit", type=int, default=200, help="sentences to translate")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--baseline", type=Path, help="another handformer checkout to time beside this one")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    translator = Translator.load(args.run_dir)
    if args.source is not None:
        texts = [line.strip() for line in args.source.read_text().splitlines() if line.strip()]
    else:
        texts = [src for src, _ in load_pairs(translator.job.data)[2].pairs]
    texts = texts[: args.limit]
    limits, pad = translator.limits(), translator.model.cfg.pad_id
    lp = translator.job.decode.length_penalty
    with tempfile.TemporaryDirectory() as tmp:
        export_marian(args.run_dir, tmp)
        hf = transformers.MarianMTModel.from_pretrained(tmp).eval()
    src_batches = batches(translator.encode_sources(texts), pad, args.batch_size)

    def ours() -> list[list[int]]:
        return [h for src in src_batches for h in beam_search(translator.model, src, limits, args.beam, lp)]

    def theirs() -> list[list[int]]:
        out = []
        for src in src_batches:
            steps = int(limits.max_lengths(src, translator.model.cfg.max_positions).max())
            ids = hf.generate(src, attention_mask=(src != pad).long(), num_beams=args.beam,
                              length_penalty=lp, max_new_tokens=steps, do_sample=False)
            out += [[t for t in row[1:] if t != pad] for row in ids.tolist()]  # drop the start token
        return out

    cases: dict[str, Callable[[], object]] = {"handformer": ours, "HF": theirs}
    baseline = BaselineWorker(args.baseline) if args.baseline else None  # after --threads: the same count
    if baseline is not None:
        baseline.translator(args.run_dir, src_batches)
        cases = {"handformer": ours, "handformer [baseline]": lambda: baseline.beam(args.beam, lp),
                 "HF": theirs}
    times: dict[str, list[float]] = {name: [] for name in cases}
    outputs: dict[str, list] = {name: [] for name in cases}
    with torch.no_grad():
        a, b = ours(), theirs()  # warm-up, and the outputs compared
        for r in range(args.rounds):  # every other round in reverse order
            for name, fn in (reversed if r % 2 else list)(cases.items()):
                start = time.perf_counter()
                out = fn()
                seconds = time.perf_counter() - start
                if isinstance(out, Reply):  # the baseline's seconds, measured around its search alone
                    seconds, out = out
                times[name].append(seconds)
                outputs[name].append(out)
    eos = translator.tgt_tok.eos_id
    same = sum(x[: x.index(eos) + 1 if eos in x else len(x)] == y[: y.index(eos) + 1 if eos in y else len(y)]
               for x, y in zip(a, b))
    ours_s, hf_s = (len(texts) / statistics.median(times[k]) for k in ("handformer", "HF"))
    print(f"{len(texts)} sentences, beam {args.beam}, batches of {args.batch_size}, length penalty {lp}, "
          f"{torch.get_num_threads()} threads, medians of {args.rounds} interleaved rounds")
    print(f"handformer {ours_s:.1f} sentences/s, HF generate {hf_s:.1f}: {ours_s / hf_s:.2f}x "
          f"(target >= 1.5x); identical outputs: {same}/{len(texts)}")
    if baseline is not None:
        twin = "handformer [baseline]"
        same_as_baseline = all(x == y for x, y in zip(outputs["handformer"], outputs[twin], strict=True))
        row = ("beam search, every batch", times["handformer"], times[twin], same_as_baseline)
        print(comparison_table("beam search", [row], baseline.label))
        baseline.close()


if __name__ == "__main__":
    main()
