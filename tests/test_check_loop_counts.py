"""loop_forms.counted_parameter: the parameter a generation loop counts its steps by, read from the
bound of a `for` loop's range(...) or a `while` test, where no parameter is named for a count; "" where
one is, where no int parameter is left, or where no loop reads one."""

from __future__ import annotations

from handformer.check.core.loop_forms import counted_parameter


def by_range(model, idx, budget=8, temperature=1.0):
    for _ in range(budget):
        idx = model(idx)
    return idx


def by_while(model, tokens, n_predict, top_k=5):
    out = list(tokens)
    while len(out) < n_predict + top_k * 0:
        out.append(model(out))
    return out


def by_attribute(model, idx, settings, budget=3):
    for _ in range(settings.budget):  # reads settings.budget, not budget
        idx = model(idx)
    return idx + budget


def named_count(model, idx, max_new_tokens, budget=4):
    for _ in range(budget):
        idx = model(idx)
    return idx


def no_loop(model, idx, budget=2):
    return model(idx) * budget


def test_the_loops_count_is_read_from_its_bound():
    read = [counted_parameter(fn) for fn in (by_range, by_while, by_attribute, named_count, no_loop)]
    assert read == ["budget", "n_predict", "", "", ""]
