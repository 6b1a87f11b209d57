"""The runner of the BPE trainer: `train_bpe(input_path | text, vocab_size, special_tokens) ->
(vocab, merges)`, the shape of Stanford CS336's first assignment (its encoder and decoder are
graded by bpe_codec.py).

The trainer is trained on the fixture corpus (handformer/check/reference/bpe_corpus.py) and its merges are
compared, in order, with handformer's reference (handformer/check/reference/bpe_reference.py: GPT-2's
pre-tokenizer pattern, ties to the lexicographically greater pair). A difference is explained by
replaying the learner's merges: when each is a most frequent pair of the pre-tokens as some
mistake cuts them (across pre-token boundaries, special tokens trained on), that mistake is named,
and the rule of their ties is read off (the smaller pair is a convention; the order pairs were
counted in is a mistake); merges that are the first counts, never updated, are named too. Then the
trainer is timed on a larger generated corpus against the reference on the same machine: past
ten times the reference's time, measured just before (at least 3 s), a timer stops it and a note
says it is slow, with the factor (slow is not wrong: it passes on its fixture merges). A trainer
that does not end on the fixture corpus is stopped too, a timeout error.
"""

from __future__ import annotations

import inspect
import os
import re
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import regex

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, call_parameters, finish
from handformer.check.core.deadline import TrainerTimeout, deadline
from handformer.check.core.discovery import Component, DiscoveryError, own_objects
from handformer.check.core.result import (
    DIFFERS,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    failed_check,
    text,
)
from handformer.check.core.source import global_reads, locate, locate_form, source_lines
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import (
    CORPUS,
    SPECIAL,
    TIMING_VOCAB_SIZE,
    VOCAB_SIZE,
    timing_corpus,
)

PATH_NAMES = (
    "input_path",
    "path",
    "file",
    "filename",
    "file_path",
    "filepath",
    "corpus_path",
    "data_path",
    "input_file",
    "train_file",
    "fname",
    "text_path",
    "training_file",
)
TEXT_NAMES = ("text", "corpus", "data", "training_text", "train_text", "s", "txt", "input_text", "string")
# a corpus argument that takes a list of texts (train_bpe(texts, vocab_size)): its name a plural of a text,
# or its annotation a list; handed the fixture corpus as one text in a list, so that its pre-tokens are
# the reference's (a string handed there is iterated character by character)
LISTED = re.compile(r"(?:\w*_)?(?:texts|documents|docs|sentences|lines|samples|strings|corpora)", re.I)
LISTED_TYPES = re.compile(r"\b(?:list|List|Iterable|Sequence)\b")
VOCAB_SIZE_NAMES = (
    "vocab_size",
    "size",
    "n_vocab",
    "target_vocab_size",
    "vocabulary_size",
    "num_tokens",
    "max_vocab_size",
)
MERGES_NAMES = ("num_merges", "n_merges", "merges", "number_of_merges")
SPECIAL_NAMES = ("special_tokens", "specials", "special", "special_token_list", "reserved_tokens")
FIXTURE_LIMIT = 10.0  # seconds for the fixture corpus (2 KB): only a runaway trainer comes near it
FACTOR, FLOOR, CEILING = 10.0, 3.0, 12.0  # the timing limit: FACTOR x the reference, within these
# the pre-tokens as each mistake cuts them, tried in this order
CUTS = (
    frozenset(),
    frozenset({"specials_trained"}),
    frozenset({"across_pretokens"}),
    frozenset({"specials_trained", "across_pretokens"}),
    frozenset({"unweighted"}),
)
CUT_DIAGNOSES = {
    "specials_trained": "bpe_special_tokens_merged",
    "across_pretokens": "bpe_merges_across_pretokens",
    "unweighted": "bpe_pairs_not_weighted",
}
# pre-tokens cut wrong: longer words, so the timing says nothing
LONGER_WORDS = ("bpe_special_tokens_merged", "bpe_merges_across_pretokens")


@cache
def reference_fixture() -> tuple[dict[int, bytes], list[R.Pair]]:
    return R.train(CORPUS, VOCAB_SIZE, [SPECIAL])


def reference_timing() -> tuple[float, list[R.Pair]]:
    """The reference's seconds on the timing corpus and its merges, measured once a process (a check of
    one file is one process, so they are measured right before that learner's run, under the same load
    on the machine; a test run checks many trainers in one process, and would train the reference again
    for each)."""
    return _timed_reference(timing_corpus(), TIMING_VOCAB_SIZE, SPECIAL)


