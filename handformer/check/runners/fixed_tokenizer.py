"""A tokenizer built with nothing (`Tokenizer()`: a byte tokenizer, or a stand-in for a SentencePiece
model) and nothing to train: it has no vocabulary or merges check could hand it, so there is no
reference for its ids. What it must do whatever its ids: give each text back from its ids (decode after
encode), and, where encode takes flags for BOS and EOS (Meta's `encode(s, bos, eos)`), put its own BOS id
first and its EOS id last and nothing else around the text's ids."""

from __future__ import annotations

import inspect
import re
import types
from typing import Any

from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, DiscoveryError, init_parameters, own_objects
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, global_reads, source_lines

# encode's flags for the special tokens, by name -> the token; the attributes that hold each one's id
FLAG_OF = {**dict.fromkeys(("bos", "add_bos", "add_bos_token", "prepend_bos"), "bos"),
           **dict.fromkeys(("eos", "add_eos", "add_eos_token", "append_eos"), "eos")}
ID_NAMES = {"bos": ("bos_id", "bos_token_id", "bos_idx"), "eos": ("eos_id", "eos_token_id", "eos_idx")}
# what a tokenizer with a reference is handed, and the methods of one that trains
BUILT_WITH = {"vocab", "merges", "ranks", "encoder", "special_tokens", "vocab_file", "merges_file",
              "model_path", "model_file", "path", "train", "fit", "learn"}
# the decoder beside an encode function, by name
DECODE_NAMES = ("decode", "bpe_decode", "decode_bpe", "detokenize", "decode_ids")
TEXTS = ("hello world", "[INST] What is 2+2? [/INST]", "a  b\n\tc!")


def fixed(comp: Component) -> bool:
    """A class built with no argument and no method that trains; a function of the text alone that reads
    a character vocabulary of its own (`encode(s)`: `[stoi[c] for c in s]`)."""
    if not inspect.isclass(comp.obj):
        return char_vocabulary(comp.obj) is not None
    params = init_parameters(comp.obj)
    names = {p.name for p in params} | set(dir(comp.obj))
    required = [p for p in params if p.default is p.empty]
    return not required and not names & BUILT_WITH


def _flags(encode: Any) -> dict[str, str]:
    """Each special token ('bos', 'eos') -> the name of encode's flag for it; an argument beyond the text
    that is no such flag and has no default: NOT CHECKED."""
    params = list(inspect.signature(encode).parameters.values())[1:]
    other = [p.name for p in params if p.name.lower() not in FLAG_OF and p.default is p.empty]
    if other:
        raise DiscoveryError(f"its encode takes {other[0]!r}, which check cannot fill; write the adapter "
                             "below",
                             zh=f"它的 encode 接受 {other[0]!r}，检查程序填不了；请写下面的适配函数")
    return {FLAG_OF[p.name.lower()]: p.name for p in params if p.name.lower() in FLAG_OF}


def char_vocabulary(fn: Any) -> dict[str, int] | None:
    """The character vocabulary a function of the text alone reads from its file (a dict of single
    characters to distinct int ids: `stoi`); None where it takes more, or reads no such dict."""
    params = init_parameters(fn) if inspect.isfunction(fn) else []
    handed = [p.default is p.empty or p.name in BUILT_WITH for p in params]
    alone = sum(handed) == 1 == handed[:1].count(True)  # the text is the one thing it must be handed
    tables = [fn.__globals__.get(name) for name in sorted(global_reads(fn))] if alone else []
    return next(filter(_characters_to_ids, tables), None)


def _characters_to_ids(table: Any) -> bool:
    """A dict of single characters to distinct int ids."""
    return isinstance(table, dict) and {(type(k), len(str(k)), type(i)) for k, i in table.items()} == {
        (str, 1, int)} and len(set(table.values())) == len(table)


def _spelled(vocab: dict[str, int]) -> tuple[str, ...]:
    """Three texts spelled from a character vocabulary: its first characters, its last ones backwards,
    and characters repeated (so a text is not its vocabulary in order)."""
    chars = sorted(vocab, key=vocab.__getitem__)
    return "".join(chars[:12]), "".join(chars[::-1][:12]), "".join(c * 2 for c in chars[1::3][:6])


def _built(comp: Component, ctx: Context, res: ComponentResult) -> tuple[Any, tuple[str, ...]]:
    """The tokenizer (its encode and decode) and the texts it must give back: check's own for a class
    built with nothing; texts of its own characters for a function that reads a character vocabulary."""
    vocab = char_vocabulary(comp.obj)
    if vocab is None:
        res.notes.append(NOTE)
        return ctx.learner.call("__init__", comp.obj), TEXTS
    decode = decoder_beside(comp, own_objects(ctx.module))
    res.notes.append(text(f"it reads a character vocabulary of {len(vocab)} characters and no merges: not a "
                          "BPE; checked by giving back texts spelled from its own characters",
                          f"它读的是 {len(vocab)} 个字符的字符词表，没有合并规则：不是 BPE；"
                          "用它自己的字符拼成的文本检查能否原样还原"))
    return types.SimpleNamespace(encode=comp.obj, decode=decode), _spelled(vocab)


