"""The training side of the translation job: label-smoothed loss, learning-rate schedules, resumable
training (in process and with a real kill -9) and atomic, strict checkpoints."""

import functools
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import kill_9_after_first_checkpoint

from handformer import io as hf_io
from handformer.config import Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.tasks.translation import train as translation
from handformer.tasks.translation.job import TranslationJob
from handformer.tasks.translation.train import run_train
from handformer.training import loop as train_module
from handformer.training.checkpoint import (
    load_checkpoint,
    load_weights,
    read_safetensors,
    save_checkpoint,
    save_weights,
)
from handformer.training.loop import TrainConfig, evaluate, make_optimizer
from handformer.training.losses import token_cross_entropy
from handformer.training.schedules import learning_rate, paper_learning_rate

PAD = 0


pytestmark = pytest.mark.usefixtures("one_thread")


# --- label-smoothed cross-entropy ---------------------------------------------------------------

def _logits_and_targets(seed: int, B: int = 3, T: int = 5, V: int = 7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 3
    targets = torch.randint(1, V, (B, T), generator=g)
    targets[0, 3:] = PAD  # ragged targets, as after collate
    targets[2, 1:] = PAD
    return logits, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_all_pad_rows_change_neither_loss_nor_gradients(smoothing):
    logits, targets = _logits_and_targets(0)
    extra_logits = torch.randn(2, logits.size(1), logits.size(2)) * 5
    extra_targets = torch.full((2, targets.size(1)), PAD)

    base = logits.clone().requires_grad_()
    loss = token_cross_entropy(base, targets, PAD, smoothing)
    loss.backward()

    padded = torch.cat([logits, extra_logits]).requires_grad_()
    padded_loss = token_cross_entropy(padded, torch.cat([targets, extra_targets]), PAD, smoothing)
    padded_loss.backward()

    torch.testing.assert_close(padded_loss, loss, rtol=0, atol=1e-6)
    torch.testing.assert_close(padded.grad[: len(logits)], base.grad, rtol=0, atol=1e-7)
    assert torch.equal(padded.grad[len(logits):], torch.zeros_like(extra_logits))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_pad_targets_get_exactly_zero_gradient(smoothing):
    logits, targets = _logits_and_targets(1)
    logits.requires_grad_()
    token_cross_entropy(logits, targets, PAD, smoothing).backward()
    is_pad = targets == PAD
    assert is_pad.any() and (~is_pad).any()
    assert torch.equal(logits.grad[is_pad], torch.zeros_like(logits.grad[is_pad]))
    assert (logits.grad[~is_pad].abs().sum(-1) > 0).all()  # real tokens do learn


def test_no_smoothing_equals_summed_cross_entropy_ignoring_pad():
    logits, targets = _logits_and_targets(2)
    expected = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(token_cross_entropy(logits, targets, PAD, 0.0), expected)


def test_smoothing_is_the_papers_mixture_with_the_uniform_distribution():
    """eps spread uniformly over the vocabulary: (1 - eps) * NLL + eps * mean over v of -log p_v."""
    logits, targets = _logits_and_targets(3)
    eps = 0.1
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, targets[..., None]).squeeze(-1)
    uniform = -logp.mean(-1)
    real = targets != PAD
    expected = ((1 - eps) * nll + eps * uniform)[real].sum()
    torch.testing.assert_close(token_cross_entropy(logits, targets, PAD, eps), expected)


def test_without_a_pad_id_every_position_counts():
    logits, targets = _logits_and_targets(4)
    expected = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
    torch.testing.assert_close(token_cross_entropy(logits, targets, None), expected)


# --- learning-rate schedules --------------------------------------------------------------------

@pytest.mark.parametrize("d_model, warmup", [(512, 4000), (128, 100), (32, 1)])
def test_inverse_sqrt_is_the_papers_closed_form(d_model, warmup):
    peak = (d_model * warmup) ** -0.5
    steps = list(range(0, 3 * warmup + 5)) + [10 * warmup, 100_000, 1_000_000]
    for step in steps:
        got = learning_rate(step, "inverse_sqrt", peak, warmup, total_steps=1)
        assert got == pytest.approx(paper_learning_rate(step, d_model, warmup), rel=1e-12), step
    assert learning_rate(0, "inverse_sqrt", peak, warmup, 1) > 0
    # The peak is reached at the end of warmup (step warmup - 1, i.e. n = warmup).
    assert learning_rate(warmup - 1, "inverse_sqrt", peak, warmup, 1) == pytest.approx(peak)


