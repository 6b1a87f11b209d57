"""Benchmark: validation loss of trained language-model runs before and after quantization.

For each run directory given, writes quantized copies with `handformer quantize` (into a temporary
folder) and scores the run's own validation split (`handformer eval RUN --data val`) with:

- fp32:                  the run as trained;
- int8:                  every linear layer, output head included, default kernel ("auto": "vnni"
                         for every row where the CPU has AVX-512 VNNI, else int8pack-bf16 for many rows);
- int8-exact:            the same int8 weights through the "dequant" kernel (fp32 activations), to
                         separate the weight rounding from the kernel's bf16 activations;
- int8-vnni:             the same int8 weights through the "vnni" kernel for every row (the
                         activations rounded to int8 in blocks of 32, as decoding's one-row
                         steps run them where the CPU has AVX-512 VNNI);
- int8-head-fp32:        --keep-head-fp32;
- int4:                  4-bit weights in groups of 32 inputs (int8 where 32 does not divide a width);
- bf16:                  every weight in bfloat16.

and prints each loss and its rise relative to fp32 (target for int8: <= 1%).

    python benchmarks/int8_quality.py runs/shakespeare_char runs/lm_default
    python benchmarks/int8_quality.py RUN --variants fp32 int8 --limit 300   # the first 300 windows
    python benchmarks/int8_quality.py runs/stories260K --data FILE   # a run with no validation split

--data scores a text file (or folder) instead of each run's own validation split: what an imported
run (import-hf, import-llama2c) needs, since it has none.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.inference.quant import set_kernel  # noqa: E402
from handformer.tasks.lm.quantize import quantize_run  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402
from handformer.tasks.lm.scoring import eval_text, score_text  # noqa: E402

VARIANTS = ("fp32", "int8", "int8-exact", "int8-head-fp32", "int4", "bf16", "int8-vnni")
KERNEL = {"int8-exact": "dequant", "int8-vnni": "vnni"}  # the variants that set Int8Linear's kernel


def val_loss(run_dir: Path, limit: int, data: str, kernel: str | None = None) -> float:
    run = load_lm(run_dir)
    if kernel is not None:
        set_kernel(run.model, kernel)
    return score_text(run, eval_text(run, data), limit=limit).loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="trained language-model run directories")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--limit", type=int, default=0, help="score only the first N windows (0 = all)")
    parser.add_argument("--data", default="val", help="a text file or folder to score instead of each run's "
                        "validation split (default: val)")
    args = parser.parse_args()
    print(f"{'run':28} {'variant':22} {'val loss':>9} {'rise':>8}")
    for run_dir in args.runs:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            base = val_loss(run_dir, args.limit, args.data)
            for variant in args.variants:
                if variant == "fp32":
                    loss = base
                elif variant in ("bf16", "int4"):
                    quantize_run(run_dir, tmp / variant, variant)
                    loss = val_loss(tmp / variant, args.limit, args.data)
                else:
                    quantize_run(run_dir, tmp / variant, "int8", head=variant != "int8-head-fp32")
                    loss = val_loss(tmp / variant, args.limit, args.data, KERNEL.get(variant))
                print(f"{run_dir.name:28} {variant:22} {loss:>9.4f} {100 * (loss / base - 1):>+7.2f}%",
                      flush=True)


if __name__ == "__main__":
    main()
