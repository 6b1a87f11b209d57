"""The training loop: one plain function that serves both model families.

Read it top to bottom like nanoGPT's train.py: build the optimizer, maybe resume, then for each step
gather micro-batches, forward under optional bf16 autocast, backward with the loss normalized by the
real tokens of the whole step, clip, set the learning rate, step, log, evaluate, checkpoint.

What is learned is the objective's: `loss_fn(model, batch) -> (loss, metrics)`, where `loss` is
summed over the batch's `n_tokens` units (target tokens for language modeling and SFT, pairs for
DPO, completions or completion tokens for GRPO) and `metrics` are sums over the same units. The
loop divides both by the units of the whole step (every micro-batch, every rank), so the gradient
is that of the step's mean loss whatever the batch, accumulation and world sizes; metrics.jsonl gets
`train_loss` and each metric as means over the units since the last logged step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from handformer.config import dataclass_from_dict
from handformer.io import atomic_write_text, read_log_records
from handformer.modes import eval_mode
from handformer.training import distributed
from handformer.training.checkpoint import load_checkpoint, load_weights, save_checkpoint, save_weights
from handformer.training.cpu_memory import keep_freed_memory
from handformer.training.muon import MuonAdamW, muon_params
from handformer.training.schedules import SCHEDULES, learning_rate
from handformer.training.tensorboard import TensorBoardLog, check_loggers
from handformer.training.zero_init import zero_output_projections

OPTIMIZERS = ("adamw", "muon")


@dataclass
class TrainConfig:
    steps: int = 1000  # optimizer steps
    lr: float = 1e-3  # peak learning rate
    schedule: str = "inverse_sqrt"  # inverse_sqrt (the paper) | cosine | constant | trapezoid
    warmup: int = 100  # warmup steps
    min_lr: float = 0.0  # floor of the cosine and trapezoid schedules
    cooldown: float = 0.2  # trapezoid: the last fraction of the steps, a straight line to min_lr
    beta1: float = 0.9  # AdamW betas (the paper: 0.9, 0.98)
    beta2: float = 0.98
    weight_decay: float = 0.0  # AdamW decay, applied to matrices only
    # adamw: AdamW for every parameter | muon: Muon for the blocks' matrices, AdamW for the
    # embeddings, head and norms (training/muon.py)
    optimizer: str = "adamw"
    muon_lr: float = 0.02  # Muon's peak learning rate; the schedule scales it as it scales lr
    muon_momentum: float = 0.95  # Muon's momentum (Nesterov)
    muon_weight_decay: float = 0.0  # Muon's decoupled weight decay (times its learning rate)
    label_smoothing: float = 0.1  # the paper: 0.1
    clip_grad: float = 1.0  # max gradient norm; 0 = no clipping
    accumulation: int = 1  # micro-batches per optimizer step
    bf16: bool = False  # bf16 autocast (CPU and GPU)
    # torch.compile the model for training: a language model's forward is one graph; the
    # translation model's breaks where it selects the non-pad rows (a data-dependent shape)
    compile: bool = False
    eval_every: int = 200  # steps between validation runs (and checkpoints)
    eval_batches: int = 0  # validation batches per evaluation; 0 = the whole validation set
    checkpoint_every: int = 0  # steps between resumable checkpoints; 0 = at every evaluation
    log_every: int = 10  # steps between metrics.jsonl lines
    seed: int = 0  # fixes initialization, data order and dropout
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    progress: bool = True  # show a tqdm progress bar
    parallel: str = "ddp"  # under torchrun: ddp (a replica per rank) | fsdp (FSDP2, sharded weights)
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    keep_cpu_memory: bool = True  # CPU: glibc keeps freed memory for reuse (cpu_memory.py)
    # Start every block's o_proj and down_proj at zero, so each block begins as the identity
    # (the modded-nanogpt speedrun's; training/zero_init.py). New models only, never a fine-tune.
    zero_init_projections: bool = False
    # CPU: torch's intra-op threads while training; 0 = torch's default (one per core). On a
    # machine busy with other jobs, 1 avoids waiting at every parallel kernel for a descheduled
    # thread (several times slower; see the README's fine-tuning section)
    threads: int = 0
    # Where the records go: "jsonl" (metrics.jsonl, always: the run's record) and optionally
    # "tensorboard" (event files in RUN/tensorboard/, best-effort; training/tensorboard.py)
    log: list[str] = field(default_factory=lambda: ["jsonl"])

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is invalid: {fix}")

        for name in ("steps", "accumulation", "eval_every", "log_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                fail(name, "it must be a positive integer")
        for name in ("warmup", "eval_batches", "checkpoint_every", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                fail(name, "it must be an integer >= 0")
        if not self.lr > 0:
            fail("lr", "it must be > 0")
        if self.schedule not in SCHEDULES:
            fail("schedule", f"choose one of {', '.join(SCHEDULES)}")
        if not 0 < self.cooldown <= 1:
            fail("cooldown", "it must be in (0, 1]: the fraction of the steps spent decaying")
        if not 0 <= self.label_smoothing < 1:
            fail("label_smoothing", "it must be in [0, 1)")
        if self.clip_grad < 0:
            fail("clip_grad", "it must be >= 0 (0 disables clipping)")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                fail(name, "it must be in [0, 1)")
        if self.parallel not in ("ddp", "fsdp"):
            fail("parallel", "choose ddp or fsdp")
        if not 0 <= self.min_lr <= self.lr:
            fail("min_lr", f"it must be in [0, lr={self.lr}]")
        if self.weight_decay < 0:
            fail("weight_decay", "it must be >= 0")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"choose {' or '.join(OPTIMIZERS)}")
        if not self.muon_lr > 0:
            fail("muon_lr", "it must be > 0")
        if not 0 <= self.muon_momentum < 1:
            fail("muon_momentum", "it must be in [0, 1)")
        if self.muon_weight_decay < 0:
            fail("muon_weight_decay", "it must be >= 0")
        if self.optimizer == "muon" and self.parallel == "fsdp":
            fail("optimizer", "Muon orthogonalizes whole matrices and FSDP shards them; use "
                 "parallel=ddp with Muon, or optimizer=adamw")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            fail("seed", "it must be an integer")
        if not isinstance(self.device, str) or not (self.device in ("auto", "cpu", "cuda", "mps")
                                                    or self.device.startswith("cuda:")):
            fail("device", "choose auto, cpu, cuda or cuda:N")
        check_loggers(self.log, installed=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return dataclass_from_dict(cls, data, "train")


class Batch(Protocol):
    n_tokens: int  # real target tokens in the batch

    def to(self, device: torch.device | str) -> Batch: ...


class BatchSource(Protocol):
    def epoch(self, epoch: int) -> list:  # the batches of one epoch, deterministic
        ...


# (model, batch) -> (loss summed over batch.n_tokens units, {name: value summed over the same units})
LossFn = Callable[[nn.Module, Any], tuple[Tensor, dict[str, float]]]
# A task's pictures of the model at each evaluation, for TensorBoard: tag -> (3, H, W) in [0, 1]
EvalImages = Callable[[nn.Module], dict[str, Any]]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices (dim >= 2) only, never on biases, norms or gains; with
    `cfg.optimizer == "muon"`, the blocks' matrices step with Muon instead (training/muon.py)."""
    params = [p for p in model.parameters() if p.requires_grad]
    matrices = muon_params(model) if cfg.optimizer == "muon" else []
    taken = {id(p) for p in matrices}
    decay = [p for p in params if p.dim() >= 2 and id(p) not in taken]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8,
                                 fused=device.type in ("cpu", "cuda"))
    groups.append({"params": matrices, "weight_decay": cfg.muon_weight_decay, "muon": True,
                   "lr_ratio": cfg.muon_lr / cfg.lr})
    # Newton-Schulz in bf16 (as published) where bf16 matmuls are native; fp32 on other CPUs
    ns_dtype = torch.bfloat16 if device.type != "cpu" or cpu_has_fast_bf16() else torch.float32
    return MuonAdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                     momentum=cfg.muon_momentum, ns_dtype=ns_dtype)