@pytest.mark.parametrize("warmup, total, min_lr", [(10, 100, 1e-5), (1, 7, 0.0), (3, 50, 2e-4)])
def test_cosine_peaks_at_warmup_and_ends_at_min_lr(warmup, total, min_lr):
    lr = 1e-3
    lrs = [learning_rate(s, "cosine", lr, warmup, total, min_lr) for s in range(total)]
    assert lrs[0] > 0
    assert lrs[-1] == pytest.approx(min_lr, abs=1e-15)  # the last optimizer step uses min_lr
    peak_step = warmup - 1
    assert lrs[peak_step] == pytest.approx(lr)
    assert max(lrs) == pytest.approx(lr)
    assert all(a <= b for a, b in zip(lrs[: peak_step + 1], lrs[1: peak_step + 1]))  # warming up
    assert all(a >= b for a, b in zip(lrs[peak_step:], lrs[peak_step + 1:]))  # then decaying
    assert all(x >= min_lr - 1e-15 for x in lrs)


def test_cosine_without_warmup_decays_from_the_first_step():
    lrs = [learning_rate(s, "cosine", 1e-3, 0, 50, 2e-4) for s in range(50)]
    assert 1e-3 * 0.99 < lrs[0] <= 1e-3
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    assert lrs[-1] == pytest.approx(2e-4)


@pytest.mark.parametrize("warmup, total, cooldown", [(10, 100, 0.2), (0, 50, 0.5), (5, 20, 0.75)])
def test_trapezoid_warms_up_holds_the_peak_then_falls_straight_to_min_lr(warmup, total, cooldown):
    lrs = [learning_rate(s, "trapezoid", 1.0, warmup, total, 0.1, cooldown) for s in range(total)]
    decay = round(cooldown * total)
    assert lrs[: warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert lrs[warmup: total - decay] == pytest.approx([1.0] * (total - decay - warmup))
    tail = lrs[total - decay:]  # a straight line ending at min_lr on the last step
    assert tail[-1] == pytest.approx(0.1) and all(a > b for a, b in zip(tail, tail[1:]))
    steps = [b - a for a, b in zip(tail, tail[1:])]
    assert steps == pytest.approx([steps[0]] * len(steps))


def test_constant_schedule_and_unknown_name():
    assert [learning_rate(s, "constant", 1.0, 4, 10) for s in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        learning_rate(0, "linear", 1.0, 4, 10)


# --- a tiny translation job ---------------------------------------------------------------------

def tiny_job(steps: int = 12, **train) -> TranslationJob:
    return TranslationJob.from_dict({
        "data": {"train": "dates", "n_train": 60, "n_heldout": 12, "tokenizer": "char",
                 "max_tokens": 256, "max_length": 48},
        "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_encoder_layers": 1, "n_decoder_layers": 1,
                  "dropout": 0.3, "max_positions": 48},
        "train": {"steps": steps, "eval_every": 5, "checkpoint_every": 2, "log_every": 3, "warmup": 3,
                  "schedule": "cosine", "lr": 3e-3, "min_lr": 1e-4, "accumulation": 2,
                  "progress": False, "device": "cpu", **train},
    })


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock fields."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def checkpoint_state(run_dir: Path) -> dict:
    _, metadata = read_safetensors(run_dir / "checkpoint.safetensors")
    return json.loads(metadata["state"])


def model_tensors(run_dir: Path, name: str = "checkpoint.safetensors") -> dict:
    tensors, _ = read_safetensors(run_dir / name)
    return {k: v for k, v in tensors.items() if not k.startswith(("optim/", "rng/"))}


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


class Crash(Exception):
    pass


@pytest.fixture
def record_batches(monkeypatch):
    """Record the source ids of every training micro-batch, in order."""
    calls: list = []
    original = translation.seq2seq_loss

    def loss(model, batch, label_smoothing):
        if torch.is_grad_enabled():  # evaluate() runs under no_grad
            calls.append(batch.src.tolist())
        return original(model, batch, label_smoothing)

    monkeypatch.setattr(translation, "seq2seq_loss", loss)
    return calls


def test_resume_after_a_crash_reproduces_the_straight_run(tmp_path, monkeypatch, record_batches):
    """Crash at step 10 (an evaluation step, before its checkpoint), resume from the step-8
    checkpoint: metrics, data order and final weights equal an uninterrupted run's. log_every=3
    does not divide the checkpoint step, accumulation=2 and the end of an epoch are crossed."""
    quiet = {"log": lambda *a: None}
    straight_dir, crash_dir = tmp_path / "straight", tmp_path / "crash"
    run_train(tiny_job(), straight_dir, **quiet)
    straight_batches = list(record_batches)
    record_batches.clear()

    def crash(step, val_loss):
        if step == 10:
            raise Crash

    with monkeypatch.context() as m:
        m.setattr(train_module, "train", functools.partial(train_module.train, on_eval=crash))
        with pytest.raises(Crash):
            run_train(tiny_job(), crash_dir, **quiet)
    assert checkpoint_state(crash_dir)["step"] == 8
    crashed_batches = list(record_batches)
    record_batches.clear()
    assert len(crashed_batches) == 2 * 10  # it did run past the checkpoint before crashing

    run_train(tiny_job(), crash_dir, resume=True, **quiet)

    straight = metric_rows(straight_dir)
    assert [r["step"] for r in straight] == [3, 5, 6, 9, 10, 12]
    assert len({r["epoch"] for r in straight if "epoch" in r}) > 1  # crosses epoch boundaries
    assert metric_rows(crash_dir) == straight  # train_loss, lr, val_loss, epoch: exactly equal
    assert crashed_batches[: 2 * 8] + record_batches == straight_batches
    assert_same_tensors(model_tensors(crash_dir), model_tensors(straight_dir))
    assert_same_tensors(model_tensors(crash_dir, "model.safetensors"),
                        model_tensors(straight_dir, "model.safetensors"))
    assert checkpoint_state(crash_dir)["best_val_loss"] == checkpoint_state(straight_dir)["best_val_loss"]


def test_logged_lr_follows_the_schedule_and_ends_at_min_lr(tmp_path):
    job = tiny_job(steps=8, log_every=1, eval_every=100, checkpoint_every=0, accumulation=1)
    run_train(job, tmp_path, log=lambda *a: None)
    rows = metric_rows(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 9))
    cfg = job.train
    for r in rows:  # the lr logged at step s is the one used by the s-th optimizer step
        assert r["lr"] == learning_rate(r["step"] - 1, "cosine", cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr)
    assert rows[-1]["lr"] == pytest.approx(cfg.min_lr)
    assert "val_loss" in rows[-1]  # the last step is always evaluated


