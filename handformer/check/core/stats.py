"""The chi-square test of a sampling step: counts of draws against the distribution they should
follow, and how likely the test is to miss a given wrong distribution (its power), both exact enough
to state a false-alarm rate of 1e-6 and a miss rate far below it.

    stat = sum over the support of (count - n p)^2 / (n p),   df = |support| - 1

Under the right distribution, stat follows chi-square(df); under another one, q, a noncentral
chi-square with lambda = n * sum (q - p)^2 / p (the large-n approximation). A draw outside the
support is a failure whatever the statistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ALPHA = 1e-6  # the test's false-alarm rate


def survival(stat: float, df: int) -> float:
    """P(chi-square(df) >= stat)."""
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def critical_value(df: int, alpha: float = ALPHA) -> float:
    """The statistic above which the test rejects at `alpha` (bisection on the survival function)."""
    lo, hi = 0.0, 10.0 * df + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if survival(mid, df) > alpha else (lo, mid)
    return hi


@dataclass
class ChiSquare:
    stat: float
    df: int
    p_value: float
    outside: int  # draws of tokens the distribution gives probability 0

    @property
    def rejected(self) -> bool:
        return self.outside > 0 or self.p_value < ALPHA


def chi_square(counts: Tensor, probs: Tensor) -> ChiSquare:
    """The test of `counts` (V,) of n draws against `probs` (V,)."""
    n = float(counts.sum())
    support = probs > 0
    expected = n * probs[support].double()
    stat = float(((counts[support].double() - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    return ChiSquare(stat, df, survival(stat, df), int(counts[~support].sum()))


def miss_probability(p: Tensor, q: Tensor, n: int, alpha: float = ALPHA) -> float:
    """The chance that n draws from q pass the test against p: no draw outside p's support, and a
    noncentral chi-square statistic (df, lambda) below the critical value."""
    support = p > 0
    outside = float(q[~support].sum())
    none_outside = (1.0 - outside) ** n
    df = int(support.sum()) - 1
    lam = n * float(((q[support] - p[support]) ** 2 / p[support]).sum())
    crit = critical_value(df, alpha)
    half = lam / 2
    top = int(half + 40 * math.sqrt(half + 1) + 100)
    j = torch.arange(top, dtype=torch.float64)
    log_pois = -half + j * math.log(half) - torch.lgamma(j + 1) if half > 0 else torch.where(
        j == 0, 0.0, -math.inf)
    below = torch.special.gammainc(df / 2 + j, torch.full_like(j, crit / 2))  # P(chi2(df + 2j) < crit)
    return none_outside * float((log_pois.exp() * below).sum())
