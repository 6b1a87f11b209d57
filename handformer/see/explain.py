"""`handformer explain`: the tutorials' pictures, drawn from handformer's own code.

    softmax_temperature.png  one set of scores through softmax at several temperatures
                             (handformer.generation.sampling.apply_temperature)
    scaling.png              why attention divides by sqrt(d_k): measured on random vectors through
                             handformer.nn.attention.scaled_dot_product_attention
    positional_encoding.png  the sinusoidal table (handformer.nn.positions.sinusoidal_table)
    top_k_top_p.png          one next-token distribution through top-k and top-p
                             (handformer.generation.sampling.top_k_filter, top_p_filter)
    masks.png                padding, causal and combined masks of a sample batch (handformer.nn.masks)
    data_flow.png            encoder-decoder and decoder-only data flow, labelled with the shapes
                             handformer.see.trace records on the presets

Titles and labels come from handformer.see.captions, in English or Chinese (`--lang zh`).

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

from handformer.families.gpt2 import GPT2  # noqa: E402
from handformer.generation.sampling import apply_temperature, top_k_filter, top_p_filter  # noqa: E402
from handformer.nn.attention import scaled_dot_product_attention  # noqa: E402
from handformer.nn.masks import causal_mask, padding_mask  # noqa: E402
from handformer.nn.positions import sinusoidal_table  # noqa: E402
from handformer.see.captions import Captions, captions_for  # noqa: E402
from handformer.see.fonts import label_fonts  # noqa: E402
from handformer.see.plots import save_figure  # noqa: E402

DPI = 100  # the committed figures stay small


def _save(fig: plt.Figure, out: Path) -> Path:
    """Write the PNG atomically (a crash leaves the previous figure, never half of one)."""
    save_figure(fig, out, DPI)
    plt.close(fig)
    return out


# --- softmax and temperature -------------------------------------------------------------------

TEMPERATURES = (0.0, 0.5, 1.0, 2.0, 5.0)
SAMPLE_SCORES = (3.0, 1.5, 1.0, 0.2, -1.0)


def softmax_at(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(scores / temperature); temperature 0 is the argmax (all probability on one)."""
    return torch.softmax(apply_temperature(scores, temperature), dim=-1)


def figure_softmax_temperature(out_dir: Path, text: Captions) -> Path:
    scores = torch.tensor(SAMPLE_SCORES)
    labels = [f"{s:g}" for s in SAMPLE_SCORES]
    fig, axes = plt.subplots(1, len(TEMPERATURES), figsize=(12, 2.9), sharey=True)
    for ax, t in zip(axes, TEMPERATURES):
        probs = softmax_at(scores, t).numpy()
        ax.bar(range(len(probs)), probs, color="C0")
        for i, p in enumerate(probs):
            ax.text(i, p + 0.02, f"{p:.2f}", ha="center", fontsize=8)
        ax.set_xticks(range(len(probs)), labels)
        ax.set_title(text("temp.panel", t=f"{t:g}") + (text("temp.argmax") if t == 0 else ""))
        ax.set_xlabel(text("temp.xlabel"))
    axes[0].set_ylabel(text("temp.ylabel"))
    axes[0].set_ylim(0, 1.12)
    fig.suptitle(text("temp.title"))
    fig.tight_layout()
    return _save(fig, out_dir / "softmax_temperature.png")


# --- top-k and top-p ---------------------------------------------------------------------------

SAMPLE_LOGITS = (2.0, 1.5, 1.2, 0.8, 0.5, 0.3, 0.0, -0.3, -0.7, -1.2)  # already sorted, most likely first
TOP_K, TOP_P = 3, 0.8


def sampling_filters(logits: torch.Tensor | None = None, k: int = TOP_K,
                     p: float = TOP_P) -> dict[str, torch.Tensor]:
    """The next-token distribution (default: SAMPLE_LOGITS) before and after each filter of
    handformer.generation.sampling, each renormalised over the tokens it keeps (removed: 0)."""
    logits = torch.tensor(SAMPLE_LOGITS) if logits is None else logits
    return {"full": torch.softmax(logits, -1),
            "top_k": torch.softmax(top_k_filter(logits, k), -1),
            "top_p": torch.softmax(top_p_filter(logits, p), -1)}


