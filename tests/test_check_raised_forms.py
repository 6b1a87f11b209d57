"""An exception is the learner's only where their code raises on inputs it accepts (core/accepted.py).

Correct files whose code check drives in a form it does not take are NOT CHECKED, never FAILed: an
encoder-decoder on nn.Transformer whose key-padding mask is (B, S) with True at a pad, a distillation
loss written for (B, T, V) logits, a train step whose model returns (loss, logits) driven with check's
stand-in model. A planted mistake that raises still FAILs at its line: a positional table sliced on the
wrong axis (the line reads none of the arguments check chose), and a loss whose targets are not
flattened (its own model's call raises there too). The caller's evidence, recorded, is tested on a
function its own caller hands a [heads, query, key] bias."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from handformer.check.core.accepted import judged
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_raised_forms"
STEP = '''
def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    loss, _ = model(batch["input_ids"], batch["labels"])
    loss.backward()
    optimizer.step()
    return loss.item()
'''
FILES = {"padded_seq2seq": "transformer", "padded_seq2seq_positions": "transformer",
         "shifted_distill": "distill", "lm_loss": "loss", "lm_loss_targets_kept": "loss"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    step = tmp_path_factory.mktemp("raised") / "own_loss_step.py"
    step.write_text(STEP, encoding="utf-8")
    out = {name: check_file(str(HERE / f"{name}.py"), only=[kind]) for name, kind in FILES.items()}
    return out | {"own_loss_step": check_file(str(step), only=["train_step"])}


def _one(results, name, component):
    return next(c for c in results[name].components if c.name == component)


@pytest.mark.parametrize(("name", "component", "said"), [
    ("padded_seq2seq", "Seq2Seq", "src_pad (6, 6) bool"),
    ("shifted_distill", "distillation_loss", "every tensor argument with a leading (batch) dimension"),
    ("own_loss_step", "train_step", "check's stand-in model")])
def test_a_correct_file_driven_in_a_form_it_does_not_take_is_not_checked(results, name, component, said):
    comp = _one(results, name, component)
    assert comp.status == "not_checked", format_report(results[name])
    assert said in comp.error.message and comp.adapter, format_report(results[name])
    assert "检查程序" in comp.error.message_zh  # the reason in Chinese too


@pytest.mark.parametrize(("name", "component", "line"), [
    ("padded_seq2seq_positions", "Seq2Seq", "line 29, in embed: return table(ids) * math.sqrt"),
    ("lm_loss_targets_kept", "lm_loss", "line 11, in lm_loss: return F.cross_entropy(logits.reshape")])
def test_a_planted_mistake_that_raises_still_fails_at_its_line(results, name, component, line):
    comp = _one(results, name, component)
    assert comp.status == "fail" and any(t.startswith(line) for t in comp.error.traceback), \
        format_report(results[name])


def test_the_loss_fails_where_its_own_model_s_call_raises(results):
    comp = _one(results, "lm_loss_targets_kept", "lm_loss")
    assert "raised where your own code calls it, with logits (2, 8, 29)" in comp.error.message
    assert _one(results, "lm_loss", "lm_loss").status == "pass"


OWN_CALLER = '''
import torch


def add_bias(scores, bias):
    if scores.size(-2) == 1:  # one query: the bias's last row
        bias = bias[:, -1:, :]
    return scores + bias


def attend(x):
    return add_bias(x, torch.zeros(4, x.size(-2), x.size(-1)))  # (H, T, S): the learner's own form
'''


def _raised_and_caller(tmp_path, source):
    path = tmp_path / "own_caller.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("own_caller_s78b", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as check imports a learner's file
    spec.loader.exec_module(module)
    try:
        module.add_bias(torch.zeros(2, 4, 1, 5), torch.zeros(1, 5))  # check's form: (T, S)
    except IndexError as err:
        return err, str(path), lambda: module.attend(torch.zeros(2, 4, 3, 5))
    raise AssertionError("check's form ran")


def test_its_own_caller_s_form_that_runs_makes_check_s_form_not_theirs(tmp_path):
    err, path, callers = _raised_and_caller(tmp_path, OWN_CALLER)
    why = judged(err, path, callers)
    assert why is not None and why.kind == "cannot_call", why
    assert "your own code calls it with bias (4, 3, 5)" in why.message
    assert not hasattr(sys.modules["own_caller_s78b"].add_bias, "__wrapped__")  # its function put back


def test_its_own_caller_s_form_that_raises_too_is_theirs(tmp_path):
    planted = OWN_CALLER.replace("return scores + bias", "return scores + bias[:, :, :2]")
    err, path, callers = _raised_and_caller(tmp_path, planted)
    why = judged(err, path, lambda: _swallowed(callers))
    assert why is not None and why.kind == "exception" and "your own code calls it" in why.message, why
    assert any("bias[:, :, :2]" in line for line in why.traceback)


def _swallowed(run):
    try:
        run()
    except RuntimeError:  # the enclosing check's run: what it raised is recorded, not passed on
        pass



def test_the_components_around_it_run_within_a_limit(monkeypatch):
    from handformer.check.core import engine

    monkeypatch.setattr(engine, "CALLERS_LIMIT", 1e-4)  # no time for its own model's check
    result = check_file(str(HERE / "lm_loss_targets_kept.py"), only=["loss"])
    comp = next(c for c in result.components if c.name == "lm_loss")
    assert comp.status in ("fail", "not_checked") and comp.error.kind != "internal", format_report(result)


def test_a_form_check_cannot_read_again_leaves_the_exception_theirs(monkeypatch):
    from handformer.check.core import engine

    def unreadable(*args):
        raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0")
    monkeypatch.setattr(engine, "judged", unreadable)  # a form the judging itself cannot take
    result = check_file(str(HERE / "padded_seq2seq_positions.py"), only=["transformer"])
    comp = next(c for c in result.components if c.name == "Seq2Seq")
    assert comp.status == "fail" and comp.error.kind == "exception", format_report(result)
