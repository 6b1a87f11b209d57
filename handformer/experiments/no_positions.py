"""The dates task with and without positional encoding.

The tutorials' claim: attention by itself has no notion of order. Without positions the encoder is
permutation-equivariant: shuffle the source tokens and its outputs are shuffled the same way, so
the decoder, which reads them through cross-attention (a weighted sum over an unordered set),
sees a bag of tokens. "march 12, 1921" and "march 21, 1912" become the same input once a source
is tokenized into pieces that can swap places; exact match collapses.

Measured: held-out exact match and which field (year, month, day) goes wrong; the encoder's
permutation gap (how much the encoder output of a shuffled source differs from the shuffled
output; zero means it cannot see order); and the share of held-out sources whose bag of tokens
equals that of another date (any date from 1900 to 2099 in any of the six styles: "19 5 2" and
"19 2 5" are one bag), which no order-blind encoder can tell apart. The decoder keeps its causal
mask, which lets it count its own positions, so it can still write "YYYY-MM-DD" in the right shape.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass, replace

import torch
from torch import nn

from handformer.data.dates import FIRST, N_DAYS, N_STYLES, render
from handformer.experiments.runner import Experiment, Metric, Plot, SmokeClaim, Trial
from handformer.experiments.workloads import (
    DatesData,
    DatesSettings,
    dates_data,
    dates_model,
    dates_outputs,
    dates_scores,
    train_dates,
)
from handformer.modes import eval_mode


@dataclass
class Settings:
    model: DatesSettings
    every_date: bool  # ambiguity against every date in every style (else: the training sources)


FULL = Settings(DatesSettings(d_model=64, n_heads=4, d_ff=256, n_layers=2, steps=300), every_date=True)
SMOKE = Settings(DatesSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1, steps=3, n_train=300, n_eval=8,
                               max_tokens=256, log_every=1), every_date=False)

VARIANTS = {"sinusoidal positions": "sinusoidal", "no positions": "none"}


@torch.no_grad()
def permutation_gap(model: nn.Module, data: DatesData, n: int = 20, seed: int = 0) -> float:
    """max |encode(shuffled source) - shuffled(encode(source))| / max |encode(source)| over the
    first n held-out sources, each shuffled by a fixed random permutation."""
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    with eval_mode(model):
        for ids in data.heldout.src[:n]:
            src = torch.tensor([ids])  # (1, S)
            perm = torch.randperm(src.size(1), generator=g)
            memory = model.encode(src)[0]  # (1, S, D)
            shuffled = model.encode(src[:, perm])[0]  # (1, S, D)
            worst = max(worst, float((shuffled - memory[:, perm]).abs().max() / memory.abs().max()))
    return worst


@functools.lru_cache(maxsize=2)
def ambiguous_share(data: DatesData, every_date: bool) -> float:
    """Share of held-out sources whose multiset of tokens is also that of another date: an encoder
    that cannot see order cannot tell the two apart. every_date: compare with every date from
    1900 to 2099 in every style (438k sources, seconds); else with the training sources only."""
    if every_date:
        days = [FIRST + datetime.timedelta(days=i) for i in range(N_DAYS)]
        sources = [render(day, style) for day in days for style in range(N_STYLES)]
        refs = (day.isoformat() for day in days for _ in range(N_STYLES))
        others = zip(data.src_tok.encode_batch(sources), refs)
        # the encoded held-out sources end in EOS, these do not
        held = [(src[:-1], ref) for src, ref in zip(data.heldout.src, data.references)]
    else:
        others = zip(data.train.src, (data.tgt_tok.decode(t) for t in data.train.tgt))
        held = list(zip(data.heldout.src, data.references))
    meanings: dict[tuple[int, ...], set[str]] = {}
    for src, ref in others:
        meanings.setdefault(tuple(sorted(src)), set()).add(ref)
    clashes = sum(bool(meanings.get(tuple(sorted(src)), set()) - {ref}) for src, ref in held)
    return clashes / len(held)


def run_trial(variant: str, seed: int, settings: Settings) -> Trial:
    s = replace(settings.model, position=VARIANTS[variant])
    data = dates_data(s.n_train, s.n_eval)
    model = dates_model(s, data, seed)
    log = train_dates(model, s, data, seed)
    metrics = {"train_loss": log.final_loss, "ambiguous": ambiguous_share(data, settings.every_date)}
    notes = {}
    if log.diverged_at is None:
        metrics.update(dates_scores(model, data))
        metrics["permutation_gap"] = permutation_gap(model, data)
        if seed == 0:
            notes["held-out outputs"] = dates_outputs(model, data)
    return Trial(variant, seed, metrics, {"train": log.curve}, notes)


EXPERIMENT = Experiment(
    name="no-positions",
    title="Dates task with and without positional encoding",
    claim="without positional encoding the model cannot order the digits: exact match collapses",
    variants=list(VARIANTS),
    metrics=[Metric("val_loss", "held-out loss"),
             Metric("exact_match", "exact match", "{:.1f}", percent=True),
             Metric("year", "year right", "{:.1f}", percent=True),
             Metric("month", "month right", "{:.1f}", percent=True),
             Metric("day", "day right", "{:.1f}", percent=True),
             Metric("permutation_gap", "encoder permutation gap", "{:.2g}"),
             Metric("ambiguous", "held-out sources with an ambiguous bag of tokens", "{:.1f}", percent=True)],
    plots=[Plot("train", "training loss", log_y=True)],
    run_trial=run_trial,
    settings={"full": FULL, "smoke": SMOKE},
    smoke_claims=[SmokeClaim("permutation_gap", "no positions", "sinusoidal positions", held=10)],
)
