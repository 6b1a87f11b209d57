"""The training loop: one plain function that serves both model families.

Read `train` top to bottom like nanoGPT's train.py. `setup` places the model, builds the optimizer
and maybe resumes; then each step is four named functions: `train_step` (gather micro-batches,
forward under optional bf16 autocast, backward with the loss normalized by the real tokens of the
whole step, clip, set the learning rate, update), `log_step` (the record: one `Loggers` fan-out to
metrics.jsonl, TensorBoard and the progress bar, loggers.py), `evaluate_and_keep_best` and
`write_checkpoint`. What they carry from step to step is one `LoopState`, which the checkpoint saves.

What is learned is the objective's: `loss_fn(model, batch) -> (loss, metrics)`, where `loss` is
summed over the batch's `n_tokens` units (target tokens for language modeling and SFT, pairs for
DPO, completions or completion tokens for GRPO) and `metrics` are sums over the same units. The
loop divides both by the units of the whole step (every micro-batch, every rank), so the gradient
is that of the step's mean loss whatever the batch, accumulation and world sizes; metrics.jsonl gets
`train_loss` and each metric as means over the units since the last logged step.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from handformer.config import dataclass_from_dict
from handformer.modes import eval_mode
from handformer.training import distributed
from handformer.training.checkpoint import (
    load_checkpoint,
    load_weights,
    readable_safetensors,
    save_checkpoint,
    save_weights,
)
from handformer.training.cpu_memory import keep_freed_memory
from handformer.training.loggers import METRICS_FILE, Loggers
from handformer.training.muon import MuonAdamW, muon_params
from handformer.training.schedules import SCHEDULES, learning_rate
from handformer.training.tensorboard import check_loggers
from handformer.training.zero_init import zero_output_projections

OPTIMIZERS = ("adamw", "muon")
CHECKPOINT_FILE = "checkpoint.safetensors"  # in the run directory: the resumable state


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
        self._check_counts()
        self._check_schedule()
        self._check_optimizer()
        self._check_placement()

    def _fail(self, name: str, fix: str) -> None:
        raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is invalid: {fix}")

    def _check_counts(self) -> None:
        """Steps, batches and intervals."""
        for name in ("steps", "accumulation", "eval_every", "log_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                self._fail(name, "it must be a positive integer")
        for name in ("warmup", "eval_batches", "checkpoint_every", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                self._fail(name, "it must be an integer >= 0")

    def _check_schedule(self) -> None:
        """The learning rate and its schedule, the loss's smoothing, the clipping."""
        if not self.lr > 0:
            self._fail("lr", "it must be > 0")
        if self.schedule not in SCHEDULES:
            self._fail("schedule", f"choose one of {', '.join(SCHEDULES)}")
        if not 0 < self.cooldown <= 1:
            self._fail("cooldown", "it must be in (0, 1]: the fraction of the steps spent decaying")
        if not 0 <= self.label_smoothing < 1:
            self._fail("label_smoothing", "it must be in [0, 1)")
        if self.clip_grad < 0:
            self._fail("clip_grad", "it must be >= 0 (0 disables clipping)")
        if not 0 <= self.min_lr <= self.lr:
            self._fail("min_lr", f"it must be in [0, lr={self.lr}]")

    def _check_optimizer(self) -> None:
        """The optimizer's settings, and that it fits the parallel mode."""
        if self.parallel not in ("ddp", "fsdp"):
            self._fail("parallel", "choose ddp or fsdp")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                self._fail(name, "it must be in [0, 1)")
        if self.weight_decay < 0:
            self._fail("weight_decay", "it must be >= 0")
        if self.optimizer not in OPTIMIZERS:
            self._fail("optimizer", f"choose {' or '.join(OPTIMIZERS)}")
        if not self.muon_lr > 0:
            self._fail("muon_lr", "it must be > 0")
        if not 0 <= self.muon_momentum < 1:
            self._fail("muon_momentum", "it must be in [0, 1)")
        if self.muon_weight_decay < 0:
            self._fail("muon_weight_decay", "it must be >= 0")
        if self.optimizer == "muon" and self.parallel == "fsdp":
            self._fail("optimizer", "Muon orthogonalizes whole matrices and FSDP shards them; use "
                       "parallel=ddp with Muon, or optimizer=adamw")

    def _check_placement(self) -> None:
        """The seed, the device and the loggers."""
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            self._fail("seed", "it must be an integer")
        if not isinstance(self.device, str) or not (self.device in ("auto", "cpu", "cuda", "mps")
                                                    or self.device.startswith("cuda:")):
            self._fail("device", "choose auto, cpu, cuda or cuda:N")
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
    """The device NAME asks for ("auto": a GPU when there is one), checked against this machine."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not one torch knows; use cpu, cuda, cuda:N or mps") from None
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(device.type)
    if available is not None and not available():
        build = " (this torch is a CPU build)" if device.type == "cuda" and torch.version.cuda is None else ""
        raise ValueError(f"device {name!r}: this machine has none{build}; use cpu (or, in a training "
                         "config, auto: a GPU when there is one)")
    return device


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


# --- the loop's state and its steps -------------------------------------------------------------

@dataclass
class Window:
    """The training loss and metrics summed since the last logged step: the next record's means."""

    loss: float = 0.0
    tokens: int = 0  # the units the sums are over
    metrics: dict[str, float] = field(default_factory=dict)
    start: float = 0.0  # time.perf_counter() when the window opened

    def add(self, loss: float, tokens: int, metrics: dict[str, float]) -> None:
        self.loss, self.tokens = self.loss + loss, self.tokens + tokens
        add_metrics(self.metrics, metrics)

    def tokens_per_s(self, now: float) -> float:
        return self.tokens / max(now - self.start, 1e-9)

    def means(self) -> dict[str, float]:
        """`train_loss` and each metric, per unit."""
        units = max(self.tokens, 1)
        return {"train_loss": self.loss / units, **{k: v / units for k, v in self.metrics.items()}}


