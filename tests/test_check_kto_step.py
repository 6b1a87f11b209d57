"""`handformer check` on a KTO step found where a DPO step is (policy, reference, optimizer, batch,
beta): its objective (desirable and undesirable examples, a KL reference point) is one check has no
reference for, so the step is NOT CHECKED with the objective named, never driven with DPO's pairs, and
the sequences' log-probabilities it computes are graded on their own. Two forms: one step reading a
`desirable` flag, and TRL's split into get_batch_logps, kto_loss and the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_kto_step"


@pytest.fixture(scope="module", params=["labelled", "split"])
def result(request):
    return check_file(str(FAMILY / f"{request.param}.py"), only=["sequence_logps", "dpo_step"])


def test_a_kto_step_is_not_checked_with_its_objective_named(result):
    assert [c.status for c in result.components] == ["pass", "not_checked"], format_report(result)
    why = result.components[1].error
    assert why.kind == "mapping" and "its objective is KTO's" in why.message, format_report(result)
