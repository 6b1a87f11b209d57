"""A mixture of experts with a capacity (Switch's top-1 routing: tokens past capacity_factor * tokens /
experts dropped, the expert's output scaled by its router probability) named as a feed-forward network
(RoutedMLP, SwitchFeedForward) is checked as a mixture of experts, never named an FFN without a down
projection, also where its routing is read nowhere in its own source (a router class of its own, a
helper function): what it builds (a router beside a list of experts) says so. It is built at a
capacity factor where no token is dropped (from a config field, and from a
constructor argument with a default), the routing compared. Its block and model are driven where the
mixture returns (out, aux_loss) and the model (logits, aux): a number beside logits the model was handed
no targets for is no loss. Planted mistakes FAIL at their line. One check run per fixture file."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component, planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_capacity_moe"
RUNS = {"top1_tuple": ["moe", "block", "gpt"], "relu_experts": ["moe"], "router_over_tokens": ["moe"],
        "scaled_by_complement": ["moe"]}
PLANTED = {"router_over_tokens": ("RoutedMLP", "dim=0"), "scaled_by_complement": ("SwitchFeedForward", "1 - prob")}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=kinds) for name, kinds in RUNS.items()}


@pytest.mark.parametrize("name, mixture", [("top1_tuple", "RoutedMLP"), ("relu_experts", "SwitchFeedForward")])
def test_a_mixture_with_a_capacity_is_checked_as_one_where_no_token_is_dropped(results, name, mixture):
    comp = component(results[name], mixture)
    assert comp.status == "pass", format_report(results[name])
    assert not comp.findings
    assert any("capacity_factor = 16: no token is dropped" in n["en"] for n in comp.notes), comp.notes


def test_its_block_and_model_are_driven_when_it_returns_an_aux_loss(results):
    result = results["top1_tuple"]
    for name in ("RoutedBlock", "RoutedLM"):
        assert component(result, name).status == "pass", format_report(result)
    model = component(result, "RoutedLM")
    assert not any("loss" in c.name["en"] for c in model.checks)  # (logits, aux): no targets, no loss


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_mixture_still_fails_at_its_line(results, name):
    mixture, written = PLANTED[name]
    comp = component(results[name], mixture)
    assert comp.status == "fail", format_report(results[name])
    (finding,) = comp.findings
    assert written in finding.code, format_report(results[name])


# a mixture named as an FFN whose own source computes no routing: (name, the mixture, the planted edit)
ROUTED_APART = {
    "router_module": ("SwitchSparseMLP", ("probs = F.softmax(logits, dim=-1)", "probs = F.softmax(logits, dim=0)")),
    "routed_by_helper": ("FeedForward", ("return logits.softmax(dim=-1).max(dim=-1)", "return logits.max(dim=-1)")),
}


@pytest.fixture(scope="module")
def routed_apart(tmp_path_factory):
    folder = tmp_path_factory.mktemp("routed_apart")
    out = {}
    for name, (_, edit) in ROUTED_APART.items():
        out[name] = check_file(str(HERE / f"{name}.py"), only=["ffn"])
        out[f"{name}_p"] = check_file(planted_copy(folder, f"{name}_p", HERE / f"{name}.py", edit), only=["ffn"])
    return out


@pytest.mark.parametrize("name", sorted(ROUTED_APART))
def test_a_mixture_whose_routing_lives_elsewhere_is_checked_as_one(routed_apart, name):
    mixture, _ = ROUTED_APART[name]
    comp = component(routed_apart[name], mixture)
    assert (comp.kind, comp.status, comp.findings) == ("moe", "pass", []), format_report(routed_apart[name])
    failed = component(routed_apart[f"{name}_p"], mixture)  # (where it departs: the routed output's line)
    assert (failed.kind, failed.status) == ("moe", "fail"), format_report(routed_apart[f"{name}_p"])
    assert failed.findings and failed.findings[0].line is not None, format_report(routed_apart[f"{name}_p"])
