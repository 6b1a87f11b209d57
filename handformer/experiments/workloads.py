"""The two small workloads the experiments train, and the plain step loop they share.

- The dates task (`handformer.data.dates`, the demo's job): an encoder-decoder translates dates
  written in words into ISO dates; scored by held-out loss and greedy exact match.
- A character-level language model on the embedded pydoc corpus (`handformer.data.text`); scored
  by held-out next-character loss.

Both are cut down from the demo and the tiny LM so that every experiment, every variant and every
seed together fit in about 20 minutes on 2 CPU cores. The step loop is deliberately smaller than
`handformer.training.loop.train` (no checkpoints, no files): a trial is thrown away once its
numbers are taken. It uses the same optimizer, schedule and clipping as the real loop.

Shape legend: B batch, S source length, T target / window length, V vocabulary.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.data.batching import EncodedPairs, Seq2SeqData, collate, encode_pairs
from handformer.data.dates import date_pairs
from handformer.data.text import LMWindows, as_token_tensor, pydoc_corpus, split_text, validation_batches
from handformer.data.tokenizer import Tokenizer
from handformer.families import build_causal_lm
from handformer.generation.decoding import DecodeLimits, greedy_decode
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.modes import eval_mode
from handformer.training.cpu_memory import keep_freed_memory
from handformer.training.loop import TrainConfig, autocast, clip_gradients, make_optimizer
from handformer.training.losses import token_cross_entropy
from handformer.training.schedules import learning_rate

CPU = torch.device("cpu")


# --- the step loop ----------------------------------------------------------------------------

@dataclass
class TrainLog:
    curve: list[tuple[float, float]] = field(default_factory=list)  # (step, mean training loss)
    step_s: list[float] = field(default_factory=list)  # wall time of every step
    diverged_at: int | None = None  # the step whose loss was NaN or infinite

    @property
    def final_loss(self) -> float:
        return math.nan if self.diverged_at is not None or not self.curve else self.curve[-1][1]

    @property
    def median_step_ms(self) -> float:
        times = sorted(self.step_s[5:] or self.step_s)  # the first steps warm the allocator up
        return 1000 * times[len(times) // 2] if times else math.nan


def train_steps(model: nn.Module, batches: Iterator, loss_sum: Callable[[nn.Module, object], Tensor],
                steps: int, lr: float, warmup: int, log_every: int = 10, clip: float = 1.0,
                **train: Any) -> TrainLog:
    """AdamW with linear warmup then cosine decay to lr/10, gradient clipping, loss normalised by
    the batch's real tokens. `loss_sum(model, batch)` returns the summed loss of one batch.
    `train`: other TrainConfig fields (optimizer="muon", schedule="trapezoid", bf16=True, ...).
    Stops at the first non-finite loss (recorded in `diverged_at`)."""
    keep_freed_memory()
    cfg = TrainConfig(**{"schedule": "cosine", **train, "steps": steps, "lr": lr, "warmup": warmup,
                         "min_lr": lr / 10, "label_smoothing": 0.0, "clip_grad": clip, "progress": False})
    optimizer = make_optimizer(model, cfg, CPU)
    log = TrainLog()
    window = 0.0
    model.train()
    for step in range(steps):
        start = time.perf_counter()
        batch = next(batches)
        with autocast(CPU, cfg.bf16):
            loss = loss_sum(model, batch) / batch.n_tokens
        loss.backward()
        if clip > 0:
            clip_gradients(model, clip, CPU)
        for group in optimizer.param_groups:  # Muon's matrices have their own peak (lr_ratio)
            group["lr"] = group.get("lr_ratio", 1.0) * learning_rate(
                step, cfg.schedule, lr, warmup, steps, cfg.min_lr, cfg.cooldown)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.step_s.append(time.perf_counter() - start)
        value = loss.item()
        if not math.isfinite(value):
            log.diverged_at = step + 1
            log.curve.append((step + 1, math.nan))
            break
        window += value
        if (step + 1) % log_every == 0 or step + 1 == steps:
            log.curve.append((step + 1, window / (log_every if (step + 1) % log_every == 0
                                                  else (step + 1) % log_every)))
            window = 0.0
    return log


def endless(epoch: Callable[[int], list]) -> Iterator:
    """Batches of epoch 0, 1, 2, ... forever."""
    n = 0
    while True:
        yield from epoch(n)
        n += 1


# --- the dates task ---------------------------------------------------------------------------

@dataclass
class DatesSettings:
    d_model: int = 64  # the demo: 128
    n_heads: int = 4
    d_ff: int = 256
    n_layers: int = 2  # encoder layers, and as many decoder layers (the demo: 2 + 2)
    norm_placement: str = "pre"
    position: str = "sinusoidal"
    dropout: float = 0.0
    steps: int = 300  # the demo: 700
    lr: float = 2e-3  # peak learning rate (the demo's)
    warmup: int = 30  # linear warmup steps; 0 = the peak rate from the first step
    max_tokens: int = 1024  # padded tokens per batch (the demo: 2048)
    n_train: int = 20000
    n_eval: int = 200  # held-out dates scored by loss and greedy exact match
    log_every: int = 10


@dataclass(eq=False)  # hashed by identity: one object per cached data set
class DatesData:
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    train: EncodedPairs
    heldout: EncodedPairs
    references: list[str]  # the held-out targets, "1997-03-23"


@functools.lru_cache(maxsize=2)
def dates_data(n_train: int, n_eval: int) -> DatesData:
    """The demo's data: BPE sources (400 tokens), character targets; tokenizers trained on the
    training pairs only. The same for every variant and seed (only the batch order follows the
    seed)."""
    train, heldout = date_pairs(n_train, n_eval, seed=0)
    src_tok = Tokenizer.train("bpe", [s for s, _ in train], 400)
    tgt_tok = Tokenizer.train("char", [t for _, t in train])
    return DatesData(src_tok, tgt_tok, encode_pairs(train, src_tok, tgt_tok, 64),
                     encode_pairs(heldout, src_tok, tgt_tok, 64), [t for _, t in heldout])


def dates_model(s: DatesSettings, data: DatesData, seed: int) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(src_vocab_size=data.src_tok.vocab_size, tgt_vocab_size=data.tgt_tok.vocab_size,
                        pad_id=data.src_tok.pad_id, d_model=s.d_model, n_heads=s.n_heads, d_ff=s.d_ff,
                        n_encoder_layers=s.n_layers, n_decoder_layers=s.n_layers,
                        norm_placement=s.norm_placement, position=s.position, dropout=s.dropout,
                        max_positions=64)
    return Seq2SeqTransformer(cfg)


def dates_loss_sum(model: nn.Module, batch) -> Tensor:
    """Summed cross-entropy of the target tokens (teacher forcing), padding left out."""
    pad_id = model.cfg.pad_id
    real = batch.tgt_out != pad_id  # (B, T)
    logits = model(batch.src, batch.tgt_in, logits_at=real).logits  # (N, V)
    return token_cross_entropy(logits, batch.tgt_out[real], pad_id)


def train_dates(model: nn.Module, s: DatesSettings, data: DatesData, seed: int,
                loss_sum: Callable[[nn.Module, object], Tensor] = dates_loss_sum) -> TrainLog:
    tok = data.tgt_tok
    batches = Seq2SeqData(data.train, s.max_tokens, data.src_tok.pad_id, tok.bos_id, tok.eos_id,
                          shuffle=True, seed=seed)
    return train_steps(model, endless(batches.epoch), loss_sum, s.steps, s.lr, s.warmup, s.log_every)


def heldout_batches(data: DatesData, size: int = 100) -> list:
    """The held-out pairs in order, `size` a batch."""
    enc, tok = data.heldout, data.tgt_tok
    return [collate(enc.src[i: i + size], enc.tgt[i: i + size], data.src_tok.pad_id, tok.bos_id,
                    tok.eos_id) for i in range(0, len(enc.src), size)]


@torch.no_grad()
def dates_scores(model: Seq2SeqTransformer, data: DatesData) -> dict[str, float]:
    """Held-out loss per target token (teacher forcing), greedy exact match, and the share of
    dates whose year, month and day are each right."""
    tok = data.tgt_tok
    limits = DecodeLimits(tok.bos_id, tok.eos_id, data.src_tok.pad_id)
    total, tokens, outputs = 0.0, 0, []
    with eval_mode(model):
        for batch in heldout_batches(data):
            total += float(dates_loss_sum(model, batch))
            tokens += batch.n_tokens
            outputs += [tok.decode(ids) for ids in greedy_decode(model, batch.src, limits).tolist()]
    refs = data.references
    n = len(refs)

    def share(part: slice) -> float:
        return sum(o[part] == r[part] and len(o) == len(r) for o, r in zip(outputs, refs)) / n

    return {"val_loss": total / tokens, "exact_match": sum(o == r for o, r in zip(outputs, refs)) / n,
            "year": share(slice(0, 4)), "month": share(slice(5, 7)), "day": share(slice(8, 10))}


def dates_outputs(model: Seq2SeqTransformer, data: DatesData, n: int = 5) -> str:
    """The first n held-out dates with the model's greedy output, one line each."""
    tok = data.tgt_tok
    limits = DecodeLimits(tok.bos_id, tok.eos_id, data.src_tok.pad_id)
    batch = heldout_batches(data, n)[0]
    out = [tok.decode(ids) for ids in greedy_decode(model, batch.src, limits).tolist()]
    sources = [data.src_tok.decode(ids) for ids in data.heldout.src[:n]]
    return "\n".join(f"{s:<44} -> {o:<12} (reference {r})"
                     for s, o, r in zip(sources, out, data.references))


