"""A WordPiece tokenizer as wordpiece.py drives it: trained on a corpus, its vocabulary read (returned
by a trainer function, or held by the instance of a class), its encoders and its decoder called with
that vocabulary, their ids read back as pieces."""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handformer.check.core import fingerprint as fp
from handformer.check.core import wordpiece_parts as W
from handformer.check.core.argument_names import call_parameters
from handformer.check.core.context import Context
from handformer.check.core.discovery import Component, DiscoveryError, own_objects
from handformer.check.core.weights import MappingError
from handformer.check.reference import wordpiece_reference as R
from handformer.check.runners.bpe import argument_role

SPECIAL = re.compile(r"\[[A-Za-z_]+\]|<[^<>\s]+>")  # [UNK], [CLS], <pad>
UNKNOWN = re.compile(r"[\[<]unk[\]>]", re.I)
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES_TAKEN = re.compile(r"^(?!.*id).*(token|piece)")  # a decoder's first argument that takes pieces
# what an encoder's or decoder's other arguments are handed, by a word of their name: the table id ->
# token, the vocabulary, the unknown token
# a trainer's arguments whose role is not a BPE trainer's: the words counted already (the Hugging Face
# course's word_freqs); a vocabulary to start from, no size
OWN_ROLES = ((re.compile(r"(?i)\w*(freq|count)\w*"), "freqs"),
             (re.compile(r"(?i)vocab|vocabulary|vocab_dict"), "-"))
ENCODING_FIELDS = ("input_ids", "ids", "tokens")  # where an encoding holds its ids beside other fields
VOCABULARY_ROLES = {"vocab", "inverse", "file"}  # a GIVEN role that hands an encoder the vocabulary
GIVEN = (("file", "file"), ("path", "file"), ("inv", "inverse"), ("id_to", "inverse"), ("itos", "inverse"),
         ("id2", "inverse"), ("vocab", "vocab"), ("unk", "unk"))


@dataclass
class Parts:
    """The learner's tokenizer after training: its vocabulary (`tokens` in id order, `vocab` as it holds
    it), what its trainer was handed, its encoders (name, call on one input, whether of one word) and
    its decoder (name, call)."""

    tokens: list[str]
    vocab: Any
    handed: set[str] = field(default_factory=set)
    encoders: list[tuple[str, Callable[..., Any], bool]] = field(default_factory=list)
    decode: tuple[str, Callable[..., Any]] | None = None
    trained: bool = True  # False: built on the reference's vocabulary, nothing trained

    @property
    def unk(self) -> str:
        return next(filter(UNKNOWN.fullmatch, self.tokens), "[UNK]")

    def pieces(self, out: Any) -> Any:
        """An encoder's output as pieces: its ids read through the vocabulary, its pieces as they are; the
        special tokens it adds around them ([CLS], [SEP], padding) left out, [UNK] kept. An encoding that
        holds its ids beside other fields (BERT's {"input_ids", "token_type_ids", ...}) read by its ids."""
        out = encoded_ids(out)
        if not isinstance(out, (list, tuple)):
            return out
        by_id = dict(enumerate(self.tokens))
        read = fp.quietly(lambda: [by_id.get(i, i) for i in out]) or out  # an id's token, a piece as it is
        added = {*filter(SPECIAL.fullmatch, self.tokens), *SPECIALS} - {self.unk}
        return [t for t in read if str(t) not in added]

    def handed_pieces(self, decode: Callable[..., Any], pieces: list[str]) -> list[Any]:
        """What the decoder takes: ids, unless its first argument names tokens or pieces."""
        ids = dict(zip(self.tokens, range(len(self.tokens))))
        taken = PIECES_TAKEN.search(W.first_argument(decode))
        return list(pieces) if taken else list(map(ids.__getitem__, pieces))


def encoded_ids(out: Any) -> Any:
    """The ids (or pieces) of an encoding that holds them beside other fields: a dict's first key of
    ENCODING_FIELDS, or such an attribute (a Hugging Face Encoding's `.ids`); else the output itself."""
    held = [out.get(k) if isinstance(out, dict) else getattr(out, k, None) for k in ENCODING_FIELDS]
    return next((v for v in held if isinstance(v, (list, tuple))), out)


