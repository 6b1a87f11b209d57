"""What every speedrun target shares: the clock (from process start), the machine's description and
the result file a run leaves (RUN/speedrun.json)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from handformer.io import atomic_write_text

_IMPORTED = time.perf_counter()
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the ones that decide fp32 / bf16 speed


def seconds_since_process_start() -> float:
    """Wall seconds since this process started (Linux: from /proc, so the interpreter's start and
    every import count); elsewhere since this module was imported."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time after boot
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


def machine() -> dict[str, Any]:
    """The CPU model, its flags that matter here, its cores, torch and its threads."""
    import torch

    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("unknown", ""):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "flags": [f for f in CPU_FLAGS if f in flags], "cores": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


@dataclass
class SpeedrunResult:
    target: str
    config: str  # the record config it ran
    seed: int
    wall_s: float  # process start to the final checkpoint written
    loss: float  # the target's quality measure (shakespeare: whole validation split, nats/char)
    steps: int
    machine: dict[str, Any] = field(default_factory=machine)

    def write(self, run_dir: Path) -> Path:
        path = Path(run_dir) / "speedrun.json"
        atomic_write_text(path, json.dumps(asdict(self), indent=1) + "\n")
        return path


@dataclass
class Target:
    name: str  # the subcommand: handformer speedrun NAME
    help: str  # one line for `handformer speedrun --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]  # the target's own options
    run: Callable[[argparse.Namespace], SpeedrunResult]  # one run, as the options say
