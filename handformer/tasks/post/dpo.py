"""Direct preference optimization (`task = "dpo"`): from pairs of a preferred and a rejected reply,
make the preferred one likelier than the reference model makes it, and the rejected one less so.

With log-probabilities summed over each reply's tokens, policy p and reference r:

    margin = (p(chosen) - r(chosen)) - (p(rejected) - r(rejected))
    sigmoid (the DPO paper):  loss = -log sigmoid(beta * margin)
    ipo:                      loss = (margin_per_token - 1 / (2 beta))^2, each log-ratio divided by
                              its reply's length first (TRL's length-normalized IPO)
    sft_weight > 0:           + sft_weight * the chosen replies' negative log-likelihood per token
                              over the batch (TRL's loss_type ["sigmoid", "sft"])

The reference is the base run (the weights training starts from). Its log-probabilities are
computed once before training and kept in reference_logprobs.safetensors (written atomically as
they are computed, so an interrupted run picks up where it stopped), or at every step by a frozen
copy ([dpo] reference = "live"). Logged per pair: the rewards beta * (p - r) of the chosen and the
rejected reply, whether the chosen one's is higher (accuracy), their difference, and the plain
log-probability margin p(chosen) - p(rejected), also on the validation pairs.

A pair is rendered as TRL renders it: the prompt with the assistant header, and each reply as what
the template writes after the prompt for prompt + reply.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save as st_save
from torch import Tensor, nn

from handformer.io import atomic_write_bytes
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode
from handformer.tasks.lm.finetune import weights_sha256
from handformer.tasks.post.job import DPOConfig, PostJob
from handformer.tasks.post.logprobs import completion_targets, token_logprobs
from handformer.tasks.post.packing import IGNORE
from handformer.tasks.post.records import Preference, read_preferences
from handformer.tasks.post.rendering import ConversationRenderer
from handformer.tasks.post.setup import (
    base_dir,
    builder,
    prepare_run,
    reference_model,
    split_lines,
    weights_file,
)
from handformer.training import distributed
from handformer.training.checkpoint import read_safetensors
from handformer.training.loop import TrainResult, pick_device, train_new_model

REFERENCE_FILE = "reference_logprobs.safetensors"


@dataclass
class Pair:
    index: int  # in its split: the row of the reference cache
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


@dataclass
class DPOBatch:
    x: Tensor  # (2B, T): the B chosen rows, then the B rejected rows, right-padded
    y: Tensor  # (2B, T): the reply's tokens as targets, IGNORE elsewhere
    attention_mask: Tensor  # (2B, T)
    ref_logps: Tensor | None  # (2B,) cached reference log-probabilities, or None (live)
    index: list[int]  # the pairs' rows in the reference cache
    n_tokens: int  # pairs: the loss is a mean over pairs

    def to(self, device: torch.device | str) -> DPOBatch:
        ref = None if self.ref_logps is None else self.ref_logps.to(device)
        return DPOBatch(self.x.to(device), self.y.to(device), self.attention_mask.to(device), ref,
                        self.index, self.n_tokens)


def encode_pairs(prefs: list[Preference], renderer: ConversationRenderer, block_size: int, overlong: str,
                 ) -> tuple[list[Pair], str]:
    """The pairs' tokens, each prompt + reply cut to block_size + 1 tokens (the start kept) or the
    pair dropped; a pair whose prompt alone fills the block is dropped. Returns a report too."""
    out, truncated, dropped = [], 0, 0
    for pref in prefs:
        prompt, (chosen, rejected) = renderer.replies(pref.prompt, [pref.chosen, pref.rejected], pref.tools)
        if not prompt or not chosen or not rejected:
            raise ValueError(f"{pref.where}: the prompt or a reply renders as no tokens")
        longest = len(prompt) + max(len(chosen), len(rejected)) - 1
        if longest > block_size:
            if overlong == "drop" or len(prompt) >= block_size:
                dropped += 1
                continue
            room = block_size + 1 - len(prompt)
            chosen, rejected, truncated = chosen[:room], rejected[:room], truncated + 1
        out.append(Pair(len(out), prompt, chosen, rejected))
    report = f"{len(out):,} pairs"
    if truncated:
        report += f", {truncated:,} truncated to block_size={block_size}"
    if dropped:
        report += f", {dropped:,} dropped (longer than block_size={block_size})"
    return out, report


def dpo_batch(pairs: list[Pair], pad_id: int, ref: Tensor | None) -> DPOBatch:
    rows = [(p.prompt + p.chosen, len(p.prompt)) for p in pairs] + \
           [(p.prompt + p.rejected, len(p.prompt)) for p in pairs]
    x, y, mask = completion_targets(rows, pad_id)
    index = [p.index for p in pairs]
    ref_logps = None if ref is None else torch.cat([ref[index, 0], ref[index, 1]])  # (2B,)
    return DPOBatch(x, y, mask, ref_logps, index, len(pairs))


class DPOBatches:
    """The batches of a DPO run, one epoch at a time (the loop's BatchSource)."""

    def __init__(self, pairs: list[Pair], batch_size: int, pad_id: int, ref: Tensor | None,
                 shuffle: bool = True, seed: int = 0) -> None:
        if not pairs:
            raise ValueError("no pairs are left to train on (all were dropped); raise data.block_size "
                             "or set data.overlong = \"truncate\"")
        self.pairs, self.batch_size, self.pad_id, self.ref = pairs, batch_size, pad_id, ref
        self.shuffle, self.seed = shuffle, seed

    def epoch(self, epoch: int) -> list[DPOBatch]:
        order = list(range(len(self.pairs)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        B = self.batch_size
        return [dpo_batch([self.pairs[i] for i in order[j:j + B]], self.pad_id, self.ref)
                for j in range(0, len(order), B)]


def sequence_logps(model: nn.Module, batch: DPOBatch) -> tuple[Tensor, Tensor]:
    """(2B,) summed log-probabilities of each row's reply, and (2B,) its number of tokens."""
    logits = model(batch.x, batch.attention_mask).logits  # (2B, T, V)
    return token_logprobs(logits, batch.y).sum(-1), (batch.y != IGNORE).sum(-1)


def dpo_losses(policy: Tensor, reference: Tensor, lengths: Tensor, cfg: DPOConfig,
               ) -> tuple[Tensor, Tensor, Tensor]:
    """Per-pair losses, chosen rewards and rejected rewards from (2B,) summed log-probabilities
    (chosen rows first) and (2B,) reply lengths."""
    chosen, rejected = policy.chunk(2)
    ref_chosen, ref_rejected = reference.chunk(2)
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected  # log pi/ref
    if cfg.loss_type == "sigmoid":
        losses = -F.logsigmoid(cfg.beta * (chosen_ratio - rejected_ratio))
    else:  # ipo: each log-ratio per token of its reply
        n_chosen, n_rejected = lengths.chunk(2)
        margin = chosen_ratio / n_chosen.clamp(min=1) - rejected_ratio / n_rejected.clamp(min=1)
        losses = (margin - 1 / (2 * cfg.beta)) ** 2
    if cfg.sft_weight:  # the chosen replies' log-likelihood per token of the batch, on each pair
        losses = losses - cfg.sft_weight * chosen.sum() / lengths.chunk(2)[0].sum().clamp(min=1)
    return losses, cfg.beta * chosen_ratio.detach(), cfg.beta * rejected_ratio.detach()


def dpo_loss(model: nn.Module, batch: DPOBatch, cfg: DPOConfig, reference: nn.Module | None = None,
             ) -> tuple[Tensor, dict[str, float]]:
    """The loop's objective: the summed loss of the batch's pairs, and the per-pair metrics (sums)."""
    policy, lengths = sequence_logps(model, batch)
    if batch.ref_logps is not None:
        ref = batch.ref_logps
    else:
        with torch.no_grad():
            ref, _ = sequence_logps(reference, batch)
    losses, chosen_rewards, rejected_rewards = dpo_losses(policy, ref.to(policy.dtype), lengths, cfg)
    chosen, rejected = policy.detach().chunk(2)
    metrics = {"rewards_chosen": chosen_rewards.sum(), "rewards_rejected": rejected_rewards.sum(),
               "reward_accuracy": (chosen_rewards > rejected_rewards).float().sum(),
               "reward_margin": (chosen_rewards - rejected_rewards).sum(),
               "logp_margin": (chosen - rejected).sum()}
    return losses.sum(), {k: float(v) for k, v in metrics.items()}


# --- the reference's log-probabilities, cached -------------------------------------------------

def fingerprint(pairs: list[Pair], base_sha256: str) -> str:
    """What the cache was computed for: the pairs' tokens and the reference weights."""
    digest = hashlib.sha256(base_sha256.encode())
    for p in pairs:
        digest.update(json.dumps([p.prompt, p.chosen, p.rejected]).encode())
    return digest.hexdigest()


def reference_logps(reference: nn.Module, pairs: list[Pair], pad_id: int, batch_size: int) -> Tensor:
    """(N, 2) summed log-probabilities of each pair's chosen and rejected reply under `reference`."""
    out = []
    with torch.no_grad(), eval_mode(reference):
        device = next(reference.parameters()).device
        for i in range(0, len(pairs), batch_size):
            batch = dpo_batch(pairs[i:i + batch_size], pad_id, None).to(device)
            logps, _ = sequence_logps(reference, batch)
            out.append(torch.stack(logps.chunk(2), dim=1).cpu())  # (b, 2)
    return torch.cat(out) if out else torch.zeros(0, 2)


def cached_reference(path: Path, splits: dict[str, list[Pair]], reference_fn, pad_id: int, batch_size: int,
                     base_sha256: str, log=print, write: bool = True) -> dict[str, Tensor]:
    """Each split's (N, 2) reference log-probabilities, from `path` when it holds them for these
    pairs and weights, else computed (reference_fn() builds the reference model) in chunks, the
    file rewritten atomically after each, so an interrupted computation resumes. `write`: this
    process writes the file (rank 0)."""
    stamps = {name: fingerprint(pairs, base_sha256) for name, pairs in splits.items()}
    done: dict[str, Tensor] = {}
    if path.is_file():
        tensors, metadata = read_safetensors(path, "delete it and start the run again")
        for name, stamp in stamps.items():
            if metadata.get(name) == stamp and name in tensors:
                done[name] = tensors[name]
    if all(name in done and len(done[name]) == len(splits[name]) for name in splits):
        log(f"reference log-probabilities: read from {path}")
        return done
    reference = reference_fn()
    chunk = max(batch_size * 8, 64)
    for name, pairs in splits.items():
        have = done.get(name, torch.zeros(0, 2))
        for start in range(len(have), len(pairs), chunk):
            more = reference_logps(reference, pairs[start:start + chunk], pad_id, batch_size)
            have = done[name] = torch.cat([have, more])
            if write:
                tensors = {n: t.contiguous() for n, t in done.items()}
                atomic_write_bytes(path, st_save(tensors, metadata={n: stamps[n] for n in done}))
        done[name] = have
    log(f"reference log-probabilities: {sum(len(p) for p in splits.values()):,} pairs, kept in {path}")
    return done


# --- the run --------------------------------------------------------------------------------------

def run_dpo(job: PostJob, run_dir: str | os.PathLike, resume: bool = False, log=print,
            ) -> tuple[CausalLM, TrainResult]:
    """Train (or resume) a DPO run in `run_dir` from the run in [train] init_from (the reference)."""
    run_dir = Path(run_dir)
    main = distributed.env_rank() == 0
    log = log if main else distributed.quiet
    post = prepare_run(job, run_dir, resume, log)
    train_prefs, val_prefs = split_lines(job, read_preferences)
    splits = {}
    for name, prefs in (("train", train_prefs), ("val", val_prefs)):
        if prefs:
            splits[name], report = encode_pairs(prefs, post.renderer, job.block_size, job.data.overlong)
            log(f"{'training' if name == 'train' else 'validation'}: {report}")
    cfg, reference, base = job.dpo, None, base_dir(job, run_dir, resume)
    device = pick_device(job.train.device)
    if cfg.reference == "cached":
        refs = cached_reference(run_dir / REFERENCE_FILE, splits, lambda: reference_model(job, base, device),
                                post.pad_id, job.data.batch_size, weights_sha256(base / "model.safetensors"),
                                log, write=main)
    else:  # under torchrun every rank has its own frozen copy
        refs, reference = {}, reference_model(job, base, device)
    B = job.data.batch_size
    train = DPOBatches(splits["train"], B, post.pad_id, refs.get("train"), seed=job.train.seed)
    val = None
    if "val" in splits:
        val = DPOBatches(splits["val"], B, post.pad_id, refs.get("val"), shuffle=False).epoch(0)
        val = val[:job.data.eval_batches] if job.data.eval_batches else val
    loss_fn = functools.partial(dpo_loss, cfg=cfg, reference=reference)
    return train_new_model(builder(job, run_dir, resume), job.train, train, val, loss_fn, run_dir,
                           resume=resume, log=log, weights_file=weights_file(job))


__all__ = ["REFERENCE_FILE", "DPOBatch", "DPOBatches", "Pair", "cached_reference", "dpo_batch", "dpo_loss",
           "dpo_losses", "encode_pairs", "reference_logps", "run_dpo", "sequence_logps"]
