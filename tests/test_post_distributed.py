"""SFT and DPO under torchrun's setup (gloo, 2 processes, torch.multiprocessing.spawn): the run
follows the single-process curve with the same global batch (2 ranks x 1 micro-batch against 1
process x 2 micro-batches), rank 0 alone writes the run; GRPO refuses more than one process."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from post_helpers import CHATML, conversations, make_chat_base, sums, write_jsonl

from handformer.tasks.post.job import PostJob
from handformer.tasks.post.train import run_post

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(task: str, base: Path, data: Path, accumulation: int, **section) -> PostJob:
    return PostJob.from_dict({
        "task": task, "train": {"init_from": str(base), "steps": 4, "lr": 3e-3, "warmup": 1, "eval_every": 2,
                                "log_every": 1, "progress": False, "device": "cpu", "accumulation": accumulation},
        "data": {"path": str(data), "batch_size": 2, "val_fraction": 0.2, "block_size": 96}, **section})


def _worker(rank: int, port: int, task: str, base: str, data: str, run_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    run_post(job(task, Path(base), Path(data), 1), run_dir, log=lambda *a: None)
    dist.destroy_process_group()


def curve(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["train_loss"], r.get("val_loss"), r.get("logp_margin")) for r in rows]


@pytest.mark.parametrize("task", ["sft", "dpo"])
def test_two_processes_follow_the_single_process_curve(task, tmp_path):
    torch.set_num_threads(1)
    base = make_chat_base(tmp_path / "base", CHATML)
    if task == "sft":
        data = write_jsonl(tmp_path / "data.jsonl", conversations(60))  # 4 steps x 2 batches within one epoch
    else:
        data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": q, "chosen": a, "rejected": "no idea"}
                                                     for q, a in sums(30)])
    single = tmp_path / "single"
    run_post(job(task, base, data, accumulation=2), single, log=lambda *a: None)
    mp.spawn(_worker, args=(_free_port(), task, str(base), str(data), str(tmp_path / "two")), nprocs=WORLD,
             join=True)
    expected, got = curve(single), curve(tmp_path / "two")
    assert len(got) == len(expected) == 4
    for e, g in zip(expected, got):
        for a, b in zip(e, g):
            assert (a is None) == (b is None) and (a is None or b == pytest.approx(a, rel=1e-5, abs=1e-7))
    assert json.loads((tmp_path / "two" / "config.json").read_text())["post_training"]["task"] == task


def test_grpo_refuses_more_than_one_process(tmp_path, monkeypatch):
    base = make_chat_base(tmp_path / "base", CHATML)
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    monkeypatch.setenv("WORLD_SIZE", "2")
    grpo_job = job("grpo", base, data, 1, grpo={"reward": "post_helpers:length_reward"})
    with pytest.raises(ValueError, match="GRPO runs in a single process"):
        run_post(grpo_job, tmp_path / "run")