@cache
def _timed_reference(corpus: str, vocab_size: int, special: str) -> tuple[float, list[R.Pair]]:
    start = time.process_time()
    _, merges = R.train(corpus, vocab_size, [special])
    return time.process_time() - start, merges


def show(pair: R.Pair) -> str:
    return f"({pair[0]!r}, {pair[1]!r})"


class Trainer:
    """The learner's trainer, called as its signature says: a path or the text, the vocabulary size
    (or the number of merges) and the special tokens, by name."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        params = call_parameters(comp.obj)
        if not params:
            raise DiscoveryError(
                f"{comp.name}{inspect.signature(comp.obj)} takes no corpus; write "
                f"{comp.name}(input_path, vocab_size, special_tokens)",
                zh=f"{comp.name}{inspect.signature(comp.obj)} 不接受语料；请写成 {comp.name}(input_path, "
                   "vocab_size, special_tokens)"
            )
        self.roles: dict[str, str] = {}
        self.listed = {p.name for p in params if listed(p)}
        for i, p in enumerate(params):
            role = parameter_role(p, i == 0, params)
            if role:
                self.roles[p.name] = role
            elif p.default is p.empty:
                raise DiscoveryError(
                    f"cannot fill the argument {p.name!r} of {comp.name}{inspect.signature(comp.obj)}: "
                    f"handformer passes the corpus ({', '.join(PATH_NAMES[:2])} or "
                    f"{', '.join(TEXT_NAMES[:2])}), "
                    f"{VOCAB_SIZE_NAMES[0]} (or {MERGES_NAMES[0]}) and {SPECIAL_NAMES[0]}; rename it or "
                    "give it a default",
                    zh=f"填不了 {comp.name}{inspect.signature(comp.obj)} 的参数 {p.name!r}：handformer "
                       f"传入语料（{', '.join(PATH_NAMES[:2])} 或 {', '.join(TEXT_NAMES[:2])}）、"
                       f"{VOCAB_SIZE_NAMES[0]}（或 {MERGES_NAMES[0]}）和 {SPECIAL_NAMES[0]}；请改名，"
                       "或给它一个默认值"
                )
        if not {"vocab_size", "merges"} & set(self.roles.values()):
            raise DiscoveryError(
                f"{comp.name}{inspect.signature(comp.obj)} takes no vocabulary size; "
                "add vocab_size (or num_merges)",
                zh=f"{comp.name}{inspect.signature(comp.obj)} 不接受词表大小；请加上 vocab_size（或 "
                   "num_merges）"
            )

    @property
    def specials(self) -> list[str]:
        """The special tokens it is handed: <|endoftext|> where it takes special tokens, else none."""
        return [SPECIAL] if "special" in self.roles.values() else []

    def run(self, corpus: str, vocab_size: int, limit: float) -> tuple[dict[int, bytes] | None, list[R.Pair]]:
        """(vocab or None, merges as pairs of bytes); TrainerTimeout past `limit` seconds."""
        with tempfile.TemporaryDirectory(prefix="handformer-bpe-") as tmp:
            path = os.path.join(tmp, "corpus.txt")
            Path(path).write_text(corpus, encoding="utf-8")
            specials = self.specials
            vocab_size -= 1 - len(specials)  # without the special token: one token less, the same merges
            values = {
                "path": path,
                "text": corpus,
                "vocab_size": vocab_size,
                "special": specials,
                "merges": vocab_size - 256 - len(specials),
            }
            kwargs = {name: [values[role]] if name in self.listed else values[role]
                      for name, role in self.roles.items()}
            with deadline(limit):
                out = self.ctx.learner.call("train", self.comp.obj, **kwargs)
        return self.parse(out)

    def parse(self, out: Any) -> tuple[dict[int, bytes] | None, list[R.Pair]]:
        if typed(out, bytes, int):  # tiktoken's mergeable_ranks alone: bytes -> rank
            return {v: k for k, v in out.items()}, merges_of_ranks(out)
        pair = isinstance(out, (tuple, list)) and len(out) == 2 and not _is_pair(out)  # (vocab, merges)
        values = list(out) if pair else [out]
        vocab = next((v for v in values if isinstance(v, dict)), None)
        merges = next((list(v) for v in values[::-1] if isinstance(v, (list, tuple))), None)
        if merges is None:
            raise self.ctx.learner.fail(
                "train",
                f"{self.comp.name} returned {type(out).__name__}; return "
                "(vocab, merges): vocab a dict[int, bytes], merges a list of "
                "(bytes, bytes) pairs",
                f"{self.comp.name} 返回了 {type(out).__name__}；应当返回 (vocab, merges)：vocab 是 "
                "dict[int, bytes]，merges 是 (bytes, bytes) 对的列表",
            )
        vocab = {v: k for k, v in vocab.items()} if typed(vocab, bytes, int) else vocab  # bytes -> id: turned
        vocab = {v: gpt2_bytes(k) for k, v in vocab.items()} if typed(vocab, str, int) else vocab  # GPT-2's
        if vocab and not typed(vocab, int, bytes):
            raise self.ctx.learner.fail(
                "train",
                "the vocab is not a dict[int, bytes]: map each id to "
                "its token's bytes, e.g. {0: b'<|endoftext|>', 1: b'\\x00', ...}",
                "vocab 不是 dict[int, bytes]：把每个 id 对应到它的 token 的字节，例如 {0: "
                "b'<|endoftext|>', 1: b'\\x00', ...}",
            )
        return vocab, [self._pair(m, vocab) for m in merges]

    def _pair(self, merge: Any, vocab: dict[int, bytes] | None) -> R.Pair:
        readers = MERGE_READERS[:2 + (vocab is not None)]  # pairs of ids read through a vocab only
        read = next((r for kind, r in readers if _is_pair(merge) and all(isinstance(t, kind) for t in merge)),
                    None)
        if read is not None:
            return read(merge[0], vocab), read(merge[1], vocab)
        raise self.ctx.learner.fail(
            "train", f"a merge is {merge!r}; each merge is a pair of bytes, e.g. (b' t', b'he')",
            f"有一个合并是 {merge!r}；每个合并是一对 bytes，例如 (b' t', b'he')"
        )


def listed(param: inspect.Parameter) -> bool:
    """Whether a trainer's corpus argument takes a list of texts: by its name or its annotation."""
    return bool(LISTED.fullmatch(param.name) or LISTED_TYPES.search(str(param.annotation)))