# --- the character language model -------------------------------------------------------------

@dataclass
class LMSettings:
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    n_layers: int = 2
    activation: str = "gelu"
    norm: str = "layernorm"
    position: str = "learned"
    qk_norm: str = "none"  # none | head: each query and key head normalized (with `norm`)
    block_size: int = 64  # training window, in characters
    max_positions: int = 64  # positions the model can encode (>= the longest evaluated window)
    batch_size: int = 16
    steps: int = 300
    lr: float = 3e-3
    warmup: int = 30
    eval_batches: int = 8  # held-out batches of block_size windows
    log_every: int = 10
    train: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (optimizer, ...)


@dataclass
class LMData:
    tokenizer: Tokenizer
    train_ids: Tensor  # (N,)
    val_ids: Tensor  # (N_val,): the last 10% of the corpus


@functools.lru_cache(maxsize=1)
def lm_data() -> LMData:
    """The embedded pydoc corpus, characters; the last 10% is held out."""
    train_text, val_text = split_text(pydoc_corpus(), 0.1)
    tok = Tokenizer.train("char", [train_text])
    return LMData(tok, as_token_tensor(tok.encode(train_text), tok.vocab_size),
                  as_token_tensor(tok.encode(val_text), tok.vocab_size))


def lm_model(s: LMSettings, vocab_size: int, seed: int) -> CausalLM:
    """A small pre-norm decoder-only model, GPT-2 style except for the fields the settings set."""
    torch.manual_seed(seed)
    cfg = CausalLMConfig(vocab_size=vocab_size, d_model=s.d_model, n_heads=s.n_heads, d_ff=s.d_ff,
                         n_layers=s.n_layers, activation=s.activation, norm=s.norm, position=s.position,
                         max_positions=s.max_positions, dropout=0.0, bias=False, qk_norm=s.qk_norm)
    return build_causal_lm(cfg)


