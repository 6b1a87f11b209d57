"""A training step that reads its batch by key or by field as a classifier's step does, in a file
whose classifier check could not build (tests/fixtures/learners_unbuilt_classifier/correct.py: its
settings read from a JSON file's path), trains that classifier, not a model of check's: NOT CHECKED,
naming the classifier whose adapter to write, never FAIL on a stand-in it was never written for. Where
check builds it (built.py: its settings a dict of the file), both steps are driven on it, the batch
read by field handed as fields."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_unbuilt_classifier"
CORRECT, BUILT = HERE / "correct.py", HERE / "built.py"


def test_steps_on_a_classifier_check_could_not_build_are_not_checked_with_its_name():
    result = check_file(str(CORRECT))
    found = {c.name: c for c in result.components}
    assert found["TextClassifier"].status == "not_checked", format_report(result)
    for name in ("train_step", "training_step"):  # the batch by key, and by field
        step = found[name]
        assert step.status == "not_checked" and "TextClassifier's adapter" in step.error.message, format_report(
            result)


def test_steps_on_a_classifier_check_builds_are_driven_by_key_and_by_field():
    result = check_file(str(BUILT))
    statuses = {c.name: c.status for c in result.components}
    assert statuses == {"TextClassifier": "pass", "train_step": "pass", "training_step": "pass"}, format_report(
        result)