def merges_of_ranks(ranks: dict[bytes, int]) -> list[R.Pair]:
    """tiktoken's mergeable_ranks as merges in the order learnt: each token of two bytes or more is
    the pair its bytes encode to under the ranks learnt before it (tiktoken's own reading)."""
    merges: list[R.Pair] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            ranked = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            low, i = min(ranked)
            if low >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        merges += [tuple(parts)] if len(parts) == 2 else []
    return merges


# each role of a trainer's argument, in the order they are tried: its names, and the words that say it
# inside a longer name
ROLES = (("path", PATH_NAMES, ("path", "file")), ("text", TEXT_NAMES, ()),
         ("vocab_size", VOCAB_SIZE_NAMES, ("vocab",)), ("merges", MERGES_NAMES, ("merge",)),
         ("special", SPECIAL_NAMES, ("special",)))


def argument_role(name: str, first: bool) -> str:
    """What the trainer's argument `name` takes: path, text, vocab_size, merges, special or ""."""
    name = name.lower()
    said = (role for role, names, words in ROLES if name in names or any(w in name for w in words))
    return next(said, "text" if first else "")  # the first argument is the corpus, whatever its name


# a count by the form of its name (subword-nmt's num_symbols, n_operations): a trainer's required argument
# of no role named so is the number of merges it learns
COUNTED = re.compile(r"(?:num|n|number_of)_\w+|\w+_count", re.I)
COUNTS = {"vocab_size", "merges"}


def parameter_role(p: inspect.Parameter, first: bool, params: list[inspect.Parameter]) -> str:
    """argument_role of a trainer's parameter; a required one of no role whose name is a count, in a
    trainer that takes no count by a name check knows, is the merges (where it takes vocab_size, its
    num_processes is not a count of merges)."""
    known = {argument_role(q.name, i == 0) for i, q in enumerate(params)}
    counted = p.default is p.empty and COUNTED.fullmatch(p.name) and not first and not known & COUNTS
    return argument_role(p.name, first) or "merges" * bool(counted)


ITEMS = {dict: dict.items, list: enumerate}  # what a value holds, as (key, value) pairs


def gpt2_bytes(token: str) -> bytes:
    """A token written in GPT-2's printable characters (its bytes_to_unicode: "Ġt") as its bytes; a
    token with a character outside that table is plain text, as UTF-8."""
    if set(token) <= R.BYTE_OF.keys():
        return bytes(map(R.BYTE_OF.__getitem__, token))
    return token.encode()