@dataclass
class LoopState:
    """Where training stands. A checkpoint saves it (the window too, so a resumed run logs the same
    means as one that never stopped)."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    position: int = 0  # this rank's next batch in the epoch's list
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    resumable_step: int | None = None  # the step checkpoint.safetensors holds
    window: Window = field(default_factory=Window)
    elapsed_before: float = 0.0  # seconds trained by the runs this one resumes
    start: float = 0.0  # time.perf_counter() when this run's first step began

    @classmethod
    def resumed(cls, saved: dict[str, Any], ctx: distributed.DistContext) -> LoopState:
        """The state `saved` by `saved_state` (a checkpoint's), for this run's world size."""
        window = Window(saved.get("window_loss", 0.0), saved.get("window_tokens", 0),
                        dict(saved.get("window_metrics", {})))
        # Checkpoints count batches of the global list, so a run resumes under another world size.
        return cls(step=saved["step"], epoch=saved["epoch"],
                   position=distributed.local_position(ctx, saved["position"]),
                   best_val_loss=saved["best_val_loss"], resumable_step=saved["step"], window=window,
                   elapsed_before=saved["elapsed_s"])

    def saved_state(self, ctx: distributed.DistContext, cfg: TrainConfig) -> dict[str, Any]:
        """What a checkpoint records (JSON), `resumed`'s input."""
        return {"step": self.step, "epoch": self.epoch,
                "position": distributed.global_position(ctx, self.position),
                "best_val_loss": self.best_val_loss, "elapsed_s": self.elapsed(),
                "window_loss": self.window.loss, "window_tokens": self.window.tokens,
                "window_metrics": self.window.metrics, "train_config": asdict(cfg)}

    def start_clock(self) -> None:
        self.start = self.window.start = time.perf_counter()

    def elapsed(self, now: float | None = None) -> float:
        """Seconds of training, the resumed runs' included."""
        return self.elapsed_before + (time.perf_counter() if now is None else now) - self.start


@dataclass
class Run:
    """What `setup` prepares: where the loop runs, what it trains, with what, and where it writes."""

    cfg: TrainConfig
    ctx: distributed.DistContext
    device: torch.device
    model: nn.Module  # the model whose weights are saved
    forward_model: nn.Module  # the model as trained: wrapped for DDP or FSDP, maybe compiled
    optimizer: torch.optim.Optimizer
    loss_fn: LossFn
    run_dir: Path
    weights_path: Path  # the best weights by validation loss (the last without validation)
    loggers: Loggers


class StepDone(NamedTuple):
    """One optimizer step's outcome."""

    loss: float  # summed over the step's units, every rank's
    tokens: int  # the units
    metrics: dict[str, float]  # sums over the same units
    lr: float
    grad_norm: Tensor | float | None  # before clipping; None when neither clipped nor logged


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
    run, state = setup(model, cfg, Path(run_dir), resume, loss_fn, weights_file)
    stream = _batches(distributed.shard_source(train_data, run.ctx), state.epoch, state.position)
    state.start_clock()
    model.train()
    with run.loggers:  # closed however the loop ends: the bar is drawn for the last time before any error
        while state.step < cfg.steps:
            micro = next_micro_batches(stream, state, cfg.accumulation)
            logging = state.step + 1 == cfg.steps or (state.step + 1) % cfg.log_every == 0
            done = train_step(run, state, micro, logging)
            record = log_step(run, state, done, logging)
            evaluating = val_batches is not None and (state.step % cfg.eval_every == 0
                                                      or state.step == cfg.steps)
            if evaluating:
                evaluate_and_keep_best(run, state, val_batches, record, on_eval, eval_images)
            if logging or evaluating:
                with explain_write_errors(run.run_dir / METRICS_FILE, run.run_dir, state.resumable_step):
                    run.loggers.write(record)
            if state.step % (cfg.checkpoint_every or cfg.eval_every) == 0 or state.step == cfg.steps:
                write_checkpoint(run, state)
    if val_batches is None:
        _save_weights(model, run.weights_path, run.ctx)
    distributed.teardown(run.ctx)
    return TrainResult(state.step, state.best_val_loss, state.last_val_loss, state.elapsed())


def setup(model: nn.Module, cfg: TrainConfig, run_dir: Path, resume: bool, loss_fn: LossFn,
          weights_file: str) -> tuple[Run, LoopState]:
    """Everything before the first step: the process group under torchrun, the device and the model
    on it, the optimizer, the state a resumed run starts from, and the loggers."""
    check_loggers(cfg.log)
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx, device_name = distributed.setup(cfg.device, cfg.parallel)
    device = pick_device(device_name)
    _place_model(model, cfg, device)
    optimizer = make_optimizer(model, cfg, device)
    state = LoopState()
    if resume:
        state = LoopState.resumed(load_checkpoint(run_dir / CHECKPOINT_FILE, model, optimizer), ctx)
        if not readable_safetensors(run_dir / weights_file):  # the best weights are lost: the
            state.best_val_loss = None  # next evaluation writes them again
    forward_model = distributed.wrap(model, ctx, device)
    if ctx.enabled and ctx.parallel == "fsdp":  # the weights are sharded now: a new optimizer
        loaded, optimizer = optimizer.state_dict(), make_optimizer(model, cfg, device)
        if resume:
            distributed.load_full_optimizer_state(model, optimizer, loaded, ctx)
    loggers = Loggers.open(run_dir, cfg.log, cfg.progress, cfg.steps, state.resumable_step, ctx.is_main)
    forward_model = torch.compile(forward_model) if cfg.compile else forward_model
    return Run(cfg, ctx, device, model, forward_model, optimizer, loss_fn, run_dir,
               run_dir / weights_file, loggers), state


def _place_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> None:
    """Move the model to `device`, with the CPU memory policy and activation checkpointing asked for."""
    if cfg.bf16 and device.type == "cpu" and not cpu_has_fast_bf16():
        warnings.warn("bf16 autocast on a CPU without AMX or AVX512-BF16 is very slow (bf16 matmuls "
                      "fall back to generic code); set train.bf16=false on this machine",
                      stacklevel=4)  # the caller of train
    if cfg.keep_cpu_memory and device.type == "cpu":
        keep_freed_memory()
    model.to(device)
    if cfg.activation_checkpointing:
        distributed.enable_activation_checkpointing(model)


def next_micro_batches(stream: Iterator[tuple[int, int, Any]], state: LoopState, n: int) -> list:
    """The next step's `n` micro-batches; `state` then points at the batch after them."""
    micro = []
    for _ in range(n):
        state.epoch, state.position, batch = next(stream)
        micro.append(batch)
    state.position += 1
    return micro


def train_step(run: Run, state: LoopState, micro: list, logging: bool) -> StepDone:
    """One optimizer step: forward and backward over the micro-batches, clip, set the learning rate,
    update. The gradient norm is measured when clipping, or for the log at a logging step."""
    cfg, model = run.cfg, run.model
    loss, tokens, metrics = forward_backward(run.forward_model, micro, run.loss_fn, run.device, cfg,
                                             run.ctx)
    grad_norm: Tensor | float | None = None
    if cfg.clip_grad > 0:
        grad_norm = clip_gradients(model, cfg.clip_grad, run.device)
    elif logging and not distributed.is_sharded(model):
        grad_norm = gradient_norm(model)
    lr = learning_rate(state.step, cfg.schedule, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr, cfg.cooldown)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_ratio", 1.0)  # Muon's matrices: their own peak
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at step {state.step}; lower the learning "
                                 "rate or enable clipping (the last checkpoint is intact)")
    return StepDone(loss, tokens, metrics, lr, grad_norm)


