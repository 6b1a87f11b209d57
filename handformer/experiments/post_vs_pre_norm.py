"""Post-norm (the paper) vs pre-norm (GPT-2, Llama), at the demo's depth (2 + 2 layers) and in a
deep narrow stack (6 + 6 = 12 layers, the paper's depth), each with and without warmup.

    post-norm:  x = norm(x + sublayer(x))     pre-norm:  x = x + sublayer(norm(x))

The tutorials' claim: post-norm puts a norm on the residual path, so gradients reaching the early
layers of a deep stack are badly scaled at the start and it needs warmup; pre-norm keeps an
identity path from the loss to every layer and trains without it. Measured on the dates task.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from handformer.experiments.runner import Experiment, Metric, Plot, SmokeClaim, Trial
from handformer.experiments.workloads import DatesSettings, dates_data, dates_model, dates_scores, train_dates


@dataclass
class Settings:
    demo: DatesSettings  # the demo's depth (2 + 2 layers), narrower
    deep: DatesSettings  # 6 + 6 = 12 narrow layers (the paper's depth, N = 6)
    warmup: int  # warmup steps of the "warmup" variants (the others start at the peak rate)


FULL = Settings(demo=DatesSettings(d_model=64, n_heads=4, d_ff=256, n_layers=2, steps=300),
                deep=DatesSettings(d_model=32, n_heads=2, d_ff=128, n_layers=6, steps=300),
                warmup=60)
SMOKE = Settings(demo=DatesSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1, steps=3, n_train=300,
                                    n_eval=8, max_tokens=256, log_every=1),
                 deep=DatesSettings(d_model=16, n_heads=2, d_ff=32, n_layers=2, steps=3, n_train=300,
                                    n_eval=8, max_tokens=256, log_every=1),
                 warmup=2)

# variant -> (norm placement, depth, with warmup)
VARIANTS = {f"{placement}, {depth}, {'warmup' if warm else 'no warmup'}": (placement, depth, warm)
            for depth in ("2+2", "6+6") for placement in ("post", "pre") for warm in (True, False)}


def run_trial(variant: str, seed: int, settings: Settings) -> Trial:
    placement, depth, warm = VARIANTS[variant]
    s = settings.demo if depth == "2+2" else settings.deep
    s = replace(s, norm_placement=placement, warmup=settings.warmup if warm else 0)
    data = dates_data(s.n_train, s.n_eval)
    model = dates_model(s, data, seed)
    log = train_dates(model, s, data, seed)
    metrics = {"train_loss": log.final_loss}
    if log.diverged_at is None:
        metrics.update(dates_scores(model, data))
    curve_key = "demo" if depth == "2+2" else "deep"
    return Trial(variant, seed, metrics, {curve_key: log.curve})


EXPERIMENT = Experiment(
    name="post-vs-pre-norm",
    title="Post-norm vs pre-norm, with and without warmup (dates task)",
    claim="post-norm needs learning-rate warmup and fails to train deep stacks without it; "
          "pre-norm trains at any depth without warmup",
    variants=list(VARIANTS),
    metrics=[Metric("train_loss", "final training loss"), Metric("val_loss", "held-out loss"),
             Metric("exact_match", "held-out exact match", "{:.1f}", percent=True)],
    plots=[Plot("demo", "training loss, 2 + 2 layers (the demo's depth), d_model 64", log_y=True),
           Plot("deep", "training loss, 6 + 6 = 12 layers (the paper's depth), d_model 32", log_y=True)],
    run_trial=run_trial,
    settings={"full": FULL, "smoke": SMOKE},
    smoke_claims=[SmokeClaim("val_loss", "post, 6+6, warmup", "post, 6+6, no warmup", held=10)],
)