def typed(value: Any, key: type, held: type) -> bool:
    """A non-empty dict (or list, keyed by position) whose keys and values are of these types."""
    items = list(ITEMS.get(type(value), lambda v: ())(value))
    return all(isinstance(k, key) and isinstance(v, held) for k, v in items) and len(items) > 0


# how each token of a merge reads as bytes, by its type: bytes; GPT-2's encoder.py's strings ("Ġ", "t");
# GPT-2 style ids, looked up in the vocab
MERGE_READERS = ((bytes, lambda t, vocab: bytes(t)), (str, lambda t, vocab: gpt2_bytes(t)),
                 (int, lambda t, vocab: vocab[t]))


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, (tuple, list)) and len(value) == 2 and not isinstance(value[0], (list, tuple, dict))
    )


SPLIT_SAMPLE = "It's 2026:  the cat\n sat, 你好."  # contractions, digits, runs of spaces, a new line


def own_splitter(comp: Component, ctx: Context) -> Callable[[str], list[str]] | None:
    """The learner's own pre-tokenizer (a hand-written stand-in for GPT-2's pattern): a function of
    their file that the trainer calls, or the findall of a compiled pattern of their file that it reads
    (re.findall(PAT, text)), that cuts a text into pieces that join back to it."""
    own, names = own_objects(ctx.module), sorted(global_reads(comp.obj))
    # (the findall of anything else raises, and cuts nothing)
    functions = [*filter(inspect.isfunction, map(own.get, names)),
                 *map(_findall, names, map(vars(ctx.module).get, names))]
    return next(filter(_splits, functions), None)


def _findall(name: str, pattern: re.Pattern[str] | regex.Pattern[str]) -> Callable[[str], list[str]]:
    """The findall of a compiled pattern, named as the file names the pattern."""
    def split(text: str) -> list[str]:
        return pattern.findall(text)
    split.__name__ = name
    return split


def _splits(fn: Callable[..., Any]) -> bool:
    out = fp.quietly(lambda: fn(SPLIT_SAMPLE))
    return bool(fp.quietly(lambda: isinstance(out, list) and len(out) > 1 and "".join(out) == SPLIT_SAMPLE))


def check_bpe(comp: Component, ctx: Context) -> ComponentResult:
    """The trainer, graded under its own pre-tokenizer when it calls one of its file's (the
    reference trained so too), else under GPT-2's pattern."""
    split = own_splitter(comp, ctx)
    if split is None:
        return _check_trainer(comp, ctx, ctx.result(comp), reference_fixture())
    res = ctx.result(comp)
    res.notes.append(text(f"trained and graded with your own pre-tokenizer ({split.__name__})",
                          f"用你自己的预分词函数（{split.__name__}）训练和评判"))
    with R.split_by(split):
        return _check_trainer(comp, ctx, res, R.train(CORPUS, VOCAB_SIZE, [SPECIAL]))


def _check_trainer(comp: Component, ctx: Context, res: ComponentResult,
                   reference: tuple[dict[int, bytes], list[R.Pair]]) -> ComponentResult:
    """Merges on the fixture corpus, the vocabulary's ids, and the time on a larger one."""
    trainer = Trainer(comp, ctx)
    lines = source_lines(ctx.objects(comp))
    ref_vocab, ref_merges = reference
    start = time.process_time()
    try:
        vocab, merges = trainer.run(CORPUS, VOCAB_SIZE, FIXTURE_LIMIT)
    except TrainerTimeout:
        raise fp.LearnerFailure(LearnerError(
            "timeout", f"training on the fixture corpus ({len(CORPUS.encode())} bytes, "
            f"{len(ref_merges)} merges) did not end within {FIXTURE_LIMIT:g} s: a loop that "
            "never ends (a merge that never makes the words shorter?)", "train",
            message_zh=f"在测试语料（{len(CORPUS.encode())} 字节，{len(ref_merges)} 次合并）上训练，"
            f"{FIXTURE_LIMIT:g} 秒内没有结束：循环停不下来（某次合并没有让词变短？）")) from None
    fixture_seconds = time.process_time() - start
    specials = trainer.specials
    if not specials:
        res.notes.append(text("your trainer takes no special tokens, so it was trained without <|endoftext|>",
                              "你的训练函数不接收特殊 token，所以训练时没有 <|endoftext|>"))
        ref_vocab, ref_merges = R.train(CORPUS, VOCAB_SIZE - 1, [])
    _vocab_size(res, vocab, merges, ref_merges, specials, lines)
    compare_merges(res, merges, ref_merges, specials, lines)
    if vocab is not None:
        _check_vocab(res, vocab, merges, specials)
    else:
        res.notes.append(text("your trainer returned the merges only; the vocabulary's ids were not checked",
                              "你的训练只返回了合并规则，词表的 id 没有检查"))
    if res.has(*LONGER_WORDS):
        res.notes.append(text("not timed: with the pre-tokens cut wrong the words are longer, so the time "
                              "says nothing about the trainer",
                              "没有计时：预分词切错了，词更长，计时说明不了训练本身"))
    else:
        _time(res, trainer, exact=merges == ref_merges, fixture_seconds=fixture_seconds)
    return finish(res)