def decoder_beside(comp: Component, own: dict[str, Any]) -> Any:
    """The decode function beside an encode function in the learner's file (by DECODE_NAMES)."""
    decode = next((own[n] for n in DECODE_NAMES if own.get(n) not in (None, comp.obj)), None)
    if decode is None:
        raise DiscoveryError(
            f"found {comp.name} but no decode function ({', '.join(DECODE_NAMES)}); "
            "write decode(ids, vocab) -> str",
            zh=f"找到了 {comp.name}，但没有解码函数（{', '.join(DECODE_NAMES)}）；请写 decode(ids, "
               "vocab) -> str")
    return decode


def check_fixed_tokenizer(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    tok, texts = _built(comp, ctx, res)
    flags = _flags(tok.encode)
    plain = dict.fromkeys(flags.values(), False)
    back = {s: ctx.learner.call("decode", tok.decode, ctx.learner.call("encode", tok.encode, s, **plain))
            for s in texts}
    wrong = [s for s in texts if back[s] != s]
    if wrong == list(TEXTS):  # a vocabulary that cannot spell any of check's texts
        raise DiscoveryError("its ids do not give any of check's texts back (a vocabulary of its own that "
                             "lacks their characters?): there is nothing to compare them with",
                             zh="它的 id 解码后得不到检查程序的任何一段文本（它自己的词表里缺这些字符？）："
                                "没有可比较的")
    came = (wrong[:1], list(map(back.get, wrong[:1])))
    res.checks.append(Check(text(f"decode(encode(text)) gives each of {len(texts)} texts back",
                                 f"decode(encode(text)) 把 {len(texts)} 段文本原样还原"), not wrong,
                            text("{!r} came back as {!r}".format(*came), "{!r} 还原成了 {!r}".format(*came))))
    ids = list(ctx.learner.call("encode", tok.encode, texts[0], **plain))
    for key, name in flags.items():
        _flag_checked(res, ctx, tok, key, name, plain, (texts[0], ids))
    return finish(res)


def _flag_checked(res: ComponentResult, ctx: Context, tok: Any, key: str, name: str, plain: dict[str, bool],
                  given: tuple[str, list[int]]) -> None:
    """encode(text, <flag>=True) is the text's ids with the token's own id put first (BOS) or last (EOS)."""
    special = next(filter(lambda v: isinstance(v, int), (getattr(tok, a, None) for a in ID_NAMES[key])), None)
    if special is None:
        return
    first, ids = given  # a text and its ids with no flag set
    got = list(ctx.learner.call("encode", tok.encode, first, **{**plain, name: True}))
    want = WANT[key](special, ids)
    said = (f"{name}=True puts its {key.upper()} id {special} {WHERE[key][0]} the text's ids",
            f"{name}=True 把它的 {key.upper()} id {special} {WHERE[key][1]}")
    res.checks.append(Check(text(*said), got == want,
                            text(f"got {got[:4]}...{got[-2:]}", f"得到 {got[:4]}...{got[-2:]}")))
    res.findings += [Finding(DEPARTS, text(f"encode with {name}=True does not give {want[:2]}...{want[-2:]}",
                                           f"{name}=True 时 encode 得不到 {want[:2]}...{want[-2:]}"),
                             *_flag_line(tok.encode, name))] * (got != want)


def _flag_line(encode: Any, name: str) -> tuple[int | None, str | None]:
    """The line that acts on the flag `name`: the one under `if <name>:`, else one that reads it in an
    expression (Meta's `[self.bos_id] * bos`)."""
    lines = source_lines([encode])
    under = {number + 1 for number, line in lines if re.match(rf"\s*if\s+{name}\s*:", line)}
    reads = re.compile(rf"^(?!\s*(def|if)\b).*\b{name}\b")
    return first_line([r"\S"], [(n, line) for n, line in lines if n in under or reads.search(line)])


WANT = {"bos": lambda special, ids: [special, *ids], "eos": lambda special, ids: [*ids, special]}
NOTE = text("it is built with nothing (no vocabulary or merges check could hand it): its ids have no "
            "reference, so it is checked by what any tokenizer must do",
            "它的构造不接受任何东西（没有检查程序能传给它的词表或合并规则）：它的 id 没有参考，"
            "所以按任何分词器都该做到的事检查")
WHERE = {"bos": ("before", "放在文本的 id 前面"), "eos": ("after", "放在文本的 id 后面")}
