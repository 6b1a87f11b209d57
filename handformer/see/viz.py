"""`handformer viz`: look inside a trained run at the attention behind one input.

For an encoder-decoder (translation) run: translate TEXT, then teacher-force that translation to
get every map: cross-attention (output tokens x source tokens), encoder self-attention (source x
source) and decoder self-attention (target x target, causal). For a language-model run: continue
TEXT greedily by a few tokens, then run one forward over prompt + generated tokens with
need_weights=True: causal self-attention over both.

Each map becomes PNGs (a grid of heads per layer and the head-averaged map, tokens on both axes)
and all of them go into one self-contained HTML explorer (handformer.see.explorer).

Shape legend: H heads, T queries, S keys. Layers and heads are counted from 0, as in
`weights[layer][batch, head, query, key]`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from handformer.see.explorer import explorer_text, write_explorer
from handformer.see.plots import plot_attention, plot_attention_heads

TASKS = ("translation", "lm")


@dataclass
class AttentionView:
    """One kind of attention in a model (say, cross-attention), over every layer."""

    name: str  # file-name prefix: cross | encoder | decoder | self
    title: str  # what it is, in words
    query_tokens: list[str]  # row labels
    key_tokens: list[str]  # column labels
    query_title: str
    key_title: str
    layers: list[np.ndarray]  # per layer, (H, T, S); each row sums to 1
    split: int | None = None  # position where generated tokens begin (language models)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        return self.layers[0].shape[0]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "queries": self.query_tokens,
                "keys": self.key_tokens, "query_title": self.query_title,
                "key_title": self.key_title, "split": self.split,
                "layers": [np.round(w.astype(np.float64), 4).tolist() for w in self.layers]}


@dataclass
class AttentionReport:
    """What `viz` shows: the input, what the model made of it, and its attention maps."""

    task: str  # translation | lm
    text: str  # the source sentence or the prompt
    output: str  # the translation or the generated continuation
    views: list[AttentionView] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        what = "translation" if self.task == "translation" else "greedy continuation"
        return {"task": self.task, "text": self.text, "output": self.output, "output_label": what,
                "views": [v.to_dict() for v in self.views]}


# --- reading a run directory -------------------------------------------------------------------

def read_run_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """config.json of a run directory, checked to be a translation or language-model run."""
    path = Path(run_dir)
    from handformer.config import CausalLMConfig, Seq2SeqConfig
    from handformer.tasks.run_config import read_run_config as read_checked
    from handformer.tasks.run_config import run_model_config

    config = read_checked(path)  # one clear error for a missing, broken or foreign config.json
    run_model_config(path, config, Seq2SeqConfig if config["task"] == "translation" else CausalLMConfig)
    return config


def layer_counts(config: dict[str, Any]) -> dict[str, int]:
    """Layers of each attention view of a run, from its config."""
    model = config["model"]
    if config["task"] == "translation":
        return {"cross": model["n_decoder_layers"], "encoder": model["n_encoder_layers"],
                "decoder": model["n_decoder_layers"]}
    return {"self": model["n_layers"]}


def check_selection(config: dict[str, Any], layer: int | None, head: int | None) -> None:
    """Raise ValueError naming the valid range when `layer` or `head` does not exist in the run."""
    counts = layer_counts(config)
    if layer is not None and not any(0 <= layer < n for n in counts.values()):
        if len(set(counts.values())) == 1:
            n = next(iter(counts.values()))
            valid = f"0-{n - 1} ({n} layer{'s' if n > 1 else ''}, counted from 0)"
        else:
            valid = ", ".join(f"{name} 0-{n - 1}" for name, n in counts.items()) + " (counted from 0)"
        raise ValueError(f"--layer {layer} is out of range; valid layers: {valid}")
    n_heads = config["model"]["n_heads"]
    if head is not None and not 0 <= head < n_heads:
        raise ValueError(f"--head {head} is out of range; valid heads: 0-{n_heads - 1} "
                         f"({n_heads} heads, counted from 0)")


def _check_text(text: str, n_tokens: int) -> None:
    if not text.strip():
        raise ValueError("TEXT is empty: give a sentence (or a prompt) to look at")
    if n_tokens == 0:
        raise ValueError(f"TEXT {text!r} tokenizes to nothing; give text the run's tokenizer knows")


# --- the two model families --------------------------------------------------------------------

def translation_report(run_dir: str | os.PathLike, text: str, device: str = "cpu") -> AttentionReport:
    """Translate `text` with the run's decoding settings and collect every attention map."""
    from handformer.tasks.translation.translator import Translator, attention_maps

    translator = Translator.load(run_dir, device)
    _check_text(text, len(translator.encode_sources([text])[0]) - 1)  # minus the EOS it appends
    _, outputs = translator.translate_ids([text])
    views = translation_views(attention_maps(translator, text, outputs[0]))
    return AttentionReport("translation", text, translator.tgt_tok.decode(outputs[0]), views)


