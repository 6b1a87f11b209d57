"""Benchmark: handformer's GGUF exports in llama.cpp (llama-cpp-python 0.3.36), side by side with
handformer on the same weights: agreement, logit differences and decoding speed.

For each model (stories260K imported from llama2.c, and a character model trained here on tiny
Shakespeare with configs/shakespeare_char_modern.toml) and each export type (f32, f16, q8_0):
- greedy agreement: how many of N_NEW greedy tokens from the same prompt ids llama.cpp generates
  before it first differs from `handformer generate` (the float32 run);
- max |delta logit| over the prompt's positions against handformer's float32 logits, in
  llama.cpp (float32 KV cache) and in transformers' GGUF loader;
- decoding speed, one thread, rounds interleaved, medians: handformer `generate` (KV cache,
  greedy, stop tokens off) and llama.cpp's `generate` loop for the same N_NEW tokens; the ratio
  llama.cpp / handformer in tokens per second; the bandwidth bound and MBU of each
  (handformer/inference/roofline.py, the fp32 weights' bytes, one thread; both models sit in the
  cache, so the bound means little).

    python benchmarks/gguf_llamacpp.py                     # trains the Shakespeare model first
    python benchmarks/gguf_llamacpp.py --run runs/shakespeare_char_modern --rounds 5

Needs llama-cpp-python (CMAKE_ARGS="-DGGML_BLAS=OFF -DLLAVA_BUILD=OFF" pip install
llama-cpp-python==0.3.36, a source build) and the tinyshakespeare and stories260K datasets (docs/data.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.cli import main as handformer  # noqa: E402
from handformer.convert.gguf_export import TYPES  # noqa: E402
from handformer.data.lookup import locate  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.roofline import bound, read_bandwidth  # noqa: E402
from handformer.tasks.lm.exports import export_gguf  # noqa: E402
from handformer.tasks.lm.run import LMRun, load_lm  # noqa: E402

N_NEW = 200
F32 = 0  # GGML_TYPE_F32: llama.cpp's KV cache in float32


def llama(path: Path, n_ctx: int):
    import llama_cpp

    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=1, verbose=False, type_k=F32, type_v=F32,
                           logits_all=True)


def llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if len(out) == n:
            break
    return out


def agreement(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def transformers_delta(folder: Path, name: str, ids: list[int], expected: torch.Tensor) -> float | None:
    import transformers

    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name,
                                                               dtype=torch.float32).eval()
    except Exception as err:  # an architecture or setting its GGUF loader does not read
        print(f"  transformers cannot load {name}: {type(err).__name__}", file=sys.stderr)
        return None
    with torch.no_grad():
        return (hf(torch.tensor([ids])).logits[0] - expected).abs().max().item()


def measure(label: str, run_dir: Path, prompt_ids: list[int], rounds: int, folder: Path) -> list[tuple]:
    run: LMRun = load_lm(run_dir)
    n_ctx = run.model.cfg.max_positions
    n = min(N_NEW, n_ctx - len(prompt_ids))
    with torch.no_grad():
        expected = run.model(torch.tensor([prompt_ids])).logits[0]
    reference = generate(run.model, [prompt_ids], n, temperature=0)[0]
    limit = bound(read_bandwidth(1), run.model, len(prompt_ids) + n / 2)  # tokens/s
    rows = []
    for type_name in TYPES:
        path = folder / f"{label}.{type_name}.gguf"
        export_gguf(run_dir, path, type_name, overwrite=True)
        llm = llama(path, n_ctx)
        llm.reset()
        llm.eval(prompt_ids)
        cpp_delta = float(np.abs(np.array(llm.scores[:len(prompt_ids)]) - expected.numpy()).max())
        tokens = llama_greedy(llm, prompt_ids, n)
        ours, theirs = [], []
        for _ in range(rounds):  # interleaved: the machine is shared
            start = time.perf_counter()
            generate(run.model, [prompt_ids], n, temperature=0, threads=1)
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            llama_greedy(llm, prompt_ids, n)
            theirs.append(time.perf_counter() - start)
        llm.close()
        hf_delta = transformers_delta(folder, path.name, prompt_ids, expected)
        rows.append((label, type_name, path.stat().st_size / 1e6, agreement(tokens, reference), n, cpp_delta,
                     hf_delta, n / statistics.median(ours), n / statistics.median(theirs), limit))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, help="a trained Shakespeare run (default: train one first)")
    parser.add_argument("--steps", type=int, default=1000, help="training steps when --run is not given")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        stories = folder / "stories260K"
        handformer(["import-llama2c", str(folder("stories260K") / "stories260K.bin"),
                    str(folder("stories260K") / "tok512.bin"), str(stories)])
        shakespeare = args.run
        if shakespeare is None:
            shakespeare = folder / "shakespeare"
            handformer(["train", "--config", str(ROOT / "configs" / "shakespeare_char_modern.toml"), "--out",
                        str(shakespeare), "--set", f"data.path={locate('tinyshakespeare', 'input.txt')}",
                        "--set", f"train.steps={args.steps}", "--set", "train.progress=false"])
        text = load_lm(shakespeare).tokenizer.encode("ROMEO:\n")
        rows = (measure("stories260K", stories, [1] + load_lm(stories).tokenizer.encode("Once upon a time"),
                        args.rounds, folder)
                + measure("shakespeare", shakespeare, text, args.rounds, folder))
    print(f"\n{'model':<12} {'type':<5} {'MB':>6} {'greedy agree':>13} {'max|dlogit| llama.cpp':>22} "
          f"{'transformers':>13} {'handformer tok/s':>17} {'llama.cpp tok/s':>16} {'ratio':>6} {'bound':>7} "
          f"{'MBU':>5} {'MBU cpp':>7}")
    for label, type_name, mb, agree, n, cpp, hf, ours, theirs, limit in rows:
        hf_text = f"{hf:.2e}" if hf is not None else "n/a"
        print(f"{label:<12} {type_name:<5} {mb:>6.2f} {f'{agree}/{n}':>13} {cpp:>22.2e} {hf_text:>13} "
              f"{ours:>17.0f} {theirs:>16.0f} {theirs / ours:>6.2f} {limit:>7.0f} {ours / limit:>5.2f} "
              f"{theirs / limit:>7.2f}")


if __name__ == "__main__":
    main()
