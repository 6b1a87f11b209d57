"""`handformer explain`: the tutorials' pictures, drawn from handformer's own code.

    softmax_temperature.png  one set of scores through softmax at several temperatures
                             (handformer.generation.sampling.apply_temperature)
    scaling.png              why attention divides by sqrt(d_k): measured on random vectors through
                             handformer.nn.attention.scaled_dot_product_attention
    positional_encoding.png  the sinusoidal table (handformer.nn.positions.sinusoidal_table)
    masks.png                padding, causal and combined masks of a sample batch (handformer.nn.masks)
    data_flow.png            encoder-decoder and decoder-only data flow, labelled with the shapes
                             handformer.see.trace records on the presets

Shape legend: B batch, H heads (here: independent samples), T queries, S keys, Dh = d_k.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from handformer.generation.sampling import apply_temperature  # noqa: E402
from handformer.nn.attention import scaled_dot_product_attention  # noqa: E402
from handformer.nn.masks import causal_mask, combine, padding_mask  # noqa: E402
from handformer.nn.positions import sinusoidal_table  # noqa: E402
from handformer.see.fonts import label_fonts  # noqa: E402

DPI = 100  # the committed figures stay small


def _save(fig: plt.Figure, out: Path) -> Path:
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


# --- softmax and temperature -------------------------------------------------------------------

TEMPERATURES = (0.0, 0.5, 1.0, 2.0, 5.0)
SAMPLE_SCORES = (3.0, 1.5, 1.0, 0.2, -1.0)


def softmax_at(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(scores / temperature); temperature 0 is the argmax (all probability on one)."""
    return torch.softmax(apply_temperature(scores, temperature), dim=-1)


def figure_softmax_temperature(out_dir: Path) -> Path:
    scores = torch.tensor(SAMPLE_SCORES)
    labels = [f"{s:g}" for s in SAMPLE_SCORES]
    fig, axes = plt.subplots(1, len(TEMPERATURES), figsize=(12, 2.9), sharey=True)
    for ax, t in zip(axes, TEMPERATURES):
        probs = softmax_at(scores, t).numpy()
        ax.bar(range(len(probs)), probs, color="C0")
        for i, p in enumerate(probs):
            ax.text(i, p + 0.02, f"{p:.2f}", ha="center", fontsize=8)
        ax.set_xticks(range(len(probs)), labels)
        ax.set_title(f"T = {t:g}" + (" (argmax)" if t == 0 else ""))
        ax.set_xlabel("score")
    axes[0].set_ylabel("probability")
    axes[0].set_ylim(0, 1.12)
    fig.suptitle("softmax(scores / T): low temperature sharpens, high temperature flattens")
    fig.tight_layout()
    return _save(fig, out_dir / "softmax_temperature.png")


# --- scaling by sqrt(d_k) ----------------------------------------------------------------------

D_KS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)


