"""Linear maps kept in another form are mapped (check/core/stacked.py, gains.py), and what is not
mapped is named by its form.

- q, k, v weights stacked in one Parameter (3, D, D): flattened through F.linear
  (tests/fixtures/learners_stacked_qkv/) or split and multiplied from the right, x @ W[i]
  (tests/fixtures/learners_stacked_right/): read as one fused (3D, D) projection.
- LayerScale, a per-channel gain on each sublayer's output, as a module (ls1 = LayerScale(d)) or a
  bare Parameter (self.gamma_1 * ...): folded into the output projections' rows, said as a convention.
- Each correct file PASSes with its attention, block (and model) checked; each plant FAILs, named or
  at its line. A depthwise convolution, routed experts and a stack in a form not read are named as
  what they are; so are an attention of queries alone and a model whose blocks are not all alike
  (cross-layer KV sharing: the second layer of a pair has wq and wo alone).
"""

from pathlib import Path

import pytest
import torch
from helpers import assert_failed_at, component
from torch import nn

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.weights import MappingError, leaves, norm_slots

FIXTURES = Path(__file__).parent / "fixtures"
FLAT, RIGHT = FIXTURES / "learners_stacked_qkv", FIXTURES / "learners_stacked_right"


@pytest.fixture(scope="module", params=[FLAT, RIGHT], ids=["flattened", "right_multiplied"])
def correct(request):
    return request.param, check_file(str(request.param / "correct.py"))


def test_a_stacked_qkv_and_layerscale_pass_with_every_component_checked(correct):
    folder, result = correct
    assert result.components and all(c.status == "pass" for c in result.components), format_report(result)
    block = component(result, "Block")
    weights = ", ".join(block.mapping)
    stack, gain = {FLAT: ("attn.qkv_weight[0] -> W_Q", "ls1 * attn.proj -> W_O"),
                   RIGHT: ("attn.W[0].T -> W_Q", "gamma_1 * attn.out_proj -> W_O")}[folder]
    assert stack in weights and gain in weights, weights
    assert any("folded into the rows" in n["en"] for n in block.notes), format_report(result)


def test_the_model_of_stacked_blocks_with_bare_gains_passes(correct):
    folder, result = correct
    if folder == RIGHT:
        assert component(result, "GPT").status == "pass", format_report(result)


@pytest.fixture(scope="module")
def unscaled():
    return check_file(str(FLAT / "p_no_scaling.py"), skip=["FeedForward", "Block"])


def test_a_mistake_in_an_attention_of_stacked_weights_is_named(unscaled):
    assert_failed_at(unscaled, "no_scaling", "att = q @ k.transpose(-2, -1)")


@pytest.fixture(scope="module")
def gain_on_input():
    return check_file(str(RIGHT / "p_gain_on_input.py"), skip=["Attention", "MLP", "GPT"])


def test_a_gain_on_the_wrong_side_of_its_sublayer_fails_at_its_line(gain_on_input):
    assert_failed_at(gain_on_input, "", "x = x + self.mlp(self.gamma_2 * self.ln_2(x))")


def _unmapped_reason(module: nn.Module) -> str:
    with pytest.raises(MappingError) as err:
        leaves(module)
    return str(err.value)


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, 6))

    def forward(self, x, router_logits):
        top = router_logits.topk(2, dim=-1).indices
        return torch.einsum("btd,btkfd->btkf", x, self.w[top])


class EinsumStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 6, 6))
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x):
        return torch.einsum("btd,sed->sbte", x, self.w) * self.scale


def test_what_is_not_mapped_is_named_by_its_form():
    conv = _unmapped_reason(nn.Conv1d(6, 6, 4, groups=6))
    assert "a depthwise convolution (Conv1d, kernel 4" in conv and "experts" not in conv
    assert "mixture of experts" in _unmapped_reason(Experts())
    stack = _unmapped_reason(EinsumStack())
    assert "stacked projections (w (3, 6, 6)" in stack and "experts" not in stack


class Hybrid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm1_post, self.norm2 = nn.LayerNorm(4), nn.LayerNorm(4), nn.LayerNorm(4)


def test_a_norm_after_a_sublayer_is_named_as_what_the_block_has_not():
    with pytest.raises(MappingError) as err:
        norm_slots(leaves(Hybrid()), 2, ["self-attention", "FFN"], "Block")
    assert str(err.value).startswith("Block: norm1_post (4,): a norm after a sublayer's output"), err.value


class QueriesOnly(nn.Module):
    """The second layer of a cross-layer KV pair: its keys and values are another layer's."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.wq, self.wo = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)


class Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attention = QueriesOnly(d)


def test_an_attention_of_queries_alone_and_blocks_not_alike_are_named():
    from handformer.check.core.weights import attention_slots, of_kind
    from handformer.check.runners.gpt import _all_blocks

    with pytest.raises(MappingError) as err:
        attention_slots(of_kind(leaves(QueriesOnly(8)), "linear"), 8, 1, "Attention")
    assert "a query and an output projection alone (wq (8, 8), wo (8, 8))" in str(err.value)
    model = nn.Module()
    model.layers = nn.ModuleList([Layer(8), Layer(8)])  # the first read as a block, the second not
    with pytest.raises(MappingError) as err:
        _all_blocks(model, [("layers.0", model.layers[0])])
    assert "check reads no attention in layers.1 (layers.1.attention.wq (8, 8)" in str(err.value)
    _all_blocks(model, [("layers.0", model.layers[0]), ("layers.1", model.layers[1])])  # all read: none
