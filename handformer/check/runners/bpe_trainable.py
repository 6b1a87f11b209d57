"""The runner of a tokenizer class that trains itself (minbpe's `RegexTokenizer`: built with no
vocabulary, `train(text, vocab_size, special_tokens)`, then `encode` and `decode`), found by what it
has, whatever its name.

It is trained on the fixture corpus with two special tokens (one inside the other); its merges
(read from the attribute that holds them: a dict of id pairs, or a list of pairs) are compared with
the reference trained under the learner's own split pattern (read from the instance: a compiled
regex or a pattern string); a pattern one alternative away from GPT-2's or GPT-4's is reported at
the line that writes it. Then its encode and decode run on the texts of bpe_codec.py against the
reference's encoding with the learner's own vocabulary and merges.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import regex

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import call_parameters
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, own_objects, trains_itself
from handformer.check.core.result import Check, ComponentResult, LearnerError, text
from handformer.check.core.source import global_reads, reachable, source_lines, source_text
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import CORPUS, SPECIAL, VOCAB_SIZE
from handformer.check.runners import bpe, bpe_codec, bpe_pieces, bpe_words, unigram

SPECIALS = [SPECIAL, bpe_codec.OVERLAP]  # in this order: the shorter first, so longest-first must be chosen


def trainable(obj: Any) -> bool:
    """A class with train, encode and decode methods that is built without a vocabulary."""
    return trains_itself(obj) and all(p.default is not p.empty for p in call_parameters(obj.__init__)[1:])


def check_tokenizer(comp: Component, ctx: Context) -> ComponentResult:
    """The kind's runner: a class that trains itself is trained first; any other encoder and decoder
    is handed the reference's vocabulary and merges (bpe_codec.py); a function of a word-level BPE's file
    (one that writes </w>), or a class there built from merges, the merges its file's trainer learns
    (bpe_words.py)."""
    functions = not inspect.isclass(comp.obj) or bpe_words.takes_merges(comp.obj)
    if functions and bpe_words.marked(ctx, comp):
        return bpe_words.check_functions(comp, ctx)
    return (check_trainable if trainable(comp.obj) else bpe_codec.check_bpe_tokenizer)(comp, ctx)


def check_trainable(comp: Component, ctx: Context) -> ComponentResult:
    """Train, compare the merges under its own pattern (and its ties to the smaller pair or to the
    pair counted first, when that is how it breaks them), then encode and decode."""
    res = ctx.result(comp)
    specials = SPECIALS[:2 * _takes_specials(comp.obj)]
    tok = ctx.learner.call("__init__", comp.obj, **_init_kwargs(comp.obj, specials))
    kwargs = _train_kwargs(tok.train, bool(specials))
    with bpe.deadline(bpe.FIXTURE_LIMIT):
        ctx.learner.call("train", tok.train, **kwargs)
    vocab, merges = _learnt(tok)
    if not merges:  # train(texts) handed one string learns nothing: a character-level BPE handed a list
        tok, merges = _as_list(comp, ctx, kwargs) or (tok, merges)
    if not merges and unigram.unigram_pieces(tok):  # a Unigram model: pieces and scores, no merges
        tok = _trained_on(comp, ctx, kwargs, bpe_words.LINES)[0]  # lines of words: pieces of several letters
        unigram.check_unigram(res, ctx, comp, tok, unigram.unigram_pieces(tok) or {})
        return finish(res)
    _merges_held(tok, merges)
    lines = source_lines(ctx.objects(comp))
    if bpe_pieces.character_merges(merges):  # SentencePiece's BPE on characters: no byte-level reference
        bpe_pieces.check_pieces(res, ctx, lambda text: _trained_on(comp, ctx, kwargs, text), merges, lines)
        return finish(res)
    split, pattern = _splitter(tok, comp, ctx)
    _split_note(res, ctx, pattern)
    with R.split_by(split):
        size = kwargs.get("vocab_size", VOCAB_SIZE + 1)
        ref_merges = R.kept(R.train, CORPUS, size, tuple(specials))[1]
        bpe.compare_merges(res, merges, ref_merges, specials, lines, ("smaller", "first", *bpe.SHOWN_RULES))
        coded = specials or _registered(tok, ctx, vocab)
        held = _special_ids(tok)
        vocab |= dict(zip(held.values(), map(str.encode, held)))
        specials_held = set(map(str.encode, coded)) <= set(vocab.values())
        if merges in _tie_conventions(ref_merges, size, specials) and specials_held:
            codec = bpe_codec.Codec.__new__(bpe_codec.Codec)
            codec.comp, codec.ctx, codec.encode_fn, codec.decode_fn = comp, ctx, _encoding(tok), tok.decode
            bpe_codec.grade_codec(res, codec, vocab, merges, coded, lines)
    return finish(res)


def _as_list(comp: Component, ctx: Context, kwargs: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """A fresh instance trained on the word-level fixture's lines as a list, and the merges of strings it
    holds; None where it learns none so (or raises)."""
    tok = fp.quietly(lambda: _trained(comp, ctx, kwargs, bpe_words.LINES)[0])
    merges = bpe_words.held_merges(tok) if tok is not None else []
    return (tok, merges) if merges else None


def _merges_held(tok: Any, merges: list[R.Pair]) -> None:
    """Trained, a BPE tokenizer holds its merges; one that holds no pairs and no attribute named for
    merges or ranks builds its vocabulary otherwise (a Unigram model's pieces and their probabilities,
    WordPiece's): not a BPE tokenizer, so no BPE reference applies (check cannot grade it)."""
    if merges or re.search("merge|rank", " ".join(vars(tok)), re.I):
        return
    raise fp.LearnerFailure(LearnerError(
        "cannot_call", "trained, it holds no merges (no pairs of tokens, no attribute named for merges or "
        "ranks): its vocabulary is not built by BPE merges (a Unigram model's, WordPiece's?), and check "
        "has no reference for it", "train",
        message_zh="训练之后它不含合并规则（没有 token 对，也没有以 merges 或 ranks 命名的属性）："
                   "它的词表不是由 BPE 合并得到的（Unigram 模型？WordPiece？），检查程序没有它的参考实现"))


def _registered(tok: Any, ctx: Context, vocab: dict[int, bytes]) -> list[str]:
    """The special tokens handed to a tokenizer trained without them through its method that registers
    them, text -> id (minbpe's `register_special_tokens({"<|endoftext|>": 100257})`), with ids past its
    vocabulary; none where it has no such method. The longer is handed first: minbpe's encode tries
    them in the dict's order, which the learner did not choose."""
    methods = [getattr(tok, name) for name in dir(tok) if "register" in name and "special" in name]
    register = next((m for m in methods if callable(m) and len(call_parameters(m)) == 1), None)
    if register is None:
        return []
    first = max(vocab, default=255) + 1
    ids = {s: first + i for i, s in enumerate(SPECIALS[::-1])}
    ctx.learner.call("register_special_tokens", register, ids)
    return list(SPECIALS)


def _encoding(tok: Any) -> Any:
    """The tokenizer's encode, with every special token allowed where it takes tiktoken's
    `allowed_special` (minbpe's, whose default refuses a text that holds one)."""
    if "allowed_special" not in inspect.signature(tok.encode).parameters:
        return tok.encode
    return lambda text: tok.encode(text, allowed_special="all")


def _tie_conventions(ref_merges: list[R.Pair], size: int, specials: list[str]) -> list[list[R.Pair]]:
    """The merges under each tie rule that is a convention for a tokenizer class: the reference's (to
    the greater pair), to the smaller, and to the pair counted first (minbpe's max(stats,
    key=stats.get), every pair recounted after each merge)."""
    first = R.kept(R.train_naive, CORPUS, size, tuple(specials), frozenset({"ties_first_seen"}))[1]
    return [ref_merges, R.kept(R.train, CORPUS, size, tuple(specials), True)[1], first]


def _split_note(res: ComponentResult, ctx: Context, pattern: str | None) -> None:
    """Which pre-tokenizer the reference was trained with: the learner's pattern, or none at all."""
    if pattern is None:
        res.notes.append(text(
            "your tokenizer has no pre-tokenizer (it trains on the whole byte sequence, minbpe's "
            "BasicTokenizer): graded against a reference trained without one",
            "你的分词器没有预分词（在整段字节序列上训练，像 minbpe 的 BasicTokenizer）："
            "按不做预分词训练的参考实现评判"))
        return
    _check_pattern(res, ctx, pattern)
    names = {p: (f"{name}'s", name) for name, p in R.KNOWN_PATTERNS.items()}
    known = names.get(pattern, ("your own", "你自己的"))
    res.notes.append(text(f"trained and graded with your split pattern ({known[0]})",
                          f"用你的切分正则训练和评判（{known[1]}）"))


def _takes_specials(cls: Any) -> bool:
    """Whether the tokenizer is handed special tokens: by train, or by its constructor when its train
    or encode reads them (minbpe's RegexTokenizer(special_tokens=...); a BasicTokenizer that only
    inherits the argument never uses it)."""
    reads = "special" in (source_text(cls.train) + source_text(cls.encode)).lower()
    init = _roles(cls.__init__, skip=1) if reads else {}
    return "special" in {**_roles(cls.train, skip=1), **init}.values()


def _init_kwargs(cls: Any, specials: list[str]) -> dict[str, Any]:
    roles = _roles(cls.__init__, skip=1)
    return {name: list(specials) for name, role in roles.items() if role == "special"}


def _special_ids(tok: Any) -> dict[str, int]:
    """The special tokens the instance holds, text -> id (minbpe's special_tokens), after training."""
    return next(filter(lambda v: bpe.typed(v, str, int) and set(v) <= set(SPECIALS), vars(tok).values()), {})


def _trained_on(comp: Component, ctx: Context, kwargs: dict[str, Any], lines: list[str],
                ) -> tuple[Any, list[Any]]:
    """A fresh instance trained on `lines` (handed where the text was) with `kwargs`, and its merges; a
    train(text) that takes one string and refuses a list is handed the lines joined by spaces, which
    SentencePiece's ▁ cuts into the same words."""
    try:
        return _trained(comp, ctx, kwargs, lines)
    except fp.LearnerFailure:
        return _trained(comp, ctx, kwargs, " ".join(lines))


def _trained(comp: Component, ctx: Context, kwargs: dict[str, Any], corpus: Any) -> tuple[Any, list[Any]]:
    tok = ctx.learner.call("__init__", comp.obj)
    name = next(n for n, role in _roles(tok.train).items() if role == "text")
    with bpe.deadline(bpe.FIXTURE_LIMIT):
        ctx.learner.call("train", tok.train, **{**kwargs, name: corpus})
    return tok, _learnt(tok)[1]


def _roles(fn: Any, skip: int = 0) -> dict[str, str]:
    """Each argument's role by its name (bpe.argument_role); `skip`: the arguments before (self)."""
    params = call_parameters(fn)[skip:]
    return {p.name: bpe.argument_role(p.name, first=i + skip == 0) for i, p in enumerate(params)}


def _train_kwargs(fn: Any, specials: bool) -> dict[str, Any]:
    """train's arguments by name: the corpus, vocab_size (the bytes, 180 merges and two special
    tokens; without special tokens two less) or the number of merges, the special tokens."""
    roles = _roles(fn)
    without = 2 * (not specials)
    values = {"text": CORPUS, "vocab_size": VOCAB_SIZE + 1 - without, "merges": VOCAB_SIZE - 257,
              "special": list(SPECIALS)}
    return {name: values[role] for name, role in roles.items() if role in values}


def _learnt(tok: Any) -> tuple[dict[int, bytes], list[R.Pair]]:
    """(vocab id -> bytes, merges as pairs of bytes in the order learnt) read from the instance's
    attributes by what they hold: minbpe's merges {(id, id): id} and vocab {id: bytes}, or a list of
    pairs (of bytes or ids)."""
    held = list(vars(tok).values())
    vocab = next(filter(lambda v: bpe.typed(v, int, bytes), held), {})
    ranked = [sorted(v, key=v.__getitem__) for v in filter(lambda v: bpe.typed(v, tuple, int), held)]
    scored = list(filter(None, map(bpe_words.scored_merges, held)))  # SentencePiece's {piece: -order}
    pairs = next(iter(ranked + list(filter(_token_pairs, held)) + scored), [])
    if bpe_pieces.character_merges(pairs) and set("".join(map("".join, pairs))) <= R.BYTE_OF.keys():
        return _byte_level(held, pairs)
    return vocab, [(vocab.get(a, a), vocab.get(b, b)) for a, b in pairs]  # ids -> bytes


TOKEN_PAIRS = {(bytes, bytes), (str, str), (int, int)}  # a merge's two tokens: bytes, strings or ids


def _token_pairs(value: Any) -> bool:
    """A list of merges: pairs of two tokens of one type (TOKEN_PAIRS), not the (piece, score) rows a
    Unigram model holds."""
    kinds = fp.quietly(lambda: {(type(a), type(b)) for _, (a, b) in bpe.ITEMS[type(value)](value)})
    return bpe.typed(value, int, tuple) and bool(kinds) and kinds <= TOKEN_PAIRS


def _byte_level(held: list[Any], pairs: list[R.Pair]) -> tuple[dict[int, bytes], list[R.Pair]]:
    """A byte-level BPE written over GPT-2's printable characters (its encoder.py: merges of strings
    such as ("Ġ", "t"), an encoder {string: id}): merges and vocabulary back in bytes."""
    encoder = max(filter(lambda v: bpe.typed(v, str, int), held), key=len, default={})  # not its specials
    merges = [(bpe.gpt2_bytes(a), bpe.gpt2_bytes(b)) for a, b in pairs]
    return dict(zip(encoder.values(), map(bpe.gpt2_bytes, encoder))), merges


def _splitter(tok: Any, comp: Component, ctx: Context) -> tuple[Any, str | None]:
    """(what the reference pre-tokenizes by, the pattern as written or None): the compiled pattern
    the instance holds, run by its own engine (`re` and `regex` differ on a joiner such as U+200D); a
    string attribute named pattern; no split at all where the tokenizer has no pre-tokenizer
    anywhere (minbpe's BasicTokenizer); else GPT-2's."""
    held = vars(tok)
    compiled = next(filter(lambda v: hasattr(v, "findall"), held.values()), None) or fp.quietly(
        lambda: regex.compile(held["pattern"]))
    if _cuts(compiled):  # minbpe's base class holds pattern = "" (none)
        return compiled.findall, compiled.pattern
    return (_whole, None) if never_splits(comp.obj, ctx) else (R.GPT2_PATTERN, R.GPT2_PATTERN)


def _whole(piece: str) -> list[str]:
    """No pre-tokenizer: each piece between special tokens is one word."""
    return [piece]


def never_splits(cls: type, ctx: Context) -> bool:
    """A tokenizer with no pre-tokenizer: neither the class (its bases too) nor a class or function of
    its file that it reaches reads a split pattern (a string or compiled pattern that cuts a text into
    pieces that join back to it) or calls a function that cuts one."""
    own = own_objects(ctx.module)
    reads = set().union(*map(global_reads, cls.__mro__))
    reached = reachable(reads, lambda name: global_reads(own.get(name)))
    return not any(_cuts(getattr(ctx.module, name, None)) for name in reached)


def _cuts(value: Any) -> bool:
    """A split pattern (as a string or compiled) or a function that cuts SPLIT_SAMPLE into pieces."""
    compiled = fp.quietly(lambda: regex.compile(value)) if isinstance(value, str) else value
    split = getattr(compiled, "findall", compiled)  # a function of the text, or a pattern's findall
    return inspect.isroutine(split) and bpe._splits(split)


def _check_pattern(res: ComponentResult, ctx: Context, pattern: str) -> None:
    """A pattern that is a known one less (or plus) one alternative: the line that writes it."""
    mine = set(pattern.split("|"))  # the alternatives (inner ones too: both sides are cut alike)
    near = [(name, mine ^ set(known.split("|"))) for name, known in R.KNOWN_PATTERNS.items()]
    for name, (alt,) in [(name, d) for name, d in near if len(d) == 1]:
        en, zh = [("with", "多了"), ("without", "少了")][alt not in mine]
        lines = inspect.getsource(ctx.module).splitlines()
        at = next((f" (line {n + 1}: {ln.strip()})" for n, ln in enumerate(lines) if pattern[:30] in ln), "")
        said = text(f"the split pattern is {name}'s as written", f"切分正则与 {name} 的原文一致")
        res.checks.append(Check(said, False, text(f"it is {name}'s {en} the alternative {alt}{at}",
                                                  f"它是 {name} 的正则，但{zh}分支 {alt}{at}")))
