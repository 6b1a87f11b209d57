"""Distributed training plumbing for the loop in train.py: PyTorch's own engine, launched by torchrun.

`torchrun --nproc_per_node N -m handformer train ...` sets RANK, LOCAL_RANK and WORLD_SIZE; with
WORLD_SIZE > 1 the loop calls `setup` (gloo on CPU, NCCL on GPU), wraps the model in
DistributedDataParallel or shards it with FSDP2 (`fully_shard`), and reads its own shard of the
data. Without those variables every helper here is a no-op and the loop runs as a single process.

How the global batch is kept equal to a single process's: the epoch's batch list is a pure function
of (seed, epoch), identical on every rank; rank r takes batches r, r + W, r + 2W, ... So one
optimizer step with W ranks and A micro-steps reads the same W * A consecutive batches that a single
process with accumulation W * A would read, and the loss is normalized by the real tokens of all of
them (all-reduced before backward), scaled by W because DDP and FSDP average gradients over ranks.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    parallel: str = "ddp"  # ddp | fsdp
    owns_group: bool = False  # setup() created the process group, so teardown() destroys it

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_rank() -> int:
    """This process's rank as torchrun sets it (0 outside torchrun); usable before setup."""
    return int(os.environ.get("RANK", "0"))


def quiet(*args, **kwargs) -> None:
    """A `log` for ranks other than 0."""


def setup(device_name: str, parallel: str) -> tuple[DistContext, str]:
    """Join the process group when WORLD_SIZE > 1 (or one already exists). Returns the context and
    the device name to use: on GPU each process takes cuda:LOCAL_RANK."""
    if dist.is_available() and dist.is_initialized():
        ctx = DistContext(dist.get_rank(), dist.get_world_size(),
                          int(os.environ.get("LOCAL_RANK", dist.get_rank())), parallel)
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = torch.cuda.is_available() and device_name != "cpu"
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo")
        ctx = DistContext(dist.get_rank(), dist.get_world_size(), local_rank, parallel, True)
    else:
        return DistContext(), device_name
    if ctx.world > 1 and device_name in ("auto", "cuda") and torch.cuda.is_available():
        device_name = f"cuda:{ctx.local_rank}"
    return ctx, device_name


def teardown(ctx: DistContext) -> None:
    """Wait for every rank (so rank 0's files are complete), then leave the group if we made it."""
    if ctx.enabled:
        dist.barrier()
        if ctx.owns_group:
            dist.destroy_process_group()


def all_sum(ctx: DistContext, *values: float, device: torch.device) -> list[float]:
    """Sum numbers over ranks (one collective)."""
    if not ctx.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


# --- data shards ------------------------------------------------------------------------------

class Shard(Sequence):
    """Rank r's batches of one epoch: r, r + W, r + 2W, ...; every rank gets len(batches) // W of
    them, so all ranks take the same number of steps. Lazy: works on LazyBatches without copying."""

    def __init__(self, batches: Sequence, rank: int, world: int) -> None:
        self.batches, self.rank, self.world = batches, rank, world

    def __len__(self) -> int:
        return len(self.batches) // self.world

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.batches[(i % len(self)) * self.world + self.rank]


class ShardedSource:
    """A BatchSource whose epoch(e) is this rank's Shard of the wrapped source's epoch(e)."""

    def __init__(self, source, ctx: DistContext) -> None:
        self.source, self.ctx = source, ctx

    def epoch(self, epoch: int) -> Shard:
        return Shard(self.source.epoch(epoch), self.ctx.rank, self.ctx.world)


def shard_source(source, ctx: DistContext):
    return ShardedSource(source, ctx) if ctx.enabled else source


# Checkpoints store the position in the *global* batch list, so a run resumes under any world size
# (when the new world size does not divide it, up to W - 1 batches of that epoch are read again).
def global_position(ctx: DistContext, position: int) -> int:
    return position * ctx.world


def local_position(ctx: DistContext, position: int) -> int:
    return position // ctx.world


# --- wrapping the model -----------------------------------------------------------------------

def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the elements of every nn.ModuleList (encoder, decoder, LM layers)."""
    return [block for m in model.modules() if isinstance(m, nn.ModuleList) for block in m]


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation and generation: nothing to recompute
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of storing them (torch.utils.
    checkpoint). Patches the block's forward, so parameter names and checkpoints are unchanged."""
    for block in blocks(model):
        block.forward = _checkpointed(block.forward)


def wrap(model: nn.Module, ctx: DistContext, device: torch.device) -> nn.Module:
    """The module to run forward on: DDP around `model`, or `model` itself sharded in place with
    FSDP2 (each block, then the root, which keeps the tied embeddings together)."""
    if not ctx.enabled:
        return model
    if ctx.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in blocks(model):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def grad_sync(forward_model: nn.Module, ctx: DistContext, last: bool):
    """Let gradients cross ranks only on the last micro-step of an accumulated step."""
    if not ctx.enabled or last:
        if ctx.enabled and ctx.parallel == "fsdp":
            forward_model.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if ctx.parallel == "fsdp":
        forward_model.set_requires_gradient_sync(False)
        return contextlib.nullcontext()
    return forward_model.no_sync()


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 turned the model's weights into DTensor shards."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


# --- full state dicts of sharded models -------------------------------------------------------

def full_model_state(model: nn.Module, ctx: DistContext) -> dict[str, Tensor] | None:
    """For FSDP: the whole model's weights gathered to CPU (a collective: every rank must call it).
    None for DDP and single processes, whose `model` holds the full weights already."""
    if not (ctx.enabled and ctx.parallel == "fsdp"):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                         ctx: DistContext) -> dict | None:
    """For FSDP: the optimizer state gathered to CPU, keyed by parameter index as a plain
    optimizer's state_dict is (a collective). None otherwise."""
    if not (ctx.enabled and ctx.parallel == "fsdp"):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    if not ctx.is_main:  # with cpu_offload only rank 0 receives the gathered state
        return None
    index = {name: i for i, name in enumerate(n for g in full["param_groups"] for n in g["params"])}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
    return {"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                              ctx: DistContext) -> None:
    """For FSDP: load an index-keyed full optimizer state (as checkpoints store it) into the
    sharded optimizer; every rank holds the full state and keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    by_param = {id(p): n for n, p in model.named_parameters()}
    order = [by_param[id(p)] for g in optimizer.param_groups for p in g["params"]]
    assert sorted(order) == sorted(names)
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]
    full = {"state": {order[i]: s for i, s in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))