def clip_gradients(model: nn.Module, max_norm: float, device: torch.device) -> Tensor:
    """Scale the gradients so their global norm is at most `max_norm`; returns the norm before
    clipping. On CPU too with torch's one-call foreach kernels (torch picks them by itself only on
    GPUs)."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm,
                                          foreach=True if device.type == "cpu" else None)


def gradient_norm(model: nn.Module) -> float:
    """The global L2 norm of the gradients, without changing them (for the log when not clipping)."""
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AMX or AVX512-BF16). Without them
    (e.g. AVX2-only CPUs) bf16 matmuls fall back to slow generic code; benchmarks/bf16_matmul.py
    measures fp32 against bf16 on the machine at hand."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True  # unknown platform: do not warn
    return "amx_bf16" in flags or "avx512_bf16" in flags


def add_metrics(total: dict[str, float], metrics: dict[str, Any]) -> dict[str, float]:
    """`total` with each of `metrics` (floats or 0-d tensors) added to it."""
    for name, value in metrics.items():
        total[name] = total.get(name, 0.0) + float(value)
    return total


def all_sum_metrics(ctx: distributed.DistContext, metrics: dict[str, float], device: torch.device,
                    ) -> dict[str, float]:
    """The metrics summed over every rank (every rank reports the same names)."""
    names = sorted(metrics)
    return dict(zip(names, distributed.all_sum(ctx, *(metrics[n] for n in names), device=device)))


@torch.no_grad()
def evaluate_with_metrics(model: nn.Module, batches: list, loss_fn: LossFn, device: torch.device,
                          bf16: bool = False, ctx: distributed.DistContext | None = None,
                          ) -> tuple[float, dict[str, float]]:
    """The mean loss per unit over `batches`, in eval mode (no dropout, no label smoothing), and
    the mean of each metric. Under torchrun (`ctx`) each rank scores batches rank, rank + W, ...
    and the sums are all-reduced, so every batch counts exactly once."""
    ctx = ctx or distributed.DistContext()
    total, tokens, metrics = 0.0, 0, {}
    mine = batches[ctx.rank::ctx.world]
    with eval_mode(model):
        for i in range(math.ceil(len(batches) / ctx.world)):
            # A rank short of batches still runs a forward (discarded): FSDP's gathers need every rank.
            batch = (mine[i] if i < len(mine) else batches[0]).to(device)
            with autocast(device, bf16):
                loss, batch_metrics = loss_fn(model, batch)
            if i < len(mine):
                total, tokens = total + float(loss), tokens + batch.n_tokens
                add_metrics(metrics, batch_metrics)
    total, tokens = distributed.all_sum(ctx, total, tokens, device=device)
    metrics = all_sum_metrics(ctx, metrics, device)
    return total / max(tokens, 1), {k: v / max(tokens, 1) for k, v in metrics.items()}


def evaluate(model: nn.Module, batches: list, loss_fn: LossFn, device: torch.device,
             bf16: bool = False, ctx: distributed.DistContext | None = None) -> float:
    """The mean loss per unit over `batches` (cross-entropy per real token for a language model),
    in eval mode: `evaluate_with_metrics` without the metrics."""
    return evaluate_with_metrics(model, batches, loss_fn, device, bf16, ctx)[0]


class MetricsLog:
    """metrics.jsonl: one JSON object a line, appended (not rewritten) as training goes. A crash can
    cut the last line anywhere; on resume that torn line is dropped, and so are lines past the
    resumed step, so the file reads as one uninterrupted run (rewritten atomically)."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            kept = [line for line, record in read_log_records(path) if record.get("step", 0) <= resume_step]
            atomic_write_text(path, "".join(line + "\n" for line in kept))
        elif resume_step is None and path.exists():
            path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