TINY_CLI = ["--config", "demo", "--set", "data.n_train=200", "--set", "data.n_heldout=20",
            "--set", "data.tokenizer=char", "--set", "model.d_model=16", "--set", "model.n_heads=2",
            "--set", "model.d_ff=32", "--set", "model.n_encoder_layers=1",
            "--set", "model.n_decoder_layers=1", "--set", "data.max_tokens=256",
            "--set", "train.steps=100", "--set", "train.eval_every=40", "--set", "train.log_every=7",
            "--set", "train.checkpoint_every=10", "--set", "train.warmup=20",
            "--set", "train.schedule=cosine", "--set", "train.progress=false", "--set", "train.device=cpu"]


def test_kill_9_then_resume_equals_a_straight_run(tmp_path, capsys):
    """A real `kill -9` of `handformer train` after its first checkpoint; `--resume` then finishes
    the run exactly as an uninterrupted one (run in process, single-threaded like the child)."""
    from handformer.cli import main

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    kill_9_after_first_checkpoint(["train", *TINY_CLI], killed)
    resumed_from = checkpoint_state(killed)["step"]
    assert 0 < resumed_from < 100, "the run finished before it could be killed"

    assert main(["train", "--resume", str(killed)]) == 0
    assert main(["train", *TINY_CLI, "--out", str(straight)]) == 0
    assert "done: 100 steps" in capsys.readouterr().out
    assert metric_rows(killed) == metric_rows(straight)
    assert_same_tensors(model_tensors(killed), model_tensors(straight))


# --- evaluation is deterministic ----------------------------------------------------------------

def tiny_model(seed: int = 0, dropout: float = 0.0, **overrides) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    cfg = dict(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2, d_ff=32,
               n_encoder_layers=1, n_decoder_layers=1, dropout=dropout, max_positions=32)
    return Seq2SeqTransformer(Seq2SeqConfig(**{**cfg, **overrides}))


def test_evaluate_turns_dropout_off_and_restores_training_mode():
    from handformer.data.batching import collate

    model = tiny_model(dropout=0.3).train()
    batches = [collate([[4, 5, 6, 2], [7, 2]], [[5, 6], [8, 9, 10]], PAD, 1, 2)]
    losses = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        losses.append(evaluate(model, batches, translation.seq2seq_loss, torch.device("cpu")))
    assert losses[0] == losses[1]
    assert model.training
    torch.manual_seed(0)
    a, _ = translation.seq2seq_loss(model, batches[0], 0.0)
    torch.manual_seed(1)
    b, _ = translation.seq2seq_loss(model, batches[0], 0.0)
    assert a != b  # dropout really is active in training mode, so the check above means something


