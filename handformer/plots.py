"""Pictures from runs: loss curves from metrics.jsonl and attention heatmaps. Matplotlib, no screen."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}; is it a training run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_loss_curve(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Training and validation loss against step; writes loss_curve.png into the run directory."""
    records = read_metrics(run_dir)
    out = Path(out) if out else Path(run_dir) / "loss_curve.png"
    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    if train:
        ax.plot(*zip(*train), label="train (label-smoothed)")
    if val:
        ax.plot(*zip(*val), marker="o", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss per token (nats)")
    ax.set_title(Path(run_dir).name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _label(token: str) -> str:
    """Make whitespace visible: a leading space as '▁', newlines as '\\n'."""
    token = token.replace("\n", "\\n")
    return "▁" + token[1:] if token.startswith(" ") else token


def plot_attention(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
                   out: str | os.PathLike, title: str = "", x_title: str = "keys",
                   y_title: str = "queries") -> Path:
    """One heatmap: rows are queries (y_labels), columns are keys (x_labels)."""
    weights = np.asarray(weights, dtype=np.float32)
    h, w = weights.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * w + 2), max(3.0, 0.4 * h + 1.5)))
    im = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6),
                   aspect="auto")
    ax.set_xticks(range(w), [_label(t) for t in x_labels], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(h), [_label(t) for t in y_labels], fontsize=8)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)
