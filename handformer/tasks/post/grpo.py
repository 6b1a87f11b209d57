"""Reinforcement learning with verifiable rewards (`task = "grpo"`): Group Relative Policy
Optimization, as TRL's GRPOTrainer computes it.

Each step takes B prompts, samples G completions for each through the one decoding engine (all
B * G rows in one batch; rows of the same prompt share its prefill), scores them with the run's
reward function (rewards.py) and turns the rewards into advantages within each group:

    A = (r - mean of the group) / (std of the group + 1e-4)     scale_rewards = "group"
        the std of the whole batch instead                        scale_rewards = "batch"
        not divided                                               scale_rewards = "none"

The loss on each completion token, with ratio = pi(token) / pi_old(token) (pi_old: the policy that
sampled it; the same weights unless `iterations` > 1 reuses the rollouts for several steps):

    -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)  +  beta * KL

    KL = exp(ref - logp) - (ref - logp) - 1, times the ratio (TRL's k3 estimate with its
         importance-sampling correction), ref the base run's log-probability of the token

with every log-probability taken of the distribution the tokens were sampled from (the logits
divided by the temperature, as TRL does), averaged as `loss_type` says: grpo (over each
completion's tokens, then over completions), bnpo and dapo (over all completion tokens of the
step), dr_grpo (over completions x max_new_tokens).
Logged: the mean reward, its spread within groups, the share of groups whose rewards are all
equal, the completion length and the KL term.

Rollouts are written to rollouts/NNNNNN.json (atomically) before they are learned from; a resumed
run reads the ones it has instead of sampling again. GRPO runs in a single process.

Shape legend: N rows (B prompts x G completions), T positions.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from handformer.generation.engine import Engine, Row
from handformer.io import atomic_write_text
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode
from handformer.tasks.post.job import GRPOConfig, PostJob
from handformer.tasks.post.logprobs import completion_targets, token_logprobs
from handformer.tasks.post.packing import IGNORE
from handformer.tasks.post.records import Prompt, read_prompts
from handformer.tasks.post.rewards import RewardFn, call_reward, load_reward
from handformer.tasks.post.setup import PostRun, base_dir, builder, prepare_run, reference_model, weights_file
from handformer.training.loop import TrainResult, pick_device, train_new_model

ROLLOUTS = "rollouts"
# Row i of the step seeded s samples with its own stream, seeded s * STEP_STREAMS + i: no two rows of
# a run share one. Seeds s + i would: row i of step s + 1 drew the numbers of row i + 1 of step s, and
# a 200-step run of 64 rows explored with 263 streams, not 12,800 (docs/benchmarks.md, the TRL section).
STEP_STREAMS = 1 << 20


@dataclass
class Rollout:
    """One step's samples: B prompts x G completions, scored."""

    prompts: list[list[int]]  # (N) each row's prompt ids
    completions: list[list[int]]  # (N) each row's sampled ids (its stop token included)
    rewards: list[float]
    advantages: list[float]
    stats: dict[str, float]
    old_logps: list[list[float]] | None = None  # per completion token, iterations > 1
    ref_logps: list[list[float]] | None = None  # per completion token, beta > 0
    texts: list[str] = field(default_factory=list)  # the completions' text, as the reward saw it

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(asdict(self)) + "\n")

    @classmethod
    def load(cls, path: Path) -> Rollout:
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path} is not a rollout file ({err}); delete it to sample again") from None


@dataclass
class GRPOBatch:
    x: Tensor  # (N, T) prompt + completion, right-padded
    y: Tensor  # (N, T) the completion's tokens as targets, IGNORE elsewhere
    attention_mask: Tensor  # (N, T)
    advantages: Tensor  # (N,)
    old_logps: Tensor | None  # (N, T) where y is a target, else 0
    ref_logps: Tensor | None  # (N, T)
    n_tokens: int  # the loss's units (loss_type): completions, or completion tokens
    stats: dict[str, float]

    def to(self, device: torch.device | str) -> GRPOBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return GRPOBatch(self.x.to(device), self.y.to(device), self.attention_mask.to(device),
                         self.advantages.to(device), move(self.old_logps), move(self.ref_logps),
                         self.n_tokens, self.stats)


