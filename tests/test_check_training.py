"""`handformer check` on the training chapter's learning-rate schedule: the paper's warmup schedule
and cosine with warmup, as functions of the step and as scheduler factories, in the conventions
learners count steps in (each planted mistake is named in tests/test_check.py)."""

from __future__ import annotations

import json

import pytest
from check_plants import FIXTURES, WRITTEN, correct_file

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report, to_json
from handformer.check.core.special_ids import SpecialIds

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_correct_file_passes():
    result = check_file(str(correct_file("training")))
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("rate", "schedule", "pass"), ("get_lr_cosine_schedule", "schedule", "pass"),
        ("make_scheduler", "schedule", "pass"), ("masked_cross_entropy", "loss", "pass"),
        ("LabelSmoothing", "loss", "pass"), ("train_step", "train_step", "pass")], format_report(result)
    rate, cosine, factory, ce, smoothing, step = result.components
    assert ce.convention["en"] == "cross-entropy; a mean over the real tokens"
    assert smoothing.convention["en"].startswith("KL divergence") and "V - 2" in smoothing.convention["en"]
    assert any("flattened (B * T, V)" in n["en"] for n in smoothing.notes)
    assert rate.convention["en"].startswith("steps counted from 1")
    assert factory.convention["en"].startswith("steps counted from 0")
    assert cosine.convention["en"].startswith("warmup t / T_w")
    assert any("0 at step 0" in n["en"] for n in cosine.notes)
    assert any("stepped on an SGD" in n["en"] for n in factory.notes)
    assert exit_code(result) == 0


OTHER_SCHEDULES = '''
import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    # nanoGPT's, with its constants as arguments
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    # Hugging Face's: a multiplier of the optimizer's lr, from 0 to 1 and down to 0
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return current_step / max(1, num_warmup_steps)
        progress = (current_step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        progress = min(1.0, progress)  # Hugging Face's climbs back after num_training_steps
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return LambdaLR(optimizer, lr_lambda)


def noam_schedule(step, d_model, warmup_steps):
    # counted from 0, as a tensor
    n = torch.tensor(step + 1.0)
    return d_model ** -0.5 * torch.minimum(n ** -0.5, n * warmup_steps ** -1.5)
'''


def test_schedules_written_as_nanogpt_hugging_face_and_with_tensors_pass(tmp_path):
    path = tmp_path / "schedules.py"
    path.write_text(OTHER_SCHEDULES)
    result = check_file(str(path))
    assert [(c.name, c.status) for c in result.components] == [
        ("noam_schedule", "pass"), ("get_lr", "pass"), ("get_cosine_schedule_with_warmup", "pass")], (
        format_report(result))
    conventions = [c.convention["en"] for c in result.components]
    assert conventions[0].startswith("steps counted from 0") and "(nanoGPT)" in conventions[1]
    # Hugging Face's own: its cosine climbs back past num_training_steps; it names no floor, so past the
    # end is outside its range (DIFFERS, said); a schedule that names min_lr FAILs (the cosine_no_floor plant)
    path.write_text(OTHER_SCHEDULES.replace("        progress = min(1.0, progress)", "        pass"))
    (hf,) = check_file(str(path), overrides={"schedule": "get_cosine_schedule_with_warmup"},
                       only=["schedule"]).components
    assert hf.status == "differs" and not hf.findings, format_report(check_file(str(path), only=["schedule"]))
    assert any("step 150: 0.5868), as Hugging Face's" in n["en"] for n in hf.notes), hf.notes


