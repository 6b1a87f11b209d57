"""QK-norm: each query and key head normalized before the scores, the same steps (character LM).

    without:  scores = q k^T / sqrt(d_k)                      q, k as the projections make them
    QK-norm:  scores = norm(q) norm(k)^T / sqrt(d_k)          each head's q and k normalized (the
                                                              model's norm, with a learned gain)

Without it, nothing bounds a score: q and k grow as training pushes the projections, and a few
scores saturate the softmax. Normalized, every query and key has the same length, so the scores
only measure the angle between them (times the gains). Qwen3 and Gemma 3 ship it; the
modded-nanogpt speedrun uses it; the shakespeare speedrun's row 4 is it ([speedrun](speedrun.md)).
Both variants train the same model on the same batches with Muon for the blocks' matrices (the
speedrun's optimizer) and the same warmup and cosine schedule. The claim: QK-norm reaches a lower
loss in the same number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from handformer.experiments.runner import Experiment, Metric, Plot, Trial
from handformer.experiments.workloads import LMSettings, lm_data, lm_model, lm_val_loss, train_lm

MUON = {"optimizer": "muon", "muon_lr": 0.02}


@dataclass
class Settings:
    model: LMSettings


FULL = Settings(LMSettings(steps=400, train=MUON))
SMOKE = Settings(LMSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1, block_size=16, max_positions=16,
                            batch_size=4, steps=3, eval_batches=1, log_every=1, train=MUON))

VARIANTS = ("without", "QK-norm")


def run_trial(variant: str, seed: int, settings: Settings) -> Trial:
    s = replace(settings.model, qk_norm="head" if variant == "QK-norm" else "none")
    data = lm_data()
    model = lm_model(s, data.tokenizer.vocab_size, seed)
    log = train_lm(model, s, data, seed)
    metrics = {"val_loss": lm_val_loss(model, data, s), "train_loss": log.final_loss,
               "step_ms": log.median_step_ms}
    return Trial(variant, seed, metrics, {"train": log.curve})


EXPERIMENT = Experiment(
    name="qk-norm",
    title="QK-norm: queries and keys normalized per head (character LM on the pydoc corpus)",
    claim="QK-norm reaches a lower loss than plain attention in the same number of steps",
    variants=list(VARIANTS),
    metrics=[Metric("val_loss", "held-out loss"), Metric("train_loss", "final training loss"),
             Metric("step_ms", "training step (ms, median)", "{:.1f}", timing=True)],
    plots=[Plot("train", "training loss")],
    run_trial=run_trial,
    settings={"full": FULL, "smoke": SMOKE},
    no_smoke_claim=("3 steps of a 16-wide model are too few for QK-norm to show: its held-out loss is "
                    "the lower one in 6 of 10 seeds"),
)
