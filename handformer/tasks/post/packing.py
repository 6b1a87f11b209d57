"""Conversations into training batches: packed several to a window, or one to a row with padding.

Each conversation becomes x = ids[:-1] and y = ids[1:], with y = -100 where the loss learns
nothing (not the assistant's token). Shifting within the conversation means its last token never
predicts the next conversation's first.

    packed   windows of block_size positions, filled with whole conversations best fit
             decreasing (TRL's packing_strategy="bfd": the longest first, each into the window it
             leaves the least room in; `best_fit=False`: in order, a window closed when the next
             does not fit); a batch carries each position's document id, attention never crosses
             a conversation (the mask object's document mask, nn/masks.py: packed_mask) and
             positions restart at 0 in each, so the loss is the one each conversation would get
             alone. The window's tail is padding: a document of its own, learned nothing.
    padded   batch_size conversations a batch, right-padded to the longest (an attention mask hides
             the padding).

A conversation longer than the block is truncated to it (its start kept) or dropped
(`overlong`); one left with nothing to learn is dropped. `SFTBatches.epoch(e)` shuffles the
conversations with seed + e, so every epoch sees them in a new order and a run resumes exactly.

Shape legend: B rows, T positions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from handformer.tasks.post.rendering import Rendered

IGNORE = -100  # a target the loss skips (F.cross_entropy's ignore_index)


@dataclass
class SFTExample:
    x: list[int]  # ids[:-1]
    y: list[int]  # ids[1:], IGNORE where not learned


@dataclass
class SFTBatch:
    x: Tensor  # (B, T) input ids
    y: Tensor  # (B, T) targets, IGNORE where nothing is learned
    position_ids: Tensor  # (B, T): from 0 in each conversation
    document_ids: Tensor | None  # (B, T) packed windows: which conversation each position holds
    attention_mask: Tensor | None  # (B, T) padded rows: 1 = real token
    n_tokens: int  # learned targets

    def to(self, device: torch.device | str) -> SFTBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return SFTBatch(move(self.x), move(self.y), move(self.position_ids), move(self.document_ids),
                        move(self.attention_mask), self.n_tokens)


@dataclass
class Counts:
    """What became of the conversations, reported by the run."""

    kept: int = 0
    truncated: int = 0
    dropped_long: int = 0  # over the block, with overlong = "drop"
    dropped_empty: int = 0  # nothing left to learn after truncation

    def report(self, block_size: int) -> str:
        parts = [f"{self.kept:,} conversations"]
        if self.truncated:
            parts.append(f"{self.truncated:,} truncated to block_size={block_size}")
        if self.dropped_long:
            parts.append(f"{self.dropped_long:,} dropped: longer than block_size={block_size}")
        if self.dropped_empty:
            parts.append(f"{self.dropped_empty:,} dropped: nothing to learn within the block")
        return ", ".join(parts)


def examples_from(rendered: Sequence[Rendered], block_size: int, overlong: str,
                  ) -> tuple[list[SFTExample], Counts]:
    """The training examples of the rendered conversations, each at most block_size positions."""
    counts, out = Counts(), []
    for r in rendered:
        ids, learned = r.ids, r.learned
        if len(ids) - 1 > block_size:
            if overlong == "drop":
                counts.dropped_long += 1
                continue
            ids, learned = ids[:block_size + 1], learned[:block_size + 1]
            counts.truncated += 1
        y = [t if keep else IGNORE for t, keep in zip(ids[1:], learned[1:])]
        if all(t == IGNORE for t in y):
            counts.dropped_empty += 1
            continue
        out.append(SFTExample(ids[:-1], y))
        counts.kept += 1
    return out, counts


Window = tuple[list[int], list[int], list[int], list[int]]  # x, y, positions, document ids


def in_order(lengths: Sequence[int], block_size: int) -> list[list[int]]:
    """The examples' indices a window, in order: a window is closed when the next does not fit."""
    bins: list[list[int]] = []
    room = 0
    for i, n in enumerate(lengths):
        if not bins or n > room:
            bins.append([])
            room = block_size
        bins[-1].append(i)
        room -= n
    return bins