def lm_loss_sum(model: nn.Module, batch) -> Tensor:
    """Summed next-token cross-entropy over every position, with the causal mask."""
    return token_cross_entropy(model(batch.x).logits, batch.y, None)


def train_lm(model: nn.Module, s: LMSettings, data: LMData, seed: int,
             loss_sum: Callable[[nn.Module, object], Tensor] = lm_loss_sum) -> TrainLog:
    windows = LMWindows(data.train_ids, s.block_size, s.batch_size, batches_per_epoch=1000, seed=seed)
    return train_steps(model, endless(windows.epoch), loss_sum, s.steps, s.lr, s.warmup, s.log_every,
                       **s.train)


@torch.no_grad()
def lm_loss_by_position(model: nn.Module, data: LMData, length: int, batch_size: int,
                        n_batches: int) -> Tensor:
    """(length,) mean held-out loss at each position of windows `length` characters long
    (evenly spaced, non-overlapping windows of the validation split)."""
    totals, count = torch.zeros(length), 0
    with eval_mode(model):
        for batch in validation_batches(data.val_ids, length, batch_size, n_batches):
            logits = model(batch.x).logits  # (B, T, V)
            per_token = nn.functional.cross_entropy(logits.transpose(1, 2).float(), batch.y,
                                                    reduction="none")  # (B, T)
            totals += per_token.sum(0)
            count += batch.x.size(0)
    return totals / count


def lm_val_loss(model: nn.Module, data: LMData, s: LMSettings) -> float:
    """Held-out loss per character at the training length."""
    return float(lm_loss_by_position(model, data, s.block_size, s.batch_size, s.eval_batches).mean())