def parts(comp: Component, ctx: Context, corpus: list[str], vocab_size: int) -> Parts:
    """Train the learner's tokenizer and find its encoders and decoder: the functions of its file beside
    a trainer function, a class's methods."""
    if inspect.isclass(comp.obj):
        build = _trained_class if hasattr(comp.obj, "train") else _handed_class
        return build(comp, ctx, corpus, vocab_size)
    handed: set[str] = set()
    vocab = _vocab_of(_train(ctx, comp.obj, corpus, vocab_size, handed))
    return _coders(Parts(_ordered(vocab), vocab, handed), own_objects(ctx.module), (comp.obj,))


def _trained_class(comp: Component, ctx: Context, corpus: list[str], vocab_size: int) -> Parts:
    """A tokenizer class: built (with the size where its constructor takes it), trained, its vocabulary
    read from the attribute that holds it."""
    handed: set[str] = set()
    tok = ctx.learner.call("__init__", comp.obj, **_kwargs(comp.obj, corpus, vocab_size, handed, False))
    _train(ctx, tok.train, corpus, vocab_size, handed)
    vocab = max(filter(_is_vocab, vars(tok).values()), key=len, default=None)
    if vocab is None:
        raise MappingError(f"{comp.name} holds no vocabulary after train (a dict token -> id or a list of "
                           "tokens with \"##\" pieces)", zh=f"{comp.name} 训练后没有保存词表（token -> id 的 "
                           "dict，或含 \"##\" 片段的 token 列表）")
    methods = {n: getattr(tok, n) for n in dir(type(tok)) if not n.startswith("_")}
    return _coders(Parts(_ordered(vocab), vocab, handed), methods, ())


def _handed_class(comp: Component, ctx: Context, corpus: list[str], vocab_size: int) -> Parts:
    """A WordPiece encoder built on a vocabulary (BERT's WordpieceTokenizer(vocab, unk_token), its
    FullTokenizer(vocab_file)): handed the reference's, trained on the corpus, as a dict token -> id or
    a file of one token a line."""
    tokens = reference_tokens(corpus, vocab_size)
    vocab = dict(zip(tokens, range(len(tokens))))
    tok = Parts(tokens, vocab, trained=False)
    build = _bound(comp.obj, tok, skip=0)
    if build is None:
        raise DiscoveryError(f"cannot build {comp.name}: handformer passes its vocabulary (vocab, a dict "
                             "token -> id, or vocab_file) and unk_token", zh=f"构造不了 {comp.name}："
                             "handformer 传入词表（vocab，token -> id 的 dict，或 vocab_file）和 unk_token")
    built = ctx.learner.call("__init__", build)
    methods = {n: getattr(built, n) for n in dir(type(built)) if not n.startswith("_")}
    return _coders(tok, methods, ())


def reference_tokens(corpus: list[str], vocab_size: int) -> list[str]:
    """The reference's vocabulary: the special tokens, the characters, then the tokens learnt."""
    alphabet = sorted(set(itertools.chain.from_iterable(map(R.spell, R.word_freqs(corpus)))))
    learnt = dict.fromkeys(itertools.starmap(R.joined, R.train(corpus, vocab_size)))
    return [*SPECIALS, *alphabet, *learnt][:vocab_size]


def _coders(tok: Parts, own: dict[str, Any], skip: tuple[Any, ...]) -> Parts:
    """`tok` with the encoders and the decoder among `own`, each called with its vocabulary (those that
    require another argument left out). Beside a trainer function (`skip` holds it), an encoder is one
    handed the vocabulary: a function of the text alone (BERT's whitespace_tokenize) cannot cut it into
    the pieces trained."""
    encoders = [fn for fn in W.named_with(own, W.ENCODER, skip) if not skip or _takes_vocabulary(fn)]
    bound = [(fn.__name__, _bound(fn, tok), fn) for fn in encoders]
    tok.encoders = [(name, call, W.word_level(fn)) for name, call, fn in bound if call is not None]
    decoders = [(fn.__name__, _bound(fn, tok)) for fn in W.named_with(own, W.DECODER, skip)]
    tok.decode = next((d for d in decoders if d[1] is not None), None)
    return tok


def _train(ctx: Context, fn: Callable[..., Any], corpus: list[str], vocab_size: int, handed: set[str]) -> Any:
    """The trainer called with the corpus (a list of texts, or a file where it takes a path), the size
    and the special tokens; a call that raises on the list is tried once with the texts as one."""
    kwargs = _kwargs(fn, corpus, vocab_size, handed, True)
    listed = [n for n, v in kwargs.items() if v is corpus]
    try:
        return ctx.learner.call("train", fn, **kwargs)
    except Exception:
        if not listed:
            raise
        return ctx.learner.call("train", fn, **{**kwargs, listed[0]: "\n".join(corpus)})


