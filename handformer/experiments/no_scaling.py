"""Attention without the 1/sqrt(d_k) scaling, at a large head dim (dates task, one head of 128).

    scaled:    softmax(Q K^T / sqrt(d_k)) V      (the paper, equation 1)
    unscaled:  softmax(Q K^T) V

The tutorials' claim: with unit-variance queries and keys, q.k has variance d_k, so unscaled
scores grow with the head dim, the softmax saturates (one weight near 1, the rest near 0), its
gradient vanishes and training suffers. Measured: the mean entropy of the attention rows (nats),
the share of rows whose largest weight is >= 0.99 (saturated), both at initialisation and after
training, and the loss.

The unscaled model is a lesson, not a configuration: `remove_scaling` multiplies every query by
sqrt(d_k) (a forward hook on `q_proj`), which cancels the division inside attention. Models that
users train have no such switch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from handformer.experiments.runner import Experiment, Metric, Plot, SmokeClaim, Trial
from handformer.experiments.workloads import (
    DatesData,
    DatesSettings,
    dates_data,
    dates_model,
    dates_scores,
    heldout_batches,
    train_dates,
)
from handformer.modes import eval_mode
from handformer.nn.attention import MultiHeadAttention

SATURATED = 0.99  # a row whose largest attention weight reaches this is counted as saturated


@dataclass
class Settings:
    model: DatesSettings


FULL = Settings(DatesSettings(d_model=128, n_heads=1, d_ff=256, n_layers=2, steps=300))
SMOKE = Settings(DatesSettings(d_model=16, n_heads=1, d_ff=32, n_layers=1, steps=3, n_train=300, n_eval=8,
                               max_tokens=256, log_every=1))

VARIANTS = ("scaled (1/sqrt(d_k))", "unscaled")


def remove_scaling(model: nn.Module) -> None:
    """Make every attention compute softmax(Q K^T) V: queries times sqrt(d_k), which the
    1/sqrt(d_k) inside `scaled_dot_product_attention` then cancels."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            factor = math.sqrt(module.head_dim)
            module.q_proj.register_forward_hook(lambda _mod, _inp, out, f=factor: out * f)


@torch.no_grad()
def attention_stats(model: nn.Module, data: DatesData) -> tuple[float, float]:
    """(mean entropy in nats, share of saturated rows) over every attention row of every layer
    (encoder self, decoder self, cross) for the real (non-pad) queries of 100 held-out dates."""
    batch = heldout_batches(data, 100)[0]
    pad = data.src_tok.pad_id
    with eval_mode(model):
        out = model(batch.src, batch.tgt_in, need_weights=True)
    entropies, peaks = [], []
    for maps, queries in ((out.encoder_attentions, batch.src != pad),
                          (out.decoder_attentions, batch.tgt_in != pad),
                          (out.cross_attentions, batch.tgt_in != pad)):
        for w in maps:  # (B, H, T, S)
            rows = queries[:, None, :].expand(w.shape[:-1])  # (B, H, T): real queries
            entropy = -(w * w.clamp_min(1e-30).log()).sum(-1)  # (B, H, T)
            entropies.append(entropy[rows])
            peaks.append(w.max(-1).values[rows])
    peak = torch.cat(peaks)
    return float(torch.cat(entropies).mean()), float((peak >= SATURATED).float().mean())


def run_trial(variant: str, seed: int, settings: Settings) -> Trial:
    s = settings.model
    data = dates_data(s.n_train, s.n_eval)
    model = dates_model(s, data, seed)
    if variant == "unscaled":
        remove_scaling(model)
    entropy_init, saturated_init = attention_stats(model, data)
    log = train_dates(model, s, data, seed)
    metrics = {"train_loss": log.final_loss, "entropy_init": entropy_init, "saturated_init": saturated_init}
    if log.diverged_at is None:
        metrics.update(dates_scores(model, data))
        metrics["entropy"], metrics["saturated"] = attention_stats(model, data)
    return Trial(variant, seed, metrics, {"train": log.curve})


EXPERIMENT = Experiment(
    name="no-scaling",
    title="Attention with and without 1/sqrt(d_k), head dim 128 (dates task)",
    claim="without 1/sqrt(d_k) the scores grow with d_k, the softmax saturates (low entropy), "
          "gradients vanish and the loss suffers",
    variants=VARIANTS,
    metrics=[Metric("entropy_init", "entropy at init (nats)"),
             Metric("saturated_init", "saturated rows at init", "{:.1f}", percent=True),
             Metric("entropy", "entropy trained (nats)"),
             Metric("saturated", "saturated rows trained", "{:.1f}", percent=True),
             Metric("train_loss", "final training loss"), Metric("val_loss", "held-out loss"),
             Metric("exact_match", "held-out exact match", "{:.1f}", percent=True)],
    plots=[Plot("train", "training loss", log_y=True)],
    run_trial=run_trial,
    settings={"full": FULL, "smoke": SMOKE},
    smoke_claims=[SmokeClaim("entropy_init", "unscaled", "scaled (1/sqrt(d_k))", held=10),
                  SmokeClaim("saturated_init", "scaled (1/sqrt(d_k))", "unscaled", held=10)],
)
