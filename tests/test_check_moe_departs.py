"""A mixture of experts that FAILs with no catalogued mistake is quoted at the line where it first
parts from the reference (runners/localize_moe.py): the router's softmax over the tokens (dim=0) in
three styles (a Qwen2-MoE-like layer that adds into one tensor with index_add_, minimind's MoEGate
class of its own with an unsorted top-k, Hugging Face's Mixtral), a sum that weights each chosen
expert by the first slot's weight (minimind's unsorted top-k weights are right), and a shared expert scaled by its
gate's raw logits where sigmoid(gate) was meant; a noisy router left on in eval mode is
dropout_in_eval at the line that turns it on. One check run per fixture file, the mixture alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handformer.check.core.engine import check_file
from handformer.check.core.localize import Step
from handformer.check.core.report import format_report
from handformer.check.runners.localize_moe import _last_values

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
PLANTED = {  # file -> (the mixture's name, the diagnosis, the text of the planted line)
    "learners_gated_shared_expert/router_softmax_dim": ("MoE", "departs", "F.softmax(self.router(h), dim=0)"),
    "learners_moe/moe_router_softmax_dim": ("MOEFeedForward", "departs", "scores = logits.softmax(dim=0)"),
    # its top-k weights unsorted (sorted=False) are right: the sum that reads one slot's weight departs
    "learners_moe/moe_first_slot_weight": ("MOEFeedForward", "departs", "topk_weight[token, 0, None]"),
    "learners_mixtral_hf/router_softmax_dim": ("MixtralSparseMoeBlock", "departs",
                                               "F.softmax(router_logits, dim=0, dtype=torch.float)"),
    "learners_gated_shared_expert/no_sigmoid": ("MoE", "departs", "out = out + self.shared_gate(h) * self.shared(h)"),
    "learners_noisy_moe/noise_in_eval": ("MixtureOfExperts", "dropout_in_eval", "if True:"),
}


@pytest.fixture(scope="module", params=sorted(PLANTED))
def planted(request, tmp_path_factory):
    """The fixture checked as a copy in a folder of its own: a fixture folder put on sys.path first
    would hand its correct.py to another test's `from correct import ...`."""
    path = tmp_path_factory.mktemp("moe") / f"{Path(request.param).name}.py"
    path.write_text((FIXTURES / f"{request.param}.py").read_text())
    return check_file(str(path), only=["moe"]), path.read_text().splitlines(), PLANTED[request.param]


def test_a_failing_mixture_is_quoted_at_its_planted_line(planted):
    result, lines, (name, diagnosis, written) = planted
    (comp,) = [c for c in result.components if c.name == name]
    assert comp.status == "fail", format_report(result)
    (finding,) = comp.findings
    assert finding.name == diagnosis and written in lines[finding.line - 1], format_report(result)
    assert written in finding.code, format_report(result)


def test_top_k_weights_are_judged_in_any_order_and_a_loop_by_its_last_sum():
    """A step whose last axis is a reading's k is judged with its rows sorted (top-k weights taken with
    sorted=False, or gathered in the experts' order); of a line's partial sums, the last alone."""
    weights = torch.tensor([[0.2, 0.7], [0.6, 0.1]], dtype=torch.float64)  # (N, K)
    steps = [Step(3, "w", weights), Step(5, "out", torch.zeros(2, 4)), Step(5, "out", torch.ones(2, 4))]
    kept = _last_values(steps, {2})
    assert [(s.line, s.name) for s in kept] == [(3, "w"), (5, "out")]
    assert kept[0].value.tolist() == [[0.7, 0.2], [0.6, 0.1]] and kept[1].value.sum() == 8
