"""localize.py's `Matches` (the views of each shape stacked once, a value compared with all of them at
once) says what `same` says with each view: for a value of each shape the views have, one of no
view's shape, a number (0-dim), a masked -inf, a NaN; and a departing step is found the same way."""

from __future__ import annotations

import math

import torch

from handformer.check.core.localize import Matches, same


def _views() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    masked = a.clone()
    masked[0, 0, 1:] = -math.inf
    return [("a", a), ("a twice", 2 * a), ("masked", masked), ("a number", torch.tensor(1.5, dtype=torch.float64)),
            ("rows", a.sum(-1)), ("float32", a[0].float())]


def test_matches_says_what_same_says_with_each_view():
    views = _views()
    a, masked = views[0][1], views[2][1]
    filled = masked.masked_fill(masked.isinf(), -1e9)  # a -1e9 fill where the reference has -inf
    nan = a.clone()
    nan[1, 2, 3] = math.nan
    values = [a, 2 * a, a + 1e-9, a + 1e-3, filled, nan, a.float(), torch.tensor(1.5), torch.tensor(2.0),
              a.sum(-1), a.sum(-1) + 1, a[0].double(), a[0] + 1, torch.zeros(5), a.reshape(6, 4)]
    matches = Matches(views)
    said = [matches(t) for t in values]
    assert said == [any(same(t, r) for _, r in views) for t in values]
    assert said == [True, True, True, False, True, False, True, True, False, True, False, True, False, False,
                    False]


def test_a_part_handed_the_wrong_input_is_found_by_the_wider_views():
    from torch import nn

    from handformer.check.core.localize import fed_wrong

    g = torch.Generator().manual_seed(1)
    mlp = nn.Linear(4, 4).double()
    x, normed = torch.randn(2, 3, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g,
                                                                                  dtype=torch.float64)
    with torch.no_grad():
        right = mlp(normed)
    part = (mlp, (x,), {})  # their mlp handed x where the reference's reads the norm
    views = [("x", x), ("the norm", normed), ("a row", normed[0])]
    assert fed_wrong(part, views, [("the attention", 2 * x), ("mlp(the norm)", right)])
    assert not fed_wrong(part, views, [("the attention", 2 * x), ("mlp(the norm) by 2", 2 * right)])
    assert not fed_wrong(part, views, [("a row of mlp(the norm)", right[0])])  # no view of its shape