def figure_top_k_top_p(out_dir: Path, text: Captions) -> Path:
    probs = {name: dist.numpy() for name, dist in sampling_filters().items()}
    full = probs["full"]
    n = len(full)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    titles = (text("sample.full", n=n), text("sample.top_k", k=TOP_K, kept=int((probs["top_k"] > 0).sum())),
              text("sample.top_p", p=TOP_P, kept=int((probs["top_p"] > 0).sum())))
    for ax, name, title in zip(axes, ("full", "top_k", "top_p"), titles):
        kept = probs[name] > 0
        ax.bar(range(n), full, color="#d0d7de", label=text("sample.before"))
        ax.bar(np.flatnonzero(kept), probs[name][kept], color="C0", width=0.5, label=text("sample.after"))
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(n))
        ax.set_xlabel(text("sample.token"))
        ax.grid(alpha=0.3, axis="y")
    axes[2].plot(range(n), np.cumsum(full), "o-", color="C3", markersize=3, label=text("sample.cumulative"))
    axes[2].axhline(TOP_P, color="C3", linestyle=":")
    axes[0].set_ylabel(text("sample.prob"))
    axes[0].set_ylim(0, 1.05)
    for ax in axes:
        ax.legend(fontsize=8, loc="center right" if ax is axes[2] else "upper right")
    fig.suptitle(text("sample.title"), fontsize=10)
    fig.tight_layout()
    return _save(fig, out_dir / "top_k_top_p.png")


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


