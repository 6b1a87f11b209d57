"""The tutorials' claims as measured experiments: `handformer experiment NAME`.

Each module here is one experiment (its variants, its metrics, how one variant trains under one
seed); `runner.py` runs every variant under every seed and writes the table and the plot;
`workloads.py` holds the two small training jobs they share. The switches that only make sense as
a lesson (no 1/sqrt(d_k), no causal mask) live in the experiments, never in the model configs.
"""

from __future__ import annotations

from handformer.experiments import (
    activations,
    layernorm_vs_rmsnorm,
    muon,
    no_causal_mask,
    no_positions,
    no_scaling,
    positions,
    post_vs_pre_norm,
    qk_norm,
)
from handformer.experiments.runner import Experiment

EXPERIMENTS: dict[str, Experiment] = {m.EXPERIMENT.name: m.EXPERIMENT for m in (
    post_vs_pre_norm, layernorm_vs_rmsnorm, activations, no_scaling, no_positions, no_causal_mask,
    positions, muon, qk_norm)}


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} "
                         "(handformer experiment list)")
    return EXPERIMENTS[name]
