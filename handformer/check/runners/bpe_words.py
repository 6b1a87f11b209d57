"""A BPE trained on words, not bytes: the text cut at whitespace, each word a sequence of characters,
its end marked with `</w>` (Sennrich et al.'s subword-nmt, as courses write it: the marker a symbol of
its own, or glued to the last character) or not marked at all. Its merges are pairs of strings.

How it cuts its words is read off its merges: the first cutting (CUTS) under which each merge, applied
in the learner's order, joins a pair the words hold. Under that cutting each merge must be a most
frequent pair, counted with each word's frequency, once the ones before it are applied; where several
pairs tie, any of them is right (the order of ties is the learner's to choose). Then its encode (the
merges applied by rank, in each word) and its decode (the words back, one space between them) are
compared with the reference's on the fixture's lines. Merges that no cutting explains are either joins
across words (a merge after an end marker: FAIL) or a cutting check does not know (NOT CHECKED).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from handformer.check.catalog.tokenizer import WORD_BPE_LINES
from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import call_parameters
from handformer.check.core.bpe_parts import snippet_parts
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, own_objects
from handformer.check.core.result import DEPARTS, ComponentResult, Finding, failed_check, text
from handformer.check.core.source import first_line, global_reads, locate_form, source_lines, source_text
from handformer.check.core.weights import MappingError
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import DOCUMENTS
from handformer.check.runners import bpe
from handformer.check.runners.bpe_codec import ORDER_FORMS

MARKER = "</w>"
Word = tuple[str, ...]
CUTS: dict[str, Callable[[str], Word]] = {  # a word -> its symbols before any merge
    "marker": lambda w: (*w, MARKER),  # "l o w </w>"
    "glued": lambda w: (*w[:-1], w[-1] + MARKER),  # "l o w</w>" (subword-nmt)
    "plain": tuple,  # "l o w": no end marker
}
# the fixture's lines as lowercase ASCII words, one space between them: cut alike by split(), split(" "),
# \w+ and a learner's lowercasing or stripping of marks, so the words are the learner's whatever it does
WORDS = re.compile("[a-z]+")
LINES = [" ".join(w) for w in map(WORDS.findall, "\n".join(DOCUMENTS).lower().splitlines()) if w]
ORDERS = ("rank", "leftmost", "latest", "reversed")  # the reference's order first, then the mistakes'


def words_of(lines: list[str], cut: str) -> Counter[Word]:
    """Each whitespace-separated word of `lines`, cut into symbols by CUTS[cut], with its frequency."""
    return Counter(CUTS[cut](w) for line in lines for w in line.split())


def cutting(lines: list[str], merges: list[tuple[str, str]]) -> str | None:
    """The first cutting under which every merge, applied in order, joins a pair the words hold: one with
    the end marker where a merge shows it, else none."""
    marked = any(MARKER in a + b for a, b in merges)
    cuts = [cut for cut in CUTS if (cut != "plain") == marked]
    return next((cut for cut in cuts if _all_held(words_of(lines, cut), merges)), None)


def _all_held(words: Counter[Word], merges: list[tuple[str, str]]) -> bool:
    for pair in merges:
        if not any(pair in zip(w, w[1:]) for w in words):
            return False
        words = Counter({R.merge_word(w, pair): n for w, n in words.items()})  # type: ignore[arg-type]
    return True


def check_words(res: ComponentResult, merges: list[tuple[str, str]], corpus: list[str],
                lines: list[tuple[int, str]]) -> str:
    """The merges learnt from `corpus`, replayed on its words as the learner cuts them; returns that
    cutting. Raises MappingError (not checked) where no cutting known explains them."""
    cut = cutting(corpus, merges)
    if cut is None:
        return _unexplained(res, merges, lines)
    words = words_of(corpus, cut)
    step = most_frequent_merges(res, merges, words, (
        f"words (cut at spaces, {_SHOWN[cut][0]})", " (ties in any order)",
        f"词上（按空格切开，{_SHOWN[cut][1]}）", "（并列时顺序不限）"))
    if step is not None:
        once = R.replay(Counter(dict.fromkeys(words, 1)), merges)[0] is None  # type: ignore[arg-type]
        what, zh = COUNTS[once]
        res.findings.append(Finding(DEPARTS, text(f"merge {step} {merges[step]}: {what}", f"合并 {step} "
                                    f"{merges[step]}：{zh}"), *first_line(WORD_BPE_LINES["count"], lines)))
    return cut


COUNTS = {  # whether the merges are those of each word counted once: what a departing count says
    True: ("each word's pairs counted once, not times the word's frequency",
           "每个词的对只数了一次，没有乘以词频"),
    False: ("a pair count differs from the reference's", "某个对的计数和参考实现不同"),
}
_SHOWN = {"marker": ("</w> a symbol after each", "每个词后面加一个符号 </w>"),
          "glued": ("</w> glued to the last character", "</w> 接在最后一个字符上"),
          "plain": ("no end marker", "没有词尾标记")}


def _unexplained(res: ComponentResult, merges: list[tuple[str, str]], lines: list[tuple[int, str]]) -> str:
    """A merge whose left part ends a word joins two words: bpe_merges_across_pretokens; merges no
    cutting explains otherwise: not checked."""
    across = next((m for m in merges if MARKER in (m[0] + m[1]).removesuffix(MARKER)), None)
    if across is None:
        raise MappingError(
            "its merges are pairs of characters that no cutting check knows explains (words cut at spaces, "
            f"with {MARKER} after each, glued to the last character, or none; SentencePiece's ▁)",
            zh=f"它的合并是字符对，但 check 认识的切词方式都解释不了（按空格切词，{MARKER} 单独一个符号、"
               "接在最后一个字符上或没有；SentencePiece 的 ▁）")
    one_word = text("each merge joins symbols of one word", "每次合并都在一个词之内")
    res.checks.append(failed_check(one_word, False,
                                   lambda: text(f"the merge {across} joins the end of a word to the next",
                                                f"合并 {across} 把一个词的结尾和下一个词连在一起")))
    res.findings.append(Finding("bpe_merges_across_pretokens", text(
        f"the merge {across} joins the end of one word ({MARKER}) to the next word",
        f"合并 {across} 把一个词的结尾（{MARKER}）和下一个词连在一起"),
        *first_line(WORD_BPE_LINES["bpe_merges_across_pretokens"], lines)))
    return ""


def pieces(line: str, merges: list[tuple[str, str]], cut: str, order: str = "rank") -> list[str]:
    """The line's symbols, each word's merged in `order` (R.encode_word's)."""
    ranks = {pair: r for r, pair in enumerate(merges)}
    return [p for w in line.split() for p in R.encode_word(CUTS[cut](w), ranks, order)]  # type: ignore[arg-type]


def check_codec(res: ComponentResult, ctx: Context, encode: Callable[[str], Any],
                decode: Callable[[Any], Any], merges: list[tuple[str, str]], cut: str, corpus: list[str],
                lines: list[tuple[int, str]], piece_of: dict[str, int]) -> None:
    """encode(line) against the merges applied by rank to each word (as symbols, or ids read by
    `piece_of`), then decode(encode(line)) against the line's words joined by single spaces."""
    made = {order: [pieces(line, merges, cut, order) for line in corpus] for order in ORDERS}
    ours = [list(ctx.learner.call("encode", encode, line)) for line in corpus]
    as_ids = [[piece_of.get(p, p) for p in want] for want in made["rank"]]  # where it gives ids
    bad = next(((line, got, want) for line, got, want, ids in zip(corpus, ours, made["rank"], as_ids)
                if got not in (want, ids)), None)
    res.checks.append(failed_check(text(
        f"encode gives each of {len(corpus)} lines as the merges applied by rank (the earliest learnt first) "
        "cut each word", f"encode 对 {len(corpus)} 行中的每一行，都给出按合并次序（先学到的先用）切出的片段"),
        bad is None, lambda: text(f"{bad[0][:30]!r}: yours {bad[1][:8]}, the reference's {bad[2][:8]}",
                                  f"{bad[0][:30]!r}：你的 {bad[1][:8]}，参考实现的 {bad[2][:8]}")))
    order = next((o for o in ORDERS if made[o] == ours), "rank")  # the reference's order first
    if order != "rank":
        form, number, code = locate_form("bpe_encode_merge_order", order, lines)
        res.findings.append(Finding("bpe_encode_merge_order", text(
            f"your encode gives the pieces the merges make when {ORDER_FORMS[order][0]}",
            f"你的 encode 给出的片段是这样合并切出的：{ORDER_FORMS[order][1]}"), number, code, form))
    _check_decode(res, ctx, decode, ours, corpus, lines, JOINERS[cut])


JOINERS = {"marker": " ", "glued": " ", "plain": ""}  # what decode puts between words: no marker, nothing


# what decode's words say, by whether they are joined with nothing between them
DECODE_SAID = {
    True: text(f"decode joins the words with nothing between them: the end marker {MARKER} is dropped, not "
               "turned into a space", f"decode 把词连在了一起：词尾标记 {MARKER} 被删掉了，没有变成空格"),
    False: text(f"decode does not give the words back as they were: the line that handles the end marker "
                f"{MARKER} does not turn it into one space between words",
                f"decode 没有按原样还原这些词：处理词尾标记 {MARKER} 的那一行"
                "没有把它变成词之间的一个空格")}


def _check_decode(res: ComponentResult, ctx: Context, decode: Callable[[Any], Any], ours: list[list[Any]],
                  corpus: list[str], lines: list[tuple[int, str]], joiner: str) -> None:
    """decode(encode(line)) is the line's words joined by single spaces (a space left at its end aside);
    by nothing where no end marker keeps where a word ends."""
    backs = [ctx.learner.call("decode", decode, ids) for ids in ours]
    bad = next(((back, line) for back, line in zip(backs, corpus)
                if str(back).rstrip() != joiner.join(line.split())), None)
    res.checks.append(failed_check(text(
        f"decode(encode(line)) gives each of {len(corpus)} lines' words back, one space between them (none "
        "where no end marker keeps where a word ends)", f"decode(encode(line)) 还原 {len(corpus)} 行中每一行"
        "的词，词之间一个空格（没有词尾标记记住词在哪里结束时，词之间没有空格）"), bad is None,
        lambda: text(f"{bad[0]!r:.60} for {bad[1]!r:.60}", f"{bad[1]!r:.60} 还原成了 {bad[0]!r:.60}")))
    joined = bool(bad) and bad[0] == "".join(bad[1].split())
    number, code = first_line(WORD_BPE_LINES["decode"][:len(WORD_BPE_LINES["decode"]) - (not joined)], lines)
    if bad and number:  # the line that turns the marker back into a space (any line, where they are joined)
        res.findings.append(Finding(DEPARTS, DECODE_SAID[joined], number, code))


# --- a word-level BPE written as free functions: learn_bpe(corpus, num_merges), encode(text, merges), decode

MERGES = 120  # merges asked of a trainer on the fixture's lines
ENCODE_MERGES = ("code", "merge", "rank")  # words in the name of encode's argument that takes the merges
MERGES_NAMED = re.compile("|".join(ENCODE_MERGES), re.I)
TRAINS = re.compile("train|learn", re.I)  # a trainer's name, beside helpers that take a count too


def marked(ctx: Context, comp: Component) -> bool:
    """The component's code writes the end-of-word marker, or reads a constant of its file that holds it
    (`EOW = "</w>"`): a word-level BPE, not a byte-level one."""
    held = set(re.findall(rf"""(?m)^(\w+)\s*=\s*['"]{MARKER}['"]""", source_text(ctx.module)))
    written = any(MARKER in code.split("#")[0] for _, code in source_lines(ctx.objects(comp)))
    return written or bool(held & global_reads(comp.obj))


def check_any_trainer(comp: Component, ctx: Context) -> ComponentResult:
    """The BPE trainer kind's runner: a word-level trainer here, a byte-level one by bpe.py."""
    words = marked(ctx, comp) or snippet_parts(comp.name, comp.obj) is not None
    return {True: check_trainer, False: bpe.check_bpe}[words](comp, ctx)


def check_trainer(comp: Component, ctx: Context) -> ComponentResult:
    """The merges a word-level trainer function learns from the fixture's lines (or the paper's loop
    over its get_stats and merge_vocab learns), replayed on its words."""
    res = ctx.result(comp)
    parts = snippet_parts(comp.name, comp.obj)
    merges = trained(ctx, comp.obj) if parts is None else _looped(ctx, *parts)
    check_words(res, merges, LINES, source_lines(ctx.objects(comp)))
    return finish(res)


def _looped(ctx: Context, stats: Any, merge: Any) -> list[tuple[str, str]]:
    """The paper's loop: MERGES times, the most frequent pair of get_stats(vocab) (the first counted of
    those tied), then vocab = merge_vocab(pair, vocab); the vocabulary the fixture's words written as the
    paper's {"l o w </w>": 5}."""
    vocab = {" ".join(word): n for word, n in words_of(LINES, "marker").items()}
    merges: list[tuple[str, str]] = []
    for _ in range(MERGES):
        pairs = dict(ctx.learner.call("get_stats", stats, vocab))
        if not pairs:
            break
        merges.append(tuple(max(pairs, key=pairs.__getitem__)))  # type: ignore[arg-type]
        vocab = ctx.learner.call("merge_vocab", merge, merges[-1], vocab)
    return merges


def check_functions(comp: Component, ctx: Context) -> ComponentResult:
    """A word-level encode function, handed the merges its file's trainer learns; its file's decode
    after. A class built from the merges (subword-nmt's `BPE(codes)`, its encode giving the pieces as
    strings) is built with them, and its own encode and decode are graded so."""
    res = ctx.result(comp)
    own = own_objects(ctx.module)
    trainers = sorted(filter(_trains, own.values()), key=lambda f: not TRAINS.search(f.__name__))
    decode = next((f for name, f in own.items() if name.startswith("decode") and callable(f)), None)
    trainer = next(iter(trainers), None)  # one named to train first (not a helper replace_pair(pair, vocab))
    if trainer is None or decode is None and not inspect.isclass(comp.obj):
        raise MappingError("a word-level BPE encode whose file has no trainer (a function that takes the "
                           "corpus and num_merges or vocab_size) or no decode function to drive it with",
                           zh="这个词级 BPE 的 encode 所在文件里没有训练函数（接收语料和 num_merges 或 "
                              "vocab_size）或 decode 函数，check 无法驱动它")
    merges, lines = trained(ctx, trainer), source_lines(ctx.objects(comp))
    cut = check_words(res, merges, LINES, lines)
    if cut:
        built = inspect.isclass(comp.obj)
        codec = _built(ctx, comp.obj, merges) if built else (_encoder(comp.obj, merges), decode)
        check_codec(res, ctx, *codec, merges, cut, LINES, lines, {})
    return finish(res)


def takes_merges(cls: Any) -> bool:
    """A class built from the merges: its constructor's first argument is named for them (merges, codes,
    ranks)."""
    return any(MERGES_NAMED.search(p.name) for p in call_parameters(cls.__init__)[1:2])


def _built(ctx: Context, cls: type, merges: list[tuple[str, str]]) -> tuple[Any, Any]:
    """(encode, decode) of the class built from the merges, by the name of its first argument."""
    first = call_parameters(cls.__init__)[1]
    forms = {True: dict(zip(merges, itertools.count())), False: list(merges)}  # ranks: pair -> order learnt
    tok = ctx.learner.call("__init__", cls, **{first.name: forms["rank" in first.name.lower()]})
    return tok.encode, tok.decode


def _trains(fn: Any) -> bool:
    if not inspect.isfunction(fn):
        return False
    params = call_parameters(fn)
    roles = [bpe.parameter_role(p, i == 0, params) for i, p in enumerate(params)]
    return bool(roles) and roles[0] == "text" and bool({"merges", "vocab_size"} & set(roles))


def _encoder(fn: Any, merges: list[tuple[str, str]]) -> Callable[[str], list[Any]]:
    """encode(text) of a function that takes the text (or one word) and the merges (a list, or ranks: a
    dict pair -> rank where the argument's name says rank)."""
    params = call_parameters(fn)
    ranks = {pair: r for r, pair in enumerate(merges)}
    given = {p.name: (ranks if "rank" in p.name.lower() else merges) for p in params[1:]
             if any(w in p.name.lower() for w in ENCODE_MERGES)}
    if "word" in params[0].name.lower():
        return lambda line: [p for w in line.split() for p in fn(w, **given)]
    return lambda line: fn(line, **given)


def trained(ctx: Context, fn: Any) -> list[tuple[str, str]]:
    """The merges `fn` learns from the fixture's lines, handed as a list (or, where it refuses that or
    learns nothing from it, as one text), with MERGES merges or a vocabulary size that allows about as
    many."""
    params = call_parameters(fn)
    roles = {p.name: bpe.parameter_role(p, i == 0, params) for i, p in enumerate(params)}
    values = {"merges": MERGES, "vocab_size": len(set("".join(LINES))) + 1 + MERGES, "special": []}
    for corpus in (LINES, " ".join(LINES)):
        kwargs = {name: values.get(role, corpus) for name, role in roles.items() if role}
        call = functools.partial(ctx.learner.call, "train", fn, **kwargs)
        with bpe.deadline(bpe.FIXTURE_LIMIT):
            out = fp.quietly(call) if corpus is LINES else call()  # a list may be refused
        held = [out, *(out if isinstance(out, tuple) else ())]  # the merges, or (vocab, merges)
        merges = next(filter(None, map(_string_merges, held)), None)
        if merges:
            return merges
    raise MappingError(f"{fn.__name__} returned no merges as pairs of strings (a list, or a dict pair -> "
                       "rank)",
                       zh=f"{fn.__name__} 没有返回字符串对形式的合并（列表，或 pair -> 次序 的字典）")


def _string_merges(value: Any) -> list[tuple[str, str]] | None:
    """A list of pairs of strings, or a dict of such pairs (to their ranks, filled in the order learnt),
    as a list; None for anything else."""
    pairs = fp.quietly(lambda: [(a, b) for a, b in value])  # a dict's keys in the order it was filled
    return pairs if pairs and all(type(a) is type(b) is str for a, b in pairs) else None


def held_merges(tok: Any) -> list[tuple[str, str]]:
    """The merges a trained tokenizer holds as pairs of strings (a list, or a dict pair -> rank), read
    as they are: ASCII ones are not GPT-2's characters of bytes here."""
    held = list(vars(tok).values())
    return next(filter(None, [*map(_string_merges, held), *map(scored_merges, held)]), [])


def scored_merges(value: Any) -> list[tuple[str, str]]:
    """SentencePiece's BPE merges held as {merged piece: score}, the score minus the merge's order: the
    pairs in score order (the highest first), each piece cut into two it was made of (single characters
    or pieces merged before it); [] where the table is not so (a Unigram model's scores, which hold
    single characters and tie)."""
    if not bpe.typed(value, str, float) or len(set(value.values())) < len(value) or len(value) < 2:
        return []
    made: set[str] = set()
    pairs = []
    for piece in sorted(value, key=lambda p: -value[p]):
        cut = next((i for i in range(1, len(piece)) if known(piece[:i], made) & known(piece[i:], made)), 0)
        if not cut:
            return []
        pairs.append((piece[:cut], piece[cut:]))
        made.add(piece)
    return pairs


def known(part: str, made: set[str]) -> bool:
    """A part a merge may join: one character, or a piece an earlier merge made."""
    return len(part) == 1 or part in made


def most_frequent_merges(res: ComponentResult, merges: list, words: Any,
                         where: tuple[str, str, str, str]) -> Any:
    """Checks that each merge, replayed on `words`, is a most frequent pair counted with each word's
    frequency; `where` says on what (en, en after, zh, zh after). The step that is not, or None."""
    step, _rule = R.replay(words, merges)
    res.checks.append(failed_check(text(
        f"its {len(merges)} merges on the fixture's {where[0]} are each a most frequent pair, counted with "
        f"each word's frequency{where[1]}",
        f"在测试语料的{where[2]}学到的 {len(merges)} 次合并，"
        f"每一次都是（按词频计数的）出现最多的一对{where[3]}"),
        step is None, lambda: text(
            f"merge {step}, {merges[step]}, is not a most frequent pair once the merges before it are "
            "applied", f"合并 {step}（从 0 数）{merges[step]} 在应用它之前的合并后，不是出现最多的一对")))
    return step
