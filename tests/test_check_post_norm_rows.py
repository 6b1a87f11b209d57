"""A correct post-norm block and a sampler of one row are never charged with a mistake they do not make.
A block whose dropout sits on the residual stream but that its file builds with a rate of 0 (its default,
no call giving another: an nn.Dropout module, and F.dropout with the rate) drops nothing: no
dropout_on_residual, a note; with a rate above 0 it is still named. An FFN width written as
ff_hidden_mult * emb is a multiplier, not a width (no 2 GB layer). A sampler the file hands one row
(`output[0, -1, :]`, `logits[-1]`) is called one row at a time, where a softmax over dim=0 is right; one
handed a batch (`logits[:, -1, :]`) with that softmax is still sampling_softmax_wrong_dim. One check run
per fixture file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.discovery import argument_keys
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_post_norm_rows"
RUNS = {"scratch_block": ["block", "sample"], "functional_block": ["block", "sample"],
        "active_dropout": ["block"], "batch_dim0": ["sample"]}
CORRECT = {"scratch_block": ("TransformerBlock", "sample"), "functional_block": ("Block", "sample_token")}
PLANTED = {"active_dropout": ("TransformerBlock", "dropout_on_residual", "nn.Dropout(dropout)"),
           "batch_dim0": ("sample_token", "sampling_softmax_wrong_dim", "torch.softmax(row / temperature, 0)")}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=kinds) for name, kinds in RUNS.items()}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_post_norm_block_built_without_dropout_is_not_charged(results, name):
    block = component(results[name], CORRECT[name][0])
    assert block.status == "differs" and not block.findings, format_report(results[name])  # post-norm: by design
    assert any("drops nothing, not charged" in n["en"] for n in block.notes), block.notes


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_sampler_the_file_hands_one_row_is_called_so(results, name):
    sampler = component(results[name], CORRECT[name][1])
    assert sampler.status == "pass", format_report(results[name])
    assert any("the file hands it one row of logits" in n["en"] for n in sampler.notes), sampler.notes


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_planted_mistake_is_still_named(results, name):
    part, mistake, written = PLANTED[name]
    comp = component(results[name], part)
    assert comp.status == "fail", format_report(results[name])
    assert [(f.name, written in f.code) for f in comp.findings] == [(mistake, True)], format_report(results[name])


def test_an_ffn_width_name_that_multiplies_the_width_is_a_multiplier():
    spec = importlib.util.spec_from_file_location("post_norm_scratch_block", HERE / "scratch_block.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (inspect reads the class's source through its module)
    spec.loader.exec_module(module)
    keys = argument_keys(module.TransformerBlock)
    assert (keys["emb"], keys["ff_hidden_mult"]) == ("d_model", "ffn_mult")  # ff_hidden_mult * emb: no width


def test_a_callable_object_is_handed_no_row_by_other_calls(tmp_path):
    from handformer.check.core.own_calls import handed_first

    path = tmp_path / "callable_sampler.py"
    path.write_text("class Sampler:\n    def __call__(self, logits):\n        return logits.softmax(0)\n\n\n"
                    "def step(model, ids, sampler):\n    return sampler.pick(model(ids)[0, -1])\n")
    spec = importlib.util.spec_from_file_location("callable_sampler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert handed_first(module.Sampler()) == []  # sampler.pick(...) is no call of it
