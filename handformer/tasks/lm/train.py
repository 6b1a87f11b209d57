"""Training a language model: random windows of text fed to the shared loop
(`handformer train` with task "lm").
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from handformer.config import CausalLMConfig, MoEConfig
from handformer.data.shards import LazyBatches, ShardSet, ShardWindows, shard_validation_batches
from handformer.data.special_tokens import SpecialTokens
from handformer.data.text import (
    PYDOC,
    LMBatch,
    LMWindows,
    as_token_tensor,
    load_text,
    split_text,
    validation_batches,
)
from handformer.data.tokenizer import Tokenizer
from handformer.families import build_causal_lm
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm import finetune
from handformer.tasks.lm.job import LMDataConfig, LMJob
from handformer.tasks.lm.run import write_lm_run_config
from handformer.training import distributed
from handformer.training.loop import TrainResult, train_new_model
from handformer.training.losses import token_cross_entropy
from handformer.training.moe_loss import RouterLogits, load_balancing_loss


def lm_loss(model: torch.nn.Module, batch: LMBatch, label_smoothing: float = 0.0,
            ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loop's objective for language modeling: the summed next-token cross-entropy over every
    position (windows have no padding), and no other metrics. Label smoothing applies in training
    mode only, so evaluation reports the plain cross-entropy."""
    logits = model(batch.x).logits  # (B, T, V)
    smoothing = label_smoothing if model.training else 0.0
    return token_cross_entropy(logits, batch.y, None, smoothing), {}


LMObjective = Callable[[torch.nn.Module, LMBatch], tuple[torch.Tensor, dict[str, float]]]


def lm_objective(job_train, model_cfg: CausalLMConfig) -> LMObjective:
    """The loop's objective for a model, as the loop calls it, (model, batch): lm_loss with the
    run's label smoothing, and the experts' balance for a mixture."""
    if model_cfg.moe is None:
        return functools.partial(lm_loss, label_smoothing=job_train.label_smoothing)
    return moe_lm_loss(model_cfg.moe, job_train.label_smoothing)


def moe_lm_loss(moe: MoEConfig, label_smoothing: float = 0.0) -> LMObjective:
    """`lm_loss` plus, in training, moe.aux_loss_coef times the load-balancing loss of the routers
    (handformer/training/moe_loss.py), per token as the loop divides by them; the loss itself is
    logged as moe_aux_loss. Evaluation scores the cross-entropy alone."""
    def loss(model: torch.nn.Module, batch: LMBatch) -> tuple[torch.Tensor, dict[str, float]]:
        with RouterLogits(model) as routers:
            ce, metrics = lm_loss(model, batch, label_smoothing)
        if not model.training or not routers.logits:
            return ce, metrics
        aux = load_balancing_loss(routers.logits, moe.n_experts, moe.top_k)
        tokens = batch.n_tokens
        metrics = {**metrics, "moe_aux_loss": float(aux.detach()) * tokens}  # logged per token
        return ce + moe.aux_loss_coef * aux * tokens, metrics
    return loss


def train_tokens(tokenizer: Tokenizer) -> SpecialTokens:
    """The special tokens of a model trained here on raw text windows. It never saw BOS or EOS (the
    text has no document markers), so generation must neither prepend BOS (an untrained embedding)
    nor wait for an EOS it cannot predict. Padding is only for batching prompts of different
    lengths: padded positions are masked out of attention, so any id works; the tokenizer's <pad>
    keeps decoded text clean (decode drops it)."""
    return SpecialTokens(bos_id=None, eos_id=None, pad_id=tokenizer.pad_id)


