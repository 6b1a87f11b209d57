"""fingerprint.max_error, the comparison a search makes for every set of mistakes it tries: its few
operations without NaN give what the NaN's rules give (a NaN in both agrees, in one only is inf, the
rows not compared are left out), on every form of rows its callers hand it."""

from __future__ import annotations

import math

import pytest
import torch

from handformer.check.core.fingerprint import _max_error_nan, max_error

B, T, D = 2, 4, 3


def cases():
    a = torch.randn(B, T, D, generator=torch.Generator().manual_seed(0))
    b = a + 1e-3 * torch.arange(B * T * D, dtype=a.dtype).view(B, T, D)  # the largest in the last row
    one_nan, both_nan, inf = a.clone(), a.clone(), a.clone()
    one_nan[1, 3, 0] = math.nan  # in the last row only
    both_nan[:, 0] = math.nan
    inf[0, 1, 2] = math.inf
    hidden = torch.tensor([[True, True, True, False], [True, True, True, False]])  # (B, T)
    for rows in (None, hidden, hidden[:, None], torch.zeros(B, T, dtype=torch.bool), torch.tensor([True] * T)):
        yield a, b.double(), rows
        yield one_nan, b, rows
        yield both_nan, both_nan.clone(), rows
        yield both_nan, b, rows
        yield inf, inf.clone(), rows  # inf - inf: NaN, as inf
        yield inf, b, rows
    yield a[:, -1:], b[:, -1:], hidden[:, -1:]  # the last position's logits (B, 1, V) alone


def test_max_error_is_the_nan_rules_on_every_case():
    seen = []
    for a, b, rows in cases():
        fast, rules = max_error(a, b, rows), _max_error_nan(a, b, rows if rows is None or rows.dim() < 3 else rows[:, 0])
        assert fast == rules, (a, b, rows, fast, rules)
        seen.append(fast)
    assert {0.0, math.inf} < set(seen) and any(0 < e < math.inf for e in seen)  # each kind of answer met
    assert max_error(torch.ones(2, 3), torch.ones(3, 2)) == math.inf
    with pytest.raises(RuntimeError):  # rows that do not expand to the output's are refused, never broadcast
        max_error(torch.ones(B, T, D), torch.zeros(B, T, D), torch.ones(3, B, T, dtype=torch.bool)[:, :, None])
