"""Benchmark: the training step of a translation config, and what each speed setting buys.

Builds the job's tokenizer, batches and model exactly as `handformer train` does, then times
`--steps` training steps (forward, backward, clipping, AdamW) on the first batches of epoch 0 after
two warm-up steps, and prints seconds per step, the implied seconds per epoch and the last loss.
Run it once per setting, on an otherwise idle machine:

    python benchmarks/translation_step.py          # configs/multi30k_de_en.toml as it is
    # d_ff 1024 and 4,096-token batches, without and with the two speed-ups:
    python benchmarks/translation_step.py --full-logits --no-keep-cpu-memory \
        --set model.d_ff=1024 --set data.max_tokens=4096
    python benchmarks/translation_step.py --set model.d_ff=1024 --set data.max_tokens=4096

--full-logits computes the generator and the loss over every target position, padding included
(the loss value is the same); --no-keep-cpu-memory leaves glibc malloc at its defaults.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.cli.common import parse_overrides  # noqa: E402
from handformer.models.seq2seq import Seq2SeqTransformer  # noqa: E402
from handformer.tasks.job_file import apply_overrides, load_job_file  # noqa: E402
from handformer.tasks.translation.job import (  # noqa: E402
    TranslationJob,
    batched_pairs,
    build_tokenizers,
    load_pairs,
    model_config,
)
from handformer.tasks.translation.train import seq2seq_loss  # noqa: E402
from handformer.training.cpu_memory import keep_freed_memory  # noqa: E402
from handformer.training.loop import clip_gradients, make_optimizer  # noqa: E402
from handformer.training.losses import token_cross_entropy  # noqa: E402


def full_logits_loss(model: Seq2SeqTransformer, batch, label_smoothing: float) -> tuple[torch.Tensor, dict]:
    logits = model(batch.src, batch.tgt_in).logits  # (B, T, V), padded rows included
    return token_cross_entropy(logits, batch.tgt_out, model.cfg.pad_id, label_smoothing), {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "multi30k_de_en.toml"))
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--full-logits", action="store_true")
    p.add_argument("--no-keep-cpu-memory", action="store_true")
    args = p.parse_args()
    if not args.no_keep_cpu_memory:
        keep_freed_memory()

    try:
        raw = apply_overrides(load_job_file(args.config), parse_overrides(args.set))
        job = TranslationJob.from_dict({k: v for k, v in raw.items() if k != "task"})
    except (ValueError, FileNotFoundError) as err:  # a --set without =, a bad field or value: one line
        p.error(str(err))
    train_pairs, _, _ = load_pairs(job.data)
    src_tok, tgt_tok = build_tokenizers(job.data, train_pairs.pairs)
    cfg = model_config(job, src_tok, tgt_tok)
    max_len = min(job.data.max_length, cfg.max_positions)
    batches = batched_pairs(job, train_pairs.pairs, src_tok, tgt_tok, max_len, shuffle=True).epoch(0)
    if len(batches) < args.steps + 2:
        raise SystemExit(f"--steps {args.steps} needs {args.steps + 2} batches; epoch 0 has {len(batches)}")

    torch.manual_seed(job.train.seed)
    model = Seq2SeqTransformer(cfg).train()
    optimizer = make_optimizer(model, job.train, torch.device("cpu"))
    loss_fn = full_logits_loss if args.full_logits else seq2seq_loss
    for i, batch in enumerate(batches[: args.steps + 2]):
        if i == 2:
            start = time.perf_counter()
        loss = loss_fn(model, batch, job.train.label_smoothing)[0] / batch.n_tokens
        loss.backward()
        clip_gradients(model, job.train.clip_grad, torch.device("cpu"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    per_step = (time.perf_counter() - start) / args.steps
    print(f"{Path(args.config).name} {' '.join(args.set)} full_logits={args.full_logits} "
          f"keep_cpu_memory={not args.no_keep_cpu_memory}: d_ff {cfg.d_ff}, max_tokens "
          f"{job.data.max_tokens}: {per_step:.3f} s/step, {len(batches)} batches/epoch "
          f"(~{per_step * len(batches):.0f} s/epoch), loss after {args.steps + 2} steps {loss.item():.4f}")


if __name__ == "__main__":
    main()
