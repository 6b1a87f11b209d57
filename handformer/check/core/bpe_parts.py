"""A word-level BPE written as the paper's snippet writes it (Sennrich et al., 2016): no trainer, only
`get_stats(vocab)`, the pair counts of a vocabulary {"l o w </w>": 5}, and `merge_vocab(pair, v_in)`,
that vocabulary with the pair joined; the loop that calls them runs at the file's top level. The pair
of functions is found by its names, and check runs that loop itself."""

from __future__ import annotations

import sys
import types
from typing import Any

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.source import source_text

STATS = ("get_stats", "get_pair_stats", "count_pairs", "get_pair_counts", "pair_stats")
MERGES = ("merge_vocab", "merge_pair", "merge_pairs", "apply_merge")


def _functions(obj: Any) -> dict[str, Any]:
    name = getattr(obj, "__module__", None)
    module = vars(sys.modules.get(name or "", sys))
    return {n: o for n, o in module.items() if isinstance(o, types.FunctionType) and o.__module__ == name}


def snippet_parts(name: str, obj: Any) -> tuple[Any, Any] | None:
    """(get_stats, merge_vocab) where `obj` is the first: a function of one argument named so, with a
    function of two beside it named for a merge, and no function of its file calls it (a trainer there
    is found as such); None otherwise."""
    own = _functions(obj) if isinstance(obj, types.FunctionType) and name in STATS else {}
    merge = next((own[n] for n in MERGES if n in own and len(call_parameters(own[n])) == 2), None)
    called = any(f"{name}(" in source_text(f) for f in own.values() if f is not obj)  # by a trainer
    return (obj, merge) if merge is not None and not called and len(call_parameters(obj)) == 1 else None
