"""A PyTorch Lightning module: a LightningModule, or a class that plays one (`training_step(batch,
batch_idx)` and `configure_optimizers()`, as the Lightning tutorials write them around a model), found by
those two methods whatever its name; and the learning-rate schedule its configure_optimizers builds,
handed to the schedule runner as a factory of a torch scheduler.

The factory (`configured_schedule`) builds the module with check's sizes and the settings its
constructor takes (its warmup, its number of steps, its floor), calls configure_optimizers, and reads
its scheduler through its own optimizer: after each step of the scheduler, that optimizer's rate over
its base rate (the multiplier) is set on the optimizer the schedule runner hands it (an SGD of lr 1).
"""

from __future__ import annotations

import functools
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from handformer.check.core.source import code_text, methods_called

LIGHTNING_METHODS = ("training_step", "configure_optimizers")
SCHEDULER_CODE = re.compile(r"lr_scheduler|[Ss]cheduler|LambdaLR")
# the model sizes the module is built with to read its schedule (its model is never run there)
SIZES = {"src_vocab": 29, "d_model": 16, "n_heads": 4, "d_ff": 40, "n_layers": 1, "max_len": 16,
         "dropout": 0.0}


def lightning_module(obj: Any) -> bool:
    """An nn.Module class with a training_step and a configure_optimizers."""
    return inspect.isclass(obj) and issubclass(obj, nn.Module) and all(
        inspect.isfunction(getattr(obj, m, None)) for m in LIGHTNING_METHODS)


def schedules(cls: type) -> bool:
    """Whether its configure_optimizers builds a learning-rate scheduler (by its code)."""
    return bool(SCHEDULER_CODE.search(code_text(cls.configure_optimizers)))


def configured_schedule(cls: type, build: Callable[..., Any], refused: type[Exception],
                        ) -> Callable[..., Any]:
    """`make(optimizer, **settings)`: the scheduler configure_optimizers builds, read as a multiplier
    on `optimizer`; the module made by discovery's `build` (handed in, as discovery imports this
    module), `refused` (its DiscoveryError) raised where no scheduler comes back. It takes the
    optimizer, then the constructor's arguments that default to numbers and that configure_optimizers
    (or a method it calls) reads as `self.<name>`; it reads as configure_optimizers (its source, its
    file, what it reads) for the schedule runner."""
    read = set(re.findall(r"\bself\.(\w+)", "".join(map(code_text, [cls.configure_optimizers, *methods_called(
        cls.configure_optimizers)]))))  # the settings it reads, not the model's sizes
    settings = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(cls).parameters.values()
                if isinstance(p.default, (int, float)) and not isinstance(p.default, bool) and p.name in read]

    def make(optimizer: torch.optim.Optimizer, **values: Any) -> Multiplier:
        module = build(functools.partial(cls, **values), SIZES)
        own, scheduler = _optimizer_and_scheduler(module.configure_optimizers())
        if scheduler is None or own is None:
            raise refused(f"{cls.__name__}.configure_optimizers returned no learning-rate scheduler "
                                 "on an optimizer",
                                 zh=f"{cls.__name__}.configure_optimizers 没有返回建在优化器上的学习率调度器")
        return Multiplier(optimizer, own, scheduler)

    make.__wrapped__ = cls.configure_optimizers  # type: ignore[attr-defined]
    make.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("optimizer", inspect.Parameter.POSITIONAL_OR_KEYWORD), *settings])
    make.__module__, make.__name__ = cls.__module__, "configure_optimizers"
    make.__qualname__ = f"{cls.__qualname__}.configure_optimizers"
    return make


class Multiplier:
    """The learner's scheduler, stepped, its optimizer's rate over its base rate set on `target`."""

    def __init__(self, target: torch.optim.Optimizer, own: torch.optim.Optimizer, scheduler: Any) -> None:
        self.target, self.own, self.scheduler = target, own, scheduler
        self.lr_lambdas = getattr(scheduler, "lr_lambdas", ())  # a LambdaLR's: what is localized
        group = own.param_groups[0]
        self.base = float(group.get("initial_lr", group["lr"]))
        self._copy()

    def _copy(self) -> None:
        self.target.param_groups[0]["lr"] = float(self.own.param_groups[0]["lr"]) / self.base

    def step(self, *args: Any) -> None:
        with warnings.catch_warnings():  # its own optimizer never steps: torch's warning of that order
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step(*args)
        self._copy()


def _optimizer_and_scheduler(value: Any) -> tuple[torch.optim.Optimizer, Any]:
    """The first optimizer and the first scheduler configure_optimizers returns, in any of Lightning's
    forms (an optimizer; a dict with "optimizer" and "lr_scheduler", itself a scheduler or a dict with
    "scheduler"; two lists); the optimizer the scheduler was built on, where it names one."""
    leaves = list(_leaves(value))
    scheduler = next((v for v in leaves if not isinstance(v, torch.optim.Optimizer) and callable(
        getattr(v, "step", None)) and hasattr(v, "optimizer")), None)
    own = getattr(scheduler, "optimizer", None) or next(
        (v for v in leaves if isinstance(v, torch.optim.Optimizer)), None)
    return own, scheduler


def _leaves(value: Any) -> Iterator[Any]:
    value = list(value.values()) if isinstance(value, dict) else value
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value
