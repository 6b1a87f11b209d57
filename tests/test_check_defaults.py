"""The grader's small helpers for optional values (handformer.check.core.defaults): what each gives
where a value is handed, and where none is."""

from __future__ import annotations

import pytest
import torch

from handformer.check.core import fingerprint as fp
from handformer.check.core.defaults import given, keyword, quietly, then


def test_given_keeps_a_falsy_value_and_fills_none() -> None:
    assert given(0, 5) == 0 and given([], [1]) == [] and given(None, 5) == 5


def test_keyword_is_empty_without_a_name() -> None:
    assert keyword("mask", 1) == {"mask": 1}
    assert keyword(None, 1) == {} and keyword("", 1) == {}


def test_then_acts_on_a_value_and_never_on_none() -> None:
    assert then(0, lambda v: v + 1) == 1 and then([], len) == 0
    assert then(None, lambda v: 1 / 0) is None  # not called: nothing to act on


def test_quietly_catches_only_what_it_is_told() -> None:
    assert quietly(lambda: 3) == 3
    assert quietly(lambda: 1 / 0) is None  # any Exception by default
    assert quietly(lambda: int("x"), ValueError, -1) == -1
    assert quietly(lambda: int("x"), (TypeError, ValueError), []) == []
    with pytest.raises(ValueError):
        quietly(lambda: int("x"), TypeError)


def test_fingerprint_quietly_is_the_same_helper() -> None:
    assert fp.quietly is quietly


def test_a_norm_without_an_eps_takes_its_kinds_default() -> None:
    """norm_eps: the eps a norm keeps, else nn.LayerNorm's 1e-5 for a LayerNorm and nn.RMSNorm's (float32's
    machine eps) for an RMSNorm."""
    from torch import nn

    from handformer.check.core.weights import norm_eps

    assert norm_eps(nn.LayerNorm(2, eps=1e-3), "rmsnorm") == pytest.approx(1e-3)
    assert norm_eps(nn.Linear(2, 2), "layernorm") == 1e-5
    assert norm_eps(nn.Linear(2, 2), "rmsnorm") == torch.finfo(torch.float32).eps
