"""Sinusoidal vs learned vs rotary (RoPE) positions on the character LM, on text longer than the
training windows.

Every model trains on windows of B characters with room for 4B positions (max_positions = 4B),
then is scored on held-out windows of B, 2B and 4B characters. The tutorials' claims: sinusoidal
encodings are a fixed function, so they "can extrapolate" to longer sequences; learned positions
have no trained vector past B; RoPE encodes relative distance, so attention scores depend on
how far apart two tokens are, not where they are.

Measured: the mean held-out loss per character at each length, and the loss at each position of
the 4B windows (averaged over buckets of positions) to show where it breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from handformer.experiments.runner import Experiment, Metric, Plot, SmokeClaim, Trial
from handformer.experiments.workloads import LMSettings, lm_data, lm_loss_by_position, lm_model, train_lm


@dataclass
class Settings:
    model: LMSettings  # block_size is B; max_positions is set to 4B
    bucket: int  # positions averaged together in the loss-by-position curve


FULL = Settings(LMSettings(block_size=64, steps=400), bucket=8)
SMOKE = Settings(LMSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1, block_size=8, batch_size=4, steps=3,
                            eval_batches=1, log_every=1), bucket=4)

VARIANTS = {"sinusoidal": "sinusoidal", "learned": "learned", "RoPE": "rope"}
LENGTHS = (1, 2, 4)  # evaluated window lengths, in multiples of B


def run_trial(variant: str, seed: int, settings: Settings) -> Trial:
    B = settings.model.block_size
    s = replace(settings.model, position=VARIANTS[variant], max_positions=4 * B)
    data = lm_data()
    model = lm_model(s, data.tokenizer.vocab_size, seed)
    log = train_lm(model, s, data, seed)
    metrics = {"train_loss": log.final_loss}
    curves = {"train": log.curve}
    if log.diverged_at is None:
        for k in LENGTHS:
            # as many windows at every length: the same number of batches
            by_position = lm_loss_by_position(model, data, k * B, s.batch_size, s.eval_batches)  # (kB,)
            metrics[f"val_{k}B"] = float(by_position.mean())
        buckets = by_position.view(-1, settings.bucket).mean(-1)  # (4B / bucket,): the 4B windows
        curves["by_position"] = [((i + 0.5) * settings.bucket, float(v)) for i, v in enumerate(buckets)]
    return Trial(variant, seed, metrics, curves)


EXPERIMENT = Experiment(
    name="positions",
    title="Sinusoidal vs learned vs RoPE positions, trained at B = 64, scored at B, 2B, 4B (character LM)",
    claim="learned positions cannot go past the training length; sinusoidal and RoPE extrapolate",
    variants=list(VARIANTS),
    metrics=[Metric("train_loss", "final training loss"), Metric("val_1B", "held-out loss at B"),
             Metric("val_2B", "at 2B"), Metric("val_4B", "at 4B")],
    plots=[Plot("train", "training loss (windows of B)"),
           Plot("by_position", "held-out loss at each position of 4B windows", x_label="position",
                x_marker=FULL.model.block_size)],
    run_trial=run_trial,
    settings={"full": FULL, "smoke": SMOKE},
    smoke_claims=[SmokeClaim("train_loss", "learned", "sinusoidal", held=10)],
)
