"""`[train] log = ["jsonl", "tensorboard"]`: the event files, read back with TensorBoard's own reader,
hold what metrics.jsonl holds (and a translation run's cross-attention picture); a missing package
or a bad list is one clear error; a failing event writer never stops training."""

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest
from helpers import require_module

from handformer.cli import main

event_accumulator = require_module("tensorboard.backend.event_processing.event_accumulator",
                                   "pip install 'handformer[tensorboard]'")

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BOARD = 'train.log=["jsonl", "tensorboard"]'

pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def train(config: str, out: Path, *sets: str, resume: bool = False) -> None:
    args = ["train", "--resume", str(out)] if resume else ["train", "--config", str(CONFIGS / config),
                                                            "--out", str(out)]
    for pair in ("train.progress=false", *sets):
        args += ["--set", pair]
    rc, _, err = run_cli(*args)
    assert rc == 0, err


def events(run_dir: Path):
    acc = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"),
                                             size_guidance={event_accumulator.SCALARS: 0,
                                                            event_accumulator.IMAGES: 0})
    acc.Reload()
    return acc


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scalar(acc, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def logged(recs: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in recs if key in r]


def test_a_language_model_run_logs_every_record_to_tensorboard(tmp_path):
    run = tmp_path / "lm"
    train("tiny_lm.toml", run, BOARD, "train.steps=20", "train.log_every=5", "train.eval_every=10")
    acc = events(run)
    recs = records(run)  # still the source of truth, written as before
    assert {"loss/train", "loss/val", "lr", "tokens_per_s", "grad_norm"} <= set(acc.Tags()["scalars"])
    for tag, key in (("loss/train", "train_loss"), ("loss/val", "val_loss"), ("lr", "lr"),
                     ("tokens_per_s", "tokens_per_s"), ("grad_norm", "grad_norm")):
        ours, theirs = logged(recs, key), scalar(acc, tag)
        assert [s for s, _ in theirs] == [s for s, _ in ours], tag
        assert [v for _, v in theirs] == pytest.approx([v for _, v in ours], rel=1e-6), tag  # float32
    assert [s for s, _ in logged(recs, "grad_norm")] == [5, 10, 15, 20]
    assert all(v > 0 for _, v in logged(recs, "grad_norm"))


def test_without_clipping_the_gradient_norm_is_still_logged(tmp_path):
    run = tmp_path / "noclip"
    train("tiny_lm.toml", run, "train.steps=10", "train.log_every=5", "train.clip_grad=0",
          "train.eval_every=10")
    assert [s for s, v in logged(records(run), "grad_norm") if v > 0] == [5, 10]
    assert not (run / "tensorboard").exists()  # "jsonl" alone, the default: no event files


def test_a_translation_run_shows_its_cross_attention_as_an_image(tmp_path):
    run = tmp_path / "mt"
    train("tiny_seq2seq.toml", run, BOARD, "train.steps=10", "train.eval_every=5", "train.log_every=5")
    acc = events(run)
    assert [v for _, v in scalar(acc, "loss/val")] == pytest.approx(
        [v for _, v in logged(records(run), "val_loss")], rel=1e-6)
    images = acc.Images("cross_attention/last_layer")
    assert [im.step for im in images] == [5, 10]
    # (T, S) weights of the first validation pair, 8 x 8 pixels a weight
    assert images[0].width % 8 == 0 and images[0].height % 8 == 0
    assert images[0].width > 8 and images[0].height > 8
    assert images[0].encoded_image_string[:4] == b"\x89PNG"


def test_a_resumed_run_continues_the_same_event_curves(tmp_path):
    run = tmp_path / "resumed"
    train("tiny_lm.toml", run, BOARD, "train.steps=10", "train.log_every=5", "train.eval_every=5")
    train("tiny_lm.toml", run, "train.steps=20", resume=True)
    steps = [s for s, _ in scalar(events(run), "loss/train")]
    assert steps == [s for s, _ in logged(records(run), "train_loss")] == [5, 10, 15, 20]


def test_a_failing_event_writer_never_stops_training(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def full_disk(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_scalar", full_disk)
    run = tmp_path / "full"
    with pytest.warns(UserWarning, match="TensorBoard events stopped .*No space left"):
        train("tiny_lm.toml", run, BOARD, "train.steps=10", "train.log_every=5", "train.eval_every=5")
    assert [r["step"] for r in records(run) if "train_loss" in r] == [5, 10]
    assert (run / "model.safetensors").is_file()


def test_tensorboard_asked_for_but_missing_is_one_error_naming_the_install(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    rc, _, err = run_cli("train", "--config", str(CONFIGS / "tiny_lm.toml"), "--out", str(tmp_path / "r"),
                         "--set", BOARD)
    assert rc == 2 and err.count("\n") == 1
    assert "pip install 'handformer[tensorboard]'" in err
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.parametrize("value, message", [
    ('["jsonl", "csv"]', "unknown 'csv'"),
    ('["tensorboard"]', 'keep "jsonl"'),
    ('"tensorboard"', "it must be a list of strings"),
])
def test_a_bad_log_list_is_one_error_naming_the_field(tmp_path, value, message):
    rc, _, err = run_cli("train", "--config", str(CONFIGS / "tiny_lm.toml"), "--out", str(tmp_path / "r"),
                         "--set", f"train.log={value}")
    assert rc == 2 and err.count("\n") == 1 and "log" in err and message in err, err