def test_a_learners_broken_schedule_fails_never_the_grader(tmp_path):
    """Globals instead of arguments (nanoGPT's get_lr(it)), a string returned, an exception after
    step 0: an error or a failure of the learner's, with what to change; never an internal error."""
    path = tmp_path / "broken.py"
    path.write_text("WARMUP = 10\n\n\ndef get_lr(it):\n    return it / WARMUP\n\n\n"
                    "def rate(step, d_model, warmup):\n    return 'fast'\n\n\n"
                    "def cosine_schedule(it, max_lr, min_lr, warmup, total_steps):\n"
                    "    if it > 50:\n        raise ValueError('not written yet')\n    return max_lr\n")
    result = check_file(str(path))  # in-process: the command line's child is tests/test_check.py's
    comps = {c["name"]: c for c in json.loads(to_json(result))["components"]}
    assert exit_code(result) == 1 and set(comps) == {"get_lr", "rate", "cosine_schedule"}
    assert comps["get_lr"]["error"]["kind"] == "mapping"
    assert "cannot tell which schedule" in comps["get_lr"]["error"]["message"]
    assert "returned str at step 1" in comps["rate"]["error"]["message"]
    err = comps["cosine_schedule"]["error"]
    assert err["kind"] == "exception" and err["traceback"] == [
        "line 14, in cosine_schedule: raise ValueError('not written yet')"]


def test_the_schedule_is_reported_in_chinese_from_the_same_result():
    result = check_file(str(correct_file("training")), only=["schedule"])
    zh = format_report(result, "zh")
    assert "rate（学习率调度）：通过" in zh and "步数从 1 开始数" in zh and "步 0 的学习率为 0" in zh


def test_a_loss_that_returns_no_number_or_takes_unknown_arguments_is_told_what_to_change(tmp_path):
    path = tmp_path / "losses.py"
    path.write_text("import torch.nn.functional as F\n\n\n"
                    "def masked_cross_entropy(logits, targets, pad_idx):\n"
                    "    return F.cross_entropy(logits.transpose(1, 2), targets, reduction='none')\n\n\n"
                    "def compute_loss(logits, targets, model):\n    return 0.0\n")
    result = check_file(str(path), only=["loss"])
    per_token, unknown = result.components
    assert per_token.error.kind == "exception" and "returned a tensor of shape (3, 5)" in per_token.error.message
    assert "a loss returns one number" in per_token.error.message
    assert unknown.error.kind == "mapping" and "cannot fill the argument 'model'" in unknown.error.message


def test_the_mask_helpers_pass():
    result = check_file(str(correct_file("assembly")))
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("make_src_mask", "mask_helper", "pass"), ("make_tgt_mask", "mask_helper", "pass"),
        ("create_masks", "mask_helper", "pass"), ("greedy_decode", "greedy_decode", "pass")], format_report(result)
    assert len(result.components[2].checks) == 2  # the source mask and the target mask


OTHER_MASKS = '''
import torch


def make_pad_mask(src):
    # torch.nn's polarity: True = masked, (B, S), pad id 0
    return src == 0


def make_tgt_mask(tgt, pad_idx):
    # torch.nn's polarity, masked if padding or future
    T = tgt.size(1)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    return (tgt == pad_idx)[:, None, None, :] | future


def make_trg_mask(trg, pad_idx):
    # additive, causal only (the padding is at the end)
    T = trg.size(1)
    return torch.triu(torch.full((T, T), float("-inf")), diagonal=1).expand(trg.size(0), 1, T, T)
'''


def test_mask_helpers_in_other_polarities_and_shapes_pass_and_a_masked_and_is_named(tmp_path):
    path = tmp_path / "masks.py"
    path.write_text(OTHER_MASKS)
    result = check_file(str(path))
    assert [(c.name, c.status) for c in result.components] == [
        ("make_tgt_mask", "pass"), ("make_trg_mask", "pass"), ("make_pad_mask", "pass")], format_report(result)
    tgt, trg, pad = result.components
    assert tgt.convention["en"].startswith("True = masked") and trg.convention["en"].startswith("additive")
    assert any("causal only" in n["en"] for n in trg.notes)
    assert any("takes no pad id" in n["en"] for n in pad.notes)
    path.write_text(OTHER_MASKS.replace("(tgt == pad_idx)[:, None, None, :] | future",
                                        "(tgt == pad_idx)[:, None, None, :] & future"))
    (tgt,) = check_file(str(path), only=["mask_helper"]).components[:1]
    assert [(f.name, f.form) for f in tgt.findings] == [("mask_combined_with_or", "and")]