def encode_splits(tokenizer: Tokenizer, train_text: str, val_text: str, data: LMDataConfig,
                  seed: int, log=print, warn_unknown: bool = False,
                  ) -> tuple[LMWindows, list[LMBatch] | None]:
    """Training windows (data order seeded by `seed`) and the fixed validation batches (None
    without a validation split). `warn_unknown`: log how many tokens are the unknown token (a
    tokenizer from a base run meeting new text)."""
    train_ids = as_token_tensor(tokenizer.encode(train_text), tokenizer.vocab_size)
    windows = LMWindows(train_ids, data.block_size, data.batch_size, data.batches_per_epoch, seed)
    kind = "the base run's" if warn_unknown else data.tokenizer
    log(f"{kind} tokenizer: {tokenizer.vocab_size:,} tokens; {len(train_ids):,} training "
        f"tokens, {data.block_size} per window, {data.batch_size} windows per batch")
    if warn_unknown:
        warning = finetune.unknown_token_warning(tokenizer, train_ids, train_text, "training")
        if warning:
            log(warning)
    if not val_text:
        return windows, None
    val_ids = as_token_tensor(tokenizer.encode(val_text), tokenizer.vocab_size)
    if warn_unknown:
        warning = finetune.unknown_token_warning(tokenizer, val_ids, val_text, "validation")
        if warning:
            log(warning)
    val_batches = validation_batches(val_ids, data.block_size, data.batch_size, data.eval_batches)
    log(f"validation: {sum(b.n_tokens for b in val_batches):,} of {len(val_ids):,} tokens in "
        f"{len(val_batches)} fixed batches")
    return windows, val_batches


def shard_tokenizer(data: LMDataConfig, shards: ShardSet) -> tuple[Tokenizer | None, SpecialTokens]:
    """The tokenizer of a shard folder (data.tokenizer when it names one, else the manifest's) and
    the special tokens of a model trained on it: documents end with EOS, so the model learns it."""
    named = Path(data.tokenizer) if data.tokenizer not in ("char", "bpe") else None
    run_config: dict = {}
    if named is not None and named.is_dir():
        config = named / "config.json"
        run_config = json.loads(config.read_text()) if config.is_file() else {}
        named = named / "tokenizer.json"
    if named is not None:
        tokenizer = Tokenizer.load(named)
    elif shards.tokenizer_path is not None:
        tokenizer = Tokenizer.load(shards.tokenizer_path)
    elif data.shard_vocab_size:
        return None, SpecialTokens()
    else:
        raise ValueError(f"[data] shards={data.shards!r} holds {shards.format} files, which carry no "
                         "tokenizer: set data.tokenizer to a tokenizer.json or a run directory (e.g. "
                         "one from `handformer import-hf` of GPT-2), or state data.shard_vocab_size")
    tokens = run_config.get("tokens", {})
    eos = (shards.manifest or {}).get("tokenizer", {}).get("eos_id", tokens.get("eos_id", tokenizer.eos_id))
    pad = tokens.get("pad_id", tokenizer.pad_id)
    return tokenizer, SpecialTokens(bos_id=tokens.get("bos_id"), eos_id=eos,
                                    pad_id=pad if pad is not None else eos)


def shard_splits(data: LMDataConfig, shards: ShardSet, vocab_size: int, seed: int,
                 log=print) -> tuple[ShardWindows, LazyBatches | None]:
    """Training windows drawn from the training shards and the fixed validation batches."""
    shards.check_vocab(vocab_size)
    windows = ShardWindows(shards.train, data.block_size, data.batch_size, vocab_size, data.sampling,
                           data.batches_per_epoch, seed)
    n_train = sum(len(s) for s in shards.train)
    log(f"{shards.format} shards in {shards.root}: {n_train:,} training tokens in {len(shards.train)} "
        f"shard(s), {shards.dtype.name}; {data.sampling} windows of {data.block_size}, "
        f"{data.batch_size} per batch; vocabulary {vocab_size:,}")
    if not shards.val:
        log("no validation shards: training without validation")
        return windows, None
    val = shard_validation_batches(shards.val, data.block_size, data.batch_size, vocab_size,
                                   data.eval_batches)
    log(f"validation: {len(val)} fixed batches from {len(shards.val)} shard(s) "
        f"({sum(len(s) for s in shards.val):,} tokens)")
    return windows, val


