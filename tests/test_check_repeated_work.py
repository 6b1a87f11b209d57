"""Work a check does once, not again for every pair it tries, with the same answers
(handformer/check/core/localize.py, stacked.py):

- a reshape left without its permute (`_unpermuted`): a view's values as they lie in memory are compared
  with the learner's tensor once for that view, not once for every other view of as many values;
- a residual sum's operand that holds the wrong sub-step (`_wrong_operand`): the views are compared only
  until the first one it holds, and the first one the sum wants, is found;
- a module's parameters read as stacked projections (`stacked.reading`): the forward's source is read
  only for a 3-D parameter of 2 to 4 matrices, the one shape such a stack has.

No check is run: each test calls the function with tensors of its own, counting the comparisons.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import handformer.check.core.localize as L
from handformer.check.core import stacked

B, T, H, DH = 2, 3, 2, 4
D = H * DH


@pytest.fixture
def counted(monkeypatch):
    """localize.same, each call's first argument's shape recorded."""
    calls, same = [], L.same

    def counting(t, r, *args, **kwargs):
        calls.append(tuple(t.shape))
        return same(t, r, *args, **kwargs)

    monkeypatch.setattr(L, "same", counting)
    return calls


def heads_views(n_others: int):
    """The reference's heads (B, H, T, Dh), the heads merged back (B, T, D), and other sub-steps of
    (B, T, D); the learner's tensor: the heads reshaped to (B * T, D) without the transpose."""
    g = torch.Generator().manual_seed(0)
    merged = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    heads = merged.view(B, T, H, DH).transpose(1, 2)  # (B, H, T, Dh)
    others = [(f"sub-step {i}", torch.randn(B, T, D, generator=g, dtype=torch.float64)) for i in range(n_others)]
    views = [("the heads", heads), *others, ("the heads merged", merged)]
    return heads.reshape(B * T, D), views


def test_a_reshape_without_its_permute_is_found_with_its_layout_compared_once(counted):
    t, views = heads_views(n_others=6)
    form = L._unpermuted(t, views)
    assert form is not None and "the heads reshaped to (6, 8) as it lies in memory" in form["en"]
    assert "(the heads merged is (2, 3, 8))" in form["en"], form["en"]
    # the heads as they lie in memory, once; then the 23 other orders of their 4 axes against each of the
    # 7 (B, T, D) views up to the one that holds them (the merge, last)
    assert counted.count((B * T, D)) == 1, counted
    assert len(counted) <= 1 + 23 * 7, len(counted)


def test_a_reshape_compared_once_per_view_whatever_the_views_beside_it(counted):
    """Twelve more (B, T, D) views beside it add their own comparisons, not one more of the heads' layout
    for each of them."""
    t, views = heads_views(n_others=1)
    L._unpermuted(t, views)
    few = len(counted)
    counted.clear()
    t, views = heads_views(n_others=13)
    assert L._unpermuted(t, views) is not None
    assert counted.count((B * T, D)) == 1, counted  # the heads as they lie in memory, compared once
    assert len(counted) - few <= 12 * 23, (few, len(counted))


def test_a_tensor_in_no_views_layout_is_no_unpermuted_reshape(counted):
    t, views = heads_views(n_others=3)
    assert L._unpermuted(torch.randn(B * T, D, dtype=torch.float64), views) is None
    assert counted == [(B * T, D)]  # the heads as they lie in memory alone: no other reading is tried


def test_a_sum_of_the_normed_input_names_the_operand_comparing_until_the_first_view_it_holds(
        tmp_path, counted):
    """Raschka's `shortcut = x` saved after the norm: `shortcut` holds the normed input where the sum
    wants the input; the views after the one it holds are never compared with it."""
    path = tmp_path / "block.py"
    path.write_text("def block(x, norm, attn):\n    shortcut = norm(x)\n    x = attn(shortcut)\n"
                    "    x = x + shortcut\n    return x\n")
    g = torch.Generator().manual_seed(1)
    x, normed, attn = (torch.randn(B, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    later = [(f"later sub-step {i}", torch.randn(B, T, D, generator=g, dtype=torch.float64)) for i in range(8)]
    views = [("the input x", x), ("the norm before attention", normed), ("attention", attn),
             ("x + attention", x + attn), *later]
    before = [L.Step(2, "shortcut", normed), L.Step(3, "x", attn)]
    step = L.Step(4, "x", attn + normed)
    found = L._wrong_operand(before, step, views, str(path))
    assert found is not None and found.line == 2
    assert found.form["en"] == "`shortcut` holds the norm before attention where the sum wants the input x"
    assert found.form.get("mistake") == "residual_from_normed"
    held = counted.index((B, T, D))  # the first comparison: shortcut against the input x
    assert held == 0 and len(counted) < 2 + len(views) * 2, len(counted)


class Fused(nn.Module):
    """modded-nanogpt's qkv_w (3, D, D), flattened to one (3D, D) projection, beside plain layers."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv_w = nn.Parameter(torch.randn(3, D, D))
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        return self.out(self.norm(x) @ self.qkv_w.flatten(end_dim=1).T)


def test_a_forwards_source_is_read_only_for_a_stack_of_matrices(monkeypatch):
    read, source = [], stacked._forward_source
    monkeypatch.setattr(stacked, "_forward_source", lambda sub: read.append(type(sub).__name__) or source(sub))
    module = Fused()
    assert stacked.unstack_(module) == ["qkv_w"]
    assert read == ["Fused"]  # the stack's module, once; never the norm's nor the linear layer's
    assert module.parametrizations.qkv_w.original.shape == (3 * D, D)  # held as one projection
