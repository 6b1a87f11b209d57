"""A byte-level BPE written over an alphabet of its own: each byte shown as one printable character
(GPT-2's `bytes_to_unicode`, or any other table a file builds), its merges pairs of such strings and
its vocabulary its own ids of them.

Such an encoder is built from merges alone (`Encoder(merges)`) and numbers its tokens itself, so it
is handed the reference's merges written in its own alphabet (read by calling the table function it
reaches) and graded against the reference's encoding with its own ids (read back from the vocabulary
it holds), never against ids it was not given.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import operator
from typing import Any

from handformer.check.core import fingerprint as fp
from handformer.check.core.source import global_reads, reachable
from handformer.check.reference import bpe_reference as R

Alphabet = dict[int, str]  # byte -> the one character that shows it
Vocab = dict[int, bytes]  # id -> the token's bytes


def own_alphabet(cls: Any, module: Any) -> Alphabet | None:
    """The byte table the class's code reaches: a function of its file (under @lru_cache too), or one it
    reaches in turn, that takes no argument and returns one distinct character for each of the 256
    bytes; None where it reaches none."""
    own = {name: inspect.unwrap(obj) for name, obj in vars(module).items() if _own_function(obj, module)}
    reached = reachable(global_reads(cls), lambda name: global_reads(own.get(name)))
    tables = map(lambda name: fp.quietly(getattr(module, name)), sorted(reached & own.keys()))
    return next((dict(table) for table in tables if _is_alphabet(table)), None)


def _own_function(obj: Any, module: Any) -> bool:
    fn = inspect.unwrap(obj)
    return inspect.isfunction(fn) and fn.__module__ == module.__name__


def _is_alphabet(table: Any) -> bool:
    """A dict of the 256 bytes to 256 distinct one-character strings."""
    chars = fp.quietly(lambda: "".join(map(table.__getitem__, range(256))))
    return isinstance(table, dict) and len(table) == 256 and isinstance(chars, str) and len(set(chars)) == 256


def written_in(alphabet: Alphabet, merges: list[R.Pair]) -> list[tuple[str, str]]:
    """The merges as pairs of strings in the alphabet ((b" ", b"t") -> ("Ġ", "t") in GPT-2's)."""
    return [(_spelt(alphabet, a), _spelt(alphabet, b)) for a, b in merges]


def encoder_in(alphabet: Alphabet, vocab: dict[int, bytes]) -> dict[str, int]:
    """The vocabulary {string: id} in the alphabet, as GPT-2's Encoder(encoder, bpe_merges) takes it."""
    return dict(zip(map(functools.partial(_spelt, alphabet), vocab.values()), vocab))


def _spelt(alphabet: Alphabet, token: bytes) -> str:
    return "".join(map(alphabet.__getitem__, token))


def own_vocab(tok: Any, alphabet: Alphabet, merges: list[R.Pair], default: Vocab) -> Vocab:
    """The ids the encoder gave itself (a dict {string: id} or {id: string} it holds, in the alphabet),
    as {id: bytes}, where they number every byte and every merge's token; `default` otherwise."""
    back = dict(zip(alphabet.values(), alphabet))
    wanted = set(map(bytes, zip(range(256)))) | set(itertools.starmap(operator.add, merges))
    held = filter(None, (fp.quietly(lambda v=value: _as_ids(v, back)) for value in vars(tok).values()))
    return next((ids for ids in held if wanted <= set(ids.values())), default)


def _as_ids(value: dict[Any, Any], back: dict[str, int]) -> dict[int, bytes]:
    """{id: bytes} from a dict of strings in the alphabet to ids, or of ids to such strings (raises on any
    other value)."""
    flipped = (((v, k) if isinstance(k, str) else (k, v)) for k, v in value.items())
    return {operator.index(i): bytes(map(back.__getitem__, s)) for i, s in flipped}
