"""`handformer check` on a loss of the model and a batch (nanoGPT-style training helpers that call the
model: `compute_loss(model, tokens)` on a (B, T + 1) window, `loss_fn(model, batch)` on the (x, y)
pair): driven with the training step's stand-in language model and compared with the next-token
cross-entropy; labels not shifted are named, at the line that slices them."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.adapters import adapter_hint
from handformer.check.core.discovery import Component
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_model_loss"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["loss"])


def test_both_losses_of_the_model_are_driven_and_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"compute_loss": "pass", "loss_fn": "pass"}, format_report(correct)
    notes = [n["en"] for c in correct.components for n in c.notes]
    assert any("compute_loss(model, tokens)" in n for n in notes) and any("loss_fn(model, (x, y))" in n for n in notes)


def test_the_adapter_of_a_loss_of_the_model_takes_the_model_and_tokens():
    def compute_loss(model, tokens):
        return model(tokens)

    hint = adapter_hint(Component("loss", "compute_loss", compute_loss))
    assert hint.startswith("def loss(model, tokens):") and "yours(model, tokens)" in hint, hint


def test_labels_not_shifted_are_named_at_their_line():
    (loss,) = [c for c in check_file(str(HERE / "labels_not_shifted.py"), only=["loss"]).components
               if c.name == "compute_loss"]
    (finding,) = loss.findings
    assert loss.status == "fail" and finding.name == "train_step_no_shift", loss.findings
    assert finding.code == "inputs, labels = tokens[:, :-1], tokens[:, :-1]"


def test_targets_cut_like_the_inputs_are_named_at_the_targets_line():
    # the inputs' slice inside the model's call is right; the line binding what the loss takes as its
    # targets is the one to move on
    def compute(name: str) -> Component:
        (loss,) = [c for c in check_file(str(HERE / name), only=["loss"]).components if c.name == "lm_loss"]
        return loss

    assert compute("sliced_in_call_correct.py").status == "pass"
    loss = compute("sliced_in_call_not_shifted.py")
    assert loss.status == "fail" and [(f.name, f.code) for f in loss.findings] == [
        ("train_step_no_shift", "targets = tokens[:, :-1]")], loss.findings
