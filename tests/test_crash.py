"""Crashes at any byte of any file a training run writes, seeded random kill -9s, a full disk and two
runs on one directory: the run resumes to exactly the uninterrupted run's result, or says clearly
why it cannot.

A crash inside an atomic write (handformer.io) is emulated where it matters: the write dies after
some bytes of its temporary file, which stays behind as a kill -9 would leave it; metrics.jsonl, the
append-only log, is cut inside its last record. The default suite samples byte offsets; the slow
versions (`-m slow`) try every byte of the metrics record and 48 offsets spread over each other file.
"""

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import bare_packages

import handformer.io as hf_io
from handformer.cli import main
from handformer.training import checkpoint as checkpoint_module
from handformer.training.checkpoint import read_safetensors
from handformer.training.loggers import MetricsLog
from handformer.training.run_lock import LOCK_NAME, run_lock

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--config", "demo", *[a for pair in (
    "data.n_train=60", "data.n_heldout=6", "data.tokenizer=char", "data.max_tokens=256",
    "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_encoder_layers=1",
    "model.n_decoder_layers=1", "model.dropout=0.3", "train.steps=12", "train.eval_every=5",
    "train.checkpoint_every=2", "train.log_every=3", "train.warmup=3", "train.schedule=cosine",
    "train.progress=false", "train.device=cpu") for a in ("--set", pair)]]
# The files a run writes, in the order they are first written.
FILES = ["tokenizer.json", "config.json", "model.safetensors", "metrics.jsonl", "checkpoint.safetensors",
         "loss_curve.png"]


class Crash(BaseException):
    """Stands for the process dying: nothing in handformer catches it."""


def train(out: Path, *extra: str) -> int:
    return main(["train", *TINY, "--out", str(out), *extra])


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def weights(run_dir: Path, name: str) -> dict:
    tensors, _ = read_safetensors(run_dir / name)
    return {k: v for k, v in tensors.items() if not k.startswith("rng/")}


