"""A toy model of one torch attention layer, no feed-forward and no blocks, written only to run a
sampling file's generate (tests/fixtures/learners_sampling_driver/tiny_driver.py): a DRIVER (its
plain properties and causality checked), not a model NOT CHECKED for want of a list of blocks."""

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DRIVER

FILE = Path(__file__).parent / "fixtures" / "learners_sampling_driver" / "tiny_driver.py"


def test_a_one_layer_toy_is_a_driver_with_its_causality_checked():
    result = check_file(str(FILE), only=["gpt"])
    (model,) = result.components
    assert model.status == DRIVER, format_report(result)
    assert any("causality" in c.name["en"] and c.ok for c in model.checks), format_report(result)
