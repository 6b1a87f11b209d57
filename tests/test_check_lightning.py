"""A language model written as a PyTorch Lightning module (tests/fixtures/learners_lightning/correct.py):
found by its training_step and configure_optimizers whatever its name. Its training step is handed a
batch in the form it unpacks ((x, y) here) and its loss compared with the cross-entropy of its own
logits against the next tokens; the LambdaLR its configure_optimizers builds (a method lr_at it calls
holds the cosine) is read as a schedule, built with the settings its constructor takes. Targets that
are the inputs and a cosine counted from step 0 FAIL at their lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_lightning" / "correct.py"
PLANTS = {  # name -> (the line as written, the line planted, the component that fails)
    "train_step_no_shift": ("F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))",
                            "F.cross_entropy(logits.view(-1, logits.size(-1)), x.view(-1))", "BigramLightning"),
    "cosine_from_step_zero": ("ratio = (it - self.warmup_iters) / (self.total_iters - self.warmup_iters)",
                              "ratio = it / self.total_iters", "BigramLightning.configure_optimizers"),
}


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


@pytest.fixture(scope="module", params=sorted(PLANTS))
def planted(request, tmp_path_factory):
    written, plant, failing = PLANTS[request.param]
    folder = tmp_path_factory.mktemp("lightning")
    return request.param, plant, failing, planted_copy(CORRECT, folder, request.param, (written, plant))


def test_the_training_step_and_the_configured_schedule_pass(correct):
    kinds = {c.name: (c.kind, c.status) for c in correct.components}
    assert kinds == {"BigramLightning": ("lightning", "pass"),
                     "BigramLightning.configure_optimizers": ("schedule", "pass")}, format_report(correct)


def test_a_planted_mistake_fails_at_its_line(planted):
    name, plant, failing, result = planted
    statuses = {c.name: c.status for c in result.components}
    assert statuses[failing] == "fail" and list(statuses.values()).count("fail") == 1, format_report(result)
    comp = next(c for c in result.components if c.name == failing)
    finding = next(f for f in comp.findings if f.name == name)
    assert plant in finding.code, format_report(result)
