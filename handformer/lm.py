"""The language-model job's run directory: what `handformer train` (task "lm") and
`handformer import-hf` write, and what `handformer generate` loads.

    config.json         {"task": "lm", "model": CausalLMConfig fields, "tokens": {"bos_id", "eos_id",
                         "pad_id"} (each an id or null), plus optional "train", "data", "source"}
    tokenizer.json      a Hugging Face `tokenizers` file
    model.safetensors   CausalLM weights under handformer's names (tied weights stored once)

A trained run also holds checkpoint.safetensors (resumable), metrics.jsonl and loss_curve.png.
`score_text` gives a run's loss and perplexity on a text (`handformer eval`).
The second half of this file is the training job: `LMJob` (a TOML config's [model], [train] and
[data] sections) and `run_train_lm`, which feeds random windows of text to the shared loop.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from handformer import distributed
from handformer.causal_lm import CausalLM
from handformer.checkpoint import load_weights, save_weights
from handformer.config import CausalLMConfig, dataclass_from_dict
from handformer.data.text import (
    PYDOC,
    LMBatch,
    LMWindows,
    as_token_tensor,
    load_text,
    split_text,
    validation_batches,
)
from handformer.io import atomic_write_text
from handformer.losses import token_cross_entropy
from handformer.modes import eval_mode
from handformer.tokenizer import Tokenizer
from handformer.train import TrainConfig, TrainResult, train_new_model


@dataclass
class SpecialTokens:
    bos_id: int | None = None  # prepended to prompts when set
    eos_id: int | None = None  # generation stops here by default
    pad_id: int | None = None  # fills the left of shorter prompts in a batch


@dataclass
class LMRun:
    model: CausalLM
    tokenizer: Tokenizer
    tokens: SpecialTokens
    config: dict[str, Any]  # the whole config.json


def write_lm_run_config(run_dir: str | os.PathLike, model_cfg: CausalLMConfig, tokens: SpecialTokens,
                        **sections: Any) -> None:
    """Write config.json for a language-model run; extra sections (train, data, source) as given."""
    data = {"task": "lm", "model": model_cfg.to_dict(), "tokens": tokens.__dict__, **sections}
    atomic_write_text(Path(run_dir) / "config.json", json.dumps(data, indent=2) + "\n")


def save_lm_run(run_dir: str | os.PathLike, model: CausalLM, tokenizer: Tokenizer,
                tokens: SpecialTokens, **sections: Any) -> None:
    """A complete run directory: config.json, tokenizer.json and model.safetensors."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / "tokenizer.json")
    save_weights(model, run_dir / "model.safetensors")
    write_lm_run_config(run_dir, model.cfg, tokens, **sections)


def load_lm(run_dir: str | os.PathLike, device: str | torch.device = "cpu") -> LMRun:
    """Load a language-model run directory for generation (model in eval mode)."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json); train one with "
                                "`handformer train --config configs/lm_default.toml` or import one "
                                "with `handformer import-hf`")
    config = json.loads(config_path.read_text())
    if config.get("task") != "lm":
        raise ValueError(f"{run_dir} holds a {config.get('task')!r} run, not a language model "
                         "(task 'lm'); use `handformer translate` for translation runs")
    for name in ("model.safetensors", "tokenizer.json"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir} has no {name}")
    model = CausalLM(CausalLMConfig.from_dict(config["model"], "model"))
    load_weights(model, run_dir / "model.safetensors")
    tokens = SpecialTokens(**config.get("tokens", {}))
    return LMRun(model.to(device).eval(), Tokenizer.load(run_dir / "tokenizer.json"), tokens, config)


# --- scoring text ------------------------------------------------------------------------------

EVAL_TOKENS_PER_BATCH = 2048  # windows per forward: this many tokens' worth (at least one window)
EVAL_DEFAULT_BLOCK = 1024  # default window of runs without a training block size (imported ones)


@dataclass
class TextScore:
    """A language model's next-token loss on a text (what `handformer eval` prints for LM runs)."""
    loss: float  # mean cross-entropy, nats per token
    tokens: int  # tokens scored (each once)
    windows: int
    block_size: int
    stride: int  # tokens between window starts (= block_size: windows do not overlap)
    unknown: int  # scored tokens the tokenizer does not know (its unknown token)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)

    def format(self) -> str:
        line = (f"loss {self.loss:.4f} per token  perplexity {self.perplexity:.2f}  "
                f"{self.bits_per_token:.3f} bits per token  ({self.tokens:,} tokens in "
                f"{self.windows:,} window{'s' if self.windows != 1 else ''} of {self.block_size}")
        line += f", stride {self.stride})" if self.stride != self.block_size else ")"
        if self.unknown:
            line += (f"\nwarning: {self.unknown:,} of the scored tokens are unknown to the tokenizer "
                     "(characters absent from its training text); they count in the loss")
        return line