def figure_scaling(out_dir: Path, text: Captions) -> Path:
    n_keys = 16
    m = measure_scaling(D_KS, n_keys)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    ax.plot(D_KS, m["raw_std"], "o-", label=text("scale.raw"))
    ax.plot(D_KS, np.sqrt(D_KS), ":", color="gray", label="√d_k")
    ax.plot(D_KS, m["scaled_std"], "s-", label="q·k / √d_k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_title(text("scale.spread"))
    ax.set_ylabel(text("scale.std"))
    for ax, key, title in ((axes[1], "max", text("scale.max")), (axes[2], "entropy", text("scale.entropy"))):
        ax.plot(D_KS, m[f"{key}_unscaled"], "o-", color="C3", label="softmax(q kᵀ)")
        ax.plot(D_KS, m[f"{key}_scaled"], "s-", color="C1", label="softmax(q kᵀ / √d_k)")
        ax.set_xscale("log", base=2)
        ax.set_title(title)
    axes[1].axhline(1.0, color="gray", linestyle=":", label=text("scale.onehot"))
    axes[1].set_ylim(0, 1.05)
    axes[2].axhline(math.log(n_keys), color="gray", linestyle=":", label=text("scale.uniform", n=n_keys))
    axes[2].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xlabel("d_k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(text("scale.title", n=n_keys))
    fig.tight_layout()
    return _save(fig, out_dir / "scaling.png")


# --- positions and masks -----------------------------------------------------------------------

def figure_positional_encoding(out_dir: Path, text: Captions, max_positions: int = 64,
                               d_model: int = 128) -> Path:
    table = sinusoidal_table(max_positions, d_model).numpy()  # (P, D)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), width_ratios=(1.4, 1))
    im = left.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    left.set_xlabel(text("pe.dim"))
    left.set_ylabel(text("pe.position"))
    left.set_title(f"sinusoidal_table({max_positions}, {d_model})")
    fig.colorbar(im, ax=left, fraction=0.04)
    for dim in (0, 4, 16, 40):
        right.plot(table[:, dim], label=text("pe.curve", dim=dim))
    right.set_xlabel(text("pe.position"))
    right.set_title(text("pe.slow"))
    right.legend(fontsize=8, loc="lower left")
    right.grid(alpha=0.3)
    fig.suptitle(text("pe.title"))
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
    both = pad & causal  # (B, 1, T, S)
    return list(SAMPLE_BATCH), {"padding": pad.expand(B, 1, T, T)[:, 0], "causal": causal.expand(B, T, T),
                                "padding & causal": both[:, 0]}


MASK_NAMES = {"padding": "mask.padding", "causal": "mask.causal", "padding & causal": "mask.both"}


def figure_masks(out_dir: Path, text: Captions) -> Path:
    batch, masks = sample_masks()
    fig, axes = plt.subplots(len(batch), len(masks), figsize=(12, 7.6))
    colors = matplotlib.colors.ListedColormap(["#d0d7de", "#2da44e"])
    for row, tokens in enumerate(batch):
        for col, (name, mask) in enumerate(masks.items()):
            ax = axes[row, col]
            ax.imshow(mask[row].numpy(), cmap=colors, vmin=0, vmax=1)
            ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=8)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
            ax.set_title(text("mask.panel", name=text(MASK_NAMES[name]), row=row), fontsize=10)
            if col == 0:
                ax.set_ylabel(text("mask.query"))
            ax.set_xlabel(text("mask.key"))
    fig.suptitle(text("mask.title"))
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


def _draw_seq2seq(ax: plt.Axes, text: Captions) -> None:
    s, cfg = traced_shapes("paper-base")
    enc, dec = "encoder.layers.0", "decoder.layers.0"
    _box(ax, 0.3, 0.3, 4.2, 0.9, f"{text('flow.src_ids')}\n{s['src_embed'][0][0]}", "#ddf4ff")
    _box(ax, 5.5, 0.3, 4.2, 0.9, f"{text('flow.tgt_ids')}\n{s['tgt_embed'][0][0]}", "#ddf4ff")
    for x, name in ((0.3, "src_embed"), (5.5, "tgt_embed")):
        _box(ax, x, 1.8, 4.2, 0.9, f"{text('flow.embed', name=name, d=cfg.d_model)}\n{s[name][1][0]}",
             "#fff8c5")
    _box(ax, 0.3, 3.3, 4.2, 3.2, text("flow.encoder", n=cfg.n_encoder_layers, w=s[enc + ".self_attn"][1][1],
                                      f=s[enc + ".ffn.up_proj"][1][0], o=s[enc][1][0]), "#dafbe1")
    _box(ax, 5.5, 3.3, 4.2, 4.6, text("flow.decoder", n=cfg.n_decoder_layers, w=s[dec + ".self_attn"][1][1],
                                      c=s[dec + ".cross_attn"][1][1], f=s[dec + ".ffn.up_proj"][1][0],
                                      o=s[dec][1][0]), "#dafbe1")
    _box(ax, 0.3, 7.2, 4.2, 0.9, f"{text('flow.memory')}\n{s['encoder'][1][0]}", "#fbefff")
    _box(ax, 5.5, 8.5, 4.2, 0.9, f"{text('flow.generator')}\n{text('flow.logits')} {s['generator'][1][0]}",
         "#ffebe9")
    for x in (2.4, 7.6):
        _arrow(ax, (x, 1.25), (x, 1.75))
        _arrow(ax, (x, 2.75), (x, 3.25))
    _arrow(ax, (2.4, 6.55), (2.4, 7.15))
    _arrow(ax, (4.55, 7.65), (5.45, 5.6), "K, V")
    _arrow(ax, (7.6, 7.95), (7.6, 8.45))


def _draw_decoder_only(ax: plt.Axes, text: Captions) -> None:
    s, cfg = traced_shapes(GPT2.model_type)
    block = "layers.0"
    _box(ax, 2.0, 0.3, 6.0, 0.9, f"{text('flow.prompt')}\n{s['embed'][0][0]}", "#ddf4ff")
    embed = text("flow.lm_embed", position=text(f"pos.{cfg.position}"))
    _box(ax, 2.0, 1.8, 6.0, 0.9, f"{embed}\n{s['embed'][1][0]}",
         "#fff8c5")
    _box(ax, 2.0, 3.3, 6.0, 3.2, text("flow.block", n=cfg.n_layers, placement=cfg.norm_placement,
                                      w=s[block + ".self_attn"][1][1], f=s[block + ".ffn.up_proj"][1][0],
                                      o=s[block][1][0]), "#dafbe1")
    _box(ax, 2.0, 7.0, 6.0, 0.9, f"{text('flow.final_norm')}\n{s['norm'][1][0]}", "#fbefff")
    _box(ax, 2.0, 8.5, 6.0, 0.9, f"{text('flow.lm_head')}\n{text('flow.logits')} {s['lm_head'][1][0]}",
         "#ffebe9")
    for y0, y1 in ((1.25, 1.75), (2.75, 3.25), (6.55, 6.95), (7.95, 8.45)):
        _arrow(ax, (5.0, y0), (5.0, y1))


def figure_data_flow(out_dir: Path, text: Captions) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 7), width_ratios=(1.15, 1))
    _draw_seq2seq(left, text)
    _draw_decoder_only(right, text)
    left.set_title(text("flow.seq2seq"), fontsize=11)
    right.set_title(text("flow.decoder_only"), fontsize=11)
    for ax in (left, right):
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 9.8)
        ax.axis("off")
    fig.suptitle(text("flow.title"))
    fig.tight_layout()
    return _save(fig, out_dir / "data_flow.png")


FIGURES: dict[str, Callable[[Path, Captions], Path]] = {
    "softmax_temperature": figure_softmax_temperature,
    "top_k_top_p": figure_top_k_top_p,
    "scaling": figure_scaling,
    "positional_encoding": figure_positional_encoding,
    "masks": figure_masks,
    "data_flow": figure_data_flow,
}


# Under the current directory, like every run's output; the committed figures (docs/figures,
# docs/zh/figures) are redrawn only when asked: `handformer explain --out docs/figures`
OUT_DIRS = {"en": "runs/explain", "zh": "runs/explain/zh"}


def explain(out_dir: str | os.PathLike | None = None, lang: str = "en") -> list[Path]:
    """Draw every figure into `out_dir` (default: OUT_DIRS[lang]) with titles and labels in `lang`
    ("en" or "zh"); returns their paths. Chinese needs a CJK font: without one, a warning line and
    English labels."""
    text = captions_for(lang)
    out_dir = Path(OUT_DIRS[lang] if out_dir is None else out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file, not a directory; give a directory for the figures")
    out_dir.mkdir(parents=True, exist_ok=True)
    with label_fonts():
        return [draw(out_dir, text) for draw in FIGURES.values()]