def _vocab_size(res: ComponentResult, vocab: Any, merges: list[R.Pair], ref_merges: list[R.Pair],
                specials: list[str], lines: list[tuple[int, str]]) -> None:
    """One merge more for each special token: the vocabulary size counted without them."""
    extra = len(merges) - len(ref_merges)
    if extra and extra == len(specials) and (vocab is None or len(vocab) == VOCAB_SIZE + extra):
        total = len(merges) + 256 + extra
        res.findings.append(Finding("bpe_vocab_size_ignores_specials", text(
            f"asked for {VOCAB_SIZE} tokens, your trainer made {len(merges)} merges ({total} "
            f"tokens): {256 + extra} + {len(ref_merges)} merges is {VOCAB_SIZE}",
            f"要求 {VOCAB_SIZE} 个 token，你的训练做了 {len(merges)} 次合并（共 {total} 个 "
            f"token）：{256 + extra} + {len(ref_merges)} 次合并才是 {VOCAB_SIZE}"),
            *locate("bpe_vocab_size_ignores_specials", lines)))


SHOWN_RULES = ("greater_shown", "smaller_shown")  # ties among GPT-2's characters of the bytes: conventions


def compare_merges(
    res: ComponentResult,
    merges: list[R.Pair],
    ref: list[R.Pair],
    specials: list[str],
    lines: list[tuple[int, str]],
    conventions: tuple[str, ...] = ("smaller", *SHOWN_RULES),
) -> None:
    """The learner's merges against the reference's; where they differ, why (`conventions`: the tie
    rules that are conventions, see _tie_rule)."""
    same = merges == ref
    n = len(ref)
    res.checks.append(
        Check(
            text(
                f"the {n} merges on the fixture corpus equal the reference's, in order",
                f"测试语料上的 {n} 次合并与参考实现一致，顺序也一致",
            ),
            same,
        )
    )
    if same:
        res.convention = text(
            "ties broken by the lexicographically greater pair (the reference's rule)",
            "出现并列时按字节的字典序，取更大的一对（参考实现的规则）",
        )
        return
    first = next((i for i, (a, b) in enumerate(zip(merges, ref)) if a != b), min(len(merges), n))
    yours = show(merges[first]) if first < len(merges) else "none"
    theirs = show(ref[first]) if first < n else "none"
    res.checks[-1].detail = text(
        f"first difference at merge {first}: yours {yours}, the reference's {theirs}",
        f"第一处不同在合并 {first}（从 0 数）：你的是 {yours}，参考实现是 {theirs}",
    )
    _explain_difference(res, merges[:n], specials, first, yours, theirs, lines, conventions)


def _explain_difference(res: ComponentResult, kept: list[R.Pair], specials: list[str], first: int, yours: str,
                        theirs: str, lines: list[tuple[int, str]], conventions: tuple[str, ...]) -> None:
    """The first pre-tokenization under which the merges replay: its cut's mistakes, counts not
    updated, and how ties were broken; or one pair merged at every step (see `_same_pair`)."""
    if _same_pair(res, kept, first, lines):
        return
    for cut in CUTS:
        words = R.pretokenize(CORPUS, specials, cut)
        step, rule = R.replay(words, kept)
        once = R.counted_once(words, kept) if step is not None else None
        if step is not None and once is None:
            continue
        for flag in sorted(cut):
            name = CUT_DIAGNOSES[flag]
            res.findings.append(Finding(name, _explained(name, kept, words, first), *locate(name, lines)))
        if once is not None:
            res.findings.append(_counts_not_updated(len(kept), first, yours, theirs, lines))
            rule = once
        _tie_rule(res, rule, len(kept), first, yours, theirs, lines, conventions)
        return