def _kwargs(fn: Callable[..., Any], corpus: list[str], vocab_size: int, handed: set[str],
            first_is_corpus: bool) -> dict[str, Any]:
    """Each argument by its role (bpe.argument_role); the roles that say a size noted in `handed`."""
    params = call_parameters(fn)
    values = {"text": corpus, "path": _written(corpus), "vocab_size": vocab_size, "merges": vocab_size // 2,
              "special": list(SPECIALS), "freqs": R.word_freqs(corpus)}
    roles = {p.name: next((r for pattern, r in OWN_ROLES if pattern.fullmatch(p.name)), None)
             or argument_role(p.name, first=first_is_corpus and i == 0) for i, p in enumerate(params)}
    unfilled = [p.name for p in params if roles[p.name] not in values and p.default is p.empty]
    if unfilled:
        shown = getattr(fn, "__qualname__", fn)
        raise DiscoveryError(f"cannot fill the argument {unfilled[0]!r} of {shown}: handformer passes the "
                             "corpus, vocab_size and special_tokens",
                             zh=f"填不了 {shown} 的参数 {unfilled[0]!r}：handformer 传入语料、vocab_size 和 "
                                "special_tokens")
    handed.update({"vocab_size", "merges"} & set(roles.values()))
    return {name: values[role] for name, role in roles.items() if role in values}


def _written(lines: list[str]) -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="handformer-wordpiece-"), "corpus.txt")
    Path(path).write_text("\n".join(lines), encoding="utf-8")
    return path


def _ordered(value: Any) -> list[Any]:
    """The tokens of a vocabulary in id order: a dict token -> id or id -> token, or a list; [] for
    anything else."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    ranked = [(i, t) if isinstance(i, int) else (t, i) for i, t in items]  # (id, token)
    return [t for _, t in sorted(ranked, key=lambda it: it[0] if isinstance(it[0], int) else -1)]


def _is_vocab(value: Any) -> bool:
    """A vocabulary of strings (_ordered) with a "##" piece."""
    tokens = _ordered(value)
    return set(map(type, tokens)) == {str} and any(t.startswith("##") for t in tokens)


def _vocab_of(out: Any) -> Any:
    """The vocabulary a trainer returned: the value itself, or the one of a returned pair (vocab, merges)."""
    held = [out, *(out if isinstance(out, tuple) else ())]
    vocab = next(filter(_is_vocab, held), None)
    if vocab is None:
        raise MappingError(f"the trainer returned {type(out).__name__}, no vocabulary: return a dict "
                           "token -> id (or a list of tokens)", zh=f"训练函数返回了 {type(out).__name__}，"
                           "不是词表：请返回 token -> id 的 dict（或 token 列表）")
    return vocab


def _bound(fn: Callable[..., Any], tok: Parts, skip: int = 1) -> Callable[..., Any] | None:
    """The function called on its first argument alone (with `skip` 1), its other arguments handed by
    name (GIVEN); None when it requires one that none of them is."""
    values = {"inverse": dict(enumerate(tok.tokens)), "vocab": tok.vocab, "unk": tok.unk,
              "file": _written(tok.tokens)}
    roles = {p: next((r for w, r in GIVEN if w in p.name.lower()), None) for p in call_parameters(fn)[skip:]}
    if any(r is None and p.default is p.empty for p, r in roles.items()):
        return None
    return functools.partial(fn, **{p.name: values[r] for p, r in roles.items() if r is not None})


def _takes_vocabulary(fn: Callable[..., Any]) -> bool:
    """Whether one of the function's arguments (after the first) is handed the vocabulary (GIVEN)."""
    names = [p.name.lower() for p in call_parameters(fn)[1:]]
    return any(w in n for n in names for w, role in GIVEN if role in VOCABULARY_ROLES)


def max_argument(encode: Callable[..., Any]) -> str | None:
    """The encoder's argument that caps a word's length (max_input_chars_per_word), if it takes one."""
    fn = getattr(encode, "func", encode)
    return next((p.name for p in call_parameters(fn)[1:] if "max" in p.name.lower()), None)