def eval_text(run: LMRun, source: str) -> str:
    """The text `handformer eval --data SOURCE` scores: "val" (the run's own validation split:
    the last data.val_fraction of its training text, as split for training), "pydoc" (the
    embedded corpus) or a text file or folder (plain or .gz)."""
    if source != "val":
        return load_text(source)
    data = run.config.get("data")
    if not data:
        raise ValueError("this run has no training data recorded in its config.json (an imported "
                         "checkpoint?), so it has no validation split; pass --data PATH to score a text")
    if not data.get("val_fraction"):
        raise ValueError("this run was trained without a validation split (data.val_fraction = 0); "
                         "pass --data PATH to score a text")
    try:
        text = load_text(data["path"])
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err} (the run's training text, from its config.json); run from "
                                "the directory it was trained in, or pass --data PATH") from None
    return split_text(text, data["val_fraction"])[1]


def score_text(run: LMRun, text: str, block_size: int | None = None, limit: int = 0,
               stride: int | None = None) -> TextScore:
    """Mean next-token cross-entropy of the run's model over `text`.

    The token stream (after the run's BOS token, when it has one, as `generate` prompts) is cut
    into windows of `block_size` tokens (default: the run's training block size, else the model's
    context length up to EVAL_DEFAULT_BLOCK), each token predicted from the tokens before it in
    its window. By default the windows do not overlap, so a window's first tokens are predicted
    from little context; these are the windows of training's fixed validation set with
    data.eval_batches = 0. With `stride` < block_size the window slides: each starts `stride`
    tokens after the previous one and scores only its last `stride` tokens (the first window
    scores all of its own), so every token after the first window has at least
    block_size - stride tokens of context. Each token is scored at most once: all but the first
    and a tail too short for another whole window. `limit` > 0 scores only the first `limit`
    windows."""
    context = run.model.cfg.max_positions
    if block_size is None:
        block_size = min(run.config.get("data", {}).get("block_size", EVAL_DEFAULT_BLOCK), context)
    if not 1 <= block_size <= context:
        raise ValueError(f"block size {block_size} is invalid: it must be between 1 and the "
                         f"model's context length (max_positions = {context})")
    stride = block_size if stride is None else stride
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride {stride} is invalid: it must be between 1 and the block size "
                         f"({block_size})")
    if limit < 0:
        raise ValueError(f"limit {limit} is invalid: give a number of windows >= 1, or 0 for all")
    bos = [] if run.tokens.bos_id is None else [run.tokens.bos_id]
    ids = as_token_tensor(bos + run.tokenizer.encode(text), run.tokenizer.vocab_size)
    if len(ids) < block_size + 1:
        raise ValueError(f"the text has {len(ids):,} tokens; scoring needs at least block size + 1 "
                         f"= {block_size + 1}; give more text or a smaller block size")
    n_windows = (len(ids) - 1 - block_size) // stride + 1  # windows whose block_size + 1 tokens fit
    if limit:
        n_windows = min(n_windows, limit)
    windows = ids.unfold(0, block_size + 1, 1)  # (N - T, T + 1): every run of T + 1 tokens, a view
    starts = torch.arange(n_windows) * stride  # (n_windows,)
    device = next(run.model.parameters()).device
    new_tokens = torch.arange(block_size, device=device) >= block_size - stride  # (T,): scored ones
    per_batch = max(1, EVAL_TOKENS_PER_BATCH // block_size)
    total, scored, unknown = 0.0, 0, 0
    with eval_mode(run.model), torch.no_grad():
        for i in range(0, n_windows, per_batch):
            chunk = windows[starts[i:i + per_batch]].long().to(device)  # (B, T + 1)
            x, y = chunk[:, :-1], chunk[:, 1:]  # (B, T) inputs, (B, T) next tokens
            keep = new_tokens.expand_as(y).clone()  # (B, T)
            if i == 0:
                keep[0] = True  # the first window scores every token it holds
            logits = run.model(x).logits  # (B, T, V)
            total += F.cross_entropy(logits[keep].float(), y[keep], reduction="sum").item()
            scored += int(keep.sum())
            if run.tokenizer.unk_id is not None:
                unknown += int((y[keep] == run.tokenizer.unk_id).sum())
    return TextScore(total / scored, scored, n_windows, block_size, stride, unknown)


# --- the training job -------------------------------------------------------------------------

@dataclass
class LMDataConfig:
    path: str = PYDOC  # "pydoc" (the embedded corpus) or a text file or folder (plain or .gz)
    tokenizer: str = "char"  # char | bpe, trained on the training split only
    vocab_size: int = 8000  # BPE vocabulary size (char: the characters of the training split)
    block_size: int = 256  # tokens per training window: the context length the model learns
    batch_size: int = 64  # windows per batch
    val_fraction: float = 0.1  # the last fraction of the text held out for validation; 0 = none
    batches_per_epoch: int = 1000  # batches between reseedings of the window sampler
    eval_batches: int = 20  # size of the fixed validation set, in batches; 0 = the whole split

    def __post_init__(self) -> None:
        def fail(name: str, fix: str) -> None:
            raise ValueError(f"[data] {name}={getattr(self, name)!r} is invalid: {fix}")

        if not isinstance(self.path, str) or not self.path:
            fail("path", f'give a text file, a folder, or "{PYDOC}" for the embedded corpus')
        if self.tokenizer not in ("char", "bpe"):
            fail("tokenizer", "choose char or bpe")
        for name in ("vocab_size", "block_size", "batch_size", "batches_per_epoch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                fail(name, "it must be a positive integer")
        if not isinstance(self.eval_batches, int) or self.eval_batches < 0:
            fail("eval_batches", "it must be an integer >= 0 (0 = the whole validation split)")
        if not isinstance(self.val_fraction, (int, float)) or not 0 <= self.val_fraction < 1:
            fail("val_fraction", "it must be in [0, 1) (0 = no validation)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMDataConfig:
        return dataclass_from_dict(cls, data, "data")


MODEL_PRESETS = {"gpt2": CausalLMConfig.gpt2_style, "llama": CausalLMConfig.llama_style}

# Where a language model's usual practice differs from TrainConfig's (the translation paper's)
# defaults; a [train] section overrides them like any other default.
LM_TRAIN_DEFAULTS = {"label_smoothing": 0.0, "schedule": "cosine"}


@dataclass
class LMJob:
    # CausalLMConfig fields, plus `preset = "gpt2" | "llama"` to start from that style before the
    # other fields apply. vocab_size comes from the tokenizer; max_positions defaults to block_size.
    model: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(**LM_TRAIN_DEFAULTS))
    data: LMDataConfig = field(default_factory=LMDataConfig)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMJob:
        """A job from a config dict; every error names the section and field. The model section is
        checked here too (with a placeholder vocabulary), before any text is read."""
        unknown = sorted(set(data) - {"model", "train", "data", "task"})
        if unknown:
            raise ValueError(f"unknown config section(s) {', '.join(unknown)} for a language model; "
                             "valid: model, train, data")
        model = data.get("model", {})
        if not isinstance(model, dict):
            raise ValueError(f"[model] must be a table of settings, got {type(model).__name__}")
        train_section = data.get("train", {})
        if not isinstance(train_section, dict):
            raise ValueError(f"[train] must be a table of settings, got {type(train_section).__name__}")
        job = cls(dict(model), TrainConfig.from_dict({**LM_TRAIN_DEFAULTS, **train_section}),
                  LMDataConfig.from_dict(data.get("data", {})))
        job.model_config(vocab_size=1)
        return job

    def model_config(self, vocab_size: int) -> CausalLMConfig:
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        if preset is not None and preset not in MODEL_PRESETS:
            raise ValueError(f"[model] preset={preset!r} is invalid: choose "
                             f"{' or '.join(MODEL_PRESETS)}, or leave it out for CausalLMConfig's defaults")
        if "vocab_size" in fields:
            raise ValueError("[model] vocab_size is set from the tokenizer; remove it (for BPE, set "
                             "data.vocab_size instead)")
        fields.setdefault("max_positions", self.data.block_size)
        base = MODEL_PRESETS[preset]() if preset else CausalLMConfig()
        cfg = CausalLMConfig.from_dict({**base.to_dict(), **fields, "vocab_size": vocab_size}, "model")
        if cfg.max_positions < self.data.block_size:
            raise ValueError(f"[model] max_positions={cfg.max_positions} is invalid: it must be at "
                             f"least data.block_size={self.data.block_size}, the length trained on")
        return cfg


def lm_loss(model: torch.nn.Module, batch: LMBatch, label_smoothing: float) -> torch.Tensor:
    """Summed next-token cross-entropy over every position (windows have no padding)."""
    logits = model(batch.x).logits  # (B, T, V)
    return token_cross_entropy(logits, batch.y, None, label_smoothing)


def train_tokens(tokenizer: Tokenizer) -> SpecialTokens:
    """The special tokens of a model trained here on raw text windows. It never saw BOS or EOS (the
    text has no document markers), so generation must neither prepend BOS (an untrained embedding)
    nor wait for an EOS it cannot predict. Padding is only for batching prompts of different
    lengths: padded positions are masked out of attention, so any id works; the tokenizer's <pad>
    keeps decoded text clean (decode drops it)."""
    return SpecialTokens(bos_id=None, eos_id=None, pad_id=tokenizer.pad_id)


def encode_splits(tokenizer: Tokenizer, train_text: str, val_text: str, data: LMDataConfig,
                  seed: int, log=print) -> tuple[LMWindows, list[LMBatch] | None]:
    """Training windows (data order seeded by `seed`) and the fixed validation batches (None
    without a validation split)."""
    train_ids = as_token_tensor(tokenizer.encode(train_text), tokenizer.vocab_size)
    windows = LMWindows(train_ids, data.block_size, data.batch_size, data.batches_per_epoch, seed)
    log(f"{data.tokenizer} tokenizer: {tokenizer.vocab_size:,} tokens; {len(train_ids):,} training "
        f"tokens, {data.block_size} per window, {data.batch_size} windows per batch")
    if not val_text:
        return windows, None
    val_ids = as_token_tensor(tokenizer.encode(val_text), tokenizer.vocab_size)
    val_batches = validation_batches(val_ids, data.block_size, data.batch_size, data.eval_batches)
    log(f"validation: {sum(b.n_tokens for b in val_batches):,} of {len(val_ids):,} tokens in "
        f"{len(val_batches)} fixed batches")
    return windows, val_batches


def run_train_lm(job: LMJob, run_dir: str | os.PathLike, resume: bool = False,
                 log=print) -> tuple[CausalLM, TrainResult]:
    """Train (or resume) a language model on `job.data` in `run_dir` with the shared loop."""
    run_dir = Path(run_dir)
    main = distributed.env_rank() == 0  # under torchrun, rank 0 alone logs and writes files
    log = log if main else distributed.quiet
    data = job.data
    text = load_text(data.path)
    train_text, val_text = split_text(text, data.val_fraction)
    source = "the embedded pydoc corpus" if data.path == PYDOC else data.path
    log(f"{len(text):,} characters from {source}: {len(train_text):,} for training, "
        f"{len(val_text):,} for validation")
    if resume:
        tokenizer = Tokenizer.load(run_dir / "tokenizer.json")
    else:
        tokenizer = Tokenizer.train(data.tokenizer, [train_text], data.vocab_size)
    model_cfg = job.model_config(tokenizer.vocab_size)
    windows, val_batches = encode_splits(tokenizer, train_text, val_text, data, job.train.seed, log)
    if not resume and main:  # written once the data is known to be usable
        run_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(run_dir / "tokenizer.json")
        write_lm_run_config(run_dir, model_cfg, train_tokens(tokenizer), train=asdict(job.train),
                            data=asdict(data))

    return train_new_model(lambda: CausalLM(model_cfg), job.train, windows, val_batches, lm_loss,
                           run_dir, resume=resume, log=log)