def translation_views(maps: dict) -> list[AttentionView]:
    """The cross, encoder and decoder views of `attention_maps`' result (translator.py)."""
    src, tgt, produced = maps["source_tokens"], maps["target_tokens"], maps["output_tokens"]
    return [
        AttentionView("cross", "cross-attention: each output token over the source tokens", produced,
                      src, "output token being produced", "source tokens", list(maps["cross"])),
        AttentionView("encoder", "encoder self-attention: source tokens over source tokens", src, src,
                      "source token (query)", "source tokens (keys)", list(maps["encoder"])),
        AttentionView("decoder", "decoder self-attention (causal): target tokens over earlier target "
                      "tokens", tgt, tgt, "target token, decoder input (query)", "target tokens (keys)",
                      list(maps["decoder"])),
    ]


def lm_report(run_dir: str | os.PathLike, text: str, max_new_tokens: int = 8,
              device: str = "cpu") -> AttentionReport:
    """Continue `text` greedily by up to `max_new_tokens` tokens, then take the self-attention of
    one forward over prompt + continuation."""
    from handformer.generation.generate import generate
    from handformer.tasks.lm.run import load_lm

    if max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    run = load_lm(run_dir, device)
    prompt = run.tokenizer.encode(text)
    _check_text(text, len(prompt))
    ids = ([run.tokens.bos_id] if run.tokens.bos_id is not None else []) + prompt
    context = run.model.cfg.max_positions
    if len(ids) > context:
        raise ValueError(f"TEXT is {len(ids)} tokens but the model's context is {context} tokens "
                         "(max_positions); shorten it")
    # Not generate's own limit: the whole continuation is fed back below to read its attention.
    new = generate(run.model, [ids], min(max_new_tokens, context - len(ids)), temperature=0,
                   stop_tokens=run.tokens.eos_ids,
                   pad_id=run.tokens.pad_id or 0)[0]
    full = torch.tensor([ids + new], device=next(run.model.parameters()).device)  # (1, T)
    with torch.no_grad():
        out = run.model(full, need_weights=True)
    layers = [w[0].float().cpu().numpy() for w in out.attentions]  # per layer (H, T, T)
    tokens = run.tokenizer.tokens(ids + new)
    view = AttentionView("self", "causal self-attention over the prompt and the generated tokens "
                         "(red line: generation starts)", tokens, tokens, "token (query)",
                         "tokens it may attend to (keys)", layers, split=len(ids) if new else None)
    return AttentionReport("lm", text, run.tokenizer.decode(new), [view])


def attention_report(run_dir: str | os.PathLike, text: str, max_new_tokens: int = 8,
                     device: str = "cpu") -> AttentionReport:
    config = read_run_config(run_dir)
    if config["task"] == "translation":
        return translation_report(run_dir, text, device)
    return lm_report(run_dir, text, max_new_tokens, device)


# --- pictures ----------------------------------------------------------------------------------

def write_pngs(report: AttentionReport, out_dir: str | os.PathLike, layer: int | None = None,
               head: int | None = None) -> list[Path]:
    """Per view and layer: the grid of all heads (or, with `head`, that head alone) and the
    head-averaged map. `layer` limits the pictures to that layer."""
    out_dir = Path(out_dir)
    files = []
    for view in report.views:
        layers = range(view.n_layers) if layer is None else [layer] if layer < view.n_layers else []
        for i in layers:
            weights = view.layers[i]  # (H, T, S)
            stem = f"{view.name}_layer{i}"
            where = f"layer {i}"
            if head is None:
                files.append(plot_attention_heads(
                    weights, view.key_tokens, view.query_tokens, out_dir / f"{stem}_heads.png",
                    f"{view.title}\n{where}, every head", view.key_title, view.query_title, view.split))
            else:
                files.append(plot_attention(
                    weights[head], view.key_tokens, view.query_tokens, out_dir / f"{stem}_head{head}.png",
                    f"{view.title}\n{where}, head {head}", view.key_title, view.query_title,
                    view.split, dpi=100))
            files.append(plot_attention(
                weights.mean(0), view.key_tokens, view.query_tokens, out_dir / f"{stem}_mean.png",
                f"{view.title}\n{where}, mean of {view.n_heads} heads", view.key_title,
                view.query_title, view.split, dpi=100))
    return files


def visualize(run_dir: str | os.PathLike, text: str, out_dir: str | os.PathLike | None = None,
              layer: int | None = None, head: int | None = None, max_new_tokens: int = 8,
              device: str = "cpu", lang: str = "en") -> tuple[AttentionReport, list[Path]]:
    """Everything `handformer viz` does: the report, its PNGs and the explorer (attention.html, its
    words in `lang`: en or zh), in `out_dir` (default RUN_DIR/viz). Returns the report and the files
    written, explorer last."""
    explorer_text(lang)  # an unknown language fails before any work
    config = read_run_config(run_dir)
    check_selection(config, layer, head)  # before any work, from the config alone
    report = attention_report(run_dir, text, max_new_tokens, device)
    out_dir = Path(out_dir) if out_dir is not None else Path(run_dir) / "viz"
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_pngs(report, out_dir, layer, head)
    files.append(write_explorer(report.to_dict(), out_dir / "attention.html", lang))
    return report, files
