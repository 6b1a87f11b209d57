"""Pictures from runs: loss curves from metrics.jsonl, several runs compared, and attention heatmaps
(one map, or a grid of heads). Matplotlib, no screen; token labels in any script (handformer.see.fonts).

Shape legend: H heads, T queries (rows), S keys (columns).
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from handformer.io import atomic_write, read_log_records  # noqa: E402
from handformer.paths import missing_from  # noqa: E402
from handformer.see.fonts import label_fonts  # noqa: E402


def save_figure(fig: plt.Figure, out: str | os.PathLike, dpi: int) -> None:
    """Write a figure atomically (handformer.io): a crash never leaves half a PNG."""
    fmt = Path(out).suffix.lstrip(".").lower() or "png"
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=dpi, format=fmt))


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of metrics.jsonl. A last line cut short (a run still writing it, or killed while
    writing it) is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        why = missing_from(run_dir, "metrics.jsonl")
        raise FileNotFoundError(f"{run_dir} is not a training run directory ({why}); give the --out folder "
                                "of a `handformer train`")
    return [record for _, record in read_log_records(path)]


def _label_smoothing(run_dir: str | os.PathLike) -> float:
    """The run's train.label_smoothing (its training loss includes it; validation never does)."""
    try:
        value = json.loads((Path(run_dir) / "config.json").read_text())["train"]["label_smoothing"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return value if isinstance(value, (int, float)) else 0.0


def plot_loss_curve(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Training and validation loss against step; writes loss_curve.png into the run directory."""
    records = read_metrics(run_dir)
    out = Path(out) if out else Path(run_dir) / "loss_curve.png"
    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    if train:
        smoothing = _label_smoothing(run_dir)
        ax.plot(*zip(*train), label=f"train (label smoothing {smoothing})" if smoothing else "train")
    if val:
        ax.plot(*zip(*val), marker="o", label="validation (no smoothing)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss per token (nats)")
    ax.set_title(Path(run_dir).name)
    ax.grid(alpha=0.3)
    ax.legend()
    # the margins tight_layout finds for this figure (losses up to 99.9), set without its extra drawing
    # pass: every `handformer train` draws this curve
    fig.subplots_adjust(left=0.12, right=0.98, bottom=0.145, top=0.91)
    save_figure(fig, out, dpi=120)
    plt.close(fig)
    return out


def _run_labels(run_dirs: Sequence[str | os.PathLike]) -> list[str]:
    """Each run's directory name, or its whole path where two runs share a name."""
    names = [Path(d).name or str(d) for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def plot_runs(run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Compare runs: training and validation loss (top) and learning rate (bottom), against step
    (left) and against wall-clock time, `elapsed_s` (right). One colour per run; validation dashed."""
    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [(label, read_metrics(d)) for label, d in zip(_run_labels(run_dirs), run_dirs)]
    for (_, records), d in zip(runs, run_dirs):
        if not records:
            raise ValueError(f"{d}/metrics.jsonl has no records yet (no step logged)")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex="col")
    for i, (label, records) in enumerate(runs):
        color = f"C{i % 10}"
        for col, x in enumerate(("step", "elapsed_s")):
            series = {key: [(r[x], r[key]) for r in records if key in r and x in r]
                      for key in ("train_loss", "val_loss", "lr")}
            if series["train_loss"]:
                axes[0, col].plot(*zip(*series["train_loss"]), color=color, label=f"{label} train")
            if series["val_loss"]:
                axes[0, col].plot(*zip(*series["val_loss"]), color=color, linestyle="--", marker="o",
                                  markersize=3, label=f"{label} validation")
            if series["lr"]:
                axes[1, col].plot(*zip(*series["lr"]), color=color, label=label)
    with label_fonts([label for label, _ in runs]):
        for col, x_title in enumerate(("step", "wall-clock time (s)")):
            axes[0, col].set_ylabel("loss per token (nats)")
            axes[1, col].set_ylabel("learning rate")
            axes[1, col].set_xlabel(x_title)
            for ax in axes[:, col]:
                ax.grid(alpha=0.3)
        axes[0, 0].set_title("loss against step")
        axes[0, 1].set_title("loss against wall-clock time")
        axes[0, 0].legend(fontsize=8)
        axes[1, 0].legend(fontsize=8)
        axes[1, 0].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        axes[1, 1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        fig.suptitle(f"{len(runs)} run{'s' if len(runs) > 1 else ''}: " + ", ".join(l for l, _ in runs))
        fig.tight_layout()
        save_figure(fig, out, dpi=100)
    plt.close(fig)
    return Path(out)


def _label(token: str) -> str:
    """Make whitespace visible: a leading space as '▁', newlines as '\\n'."""
    token = token.replace("\n", "\\n")
    return "▁" + token[1:] if token.startswith(" ") else token


def _heatmap(ax: plt.Axes, weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
             split: int | None = None, fontsize: float = 8, vmax: float | None = None):
    """Draw one (T, S) map with a token on every tick; a red line before position `split` (where
    generated tokens begin, say)."""
    T, S = weights.shape
    im = ax.imshow(weights, cmap="viridis", vmin=0.0, aspect="auto",
                   vmax=vmax if vmax is not None else max(float(weights.max()), 1e-6))
    ax.set_xticks(range(S), [_label(t) for t in x_labels], rotation=60, ha="right", fontsize=fontsize)
    ax.set_yticks(range(T), [_label(t) for t in y_labels], fontsize=fontsize)
    if split is not None and 0 < split:
        if split < S:
            ax.axvline(split - 0.5, color="red", linewidth=1, linestyle="--")
        if split < T:
            ax.axhline(split - 0.5, color="red", linewidth=1, linestyle="--")
    return im


def _fit_title(title: str, width_inches: float) -> str:
    """Wrap each line of a title to what fits across a figure this wide (about 9 characters an inch)."""
    chars = max(20, int(width_inches * 9))
    return "\n".join(textwrap.fill(line, chars) for line in title.splitlines())


def _check_map(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str]) -> None:
    if weights.shape[-2:] != (len(y_labels), len(x_labels)):
        raise ValueError(f"attention map of shape {weights.shape} does not match {len(y_labels)} query "
                         f"labels x {len(x_labels)} key labels")


def plot_attention(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
                   out: str | os.PathLike, title: str = "", x_title: str = "keys",
                   y_title: str = "queries", split: int | None = None, dpi: int = 120) -> Path:
    """One heatmap: rows are queries (y_labels), columns are keys (x_labels)."""
    weights = np.asarray(weights, dtype=np.float32)  # (T, S)
    _check_map(weights, x_labels, y_labels)
    h, w = weights.shape
    with label_fonts([*x_labels, *y_labels, title]):
        size = (max(4.0, 0.45 * w + 2), max(3.0, 0.4 * h + 1.5))
        fig, ax = plt.subplots(figsize=size)
        im = _heatmap(ax, weights, x_labels, y_labels, split)
        ax.set_xlabel(x_title)
        ax.set_ylabel(y_title)
        if title:
            ax.set_title(_fit_title(title, size[0] - 1))
        fig.colorbar(im, ax=ax, fraction=0.04)
        fig.tight_layout()
        save_figure(fig, out, dpi=dpi)
    plt.close(fig)
    return Path(out)


def plot_attention_heads(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
                         out: str | os.PathLike, title: str = "", x_title: str = "keys",
                         y_title: str = "queries", split: int | None = None, dpi: int = 100) -> Path:
    """A grid with one heatmap per head of a layer's (H, T, S) weights, on one colour scale."""
    weights = np.asarray(weights, dtype=np.float32)  # (H, T, S)
    if weights.ndim != 3:
        raise ValueError(f"expected (heads, queries, keys) weights, got shape {weights.shape}")
    _check_map(weights, x_labels, y_labels)
    H, T, S = weights.shape
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    fontsize = max(4.0, min(8.0, 160 / max(T, S)))
    cell_w, cell_h = max(2.6, 0.16 * S * fontsize / 6 + 1.2), max(2.4, 0.15 * T * fontsize / 6 + 1.2)
    vmax = max(float(weights.max()), 1e-6)
    with label_fonts([*x_labels, *y_labels, title]):
        width = cols * cell_w + 1
        fig, axes = plt.subplots(rows, cols, figsize=(width, rows * cell_h + 0.8), squeeze=False,
                                 layout="constrained")
        for h, ax in enumerate(axes.flat):
            if h >= H:
                ax.axis("off")
                continue
            im = _heatmap(ax, weights[h], x_labels, y_labels, split, fontsize, vmax)
            ax.set_title(f"head {h}", fontsize=9)
            if h % cols == 0:
                ax.set_ylabel(y_title, fontsize=8)
            if h // cols == rows - 1 or h + cols >= H:
                ax.set_xlabel(x_title, fontsize=8)
        if title:
            fig.suptitle(_fit_title(title, width))
        fig.colorbar(im, ax=axes, fraction=0.02)
        save_figure(fig, out, dpi=dpi)
    plt.close(fig)
    return Path(out)


def plot_stage_accuracy(report: dict, out: str | os.PathLike) -> Path:
    """`handformer speedrun chat`'s plot: held-out accuracy after each stage, overall and per task."""
    stages = list(report["stages"])
    kinds = list(next(iter(report["stages"].values()))["per_kind"])
    fig, ax = plt.subplots(figsize=(8.5, 4))
    x = range(len(stages))
    for kind in kinds:
        ax.plot(x, [100 * report["stages"][s]["per_kind"][kind] for s in stages], marker="o", alpha=0.6,
                label=kind)
    ax.plot(x, [100 * report["stages"][s]["accuracy"] for s in stages], marker="o", color="black",
            linewidth=2.5, label="all tasks")
    if all("long_accuracy" in report["stages"][s] for s in stages):  # the reasoning tasks' GRPO target
        ax.plot(x, [100 * report["stages"][s]["long_accuracy"] for s in stages], marker="s", color="tab:red",
                linewidth=2.5, linestyle="--", label="long sums (GRPO's target)")
    ax.set_xticks(list(x), stages)
    ax.set_ylim(0, 100)
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title("zero to chat: held-out accuracy after each stage")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)  # outside the lines
    fig.tight_layout()
    out = Path(out)
    save_figure(fig, out, dpi=120)
    plt.close(fig)
    return out