def measure_scaling(d_ks: tuple[int, ...] = D_KS, n_keys: int = 16, samples: int = 64,
                    seed: int = 0) -> dict[str, list[float]]:
    """Random unit-variance queries and keys of width d_k through the real attention function.

    Returns, per d_k: the std of the raw scores q.k, the std after dividing by sqrt(d_k), and the
    mean largest weight and mean entropy of a softmax row, with and without the scaling. "Without"
    runs the same function on q * sqrt(d_k), which cancels its division: softmax(q k^T)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, list[float]] = {k: [] for k in (
        "raw_std", "scaled_std", "max_scaled", "max_unscaled", "entropy_scaled", "entropy_unscaled")}
    for d in d_ks:
        q = torch.randn(1, samples, 1, d, generator=g)  # (B, H, T, Dh): one query per sample
        k = torch.randn(1, samples, n_keys, d, generator=g)  # (B, H, S, Dh)
        v = torch.zeros(1, samples, n_keys, d)
        raw = q @ k.transpose(-2, -1)  # (B, H, T, S): the scores before scaling
        out["raw_std"].append(raw.std().item())
        out["scaled_std"].append((raw / math.sqrt(d)).std().item())
        for name, queries in (("scaled", q), ("unscaled", q * math.sqrt(d))):
            _, w = scaled_dot_product_attention(queries, k, v, need_weights=True)  # (B, H, T, S)
            entropy = -(w * w.clamp_min(1e-30).log()).sum(-1)
            out[f"max_{name}"].append(w.max(-1).values.mean().item())
            out[f"entropy_{name}"].append(entropy.mean().item())
    return out


def figure_scaling(out_dir: Path) -> Path:
    n_keys = 16
    m = measure_scaling(D_KS, n_keys)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    ax.plot(D_KS, m["raw_std"], "o-", label="raw q·k")
    ax.plot(D_KS, np.sqrt(D_KS), ":", color="gray", label="√d_k")
    ax.plot(D_KS, m["scaled_std"], "s-", label="q·k / √d_k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_title("spread (std) of the scores")
    ax.set_ylabel("std over random q, k")
    for ax, key, title in ((axes[1], "max", "largest attention weight in a row"),
                           (axes[2], "entropy", "entropy of a row (nats)")):
        ax.plot(D_KS, m[f"{key}_unscaled"], "o-", color="C3", label="softmax(q kᵀ)")
        ax.plot(D_KS, m[f"{key}_scaled"], "s-", color="C1", label="softmax(q kᵀ / √d_k)")
        ax.set_xscale("log", base=2)
        ax.set_title(title)
    axes[1].axhline(1.0, color="gray", linestyle=":", label="one-hot")
    axes[1].set_ylim(0, 1.05)
    axes[2].axhline(math.log(n_keys), color="gray", linestyle=":", label=f"uniform over {n_keys} keys")
    axes[2].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xlabel("d_k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("without the 1/√d_k scale, scores grow like √d_k and softmax saturates to one-hot "
                 f"(measured: random vectors, {n_keys} keys)")
    fig.tight_layout()
    return _save(fig, out_dir / "scaling.png")


# --- positions and masks -----------------------------------------------------------------------

def figure_positional_encoding(out_dir: Path, max_positions: int = 64, d_model: int = 128) -> Path:
    table = sinusoidal_table(max_positions, d_model).numpy()  # (P, D)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), width_ratios=(1.4, 1))
    im = left.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    left.set_xlabel("dimension i of the encoding")
    left.set_ylabel("position")
    left.set_title(f"sinusoidal_table({max_positions}, {d_model})")
    fig.colorbar(im, ax=left, fraction=0.04)
    for dim in (0, 4, 16, 40):
        right.plot(table[:, dim], label=f"dim {dim} (sin)")
    right.set_xlabel("position")
    right.set_title("low dimensions change fast, high ones slowly")
    right.legend(fontsize=8, loc="lower left")
    right.grid(alpha=0.3)
    fig.suptitle("PE[pos, 2i] = sin(pos / 10000^(2i/D)),  PE[pos, 2i+1] = cos(pos / 10000^(2i/D))")
    fig.tight_layout()
    return _save(fig, out_dir / "positional_encoding.png")


SAMPLE_BATCH = (("<s>", "I", "love", "cats", "</s>", "<pad>", "<pad>"),
                ("<s>", "we", "drink", "green", "tea", "daily", "</s>"))


def sample_masks() -> tuple[list[tuple[str, ...]], dict[str, torch.Tensor]]:
    """The sample batch's tokens and its masks, each (B, T, S) bool, True = may attend."""
    vocab = {"<pad>": 0}
    ids = torch.tensor([[vocab.setdefault(t, len(vocab)) for t in row] for row in SAMPLE_BATCH])  # (B, T)
    B, T = ids.shape
    pad = padding_mask(ids, vocab["<pad>"])  # (B, 1, 1, S)
    causal = causal_mask(T)  # (T, S)
    both = combine(pad, causal)  # (B, 1, T, S)
    return list(SAMPLE_BATCH), {"padding": pad.expand(B, 1, T, T)[:, 0], "causal": causal.expand(B, T, T),
                                "padding & causal": both[:, 0]}


