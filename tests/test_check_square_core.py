"""An attention core that takes as many queries as keys (tests/fixtures/learners_square_core/): a
class that builds its causal mask from the query length, and a function whose mask comes from a helper
of one size. Check's cases with fewer queries than keys are its own choice: they run again with T = S
(a note says so), and the core, handed no mask and causal all the same, is compared with the causal
reference. Each correct file PASSes; each plant FAILs named at its line."""

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures" / "learners_square_core"
CORES = {"core_class": "CoreAttention", "core_function": "attention"}
PLANTS = {"core_class_scale": ("CoreAttention", "scale_by_dk", "self.scale = 1.0 / head_dim"),
          "core_function_mask": ("attention", "causal_off_by_one",
                                 "return torch.tril(torch.ones(size, size), diagonal=1)")}


@pytest.fixture(scope="module", params=[*CORES, *PLANTS])
def checked(request):
    return request.param, check_file(str(FIXTURES / f"{request.param}.py"))


def test_a_square_only_core_runs_square_and_fails_only_on_its_own_mistake(checked):
    name, result = checked
    core = next(c for c in result.components if c.name == (CORES.get(name) or PLANTS[name][0]))
    assert any("fewer queries than keys" in n["en"] for n in core.notes), format_report(result)
    assert result.error is None and core.error in (None, {}), format_report(result)
    if name in CORES:
        assert core.status == "pass", format_report(result)
        return
    _, finding, line = PLANTS[name]
    assert core.status == "fail" and [(f.name, f.code) for f in core.findings] == [(finding, line)], \
        format_report(result)
