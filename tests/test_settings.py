"""The typed setting checkers (handformer/settings.py): bools are not counts, NaN is not a number
>= 0, and each error names the field and what it must be."""

import math

import pytest

from handformer.settings import (
    choice,
    int_at_least,
    is_int,
    is_number,
    non_negative_float,
    non_negative_int,
    positive_int,
)


def test_bools_are_neither_integers_nor_numbers():
    assert [is_int(v) for v in (3, 0, True, 3.0, "3")] == [True, True, False, False, False]
    assert [is_number(v) for v in (3, 0.5, False, "0.5")] == [True, True, False, False]


@pytest.mark.parametrize("check, good, bad, says", [
    (positive_int, 1, 0, "top_k must be a positive integer, got 0"),
    (positive_int, 1, True, "top_k must be a positive integer, got True"),
    (non_negative_int, 0, -1, "top_k must be a non-negative integer, got -1"),
    (non_negative_int, 0, 2.0, "top_k must be a non-negative integer, got 2.0"),
    (non_negative_float, 0.0, math.nan, "top_k must be a number >= 0, got nan"),
    (lambda name, v: int_at_least(name, v, 2), 2, 1, "top_k must be an integer >= 2, got 1"),
    (lambda name, v: choice(name, v, ("a", "b")), "a", "c", "top_k must be one of 'a', 'b', got 'c'"),
])
def test_each_checker_passes_a_good_value_and_names_the_field_of_a_bad_one(check, good, bad, says):
    assert check("top_k", good) == good
    with pytest.raises(ValueError, match="^" + says.replace("(", r"\(").replace(")", r"\)") + "$"):
        check("top_k", bad)


def test_the_decoders_report_a_bad_count_through_the_checkers():
    from handformer.generation.sampling import top_k_filter

    with pytest.raises(ValueError, match="top_k must be a positive integer, got True"):
        top_k_filter(None, True)
