"""`handformer train` for the post-training tasks: the job's task picks its runner."""

from __future__ import annotations

import os

from handformer.models.causal_lm import CausalLM
from handformer.tasks.post.job import PostJob
from handformer.training.loop import TrainResult


def run_post(job: PostJob, run_dir: str | os.PathLike, resume: bool = False, log=print,
             ) -> tuple[CausalLM, TrainResult]:
    """Train (or resume) the job's task (sft, dpo or grpo) in `run_dir`."""
    if job.task == "sft":
        from handformer.tasks.post.sft import run_sft as run
    elif job.task == "dpo":
        from handformer.tasks.post.dpo import run_dpo as run
    else:
        from handformer.tasks.post.grpo import run_grpo as run
    return run(job, run_dir, resume=resume, log=log)


__all__ = ["run_post"]
