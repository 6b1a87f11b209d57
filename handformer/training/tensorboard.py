"""TensorBoard event files beside metrics.jsonl: `[train] log = ["jsonl", "tensorboard"]`.

metrics.jsonl is the run's record (resume trims it, `handformer see` and the plots read it, a crash
can only tear its last line). The event files in RUN/tensorboard/ are a second view of the same
records for people who watch runs in TensorBoard, and best-effort: if writing one fails (a full
disk, a broken install), training goes on, one warning says so, and no more events are written.

Each record's numbers become scalars: `loss/train`, `loss/val`, `lr`, `tokens_per_s`,
`grad_norm` and any other number a record holds. A task may add pictures at each evaluation (a
translation run: the cross-attention of one validation pair, `heatmap_image`).

Needs the `tensorboard` package (`pip install 'handformer[tensorboard]'`); asked for without it,
training stops before it starts with one error that says so.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

LOGGERS = ("jsonl", "tensorboard")
INSTALL = "pip install 'handformer[tensorboard]'"
FOLDER = "tensorboard"  # inside the run directory
# record keys whose scalars get a grouped name in TensorBoard; the rest keep their own
SCALAR_NAMES = {"train_loss": "loss/train", "val_loss": "loss/val"}
SKIPPED = ("step", "epoch", "elapsed_s")  # the x axis, not values to plot


def check_loggers(log: Sequence[str], installed: bool = True) -> None:
    """Raise one ValueError naming the fix when `train.log` asks for what cannot be written:
    unknown names, no jsonl, and (`installed`) tensorboard missing on this machine. A run's saved
    config is checked without `installed`: evaluating a run needs no TensorBoard."""
    if isinstance(log, str) or not all(isinstance(name, str) for name in log):
        raise ValueError(f"TrainConfig.log={log!r} is invalid: give a list, e.g. "
                         '["jsonl"] or ["jsonl", "tensorboard"]')
    unknown = [name for name in log if name not in LOGGERS]
    if unknown:
        raise ValueError(f"TrainConfig.log={list(log)!r} is invalid: unknown "
                         f"{', '.join(map(repr, unknown))}; choose from {', '.join(LOGGERS)}")
    if "jsonl" not in log:
        raise ValueError(f"TrainConfig.log={list(log)!r} is invalid: metrics.jsonl is the run's record "
                         '(resume and the plots read it); keep "jsonl" in the list')
    if installed and "tensorboard" in log and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(f'TrainConfig.log asks for "tensorboard", which is not installed: {INSTALL}')


def heatmap_image(weights: np.ndarray, cell: int = 8) -> np.ndarray:
    """A (T, S) matrix of attention weights as an (3, T*cell, S*cell) float image in [0, 1]:
    viridis colours on the matrix's own scale, each weight a cell x cell square (rows: queries)."""
    from matplotlib import colormaps

    w = np.asarray(weights, dtype=np.float64)
    span = w.max() - w.min()
    scaled = (w - w.min()) / span if span > 0 else np.zeros_like(w)
    rgb = colormaps["viridis"](scaled)[..., :3]  # (T, S, 3)
    rgb = rgb.repeat(cell, axis=0).repeat(cell, axis=1)  # (T*cell, S*cell, 3)
    return rgb.transpose(2, 0, 1).astype(np.float32)  # (3, H, W)


class TensorBoardLog:
    """Writes the loop's records (and a task's pictures) as TensorBoard events, best-effort."""

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(run_dir) / FOLDER
        # A resumed run drops the events logged after its checkpoint, as metrics.jsonl drops lines.
        purge = None if resume_step is None else resume_step + 1
        self.writer: Any = None
        self._safely(lambda _: setattr(self, "writer", SummaryWriter(str(self.folder), purge_step=purge)),
                     opening=True)

    def write(self, record: dict[str, Any]) -> None:
        step = record["step"]
        values = {SCALAR_NAMES.get(k, k): float(v) for k, v in record.items()
                  if k not in SKIPPED and isinstance(v, (int, float)) and not isinstance(v, bool)}

        def write(writer: Any) -> None:
            for name, value in values.items():
                writer.add_scalar(name, value, step)
            writer.flush()

        self._safely(write)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """`image`: (3, H, W) floats in [0, 1] (`heatmap_image`)."""
        def write(writer: Any) -> None:
            writer.add_image(tag, image, step, dataformats="CHW")
            writer.flush()

        self._safely(write)

    def close(self) -> None:
        self._safely(lambda writer: writer.close())
        self.writer = None

    def _safely(self, call: Callable[[Any], None], opening: bool = False) -> None:
        if self.writer is None and not opening:
            return
        try:
            call(self.writer)
        except Exception as err:  # best-effort: never stop training for a second view
            warnings.warn(f"TensorBoard events stopped ({type(err).__name__}: {err}); training goes "
                          "on and metrics.jsonl keeps every record", stacklevel=3)
            self.writer = None