def figure_masks(out_dir: Path) -> Path:
    batch, masks = sample_masks()
    fig, axes = plt.subplots(len(batch), len(masks), figsize=(12, 7.6))
    colors = matplotlib.colors.ListedColormap(["#d0d7de", "#2da44e"])
    for row, tokens in enumerate(batch):
        for col, (name, mask) in enumerate(masks.items()):
            ax = axes[row, col]
            ax.imshow(mask[row].numpy(), cmap=colors, vmin=0, vmax=1)
            ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=8)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
            ax.set_title(f"{name} mask, sentence {row}", fontsize=10)
            if col == 0:
                ax.set_ylabel("query (row)")
            ax.set_xlabel("key (column)")
    fig.suptitle("masks in handformer: True (green) = may attend; padding hides <pad> keys, causal "
                 "hides the future")
    fig.tight_layout()
    return _save(fig, out_dir / "masks.png")


# --- data flow ---------------------------------------------------------------------------------

def traced_shapes(preset: str) -> tuple[dict[str, tuple[list[str], list[str]]], object]:
    """{module name: (input shapes, output shapes)} of the first call, from handformer.see.trace, and
    the preset's config. Names like 'x=' are dropped from the shape texts. One layer per stack is
    traced (every layer of a stack has the same shapes), which keeps this to a fraction of a second."""
    from handformer.see.trace import PRESETS, build_model, trace

    cfg = PRESETS[preset]()
    one_layer = {k: 1 for k in ("n_layers", "n_encoder_layers", "n_decoder_layers") if hasattr(cfg, k)}
    torch.manual_seed(0)
    rows = trace(build_model(dataclasses.replace(cfg, **one_layer)))

    def strip(items: list[str]) -> list[str]:
        return [item.split("=", 1)[1] if "=" in item else item for item in items]

    return {r.name: (strip(r.calls[0].inputs), strip(r.calls[0].outputs)) for r in rows if r.calls}, cfg


def _box(ax: plt.Axes, x: float, y: float, w: float, h: float, text: str, color: str) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05,rounding_size=0.15",
                                facecolor=color, edgecolor="#57606a"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5)


def _arrow(ax: plt.Axes, start: tuple[float, float], end: tuple[float, float], text: str = "") -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": "#24292f"})
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.1, (start[1] + end[1]) / 2, text, fontsize=8, va="center",
                color="#0550ae")


