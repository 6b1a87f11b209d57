"""`handformer check` on the paper's sublayers written as one module (the style of jadore801120's
SubLayers.py: `x += residual; x = self.layer_norm(x)` inside the FFN): the FFN is compared with the
reference FFN inside its residual and norm, post-norm or pre-norm, the norm with its own gain, bias and
eps; a missing activation is named, a missing residual fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
CORRECT = Path(__file__).parent / "fixtures" / "learners_sublayers" / "correct.py"
FFN_BODY = """        skip = x
        x = self.drop(self.fc2(F.relu(self.fc1(x))))
        x = x + skip
        return self.norm(x)"""


def _ffn(path: Path | str):
    result = check_file(str(path), only=["ffn"])
    (comp,) = result.components
    return comp, format_report(result)


def test_the_ffn_sublayer_passes_post_norm_and_pre_norm(tmp_path):
    comp, report = _ffn(CORRECT)
    assert comp.status == "pass", report
    assert "compared as the sublayer norm(x + f(x)) (post-norm)" in report
    pre = edited_copy(tmp_path, CORRECT, [(FFN_BODY, "        return x + self.fc2(F.relu(self.fc1(self.norm(x))))")])
    comp, report = _ffn(pre)
    assert comp.status == "pass" and "x + f(norm(x)) (pre-norm)" in report, report


@pytest.mark.parametrize("old, new, named", [
    ("x = self.drop(self.fc2(F.relu(self.fc1(x))))", "x = self.drop(self.fc2(self.fc1(x)))", "ffn_no_activation"),
    ("        x = x + skip\n", "", "departs"),
])
def test_a_planted_ffn_sublayer_fails(tmp_path, old, new, named):
    comp, report = _ffn(edited_copy(tmp_path, CORRECT, [(old, new)]))
    assert comp.status == "fail" and [f.name for f in comp.findings] == [named], report