STEP_STYLES = '''
import torch


def train_step(model, batch, optimizer, criterion):
    # the batch as an object with fields, no clipping
    model.train()
    logits = model(batch.src, batch.tgt[:, :-1], None, None)  # masks: the model builds its own
    loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def training_step(model, optimizer, src, tgt):
    # src and tgt themselves, a criterion of its own, clipping at 1.0
    model.train()
    logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=0)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
'''


def test_training_steps_of_other_shapes_pass(tmp_path):
    path = tmp_path / "steps.py"
    path.write_text(STEP_STYLES)
    result = check_file(str(path))
    assert [(c.name, c.status) for c in result.components] == [("train_step", "pass"), ("training_step", "pass")], (
        format_report(result))
    assert any("clips the gradient norm at 1" in n["en"] for n in result.components[1].notes)
    path.write_text(STEP_STYLES.replace(
        "def train_step(model, batch, optimizer, criterion):", "def train_step(model, batch, optimizer, vocab):"))
    (comp,) = check_file(str(path), only=["train_step"]).components[:1]
    assert comp.error.kind == "mapping" and "cannot fill the argument 'vocab'" in comp.error.message


FAIRSEQ_STYLE = '''
def label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index):
    # as fairseq returns it: (smoothed loss, plain nll), both summed over the real tokens; the
    # smoothing goes to the V - 1 tokens that are not the target
    real = (target != ignore_index).to(lprobs.dtype)
    picked = lprobs.gather(-1, target[..., None])[..., 0]
    others = lprobs.sum(-1) - picked
    share = epsilon / (lprobs.size(-1) - 1)
    nll = -(picked * real).sum()
    return -(((1.0 - epsilon) * picked + share * others) * real).sum(), nll
'''


def test_a_fairseq_style_loss_that_returns_a_pair_is_read_as_its_first(tmp_path):
    path = tmp_path / "fairseq.py"
    path.write_text(FAIRSEQ_STYLE)
    (comp,) = check_file(str(path)).components
    assert comp.status == "pass", comp
    assert "V - 1 other tokens" in comp.convention["en"] and "a sum over the real tokens" in comp.convention["en"]


ANNOTATED_GREEDY = '''
import torch


def greedy_decode(model, src, src_mask, max_len, start_symbol):
    # no end symbol: max_len tokens, the start symbol included; the model called directly
    ys = torch.ones(1, 1, dtype=src.dtype) * start_symbol
    for _ in range(max_len - 1):
        logits = model(src, ys)
        best = logits[0, -1].max(dim=-1).indices.view(1, 1).to(src.dtype)
        ys = torch.cat([ys, best], dim=1)
    return ys
'''


def test_greedy_decoding_without_an_end_symbol_is_compared_over_max_len(tmp_path):
    path = tmp_path / "greedy.py"
    path.write_text(ANNOTATED_GREEDY)
    (comp,) = check_file(str(path)).components
    assert comp.status == "pass", comp
    assert any("cannot stop at EOS" in n["en"] for n in comp.notes)


VOCAB_GREEDY = FIXTURES / "learners_decoding_vocab" / "translate_vocab_correct.py"