def _same_pair(res: ComponentResult, kept: list[R.Pair], first: int, lines: list[tuple[int, str]]) -> bool:
    """Merges that are the first pair alone (once in a dict keyed by pair, or again and again in a
    list) where more were asked: the ids it counts from never change (minbpe's `merge(ids, pair, idx)`
    with its result left unused), so it found the same pair at every step. A finding, True, when so."""
    if len(set(kept)) != 1:
        return False
    pair = show(kept[0])
    res.findings.append(Finding("bpe_counts_not_updated", text(
        f"every merge your trainer made is the one pair {pair}: the ids it counts from are never updated "
        "by a merge, so it finds that pair again at each step",
        f"你的训练做出的合并都是同一对 {pair}：它计数所用的 id 合并后从没更新，每一步找到的都还是这一对"),
        *locate_form("bpe_counts_not_updated", "same_pair", lines)[1:], "same_pair"))
    return True


def _counts_not_updated(n: int, first: int, yours: str, theirs: str, lines: list[tuple[int, str]]) -> Finding:
    return Finding(
        "bpe_counts_not_updated",
        text(
            f"your {n} merges are the pairs counted before the first merge, "
            "most frequent first; "
            f"merge {first} {yours} is an old count (the reference recounts and merges {theirs})",
            f"你的 {n} 次合并就是第一次合并前数出的各对，"
            f"按次数从多到少；合并 {first}（从 0 数）{yours} "
            f"用的是旧的次数（参考实现重新计数后合并的是 {theirs}）",
        ),
        *locate("bpe_counts_not_updated", lines),
    )


TIE_CONVENTIONS = {  # a tie rule that is a convention -> (what it is, en and zh)
    "smaller": text("ties broken by the lexicographically smaller pair (the reference, like "
                    "CS336, takes the greater: the merges differ from the first tie on)",
                    "出现并列时按字节的字典序，取更小的一对（参考实现和 CS336 选更大的一对："
                    "从第一次并列起合并规则就不同了）"),
    "first": text("ties go to the pair counted first, minbpe's max(stats, key=stats.get) (the reference, "
                  "like CS336, takes the lexicographically greater: the merges differ from the first tie on)",
                  "出现并列时取最先数到的一对，即 minbpe 的 max(stats, key=stats.get)（参考实现和 CS336 "
                  "按字节的字典序选更大的一对：从第一次并列起合并规则就不同了）"),
}
TIE_CONVENTIONS |= {rule: text(
    f"ties broken by the {en} pair of GPT-2's characters of the bytes (bytes_to_unicode, as openai's "
    "encoder.py writes its merges; the reference, like CS336, compares the bytes: the merges differ from "
    "the first tie on)", f"出现并列时按 GPT-2 的字节字符（bytes_to_unicode，openai 的 encoder.py 写合并规则"
    f"用的就是它）比较，取{zh}的一对（参考实现和 CS336 比较字节：从第一次并列起合并规则就不同了）")
    for rule, en, zh in (("greater_shown", "greater", "更大"), ("smaller_shown", "smaller", "更小"))}
TIE_WORDS = {"greater_shown": ("to the greater pair of GPT-2's byte characters",
                               "按 GPT-2 的字节字符选更大的一对"),
             "smaller_shown": ("to the smaller pair of GPT-2's byte characters",
                               "按 GPT-2 的字节字符选更小的一对"),
             "smaller": ("to the smaller pair", "按并列选更小的一对"),
             "first": ("to the pair counted first", "按并列选最先数到的一对")}


def _tie_rule(res: ComponentResult, rule: str | None, n: int, first: int, yours: str, theirs: str,
              lines: list[tuple[int, str]], conventions: tuple[str, ...] = ("smaller",)) -> None:
    """How the learner's merges break ties: a convention of `conventions` (DIFFERS when nothing else
    is wrong: to the smaller pair; for minbpe's tokenizer classes, to the pair counted first too), or
    another way (a mistake)."""
    if rule in {"other", "first"} - set(conventions):
        res.findings.append(
            Finding(
                "bpe_ties_not_by_bytes",
                text(
                    f"each of your {n} merges is a most frequent pair, but the ties "
                    "among them go neither "
                    f"to the greater nor to the smaller pair of bytes (merge {first}: yours {yours}, the "
                    f"reference's {theirs})",
                    f"你的 {n} 次合并每次都是出现最多的一对，"
                    "但并列时既不是按字节的字典序取更大的，也不是更小的"
                    f"（合并 {first}，从 0 数：你的是 {yours}，参考实现是 {theirs}）",
                ),
                *locate("bpe_ties_not_by_bytes", lines),
            )
        )
    elif rule in conventions:
        res.convention = TIE_CONVENTIONS[rule]
        if not res.findings:
            res.checks[-1].ok = True
            res.status = DIFFERS
            en, zh = TIE_WORDS[rule]
            res.notes.append(text(f"with ties {en} your {n} merges are right; first tie at merge {first}: "
                                  f"yours {yours}, the reference's {theirs}",
                                  f"{zh}，你的 {n} 次合并都对；第一次并列在合并 {first}"
                                  f"（从 0 数）：你的是 {yours}，参考实现是 {theirs}"))