@dataclass
class TrainResult:
    step: int
    best_val_loss: float | None
    last_val_loss: float | None
    elapsed_s: float


class RunWriteError(OSError):
    """A file of the run could not be written (a full disk, lost permissions); says what still holds."""


@contextlib.contextmanager
def explain_write_errors(path: Path, run_dir: Path, resumable_step: int | None) -> Iterator[None]:
    """Turn an OSError while writing `path` into one line: what failed, and that the previous
    checkpoint is intact (atomic writes never replace a file with half of one)."""
    try:
        yield
    except OSError as err:
        reason = err.strerror or str(err)
        if resumable_step is None:
            then = "no checkpoint was written yet: free space and start the run again"
        else:
            then = (f"checkpoint.safetensors (step {resumable_step}) is intact: free space, then "
                    f"`handformer train --resume {run_dir}`")
        raise RunWriteError(f"could not write {path}: {reason}; {then}") from None


def _batches(source: BatchSource, epoch: int, position: int) -> Iterator[tuple[int, int, Any]]:
    """Endless (epoch, position, batch) stream starting at the given place."""
    while True:
        batches = source.epoch(epoch)
        if not batches:
            raise ValueError("the training data produced no batches")
        for i in range(position, len(batches)):
            yield epoch, i, batches[i]
        epoch, position = epoch + 1, 0