def assert_equals_straight(run_dir: Path, straight: Path) -> None:
    assert metric_rows(run_dir) == metric_rows(straight)
    for name in ("checkpoint.safetensors", "model.safetensors"):
        a, b = weights(run_dir, name), weights(straight, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert (run_dir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert hf_io.stale_temporary_files(run_dir) == []


@pytest.fixture(scope="module")
def straight(tmp_path_factory, one_thread):
    """The uninterrupted run, and how many times it wrote each file (atomic writes; metrics lines)."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    writes: dict[str, int] = {}
    real_replace, real_write = os.replace, MetricsLog.write

    def count_replace(src, dst):
        writes[Path(dst).name] = writes.get(Path(dst).name, 0) + 1
        return real_replace(src, dst)

    def count_line(self, record):
        writes["metrics.jsonl"] = writes.get("metrics.jsonl", 0) + 1
        return real_write(self, record)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(hf_io.os, "replace", count_replace)
        m.setattr(MetricsLog, "write", count_line)
        assert train(run_dir) == 0
    assert set(FILES) <= set(writes), writes
    return run_dir, writes


def crash_in_last_write(monkeypatch, run_dir: Path, name: str, nth: int) -> bytes:
    """Train until the nth (last) write of `name` and die inside it; returns the bytes the write was
    writing. For metrics.jsonl nothing of the record is written yet; for the other files the temporary
    file is left empty (`leave_partial` then fills it to a chosen length)."""
    seen = {"n": 0}
    caught: dict[str, object] = {}
    real_replace, real_write = os.replace, MetricsLog.write

    def replace(src, dst):
        if Path(dst).name == name:
            seen["n"] += 1
            if seen["n"] == nth:
                caught["data"], caught["tmp"] = Path(src).read_bytes(), src
                raise Crash
        return real_replace(src, dst)

    def write(self, record):
        seen["n"] += 1
        if seen["n"] == nth:
            caught["data"] = (json.dumps(record) + "\n").encode()
            raise Crash
        return real_write(self, record)

    with monkeypatch.context() as m:
        if name == "metrics.jsonl":
            m.setattr(MetricsLog, "write", write)
        else:
            m.setattr(hf_io.os, "replace", replace)
        with pytest.raises(Crash):
            train(run_dir)
    if "tmp" in caught:  # atomic_write removed its temporary file on the way out; a kill would not
        Path(caught["tmp"]).parent.mkdir(parents=True, exist_ok=True)
        Path(caught["tmp"]).write_bytes(b"")
    return caught["data"]


def leave_partial(run_dir: Path, name: str, data: bytes, keep: int) -> None:
    """What a kill -9 after `keep` bytes of the write leaves: a torn last metrics line, or a
    temporary file of `keep` bytes next to the intact previous file."""
    if name == "metrics.jsonl":
        with open(run_dir / name, "ab") as f:
            f.write(data[:keep])
    else:
        (tmp,) = [p for p in hf_io.stale_temporary_files(run_dir) if p.name.startswith(f".{name}.")]
        tmp.write_bytes(data[:keep])


def resume_after_crash(run_dir: Path, straight_dir: Path) -> None:
    if not (run_dir / "checkpoint.safetensors").exists():  # died before its first checkpoint
        assert main(["train", "--resume", str(run_dir)]) == 2
        assert train(run_dir, "--overwrite") == 0
    else:
        assert main(["train", "--resume", str(run_dir)]) == 0
    assert_equals_straight(run_dir, straight_dir)


def offsets(name: str, size: int, exhaustive: bool) -> list[int]:
    if exhaustive:
        return list(range(size)) if name == "metrics.jsonl" else sorted({size * i // 48 for i in range(48)})
    return [1, size // 2, size - 1] if name == "metrics.jsonl" else [size // 2]


def check_file(name: str, straight, tmp_path: Path, monkeypatch, exhaustive: bool) -> None:
    straight_dir, writes = straight
    crashed = tmp_path / "crashed"
    data = crash_in_last_write(monkeypatch, crashed, name, writes[name])
    for keep in offsets(name, len(data), exhaustive):
        run_dir = tmp_path / f"keep{keep}"
        shutil.copytree(crashed, run_dir)
        leave_partial(run_dir, name, data, keep)
        resume_after_crash(run_dir, straight_dir)
        shutil.rmtree(run_dir)


@pytest.mark.parametrize("name", FILES)
def test_a_crash_inside_the_last_write_of_each_file_resumes(name, straight, tmp_path, monkeypatch, capsys):
    check_file(name, straight, tmp_path, monkeypatch, exhaustive=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_a_crash_at_every_byte_of_the_last_write_resumes(name, straight, tmp_path, monkeypatch, capsys):
    check_file(name, straight, tmp_path, monkeypatch, exhaustive=True)


def test_a_broken_line_before_the_last_is_named_not_repaired(straight, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(straight[0], run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:10]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["train", "--resume", str(run_dir), "--set", "train.steps=14"]) == 2
    assert "metrics.jsonl line 2 is not a JSON object" in capsys.readouterr().err


# --- a full disk ----------------------------------------------------------------------------------

def test_a_full_disk_while_checkpointing_is_one_clear_error_and_resumable(straight, tmp_path, monkeypatch,
                                                                          capsys):
    run_dir = tmp_path / "run"
    real = checkpoint_module.atomic_write_bytes
    calls = {"n": 0}

    def full_disk(path, data):
        if Path(path).name == "checkpoint.safetensors":
            calls["n"] += 1
            if calls["n"] == 3:  # the step-6 checkpoint: half written, then the disk is full
                def write(tmp):
                    with open(tmp, "wb") as f:
                        f.write(data[: len(data) // 2])
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                before.append((run_dir / "checkpoint.safetensors").read_bytes())
                return hf_io.atomic_write(path, write)
        return real(path, data)

    before: list[bytes] = []
    monkeypatch.setattr(checkpoint_module, "atomic_write_bytes", full_disk)
    assert train(run_dir) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: could not write ") and "No space left" in err[0]
    assert "checkpoint.safetensors (step 4) is intact" in err[0] and f"--resume {run_dir}" in err[0]
    assert (run_dir / "checkpoint.safetensors").read_bytes() == before[0]  # the step-4 checkpoint
    assert hf_io.stale_temporary_files(run_dir) == []
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert_equals_straight(run_dir, straight[0])


# --- two runs on one directory --------------------------------------------------------------------

def test_a_second_train_on_a_busy_run_directory_names_the_first(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with run_lock(run_dir):  # as another `handformer train` would hold it
        assert train(run_dir) == 2
        err = capsys.readouterr().err
        assert f"is in use by another `handformer train` (pid {os.getpid()})" in err
    assert not run_dir.exists()  # nothing was written but the lock, which its holder took away
    assert train(run_dir) == 0  # free again once the holder is gone
    assert (run_dir / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_the_lock_holds_across_processes_and_dies_with_its_holder(tmp_path):
    run_dir = tmp_path / "run"
    code = (bare_packages("handformer") + "import time\nfrom handformer.training.run_lock import run_lock\n"
            f"with run_lock({str(run_dir)!r}):\n    print('locked', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(ValueError, match=f"pid {holder.pid}"):
            with run_lock(run_dir):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    with run_lock(run_dir):  # kill -9 released it
        pass


# --- seeded random kill -9s -----------------------------------------------------------------------

LONGER = ["--set", "train.steps=150", "--set", "train.checkpoint_every=10"]


def kill_at_random_moments(run_dir: Path, seed: int, kills: int) -> int:
    """Start `handformer train` (or resume it) and SIGKILL it after a random delay, `kills` times;
    then let the last resume finish. Returns how many kills landed on a live process."""
    rng = random.Random(seed)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    landed = 0
    for _ in range(kills):
        resuming = (run_dir / "checkpoint.safetensors").exists()
        args = (["train", "--resume", str(run_dir)] if resuming
                else ["train", *TINY, *LONGER, "--out", str(run_dir), "--overwrite"])
        proc = subprocess.Popen([sys.executable, "-m", "handformer", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        time.sleep(rng.uniform(1.0, 8.0))  # python + torch start-up is a few seconds of this
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            landed += 1
        proc.wait(timeout=120)
    if (run_dir / "checkpoint.safetensors").exists():
        assert main(["train", "--resume", str(run_dir)]) == 0
    else:
        assert train(run_dir, *LONGER, "--overwrite") == 0
    return landed


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_seeded_random_kill_9s_then_resume_equal_the_straight_run(seed, tmp_path, capsys):
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "run"
    assert train(straight_dir, *LONGER) == 0
    landed = kill_at_random_moments(run_dir, seed, kills=5)
    assert landed >= 1, "every process finished before its kill; the delays are too long"
    assert_equals_straight(run_dir, straight_dir)
