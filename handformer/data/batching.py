"""Batching for the encoder-decoder model: bucket by length, cut batches by a token budget.

A batch holds as many sentences as fit in `max_tokens` padded tokens (batch size x longest side),
so short sentences travel in large batches and long ones in small batches, and padding stays small.
Batch order is a pure function of (seed, epoch): a resumed run sees exactly the same batches.

Shape legend: B batch, S source length, T target length (+1 for BOS/EOS).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Seq2SeqBatch:
    src: Tensor  # (B, S) source ids ending in EOS, right-padded
    tgt_in: Tensor  # (B, T) BOS + target ids: the decoder's input (teacher forcing)
    tgt_out: Tensor  # (B, T) target ids + EOS: what each position must predict
    n_tokens: int  # real (non-pad) target tokens, for normalizing the loss

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        return Seq2SeqBatch(self.src.to(device, non_blocking=True),
                            self.tgt_in.to(device, non_blocking=True),
                            self.tgt_out.to(device, non_blocking=True), self.n_tokens)


@dataclass
class EncodedPairs:
    src: list[list[int]]  # source ids, each ending in EOS
    tgt: list[list[int]]  # target ids without BOS/EOS (added when batching)
    truncated: int  # examples cut to the maximum length (EOS kept)


def encode_pairs(pairs: Sequence[tuple[str, str]], src_tok, tgt_tok, max_length: int) -> EncodedPairs:
    """Tokenize pairs; a side longer than `max_length` (EOS included) is cut, keeping its EOS,
    and counted in `truncated`."""
    src_ids = src_tok.encode_batch([s for s, _ in pairs])
    tgt_ids = tgt_tok.encode_batch([t for _, t in pairs])
    truncated = 0
    src_out, tgt_out = [], []
    for s, t in zip(src_ids, tgt_ids):
        if len(s) + 1 > max_length or len(t) + 1 > max_length:
            truncated += 1
        src_out.append(s[: max_length - 1] + [src_tok.eos_id])
        tgt_out.append(t[: max_length - 1])
    return EncodedPairs(src_out, tgt_out, truncated)


def collate(src: Sequence[list[int]], tgt: Sequence[list[int]], pad_id: int, bos_id: int,
            eos_id: int) -> Seq2SeqBatch:
    B = len(src)
    S = max(len(s) for s in src)
    T = max(len(t) for t in tgt) + 1
    src_t = torch.full((B, S), pad_id, dtype=torch.long)  # (B, S)
    tgt_in = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
    tgt_out = torch.full((B, T), pad_id, dtype=torch.long)  # (B, T)
    for i, (s, t) in enumerate(zip(src, tgt)):
        src_t[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(t) + 1] = torch.tensor([bos_id] + t)
        tgt_out[i, : len(t) + 1] = torch.tensor(t + [eos_id])
    n_tokens = sum(len(t) + 1 for t in tgt)
    return Seq2SeqBatch(src_t, tgt_in, tgt_out, n_tokens)


def token_budget_batches(lengths: Sequence[int], max_tokens: int, shuffle: bool, seed: int = 0,
                         pool_batches: int = 50) -> list[list[int]]:
    """Group example indices into batches whose padded size (count x longest) <= max_tokens.

    With shuffle, examples are shuffled, sorted by length within pools of about `pool_batches`
    batches (so batches mix lengths little but epochs differ), and the batch order is shuffled.
    """
    if max_tokens < max(lengths):
        raise ValueError(f"max_tokens={max_tokens} is smaller than the longest example "
                         f"({max(lengths)} tokens); raise max_tokens or lower max_length")
    order = list(range(len(lengths)))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
        avg = max(1, max_tokens // max(1, sum(lengths) // len(lengths)))
        pool = avg * pool_batches
        order = [i for p in range(0, len(order), pool)
                 for i in sorted(order[p: p + pool], key=lambda i: lengths[i])]
    else:
        order.sort(key=lambda i: lengths[i])
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


class Seq2SeqData:
    """Encoded pairs plus deterministic, token-budgeted batching for any epoch."""

    def __init__(self, encoded: EncodedPairs, max_tokens: int, pad_id: int, bos_id: int,
                 eos_id: int, shuffle: bool = True, seed: int = 0) -> None:
        self.encoded = encoded
        self.max_tokens = max_tokens
        self.ids = (pad_id, bos_id, eos_id)
        self.shuffle = shuffle
        self.seed = seed
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(encoded.src, encoded.tgt)]

    def __len__(self) -> int:
        return len(self.lengths)

    def epoch(self, epoch: int) -> list[Seq2SeqBatch]:
        """The batches of one epoch, the same for the same (seed, epoch)."""
        groups = token_budget_batches(self.lengths, self.max_tokens, self.shuffle,
                                      seed=self.seed * 1_000_003 + epoch)
        return [collate([self.encoded.src[i] for i in g], [self.encoded.tgt[i] for i in g],
                        *self.ids) for g in groups]