def test_a_decoder_handed_a_vocabulary_and_a_device_reads_its_special_ids_from_them(tmp_path):
    """greedy_decode(model, src, src_mask, tgt_vocab, max_len, device): the vocabulary (or tokenizer)
    answers the runner's BOS / EOS / PAD under every lookup tokenizers offer, the device is "cpu"; the
    loop reads an EOS from it, so it must stop there."""
    ids = SpecialIds(bos=1, eos=2, pad=0, unk=3)
    assert [ids.token_to_id("[SOS]"), ids["<eos>"], ids.stoi["<pad>"], ids.convert_tokens_to_ids("</s>"),
            ids.get("hello"), ids.bos_id(), ids.eos_token_id] == [1, 2, 0, 2, 3, 1, 2]
    (comp,) = check_file(str(VOCAB_GREEDY), only=["greedy_decode"]).components
    assert comp.status == "pass" and "1 3 10 10 2" in comp.checks[0].name["en"], comp
    runs_on = tmp_path / "runs_on.py"
    runs_on.write_text(VOCAB_GREEDY.read_text().replace("        if next_id == eos_id:\n            break\n", ""))
    result = check_file(str(runs_on), only=["greedy_decode"])
    (comp,) = result.components
    assert [(f.name, f.line) for f in comp.findings] == [("greedy_no_stop_at_eos", 19)], format_report(result)


def test_greedy_decoding_passes_and_its_report_is_chinese_too():
    result = check_file(str(correct_file("assembly")), only=["greedy_decode"])
    (comp,) = result.components
    assert comp.status == "pass" and "1 3 10 10 2" in comp.checks[0].name["en"]
    assert comp.driven["en"].startswith("a stand-in: handformer's tiny Seq2SeqTransformer")
    assert "greedy_decode（贪心解码（编码器-解码器））：通过" in format_report(result, "zh")


def test_an_accumulating_step_and_an_epoch_pass_with_the_learners_own_criterion():
    result = check_file(str(correct_file("loop")))
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("LabelSmoothing", "loss", "pass"), ("train_step", "train_step", "pass"),
        ("train_epoch", "train_epoch", "pass")], format_report(result)
    _, step, epoch = result.components
    assert any(n["en"].startswith("accum_steps=2: each batch") for n in step.notes)
    for comp in (step, epoch):
        assert any("your own LabelSmoothing" in n["en"] for n in comp.notes)
    assert "你自己的 LabelSmoothing" in format_report(result, "zh")


def test_the_learners_criterion_is_built_for_the_steps_vocabulary(tmp_path):
    """The step hands the learner's loss the sizes of its own model (its vocabulary, not the loss
    runner's): a LabelSmoothing that asserts its width passes its own check and the step's."""
    source = correct_file("loop").read_text()
    path = tmp_path / "asserts_width.py"
    path.write_text(source.replace("        smoothed = torch.full_like(",
                                   "        assert x.size(-1) == self.size, 'built for another vocabulary'\n"
                                   "        smoothed = torch.full_like("))
    result = check_file(str(path), only=["loss", "train_step"])
    assert [c.status for c in result.components] == ["pass", "pass"], format_report(result)
    assert any("your own LabelSmoothing" in n["en"] for n in result.components[1].notes)


def test_a_step_with_handformers_criterion_differs_from_one_with_a_smoothed_criterion(tmp_path):
    """The criterion matters: the same step, its file without a loss of its own, is handed
    handformer's cross-entropy, and its parameters still match handformer's step."""
    source = correct_file("loop").read_text()
    path = tmp_path / "no_loss.py"
    path.write_text(source.replace("class LabelSmoothing(nn.Module):", "class Smoother(nn.Module):"))
    result = check_file(str(path), only=["train_step", "train_epoch"])
    assert [c.status for c in result.components] == ["pass", "pass"], format_report(result)
    assert not any("your own" in n["en"] for c in result.components for n in c.notes)


MINIMIND_LR = """
import math


def get_lr(current_step, total_steps, lr):
    return lr / 10 + 0.5 * lr * (1 + math.cos(math.pi * current_step / total_steps))
"""


