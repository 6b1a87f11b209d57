"""Peak memory of `handformer import-hf` on a checkpoint of about 1 GB, against transformers
loading the same checkpoint, side by side.

A random Llama-shaped model of ~254 M parameters (float32: ~1.02 GB; hidden 1024, 12 layers,
vocab 32 000) is built by transformers and saved by it in shards of 300 MB. Each side then runs in a
fresh Python process that first imports what it needs, resets its peak resident memory
(/proc/self/clear_refs) and measures the peak growth (VmHWM minus the resident memory before):

- handformer: `import_hf(checkpoint, run)`, writing the run directory (shards memory-mapped, the
  run's model.safetensors written one tensor at a time);
- transformers: `AutoModelForCausalLM.from_pretrained(checkpoint)` (loading the model, the least a
  loader must hold).

The target for handformer is peak growth <= 1.25 x the checkpoint size + 300 MB; the script prints
each growth, its ratio to the checkpoint size, the bound and whether it holds.

    python benchmarks/import_memory.py
    python benchmarks/import_memory.py --layers 24   # ~1.8 GB
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.tasks.lm.import_memory import checkpoint_bytes, peak_growth, within_bound  # noqa: E402

TRANSFORMERS_LOAD = ("from transformers import AutoModelForCausalLM\n"
                     "AutoModelForCausalLM.from_pretrained({hf_dir!r})")


def save_checkpoint(path: Path, layers: int) -> None:
    """A random Llama of `layers` layers saved by transformers (sharded) with a byte tokenizer."""
    import torch
    import transformers

    from handformer.data.tokenizer import Tokenizer

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, num_attention_heads=16,
                                      num_key_value_heads=8, intermediate_size=4096, num_hidden_layers=layers,
                                      max_position_embeddings=2048, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True, max_shard_size="300MB")
    Tokenizer.train_char(["a checkpoint of a few hundred megabytes"]).save(path / "tokenizer.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12, help="decoder layers (12: ~1.02 GB in float32)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, run_dir = Path(tmp) / "hf", Path(tmp) / "run"
        save_checkpoint(hf_dir, args.layers)
        size = checkpoint_bytes(hf_dir)
        ours = peak_growth(hf_dir, run_dir)
        theirs = peak_growth(hf_dir, run_dir, code=TRANSFORMERS_LOAD)
        shards = len(list(hf_dir.glob("*.safetensors")))
        print(f"checkpoint: {size / 2**20:,.0f} MiB in {shards} shards ({args.layers} layers)")
        for name, growth in (("handformer import-hf", ours), ("transformers from_pretrained", theirs)):
            print(f"{name:30s} peak growth {growth / 2**20:7,.0f} MiB = {growth / size:.2f} x the checkpoint")
        bound = 1.25 * size + 300 * 2**20
        print(f"handformer / transformers: {ours / theirs:.2f}; bound 1.25 x size + 300 MiB = "
              f"{bound / 2**20:,.0f} MiB: {'holds' if within_bound(ours, size) else 'EXCEEDED'}")
        subprocess.run(["du", "-sh", str(run_dir)], check=False)


if __name__ == "__main__":
    main()