def test_the_training_loss_skips_padded_rows_and_equals_the_full_logits_loss():
    """seq2seq_loss computes logits only where the target is real (logits_at); loss and
    gradients must equal the plain loss over the full (B, T, V) logits."""
    from handformer.data.batching import collate

    batch = collate([[4, 5, 6, 2], [7, 2], [9, 8, 2]], [[5, 6], [8, 9, 10, 4], [3]], PAD, 1, 2)
    assert (batch.tgt_out == PAD).any()  # the fixture really has padded rows
    losses, grads = [], []
    for fast in (True, False):
        model = tiny_model(seed=3)
        if fast:
            loss, _ = translation.seq2seq_loss(model, batch, 0.1)
        else:
            logits = model(batch.src, batch.tgt_in).logits  # (B, T, V)
            loss = token_cross_entropy(logits, batch.tgt_out, PAD, 0.1)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[0], losses[1])
    for name in grads[1]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_logits_at_selects_rows_of_the_full_logits_and_checks_its_mask():
    model = tiny_model(seed=4).eval()
    src = torch.tensor([[4, 5, 2, PAD], [6, 7, 8, 2]])
    tgt = torch.tensor([[1, 5, 6], [1, 9, PAD]])
    keep = torch.tensor([[True, False, True], [True, True, False]])
    full = model(src, tgt).logits  # (B, T, V)
    picked = model(src, tgt, logits_at=keep).logits  # (N, V)
    assert picked.shape == (4, full.size(-1))
    torch.testing.assert_close(picked, full[keep])
    with pytest.raises(ValueError, match="logits_at must be a bool tensor shaped like tgt_ids"):
        model(src, tgt, logits_at=keep.long())
    with pytest.raises(ValueError, match=r"shaped like tgt_ids \(2, 3\)"):
        model(src, tgt, logits_at=keep[:, :2])


def test_keep_freed_memory_is_idempotent_and_the_loop_calls_it_only_when_asked(tmp_path, monkeypatch):
    import ctypes.util

    from handformer.training import cpu_memory

    first = cpu_memory.keep_freed_memory()
    assert cpu_memory.keep_freed_memory() == first
    if sys.platform.startswith("linux") and ctypes.util.find_library("c"):
        assert first  # glibc accepted both settings
    calls = []
    monkeypatch.setattr(train_module, "keep_freed_memory", lambda: calls.append(1) or True)
    run_train(tiny_job(steps=1, keep_cpu_memory=False), tmp_path / "off", log=lambda *a: None)
    assert calls == []
    run_train(tiny_job(steps=1), tmp_path / "on", log=lambda *a: None)
    assert calls == [1]


def test_mallopt_receives_the_values_the_comment_promises(monkeypatch):
    """The values reach a C function taking (int, int), as glibc's mallopt does: none may wrap
    around (2**31 through a C int arrives as -2**31)."""
    import ctypes

    from handformer.training import cpu_memory

    received = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int)
    def fake_mallopt(param, value):
        received.append((param, value))
        return 1

    class FakeLibc:
        mallopt = fake_mallopt

    monkeypatch.setattr(cpu_memory, "_done", False)
    monkeypatch.setattr(cpu_memory.sys, "platform", "linux")
    monkeypatch.setattr(cpu_memory.ctypes, "CDLL", lambda name: FakeLibc())
    assert cpu_memory.keep_freed_memory()
    assert received == [(cpu_memory.M_MMAP_THRESHOLD, 1 << 30), (cpu_memory.M_TRIM_THRESHOLD, 2**31 - 1)]
    assert all(value > 0 for _, value in received)
    # The old call, for the record: what a C int makes of 2 * 1 GiB.
    assert ctypes.c_int(2 * (1 << 30)).value == -(2**31)


# --- checkpoints --------------------------------------------------------------------------------