def log_step(run: Run, state: LoopState, done: StepDone, logging: bool) -> dict[str, Any]:
    """Add the step to the window and move the progress bar. Returns the step's record: the step,
    seconds and learning rate and, at a logging step, the window's means (a new window opens)."""
    window = state.window
    window.add(done.loss, done.tokens, done.metrics)
    now = time.perf_counter()
    run.loggers.tick(done.loss / max(done.tokens, 1), done.lr, window.tokens_per_s(now))
    record: dict[str, Any] = {"step": state.step, "elapsed_s": round(state.elapsed(now), 3), "lr": done.lr}
    if logging:
        record.update(window.means())
        record.update(tokens_per_s=window.tokens_per_s(now), epoch=state.epoch)
        if done.grad_norm is not None:  # this step's, before clipping
            record["grad_norm"] = float(done.grad_norm)
        state.window = Window(start=now)
    return record


def evaluate_and_keep_best(run: Run, state: LoopState, val_batches: list, record: dict[str, Any],
                           on_eval: Callable[[int, float], None] | None,
                           eval_images: EvalImages | None) -> None:
    """Score the validation batches into `record`; save the weights when they are the best so far;
    then the task's hooks (`on_eval`, pictures for TensorBoard) and a line above the progress bar."""
    cfg, model = run.cfg, run.model
    eval_set = val_batches[: cfg.eval_batches] if cfg.eval_batches else val_batches
    val_loss, val_metrics = evaluate_with_metrics(model, eval_set, run.loss_fn, run.device, cfg.bf16, run.ctx)
    state.last_val_loss = record["val_loss"] = val_loss
    record.update({f"val_{k}": v for k, v in val_metrics.items()})
    if state.best_val_loss is None or val_loss < state.best_val_loss:
        state.best_val_loss = val_loss
        with explain_write_errors(run.weights_path, run.run_dir, state.resumable_step):
            _save_weights(model, run.weights_path, run.ctx)
    if on_eval is not None:
        on_eval(state.step, val_loss)
    if eval_images is not None and run.loggers.wants_images and not distributed.is_sharded(model):
        for tag, image in eval_images(model).items():
            run.loggers.image(tag, image, state.step)
    run.loggers.say(f"step {state.step}: val_loss {val_loss:.4f} (best {state.best_val_loss:.4f})")


def write_checkpoint(run: Run, state: LoopState) -> None:
    """checkpoint.safetensors: the weights, the optimizer state, the RNG and `state`, so the run can
    resume here. Rank 0 writes it (FSDP first gathers the shards from every rank)."""
    saved = state.saved_state(run.ctx, run.cfg)
    full_state = distributed.full_model_state(run.model, run.ctx)  # collectives: every rank
    full_optim = distributed.full_optimizer_state(run.model, run.optimizer, run.ctx)
    if run.ctx.is_main:
        path = run.run_dir / CHECKPOINT_FILE
        with explain_write_errors(path, run.run_dir, state.resumable_step):
            save_checkpoint(path, run.model, run.optimizer, saved, full_state, full_optim)
    state.resumable_step = state.step


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
    load_weights(model, Path(run_dir) / weights_file,
                 fix=f"resume with more steps (`--set train.steps=N`, N above {cfg.steps}): the next "
                     "evaluation writes it again")
    return model, result


def _save_weights(model: nn.Module, path: Path, ctx: distributed.DistContext) -> None:
    """Rank 0 writes the weights (FSDP first gathers them from every rank)."""
    full_state = distributed.full_model_state(model, ctx)
    if ctx.is_main:
        save_weights(model, path, full_state)
