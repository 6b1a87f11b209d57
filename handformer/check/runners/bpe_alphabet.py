"""A byte-level BPE written over an alphabet of its own: each byte shown as one printable character
(GPT-2's `bytes_to_unicode`, or any other table a file builds), its merges pairs of such strings and
its vocabulary its own ids of them.

Such an encoder is built from merges alone (`Encoder(merges)`) and numbers its tokens itself, so it
is handed the reference's merges written in its own alphabet (read by calling the table function it
reaches) and graded against the reference's encoding with its own ids (read back from the vocabulary
it holds), never against ids it was not given.
"""

from __future__ import annotations

import inspect
from typing import Any

from handformer.check.core import fingerprint as fp
from handformer.check.core.source import global_reads, reachable
from handformer.check.reference import bpe_reference as R

Alphabet = dict[int, str]  # byte -> the one character that shows it


def own_alphabet(cls: Any, module: Any) -> Alphabet | None:
    """The byte table the class's code reaches: a function of its file (under @lru_cache too) that
    takes no argument and returns one distinct character for each of the 256 bytes; None where it
    reaches none."""
    own = {name: inspect.unwrap(obj) for name, obj in vars(module).items() if callable(obj)
           and inspect.isfunction(inspect.unwrap(obj)) and inspect.unwrap(obj).__module__ == module.__name__}
    reached = reachable(global_reads(cls), lambda name: global_reads(own.get(name)))
    for name in sorted(reached & own.keys()):
        if not _required(own[name]):
            table = fp.quietly(getattr(module, name))
            if _is_alphabet(table):
                return dict(table)
    return None


def _required(fn: Any) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _is_alphabet(table: Any) -> bool:
    """A dict of the 256 bytes to 256 distinct one-character strings."""
    return (isinstance(table, dict) and set(table) == set(range(256))
            and all(isinstance(c, str) and len(c) == 1 for c in table.values())
            and len(set(table.values())) == 256)


def written_in(alphabet: Alphabet, merges: list[R.Pair]) -> list[tuple[str, str]]:
    """The merges as pairs of strings in the alphabet ((b" ", b"t") -> ("Ġ", "t") in GPT-2's)."""
    return [("".join(map(alphabet.__getitem__, a)), "".join(map(alphabet.__getitem__, b))) for a, b in merges]


def encoder_in(alphabet: Alphabet, vocab: dict[int, bytes]) -> dict[str, int]:
    """The vocabulary {string: id} in the alphabet, as GPT-2's Encoder(encoder, bpe_merges) takes it."""
    return {"".join(map(alphabet.__getitem__, t)): i for i, t in vocab.items()}


def own_vocab(tok: Any, alphabet: Alphabet, merges: list[R.Pair]) -> dict[int, bytes] | None:
    """The ids the encoder gave itself (a dict {string: id} or {id: string} it holds, in the alphabet),
    as {id: bytes}, where they number every byte and every merge's token once; None otherwise."""
    back = {c: b for b, c in alphabet.items()}
    wanted = {bytes([b]) for b in range(256)} | {a + b for a, b in merges}
    for value in vars(tok).values():
        vocab = _as_ids(value, back)
        if vocab is not None and wanted <= set(vocab.values()) and len(set(vocab.values())) == len(vocab):
            return vocab
    return None


def _as_ids(value: Any, back: dict[str, int]) -> dict[int, bytes] | None:
    """{id: bytes} from a dict of strings in the alphabet to ids, or of ids to such strings."""
    if not isinstance(value, dict) or not value:
        return None
    pairs = [(v, k) for k, v in value.items()] if isinstance(next(iter(value)), str) else list(value.items())
    if not all(isinstance(i, int) and isinstance(s, str) and set(s) <= back.keys() for i, s in pairs):
        return None
    return {i: bytes(map(back.__getitem__, s)) for i, s in pairs}
