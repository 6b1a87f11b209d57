"""Benchmark: llama.cpp beside handformer on the same GGUF files at GPT-2-124M shape, batch 1,
at one and two threads: tokens/s, the memory-bandwidth bound and MBU of each.

A GPT-2-124M-shaped run (random weights, seed 0; a character tokenizer, the vocabulary padded to
50,257) is exported by `handformer export-gguf` as f32, q8_0 and q4_0. Each file runs in
llama.cpp (llama-cpp-python, its KV cache in float32 as handformer's) and in handformer as a user
would run it:

- f32: `import-gguf` of the f32 file, prepared for decoding (fused, packed for oneDNN);
- q8_0: `import-gguf` of the q8_0 file (decoded to float32), then `quantize --int8` (per output
  channel, the head included): handformer's int8 path on the file's weights;
- q4_0: `import-gguf --int4` of the q4_0 file: the file's 4-bit values and scales kept (Int4Linear).

Both sides take the same prompt ids (64), decode --new-tokens greedily with stop tokens off, at the
same thread count. tokens/s = new tokens / wall time of the call that prefills the prompt and
decodes (handformer's `generate`, llama.cpp's `generate` loop after `reset`), the median of
--rounds rounds after a warm-up call, every case of a thread count interleaved in each round (every
other round in reverse order: the machine is shared). The bound is handformer/inference/roofline.py's:
read bandwidth (best of 5 sums over 1 GiB at that thread count, the best over the rounds) / bytes per
token, with each side's own bytes: handformer's model as stored in memory, llama.cpp's tensors as
stored in the file (the position table one row), plus the float32 KV cache at its mean length.
MBU = tokens/s / bound.
"agree" is how many greedy tokens the two give before they first differ (random weights give
near-flat logits, so quantized files part early).

    python benchmarks/llamacpp_decode.py                       # 1 and 2 threads, 128 tokens, 5 rounds
    python benchmarks/llamacpp_decode.py --threads 1 --new-tokens 64 --rounds 3

Needs llama-cpp-python (0.3.36: pip install llama-cpp-python==0.3.36, a source build; outside the
default install). On a CPU with AMX its extra buffer types (the AMX repacking of Q8_0 / Q4_0, and the
repacked Q4_0 of AVX-512) are off by default (--extra-buffers): there 0.3.36 segfaults in the first
decode of a q8_0 file.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from decode_limit import SHAPES  # noqa: E402

from handformer.convert.gguf_file import read_gguf  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.fused_step import fused_reason  # noqa: E402
from handformer.inference.roofline import bytes_per_token, read_bandwidth  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.exports import export_gguf  # noqa: E402
from handformer.tasks.lm.imports import import_gguf  # noqa: E402
from handformer.tasks.lm.quantize import quantize_run  # noqa: E402
from handformer.tasks.lm.run import load_lm, save_lm_run  # noqa: E402

FILE_TYPES = ("f32", "q8_0", "q4_0")
HOW = {"f32": "fp32, prepared", "q8_0": "int8 (quantize --int8)", "q4_0": "int4 (import-gguf --int4)"}
TEXT = "Once upon a time, in a small town by the sea, there lived an old fisherman and his cat. "
F32 = 0  # GGML_TYPE_F32: llama.cpp's KV cache in float32, as handformer's


def make_run(folder: Path) -> Path:
    """A GPT-2-124M-shaped run of random weights (seed 0) with a character tokenizer."""
    torch.manual_seed(0)
    run_dir = folder / "run"
    save_lm_run(run_dir, CausalLM(SHAPES["gpt2-124M"]()).eval(), Tokenizer.train_char([TEXT]),
                SpecialTokens(eos_id=None, pad_id=None))
    return run_dir


def handformer_models(run_dir: Path, folder: Path) -> tuple[dict[str, Path], dict[str, CausalLM]]:
    """The GGUF file of each type and the handformer model read back from it (see the docstring)."""
    files, models = {}, {}
    for type_name in FILE_TYPES:
        files[type_name] = folder / f"gpt2-124M.{type_name}.gguf"
        export_gguf(run_dir, files[type_name], type_name)
    import_gguf(files["f32"], folder / "f32")
    import_gguf(files["q8_0"], folder / "q8_0-float")
    quantize_run(folder / "q8_0-float", folder / "q8_0", "int8")
    import_gguf(files["q4_0"], folder / "q4_0", int4=True)
    for type_name in FILE_TYPES:
        models[type_name] = load_lm(folder / type_name, decoding=True).model
    return files, models


def file_bytes_per_token(path: Path, model: CausalLM, kv_length: float) -> float:
    """Bytes a llama.cpp step reads from the file's tensors: each as stored, the position table one
    row (the tied token table is the head: whole), plus the float32 KV cache of `kv_length` positions."""
    total = 0.0
    for name, tensor in read_gguf(path).tensors.items():
        total += tensor.raw.nbytes / tensor.shape[0] if name == "position_embd.weight" else tensor.raw.nbytes
    cfg = model.cfg
    return total + 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * 4 * kv_length


def has_amx() -> bool:
    """Whether the CPU has AMX's int8 tiles (/proc/cpuinfo's amx_int8 flag)."""
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def llama(path: Path, n_ctx: int, threads: int, extra_buffers: bool):
    """A llama.cpp model of the file. extra_buffers False: its tensors stay in plain CPU buffers (no
    AMX or repacked copies): llama-cpp-python 0.3.36's AMX buffers segfault in decode on an AMX Xeon."""
    import llama_cpp
    import llama_cpp.llama as module

    defaults = module.llama_cpp.llama_model_default_params

    def params():  # Llama() reads its model parameters from here and passes no use_extra_bufts
        p = defaults()
        p.use_extra_bufts = extra_buffers
        return p

    module.llama_cpp.llama_model_default_params = params
    try:
        return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               verbose=False, type_k=F32, type_v=F32)
    finally:
        module.llama_cpp.llama_model_default_params = defaults


def llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `ids`, the prompt evaluated again (reset: no prefix kept from before)."""
    llm.reset()
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if len(out) == n:
            break
    return out


def agreement(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(threads: int, files: dict[str, Path], models: dict[str, CausalLM], prompt: list[int], n: int,
            rounds: int, extra_buffers: bool) -> list[tuple]:
    """One row a file type: tokens/s, bound and MBU of each side at `threads`, rounds interleaved."""
    llms = {t: llama(files[t], len(prompt) + n, threads, extra_buffers) for t in FILE_TYPES}
    cases: dict[str, Callable[[], object]] = {}
    for t in FILE_TYPES:
        cases[f"hf {t}"] = lambda t=t: generate(models[t], [prompt], n, temperature=0, threads=threads)[0]
        cases[f"cpp {t}"] = lambda t=t: llama_greedy(llms[t], prompt, n)
    tokens = {name: case() for name, case in cases.items()}  # the warm-up call
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    bandwidth = 0.0
    for r in range(rounds):
        bandwidth = max(bandwidth, read_bandwidth(threads))
        for name, case in (reversed if r % 2 else list)(cases.items()):  # every other round backwards
            seconds[name].append(timed(case))
    for llm in llms.values():
        llm.close()
    kv = len(prompt) + n / 2
    rows = []
    for t in FILE_TYPES:
        ours, theirs = n / statistics.median(seconds[f"hf {t}"]), n / statistics.median(seconds[f"cpp {t}"])
        our_bound = bandwidth / bytes_per_token(models[t], kv)
        their_bound = bandwidth / file_bytes_per_token(files[t], models[t], kv)
        rows.append((threads, t, bandwidth / 1e9, ours, our_bound, theirs, their_bound,
                     agreement(tokens[f"hf {t}"], tokens[f"cpp {t}"])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--extra-buffers", choices=("auto", "on", "off"), default="auto",
                        help="llama.cpp's extra buffer types (AMX, repacked Q4_0); auto: off where the CPU "
                             "has AMX (llama-cpp-python 0.3.36 segfaults in them there)")
    args = parser.parse_args()
    import llama_cpp

    extra_buffers = args.extra_buffers == "on" or (args.extra_buffers == "auto" and not has_amx())

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files, models = handformer_models(make_run(folder), folder)
        sizes = {t: files[t].stat().st_size / 1e6 for t in FILE_TYPES}
        prompt = torch.randint(0, 50257, (64,), generator=torch.Generator().manual_seed(1)).tolist()
        rows = [row for threads in args.threads for row in
                measure(threads, files, models, prompt, args.new_tokens, args.rounds, extra_buffers)]
    print(f"\ntorch {torch.__version__}, llama-cpp-python {llama_cpp.__version__}; GPT-2-124M shape, random "
          f"weights, batch 1, a 64-token prompt, {args.new_tokens} new tokens, greedy; medians of "
          f"{args.rounds} interleaved rounds; {time.perf_counter() - start:.0f} s in all; llama.cpp's extra "
          f"buffer types {'on' if extra_buffers else 'off'}")
    for t in FILE_TYPES:
        reason = fused_reason(models[t])
        print(f"handformer {t}: " + ("the fused C step" if reason is None else f"the eager step ({reason})"))
    print(f"{'threads':>7} {'file':<5} {'MB':>5} {'handformer as':<26} {'GB/s':>5} {'hf tok/s':>8} "
          f"{'bound':>6} {'MBU':>5} {'cpp tok/s':>9} {'bound':>6} {'MBU':>5} {'hf/cpp':>6} {'agree':>7}")
    for threads, t, gbs, ours, our_bound, theirs, their_bound, agree in rows:
        print(f"{threads:>7} {t:<5} {sizes[t]:>5.0f} {HOW[t]:<26} {gbs:>5.1f} {ours:>8.1f} {our_bound:>6.1f} "
              f"{ours / our_bound:>5.2f} {theirs:>9.1f} {their_bound:>6.1f} {theirs / their_bound:>5.2f} "
              f"{ours / theirs:>6.2f} {f'{agree}/{args.new_tokens}':>7}")


if __name__ == "__main__":
    main()
