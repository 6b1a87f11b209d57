"""The size a constructor's argument stands for by what the constructor does with it, where its name
says nothing or says something else:

    a width multiplier   a block(dim, heads, expand) that builds nn.Linear(dim, expand * dim) (Persson's
                         forward_expansion, lucidrains' ff_mult: these names are in discovery's table
                         too, for a block that hands its multiplier on to another)
    a vocabulary         bentrevett's Encoder(input_dim, hid_dim, ...) builds nn.Embedding(input_dim,
                         hid_dim): input_dim is a width's name there, a table's rows in fact
    an FFN's width       GPT-2's MLP(n_state, config) reads the width from its config (config.n_embd):
                         n_state, a width's name, is the hidden width (4 * n_embd) beside it
    the model's width    lucidrains' Attention(query_dim, context_dim=None, heads, dim_head) builds
                         nn.Linear(query_dim, inner_dim): a name no table lists, handed to a layer
                         as its input width

Read from the constructor's source; a constructor without one (inherited, built by type()) has none.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from typing import Any

from handformer.check.core.source import config_reads, function_nodes, source_text


@functools.lru_cache(maxsize=256)
def _init_nodes(cls: type) -> tuple[ast.AST, ...]:
    """The nodes of the parsed source of cls's own __init__; none where it has none."""
    init = vars(cls).get("__init__")
    return function_nodes(init) if init else ()


def _parameters(cls: type) -> list[str]:
    """The names of cls's constructor arguments, self left out."""
    return list(inspect.signature(cls.__init__).parameters)[1:]


def _name(node: ast.AST) -> str:
    """The name a node reads (x, or the attr of nn.Embedding), "" for another node."""
    return getattr(node, "id", getattr(node, "attr", ""))


def multipliers(cls: type, size_of: dict[str, str]) -> set[str]:
    """The constructor arguments of `cls` that multiply a width (an argument `size_of` says is d_model):
    `forward_expansion * embed_size`, `int(dim * mlp_ratio)`."""
    params = _parameters(cls)
    widths = {p for p in params if size_of.get(p.lower()) == "d_model"}
    products = [{_name(n.left), _name(n.right)} for n in _init_nodes(cls) if isinstance(n, ast.BinOp)
                and isinstance(n.op, ast.Mult)]
    return {name for pair in products if pair & widths for name in pair - widths} & set(params)


def embedding_rows(cls: type) -> set[str]:
    """The names handed to nn.Embedding as its number of rows, its first argument."""
    return {_name(n.args[0]) for n in _init_nodes(cls) if _name(getattr(n, "func", None)) == "Embedding"
            and n.args}


def with_roles(cls: Any, keys: dict[str, str | None], size_of: dict[str, str]) -> dict[str, str | None]:
    """Each constructor argument of the class `cls` -> the size it stands for, its name's `keys`
    corrected by what the constructor does: a width's name that is an embedding's rows is a
    vocabulary, an argument no name places that multiplies a width is a width multiplier, a width's
    name beside a configuration the width is read from is the FFN's width."""
    # a name that says an FFN's width and multiplies the width (Peter Bloem's ff_hidden_mult * emb) is
    # a multiplier too: a width times a width is no layer's size
    mult = multipliers(cls, size_of)
    found = {"d_model": ("src_vocab", embedding_rows(cls)), None: ("ffn_mult", mult),
             "d_ff": ("ffn_mult", mult)}
    keys = {name: found[key][0] if name in found.get(key, ("", ()))[1] else key for name, key in keys.items()}
    keys = {**keys, **dict.fromkeys(widths_by_use(cls, keys), "d_model")}
    keys = {**keys, **dict.fromkeys(widths_beside_config(cls, keys, size_of), "d_ff")}
    return {**keys, **dict.fromkeys(configurations(cls, keys), None)}


def configurations(cls: Any, keys: dict[str, str | None]) -> set[str]:
    """The constructor arguments that the constructor reads a field of (`config.d_model`, `cfg["dim"]`):
    a configuration, never a size, whatever their name or position (OLMo's
    OLMoSequentialBlock(layer_id, config) hands `config` to LayerNorm(config) first, the place of a
    width); an argument used in arithmetic or handed to range() is read whole, a size."""
    return set(filter(lambda name: any(config_reads(cls, name)), keys)) if inspect.isclass(cls) else set()


# a layer handed an input's width first (nn.Linear(query_dim, ...), nn.LayerNorm(n_units))
WIDTH_LAYER = re.compile(r"\b(?:Linear|LayerNorm|RMSNorm)\(\s*(\w+)\s*[,)]")


def widths_by_use(cls: type, keys: dict[str, str | None]) -> set[str]:
    """The first argument no name places that the constructor hands a layer as its input width: the
    model's width (an MLP(n_in, n_hidden, n_out) leaves n_hidden, its second layer's input, unfilled)."""
    handed = WIDTH_LAYER.findall(source_text(vars(cls).get("__init__")))
    return set([name for name in handed if keys.get(name, "") is None][:1])


def widths_beside_config(cls: type, keys: dict[str, str | None], size_of: dict[str, str]) -> set[str]:
    """The one width argument of a constructor that also reads the width from another argument
    (GPT-2's MLP(n_state, config): config.n_embd), where no argument is the FFN's width: that one.
    A width with a default is the width's override, not another width (OLMo's LayerNorm(config,
    size=None): `size or config.d_model`)."""
    init = vars(cls).get("__init__")
    params = inspect.signature(init).parameters if init else {}
    widths = {name for name, key in keys.items() if key == "d_model"
              and getattr(params.get(name), "default", None) is inspect.Parameter.empty}
    # the names whose attribute it reads as the width (self.dim too: no argument)
    read = {_name(getattr(n, "value", None)) for n in _init_nodes(cls)
            if size_of.get(_name(n).lower()) == "d_model"}
    alone = (len(widths), "d_ff" in keys.values(), bool(read & set(keys) - widths)) == (1, False, True)
    return widths if alone else set()