def test_a_cosine_without_warmup_and_a_floor_of_its_own_is_read_as_written(tmp_path):
    """get_lr(current_step, total_steps, lr), no warmup, the floor lr / 10 a constant of the learner's:
    half a cosine from lr passes; lr as the amplitude above the floor (a peak of 1.1 x lr) differs, named;
    a quarter of a cosine fails with the values shown."""
    (right,) = check_file(str(WRITTEN["kvcache"] / "correct.py"), only=["schedule"]).components
    assert right.status == "pass" and right.convention["en"].startswith("no warmup: half a cosine from 1 x lr")
    assert "0.1 x lr at the last step (the floor is a constant of your own)" in right.convention["en"]
    path = tmp_path / "lr.py"
    path.write_text(MINIMIND_LR)
    (amplitude,) = check_file(str(path)).components
    assert amplitude.status == "differs" and "the peak is 1.1 x lr, not lr" in amplitude.convention["en"]
    assert "峰值是 1.1 × lr" in amplitude.convention["zh"]
    path.write_text(MINIMIND_LR.replace("current_step / total_steps", "current_step / (2 * total_steps)"))
    (quarter,) = check_file(str(path)).components
    assert quarter.status == "fail" and quarter.convention is None
    assert any(n["en"].startswith("it is not half a cosine") for n in quarter.notes)


TORCH_STYLE_SCHEDULES = '''
import math
from dataclasses import dataclass

from torch.optim.lr_scheduler import LambdaLR


@dataclass
class Hyper:
    max_lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    max_steps: int = 5000
    grad_clip: float = 1.0


def lr_for(step, hp: Hyper):
    if step < hp.warmup_steps:
        return hp.max_lr * (step + 1) / hp.warmup_steps
    if step > hp.max_steps:
        return hp.min_lr
    ratio = (step - hp.warmup_steps) / (hp.max_steps - hp.warmup_steps)
    return hp.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (hp.max_lr - hp.min_lr)


def linear_warmup_cosine(optimizer, num_warmup_steps, num_training_steps):
    def factor(s):
        if s < num_warmup_steps:
            return s / max(1, num_warmup_steps)
        progress = (s - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return LambdaLR(optimizer, factor)


def inverse_sqrt_warmup(optimizer, d_model, warmup_steps):
    def factor(s):
        s = max(s, 1)
        return d_model ** -0.5 * min(s ** -0.5, s * warmup_steps ** -1.5)
    return LambdaLR(optimizer, factor)


BUILDERS = {"cosine": linear_warmup_cosine, "noam": inverse_sqrt_warmup}


def get_scheduler(name, optimizer, **kwargs):
    return BUILDERS[name](optimizer, **kwargs)
'''
# one planted mistake in each schedule (verified against transformers' get_cosine_schedule_with_warmup
# and get_inverse_sqrt_schedule in /tmp/dev_e60k): its line, and the catalogued name where it has one
TORCH_STYLE_PLANTS = {
    "lr_for": ("ratio = (step - hp.warmup_steps) / (hp.max_steps - hp.warmup_steps)",
               "ratio = (step - hp.warmup_steps) / (2 * hp.max_steps - hp.warmup_steps)", "departs"),
    "linear_warmup_cosine": ("progress = (s - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)",
                             "progress = s / max(1, num_training_steps)", "cosine_from_step_zero"),
    "inverse_sqrt_warmup": ("s = max(s, 1)", "s = s", "schedule_step_zero"),
}