def group_advantages(rewards: Tensor, group_size: int, scale_rewards: str) -> tuple[Tensor, Tensor]:
    """(N,) advantages of rewards in consecutive groups of `group_size`, and (N,) the std they
    were scaled by (Bessel-corrected, as TRL's nanstd)."""
    grouped = rewards.view(-1, group_size)  # (B, G)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)  # (N,)
    if scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        std = grouped.std(dim=1).repeat_interleave(group_size)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return advantages, std


def per_token_losses(logps: Tensor, batch: GRPOBatch, cfg: GRPOConfig) -> tuple[Tensor, Tensor | None]:
    """(N, T) the clipped policy-gradient loss (+ beta * KL) of each completion token, and (N, T)
    the KL term (None without beta)."""
    old = logps.detach() if batch.old_logps is None else batch.old_logps
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.clip_high)
    A = batch.advantages[:, None]  # (N, 1)
    losses = -torch.min(ratio * A, clipped * A)
    if not cfg.beta:
        return losses, None
    delta = batch.ref_logps - logps
    kl = (torch.exp(delta) - delta - 1) * ratio
    return losses + cfg.beta * kl, kl


def loss_units(mask: Tensor, cfg: GRPOConfig) -> int:
    """What the summed loss is divided by, for `loss_type`: completions (grpo), completion tokens
    (bnpo, dapo), completions x max_new_tokens (dr_grpo)."""
    if cfg.loss_type == "grpo":
        return mask.size(0)
    if cfg.loss_type == "dr_grpo":
        return mask.size(0) * cfg.max_new_tokens
    return int(mask.sum())


