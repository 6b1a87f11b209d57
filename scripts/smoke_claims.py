"""How often each direction holds in an experiment's smoke configuration, over 10 seeds.

An experiment declares a smoke claim (handformer/experiments/runner.py: SmokeClaim) only where it
held in at least 9 of the 10 seeds this script runs; the declaration keeps the count, and the
default test run asserts the direction on seed 0.

    python scripts/smoke_claims.py no-scaling            # its declared claims: held in N of 10
    python scripts/smoke_claims.py no-scaling --explore  # every metric, every pair of variants
    python scripts/smoke_claims.py all
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from handformer.experiments import EXPERIMENTS, get_experiment  # noqa: E402
from handformer.experiments.runner import SMOKE_CLAIM_SEEDS, Experiment, SmokeClaim  # noqa: E402


def held(trials: dict[tuple[str, int], dict[str, float]], claim: SmokeClaim, seeds: int) -> int:
    """Seeds where the claim's metric is lower for `lower` than for `higher` (NaN never holds)."""
    return sum(trials[claim.lower, s][claim.metric] < trials[claim.higher, s][claim.metric]
               for s in range(seeds))


def measure(exp: Experiment, seeds: int, explore: bool) -> None:
    settings = exp.settings["smoke"]
    trials = {}
    for seed in range(seeds):
        for variant in exp.variants:
            trials[variant, seed] = exp.run_trial(variant, seed, settings).metrics
    print(f"{exp.name}: {seeds} seeds of the smoke configuration")
    for claim in exp.smoke_claims:
        print(f"  declared {claim.metric}: {claim.lower} < {claim.higher}: held in "
              f"{held(trials, claim, seeds)} of {seeds} (declared {claim.held})")
    if explore:
        for metric in exp.metrics:
            for low, high in itertools.permutations(exp.variants, 2):
                values = [(trials[low, s].get(metric.key, math.nan),
                           trials[high, s].get(metric.key, math.nan)) for s in range(seeds)]
                n = sum(a < b for a, b in values)
                if n >= seeds // 2:
                    print(f"  {metric.key}: {low} < {high}: {n} of {seeds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help="experiments, or all")
    parser.add_argument("--seeds", type=int, default=SMOKE_CLAIM_SEEDS)
    parser.add_argument("--explore", action="store_true", help="every metric and pair of variants")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the test run measures them
    names = list(EXPERIMENTS) if args.names == ["all"] else args.names
    for name in names:
        measure(get_experiment(name), args.seeds, args.explore)


if __name__ == "__main__":
    main()