def test_schedules_found_by_signature_with_a_config_a_lambda_lr_and_a_registry(tmp_path):
    """A schedule reading its settings from a dataclass argument, LambdaLR factories found by their
    arguments (optimizer, then settings), a registry that picks one by name (not graded itself: what
    it calls is); each planted mistake FAILs quoting its line, the step-0 division caught while the
    LambdaLR is built."""
    path = tmp_path / "torch_style.py"
    path.write_text(TORCH_STYLE_SCHEDULES)
    result = check_file(str(path), only=["schedule"])
    assert [(c.name, c.status) for c in result.components] == [
        ("lr_for", "pass"), ("linear_warmup_cosine", "differs"), ("inverse_sqrt_warmup", "pass")], (
        format_report(result))
    planted = TORCH_STYLE_SCHEDULES
    for right, wrong, _ in TORCH_STYLE_PLANTS.values():
        planted = planted.replace(right, wrong)
    path.write_text(planted)
    lines = planted.splitlines()
    result = check_file(str(path), only=["schedule"])
    for comp in result.components:
        wrong, name = TORCH_STYLE_PLANTS[comp.name][1:]
        assert comp.status == "fail" and [f.name for f in comp.findings] == [name], format_report(result)
        code = lines[comp.findings[0].line - 1]
        assert wrong in code or "s ** -0.5" in code, (comp.name, code)  # step 0 raises at its power


STEP_WITH_SETTINGS = '''
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Settings:
    peak_lr: float = 1e-3
    warmup_iters: int = 4
    max_iters: int = 40
    grad_accum: int = 4
    clip_norm: float = 0.5


def rate_at(step, s: Settings):
    if step < s.warmup_iters:
        return s.peak_lr * (step + 1) / s.warmup_iters
    progress = min(1.0, (step - s.warmup_iters) / (s.max_iters - s.warmup_iters))
    return 0.5 * s.peak_lr * (1 + math.cos(math.pi * progress))


def one_update(model, optimizer, x, y, step, s: Settings):
    for group in optimizer.param_groups:
        group["lr"] = rate_at(step, s)
    optimizer.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(s.grad_accum), y.chunk(s.grad_accum)):
        loss = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten()) / s.grad_accum
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip_norm)
    optimizer.step()
'''


def test_a_step_with_its_iteration_and_a_settings_dataclass_is_driven(tmp_path):
    """nanoGPT's train_step(model, optimizer, X, Y, iter_num, cfg) in another hand: the settings built
    at the learner's defaults with 2 micro-steps, its own clipping norm, the rate it writes into the
    optimizer read back for the reference (checked against a full-batch AdamW loop in /tmp/dev_e60k);
    the loss not divided and the rate never written are named."""
    path = tmp_path / "step_settings.py"
    path.write_text(STEP_WITH_SETTINGS)
    (step,) = check_file(str(path), only=["lm_train_step"]).components
    assert step.status == "pass", format_report(check_file(str(path), only=["lm_train_step"]))
    assert step.checks[0].name["en"].startswith("AdamW, learning rates 0.00025 then 0.0005"), step.checks[0]
    planted = STEP_WITH_SETTINGS.replace(" / s.grad_accum\n", "\n").replace(
        'group["lr"] = rate_at(step, s)', 'lr = rate_at(step, s)')  # computed, never written
    path.write_text(planted)
    (step,) = check_file(str(path), only=["lm_train_step"]).components
    assert step.status == "fail" and {f.name for f in step.findings} == {
        "train_step_loss_not_divided", "train_step_lr_not_set"}, [f.name for f in step.findings]


LOADER_STEP = FIXTURES / "learners_lm_loader" / "draw_step_correct.py"


def test_a_language_model_step_that_draws_its_micro_batches_from_a_loader_is_driven(tmp_path):
    """optimize_step(model, opt, data_iter, accum_steps, max_norm=0.5) draws (x, y) with next(data_iter)
    (build-nanogpt: train_loader.next_batch()): handed this step's batch in accum_steps micro-batches,
    clipped at its own default norm; a loss left undivided is named."""
    (comp,) = check_file(str(LOADER_STEP)).components
    assert (comp.kind, comp.status) == ("lm_train_step", "pass"), comp
    assert any("clips the gradient norm at 0.5" in n["en"] for n in comp.notes)
    undivided = tmp_path / "undivided.py"
    undivided.write_text(LOADER_STEP.read_text().replace("targets.view(-1)) / accum_steps", "targets.view(-1))"))
    result = check_file(str(undivided))
    assert [f.name for c in result.components for f in c.findings] == ["train_step_loss_not_divided"]
    assert exit_code(result) == 1


