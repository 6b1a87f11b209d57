"""`handformer check` on the paper's sublayers written as one module each (the style of
jadore801120's SubLayers.py: `x += residual; x = self.layer_norm(x)` inside the FFN and the
attention): the FFN is compared with the reference FFN inside its residual and norm, post-norm or
pre-norm, the norm with its own gain, bias and eps; the attention that ends with norm(q + attention)
is checked as an attention with that norm taken out and its query taken away. Mistakes inside are
named as in the parts alone; a missing residual fails."""

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


def _one(path: Path | str, kind: str):
    result = check_file(str(path), only=[kind])
    (comp,) = result.components
    return comp, format_report(result)


@pytest.fixture(scope="module")
def correct():
    result = check_file(str(CORRECT), only=["ffn", "mha"])
    return {c.name: c for c in result.components}, format_report(result)


def test_both_sublayers_pass(correct):
    comps, report = correct
    assert {n: c.status for n, c in comps.items()} == {"MultiHeadAttention": "pass",
                                                        "PositionwiseFeedForward": "pass"}, report
    assert "compared as the sublayer norm(x + f(x)) (post-norm)" in report
    assert "its output is norm(q + attention) (post-norm)" in report


def test_a_pre_norm_ffn_sublayer_passes(tmp_path):
    pre = edited_copy(tmp_path, CORRECT, [(FFN_BODY, "        return x + self.fc2(F.relu(self.fc1(self.norm(x))))")])
    comp, report = _one(pre, "ffn")
    assert comp.status == "pass" and "x + f(norm(x)) (pre-norm)" in report, report


@pytest.mark.parametrize("kind, old, new, named", [
    ("ffn", "x = self.drop(self.fc2(F.relu(self.fc1(x))))", "x = self.drop(self.fc2(self.fc1(x)))",
     ["ffn_no_activation"]),
    ("ffn", "        x = x + skip\n", "", ["departs"]),
    ("mha", "torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)", ["softmax_wrong_dim"]),
    ("mha", "self.core = ScaledDotProductAttention(self.d_k ** 0.5)", "self.core = ScaledDotProductAttention(1.0)",
     ["no_scaling"]),
    ("mha", "        out = out + skip\n", "", ["unlocated"]),
])
def test_a_planted_sublayer_fails(tmp_path, kind, old, new, named):
    comp, report = _one(edited_copy(tmp_path, CORRECT, [(old, new)]), kind)
    assert comp.status == "fail" and [f.name for f in comp.findings] == named, report
