"""`handformer check` on small callables found by what they are: logits processors in Hugging Face's
style (a class whose `__call__(input_ids, scores)` filters and whose constructor takes the setting),
a sampling step handed a list of them, a criterion whose constructor refuses smoothing 0, a linear
schedule with warmup (a scheduler factory, and a function of the settings that returns the schedule),
and a decay of another shape, NOT CHECKED (tests/fixtures/learners_callables/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_callables"


def _planted(tmp_path: Path, name: str, old: str, new: str) -> Path:
    source = (FIXTURES / name).read_text()
    assert source.count(old) == 1, old
    path = tmp_path / name
    path.write_text(source.replace(old, new))
    return path


def test_processor_classes_are_checked_as_the_filters_their_settings_name():
    result = check_file(str(FIXTURES / "processors_correct.py"))
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("ScaleByTemperature", "temperature", "pass"), ("KeepTopK", "top_k", "pass"),
        ("NucleusWarper", "top_p", "pass"), ("MinProbabilityWarper", "min_p", "pass"),
        ("sample_token", "sample", "pass")], format_report(result)
    assert exit_code(result) == 0
    notes = [n["en"] for c in result.components for n in c.notes]
    assert sum("a logits processor" in n for n in notes) == 4
    assert any("`logits_processor` is handed an empty list" in n for n in notes)


@pytest.mark.parametrize("old, new, kind, name, line", [
    ("return logits / self.temp", "return logits * self.temp", "temperature", "temperature_multiplied", 21),
    ("threshold = self.min_p * probs.max(dim=-1, keepdim=True).values", "threshold = self.min_p", "min_p",
     "min_p_not_scaled", 58),
    ("drop[..., : self.keep_at_least] = False", "drop[..., -self.keep_at_least :] = False", "top_p", "departs",
     46),
    ("probs.max(dim=-1, keepdim=True).values", "probs.mean(dim=-1, keepdim=True)", "min_p", "departs", 58)])
def test_a_mistake_in_a_processor_fails_at_its_line(tmp_path, old, new, kind, name, line):
    result = check_file(str(_planted(tmp_path, "processors_correct.py", old, new)), only=[kind])
    (comp,) = result.components
    assert comp.status == "fail" and exit_code(result) == 1, format_report(result)
    assert [(f.name, f.line) for f in comp.findings] == [(name, line)], format_report(result)


def test_a_criterion_that_refuses_smoothing_zero_is_checked_at_its_smoothing(tmp_path):
    result = check_file(str(FIXTURES / "criterion_correct.py"))
    (comp,) = result.components
    assert comp.status == "pass", format_report(result)
    assert any("refuses label_smoothing=0" in n["en"] for n in comp.notes)
    wrong = _planted(tmp_path, "criterion_correct.py", "target, ignore_index=self.ignore_index,", "target,")
    (comp,) = check_file(str(wrong)).components
    assert comp.status == "fail" and [(f.name, f.line) for f in comp.findings] == [("loss_counts_padding", 16)]


def test_a_loss_with_a_smoothing_switch_is_checked_and_its_padding_summed_fails_at_that_line(tmp_path):
    """cal_loss(pred, gold, trg_pad_idx, smoothing=False): the switch turns on its own eps; the real
    tokens' losses summed pass, every position's summed FAILs at that line."""
    (comp,) = check_file(str(FIXTURES / "cal_loss_correct.py")).components
    assert comp.status == "pass", format_report(comp)
    wrong = _planted(tmp_path, "cal_loss_correct.py", "loss = per_token.masked_select(gold != trg_pad_idx).sum()",
                     "loss = per_token.sum()")
    (comp,) = check_file(str(wrong)).components
    assert comp.status == "fail" and [(f.name, f.line) for f in comp.findings] == [("loss_counts_padding", 19)]


def test_a_linear_decay_is_compared_with_a_line_and_another_decay_is_not_checked(tmp_path):
    """Hugging Face's linear schedule (a factory), a function of the settings that returns the
    schedule and a class whose __call__ takes the step (the TensorFlow tutorial's) pass; an exponential
    decay is NOT CHECKED, never FAIL; a linear decay over the wrong length FAILs at its line, the class
    taking max for min FAILs."""
    result = check_file(str(FIXTURES / "schedules_correct.py"))
    assert [(c.name, c.status) for c in result.components] == [
        ("NoamRate", "pass"), ("linear_with_warmup", "pass"), ("warmup_then_linear", "pass"),
        ("exp_decay_lr", "not_checked")], format_report(result)
    assert exit_code(result) == 3
    wrong = _planted(tmp_path, "schedules_correct.py", "/ max(1, num_training_steps - num_warmup_steps))",
                     "/ max(1, num_training_steps))")
    comp = check_file(str(wrong), only=["schedule"]).components[1]
    assert comp.status == "fail" and [f.line for f in comp.findings] == [11], format_report(comp)
    wrong = _planted(tmp_path, "schedules_correct.py", "* min(step ** -0.5", "* max(step ** -0.5")
    assert check_file(str(wrong), only=["schedule"]).components[0].status == "fail"


def test_a_d2l_loss_of_valid_lengths_is_read_per_row_and_padding_counted_fails(tmp_path):
    """d2l's MaskedSoftmaxCELoss(nn.CrossEntropyLoss): torch's constructor keeps its defaults (no
    ignore_index given), its valid_len gets the real lengths, its (B,) rows are read as their sum
    times T; the mask left out FAILs at its line."""
    result = check_file(str(FIXTURES / "masked_ce_correct.py"))
    (comp,) = result.components
    assert comp.status == "pass" and any("valid lengths" in n["en"] for n in comp.notes), format_report(result)
    wrong = _planted(tmp_path, "masked_ce_correct.py", "(per_token * keep).mean(dim=1)",
                     "per_token.mean(dim=1)")
    (comp,) = check_file(str(wrong)).components
    assert comp.status == "fail" and [(f.name, f.line) for f in comp.findings] == [("loss_counts_padding", 13)]


def test_a_loss_handed_a_generator_and_a_criterion_is_checked_for_what_it_adds(tmp_path):
    """OpenNMT's compute_loss(output, target, generator, criterion): stand-ins for both (log_softmax, a
    summed cross-entropy of the real tokens); dividing by every target FAILs at that line."""
    (comp,) = check_file(str(FIXTURES / "loss_compute_correct.py")).components
    assert comp.status == "pass" and any("stand-ins" in n["en"] for n in comp.notes), format_report(comp)
    wrong = _planted(tmp_path, "loss_compute_correct.py", "gold.ne(pad_idx).sum()", "gold.numel()")
    (comp,) = check_file(str(wrong)).components
    assert comp.status == "fail" and [(f.name, f.line) for f in comp.findings] == [("loss_counts_padding", 20)]


ASCENDING_TOP_P = '''import torch


class TailCutter:
    """Top-p as Hugging Face's TopPLogitsWarper computes it: sorted least likely first, the tail of
    mass at most 1 - p removed, the most likely token always kept."""

    def __init__(self, top_p, keep=1):
        self.top_p, self.keep = top_p, keep

    def __call__(self, input_ids, scores):
        ranked, order = torch.sort(scores, descending=False)
        cum = ranked.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - self.top_p)
        remove[..., -self.keep:] = False
        remove = remove.scatter(1, order, remove)
        return scores.masked_fill(remove, float("-inf"))
'''


def test_a_top_p_sorted_least_likely_first_is_localized_at_its_guard(tmp_path):
    """The ascending top-p passes (found by what it is, or named with --component top_p=TailCutter);
    its guard at the wrong end FAILs at the guard's line, not at the sort."""
    path = tmp_path / "tail.py"
    path.write_text(ASCENDING_TOP_P)
    (comp,) = check_file(str(path), overrides={"top_p": "TailCutter"}).components
    assert comp.status == "pass", format_report(comp)
    path.write_text(ASCENDING_TOP_P.replace("remove[..., -self.keep:] = False", "remove[..., :self.keep] = False"))
    (comp,) = check_file(str(path)).components
    assert comp.status == "fail" and [f.line for f in comp.findings] == [16], format_report(comp)
