"""A training step's settings and batch read by use (tests/fixtures/learners_step_settings/): a step that reads
its clipping norm from a dict (`cfg["grad_clip"]`) and one that reads its micro-steps and norm from a
namespace (`hp.accum_steps`) are handed an object holding what they read, at the file's values (the
micro-steps check's), said in a note; each loops over its micro-batches, the model handed the inputs
alone and the targets scored by a loss function of the file that flattens them (a language model's
step); a step whose loss is cast to float32 is compared at float32's precision. A step that unpacks its
batch to three names (`input_ids, attention_mask, labels = batch`) is handed a tuple of them in that
order, one that reads it by key a dict; the model called with a mask beside the ids. Each correct step
passes; each plant fails, named, at its line. The adapter a step's NOT CHECKED prints calls it with its
own arguments, in its order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.adapters import adapter_hint
from handformer.check.core.discovery import Component
from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FOLDER = Path(__file__).parent / "fixtures" / "learners_step_settings"
DICT, SPACE = FOLDER / "dict_settings.py", FOLDER / "namespace_settings.py"
TUPLE, KEYED = FOLDER / "tuple_batch.py", FOLDER / "dict_batch.py"  # a batch unpacked to 3 names; read by key
CLIP = "    nn.utils.clip_grad_norm_(model.parameters(), hp.max_grad_norm)\n"
# name: (file, edit, the mistake named, the quoted line's start)
PLANTS = {
    "dict_not_divided": (DICT, ("loss = lm_loss(logits, yb) / n_micro", "loss = lm_loss(logits, yb)"),
                         "train_step_loss_not_divided", "loss.backward()"),
    "space_clip_before_backward": (SPACE, (CLIP, ""), "train_step_not_clipped", "nn.utils.clip_grad_norm_"),
    "tuple_labels_not_shifted": (TUPLE, ("labels = labels[:, 1:]", "labels = labels[:, :-1]"),
                                 "train_step_no_shift", "labels = labels[:, :-1]"),
    "keyed_no_zero_grad": (KEYED, ("    optimizer.zero_grad()\n", ""), "train_step_no_zero_grad", "loss.backward()"),
}
MOVED = {"space_clip_before_backward": ("    opt.zero_grad()\n", "    opt.zero_grad()\n" + CLIP)}
CORRECT = {"dict": DICT, "space": SPACE, "tuple": TUPLE, "keyed": KEYED}
HANDED = {"dict": "it was handed grad_clip=1.0, use_amp=True", "space": "it was handed accum_steps=2, max_grad_norm=0.5",
          "tuple": "input_ids, attention_mask, labels: it was handed a tuple of them",
          "keyed": "input_ids, attention_mask, labels: it was handed a dict of them"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_settings")
    out = {name: check_file(str(path)) for name, path in CORRECT.items()}
    for name, (path, edit, _, _) in PLANTS.items():
        out[name] = check_file(planted_copy(folder, name, path, edit, MOVED.get(name, ("", ""))))
    return out


@pytest.mark.parametrize("name", list(CORRECT))
def test_the_correct_step_is_driven_and_passes(results, name):
    result = results[name]
    assert exit_code(result) == 0, format_report(result)
    step = next(c for c in result.components if c.kind == "lm_train_step")
    assert step.status == "pass", format_report(result)
    assert any(HANDED[name] in n["en"] for n in step.notes), step.notes


def test_a_float32_loss_is_compared_at_float32s_precision(results):
    step = next(c for c in results["dict"].components if c.name == "train_step")
    assert any("compared to 1e-6" in n["en"] for n in step.notes), step.notes


@pytest.mark.parametrize("name", list(PLANTS))
def test_the_plant_fails_named_at_its_line(results, name):
    _, _, mistake, line = PLANTS[name]
    result = results[name]
    assert exit_code(result) == 1, format_report(result)
    findings = [f for c in result.components for f in c.findings]
    assert any(f.name == mistake and f.code.strip().startswith(line) for f in findings), format_report(result)


def _step_with_settings(model, optimizer, micro_batches, cfg):
    return model, optimizer, micro_batches, cfg


def _lm_step_with_settings(model, optimizer, xb, yb, hp):
    return model, optimizer, xb, yb, hp


@pytest.mark.parametrize(("kind", "fn", "called"), [
    ("train_step", _step_with_settings, "yours(model, optimizer, micro_batches, cfg)"),
    ("lm_train_step", _lm_step_with_settings, "yours(model, optimizer, x, y, hp)"),
])
def test_the_adapter_calls_the_step_with_its_own_arguments_and_builds_those_check_does_not_hand(
        kind, fn, called):
    hint = adapter_hint(Component(kind, fn.__name__, fn))
    tree = ast.parse(hint)  # Python as printed: every name it hands is bound
    (adapter,) = tree.body
    bound = {a.arg for a in adapter.args.args} | {t.id for n in adapter.body if isinstance(n, ast.Assign)
                                                   for t in n.targets}
    call = adapter.body[-1].value
    assert called in hint and {a.id for a in call.args} <= bound, hint
