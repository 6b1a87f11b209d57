"""Training a translation run: the job's batches fed to the shared loop, and the
run directory it writes.

A run directory holds:
    config.json              model, train, data and decode sections
    tokenizer.json           source tokenizer (or the joint one)
    tokenizer.target.json    target tokenizer, when source and target vocabularies are separate
    model.safetensors        best weights by validation loss
    checkpoint.safetensors   everything needed to resume
    metrics.jsonl            one JSON object per logged step
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from handformer.config import Seq2SeqConfig
from handformer.data.batching import Seq2SeqBatch
from handformer.io import atomic_write_text
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.modes import eval_mode
from handformer.tasks.translation.job import (
    TranslationJob,
    batched_pairs,
    build_tokenizers,
    load_pairs,
    model_config,
)
from handformer.tasks.translation.translator import load_tokenizers
from handformer.training import distributed
from handformer.training.loop import EvalImages, TrainResult, train_new_model
from handformer.training.losses import token_cross_entropy
from handformer.training.tensorboard import heatmap_image


def seq2seq_loss(model: torch.nn.Module, batch: Seq2SeqBatch, label_smoothing: float = 0.0,
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loop's objective for translation: summed cross-entropy over the real target tokens (label
    smoothing in training mode only: evaluation reports the plain cross-entropy), no other metrics."""
    pad_id = model_pad_id(model)
    real = batch.tgt_out != pad_id  # (B, T): logits only where there is a target to score
    logits = model(batch.src, batch.tgt_in, logits_at=real).logits  # (N, V)
    smoothing = label_smoothing if model.training else 0.0
    return token_cross_entropy(logits, batch.tgt_out[real], pad_id, smoothing), {}


def model_pad_id(model: torch.nn.Module) -> int:
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return getattr(model, "module", model).cfg.pad_id  # DistributedDataParallel's wrapper


def run_train(job: TranslationJob, run_dir: str | os.PathLike, resume: bool = False,
              log=print) -> tuple[Seq2SeqTransformer, TrainResult]:
    """Train (or resume) a translation run in `run_dir`."""
    run_dir = Path(run_dir)
    main = distributed.env_rank() == 0  # under torchrun, rank 0 alone logs and writes files
    log = log if main else distributed.quiet
    train_pairs, val_pairs, _ = load_pairs(job.data)
    log(train_pairs.report())
    if val_pairs is not None:
        log(f"validation: {val_pairs.report()}")
    if resume:
        src_tok, tgt_tok = load_tokenizers(run_dir)
    else:
        src_tok, tgt_tok = build_tokenizers(job.data, train_pairs.pairs)
    model_cfg = model_config(job, src_tok, tgt_tok)
    if not resume and main:
        run_dir.mkdir(parents=True, exist_ok=True)
        src_tok.save(run_dir / "tokenizer.json")
        if tgt_tok is not src_tok:
            tgt_tok.save(run_dir / "tokenizer.target.json")
        save_run_config(run_dir, model_cfg, job)

    max_len = min(job.data.max_length, model_cfg.max_positions)
    train_data = batched_pairs(job, train_pairs.pairs, src_tok, tgt_tok, max_len, shuffle=True)
    if train_data.encoded.truncated:
        log(f"truncated {train_data.encoded.truncated:,} training pairs longer than {max_len} tokens "
            "(EOS kept)")
    val_batches = None
    if val_pairs is not None:
        val_batches = batched_pairs(job, val_pairs.pairs, src_tok, tgt_tok, max_len, shuffle=False).epoch(0)

    images = cross_attention_images(val_batches[0], model_cfg.pad_id) if val_batches else None
    loss_fn = functools.partial(seq2seq_loss, label_smoothing=job.train.label_smoothing)
    return train_new_model(lambda: Seq2SeqTransformer(model_cfg), job.train, train_data, val_batches,
                           loss_fn, run_dir, resume=resume, log=log, eval_images=images)


def cross_attention_images(batch: Seq2SeqBatch, pad_id: int) -> EvalImages:
    """For TensorBoard at each evaluation: the cross-attention of the first validation pair,
    teacher-forced on its reference, in the last decoder layer, mean of the heads (rows: target
    positions, columns: source tokens)."""
    src = batch.src[:1, : int((batch.src[0] != pad_id).sum())]  # (1, S) without padding
    tgt = batch.tgt_in[:1, : int((batch.tgt_in[0] != pad_id).sum())]  # (1, T)

    def images(model: torch.nn.Module) -> dict[str, object]:
        device = next(model.parameters()).device
        with torch.no_grad(), eval_mode(model):
            out = model(src.to(device), tgt.to(device), need_weights=True)
        weights = out.cross_attentions[-1][0].float().mean(0).cpu().numpy()  # (T, S)
        return {"cross_attention/last_layer": heatmap_image(weights)}

    return images


def save_run_config(run_dir: Path, model_cfg: Seq2SeqConfig, job: TranslationJob) -> None:
    data = {"task": "translation", "model": model_cfg.to_dict(), "train": asdict(job.train),
            "data": asdict(job.data), "decode": asdict(job.decode)}
    atomic_write_text(run_dir / "config.json", json.dumps(data, indent=2) + "\n")
