"""Where the training loop's records go: one `Loggers` fan-out over every sink.

The loop builds each record once (a dict: `step`, `elapsed_s`, `lr`, the training means, at an
evaluation `val_loss`) and hands it to `Loggers.write`, which sends it to

- metrics.jsonl (`MetricsLog`), always: the run's record, which resume trims and the plots read;
- TensorBoard event files (`TensorBoardLog`, with `train.log` holding "tensorboard"), best-effort;
- the progress bar (`ProgressBar`, with `train.progress`), which also ticks at every step.

Under torchrun only rank 0 logs: on the other ranks `Loggers` holds no sinks and every call does
nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from handformer.io import atomic_write_text, read_log_records
from handformer.training.tensorboard import TensorBoardLog

METRICS_FILE = "metrics.jsonl"


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


class ProgressBar:
    """A tqdm bar of the steps: each tick shows the step's loss, the learning rate and the tokens per
    second; an evaluation prints a line above it."""

    def __init__(self, total: int, initial: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, unit="step")

    def tick(self, loss: float, lr: float, tokens_per_s: float) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")

    def say(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()


@dataclass
class Loggers:
    """The sinks of one run; each is None when the run does not write it (or on ranks other than 0)."""

    metrics: MetricsLog | None = None
    board: TensorBoardLog | None = None
    bar: ProgressBar | None = None

    @classmethod
    def open(cls, run_dir: Path, log: list[str], progress: bool, steps: int, resume_step: int | None,
             is_main: bool = True) -> Loggers:
        """The sinks `log` and `progress` ask for. `resume_step`: the checkpoint's step when resuming
        (each sink drops what was logged after it), None for a new run (metrics.jsonl starts empty)."""
        if not is_main:
            return cls()
        return cls(metrics=MetricsLog(run_dir / METRICS_FILE, resume_step),
                   board=TensorBoardLog(run_dir, resume_step) if "tensorboard" in log else None,
                   bar=ProgressBar(steps, resume_step or 0) if progress else None)

    @property
    def wants_images(self) -> bool:
        """Whether `image` goes anywhere (pictures cost a forward; skip them when not)."""
        return self.board is not None

    def write(self, record: dict[str, Any]) -> None:
        """One record to metrics.jsonl and TensorBoard."""
        if self.metrics is not None:
            self.metrics.write(record)
        if self.board is not None:
            self.board.write(record)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """`image`: (3, H, W) floats in [0, 1], to TensorBoard."""
        if self.board is not None:
            self.board.image(tag, image, step)

    def tick(self, loss: float, lr: float, tokens_per_s: float) -> None:
        """One step done: the progress bar moves."""
        if self.bar is not None:
            self.bar.tick(loss, lr, tokens_per_s)

    def say(self, line: str) -> None:
        """A line for the person watching (printed above the bar; nowhere without one)."""
        if self.bar is not None:
            self.bar.say(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.board is not None:
            self.board.close()

    def __enter__(self) -> Loggers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
