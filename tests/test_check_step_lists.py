"""Training steps handed their parts as lists, and a loop that builds its own optimizer
(tests/fixtures/learners_step_lists/): a Chinese tutorial's step that takes its micro-batches as a list
of (inp, tgt) pairs under any name and updates once after its loop over them (check hands it that many
micro-batches); a step that takes a list of optimizers it steps in turn (handed a list holding one); a
book's pretraining loop, one function with a momentum SGD written by hand, a warmup, accumulation and
clipping (stopped after two steps, compared with handformer's steps on its own optimizer and rates), and
an AMP recipe's loop (AdamW, a LambdaLR, bf16 autocast, a loss scaler that steps the optimizer).
Each correct file passes; each plant fails, named, at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FOLDER = Path(__file__).parent / "fixtures" / "learners_step_lists"
SHARDS, TWO, LOOP = FOLDER / "zh_shards.py", FOLDER / "two_optimizers.py", FOLDER / "own_optimizer_loop.py"
AMP = FOLDER / "amp_scaler_loop.py"  # AdamW, LambdaLR, autocast, GradScaler: scaler.step(optimizer)
AMP_CLIP = "        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)\n"
AMP_UPDATE = "        scaler.step(optimizer)\n"
CLIP, UPDATE = ("    torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)  # 先裁剪\n",
                "    optim.step()  # 再更新\n")
ZERO = "    for optimizer in optimizers:\n        optimizer.zero_grad(set_to_none=True)\n"
LOOP_CLIP, LOOP_UPDATE = "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP)\n", "        opt.step()\n"
# name: (file, edit, the mistake named, the quoted line's start)
PLANTS = {
    "not_divided": (SHARDS, ("(loss / n).backward()", "loss.backward()"), "train_step_loss_not_divided",
                    "loss.backward()"),
    "clip_after": (SHARDS, (CLIP + UPDATE, UPDATE + CLIP), "train_step_clip_after_step",
                   "torch.nn.utils.clip_grad_norm_"),
    "no_zero_grad": (TWO, (ZERO, ""), "train_step_no_zero_grad", "loss.backward()"),
    "no_shift": (TWO, ("y.view(-1))", "x.view(-1))"), "train_step_no_shift", "loss = F.cross_entropy"),
    "loop_not_divided": (LOOP, ("(loss / ACCUM_STEPS).backward()", "loss.backward()"),
                         "train_step_loss_not_divided", "loss.backward()"),
    "loop_clip_after": (LOOP, (LOOP_CLIP + LOOP_UPDATE, LOOP_UPDATE + LOOP_CLIP), "train_step_clip_after_step",
                        "torch.nn.utils.clip_grad_norm_"),
    "loop_no_zero_grad": (LOOP, ("        opt.zero_grad()\n", ""), "train_step_no_zero_grad", "(loss / ACCUM"),
    "amp_clip_after": (AMP, (AMP_CLIP + AMP_UPDATE, AMP_UPDATE + AMP_CLIP), "train_step_clip_after_step",
                       "torch.nn.utils.clip_grad_norm_"),
}
KINDS = {"shards": "lm_train_step", "two": "lm_train_step", "loop": "lm_train_loop", "amp": "lm_train_loop"}
CORRECT = {"shards": SHARDS, "two": TWO, "loop": LOOP, "amp": AMP}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_lists")
    out = {name: check_file(str(path)) for name, path in CORRECT.items()}
    for name, (path, edit, _, _) in PLANTS.items():
        out[name] = check_file(planted_copy(folder, name, path, edit))
    return out


@pytest.mark.parametrize("name", list(KINDS))
def test_the_correct_step_is_checked_and_passes(results, name):
    result = results[name]
    assert exit_code(result) == 0, format_report(result)
    (step,) = result.components
    assert step.kind == KINDS[name] and step.status == "pass", format_report(result)


def test_the_lists_are_said(results):
    shards, two = (results[n].components[0] for n in ("shards", "two"))
    assert any("shards, a list of 2" in n["en"] for n in shards.notes), shards.notes
    assert any("a list of optimizers (optimizers)" in n["en"] for n in two.notes), two.notes
    loop = results["loop"].components[0]
    assert any("its own optimizer (MomentumSGD)" in n["en"] and "0.01667; 0.03333" in n["en"]
               for n in loop.notes), loop.notes


@pytest.mark.parametrize("name", list(PLANTS))
def test_the_plant_fails_named_at_its_line(results, name):
    _, _, mistake, line = PLANTS[name]
    result = results[name]
    assert exit_code(result) == 1, format_report(result)
    findings = [f for c in result.components for f in c.findings]
    assert any(f.name == mistake and f.code.strip().startswith(line) for f in findings), format_report(result)
