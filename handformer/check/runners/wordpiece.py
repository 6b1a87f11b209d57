"""The runner of a WordPiece tokenizer (BERT's): a trainer written as free functions
(`train_wordpiece(corpus, vocab_size)` with an encoder of a word, one of a text, and a decoder beside
it), a class with train, encode and decode methods, or a class built on a vocabulary with no trainer
(BERT's WordpieceTokenizer(vocab), FullTokenizer(vocab_file): built on the reference's); found by its
code's "##" (core/wordpiece_parts.py).

It is trained on the fixture corpus below; the tokens it learns (its vocabulary in id order, less the
characters and the special tokens) are compared with the reference's (reference/wordpiece_reference.py,
ties to the pair counted first). A difference is explained by replay: each learnt token must be made
by a best-scoring pair once the ones before it are merged; when so, only the ties differ (a convention,
DIFFERS); when the replay holds under a mistake (a cut by spaces alone, a score that is the frequency,
no "##"), that mistake is named. Then its encoders run on words and texts, with its own vocabulary,
against the reference's longest-match-first, and its decoder on their pieces.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

from handformer.check.catalog.tokenizer import WORDPIECE_LINES
from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, finish
from handformer.check.core.deadline import TrainerTimeout, deadline
from handformer.check.core.discovery import Component
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
from handformer.check.core.source import first_line, functions_called, methods_called, source_lines
from handformer.check.core.weights import MappingError
from handformer.check.reference import wordpiece_reference as R
from handformer.check.reference.diagnoses import CATALOG
from handformer.check.runners import wordpiece_calls as P

CORPUS = [
    "the quick tokenizer splits words into pieces, and the pieces into smaller pieces.",
    "a tokenizer learns its vocabulary from the words it sees: hugging, hugged, hugs and hug.",
    "wordpiece merges the pair whose score is highest, not the pair seen most often.",
    "the score divides how often the pair occurs by how often each of its parts occurs.",
    "question: which pieces does the tokenizer keep? the ones that score best!",
    "unbreakable words stay unknown, and unknown words become one unknown token.",
]
VOCAB_SIZE = 120
# the words encoded one by one: seen, unseen, one with a character never inside a word ("q": [UNK]
# after a piece), one with a character never seen ("j"); LONG has MAX_CHARS + 2 characters
WORDS = ("tokenizer", "hugging", "pieces", "scores", "unquiet", "jug", "understood", "the", "a")
# the texts decoded, and encoded without their punctuation (an encoder may cut its text by spaces alone:
# BERT's WordpieceTokenizer runs after the tokenizer that cuts the punctuation off)
TEXTS = ("the tokenizer keeps hugging pieces, not words!", "unknown scores: often the best pair.")
SPOKEN = tuple(re.sub(r"[^\w\s]", "", t) for t in TEXTS)
MAX_CHARS, LONG = 8, "tokenizers"
LIMIT = 10.0  # seconds for all of it: only a loop that never ends comes near
# (cut, score, "##") of a trainer that the replay explains, and its diagnosis and form
TRAIN_MISTAKES = (("whitespace", "score", True, "bpe_merges_across_pretokens", "whitespace"),
                  ("text", "score", True, "bpe_merges_across_pretokens", "text"),
                  ("words", "frequency", True, "wordpiece_pair_score", "frequency"),
                  ("words", "first_only", True, "wordpiece_pair_score", "first_only"),
                  ("words", "second_only", True, "wordpiece_pair_score", "second_only"),
                  ("words", "sum", True, "wordpiece_pair_score", "sum"),
                  ("words", "score", False, "wordpiece_missing_prefix", "train"))
ENCODE_DIAGNOSES = {"shortest": "wordpiece_shortest_match", "no_prefix": "wordpiece_missing_prefix",
                    "unk_piece": "wordpiece_unk_piece", "unk_skip": "wordpiece_unk_piece"}
ENCODE_TRIED = [frozenset(c) for n in (1, 2) for c in itertools.combinations(ENCODE_DIAGNOSES, n)
                if not {"unk_piece", "unk_skip"} <= set(c)]
DECODE_DIAGNOSES = dict.fromkeys(("spaced", "kept", "glued_kept"), "wordpiece_decode_continuation")
DECODE_TRIED = [frozenset({f}) for f in DECODE_DIAGNOSES]
DIAGNOSES = {**ENCODE_DIAGNOSES, **DECODE_DIAGNOSES}  # a mistake of encode or decode -> its diagnosis
PUNCTUATION_SPACE = re.compile(r"\s+(?=[^\w\s#])")  # a space before a punctuation mark (not "##")
# a token learnt: two characters or more, "##" left out; not a special token ([UNK], <pad>)
LEARNT = re.compile(r"(?!\[[A-Za-z_]+\]$|<[^<>\s]+>$|##.$).{2,}", re.S)
Reference = Callable[[frozenset[str]], list[Any]]  # the reference's outputs with a set of mistakes


def check_wordpiece(comp: Component, ctx: Context) -> ComponentResult:
    """The kind's runner; a loop of the learner's that never ends stopped after LIMIT seconds."""
    try:
        with deadline(LIMIT):
            return _check(comp, ctx)
    except TrainerTimeout:
        raise fp.LearnerFailure(LearnerError(
            "timeout", f"training, encode and decode did not finish within {LIMIT:g} s: a loop that never "
            "ends (a position that never moves on?)", "encode",
            message_zh=f"训练、encode 和 decode 在 {LIMIT:g} 秒内没有结束：循环停不下来"
                       "（位置一直没有前进？）")) from None


def _check(comp: Component, ctx: Context) -> ComponentResult:
    """Train on the fixture corpus, compare the tokens learnt, then grade its encoders and decoder
    with its own vocabulary."""
    res = ctx.result(comp)
    tok = P.parts(comp, ctx, CORPUS, VOCAB_SIZE)
    if tok.trained:
        _grade_training(res, ctx, comp, tok)
    else:
        res.notes.append(text(f"built on the reference's vocabulary of the fixture corpus ({len(tok.tokens)} "
                              "tokens): nothing of yours trained", f"用参考实现在测试语料上训练出的词表"
                              f"（{len(tok.tokens)} 个 token）构造：没有训练你的代码"))
    for name, encode, one_word in tok.encoders:
        _grade_encoder(res, ctx, comp, tok, (name, encode), WORDS if one_word else WORDS + SPOKEN)
        _grade_max_chars(res, ctx, tok, name, encode)
    if tok.decode is not None:
        _grade_decoder(res, ctx, comp, tok)
    return finish(res)


def learnt_tokens(tokens: list[str]) -> list[str]:
    """The tokens a trainer learnt, in id order: not a character (with its "##" or not), not a special
    token ([UNK], <pad>)."""
    return list(filter(LEARNT.fullmatch, tokens))


def _grade_training(res: ComponentResult, ctx: Context, comp: Component, tok: P.Parts) -> None:
    """The tokens learnt against the reference's first ones, in order; the vocabulary's size."""
    learnt = learnt_tokens(tok.tokens)
    if not learnt:
        raise MappingError("its vocabulary holds no token of two characters or more after training: "
                           "nothing learnt to compare",
                           zh="训练后它的词表里没有两个字符以上的 token：没有学到的东西可比较")
    n = len(learnt)
    ref = list(dict.fromkeys(itertools.starmap(R.joined, R.train(CORPUS, n + 20))))[:n]
    said = text(f"the {n} tokens learnt on the fixture corpus equal the reference's, in order",
                f"测试语料上学到的 {n} 个 token 与参考实现一致，顺序也一致")
    res.checks.append(Check(said, learnt == ref))
    size = len(tok.tokens)
    if "vocab_size" in tok.handed:
        res.checks.append(failed_check(text(f"the vocabulary has vocab_size = {VOCAB_SIZE} tokens",
                                            f"词表有 vocab_size = {VOCAB_SIZE} 个 token"), size == VOCAB_SIZE,
                                       lambda: text(f"it has {size}", f"实际有 {size} 个")))
    if learnt == ref:
        res.convention = text("ties go to the pair counted first (the reference's rule, the Hugging Face "
                              "course's `if max_score < score`)", "出现并列时取最先数到的一对（参考实现的"
                              "规则，Hugging Face 课程的 `if max_score < score`）")
        return
    first = next(i for i, (a, b) in enumerate(zip(learnt, ref)) if a != b)
    res.checks[0].detail = text(f"first difference at token {first}: yours {learnt[first]!r}, the "
                                f"reference's {ref[first]!r}", f"第一处不同在 token {first}（从 0 数）："
                                f"你的是 {learnt[first]!r}，参考实现是 {ref[first]!r}")
    _explain_training(res, ctx, comp, (learnt, ref), first)


def _sorted_vocabulary(res: ComponentResult, learnt: list[str], ref: list[str]) -> None:
    """A vocabulary handed back sorted (`sorted(vocab)`): the order its tokens were learnt in is lost.
    The reference's tokens are a convention (DIFFERS); other tokens are not checked, since ties broken
    another way change which tokens are learnt and the lost order cannot be replayed."""
    if set(learnt) != set(ref):
        raise MappingError("its vocabulary comes back sorted, so the order its tokens were learnt in is "
                           "lost and cannot be replayed, and its tokens are not the reference's: keep the "
                           "tokens in the order they are learnt (ids in merge order)",
                           zh="它的词表按排序返回，学到 token 的顺序丢了，无法重放，而且 token 与参考实现"
                              "不同：请按学到的顺序保存 token（id 按合并顺序）")
    res.checks[0].ok, res.status = True, DIFFERS
    res.convention = text("the vocabulary comes back sorted: the reference's tokens, the order they were "
                          "learnt in not kept", "词表按排序返回：token 与参考实现相同，学到的顺序没有保留")


def _explain_training(res: ComponentResult, ctx: Context, comp: Component,
                      tokens: tuple[list[str], list[str]], first: int) -> None:
    """Ties broken another way (DIFFERS), a mistake the replay names, a vocabulary handed back sorted, or
    a token no best pair makes; `tokens`: (yours, the reference's) learnt."""
    learnt, ref = tokens
    step, n = R.replay(CORPUS, learnt), len(learnt)
    if step is None:
        res.checks[0].ok, res.status = True, DIFFERS
        res.convention = text("ties broken another way than by the pair counted first (the reference's "
                              "rule): the tokens differ from the first tie on",
                              "出现并列时不是取最先数到的一对（参考实现的规则）：从第一次并列起 "
                              "token 就不同了")
        res.notes.append(text(f"each of your {n} tokens is made by a best-scoring pair; first tie at token "
                              f"{first}", f"你的 {n} 个 token 每个都由得分最高的一对合并而来；第一次并列在 "
                              f"token {first}（从 0 数）"))
        return
    for cut, rule, prefix, name, form in TRAIN_MISTAKES:
        if R.replay(CORPUS, learnt, cut, rule, prefix) is None:
            observed = text(f"your {n} tokens are the ones learnt with this mistake ({form}); from token "
                            f"{first} on they differ from the reference's", f"你的 {n} 个 token 与带这个错误"
                            f"（{form}）训练出的一致；从 token {first}（从 0 数）起与参考实现不同")
            res.findings.append(Finding(name, observed, *_line(name, comp.obj, ctx, comp), form))
            return
    if n > 2 and learnt == sorted(learnt):  # neither ties nor a mistake explain it: the order was lost
        return _sorted_vocabulary(res, learnt, ref)
    res.checks[0].detail = text(f"token {step}, {learnt[step]!r}, is made by no best-scoring pair once the "
                                "tokens before it are merged", f"token {step}（从 0 数）{learnt[step]!r} 在"
                                "合并它之前的 token 后，不是由得分最高的一对合并而来")


def _grade_encoder(res: ComponentResult, ctx: Context, comp: Component, tok: P.Parts,
                   named: tuple[str, Callable[[str], Any]], inputs: tuple[str, ...]) -> None:
    """The encoder's pieces on `inputs` against the reference's with its own vocabulary."""
    name, encode = named
    vocab = set(tok.tokens)
    yours = [tok.pieces(ctx.learner.call(name, encode, x)) for x in inputs]
    said = text(f"{name} gives the reference's pieces (longest match first, \"##\" inside a word, {tok.unk} "
                f"for a word it cannot split) on {len(inputs)} inputs", f"{name} 在 {len(inputs)} 个输入上"
                f"切出的片段与参考实现一致（最长匹配优先，词中间加 \"##\"，切不开的词是 {tok.unk}）")
    _compare(res, ctx, comp, (name, encode, said), (inputs, yours),
             lambda flags: [R.tokenize(x, vocab, flags, tok.unk) for x in inputs], ENCODE_TRIED)


def _grade_decoder(res: ComponentResult, ctx: Context, comp: Component, tok: P.Parts) -> None:
    """decode of the reference's pieces of each text gives its words joined by spaces (a space before a
    punctuation mark may be cleaned up)."""
    name, decode = tok.decode
    vocab = set(tok.tokens)
    encoded = map(lambda t: R.tokenize(t, vocab, unk=tok.unk), TEXTS + WORDS)
    pieces = list(filter(lambda p: tok.unk not in p, encoded))  # the words it cannot split left out
    yours = [_spaced(ctx.learner.call(name, decode, tok.handed_pieces(decode, p))) for p in pieces]
    said = text(f"{name} gives the words back from their pieces (a \"##\" piece glued onto the word before "
                f"it) on {len(pieces)} inputs", f"{name} 在 {len(pieces)} 个输入上把片段还原成词（\"##\" "
                "片段接到前一个词上）")
    _compare(res, ctx, comp, (name, decode, said), (tuple(map(" ".join, pieces)), yours),
             lambda flags: [_spaced(R.decode(p, flags)) for p in pieces], DECODE_TRIED)


def _compare(res: ComponentResult, ctx: Context, comp: Component, part: tuple[str, Any, Text],
             given: tuple[tuple[str, ...], list[Any]], reference: Reference, tried: list[frozenset[str]],
             ) -> None:
    """A check that the part's outputs (`given`: the inputs as shown, its outputs) are the reference's;
    where not, the fewest mistakes of `tried` that reproduce them, each named once (DIAGNOSES)."""
    name, fn, said = part
    shown, yours = given
    same = yours == reference(frozenset())
    res.checks.append(failed_check(said, same, lambda: _first_difference(shown, yours,
                                                                         reference(frozenset()))))
    flags = next((f for f in tried if not same and yours == reference(f)), frozenset())
    for flag in sorted(flags):
        diagnosis = DIAGNOSES[flag]
        observed = text(f"{name}'s outputs are the reference's with this mistake ({flag}) on all "
                        f"{len(shown)} inputs", f"{name} 在全部 {len(shown)} 个输入上的结果都与带这个错误"
                        f"（{flag}）的参考实现一致")
        if not res.has(diagnosis):
            res.findings.append(Finding(diagnosis, observed, *_line(diagnosis, fn, ctx, comp), flag))


def _first_difference(inputs: tuple[str, ...], yours: list[Any], ref: list[Any]) -> Text:
    x, a, b = next((x, a, b) for x, a, b in zip(inputs, yours, ref) if a != b)
    return text(f"{x!r}: yours {a!r}, the reference's {b!r}", f"{x!r}：你的是 {a!r}，参考实现是 {b!r}")


def _grade_max_chars(res: ComponentResult, ctx: Context, tok: P.Parts, name: str, encode: Callable[..., Any],
                     ) -> None:
    """A word longer than the encoder's `max_input_chars_per_word` is [UNK]; one of that length is not."""
    limit = P.max_argument(encode)
    if limit is None:
        return
    long, fits = (tok.pieces(ctx.learner.call(name, encode, w, **{limit: MAX_CHARS}))
                  for w in (LONG, LONG[:-2]))
    res.checks.append(failed_check(
        text(f"{name}(..., {limit}={MAX_CHARS}) gives {LONG!r} ({len(LONG)} characters) as {tok.unk}, and "
             f"not {LONG[:-2]!r}", f"{name}(..., {limit}={MAX_CHARS}) 把 {LONG!r}（{len(LONG)} 个字符）切成 "
             f"{tok.unk}，{LONG[:-2]!r} 不是"), long == [tok.unk] != fits,
        lambda: text(f"yours: {long} and {fits}", f"你的：{long} 和 {fits}")))


def _spaced(out: Any) -> Any:
    """A decoded text with the spaces before punctuation marks left out (Hugging Face's clean-up)."""
    return PUNCTUATION_SPACE.sub("", str(out))


def _line(name: str, fn: Any, ctx: Context, comp: Component) -> tuple[int | None, str | None]:
    """The line a finding quotes: in the function that shows the mistake and the ones it calls first,
    then in the component and the rest of the file."""
    fn = getattr(fn, "__func__", fn)
    near = [fn, *functions_called(fn), *methods_called(fn)]
    patterns = WORDPIECE_LINES.get(name, CATALOG[name].patterns)
    found = [first_line(patterns, tier) for tier in (source_lines(near), source_lines(ctx.objects(comp)))]
    return min(found, key=lambda line: line[0] is None)  # the first tier's, where it finds one