PAIRED_STEP = '''import torch
import torch.nn.functional as F

base_lr, warmup = 6e-6, 4


def lr_at(step_num):
    return base_lr * min(1.0, (step_num + 1) / warmup)


def train_step(net, batch, opt, step_num, clip=5.0):
    for group in opt.param_groups:
        group["lr"] = lr_at(step_num)
    xb, yb = batch
    logits = net(xb)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), yb.view(-1))
    opt.zero_grad()
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
    opt.step()
    return loss.item()
'''


def test_a_step_handed_its_windows_as_one_batch_pair_is_driven_and_a_skipped_clip_is_named(tmp_path):
    """train_step(net, batch, opt, step_num) unpacking `xb, yb = batch` (nanoGPT's get_batch pair) is a
    language model's step; its clipping, which AdamW's scale-free update hides, is seen with SGD over
    the clipping norm: a guard that never clips is named at its line."""
    path = tmp_path / "paired_step.py"
    path.write_text(PAIRED_STEP)
    (step,) = check_file(str(path), only=["lm_train_step"]).components
    assert step.status == "pass", format_report(check_file(str(path), only=["lm_train_step"]))
    path.write_text(PAIRED_STEP.replace("if clip > 0:", "if clip < 0:"))
    (step,) = check_file(str(path), only=["lm_train_step"]).components
    assert step.status == "fail" and [(f.name, f.line) for f in step.findings] == [
        ("train_step_not_clipped", 19)], [(f.name, f.line) for f in step.findings]


CRITERION_FIRST = '''def seq2seq_loss(criterion, scores, next_ids):
    """scores (B, T, V), next_ids (B, T): the criterion applied to every position."""
    return criterion(scores.reshape(-1, scores.size(-1)), next_ids.reshape(-1))
'''


def test_a_loss_that_takes_its_criterion_first_is_handed_the_stand_in_criterion(tmp_path):
    """seq2seq_loss(criterion, scores, next_ids): the criterion is a part it is handed (the summed
    cross-entropy of the real tokens), never its input; the data are the remaining arguments."""
    path = tmp_path / "criterion_first.py"
    path.write_text(CRITERION_FIRST)
    (loss,) = check_file(str(path), only=["loss"]).components
    assert loss.status == "pass", format_report(check_file(str(path), only=["loss"]))
    path.write_text(CRITERION_FIRST.replace("next_ids.reshape(-1))", "next_ids.reshape(-1)) / next_ids.size(0)"))
    (loss,) = check_file(str(path), only=["loss"]).components
    assert loss.status == "fail" and loss.findings[0].line == 3, [(f.name, f.line) for f in loss.findings]


EPOCH = FIXTURES / "learners_s2s_epoch" / "train_with_clip.py"


@pytest.mark.parametrize(("old", "new", "name"), [
    (None, None, None),
    ("labels = trg[:, 1:].reshape(-1)", "labels = trg[:, :-1].reshape(-1)", "train_step_no_shift"),
    ("        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n        optimizer.step()\n",
     "        optimizer.step()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n",
     "train_step_clip_after_step")])
def test_an_epoch_handed_its_clipping_norm_and_enumerating_its_batches_is_driven(tmp_path, old, new, name):
    """train(model, iterator, optimizer, criterion, clip), found by its arguments: handed the norm it
    clips at, each batch the second name of `for i, batch in enumerate(iterator)`; its plants FAIL at
    their lines."""
    from check_plants import edited_copy

    result = check_file(edited_copy(tmp_path, EPOCH, [(old, new)]) if old else str(EPOCH))
    (comp,) = result.components
    assert comp.status == ("fail" if old else "pass"), format_report(result)
    if old:
        assert (comp.findings[0].name, new.strip().splitlines()[-1].strip()) == (name, comp.findings[0].code), (
            format_report(result))
