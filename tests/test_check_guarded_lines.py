"""A named mistake that only a guess of its patterns finds, at a guard that tests whether a setting is
given (`if temperature > 0:`, `if temperature:`), is quoted at the first statement the guard runs:
the guard computes nothing. Two sampling loops (tests/fixtures/learners_guarded_sampling/: Meta's
Llama style and nanoGPT's), each planted with the temperature left out of the softmax under the guard
(`temperature_after_softmax`: the draw samples from softmax(logits), as at t = 1)."""

from __future__ import annotations

import pytest
from check_results import FIXTURES, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = FIXTURES / "learners_guarded_sampling"
PLANTS = {  # fixture -> (the loop, the softmax as written, as planted)
    "meta_style.py": ("generate", "probs = torch.softmax(logits[:, -1] / temperature, dim=-1)",
                      "probs = torch.softmax(logits[:, -1], dim=-1)"),
    "nanogpt_style.py": ("sample", "probs = F.softmax(logits / temperature, dim=-1)",
                         "probs = F.softmax(logits, dim=-1)"),
}


@pytest.fixture(scope="module", params=PLANTS)
def planted(request, tmp_path_factory):
    name, (loop, written, plant) = request.param, PLANTS[request.param]
    text = (HERE / name).read_text()
    assert written in text, f"{name} no longer holds {written!r}"
    path = tmp_path_factory.mktemp("guarded_lines") / name
    path.write_text(text.replace(written, plant))
    line = next(i for i, code in enumerate(text.splitlines(), 1) if written in code)
    return check_file(str(path), only=["generate"]), loop, line


def test_the_mistake_is_quoted_at_the_guarded_softmax_not_at_the_guard(planted):
    result, loop, line = planted
    found = component(result, loop)
    assert found.status == "fail", format_report(result)
    assert [(f.name, f.line) for f in found.findings] == [("temperature_after_softmax", line)], format_report(
        result)
