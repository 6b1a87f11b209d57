"""A function of logits that returns token ids is a sampler unless it picks the argmax every time
(greedy choice; signatures.py). The probe draws at a fixed seed, on enough rows that a sampler never
reads as greedy: the verdict on a sampling step is the same whatever the global RNG's state (a
sampler read as greedy is handed logits and FAILs, `torch.multinomial` refusing them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handformer.check.core.discovery import find_components
from handformer.check.core.engine import check_file, import_learner
from handformer.check.core.report import format_report
from handformer.check.core.signatures import ROWS, _by_row

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures" / "learners_zh_speculative"

SAMPLERS = '''
import torch


def draw(probs):
    return torch.multinomial(probs, 1)


def gumbel(logits):
    return (logits - torch.log(-torch.log(torch.rand_like(logits)))).argmax(-1)


def categorical(logits):
    return torch.distributions.Categorical(logits=logits).sample()


def inverse_cdf(probs):
    u = torch.rand(probs.shape[:-1] + (1,))
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=probs.shape[-1] - 1)


def pick(logits):
    return logits.argmax(-1)
'''

KINDS = {"draw": "sample", "gumbel": "sample", "categorical": "sample", "inverse_cdf": "sample",
         "pick": "greedy"}


def test_samplers_and_greedy_choice_are_told_apart_whatever_the_global_seed(tmp_path):
    """Four samplers and the argmax (and the fixture's `sample(probs)`) read the same under 12 global
    seeds: a probe of one draw per row on 2 rows, twice, reads one of them as greedy 1 run in 4."""
    path = tmp_path / "samplers.py"
    path.write_text(SAMPLERS)
    modules = import_learner(str(path)), import_learner(str(FIXTURES / "correct.py"))
    for seed in range(12):
        torch.manual_seed(seed)
        found = {c.name: c.kind for module in modules for c in find_components(module)}
        assert found == {**KINDS, "top_k_top_p_filter": "top_p", "sample": "sample",
                         "speculative_sampling": "speculative"}, seed


def test_rows_called_one_by_one_draw_apart():
    """A sampler called on each row alone (a probe for a 1-D row's code) draws each row anew: 32
    copies of a row are not one draw repeated, whatever the global RNG's state."""
    def draw(probs):
        return torch.multinomial(probs, 1)

    for seed in (1, 2):
        torch.manual_seed(seed)
        tokens = _by_row(draw, ROWS[:1].repeat(32, 1).softmax(-1), {}).reshape(-1)
        assert len(set(tokens.tolist())) > 1, tokens


@pytest.fixture(scope="module")
def checked():
    return {name: check_file(str(FIXTURES / f"{name}.py")) for name in ("correct", "top_k_off_by_one")}


def test_the_speculative_sampling_notes_pass(checked):
    """The Chinese blog's speculative sampling helpers: `sample(probs)` is graded as a sampling step
    by its draws and passes, and so do the combined filter and the speculative loop."""
    result = checked["correct"]
    assert {(c.kind, c.name, c.status) for c in result.components} == {
        ("top_p", "top_k_top_p_filter", "pass"), ("sample", "sample", "pass"),
        ("speculative", "speculative_sampling", "pass")}, format_report(result)


def test_the_top_k_off_by_one_still_fails(checked):
    """`logits <= kth` drops the k-th token: the filter FAILs on that line; the sampler still passes."""
    by_name = {c.name: c for c in checked["top_k_off_by_one"].components}
    findings = [(f.name, f.line) for f in by_name["top_k_top_p_filter"].findings]
    assert by_name["top_k_top_p_filter"].status == "fail"
    assert ("top_k_off_by_one", 12) in findings, findings
    assert (by_name["sample"].kind, by_name["sample"].status) == ("sample", "pass")
