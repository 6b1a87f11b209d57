"""The runner of the BPE encoder and decoder: `Tokenizer(vocab, merges, special_tokens)` with
`encode` and `decode`, or functions `encode(text, vocab, merges, special_tokens)` and
`decode(ids, vocab)` (the trainer is graded by bpe.py).

They are given the reference's vocabulary and merges (so they are graded whatever the trainer
does) and run on English, indented code, Chinese, emoji, special tokens (one inside another too)
and text decoded from invalid UTF-8 with errors="replace": ids equal the reference's,
decode(encode(text)) == text, and ids whose bytes are not UTF-8 decode to U+FFFD. Ids that differ
are explained by the reference's encoding with each named mistake, and each pair of them.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable
from functools import cache
from typing import Any

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, finish
from handformer.check.core.deadline import TrainerTimeout, deadline
from handformer.check.core.discovery import Component, DiscoveryError, own_objects
from handformer.check.core.result import Check, ComponentResult, Finding, LearnerError, failed_check, text
from handformer.check.core.source import locate, locate_form, source_lines
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import SPECIAL
from handformer.check.runners import fixed_tokenizer
from handformer.check.runners.bpe import own_splitter, reference_fixture
from handformer.check.runners.bpe_alphabet import encoder_in, own_alphabet, own_vocab, written_in

# a codec argument's role by the words in its name, tried in order
ROLE_WORDS = ((("special",), "special"), (("rank",), "ranks"), (("merge",), "merges"),
              (("encoder",), "encoder"), (("vocab", "id_to_token", "itos", "tokens"), "vocab"))
CODEC_LIMIT = 10.0  # seconds for all of encode and decode on the six texts
OVERLAP = SPECIAL + SPECIAL  # a special token that holds another
TEXTS = {
    "English": "Hello, world! It's 2026, and there the other tokenizer's merges are trained.",
    "indented code": "def f(x):\n    if x:\n        return x + 1\n    return 0\n",
    "Chinese": "我们今天训练一个分词器，然后用它分词。",
    "emoji": "🙂 👍🏽 🎉 👨‍👩‍👧 🇨🇳 ok",
    "special tokens": f"one{SPECIAL}two{OVERLAP}three {SPECIAL}",
    "invalid UTF-8": b"ok \xff\xfe bytes \xe4\xbd and \xf0\x9f".decode("utf-8", errors="replace"),
}
ENCODE_FLAGS = (
    "specials_ignored",
    "specials_shortest_first",
    "across_pretokens",
    "order_leftmost",
    "order_latest",
    "order_reversed",
)
ENCODE_DIAGNOSES = {
    "specials_ignored": "bpe_special_token_split",
    "specials_shortest_first": "bpe_overlapping_specials",
    "across_pretokens": "bpe_merges_across_pretokens",
    "order_leftmost": "bpe_encode_merge_order",
    "order_latest": "bpe_encode_merge_order",
    "order_reversed": "bpe_encode_merge_order",
}
# the mistakes tried: one, then two (two orders never together)
ENCODE_TRIED = [frozenset(c) for n in (1, 2) for c in itertools.combinations(ENCODE_FLAGS, n)
                if sum(f.startswith("order_") for f in c) < 2]
ORDER_FORMS = {
    "leftmost": (
        "the leftmost pair that has a rank goes first, not the earliest learnt",
        "先合并最左边能合并的一对，而不是最早学到的那一对",
    ),
    "latest": (
        "the pair learnt last goes first, not the earliest learnt",
        "先合并最晚学到的那一对，而不是最早学到的",
    ),
    "reversed": (
        "the merges are applied from the last learnt to the first",
        "合并规则从最后学到的一条往前用",
    ),
}



@cache
def tokenizer_inputs() -> tuple[dict[int, bytes], list[R.Pair], list[str]]:
    """The reference's vocabulary and merges on the fixture corpus, with one more special token
    that holds the first (so which one wins can be seen)."""
    vocab, merges = reference_fixture()
    return vocab | {len(vocab): OVERLAP.encode()}, merges, [SPECIAL, OVERLAP]


class Codec:
    """The learner's encode and decode: methods of a class built with (vocab, merges,
    special_tokens), or functions of (text, vocab, merges, special_tokens) and (ids, vocab)."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        self.roles: set[str] = set()  # what the learner's code is handed (a codec without special tokens)
        vocab, merges, specials = tokenizer_inputs()
        # tiktoken's mergeable_ranks: each token's bytes -> its rank, which is its id (no special token)
        ranks = {token: i for i, token in vocab.items() if token.decode(errors="replace") not in specials}
        self.values = {"vocab": dict(vocab), "merges": list(merges), "special": list(specials),
                       "ranks": ranks, **R.shown_inputs(vocab, merges)}
        if "encoder" in inspect.signature(comp.obj).parameters:  # GPT-2's Encoder(encoder, bpe_merges)
            self.values["merges"] = self.values["shown_merges"]
        self.vocab = vocab  # the ids it is graded with: the reference's, or its own (built from merges alone)
        if inspect.isclass(comp.obj):
            obj = self._built(comp, ctx, vocab, merges)
            for method in ("encode", "decode"):
                if not callable(getattr(obj, method, None)):
                    raise ctx.learner.fail(
                        "__init__",
                        f"{comp.name} has no {method} method; give it "
                        f"encode(self, text) -> list[int] and decode(self, ids) -> str",
                        f"{comp.name} 没有 {method} 方法；请给它 encode(self, text) -> list[int] 和 "
                        "decode(self, ids) -> str",
                    )
            self.encode_fn, self.decode_fn = obj.encode, obj.decode
        else:
            decode = fixed_tokenizer.decoder_beside(comp, own_objects(ctx.module))
            self._kwargs(comp.obj, first="")  # what encode is handed, known before it runs
            self.encode_fn = lambda s: comp.obj(**self._kwargs(comp.obj, first=s))
            self.decode_fn = lambda ids: decode(**self._kwargs(decode, first=ids))

    def _built(self, comp: Component, ctx: Context, vocab: dict[int, bytes], merges: list[R.Pair]) -> Any:
        """The class built with the inputs it takes; over a byte alphabet of its own (bpe_alphabet.py),
        handed them in it, and graded with its own ids where it is handed no vocabulary."""
        alphabet = own_alphabet(comp.obj, ctx.module)
        if alphabet is None:
            return ctx.learner.call("__init__", comp.obj, **self._kwargs(comp.obj.__init__, skip=1))
        self.values.update(merges=written_in(alphabet, merges), encoder=encoder_in(alphabet, vocab))
        obj = ctx.learner.call("__init__", comp.obj, **self._kwargs(comp.obj.__init__, skip=1))
        if not self.roles & {"vocab", "encoder", "ranks", "special"}:
            self.vocab = own_vocab(obj, alphabet, merges, vocab)
        return obj

    def _kwargs(self, fn: Callable[..., Any], skip: int = 0, first: Any = None) -> dict[str, Any]:
        params = [
            p
            for p in list(inspect.signature(fn).parameters.values())[skip:]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        out: dict[str, Any] = {}
        given = {**self.values, "first": first}
        for i, p in enumerate(params):
            name = p.name.lower()
            first_role = ["", "first"][i == 0 and first is not None]
            role = next((r for words, r in ROLE_WORDS if any(w in name for w in words)), first_role)
            out.update({p.name: given[role]} if role else {})
            self.roles.add(role)
            if not role and p.default is p.empty:
                raise DiscoveryError(
                    f"cannot fill the argument {p.name!r} of {getattr(fn, '__qualname__', fn)}"
                    f"{inspect.signature(fn)}: handformer passes vocab, merges and "
                    "special_tokens by name; rename it or give it a default",
                    zh=f"填不了 {getattr(fn, '__qualname__', fn)}{inspect.signature(fn)} 的参数 {p.name!r}："
                       "handformer 按名字传入 vocab、merges 和 special_tokens；请改名，或给它一个默认值"
                )
        return out

    def encode(self, s: str) -> list[int]:
        out = self.ctx.learner.call("encode", self.encode_fn, s)
        if not isinstance(out, str) and fp.quietly(lambda: set(map(type, out))) == {str}:
            raise _subword_strings()  # subword-nmt's form: a valid tokenizer check cannot compare by ids
        try:
            return list(map(int, out))
        except (TypeError, ValueError):
            raise self.ctx.learner.fail(
                "encode", f"encode returned {type(out).__name__}; return a list of int ids",
                f"encode 返回了 {type(out).__name__}；应当返回 int id 的列表"
            ) from None

    def decode(self, ids: list[int]) -> str:
        return self.ctx.learner.call("decode", self.decode_fn, list(ids))


def _subword_strings() -> DiscoveryError:
    """encode returned the subwords themselves: the reference's ids say nothing of them (NOT CHECKED)."""
    return DiscoveryError(
        "encode returns subword strings, not ids; check compares a tokenizer by its ids (an adapter "
        "whose encode maps each subword to its id in your vocabulary lets check grade it)",
        zh="encode 返回的是子词字符串，不是 id；检查程序按 id 比较分词器（写一个适配函数，"
           "让 encode 把每个子词换成它在你的词表里的 id，检查程序就能判断）")


def check_bpe_tokenizer(comp: Component, ctx: Context) -> ComponentResult:

    """encode and decode against the reference, on the reference's vocabulary and merges; a loop
    that never ends is stopped after CODEC_LIMIT seconds."""
    if fixed_tokenizer.fixed(comp):  # built with nothing: no reference for its ids
        return fixed_tokenizer.check_fixed_tokenizer(comp, ctx)
    try:
        with deadline(CODEC_LIMIT):
            return _check_codec(comp, ctx)
    except TrainerTimeout:
        raise fp.LearnerFailure(
            LearnerError(
                "timeout",
                f"encode and decode did not finish six short texts within {CODEC_LIMIT:g} s: a loop "
                "that never ends (a merge loop whose word never gets shorter?)",
                "encode",
            )
        ) from None


def _check_codec(comp: Component, ctx: Context) -> ComponentResult:
    """Graded under the learner's own pre-tokenizer when their code calls one (the reference encodes
    so too), and without special tokens when it is handed none (tiktoken's SimpleBytePairEncoding)."""
    res = ctx.result(comp)
    vocab, merges, specials = tokenizer_inputs()
    codec, split = Codec(comp, ctx), own_splitter(comp, ctx)
    vocab = codec.vocab
    if "special" not in codec.roles:
        specials = []
        res.notes.append(text("your encoder takes no special tokens: graded without them (the special "
                              "tokens' text is ordinary text)",
                              "你的编码器不接收特殊 token：按没有特殊 token 评判"
                              "（特殊 token 的文本是普通文本）"))
    res.notes += [text(f"graded with your own pre-tokenizer ({getattr(split, '__name__', '')})",
                       f"用你自己的预分词函数（{getattr(split, '__name__', '')}）评判")] * (split is not None)
    with R.split_by(split) if split is not None else contextlib.nullcontext():
        grade_codec(res, codec, vocab, merges, specials, source_lines(ctx.objects(comp)))
    return finish(res)


def grade_codec(res: ComponentResult, codec: Codec, vocab: dict[int, bytes], merges: list[R.Pair],
                specials: list[str], lines: list[tuple[int, str]]) -> None:
    """The ids of each text against the reference's on this vocabulary and merges, the mistakes
    that explain a difference, then decode."""
    ref = {k: R.encode(s, vocab, merges, specials) for k, s in TEXTS.items()}
    ours = {k: codec.encode(s) for k, s in TEXTS.items()}
    for k in TEXTS:
        res.checks.append(failed_check(
            text(f"encode ({k}) gives the reference's ids", f"encode（{_ZH[k]}）与参考实现的 id 一致"),
            ours[k] == ref[k],
            lambda k=k: text(f"{len(ours[k])} ids, the reference {len(ref[k])}",
                             f"{len(ours[k])} 个 id，参考实现 {len(ref[k])} 个")))
    if ours != ref:
        _explain_encode(res, ours, ref, vocab, merges, specials, lines)
    _check_decode(res, codec, ref, vocab, lines)


_ZH = {
    "English": "英文",
    "indented code": "缩进的代码",
    "Chinese": "中文",
    "emoji": "emoji",
    "special tokens": "特殊 token",
    "invalid UTF-8": "非法 UTF-8",
}


def _explain_encode(
    res: ComponentResult,
    ours: dict[str, list[int]],
    ref: dict[str, list[int]],
    vocab: dict[int, bytes],
    merges: list[R.Pair],
    specials: list[str],
    lines: list[tuple[int, str]],
) -> None:
    for flags in ENCODE_TRIED:
        variant = {k: R.encode(s, vocab, merges, specials, flags) for k, s in TEXTS.items()}
        if variant != ours:
            continue
        for flag in sorted(flags):
            name = ENCODE_DIAGNOSES[flag]
            which = next(
                k
                for k in TEXTS
                if variant[k] != ref[k]
                and R.encode(TEXTS[k], vocab, merges, specials, frozenset({flag})) != ref[k]
            )
            form = flag.partition("order_")[2]  # the order's form ("" for the other flags)
            res.findings.append(_encode_finding(name, form, which, ours, ref, lines))
        return


def _encode_finding(name: str, form: str, which: str, ours: dict[str, list[int]], ref: dict[str, list[int]],
                    lines: list[tuple[int, str]]) -> Finding:
    en, zh = ORDER_FORMS.get(form, ("", ""))
    en, zh = (f" ({en})", f"（{zh}）") if en else ("", "")
    return Finding(name, text(
        f"your ids equal the encoding with this mistake{en} on all {len(TEXTS)} texts; on the "
        f"{which} text you give {len(ours[which])} ids, the reference {len(ref[which])}",
        f"在全部 {len(TEXTS)} 段文本上，你的 id 与带这个错误的编码一致{zh}；{_ZH[which]}那段你给出 "
        f"{len(ours[which])} 个 id，参考实现 {len(ref[which])} 个"),
        *locate_form(name, form, lines)[1:], form)


def _check_decode(
    res: ComponentResult,
    codec: Codec,
    ref: dict[str, list[int]],
    vocab: dict[int, bytes],
    lines: list[tuple[int, str]],
) -> None:
    _decode_invalid(res, codec, vocab, lines)
    per_token = []
    for k, s in TEXTS.items():
        try:
            back = codec.decode(ref[k])
        except fp.LearnerFailure as failure:
            if failure.error.message.startswith("UnicodeDecodeError") and res.has("bpe_decode_strict"):
                continue
            raise
        res.checks.append(Check(text(f"decode(encode(text)) == text ({k})",
                                     f"decode(encode(text)) == text（{_ZH[k]}）"), back == s))
        if back != s and back == R.decode(ref[k], vocab, per_token=True):
            per_token.append((k, back))
    if per_token:
        k, back = per_token[0]
        res.findings.append(Finding("bpe_decode_per_token", text(
            f"your decode of the {k} text equals each token decoded on its own: {back.count(chr(0xFFFD))} "
            f"U+FFFD where a character's bytes are split over tokens ({len(per_token)} of {len(TEXTS)} "
            "texts)",
            f"你对{_ZH[k]}那段的 decode 与逐个 token 单独解码的结果一致：一个字的字节分在几个 token 里的地方"
            f"出现了 {back.count(chr(0xFFFD))} 个 U+FFFD（{len(TEXTS)} 段中有 {len(per_token)} 段）"),
            *locate("bpe_decode_per_token", lines)))


def _decode_invalid(res: ComponentResult, codec: Codec, vocab: dict[int, bytes],
                    lines: list[tuple[int, str]]) -> None:
    """Ids whose bytes are not UTF-8 (half of a Chinese character, 0xff) decode to U+FFFD; raising
    UnicodeDecodeError is the mistake bpe_decode_strict."""
    ids = {b: i for i, b in vocab.items()}
    broken = [ids[b"\xe4"], ids[b"\xbd"], ids[b" "], ids[b"\xff"]]  # half of a Chinese character; not UTF-8
    wanted = R.decode(broken, vocab)
    try:
        out = codec.decode(broken)
    except fp.LearnerFailure as failure:
        if not failure.error.message.startswith("UnicodeDecodeError"):
            raise
        res.findings.append(Finding("bpe_decode_strict", text(
            f"decode of {len(broken)} ids whose bytes are not UTF-8 raised {failure.error.message[:120]}; "
            f'with errors="replace" they decode to {wanted!r}',
            f"对字节不是合法 UTF-8 的 {len(broken)} 个 id 做 decode 时抛出了 {failure.error.message[:120]}；"
            f'用 errors="replace" 应该得到 {wanted!r}'), *locate("bpe_decode_strict", lines)))
        return
    res.checks.append(failed_check(text('ids whose bytes are not UTF-8 decode to U+FFFD (errors="replace")',
                                        '字节不是合法 UTF-8 的 id 解码成 U+FFFD（errors="replace"）'),
                                   out == wanted,
                                   lambda: text(f"{out!r}, not {wanted!r}",
                                                f"得到 {out!r}，而不是 {wanted!r}")))
