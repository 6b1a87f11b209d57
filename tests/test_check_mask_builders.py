"""A causal model's mask made by a builder of the learner's, quoted at the builder's line, not at the
line that uses it: tests/fixtures/learners_mask_builders/method.py (a builder method returning an
additive mask, added to the scores in each block) and buffer.py (nanoGPT's form: a 0/1 buffer made in
__init__, cut to the length and used through masked_fill). Each correct file passes; each with its
builder planted wrong FAILs quoting the builder's line and the line that used the mask."""

from __future__ import annotations

import pytest
import torch
from check_results import FIXTURES, component
from helpers import planted_copy

from handformer.check.core.built_masks import _departs
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FOLDER = FIXTURES / "learners_mask_builders"
METHOD_BUILT = "mask = torch.triu(hidden, diagonal=1)"
METHOD_PLANT = "mask = torch.triu(hidden, diagonal=0)"  # the token itself hidden too
BUFFER_BUILT = 'self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))'
BUFFER_PLANT = 'self.register_buffer("bias", torch.triu(torch.ones(block_size, block_size))'  # the future kept


def _line_of(source: str, written: str) -> int:
    return next(i for i, line in enumerate((FOLDER / source).read_text().splitlines(), 1) if written in line)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One check run per file: each correct file and each planted copy (the gpt kind alone)."""
    folder = tmp_path_factory.mktemp("mask_builders")
    planted = {"method": planted_copy(folder, "method_p", FOLDER / "method.py", (METHOD_BUILT, METHOD_PLANT)),
               "buffer": planted_copy(folder, "buffer_p", FOLDER / "buffer.py", (BUFFER_BUILT, BUFFER_PLANT))}
    out = {name: check_file(str(FOLDER / f"{name}.py"), only=["gpt"]) for name in planted}
    out.update({f"{name}_p": check_file(path, only=["gpt"]) for name, path in planted.items()})
    return out


@pytest.mark.parametrize("name, model", [("method", "TinyLM"), ("buffer", "GPT")])
def test_correct_builders_pass(runs, name, model):
    assert component(runs[name], model).status == "pass", format_report(runs[name])


def test_builder_method_quoted_at_its_line_with_the_line_using_it(runs):
    res = component(runs["method_p"], "TinyLM")
    assert res.status == "fail", format_report(runs["method_p"])
    found = [(f.line, f.code) for f in res.findings]
    assert found[0][0] == _line_of("method.py", METHOD_BUILT), format_report(runs["method_p"])
    assert found[0][1].startswith(METHOD_PLANT), found  # the builder's line, then the one using the mask
    assert " / line " in found[0][1] and found[0][1].count(" / line ") == 1, found
    assert "keys at positions [0, 1, 2, 3]" in res.findings[0].observed["en"], res.findings[0].observed


def test_buffer_made_in_init_quoted_at_its_line(runs):
    res = component(runs["buffer_p"], "GPT")
    assert res.status == "fail", format_report(runs["buffer_p"])
    assert res.findings[0].line == _line_of("buffer.py", BUFFER_BUILT), format_report(runs["buffer_p"])
    assert "位置 [" in res.findings[0].observed["zh"], res.findings[0].observed


def _masks(T: int) -> dict[str, torch.Tensor]:
    """Keep masks (T, T), 1 = may attend: the causal ones in the forms correct files build, and two wrong."""
    causal = torch.ones(T, T).tril()
    prefix = causal.clone()
    prefix[:3, :3] = 1  # GLM's prefix-LM mask: the first 3 tokens see each other whole
    chunk = causal * (torch.arange(T)[:, None] // 4 == torch.arange(T) // 4)  # Llama 4's chunks of 4
    return {"causal": causal, "window": causal - torch.ones(T, T).tril(-3), "chunk": chunk, "prefix": prefix,
            "additive": (1 - causal) * torch.finfo(torch.float32).min, "future": causal.T, "no_self": causal.tril(-1)}


@pytest.mark.parametrize("name, departs", [("causal", False), ("window", False), ("chunk", False),
                                           ("prefix", False), ("additive", False), ("future", True),
                                           ("no_self", True)])
def test_a_mask_departs_when_it_keeps_a_later_key_or_not_its_own(name, departs):
    assert _departs(_masks(8)[name][None, None], 8) is departs