def grpo_loss(model: nn.Module, batch: GRPOBatch, cfg: GRPOConfig) -> tuple[Tensor, dict[str, float]]:
    """The loop's objective: the per-token losses summed as `loss_type` averages them (the loop
    divides by batch.n_tokens), and the rollout's statistics."""
    logits = model(batch.x, batch.attention_mask).logits  # (N, T, V)
    logps = token_logprobs(logits / cfg.temperature, batch.y)  # (N, T), of what was sampled from
    mask = (batch.y != IGNORE).to(logps.dtype)
    losses, kl = per_token_losses(logps, batch, cfg)
    if cfg.loss_type == "grpo":  # each completion's mean, summed over completions
        loss = ((losses * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    else:
        loss = (losses * mask).sum()
    metrics = {k: v * batch.n_tokens for k, v in batch.stats.items()}  # the loop divides by the units
    if kl is not None:
        metrics["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1)) * batch.n_tokens
    return loss, metrics


def rollout_batch(rollout: Rollout, pad_id: int, cfg: GRPOConfig) -> GRPOBatch:
    """The tensors of a rollout, completions as targets."""
    rows = [(p + c, len(p)) for p, c in zip(rollout.prompts, rollout.completions)]
    x, y, mask = completion_targets(rows, pad_id)

    def per_token(values: list[list[float]] | None) -> Tensor | None:
        if values is None:
            return None
        out = torch.zeros(y.shape)
        for i, ((ids, n), v) in enumerate(zip(rows, values)):
            out[i, n - 1:len(ids) - 1] = torch.tensor(v)
        return out

    advantages = torch.tensor(rollout.advantages)
    return GRPOBatch(x, y, mask, advantages, per_token(rollout.old_logps), per_token(rollout.ref_logps),
                     loss_units(y != IGNORE, cfg), rollout.stats)


class Sampler:
    """Samples and scores the rollouts of a GRPO run with the model being trained."""

    def __init__(self, post: PostRun, cfg: GRPOConfig, reward: RewardFn, reference: nn.Module | None,
                 max_positions: int) -> None:
        self.post, self.cfg, self.reward, self.reference = post, cfg, reward, reference
        self.max_positions = max_positions
        self.model: nn.Module | None = None  # set once the loop has built it

    def completion_logps(self, model: nn.Module, prompts: list[list[int]], completions: list[list[int]],
                         ) -> list[list[float]]:
        rows = [(p + c, len(p)) for p, c in zip(prompts, completions)]
        x, y, mask = completion_targets(rows, self.post.pad_id)
        device = next(model.parameters()).device
        with torch.no_grad(), eval_mode(model):
            logits = model(x.to(device), mask.to(device)).logits / self.cfg.temperature
            logps = token_logprobs(logits, y.to(device)).cpu()
        return [logps[i, n - 1:len(ids) - 1].tolist() for i, (ids, n) in enumerate(rows)]

    def sample(self, prompts: list[Prompt], seed: int) -> Rollout:
        """G completions for each prompt through the engine, in one batch, and their rewards; row i
        samples with the random stream seeded seed * STEP_STREAMS + i."""
        cfg, post, model = self.cfg, self.post, self.model
        row_prompts = [post.renderer.prompt(p.prompt) for p in prompts for _ in range(cfg.group_size)]
        if len(row_prompts) > STEP_STREAMS:
            raise ValueError(f"a step of {len(row_prompts):,} completions is more than the {STEP_STREAMS:,} "
                             "random streams a step has; lower data.batch_size or grpo.group_size")
        options = cfg.sampling(seed * STEP_STREAMS)
        rows = [Row(ids, min(cfg.max_new_tokens, self.max_positions - len(ids) + 1), options,
                    frozenset(post.stop_ids), choice=i) for i, ids in enumerate(row_prompts)]
        with torch.inference_mode(), eval_mode(model):
            engine = Engine(model, pad_id=post.pad_id)
            engine.add(rows)
            engine.run()
        completions = [row.tokens for row in rows]
        texts = [post.tokenizer.hf.decode(c, skip_special_tokens=True) for c in completions]
        rewards = self.score(prompts, texts)
        advantages, std = group_advantages(torch.tensor(rewards), cfg.group_size, cfg.scale_rewards)
        grouped_std = torch.tensor(rewards).view(-1, cfg.group_size).std(dim=1)
        stats = {"reward": sum(rewards) / len(rewards), "reward_std": float(grouped_std.mean()),
                 "frac_reward_zero_std": float((grouped_std == 0).float().mean()),
                 "completion_length": sum(map(len, completions)) / len(completions)}
        old = self.completion_logps(model, row_prompts, completions) if cfg.iterations > 1 else None
        ref = self.completion_logps(self.reference, row_prompts, completions) if cfg.beta else None
        return Rollout(row_prompts, completions, rewards, advantages.tolist(), stats, old, ref, texts)

    def score(self, prompts: list[Prompt], texts: list[str]) -> list[float]:
        G = self.cfg.group_size
        names = sorted({name for p in prompts for name in p.columns})
        columns = {name: [p.columns.get(name) for p in prompts for _ in range(G)] for name in names}
        messages = [p.prompt for p in prompts for _ in range(G)]
        return call_reward(self.reward, self.cfg.reward, messages, texts, columns, self.cfg.reward_timeout)


class RolloutEpoch:
    """The batches of one epoch, sampled when the loop reaches them (with the weights of that
    step) and kept in rollouts/, each reused for `iterations` steps."""

    def __init__(self, source: GRPOSource, epoch: int) -> None:
        self.source, self.epoch = source, epoch
        order = list(range(len(source.prompts)))
        random.Random(source.seed * 1_000_003 + epoch).shuffle(order)
        B = source.batch_size
        self.groups = [order[i:i + B] for i in range(0, len(order), B)]

    def __len__(self) -> int:
        return len(self.groups) * self.source.cfg.iterations

    def __getitem__(self, i: int) -> GRPOBatch:
        if not 0 <= i < len(self):
            raise IndexError(i)
        j = i // self.source.cfg.iterations
        prompts = [self.source.prompts[k] for k in self.groups[j]]
        return self.source.batch(self.epoch * len(self.groups) + j, prompts)


class GRPOSource:
    """The loop's BatchSource for GRPO: rollouts sampled on the fly, written before use."""

    def __init__(self, prompts: list[Prompt], batch_size: int, sampler: Sampler, run_dir: Path,
                 seed: int) -> None:
        self.prompts, self.batch_size, self.sampler, self.seed = prompts, batch_size, sampler, seed
        self.cfg = sampler.cfg
        self.folder = run_dir / ROLLOUTS
        self.cached: tuple[int, GRPOBatch] | None = None  # the last one: iterations > 1 reuse it

    def epoch(self, epoch: int) -> RolloutEpoch:
        return RolloutEpoch(self, epoch)

    def batch(self, index: int, prompts: list[Prompt]) -> GRPOBatch:
        if self.cached is not None and self.cached[0] == index:
            return self.cached[1]
        path = self.folder / f"{index:06d}.json"
        if path.is_file():
            rollout = Rollout.load(path)
        else:
            rollout = self.sampler.sample(prompts, self.seed * 1_000_003 + index)
            self.folder.mkdir(parents=True, exist_ok=True)
            rollout.save(path)
        batch = rollout_batch(rollout, self.sampler.post.pad_id, self.cfg)
        self.cached = (index, batch)
        return batch


def usable_prompts(prompts: list[Prompt], post: PostRun, max_positions: int, log=print) -> list[Prompt]:
    """The prompts that leave room for at least one new token in the context."""
    kept = [p for p in prompts if len(post.renderer.prompt(p.prompt)) < max_positions]
    if len(kept) < len(prompts):
        log(f"dropped {len(prompts) - len(kept):,} prompts that fill the context of {max_positions} tokens")
    if not kept:
        raise ValueError("no prompt leaves room for a completion in the model's context")
    return kept


def run_grpo(job: PostJob, run_dir: str | os.PathLike, resume: bool = False, log=print,
             ) -> tuple[CausalLM, TrainResult]:
    """Train (or resume) a GRPO run in `run_dir` from the run in [train] init_from."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("GRPO runs in a single process (its rollouts sample with the one model); run "
                         "`handformer train` without torchrun")
    run_dir = Path(run_dir)
    cfg = job.grpo
    reward = load_reward(cfg.reward)  # before any work: a bad name is the first error
    post = prepare_run(job, run_dir, resume, log)
    max_positions = job.model_cfg.max_positions
    prompts = usable_prompts(read_prompts(job.data.path), post, max_positions, log)
    log(f"{len(prompts):,} prompts, {job.data.batch_size} a step, {cfg.group_size} completions each; "
        f"reward {cfg.reward}")
    reference = reference_model(job, base_dir(job, run_dir, resume), pick_device(job.train.device)) \
        if cfg.beta else None
    sampler = Sampler(post, cfg, reward, reference, max_positions)
    source = GRPOSource(prompts, job.data.batch_size, sampler, run_dir, job.train.seed)
    build = builder(job, run_dir, resume)

    def build_and_keep() -> nn.Module:
        sampler.model = build()  # the rollouts sample with the weights being trained
        return sampler.model

    def loss_fn(model: nn.Module, batch: GRPOBatch) -> tuple[Tensor, dict[str, float]]:
        return grpo_loss(model, batch, cfg)

    return train_new_model(build_and_keep, job.train, source, None, loss_fn, run_dir, resume=resume, log=log,
                           weights_file=weights_file(job))


__all__ = ["ROLLOUTS", "STEP_STREAMS", "GRPOBatch", "GRPOSource", "Rollout", "Sampler", "group_advantages",
           "grpo_loss", "loss_units", "per_token_losses", "rollout_batch", "run_grpo"]