def _inside_special(pair: R.Pair) -> bool:
    """A merge of two or more bytes of the special token's text: trained on it."""
    return len(pair[0] + pair[1]) > 1 and pair[0] + pair[1] in SPECIAL.encode()


def _across_pretokens(pair: R.Pair) -> bool:
    """A merge that no pre-token holds whole: trained across their edges."""
    joined = (pair[0] + pair[1]).decode("utf-8", "replace")
    return R.PRETOKEN.findall(joined) != [joined]


# a cut diagnosis -> (what it trains on, in English and Chinese; a merge only that mistake makes)
CUT_WORDS: dict[str, tuple[str, str, Callable[[R.Pair], bool]]] = {
    "bpe_special_tokens_merged": ("the special token's text is trained on", "特殊 token 的文本也参与了训练",
                                  _inside_special),
    "bpe_merges_across_pretokens": ("the text is not cut into pre-tokens", "文本没有切成预分词",
                                    _across_pretokens),
    "bpe_pairs_not_weighted": ("each distinct pre-token counts once, however often it occurs",
                               "每个不同的预分词只算一次、不管它出现多少次", lambda pair: False),
}


def _explained(name: str, merges: list[R.Pair], words: Any, first: int) -> Text:
    what_en, what_zh, telling = CUT_WORDS[name]
    example = next(filter(telling, merges), merges[first])
    return text(
        f"your {len(merges)} merges are the ones trained when {what_en} (from merge {first} on they "
        f"differ from the reference's; e.g. {show(example)})",
        f"你的 {len(merges)} 次合并与{what_zh}时训练出的一致（从合并 {first} 起与参考实现不同，从 0 数；"
        f"例如 {show(example)}）",
    )


def _check_vocab(
    res: ComponentResult, vocab: dict[int, bytes], merges: list[R.Pair], specials: list[str]
) -> None:
    """Sizes, the ids 0..n-1, every byte and special token once, each merge's token; the ids'
    layout as a convention."""
    n = len(vocab)
    wanted = VOCAB_SIZE - (0 if specials else 1)
    res.checks.append(failed_check(text(f"the vocabulary has vocab_size = {wanted} tokens",
                                        f"词表有 vocab_size = {wanted} 个 token"),
                                   n == wanted, lambda: text(f"it has {n}", f"实际有 {n} 个")))
    res.checks.append(Check(text("the ids are 0 .. n - 1", "id 是 0 .. n - 1"),
                            sorted(vocab) == list(range(n))))
    single = {v: k for k, v in vocab.items() if len(v) == 1}
    res.checks.append(failed_check(text("each of the 256 bytes is a token", "256 个字节各是一个 token"),
                                   len(single) == 256,
                                   lambda: text(f"{256 - len(single)} missing",
                                                f"缺了 {256 - len(single)} 个")))
    special_ids = [k for k, v in vocab.items() if v == SPECIAL.encode()]
    if specials:
        res.checks.append(Check(text("<|endoftext|> is one token", "<|endoftext|> 是一个 token"),
                                len(special_ids) == 1))
    made, values = [m[0] + m[1] for m in merges], list(vocab.values())
    missing = [t for t in made if t not in values]
    res.checks.append(failed_check(text("each merge's token is in the vocabulary",
                                        "每次合并得到的 token 都在词表里"),
                                   not missing,
                                   lambda: text(f"{len(missing)} missing, e.g. {missing[0]!r}",
                                                f"缺了 {len(missing)} 个，例如 {missing[0]!r}")))
    if len(single) == 256:
        _vocab_layout(res, vocab, single, special_ids, made)


VOCAB_WHERE = {
    "first": ("special token first (id {i})", "特殊 token 在最前（id {i}）"),
    "last": ("special token last (id {i})", "特殊 token 在最后（id {i}）"),
    "after the bytes": ("special token right after the bytes (id {i})",
                        "特殊 token 紧跟在字节之后（id {i}）"),
    "none": ("no special token", "没有特殊 token"),
}


BYTE_ORDER = {True: ("in byte order", "按字节顺序"), False: ("in another order", "换了顺序")}


