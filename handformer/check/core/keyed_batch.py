"""A decoder-only training step whose batch is a dict read by its keys (Hugging Face's
`batch["input_ids"], batch["labels"]`, the labels the inputs themselves), or a tuple it unpacks to
three or more names (`input_ids, attention_mask, labels = batch`, handed a tuple in that order), and
that shifts the logits and the labels itself (`logits[..., :-1, :]`, `labels[..., 1:]`): every key
but a mask holds the same (B, T + 1) windows of text, a mask holds ones. Read from the step's source:
the keys it reads of its batch argument, a model called on one sequence alone (a mask beside it), and
a slice that drops the first or the last position, in the step or in a function of its file it calls
(an SFT tutorial's sft_loss(logits, labels)); an encoder-decoder's step calls its model on the source
and the target.

Shape legend: B batch, T length.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.argument_names import BATCH_NAMES, STEP_MODEL_NAMES, named, readable_parameters
from handformer.check.core.defaults import quietly
from handformer.check.core.source import config_reads, function_nodes, functions_called, source_text


@dataclass(frozen=True)
class KeyedBatch:
    name: str  # the step's batch argument
    keys: tuple[str, ...]  # the keys the step reads of it, in their order (or the names it unpacks it to)
    unpacked: bool = False  # a tuple it unpacks (`input_ids, attention_mask, labels = batch`), not a dict

    def filled(self, window: Tensor) -> dict[str, Tensor] | tuple[Tensor, ...]:
        """The batch: the windows (B, T + 1) under every key, ones under a mask's; a tuple of them in
        the order it unpacks them."""
        held = {key: (window.clone(), torch.ones_like(window))["mask" in key.lower()] for key in self.keys}
        return tuple(held.values()) if self.unpacked else held


def keyed_batch(fn: Any) -> KeyedBatch | None:
    """The dict batch a decoder-only step reads and shifts itself (see the module's docstring): the
    keys it reads, every call of its model handed one argument, a slice `:-1` or `1:`; else None."""
    names = [p.name for p in readable_parameters(fn)]
    batch, model = str(named(names, BATCH_NAMES)), str(named(names, STEP_MODEL_NAMES))
    keys = sorted(config_reads(fn, batch)[0], key=source_text(fn).find)
    nodes = function_nodes(fn)
    unpacked = _unpacked(nodes, batch) if not keys else ()  # `input_ids, attention_mask, labels = batch`
    keys = keys or unpacked
    calls = {len([a for a in [*n.args, *n.keywords] if not _masks(a)]) for n in nodes  # a mask aside
             if getattr(getattr(n, "func", None), "id", None) == model}  # model(...) calls: their arguments
    helpers = map(function_nodes, functions_called(fn))  # a loss of its file it calls (sft_loss)
    cuts = {(_value(n.lower), _value(n.upper)) for n in itertools.chain(nodes, *helpers)
            if isinstance(n, ast.Slice)}
    found = len(keys) > 1 and calls == {1} and bool({(None, -1), (1, None)} & cuts)
    return KeyedBatch(batch, tuple(keys), bool(unpacked)) if found else None


def _unpacked(nodes: list[ast.AST], batch: str) -> list[str]:
    """The names a step unpacks its batch to, three or more of them (`ids, mask, labels = batch`; two
    are the (x, y) pair: signatures.paired_batch)."""
    tuples = [n.targets[0].elts for n in nodes if isinstance(n, ast.Assign)
              and getattr(n.value, "id", None) == batch and isinstance(n.targets[0], ast.Tuple)]
    return next(([e.id for e in elts] for elts in tuples
                 if len(elts) > 2 and all(isinstance(e, ast.Name) for e in elts)), [])


def _masks(node: ast.AST) -> bool:
    """An argument that is a mask (`model(input_ids, attention_mask)`, `attention_mask=batch[...]`): the
    model's input beside the ids."""
    return "mask" in ast.unparse(node).lower()


def _value(node: ast.AST | None) -> Any:
    """A slice's bound as a number (None where it has none)."""
    return quietly(lambda: ast.literal_eval(node), ValueError)
