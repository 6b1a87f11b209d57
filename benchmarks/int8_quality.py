"""Benchmark: validation loss of trained language-model runs before and after quantization.

For each run directory given, writes quantized copies with `handformer quantize` (into a temporary
folder) and scores the run's own validation split (`handformer eval RUN --data val`) with:

- fp32:                  the run as trained;
- int8:                  every linear layer, output head included, default kernel (int8pack-bf16);
- int8, exact kernel:    the same int8 weights through the "dequant" kernel (fp32 activations), to
                         separate the weight rounding from the kernel's bf16 activations;
- int8, head fp32:       --keep-head-fp32;
- bf16:                  every weight in bfloat16.

and prints each loss and its rise relative to fp32 (target for int8: <= 1%).

    python benchmarks/int8_quality.py runs/shakespeare_char runs/lm_default
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.nn.quant import set_kernel  # noqa: E402
from handformer.tasks.lm.quantize import quantize_run  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402
from handformer.tasks.lm.scoring import eval_text, score_text  # noqa: E402


def val_loss(run_dir: Path, kernel: str | None = None) -> float:
    run = load_lm(run_dir)
    if kernel is not None:
        set_kernel(run.model, kernel)
    return score_text(run, eval_text(run, "val")).loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="trained language-model run directories")
    args = parser.parse_args()
    print(f"{'run':28} {'variant':22} {'val loss':>9} {'rise':>8}")
    for run_dir in args.runs:
        with tempfile.TemporaryDirectory() as tmp:
            quantize_run(run_dir, Path(tmp) / "int8", "int8")
            quantize_run(run_dir, Path(tmp) / "int8_head_fp32", "int8", head=False)
            quantize_run(run_dir, Path(tmp) / "bf16", "bf16")
            base = val_loss(run_dir)
            rows = [("fp32", base), ("int8", val_loss(Path(tmp) / "int8")),
                    ("int8, exact kernel", val_loss(Path(tmp) / "int8", "dequant")),
                    ("int8, head fp32", val_loss(Path(tmp) / "int8_head_fp32")),
                    ("bf16", val_loss(Path(tmp) / "bf16"))]
        for name, loss in rows:
            print(f"{run_dir.name:28} {name:22} {loss:>9.4f} {100 * (loss / base - 1):>+7.2f}%", flush=True)


if __name__ == "__main__":
    main()
