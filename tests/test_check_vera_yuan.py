"""Two correct styles check once named falsely (tests/fixtures/learners_vera_yuan/), and the plants that
must still be named. VeRA's step (frozen shared A and B, only the vectors d and b train) clips the
trainable parameters it filters, or not at all: what it clips at is read from its code, never from a
docstring that speaks of clip_grad_norm_, nor from the filter it hands the parameters through; a step
that clips by value is compared with a step that clips by value; one that clips after a loss scaler's
unscale_ passes. Yuan 2.0's model (localized filtering:
causal convolutions before q and k; rotary positions, no position table) drives its own greedy loop
although check has no weights to give its convolutions, and a model that runs on any length needs no
crop, also where the stand-in drives the loop (the model failed its check). A GPT with a learned
position table whose generate forgets the crop is still named."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FOLDER = Path(__file__).parent / "fixtures" / "learners_vera_yuan"
VERA, YUAN, YUAN_METHOD, GPT = (FOLDER / f for f in ("vera.py", "yuan.py", "yuan_method.py", "gpt_crop.py"))
CLIP = "    torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)\n"
STEP_HEAD = "def train_step(model, optimizer, x, y, max_grad_norm=1.0):\n"
NO_CLIP_HEAD = ('def train_step(model, optimizer, x, y):\n    """No clipping here: only d and b train, their '
                'gradients stay small (no clip_grad_norm_ needed)."""\n')
# name: (file, kind, edits, the mistake named (None: passes), the quoted line's start)
CASES = {
    "vera": (VERA, "lm_train_step", (), None, None),
    "vera_unclipped_by_design": (VERA, "lm_train_step", ((STEP_HEAD, NO_CLIP_HEAD), (CLIP, "")), None, None),
    "vera_filter_literal": (VERA, "lm_train_step", ((CLIP, "    torch.nn.utils.clip_grad_norm_(filter(lambda p: "
                                                          "p.requires_grad, model.parameters()), 0.5)\n"),),
                            None, None),
    "vera_by_value": (VERA, "lm_train_step", ((CLIP, "    torch.nn.utils.clip_grad_value_(trainable, 0.01)\n"),),
                      None, None),
    "vera_scaler_unscaled": (VERA, "lm_train_step", (
        (STEP_HEAD, "def train_step(model, optimizer, x, y, scaler, max_grad_norm=1.0):\n"),
        ("    loss.backward()\n", "    scaler.scale(loss).backward()\n    scaler.unscale_(optimizer)\n"),
        ("    optimizer.step()\n", "    scaler.step(optimizer)\n    scaler.update()\n")), None, None),
    "vera_no_zero_grad": (VERA, "lm_train_step", (("    optimizer.zero_grad(set_to_none=True)\n", ""),),
                          "train_step_no_zero_grad", "loss.backward()"),
    "vera_clip_dropped": (VERA, "lm_train_step", ((CLIP, ""),), "train_step_not_clipped", None),
    "vera_clip_after_step": (VERA, "lm_train_step", ((CLIP, ""), ("    optimizer.step()\n",
                                                                   "    optimizer.step()\n" + CLIP)),
                             "train_step_clip_after_step", "torch.nn.utils.clip_grad_norm_"),
    "yuan": (YUAN, "generate", (), None, None),
    "yuan_method": (YUAN_METHOD, "generate", (), None, None),
    "yuan_last_token": (YUAN, "generate", (("logits = model(input_ids)", "logits = model(input_ids[:, -1:])"),),
                        "generate_cache_mismatch", "logits = model(input_ids[:, -1:])"),
    "gpt": (GPT, "generate", (), None, None),
    "gpt_no_crop": (GPT, "generate", (("idx_cond = idx[:, -block_size:]\n            logits = self(idx_cond)",
                                       "logits = self(idx)"),), "generate_no_crop", "logits = self(idx)"),
    "gpt_crop_by_name": (GPT, "generate", (("idx_cond = idx[:, -block_size:]",
                                            "ctx = block_size\n            idx_cond = idx[:, -ctx:]"),), None, None),
    "gpt_forward_crops": (GPT, "generate", (("idx_cond = idx[:, -block_size:]\n            logits = self(idx_cond)",
                                             "logits = self(idx)"),
                                            ("        B, T = idx.shape\n", "        idx = idx[:, -block_size:]\n"
                                             "        B, T = idx.shape\n")), None, None),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vera_yuan")
    out = {}
    for name, (path, kind, edits, _, _) in CASES.items():
        file = planted_copy(folder, name, path, *edits) if edits else str(path)
        out[name] = check_file(file, only=[kind])
    return out


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] is None])
def test_the_correct_form_passes(results, name):
    result = results[name]
    (comp,) = result.components
    assert comp.status == "pass", format_report(result)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] is not None])
def test_the_plant_is_named_at_its_line(results, name):
    result, (_, _, _, mistake, line) = results[name], CASES[name]
    (comp,) = result.components
    assert comp.status == "fail" and comp.findings[0].name == mistake, format_report(result)
    assert line is None or (comp.findings[0].code or "").strip().startswith(line), format_report(result)


def test_a_step_that_clips_by_value_is_said_so(results):
    (comp,) = results["vera_by_value"].components
    assert any("clips each gradient element at 0.01" in n["en"] for n in comp.notes), comp.notes


def test_yuan_is_driven_through_its_own_model_which_needs_no_crop(results):
    for name in ("yuan", "yuan_method"):
        (comp,) = results[name].components
        assert "your own YuanModel" in comp.driven["en"] and "no crop is needed" in comp.driven["en"], comp.driven


def test_a_stand_in_driven_loop_is_not_run_past_a_block_its_model_has_not(tmp_path):
    """The model fails its check (its first convolution padded on the right: the future leaks), so the
    stand-in drives its generate; the model itself runs on any length: no crop is charged. The leak is
    found in that convolution, whose output is laid out (B, C, T) with C the width of the whole context."""
    broken = planted_copy(tmp_path, "yuan_leaks", YUAN_METHOD, ("h = self.conv1(F.pad(h, (1, 0)))",
                                                               "h = self.conv1(F.pad(h, (0, 1)))"))
    result = check_file(broken, only=["gpt", "generate"])
    model, loop = result.components
    assert model.status == "fail" and loop.status == "pass", format_report(result)
    assert "first in layers.0.self_attn.lf.conv1 " in model.findings[0].observed["en"], format_report(result)
    assert "a stand-in" in loop.driven["en"] and any("needs no crop" in n["en"] for n in loop.notes), loop.notes