def forward_backward(forward_model: nn.Module, micro: list, loss_fn: LossFn, device: torch.device,
                     cfg: TrainConfig, ctx: distributed.DistContext | None = None,
                     ) -> tuple[float, int, dict[str, float]]:
    """Accumulate the gradient of one step: the summed loss of the micro-batches divided by their
    units (real tokens). Returns (summed loss, units, summed metrics), all over every rank under
    torchrun."""
    ctx = ctx or distributed.DistContext()
    step_tokens = sum(b.n_tokens for b in micro)
    # Under torchrun: the tokens of every rank's micro-batches; DDP averages gradients over ranks,
    # so scale by the world size to get the gradient of the global batch's mean loss.
    step_tokens = int(distributed.all_sum(ctx, step_tokens, device=device)[0])
    step_loss, step_metrics = 0.0, {}
    for i, batch in enumerate(micro):
        batch = batch.to(device)
        with distributed.grad_sync(forward_model, ctx, last=i == len(micro) - 1):
            with autocast(device, cfg.bf16):
                loss_sum, metrics = loss_fn(forward_model, batch)
            (loss_sum * ctx.world / max(step_tokens, 1)).backward()
        step_loss += loss_sum.item()
        add_metrics(step_metrics, metrics)
    (step_loss,) = distributed.all_sum(ctx, step_loss, device=device)
    return step_loss, step_tokens, all_sum_metrics(ctx, step_metrics, device)


