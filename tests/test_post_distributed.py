"""SFT and DPO under torchrun's setup (gloo, 2 processes, torch.multiprocessing.spawn): the run
follows the single-process curve with the same global batch (2 ranks x 1 micro-batch against 1
process x 2 micro-batches), rank 0 alone writes the run; GRPO refuses more than one process."""

import json
from pathlib import Path

import pytest
import torch.distributed as dist
from helpers import join_ranks, spawn_ranks
from post_helpers import CHATML, conversations, make_chat_base, sums, write_jsonl

from handformer.tasks.post.job import PostJob
from handformer.tasks.post.train import run_post

TASKS = ("sft", "dpo")


def job(task: str, base: Path, data: Path, accumulation: int, **section) -> PostJob:
    return PostJob.from_dict({
        "task": task, "train": {"init_from": str(base), "steps": 4, "lr": 3e-3, "warmup": 1, "eval_every": 2,
                                "log_every": 1, "progress": False, "device": "cpu", "accumulation": accumulation},
        "data": {"path": str(data), "batch_size": 2, "val_fraction": 0.2, "block_size": 96}, **section})


def _worker(rank: int, port: int, root: str) -> None:
    """Both tasks in turn in one group: one process start-up per rank for the module."""
    join_ranks(rank, port)
    for task in TASKS:
        run_post(job(task, Path(root) / "base", Path(root) / f"{task}.jsonl", 1), Path(root) / task / "two",
                 log=lambda *a: None)
    dist.destroy_process_group()


def curve(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["train_loss"], r.get("val_loss"), r.get("logp_margin")) for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread) -> Path:
    """For each task: a single-process run with 2 micro-batches and a 2-rank run of 1 each."""
    root = tmp_path_factory.mktemp("post_distributed")
    base = make_chat_base(root / "base", CHATML)
    write_jsonl(root / "sft.jsonl", conversations(60))  # 4 steps x 2 batches within one epoch
    write_jsonl(root / "dpo.jsonl", [{"prompt": q, "chosen": a, "rejected": "no idea"} for q, a in sums(30)])
    for task in TASKS:
        run_post(job(task, base, root / f"{task}.jsonl", accumulation=2), root / task / "single",
                 log=lambda *a: None)
    spawn_ranks(_worker, str(root))
    return root


@pytest.mark.parametrize("task", TASKS)
def test_two_processes_follow_the_single_process_curve(task, runs):
    expected, got = curve(runs / task / "single"), curve(runs / task / "two")
    assert len(got) == len(expected) == 4
    for e, g in zip(expected, got):
        for a, b in zip(e, g):
            assert (a is None) == (b is None) and (a is None or b == pytest.approx(a, rel=1e-5, abs=1e-7))
    assert json.loads((runs / task / "two" / "config.json").read_text())["post_training"]["task"] == task


def test_grpo_refuses_more_than_one_process(tmp_path, monkeypatch):
    base = make_chat_base(tmp_path / "base", CHATML)
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    monkeypatch.setenv("WORLD_SIZE", "2")
    grpo_job = job("grpo", base, data, 1, grpo={"reward": "post_helpers:length_reward"})
    with pytest.raises(ValueError, match="GRPO runs in a single process"):
        run_post(grpo_job, tmp_path / "run")
