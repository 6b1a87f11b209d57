"""Prefix caching: prompts that begin like earlier ones (a shared system prompt, a chat's earlier
turns) reuse the keys and values of that beginning instead of recomputing them.

The cache is a radix tree over token ids: each node holds a segment of tokens and, for every
layer, the keys and values of those positions for one row, (Hkv, n, Dh); a path from the root
spells a prompt's beginning. Prompts that share a system prompt share its node, so it is stored
once however many prompts extend it.

    lookup(prompt)       the longest cached beginning of the prompt (at most len(prompt) - 1
                         tokens: the last one must run, for its logits)
    materialize(hit)     copy-on-admit: a new one-row cache holding those positions, which the
                         engine's prefill continues with the rest of the prompt
    insert(prompt, ...)  after a prefill: the prompt's positions that the tree does not hold yet

Memory is bounded by `max_bytes` (the keys and values held); past it the least recently used
leaves go first. A sliding-window model's prefill keeps only the last W positions, so a prompt is
stored, and a prefix reused, only while it fits the window. Every operation runs on the engine's
thread.

Shape legend: L layers, Hkv key/value heads, n a segment's positions, Dh head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from handformer.generation.cache import DecodingCache, columns_of
from handformer.nn.kv_cache import KVCache

MIN_TOKENS = 8  # a shorter shared beginning is not worth a prefill of its own


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]
    keys: list[Tensor]  # per layer (Hkv, n, Dh)
    values: list[Tensor]
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)  # first token -> child
    used: int = 0  # the tick of its last use

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class Hit:
    """A cached beginning of a prompt: `length` positions, spelled by `path` (nodes, and how many
    tokens of each are used)."""

    length: int
    path: list[tuple[Node, int]]


class PrefixCache:
    def __init__(self, max_bytes: int, sliding_window: int | None = None,
                 min_tokens: int = MIN_TOKENS) -> None:
        """sliding_window: the model's (config.sliding_window)."""
        self.max_bytes, self.sliding_window, self.min_tokens = max_bytes, sliding_window, min_tokens
        self.root = Node((), [], [], None)
        self.bytes = 0
        self.tick = 0
        self.hits = self.reused_tokens = 0  # prefills that reused a prefix, and the positions reused

    # --- reading ------------------------------------------------------------------------------
    def lookup(self, prompt: Sequence[int]) -> Hit | None:
        """The longest cached beginning of `prompt` that is worth reusing, or None."""
        limit = len(prompt) - 1 if self.sliding_window is None else min(len(prompt) - 1, self.sliding_window)
        path, node, n = [], self.root, 0
        while n < limit and (child := node.children.get(prompt[n])) is not None:
            take = common_prefix(child.tokens, prompt[n:limit])
            path.append((child, take))
            n += take
            if take < len(child.tokens):
                break
            node = child
        if n < self.min_tokens:
            return None
        self._touch(path[-1][0])
        return Hit(n, path)

    def materialize(self, hit: Hit, capacity: int) -> KVCache:
        """A one-row cache of `capacity` positions (rolling over the window, if any) holding the
        hit's positions, ready for the rest of the prompt."""
        layers = range(len(hit.path[0][0].keys))
        keys = [torch.cat([node.keys[i][:, :take] for node, take in hit.path], dim=1) for i in layers]
        values = [torch.cat([node.values[i][:, :take] for node, take in hit.path], dim=1) for i in layers]
        cache = DecodingCache.from_columns(keys, values, capacity, self.sliding_window)  # (Hkv, n, Dh) each
        self.hits += 1
        self.reused_tokens += hit.length
        return cache

    # --- writing ------------------------------------------------------------------------------
    def insert(self, prompt: Sequence[int], cache: KVCache, row: int) -> None:
        """Store the positions of `prompt` that the tree lacks, read from row `row` of `cache`,
        where the prompt's last token is the cache's last column (right-aligned)."""
        n = len(prompt)
        if n < self.min_tokens or (self.sliding_window is not None and n > self.sliding_window) \
                or n > cache.length:
            return
        if min(cache.length, cache.slots) < n:  # a rolling cache no longer holds the prompt's start
            return
        node, at = self.root, 0
        while at < n and (child := node.children.get(prompt[at])) is not None:
            take = common_prefix(child.tokens, prompt[at:])
            if take < len(child.tokens):
                child = self._split(child, take)
            node, at = child, at + take
        if at < n:
            node = self._add(node, prompt, at, cache, row)
        self._touch(node)
        self._evict()

    def _add(self, parent: Node, prompt: Sequence[int], start: int, cache: KVCache, row: int) -> Node:
        """A child of `parent` holding positions start..n-1 of the prompt."""
        n, keys, values = len(prompt), [], []
        for layer in range(len(cache.keys)):
            k, v = columns_of(cache, layer)  # (B, Hkv, held, Dh), oldest column first
            first = k.size(2) - (n - start)  # the prompt's position `start` as a column of k
            keys.append(k[row, :, first:].clone())  # (Hkv, n - start, Dh)
            values.append(v[row, :, first:].clone())
        node = Node(tuple(prompt[start:]), keys, values, parent)
        parent.children[node.tokens[0]] = node
        self.bytes += node.bytes
        return node

    def _split(self, node: Node, at: int) -> Node:
        """Cut `node` after its first `at` tokens; returns the new upper part (the old node is
        now its only child)."""
        upper = Node(node.tokens[:at], [k[:, :at].clone() for k in node.keys],
                     [v[:, :at].clone() for v in node.values], node.parent, used=node.used)
        node.parent.children[upper.tokens[0]] = upper
        self.bytes -= node.bytes
        node.tokens = node.tokens[at:]
        node.keys = [k[:, at:].clone() for k in node.keys]
        node.values = [v[:, at:].clone() for v in node.values]
        node.parent = upper
        upper.children[node.tokens[0]] = node
        self.bytes += node.bytes + upper.bytes
        return upper

    def _touch(self, node: Node) -> None:
        """Mark `node` and its ancestors used now (a parent is never older than its children)."""
        self.tick += 1
        while node is not None and node is not self.root:
            node.used = self.tick
            node = node.parent

    def _evict(self) -> None:
        """Drop the least recently used leaves until the tree fits in max_bytes."""
        while self.bytes > self.max_bytes:
            leaves = [n for n in self.nodes() if not n.children]
            if not leaves:
                return
            self.remove(min(leaves, key=lambda n: n.used))

    def remove(self, node: Node) -> None:
        del node.parent.children[node.tokens[0]]
        self.bytes -= node.bytes

    def nodes(self) -> list[Node]:
        out, todo = [], list(self.root.children.values())
        while todo:
            node = todo.pop()
            out.append(node)
            todo.extend(node.children.values())
        return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from the start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def default_prefix_cache_mb() -> float:
    """256 MB or 10 % of the machine's memory, whichever is smaller (serve's default)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        return min(256.0, total_kb / 1024 * 0.10)
    except (OSError, StopIteration, ValueError):
        return 256.0


__all__ = ["Hit", "MIN_TOKENS", "PrefixCache", "default_prefix_cache_mb"]