def train(model: nn.Module, cfg: TrainConfig, train_data: BatchSource, val_batches: list | None,
          loss_fn: LossFn, run_dir: str | os.PathLike, resume: bool = False,
          on_eval: Callable[[int, float], None] | None = None,
          weights_file: str = "model.safetensors", eval_images: EvalImages | None = None,
          ) -> TrainResult:
    """Train `model` in place. Writes metrics.jsonl, checkpoint.safetensors (resumable) and
    `weights_file` (the best weights by validation loss, or the last without validation). Only
    parameters with requires_grad train and get optimizer state; a LoRA model saves its adapters only.
    With `cfg.log` holding "tensorboard", the records also go to RUN/tensorboard/, with
    `eval_images(model)` at each evaluation. Under torchrun every rank calls this; rank 0 alone logs
    and writes files (distributed.py)."""
    check_loggers(cfg.log)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx, device_name = distributed.setup(cfg.device, cfg.parallel)
    device = pick_device(device_name)
    if cfg.bf16 and device.type == "cpu" and not cpu_has_fast_bf16():
        warnings.warn("bf16 autocast on a CPU without AMX or AVX512-BF16 is very slow (bf16 matmuls "
                      "fall back to generic code); set train.bf16=false on this machine", stacklevel=2)
    if cfg.keep_cpu_memory and device.type == "cpu":
        keep_freed_memory()
    model.to(device)
    if cfg.activation_checkpointing:
        distributed.enable_activation_checkpointing(model)
    optimizer = make_optimizer(model, cfg, device)
    ckpt_path = run_dir / "checkpoint.safetensors"

    state = {"step": 0, "epoch": 0, "position": 0, "best_val_loss": None, "elapsed_s": 0.0}
    if resume:
        state = load_checkpoint(ckpt_path, model, optimizer)
    forward_model = distributed.wrap(model, ctx, device)
    if ctx.enabled and ctx.parallel == "fsdp":  # the weights are sharded now: a new optimizer
        loaded, optimizer = optimizer.state_dict(), make_optimizer(model, cfg, device)
        if resume:
            distributed.load_full_optimizer_state(model, optimizer, loaded, ctx)
    metrics = None  # rank 0 alone writes metrics.jsonl (and the TensorBoard events)
    board = None
    if ctx.is_main:
        metrics = MetricsLog(run_dir / "metrics.jsonl", state["step"] if resume else None)
        if "tensorboard" in cfg.log:
            board = TensorBoardLog(run_dir, state["step"] if resume else None)
    forward_model = torch.compile(forward_model) if cfg.compile else forward_model
    train_data = distributed.shard_source(train_data, ctx)

    step = state["step"]
    resumable_step = step if resume else None  # the step checkpoint.safetensors holds
    # Checkpoints count batches of the global list, so a run resumes under another world size.
    epoch, position = state["epoch"], distributed.local_position(ctx, state["position"])
    stream = _batches(train_data, epoch, position)
    best, last_val = state["best_val_loss"], None
    elapsed_before = state["elapsed_s"]
    start = time.perf_counter()
    # The loss window since the last logged step, restored so a resumed run logs the same means.
    window_loss, window_tokens = state.get("window_loss", 0.0), state.get("window_tokens", 0)
    window_metrics = dict(state.get("window_metrics", {}))
    window_start = start

    bar = None
    if cfg.progress and ctx.is_main:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps, initial=step, dynamic_ncols=True, unit="step")

    model.train()
    while step < cfg.steps:
        # 1. Gather this step's micro-batches; normalize by all their real tokens.
        micro = []
        for _ in range(cfg.accumulation):
            epoch, position, batch = next(stream)
            micro.append(batch)
        position += 1  # the next batch to read after this step

        # 2. Forward and backward.
        step_loss, step_tokens, step_metrics = forward_backward(forward_model, micro, loss_fn, device,
                                                                cfg, ctx)

        # 3. Clip, set the learning rate, update.
        logging = step + 1 == cfg.steps or (step + 1) % cfg.log_every == 0
        grad_norm: Tensor | float | None = None
        if cfg.clip_grad > 0:
            grad_norm = clip_gradients(model, cfg.clip_grad, device)
        elif logging and not distributed.is_sharded(model):
            grad_norm = gradient_norm(model)
        lr = learning_rate(step, cfg.schedule, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr, cfg.cooldown)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_ratio", 1.0)  # Muon's matrices: their own peak
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if not math.isfinite(step_loss):
            raise FloatingPointError(f"loss became {step_loss} at step {step}; lower the learning "
                                     "rate or enable clipping (the last checkpoint is intact)")

        # 4. Log.
        window_loss += step_loss
        window_tokens += step_tokens
        add_metrics(window_metrics, step_metrics)
        now = time.perf_counter()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss / max(step_tokens, 1):.3f}", lr=f"{lr:.2e}",
                            tok_s=f"{window_tokens / max(now - window_start, 1e-9):,.0f}")
        record: dict[str, Any] | None = None
        if logging:
            record = {"step": step, "elapsed_s": round(elapsed_before + now - start, 3), "lr": lr,
                      "train_loss": window_loss / max(window_tokens, 1),
                      **{k: v / max(window_tokens, 1) for k, v in window_metrics.items()},
                      "tokens_per_s": window_tokens / max(now - window_start, 1e-9), "epoch": epoch}
            if grad_norm is not None:  # this step's, before clipping
                record["grad_norm"] = float(grad_norm)
            window_loss, window_tokens, window_metrics, window_start = 0.0, 0, {}, now

        # 5. Evaluate, keep the best weights, write a resumable checkpoint.
        evaluating = val_batches is not None and (step % cfg.eval_every == 0 or step == cfg.steps)
        if evaluating:
            eval_set = val_batches[: cfg.eval_batches] if cfg.eval_batches else val_batches
            last_val, val_metrics = evaluate_with_metrics(model, eval_set, loss_fn, device, cfg.bf16, ctx)
            record = record or {"step": step, "elapsed_s": round(elapsed_before + now - start, 3),
                                "lr": lr}
            record["val_loss"] = last_val
            record.update({f"val_{k}": v for k, v in val_metrics.items()})
            if best is None or last_val < best:
                best = last_val
                with explain_write_errors(run_dir / weights_file, run_dir, resumable_step):
                    _save_weights(model, run_dir / weights_file, ctx)
            if on_eval is not None:
                on_eval(step, last_val)
            if board is not None and eval_images is not None and not distributed.is_sharded(model):
                for tag, image in eval_images(model).items():
                    board.image(tag, image, step)
            if bar is not None:
                bar.write(f"step {step}: val_loss {last_val:.4f} (best {best:.4f})")
        if record is not None and metrics is not None:
            with explain_write_errors(metrics.path, run_dir, resumable_step):
                metrics.write(record)
            if board is not None:
                board.write(record)
        every = cfg.checkpoint_every or cfg.eval_every
        if step % every == 0 or step == cfg.steps:
            elapsed = elapsed_before + time.perf_counter() - start
            full_state = distributed.full_model_state(model, ctx)  # collectives: every rank
            full_optim = distributed.full_optimizer_state(model, optimizer, ctx)
            if ctx.is_main:
                with explain_write_errors(ckpt_path, run_dir, resumable_step):
                    save_checkpoint(ckpt_path, model, optimizer,
                                    {"step": step, "epoch": epoch,
                                     "position": distributed.global_position(ctx, position),
                                     "best_val_loss": best, "elapsed_s": elapsed,
                                     "window_loss": window_loss, "window_tokens": window_tokens,
                                     "window_metrics": window_metrics,
                                     "train_config": asdict(cfg)}, full_state, full_optim)
            resumable_step = step
    if bar is not None:
        bar.close()
    if board is not None:
        board.close()
    if val_batches is None:
        _save_weights(model, run_dir / weights_file, ctx)
    distributed.teardown(ctx)
    return TrainResult(step, best, last_val, elapsed_before + time.perf_counter() - start)