def best_fit_decreasing(lengths: Sequence[int], block_size: int) -> list[list[int]]:
    """The examples' indices a window: the longest first (ties in the given order), each into the
    open window with the least room that still holds it, else a new one."""
    bins: list[list[int]] = []
    by_room: list[list[int]] = [[] for _ in range(block_size + 1)]  # room left -> open windows
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        room = next((r for r in range(n, block_size + 1) if by_room[r]), None)
        if room is None:
            bins.append([])
            b, room = len(bins) - 1, block_size
        else:
            b = by_room[room].pop()
        bins[b].append(i)
        by_room[room - n].append(b)
    return bins


def pack_windows(examples: Sequence[SFTExample], block_size: int, pad_id: int, best_fit: bool = True,
                 ) -> list[Window]:
    """Whole conversations into windows of block_size (best fit decreasing, or in order).
    Returns (x, y, positions, documents) lists per window."""
    lengths = [len(ex.x) for ex in examples]
    bins = best_fit_decreasing(lengths, block_size) if best_fit else in_order(lengths, block_size)
    windows = []
    for members in bins:
        current: Window = ([], [], [], [])
        for doc, i in enumerate(members):
            ex = examples[i]
            current[0].extend(ex.x)
            current[1].extend(ex.y)
            current[2].extend(range(len(ex.x)))
            current[3].extend([doc] * len(ex.x))
        windows.append(current)
    for x, y, positions, documents in windows:  # the tail: padding, a document of its own
        n = block_size - len(x)
        tail_doc = documents[-1] + 1
        x.extend([pad_id] * n)
        y.extend([IGNORE] * n)
        positions.extend(range(n))
        documents.extend([tail_doc] * n)
    return windows


def packed_batch(windows: Sequence[Window]) -> SFTBatch:
    x, y, positions, documents = (torch.tensor([w[i] for w in windows]) for i in range(4))  # (B, T) each
    return SFTBatch(x, y, positions, documents, None, int((y != IGNORE).sum()))


def padded_batch(examples: Sequence[SFTExample], pad_id: int) -> SFTBatch:
    T = max(len(ex.x) for ex in examples)
    x = torch.full((len(examples), T), pad_id, dtype=torch.long)  # (B, T)
    y = torch.full((len(examples), T), IGNORE, dtype=torch.long)
    mask = torch.zeros(len(examples), T, dtype=torch.long)
    for i, ex in enumerate(examples):
        x[i, :len(ex.x)] = torch.tensor(ex.x)
        y[i, :len(ex.y)] = torch.tensor(ex.y)
        mask[i, :len(ex.x)] = 1
    positions = torch.arange(T).expand(len(examples), T)  # (B, T); padding follows the real tokens
    return SFTBatch(x, y, positions, None, mask, int((y != IGNORE).sum()))


class SFTBatches:
    """The batches of an SFT run, one epoch at a time (the loop's BatchSource)."""

    def __init__(self, examples: Sequence[SFTExample], batch_size: int, block_size: int, pad_id: int,
                 packing: bool, shuffle: bool = True, seed: int = 0, best_fit: bool = True) -> None:
        if not examples:
            raise ValueError("no conversations are left to train on (all were dropped); raise "
                             "data.block_size or set data.overlong = \"truncate\"")
        self.examples, self.batch_size, self.block_size = list(examples), batch_size, block_size
        self.pad_id, self.packing, self.shuffle, self.seed = pad_id, packing, shuffle, seed
        self.best_fit = best_fit

    def epoch(self, epoch: int) -> list[SFTBatch]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        examples = [self.examples[i] for i in order]
        B = self.batch_size
        if self.packing:
            windows = pack_windows(examples, self.block_size, self.pad_id, self.best_fit)
            if self.shuffle and self.best_fit:  # best fit puts the long conversations first
                random.Random(self.seed * 1_000_003 + epoch).shuffle(windows)
            return [packed_batch(windows[i:i + B]) for i in range(0, len(windows), B)]
        return [padded_batch(examples[i:i + B], self.pad_id) for i in range(0, len(examples), B)]


__all__ = ["IGNORE", "Counts", "SFTBatch", "SFTBatches", "SFTExample", "best_fit_decreasing", "examples_from",
           "in_order", "pack_windows", "packed_batch", "padded_batch"]