def _vocab_layout(res: ComponentResult, vocab: dict[int, bytes], single: dict[bytes, int],
                  special_ids: list[int], made: list[bytes]) -> None:
    """Where the special token and the bytes sit, as a convention; merges' ids out of order, noted."""
    n = len(vocab)
    start = min(single.values())
    in_order = all(single[bytes([b])] == start + b for b in range(256))
    order, order_zh = BYTE_ORDER[in_order]
    where = ("none" if not special_ids else "first" if special_ids[0] < start
             else "last" if special_ids[0] == n - 1 else "after the bytes")
    en, zh = (w.format(i=special_ids[0] if special_ids else "") for w in VOCAB_WHERE[where])
    layout = text(f"{en}; the 256 bytes {order} from id {start}",
                  f"{zh}；256 个字节{order_zh}，从 id {start} 开始")
    first_id = {v: k for k, v in reversed(vocab.items())}  # each token's first id
    ids = list(map(first_id.get, made))
    if ids and ids != sorted(i for i in ids if i is not None):
        res.notes.append(text("the merges' ids are not in the order of the merges",
                              "合并得到的 token 的 id 没有按合并顺序排"))
    convention = res.convention or text("", "")
    res.convention = text(f"{convention['en']}; {layout['en']}".strip("; "),
                          f"{convention['zh']}；{layout['zh']}".strip("；"))


def _time(res: ComponentResult, trainer: Trainer, exact: bool, fixture_seconds: float) -> None:
    seconds, ref_merges = reference_timing()
    limit = min(max(FACTOR * seconds, FLOOR), CEILING)
    corpus = timing_corpus()
    size = len(corpus.encode())
    start = time.process_time()
    try:
        _, merges = trainer.run(corpus, TIMING_VOCAB_SIZE, limit)
    except TrainerTimeout:
        res.notes.append(_slow(limit, seconds, size, len(ref_merges), fixture_seconds))
        return
    took = time.process_time() - start
    res.checks.append(
        Check(
            text(
                f"trains {size} bytes into {len(ref_merges)} merges within {FACTOR:g} x the reference's time",
                f"{size} 字节训练 {len(ref_merges)} 次合并，用时不超过参考实现的 {FACTOR:g} 倍",
            ),
            True,
        )
    )
    res.notes.append(
        text(
            f"timing corpus: yours {took:.2f} s, the reference {seconds:.2f} s (limit {limit:.1f} s)",
            f"计时语料：你的 {took:.2f} 秒，参考实现 {seconds:.2f} 秒（上限 {limit:.1f} 秒）",
        )
    )
    if exact and trainer.specials:
        res.checks.append(
            Check(
                text(
                    "its merges on the timing corpus equal the reference's too",
                    "计时语料上的合并也与参考实现一致",
                ),
                merges == ref_merges,
            )
        )


def _slow(limit: float, seconds: float, size: int, merges: int, fixture_seconds: float) -> Text:
    """Slow is not wrong: a trainer that recounts every pair after each merge (minbpe's) makes the
    right merges; it is told how much slower it is, measured, and passes on its merges."""
    factor = limit / seconds
    start = time.process_time()
    R.train(CORPUS, VOCAB_SIZE, [SPECIAL])  # the reference on the fixture corpus, timed now
    ref_fixture = time.process_time() - start
    fixture = fixture_seconds / ref_fixture
    return text(
        f"slow: on the fixture corpus it took {fixture_seconds:.2f} s, {fixture:.1f} x the reference's "
        f"{ref_fixture:.2f} s; on the timing corpus ({size} bytes, {merges} merges) it was stopped after "
        f"{limit:.1f} s, "
        f"more than {factor:.0f} x the reference's {seconds:.2f} s on this machine, so its merges there "
        "were not compared (the fixture's were). Recounting every pair after each merge is correct but "
        "slow; counting once and updating only the words that hold the merged pair is fast",
        f"慢：在测试语料上用了 {fixture_seconds:.2f} 秒，"
        f"是参考实现（{ref_fixture:.2f} 秒）的 {fixture:.1f} 倍；"
        f"在计时语料（{size} 字节，{merges} 次合并）上训练 {limit:.1f} 秒后被停下，超过参考实现"
        f"（这台机器上 {seconds:.2f} 秒）的 {factor:.0f} 倍，所以那里的合并没有比较（测试语料上的比较了）。"
        "每次合并后重新统计所有的对是对的，只是慢；只数一次、之后只更新含有这一对的词就快了",
    )