def train_new_model(build: Callable[[], nn.Module], cfg: TrainConfig, train_data: BatchSource,
                    val_batches: list | None, loss_fn: LossFn, run_dir: str | os.PathLike,
                    resume: bool = False, log: Callable[[str], None] = print,
                    weights_file: str = "model.safetensors", eval_images: EvalImages | None = None,
                    ) -> tuple[nn.Module, TrainResult]:
    """Seed, build a model with `build()`, `train` it (or resume), and return it holding the best
    weights (`weights_file`). The tasks (translation, lm) call this after preparing data."""
    torch.manual_seed(cfg.seed)
    model = build()
    if cfg.zero_init_projections and not resume:  # a resumed run loads its weights over these
        zero_output_projections(model)
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    trainable = f" ({n_trainable:,} trainable)" if n_trainable < n_params else ""
    threads = f", {cfg.threads} thread(s)" if cfg.threads else ""
    log(f"model: {n_params:,} parameters{trainable}; training {cfg.steps} steps on "
        f"{pick_device(cfg.device)}{threads}")
    previous_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        result = train(model, cfg, train_data, val_batches, loss_fn, run_dir, resume=resume,
                       weights_file=weights_file, eval_images=eval_images)
    finally:
        torch.set_num_threads(previous_threads)
    if distributed.is_sharded(model):  # FSDP left shards: the best weights go into a plain model
        model = build()
    load_weights(model, Path(run_dir) / weights_file)
    return model, result


def _save_weights(model: nn.Module, path: Path, ctx: distributed.DistContext) -> None:
    """Rank 0 writes the weights (FSDP first gathers them from every rank)."""
    full_state = distributed.full_model_state(model, ctx)
    if ctx.is_main:
        save_weights(model, path, full_state)
