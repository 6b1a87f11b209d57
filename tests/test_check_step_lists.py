"""Training steps handed their parts as lists (tests/fixtures/learners_step_lists/): a Chinese tutorial's
step that takes its micro-batches as a list of (inp, tgt) pairs under any name and updates once after its
loop over them (check hands it that many micro-batches), and a step that takes a list of optimizers it
steps in turn (handed a list holding one). Each correct file passes; each plant fails, named, at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FOLDER = Path(__file__).parent / "fixtures" / "learners_step_lists"
SHARDS, TWO = FOLDER / "zh_shards.py", FOLDER / "two_optimizers.py"
CLIP, UPDATE = ("    torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)  # 先裁剪\n",
                "    optim.step()  # 再更新\n")
ZERO = "    for optimizer in optimizers:\n        optimizer.zero_grad(set_to_none=True)\n"
# name: (file, edit, the mistake named, the quoted line's start)
PLANTS = {
    "not_divided": (SHARDS, ("(loss / n).backward()", "loss.backward()"), "train_step_loss_not_divided",
                    "loss.backward()"),
    "clip_after": (SHARDS, (CLIP + UPDATE, UPDATE + CLIP), "train_step_clip_after_step",
                   "torch.nn.utils.clip_grad_norm_"),
    "no_zero_grad": (TWO, (ZERO, ""), "train_step_no_zero_grad", "loss.backward()"),
    "no_shift": (TWO, ("y.view(-1))", "x.view(-1))"), "train_step_no_shift", "loss = F.cross_entropy"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_lists")
    out = {"shards": check_file(str(SHARDS)), "two": check_file(str(TWO))}
    for name, (path, (old, new), _, _) in PLANTS.items():
        text = path.read_text(encoding="utf-8")
        assert old in text
        (folder / f"{name}.py").write_text(text.replace(old, new, 1), encoding="utf-8")
        out[name] = check_file(str(folder / f"{name}.py"))
    return out


@pytest.mark.parametrize("name", ["shards", "two"])
def test_the_correct_step_is_checked_and_passes(results, name):
    result = results[name]
    assert exit_code(result) == 0, format_report(result)
    (step,) = result.components
    assert step.kind == "lm_train_step" and step.status == "pass", format_report(result)


def test_the_lists_are_said(results):
    shards, two = (results[n].components[0] for n in ("shards", "two"))
    assert any("shards, a list of 2" in n["en"] for n in shards.notes), shards.notes
    assert any("a list of optimizers (optimizers)" in n["en"] for n in two.notes), two.notes


@pytest.mark.parametrize("name", list(PLANTS))
def test_the_plant_fails_named_at_its_line(results, name):
    _, _, mistake, line = PLANTS[name]
    result = results[name]
    assert exit_code(result) == 1, format_report(result)
    findings = [f for c in result.components for f in c.findings]
    assert any(f.name == mistake and f.code.strip().startswith(line) for f in findings), format_report(result)
