"""A departure the code says is its own is NOT CHECKED, never FAIL (core/own_steps.py).

Correct files of architectures and losses check's reference has no step for: DeepNet's residual scaled
by a number its block keeps (`self.alpha = (2 * N) ** 0.25`), Scalable-Softmax's learned `self.s` (with n
fixed, a constant factor while s is at its ones: a learned parameter counts whatever the form), NEZHA's
relative-position table added inside the scores, attention weights with no softmax (stick-breaking,
sigmoid attention), an unlikelihood term added to the cross-entropy. Each is NOT CHECKED, the reason
naming the step and its line; a model of such blocks says so through the block. What stays a FAIL: a
scale the reference has, kept as a number and set wrong (a constant factor), and a catalogued mistake of
a part beside the step of its own (the block is named by its attention's mistake).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_own_steps"
FILES = {
    "deepnorm.py": ["block", "gpt"],
    "deepnorm_no_scaling.py": ["causal_attention", "block"],
    "deepnorm_scale_kept.py": ["causal_attention"],
    "ssmax.py": ["causal_attention"],
    "ssmax_fixed_n.py": ["causal_attention"],
    "nezha.py": ["mha"],
    "stick_breaking.py": ["block"],
    "sigmoid_attention.py": ["mha"],
    "unlikelihood.py": ["lm_train_step"],
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kinds in FILES.items():
        result = check_file(str(FOLDER / name), only=kinds)
        out[name] = ({c.kind: c for c in result.components}, format_report(result))
    return out


# file -> (kind, the line its reason quotes, what it names there)
OWN = {
    "deepnorm.py": ("block", 66, "self.alpha, a number of its own (set at line 59"),
    "ssmax.py": ("causal_attention", 38, "self.s, a learned parameter"),
    "ssmax_fixed_n.py": ("causal_attention", 37, "self.s, a learned parameter"),  # a constant factor at ones
    "nezha.py": ("mha", 47, "adds a term of its own: torch.einsum('bhid,ijd->bhij', q, rel)"),
    "stick_breaking.py": ("block", 35, "never go through a softmax (StickBreakingAttention)"),
    "sigmoid_attention.py": ("mha", 27, "never go through a softmax (MultiHeadAttention)"),
    "unlikelihood.py": ("lm_train_step", 75, "a term of its own to the cross-entropy: alpha * unlikelihood_loss"),
}


@pytest.mark.parametrize("name", sorted(OWN))
def test_a_step_of_its_own_is_not_checked_naming_its_line(results, name):
    parts, report = results[name]
    kind, line, said = OWN[name]
    part = parts[kind]
    assert part.status == "not_checked" and not part.findings, report
    assert part.error.kind == "own_step", report
    assert f"parts from the reference at line {line}:" in part.error.message, report
    assert said in part.error.message and "check's reference has no such step" in part.error.message, report
    assert f"在第 {line} 行与参考不同" in part.error.message_zh and "没有评分" in part.error.message_zh, report


def test_a_model_of_such_blocks_is_not_checked_through_the_block(results):
    parts, report = results["deepnorm.py"]
    assert parts["gpt"].status == "not_checked", report
    assert parts["gpt"].error.message.startswith("GPT uses Block, which is not graded: Block parts from the "
                                                 "reference at line 66"), report


def test_a_scale_the_reference_has_kept_as_a_number_and_set_wrong_fails(results):
    parts, report = results["deepnorm_scale_kept.py"]
    found = parts["causal_attention"].findings
    assert parts["causal_attention"].status == "fail", report
    assert [(f.name, f.line) for f in found] == [("departs", 37)], report
    assert "a constant factor 1.414 = d_k**0.25" in found[0].observed["en"], report


def test_a_catalogued_mistake_of_a_part_fails_the_block_named(results):
    parts, report = results["deepnorm_no_scaling.py"]
    for kind in ("causal_attention", "block"):
        assert [(f.name, f.line) for f in parts[kind].findings] == [("no_scaling", 36)], report
        assert parts[kind].status == "fail", report


# a slip on a step the reference has, beside a step of its own: made from the correct file at test time
# (name -> (correct file, (old, new), the kind graded, the mistake named, its line))
PLANTS = {
    "deepnorm_softmax_dim": ("deepnorm.py", ("F.softmax(att, dim=-1)", "F.softmax(att, dim=-2)"),
                             "causal_attention", "softmax_wrong_dim", 38),
    "unlikelihood_softmax_dim": ("unlikelihood.py", ("F.softmax(att, dim=-1) @ v", "F.softmax(att, dim=-2) @ v"),
                                 "causal_attention", "softmax_wrong_dim", 27),
    "rezero_no_scaling": ("rezero.py", ("k.transpose(-2, -1) / math.sqrt(self.d_k)", "k.transpose(-2, -1)"),
                          "mha", "no_scaling", 26),
    "rezero_softmax_dim": ("rezero.py", ("F.softmax(scores, dim=-1)", "F.softmax(scores, dim=-2)"),
                           "mha", "softmax_wrong_dim", 29),
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own_steps")
    out = {}
    for name, (source, edit, kind, _, _) in PLANTS.items():
        result = check_file(planted_copy(folder, name, FOLDER / source, edit), only=[kind])
        out[name] = ({c.kind: c for c in result.components}, format_report(result))
    return out


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_slip_beside_a_step_of_its_own_fails_named_at_its_line(planted, name):
    parts, report = planted[name]
    _, _, kind, mistake, line = PLANTS[name]
    assert parts[kind].status == "fail", report
    assert (mistake, line) in {(f.name, f.line) for f in parts[kind].findings}, report
