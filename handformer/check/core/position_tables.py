"""A model's learned positions kept as one bare nn.Parameter, read from the forward that adds it.

nanoGPT-style and ViT-style models often keep their learned positions as `nn.Parameter(torch.zeros(1,
block_size, n_embd))` (or `(block_size, n_embd)`) on the model itself, not as an nn.Embedding, and add a
slice of it to the token embeddings: `x = self.tok_emb(idx) + self.pos_emb[:, :T, :]`. Whatever its name,
such a parameter is a position table: its rows are the positions. Here it is found by its shape (a table
of rows, with at most one leading axis of one) and by its use: the model's forward
adds it (or a name it assigned from it) to something. Its (T, D) view is then mapped as an nn.Embedding
of the positions would be.

Shape legend: T the table's rows (positions), D d_model.
"""

from __future__ import annotations

import inspect
import re

from torch import Tensor, nn

from handformer.check.core.defaults import quietly


def forward_source(sub: nn.Module) -> str:
    return quietly(lambda: inspect.getsource(type(sub).forward), otherwise="")


def read_as(source: str, name: str) -> list[str]:
    """The patterns of `self.<name>` and of the local names the forward assigns from an expression that
    reads it (`pos = self.pos_emb[:, :t]`, `cls = self.cls_token.expand(B, -1, -1)`)."""
    ref = rf"self\.{re.escape(name)}"
    return [ref, *re.findall(rf"^\s*(\w+)\s*=[^=].*\b{ref}\b", source, re.M)]


def added(sub: nn.Module, name: str) -> bool:
    """Whether the module's forward adds its parameter `name` (or a slice of it, or a name it assigns
    from it) to something: `tok + self.pos_emb[:, :T, :]`, `x += pos`, or `x = x + pos` with `pos =
    self.pos_emb[:, :t]`."""
    source = forward_source(sub)
    sides = "|".join(read_as(source, name))
    # `+ side`, `+= side`, or `side + ...`, `side[...] + ...`
    return bool(re.search(rf"\+=?\s*({sides})\b|(?<![\w.])({sides})\b(\[[^\]]*\])?\s*\+", source))


def is_table(p: Tensor) -> bool:
    """A table of rows (T, D) or (1, T, D), T > 1."""
    return p.dim() in (2, 3) and p.shape[:-2] in ((), (1,)) and p.shape[-2] > 1


# what embeds the inputs a model adds its positions to: a token table, a patch or frame convolution
EMBEDDERS = (nn.Embedding, nn.modules.conv._ConvNd)


def position_tables(sub: nn.Module, params: dict[str, nn.Parameter]) -> dict[str, Tensor]:
    """The module's own parameters that are learned position tables (`is_table`, `added` by its forward),
    each as its (T, D) view, in a module that embeds its inputs (`EMBEDDERS`): a model, not an attention
    adding a learned (T, T) bias to its scores."""
    embeds = any(isinstance(m, EMBEDDERS) for m in sub.modules())
    return {n: p.view(p.shape[-2:]) for n, p in params.items() if embeds and is_table(p) and added(sub, n)}