def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path):
    model = tiny_model()
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    save_weights(model, tmp_path / "model.safetensors")
    save_checkpoint(tmp_path / "checkpoint.safetensors", model, optimizer, {"step": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.safetensors", "model.safetensors"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failing_write_leaves_the_previous_file_intact(tmp_path, monkeypatch, failing):
    path = tmp_path / "model.safetensors"
    save_weights(tiny_model(seed=0), path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(hf_io.os, failing, boom)  # the temporary file is fully written by now
    with pytest.raises(OSError, match="disk full"):
        save_weights(tiny_model(seed=1), path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


@pytest.mark.parametrize("share", [False, True])
def test_tied_weights_are_stored_once_and_load_back_strictly(tmp_path, share):
    model = tiny_model(seed=0, share_embeddings=share, tie_output=True)
    path = tmp_path / "model.safetensors"
    save_weights(model, path)
    stored, _ = read_safetensors(path)
    assert "generator.weight" not in stored
    assert ("tgt_embed.weight" in stored) is not share
    n_unique = len({p.data_ptr() for p in model.parameters()})
    assert len([k for k in stored if k in dict(model.named_parameters())]) == n_unique

    fresh = tiny_model(seed=1, share_embeddings=share, tie_output=True)
    load_weights(fresh, path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    assert fresh.generator.weight is fresh.tgt_embed.weight  # still tied after loading
    assert (fresh.src_embed.weight is fresh.tgt_embed.weight) is share


def test_untied_weights_are_all_stored(tmp_path):
    model = tiny_model(tie_output=False)
    save_weights(model, tmp_path / "m.safetensors")
    stored, _ = read_safetensors(tmp_path / "m.safetensors")
    assert set(stored) == set(model.state_dict())


@pytest.mark.parametrize("other, fragment", [
    ({"d_model": 32}, "src_embed.weight (11, 16) (model: (11, 32))"),
    ({"n_decoder_layers": 2}, "missing ['decoder.layers.1"),
    ({"tie_output": False}, "missing ['generator.weight']"),
])
def test_loading_into_a_mismatched_model_raises_a_clear_value_error(tmp_path, other, fragment):
    path = tmp_path / "model.safetensors"
    save_weights(tiny_model(), path)
    with pytest.raises(ValueError, match="does not match the model") as info:
        load_weights(tiny_model(**other), path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_loading_a_bigger_model_into_a_smaller_one_names_the_unexpected_keys(tmp_path):
    path = tmp_path / "model.safetensors"
    save_weights(tiny_model(n_encoder_layers=2), path)
    with pytest.raises(ValueError, match=r"unexpected \['encoder.layers.1"):
        load_weights(tiny_model(), path)


def test_checkpoint_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    from handformer.data.batching import collate

    model = tiny_model(seed=0, dropout=0.3)
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    batch = collate([[4, 5, 6, 2], [7, 2]], [[5, 6], [8, 9, 10]], PAD, 1, 2)
    translation.seq2seq_loss(model, batch, 0.1)[0].backward()
    optimizer.step()
    path = tmp_path / "checkpoint.safetensors"
    torch.manual_seed(123)
    save_checkpoint(path, model, optimizer, {"step": 7, "epoch": 1})
    expected_noise = torch.rand(3)

    fresh = tiny_model(seed=5, dropout=0.3)
    fresh_opt = make_optimizer(fresh, TrainConfig(), torch.device("cpu"))
    torch.manual_seed(999)
    assert load_checkpoint(path, fresh, fresh_opt) == {"step": 7, "epoch": 1}
    assert torch.equal(torch.rand(3), expected_noise)  # the RNG continues where it was saved
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    for p, q in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], fresh_opt.state[q][key])


def test_a_weights_file_is_not_a_training_checkpoint(tmp_path):
    model = tiny_model()
    save_weights(model, tmp_path / "model.safetensors")
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    with pytest.raises(ValueError, match="not a handformer training checkpoint"):
        load_checkpoint(tmp_path / "model.safetensors", model, optimizer)
    with pytest.raises(FileNotFoundError, match="no weights file"):
        load_weights(model, tmp_path / "missing.safetensors")


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_the_optimizer_sees_gradients_clipped_to_clip_grad(tmp_path, monkeypatch, clip):
    """The gradient norm at every optimizer step: at most clip_grad with clipping (these tiny
    models' raw norms are far above 0.05, so it is exactly clip_grad), unclipped without."""
    norms: list[float] = []

    def recording_optimizer(model, cfg, device):
        optimizer = make_optimizer(model, cfg, device)
        step = optimizer.step

        def recorded_step(*args, **kwargs):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
            return step(*args, **kwargs)

        optimizer.step = recorded_step
        return optimizer

    monkeypatch.setattr(train_module, "make_optimizer", recording_optimizer)
    run_train(tiny_job(steps=4, clip_grad=clip, eval_every=100), tmp_path / "run", log=lambda *_: None)
    assert len(norms) == 4
    if clip:
        assert norms == pytest.approx([clip] * 4, rel=1e-4)
    else:
        assert min(norms) > 0.5


def test_eval_mode_gives_the_model_back_as_it_was_even_after_an_error():
    from handformer.modes import eval_mode

    model = torch.nn.Sequential(torch.nn.Dropout(0.5))
    for training in (True, False):
        model.train(training)
        with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
            assert not model.training and not model[0].training
            raise RuntimeError("boom")
        assert model.training is training and model[0].training is training
