"""Components found by what they do, under names no table has (tests/fixtures/learners_by_behaviour,
handformer/check/core/behaviour.py): a schedule as a class whose `__call__` takes the step, as a
subclass of torch's LRScheduler and as a function of the step alone; a loss as a criterion module over
logits and as a function over hidden states and the head's weight. Each correct form passes; each
planted one fails, its line quoted. A probe that finds nothing is silent and bounded in time."""

from __future__ import annotations

import math
import time

import pytest
import torch.nn.functional as F
from check_results import FIXTURES, checked, component, planted_copy, statuses

from handformer.check.core import behaviour
from handformer.check.core.report import format_report

FOLDER = "learners_by_behaviour"
MIN_LR_LEFT_OUT = (
    "        return self.min_lr + 0.5 * (self.max_lr - self.min_lr) * (1 + math.cos(math.pi * progress))",
    "        return 0.5 * self.max_lr * (1 + math.cos(math.pi * progress))")
RATIO_LEFT_OUT = ("            scale = self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine",
                  "            scale = cosine")
HALF_COSINE = ("    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LEARNING_RATE - MIN_LR)",
               "    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio / 2)) * (LEARNING_RATE - MIN_LR)")
PADDING_COUNTED = ("        return -(picked * keep).sum() / keep.sum()",
                   "        return -(picked * keep).sum() / targets.numel()")
PIECE_PADDING = ("        count += (part != ignore_index).sum()", "        count += part.numel()")
SCHEDULES = ("WarmCosineMultiplier", "LinearWarmupCosineDecay", "rate_for")
LOSSES = ("TokenNLL", "loss_over_head_in_pieces")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("by_behaviour")
    return {"schedules": checked(FOLDER, "schedules"), "losses": checked(FOLDER, "losses"),
            "schedules_planted": planted_copy(FIXTURES / FOLDER / "schedules.py", folder, "schedules",
                                              MIN_LR_LEFT_OUT, RATIO_LEFT_OUT, HALF_COSINE),
            "losses_planted": planted_copy(FIXTURES / FOLDER / "losses.py", folder, "losses",
                                           PADDING_COUNTED, PIECE_PADDING)}


def test_schedules_under_names_of_their_own_are_found_and_pass(results):
    result = results["schedules"]
    assert statuses(result) == dict.fromkeys(SCHEDULES, "pass"), format_report(result)
    assert all(component(result, name).kind == "schedule" for name in SCHEDULES)
    assert "found as a learning-rate schedule by what it does" in format_report(result)


def test_losses_under_names_of_their_own_are_found_and_pass(results):
    result = results["losses"]
    assert statuses(result) == {"TokenNLL": "pass", "loss_over_head_in_pieces": "pass"}, format_report(result)
    assert [component(result, name).kind for name in LOSSES] == ["loss", "chunked_ce"]


@pytest.mark.parametrize(("name", "plant"), [("WarmCosineMultiplier", MIN_LR_LEFT_OUT),
                                             ("LinearWarmupCosineDecay", RATIO_LEFT_OUT),
                                             ("rate_for", HALF_COSINE)])
def test_a_plant_in_each_schedule_fails_at_its_line(results, name, plant):
    comp = component(results["schedules_planted"], name)
    assert comp.status == "fail", format_report(results["schedules_planted"])
    assert plant[1].strip() in [f.code for f in comp.findings]


@pytest.mark.parametrize(("name", "plant"), [("TokenNLL", PADDING_COUNTED),
                                             ("loss_over_head_in_pieces", PIECE_PADDING)])
def test_a_plant_in_each_loss_fails_at_its_line(results, name, plant):
    comp = component(results["losses_planted"], name)
    assert comp.status == "fail", format_report(results["losses_planted"])
    assert plant[1].strip() in [f.code for f in comp.findings]


def _flat(step):
    return 0.1


def _runs_long(step):  # 10 s of CPU time: a probe's limit counts CPU, not the wall clock
    start = time.process_time()
    while time.process_time() - start < 10:
        pass
    return math.sin(step)


def _writes(step):
    with open("never_written", "w") as f:
        f.write(str(step))
    return step


def test_a_probe_that_finds_nothing_is_silent_and_bounded():
    start = time.process_time()
    assert [behaviour.found(fn) for fn in (_flat, _runs_long, _writes, len)] == [None] * 4
    assert time.process_time() - start < 6  # the 10 s probe stopped at PROBE_SECONDS of CPU


def _mean_over_batch(logits, targets):  # a planted mean over the batch: still a loss to grade
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / logits.shape[0]


def _perplexity(logits, targets):  # exp of the cross-entropy: no loss, never a count times it
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()).exp()


def _accuracy(logits, targets):  # higher where the targets are the likeliest: no loss
    return (logits.argmax(-1) == targets).float().mean() + 2.5


def test_a_loss_off_by_a_count_is_found_and_a_perplexity_or_an_accuracy_is_not():
    assert behaviour.found(_mean_over_batch)[0] == "loss"
    assert behaviour.found(_perplexity) is None
    assert behaviour.found(_accuracy) is None