def _draw_seq2seq(ax: plt.Axes) -> None:
    s, cfg = traced_shapes("paper-base")
    enc, dec = "encoder.layers.0", "decoder.layers.0"
    _box(ax, 0.3, 0.3, 4.2, 0.9, f"source ids\n{s['src_embed'][0][0]}", "#ddf4ff")
    _box(ax, 5.5, 0.3, 4.2, 0.9, f"target ids (BOS + output so far)\n{s['tgt_embed'][0][0]}", "#ddf4ff")
    _box(ax, 0.3, 1.8, 4.2, 0.9, f"src_embed × √{cfg.d_model} + positions\n{s['src_embed'][1][0]}",
         "#fff8c5")
    _box(ax, 5.5, 1.8, 4.2, 0.9, f"tgt_embed × √{cfg.d_model} + positions\n{s['tgt_embed'][1][0]}",
         "#fff8c5")
    _box(ax, 0.3, 3.3, 4.2, 3.2,
         f"{cfg.n_encoder_layers} × EncoderLayer\n\nself-attention\nweights {s[enc + '.self_attn'][1][1]}"
         f"\n\nfeed-forward\n{s[enc + '.ffn.up_proj'][1][0]} inside\n\nout {s[enc][1][0]}", "#dafbe1")
    _box(ax, 5.5, 3.3, 4.2, 4.6,
         f"{cfg.n_decoder_layers} × DecoderLayer\n\nmasked self-attention\nweights "
         f"{s[dec + '.self_attn'][1][1]}\n\ncross-attention (K, V from memory)\nweights "
         f"{s[dec + '.cross_attn'][1][1]}\n\nfeed-forward\n{s[dec + '.ffn.up_proj'][1][0]} inside"
         f"\n\nout {s[dec][1][0]}", "#dafbe1")
    _box(ax, 0.3, 7.2, 4.2, 0.9, f"memory (encoder output)\n{s['encoder'][1][0]}", "#fbefff")
    _box(ax, 5.5, 8.5, 4.2, 0.9, f"generator (Linear to the vocabulary)\nlogits {s['generator'][1][0]}",
         "#ffebe9")
    for x in (2.4, 7.6):
        _arrow(ax, (x, 1.25), (x, 1.75))
        _arrow(ax, (x, 2.75), (x, 3.25))
    _arrow(ax, (2.4, 6.55), (2.4, 7.15))
    _arrow(ax, (4.55, 7.65), (5.45, 5.6), "K, V")
    _arrow(ax, (7.6, 7.95), (7.6, 8.45))


def _draw_decoder_only(ax: plt.Axes) -> None:
    s, cfg = traced_shapes("gpt2")
    block = "layers.0"
    _box(ax, 2.0, 0.3, 6.0, 0.9, f"token ids (prompt)\n{s['embed'][0][0]}", "#ddf4ff")
    _box(ax, 2.0, 1.8, 6.0, 0.9, f"embed + {cfg.position} positions\n{s['embed'][1][0]}", "#fff8c5")
    _box(ax, 2.0, 3.3, 6.0, 3.2,
         f"{cfg.n_layers} × DecoderOnlyBlock ({cfg.norm_placement}-norm)\n\ncausal self-attention\n"
         f"weights {s[block + '.self_attn'][1][1]}\n\nfeed-forward\n{s[block + '.ffn.up_proj'][1][0]} "
         f"inside\n\nout {s[block][1][0]}", "#dafbe1")
    _box(ax, 2.0, 7.0, 6.0, 0.9, f"final norm\n{s['norm'][1][0]}", "#fbefff")
    _box(ax, 2.0, 8.5, 6.0, 0.9, f"lm_head (Linear to the vocabulary)\nlogits {s['lm_head'][1][0]}",
         "#ffebe9")
    for y0, y1 in ((1.25, 1.75), (2.75, 3.25), (6.55, 6.95), (7.95, 8.45)):
        _arrow(ax, (5.0, y0), (5.0, y1))


def figure_data_flow(out_dir: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 7), width_ratios=(1.15, 1))
    _draw_seq2seq(left)
    _draw_decoder_only(right)
    left.set_title("encoder-decoder, paper-base preset (translation)", fontsize=11)
    right.set_title("decoder-only, gpt2 preset (language model)", fontsize=11)
    for ax in (left, right):
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 9.8)
        ax.axis("off")
    fig.suptitle("data flow with the shapes handformer.see.trace records for a batch of 2 "
                 "(source/prompt length 10, target length 5)")
    fig.tight_layout()
    return _save(fig, out_dir / "data_flow.png")


FIGURES: dict[str, Callable[[Path], Path]] = {
    "softmax_temperature": figure_softmax_temperature,
    "scaling": figure_scaling,
    "positional_encoding": figure_positional_encoding,
    "masks": figure_masks,
    "data_flow": figure_data_flow,
}


def explain(out_dir: str | os.PathLike = "docs/figures") -> list[Path]:
    """Draw every figure into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with label_fonts():
        return [draw(out_dir) for draw in FIGURES.values()]
