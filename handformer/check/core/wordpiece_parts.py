"""A WordPiece tokenizer found by what its code does, whatever its names: a trainer (a function that
takes a corpus and a vocabulary size, or a class with train, encode and decode methods) whose code,
or the code of its file that it reaches, writes the "##" that marks a piece inside a word. The parts
beside a trainer written as free functions (an encoder of a word, one of a text, a decoder) are found
by their names' words and their arguments."""

from __future__ import annotations

import inspect
import re
from typing import Any

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.defaults import quietly
from handformer.check.core.source import file_objects, global_reads, reachable, source_text

# the string "##" (f"##{c}" too); not a banner ("#####") or a heading ("## Results") a script prints
CONTINUATION = re.compile(r"""['"]##['"{]""")
SIZED = re.compile(r"vocab|size|merge", re.I)  # a trainer's argument that says how much to learn
# train_wordpiece, fit_wordpiece, learn_vocab, build_wordpiece_vocab
TRAINER = re.compile(r"train|fit|learn|(build|make|create).*vocab", re.I)
TOKENIZER_METHODS = ("train", "encode", "decode")
# an encoder's name (encode_word, tokenize, wordpiece_tokenize; not pre_tokenize), a decoder's
ENCODER = re.compile(r"^(?!_*pre)(?!.*(decode|detokeniz)).*(encode|tokeniz)", re.I)
DECODER = re.compile(r"decode|detokeniz", re.I)
WORD_ARGUMENTS = re.compile(r"w|word.*")  # an encoder of one word takes it so


def writes_wordpiece(obj: Any) -> bool:
    """Whether the object, or a class or function of its file that it reaches, writes "##"."""
    own = file_objects(obj)
    reached = reachable([obj], lambda o: set(map(own.get, global_reads(o) & own.keys())))
    return any(CONTINUATION.search(source_text(o)) for o in reached)


def wordpiece_trainer(obj: Any) -> bool:
    """A function of a corpus and a size that writes "##", or a tokenizer class that does
    (`_tokenizer_class`; no torch module: its train() is the mode switch)."""
    if inspect.isclass(obj):
        return _tokenizer_class(obj) and "torch.nn" not in str(inspect.getmro(obj)) and writes_wordpiece(obj)
    named = inspect.isfunction(obj) and TRAINER.search(obj.__name__)
    sized = any(SIZED.search(p.name) for p in _parameters(obj)[1:])
    return bool(named and sized and writes_wordpiece(obj))


def _tokenizer_class(cls: type) -> bool:
    """A class with train, encode and decode methods, or one built on a vocabulary with a method that
    encodes and none that trains (BERT's WordpieceTokenizer(vocab, unk_token), FullTokenizer(vocab_file))."""
    trains = all(callable(getattr(cls, m, None)) for m in TOKENIZER_METHODS)
    handed = not hasattr(cls, "train") and any(map(ENCODER.search, dir(cls))) and any(
        "vocab" in p.name.lower() for p in _parameters(cls))
    return trains or handed


def _parameters(fn: Any) -> list[inspect.Parameter]:
    return quietly(lambda: call_parameters(fn), (TypeError, ValueError), [])


def first_argument(fn: Any) -> str:
    """The name of the first argument a function takes (after self), lowered; "" when none."""
    params = _parameters(getattr(fn, "func", fn))  # a functools.partial's function
    return params[0].name.lower() if params else ""


def named_with(own: dict[str, Any], pattern: re.Pattern[str], skip: tuple[Any, ...]) -> list[Any]:
    """The file's functions (or a tokenizer's methods) that `pattern` finds by name, less `skip`."""
    return [fn for name, fn in own.items()
            if pattern.search(name) and inspect.isroutine(fn) and fn not in skip]


def word_level(fn: Any) -> bool:
    """An encoder of one word (`encode_word(word, vocab)`), not of a text."""
    return bool(WORD_ARGUMENTS.fullmatch(first_argument(fn)))