def run_train_lm_shards(job: LMJob, run_dir: Path, resume: bool, log) -> tuple[CausalLM, TrainResult]:
    """Train on a folder of token shards (`data.shards`); memory does not grow with the corpus."""
    data, main = job.data, distributed.env_rank() == 0
    shards = ShardSet.open(data.shards)
    tokenizer, tokens = shard_tokenizer(data, shards)
    vocab_size = data.shard_vocab_size or tokenizer.vocab_size
    if tokenizer is not None and vocab_size < tokenizer.vocab_size:
        raise ValueError(f"[data] shard_vocab_size={vocab_size} is invalid: it must be at least the "
                         f"tokenizer's {tokenizer.vocab_size:,} tokens (or 0)")
    model_cfg = job.model_config(vocab_size)
    windows, val_batches = shard_splits(data, shards, vocab_size, job.train.seed, log)
    if not resume and main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if tokenizer is not None:
            tokenizer.save(run_dir / "tokenizer.json")
        else:
            log("no tokenizer: the run will have no tokenizer.json (generate needs one)")
        write_lm_run_config(run_dir, model_cfg, tokens, train=asdict(job.train), data=asdict(data))
    return train_new_model(lambda: build_causal_lm(model_cfg), job.train, windows, val_batches,
                           lm_objective(job.train, model_cfg), run_dir, resume=resume, log=log)


def run_train_lm(job: LMJob, run_dir: str | os.PathLike, resume: bool = False,
                 log=print) -> tuple[CausalLM, TrainResult]:
    """Train (or resume) a language model on `job.data` in `run_dir` with the shared loop."""
    run_dir = Path(run_dir)
    main = distributed.env_rank() == 0  # under torchrun, rank 0 alone logs and writes files
    log = log if main else distributed.quiet
    if job.data.shards:
        return run_train_lm_shards(job, run_dir, resume, log)
    data = job.data
    path = data.text_path()
    text = load_text(path)
    train_text, val_text = split_text(text, data.val_fraction)
    source = "the embedded pydoc corpus" if path == PYDOC else path
    log(f"{len(text):,} characters from {source}: {len(train_text):,} for training, "
        f"{len(val_text):,} for validation")
    base = job.base
    if resume or base is None:
        tokenizer = (Tokenizer.load(run_dir / "tokenizer.json") if resume else
                     Tokenizer.train(data.tokenizer, [train_text], data.vocab_size))
    else:
        tokenizer = Tokenizer.load(base.path / "tokenizer.json")
        log(f"fine-tuning {base.path}{' with LoRA adapters' if job.lora else ''}: its model, "
            "weights and tokenizer")
    model_cfg = job.model_config(tokenizer.vocab_size)
    windows, val_batches = encode_splits(tokenizer, train_text, val_text, data, job.train.seed, log,
                                         warn_unknown=base is not None)
    if not resume and main:  # written once the data is known to be usable
        run_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(run_dir / "tokenizer.json")
        tokens, sections = _run_sections(job, tokenizer, run_dir)
        write_lm_run_config(run_dir, model_cfg, tokens, **sections)
        if base is not None:
            finetune.copy_chat_files(base.path, run_dir)

    return train_new_model(_builder(job, model_cfg, run_dir, resume), job.train, windows, val_batches,
                           lm_objective(job.train, model_cfg), run_dir, resume=resume, log=log,
                           weights_file=finetune.ADAPTERS_FILE if job.lora else "model.safetensors")


def _run_sections(job: LMJob, tokenizer: Tokenizer, run_dir: Path) -> tuple[SpecialTokens, dict]:
    """The special tokens and config.json sections of a new run: a fine-tuned run keeps its base's
    tokens (an imported model prompts with BOS as before) and records where it came from."""
    train = asdict(job.train)
    if job.base is None:
        return train_tokens(tokenizer), {"train": train, "data": asdict(job.data)}
    train["init_from"] = str(job.base.path)  # absolute: --resume works from any directory
    sections = {"train": train, "data": asdict(job.data),
                "init_from": finetune.provenance(job.base, run_dir, lora=job.lora is not None)}
    if job.lora is not None:
        train["lora"] = sections["lora"] = asdict(job.lora)
    return SpecialTokens(**job.base.config.get("tokens", {})), sections


def _builder(job: LMJob, model_cfg, run_dir: Path, resume: bool):
    """What train_new_model calls to build the model: random weights, or the base run's. Resuming
    a full fine-tune needs no base weights (the checkpoint has them all); resuming LoRA needs the
    base, unchanged since the adapters began."""
    if job.base is None or (resume and job.lora is None):
        return lambda: build_causal_lm(model_cfg)
    if resume:
        config = json.loads((run_dir / "config.json").read_text())
        base_dir = finetune.verified_base(run_dir, config)
    else:
        base_dir = job.base.path
    return lambda: finetune.base_model(model_cfg, base_dir, job.lora)
