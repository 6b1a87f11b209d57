"""Supervised fine-tuning on conversations (`task = "sft"`): next-token cross-entropy on the
assistant's tokens only (rendering.py marks them), conversations packed into windows or padded
(packing.py), through the shared training loop.

    handformer train --config sft.toml          (task = "sft", [train] init_from = "RUN_DIR")
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from torch import nn

from handformer.models.causal_lm import CausalLM
from handformer.nn.masks import packed_mask
from handformer.tasks.post.job import PostJob
from handformer.tasks.post.packing import IGNORE, SFTBatch, SFTBatches, examples_from
from handformer.tasks.post.records import read_conversations
from handformer.tasks.post.setup import builder, core, prepare_run, split_lines, weights_file
from handformer.training import distributed
from handformer.training.loop import TrainResult, train_new_model
from handformer.training.losses import token_cross_entropy


def sft_logits(model: nn.Module, batch: SFTBatch) -> torch.Tensor:
    """(B, T, V) logits of a packed batch (document mask, positions restarting) or a padded one."""
    if batch.document_ids is None:
        mask = batch.attention_mask
    else:
        mask = packed_mask(batch.document_ids, core(model).cfg.sliding_window)  # (B, 1, T, T)
    return model(batch.x, mask, position_ids=batch.position_ids).logits


def sft_loss(model: nn.Module, batch: SFTBatch, label_smoothing: float = 0.0,
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loop's objective: summed cross-entropy over the learned targets (label smoothing in
    training mode only)."""
    logits = sft_logits(model, batch)
    smoothing = label_smoothing if model.training else 0.0
    return token_cross_entropy(logits, batch.y, IGNORE, smoothing), {}


def per_token_loss(model: nn.Module, batch: SFTBatch) -> torch.Tensor:
    """The cross-entropy of every learned target, in order, row by row (N,): what the proofs
    against TRL and against unpacked training compare."""
    logits = sft_logits(model, batch)  # (B, T, V)
    keep = batch.y != IGNORE  # (B, T)
    return torch.nn.functional.cross_entropy(logits[keep].float(), batch.y[keep], reduction="none")


def sft_batches(job: PostJob, run_dir: Path, resume: bool, log=print) -> tuple[SFTBatches, list | None]:
    """The training batches and the fixed validation batches of an SFT job."""
    post = prepare_run(job, run_dir, resume, log)
    train_conv, val_conv = split_lines(job, lambda path: read_conversations(path, job.data.format))
    block = job.block_size

    def encode(conversations, name):
        examples, counts = examples_from([post.renderer.conversation(c) for c in conversations], block,
                                         job.data.overlong)
        log(f"{name}: {counts.report(block)}")
        return examples

    train_examples = encode(train_conv, "training")
    for warning in post.renderer.warnings:
        log(f"warning: {warning}")
    train = SFTBatches(train_examples, job.data.batch_size, block, post.pad_id, job.data.packing,
                       seed=job.train.seed)
    if not val_conv:
        return train, None
    val = SFTBatches(encode(val_conv, "validation"), job.data.batch_size, block, post.pad_id,
                     job.data.packing, shuffle=False).epoch(0)
    return train, val[:job.data.eval_batches] if job.data.eval_batches else val


def run_sft(job: PostJob, run_dir: str | os.PathLike, resume: bool = False, log=print,
            ) -> tuple[CausalLM, TrainResult]:
    """Train (or resume) an SFT run in `run_dir` from the run in [train] init_from."""
    run_dir = Path(run_dir)
    log = log if distributed.env_rank() == 0 else distributed.quiet
    train, val = sft_batches(job, run_dir, resume, log)
    loss_fn = functools.partial(sft_loss, label_smoothing=job.train.label_smoothing)
    return train_new_model(builder(job, run_dir, resume), job.train, train, val, loss_fn, run_dir,
                           resume=resume, log=log, weights_file=weights_file(job))


__all__ = ["per_token_loss", "run_sft", "sft_batches", "sft_logits", "sft_loss"]
