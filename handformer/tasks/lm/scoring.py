"""Scoring a text with a language-model run: loss, perplexity and bits per token
(`handformer eval` on an LM run), over non-overlapping or sliding windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from handformer.data.lookup import text_file
from handformer.data.text import (
    as_token_tensor,
    load_text,
    split_text,
)
from handformer.modes import eval_mode
from handformer.tasks.lm.run import LMRun

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
    if data.get("shards"):
        raise ValueError(f"this run trained on token shards ({data['shards']}); its validation loss "
                         "on their validation shards is in metrics.jsonl (val_loss); pass --data PATH "
                         "to score a text")
    if not data.get("val_fraction"):
        raise ValueError("this run was trained without a validation split (data.val_fraction = 0); "
                         "pass --data PATH to score a text")
    try:
        text = load_text(text_file(data["dataset"]) if data.get("dataset") else data["path"])
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
