"""Tokenizers in GGUF: handformer's tokenizer.json <-> llama.cpp's vocabulary keys (tokenizer.ggml.*).

llama.cpp knows two kinds that handformer's runs have:
- byte-level BPE (tokenizer.ggml.model `BYTE_LEVEL_BPE`,
    named after GPT-2). The tokens are byte-level strings (each byte shown as one printable
  character: a space is "Ġ", a newline "Ċ"), the merges are "left right" strings ranked by
  position, and `tokenizer.ggml.pre` names the split before BPE (`PRE_NAMES`: llama.cpp has one
  regex for each). handformer's trained BPE, GPT-2, Llama 3, Qwen2,
  SmolLM. A character tokenizer is written as this kind too: one token per character (its UTF-8
  bytes in byte-level form) and merges only to join the bytes of characters beyond ASCII (none for
  ASCII text: an empty list).
- SentencePiece (tokenizer.ggml.model `SENTENCEPIECE`, named after Llama). Tokens with "▁" for spaces,
    byte tokens <0x00>..<0xFF>, and a score per
  token: llama.cpp merges the adjacent pair whose concatenation scores highest. llama2.c's
  tokenizer and the Hugging Face Llama 2 / Gemma ones are BPE with byte fallback whose merges were
  made from such scores; the scores written are the merges' ranks (-rank of the first merge that
  forms a token), so llama.cpp merges in the same order.
Token types (normal, unknown, control, user-defined, unused, byte) and the special ids (BOS, EOS,
and further end-of-generation ids as EOT/EOM) go with them, and the run's tokenizer.json itself
goes in `tokenizer.huggingface.json`: importing an export gives the same tokenizer back. A file
without it (from llama.cpp's converter) is rebuilt from the vocabulary keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.families.catalogue import BYTE_LEVEL_BPE, QWEN2_PRE, SENTENCEPIECE
from handformer.settings import is_int

SPACE = "\u2581"  # SentencePiece's visible space
T = gguf.TokenType
K = gguf.Keys.Tokenizer

# The split before byte-level BPE: llama.cpp's name -> the regex Hugging Face's tokenizer.json
# holds for it (llama.cpp's llama-vocab.cpp lists each one; "gpt-2" is ByteLevel's own regex).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama-bpe": LLAMA3_SPLIT, QWEN2_PRE: QWEN2_SPLIT}
PRE_NAMES = ("gpt-2", "llama-bpe", QWEN2_PRE, "smollm")
_PRE_ALIASES = {"llama3": "llama-bpe", "llama-v3": "llama-bpe"}
EOS_STANDS_IN = "handformer.eos_stands_in"  # the EOS id is a stand-in for a run without one


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map: the printable Latin-1 bytes stand for themselves,
    the other 68 bytes (controls, space, ...) become the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_LEVEL = byte_level_alphabet()
FROM_BYTE_LEVEL = {c: b for b, c in BYTE_LEVEL.items()}


def to_byte_level(text: str) -> str:
    return "".join(BYTE_LEVEL[b] for b in text.encode("utf-8"))


def from_byte_level(text: str) -> str | None:
    """The text a byte-level string stands for, or None if it is not one (or not whole UTF-8)."""
    try:
        return bytes(FROM_BYTE_LEVEL[c] for c in text).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return None


@dataclass
class Vocab:
    """A vocabulary as GGUF holds it (lists as long as the model's vocabulary)."""

    model: str  # BYTE_LEVEL_BPE or SENTENCEPIECE
    tokens: list[str]
    types: list[int]
    pre: str | None = None  # byte-level BPE
    merges: list[str] = field(default_factory=list)  # byte-level BPE
    scores: list[float] = field(default_factory=list)  # llama
    add_space_prefix: bool = True  # llama


# --- handformer -> GGUF ----------------------------------------------------------------------------

def _spec(tokenizer: Tokenizer) -> dict[str, Any]:
    return json.loads(tokenizer.hf.to_str())


def _pre_name(spec: dict[str, Any]) -> str:
    """llama.cpp's name for a byte-level BPE's split, or ValueError naming the pre-tokenizer."""
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if (kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits")
            and parts[1].get("use_regex", True)):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        pattern = (parts[0].get("pattern") or {}).get("Regex")
        for name, regex in SPLITS.items():
            if pattern == regex:
                return name
    raise ValueError(f"the tokenizer's pre-tokenizer {json.dumps(pre)[:200]} is none of the splits llama.cpp "
                     f"has ({', '.join(PRE_NAMES)}); llama.cpp would tokenize text differently")


def _added(spec: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {t["id"]: t for t in spec.get("added_tokens", [])}


def _padded(vocab: dict[str, int], vocab_size: int, what: str) -> list[str | None]:
    """id -> token text for ids 0 .. vocab_size - 1 (None where the tokenizer has no token)."""
    if vocab and max(vocab.values()) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(vocab.values())} but the model's vocabulary "
                         f"has {vocab_size}; {what} needs every token inside the vocabulary")
    tokens: list[str | None] = [None] * vocab_size
    for text, i in vocab.items():
        tokens[i] = text
    return tokens


def _fill(tokens: list[str | None], types: list[int]) -> tuple[list[str], list[int]]:
    """Ids without a token become "[PAD<id>]", unused (as llama.cpp's converter writes them)."""
    return ([t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)],
            [ty if tokens[i] is not None else int(T.UNUSED) for i, ty in enumerate(types)])


def _added_type(token: dict[str, Any]) -> int:
    return int(T.CONTROL if token.get("special") else T.USER_DEFINED)


def _char_vocab(tokenizer: Tokenizer, spec: dict[str, Any], vocab_size: int) -> Vocab:
    added = _added(spec)
    tokens = _padded(tokenizer.hf.get_vocab(with_added_tokens=True), vocab_size, "GGUF")
    types, merges = [], []
    for i, text in enumerate(tokens):
        if text is None or i in added:
            types.append(_added_type(added[i]) if i in added else int(T.UNUSED))
            continue
        pieces = [BYTE_LEVEL[b] for b in text.encode("utf-8")]
        for k in range(1, len(pieces)):  # join a character's bytes: (b0, b1), (b0b1, b2), ...
            merges.append(f"{''.join(pieces[:k])} {pieces[k]}")
        tokens[i] = "".join(pieces)
        types.append(int(T.NORMAL))
    words, kinds = _fill(tokens, types)
    return Vocab(BYTE_LEVEL_BPE, words, kinds, pre="gpt-2", merges=merges)


def _merge_strings(spec_merges: list[Any]) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in spec_merges]


def _byte_level_vocab(tokenizer: Tokenizer, spec: dict[str, Any], vocab_size: int) -> Vocab:
    pre = _pre_name(spec)
    added = _added(spec)
    tokens = _padded(tokenizer.hf.get_vocab(with_added_tokens=True), vocab_size, "GGUF")
    types = [_added_type(added[i]) if i in added else int(T.NORMAL) for i in range(vocab_size)]
    words, kinds = _fill(tokens, types)
    return Vocab(BYTE_LEVEL_BPE, words, kinds, pre=pre, merges=_merge_strings(spec["model"].get("merges",
        [])))


def _sentencepiece_vocab(tokenizer: Tokenizer, spec: dict[str, Any], vocab_size: int) -> Vocab:
    added = _added(spec)
    vocab = tokenizer.hf.get_vocab(with_added_tokens=True)
    tokens = _padded(vocab, vocab_size, "GGUF")
    unk = spec["model"].get("unk_token")
    ranks: dict[int, int] = {}  # token id -> rank of the first merge that forms it
    for rank, merge in enumerate(_merge_strings(spec["model"].get("merges", []))):
        left, right = merge.split(" ", 1)
        formed = vocab.get(left + right)
        if formed is not None:
            ranks.setdefault(formed, rank)
    types, scores = [], []
    for i, text in enumerate(tokens):
        if i in added and text != unk:
            types.append(_added_type(added[i]))
        elif text == unk:
            types.append(int(T.UNKNOWN))
        elif text is not None and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types.append(int(T.BYTE))
        else:
            types.append(int(T.NORMAL))
        # formed by a merge: its rank orders it; never formed but longer than one character: last
        multi = text is not None and len(text) > 1 and types[-1] == T.NORMAL
        scores.append(-float(ranks[i]) if i in ranks else (-1e9 if multi else 0.0))
    words, kinds = _fill(tokens, types)
    return Vocab(SENTENCEPIECE, words, kinds, scores=scores, add_space_prefix=_adds_space_prefix(spec))


def _adds_space_prefix(spec: dict[str, Any]) -> bool:
    """Whether the tokenizer puts "▁" before the text (SentencePiece's dummy prefix): a Prepend
    normalizer, or a Metaspace pre-tokenizer that prepends."""
    prepends = any(n.get("type") == "Prepend" and n.get("prepend") == SPACE
                   for n in _flatten(spec.get("normalizer"), "normalizers"))
    return prepends or any(p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never"
                           and p.get("add_prefix_space", True)
                           for p in _flatten(spec.get("pre_tokenizer"), "pretokenizers"))


def _flatten(part: Any, members: str) -> list[dict[str, Any]]:
    """The steps of a normalizer or pre-tokenizer, Sequences opened."""
    if not isinstance(part, dict):
        return []
    if part.get("type") == "Sequence":
        return [q for p in part.get(members, []) for q in _flatten(p, members)]
    return [part]


def vocab_from_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> Vocab:
    """The GGUF vocabulary of a handformer tokenizer (see the module docstring), or ValueError."""
    spec = _spec(tokenizer)
    model = spec.get("model", {})
    if tokenizer.is_char:
        return _char_vocab(tokenizer, spec, vocab_size)
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return _sentencepiece_vocab(tokenizer, spec, vocab_size)
    if model.get("type") == "BPE":
        return _byte_level_vocab(tokenizer, spec, vocab_size)
    raise ValueError(f"the tokenizer is a {model.get('type')} model; GGUF holds byte-level BPE, "
                     "SentencePiece-style BPE and character tokenizers (handformer's kinds)")


def write_tokenizer(writer: Any, tokenizer: Tokenizer, tokenizer_json: str, tokens: SpecialTokens,
                    vocab_size: int, chat_template: str | None, notes: list[str]) -> None:
    """The tokenizer.* keys: vocabulary, special ids, chat template, and tokenizer.json itself."""
    vocab = vocab_from_tokenizer(tokenizer, vocab_size)
    writer.add_tokenizer_model(vocab.model)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.model == BYTE_LEVEL_BPE:
        writer.add_tokenizer_pre(vocab.pre)
        writer.add_key_value(K.MERGES, vocab.merges, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    else:
        writer.add_tokenizer_pre("default")
        writer.add_token_scores(vocab.scores)
        writer.add_add_space_prefix(vocab.add_space_prefix)
    if tokens.bos_id is not None:
        writer.add_bos_token_id(tokens.bos_id)
    writer.add_add_bos_token(tokens.bos_id is not None)
    writer.add_add_eos_token(False)
    stops = list(tokens.eos_ids)
    if not stops:
        stops = _stand_in_eos(tokenizer, tokens, notes)
        writer.add_bool(EOS_STANDS_IN, True)  # read back as "no EOS": the run's tokens again
    adders = (writer.add_eos_token_id, writer.add_eot_token_id, writer.add_eom_token_id)
    for add, token_id in zip(adders, stops):
        add(token_id)
    if len(stops) > 3:
        notes.append(f"generation stops at ids {stops}; GGUF has three stop keys (EOS, EOT, EOM), so "
                     f"llama.cpp stops at {stops[:3]} only")
    if tokenizer.unk_id is not None and tokenizer.unk_id < vocab_size:
        writer.add_unk_token_id(tokenizer.unk_id)
    if tokens.pad_id is not None:
        writer.add_pad_token_id(tokens.pad_id)
    if chat_template:
        writer.add_chat_template(chat_template)
    writer.add_string(K.HF_JSON, tokenizer_json)


def _stand_in_eos(tokenizer: Tokenizer, tokens: SpecialTokens, notes: list[str]) -> list[int]:
    """An EOS for a run that has none (trained here on raw text, it never saw one). Without the key
    llama.cpp takes a default id (11 for byte-level BPE vocabularies: a character or word of this one) and
    stops there; it stops at a token named </s> in any case, so that one stands in."""
    for token_id in (tokenizer.eos_id, tokens.pad_id, tokenizer.pad_id, tokenizer.unk_id):
        if token_id is not None:
            notes.append(f"the run has no end-of-sequence token; {tokenizer.hf.id_to_token(token_id)!r} "
                         f"(id {token_id}), which it never generates, is written as EOS so that llama.cpp "
                         "does not stop at its default id")
            return [token_id]
    raise ValueError("the run has no end-of-sequence token and its tokenizer no </s>, <pad> or <unk> to "
                     "stand in; llama.cpp would stop at its default id (11)")


# --- GGUF -> handformer ----------------------------------------------------------------------------

def _list(metadata: dict[str, Any], key: str, where: str, n: int | None = None) -> list[Any]:
    value = metadata.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{where} has no {key} list, which the tokenizer needs")
    if n is not None and len(value) != n:
        raise ValueError(f"{where}: {key} has {len(value)} entries for {n} tokens")
    return value


def _specials(tokens: list[str], types: list[int]) -> list[AddedToken]:
    return [AddedToken(t, special=ty == T.CONTROL, normalized=False)
            for t, ty in zip(tokens, types) if ty in (T.CONTROL, T.USER_DEFINED)]


def _char_tokenizer(tokens: list[str], types: list[int], merges: list[str]) -> HFTokenizer | None:
    """A character tokenizer as handformer trains them, if the vocabulary is one: every normal token
    one character, and the merges only those joining the bytes of each character."""
    vocab, expected = {}, []
    for i, (text, ty) in enumerate(zip(tokens, types)):
        if ty == T.UNUSED:
            continue
        if ty == T.NORMAL:
            char = from_byte_level(text)
            if char is None or len(char) != 1:
                return None
            pieces = [BYTE_LEVEL[b] for b in char.encode("utf-8")]
            expected += [f"{''.join(pieces[:k])} {pieces[k]}" for k in range(1, len(pieces))]
            text = char
        vocab[text] = i
    unk = next((t for t, ty in zip(tokens, types) if ty == T.UNKNOWN), None) or (
        "<unk>" if "<unk>" in vocab else None)
    if sorted(expected) != sorted(merges) or unk is None:
        return None
    hf = HFTokenizer(models.WordLevel(vocab, unk_token=unk))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    hf.decoder = decoders.Fuse()
    hf.add_special_tokens([t.content for t in _specials(tokens, types) if t.special])
    return hf


def _byte_level_tokenizer(tokens: list[str], types: list[int], merges: list[str], pre: str,
                          where: str) -> HFTokenizer:
    pre = _PRE_ALIASES.get(pre, pre)
    if pre not in PRE_NAMES:
        raise ValueError(f"{where} has tokenizer.ggml.pre = {pre!r}; handformer rebuilds the splits "
                         f"{', '.join(PRE_NAMES)} (a file handformer exported carries its tokenizer.json)")
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty != T.UNUSED}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    hf = HFTokenizer(models.BPE(vocab, pairs, ignore_merges=pre == "llama-bpe"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre in ("gpt-2", "smollm"))
    if pre in SPLITS:
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"), byte_level])
    elif pre == "smollm":
        digits = pre_tokenizers.Digits(individual_digits=True)
        hf.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        hf.pre_tokenizer = byte_level
    if pre == QWEN2_PRE:
        hf.normalizer = normalizers.NFC()
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(_specials(tokens, types))
    return hf


def _sentencepiece_tokenizer(tokens: list[str], types: list[int], scores: list[float],
                             add_space_prefix: bool) -> HFTokenizer:
    """BPE with byte fallback whose merges are every split of a token into two normal tokens,
    ranked by the token's score (highest first), as llama.cpp merges."""
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty != T.UNUSED}
    normal = {t for t, ty in zip(tokens, types) if ty in (T.NORMAL, T.USER_DEFINED)}
    merges = []
    for i, (text, ty) in enumerate(zip(tokens, types)):
        if ty != T.NORMAL:
            continue
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in normal and right in normal:
                merges.append((-scores[i], i, vocab[left], (left, right)))
    merges.sort(key=lambda m: m[:3])
    unk = next((t for t, ty in zip(tokens, types) if ty == T.UNKNOWN), None)
    hf = HFTokenizer(models.BPE(vocab, [m[3] for m in merges], unk_token=unk, byte_fallback=True,
                                fuse_unk=True))
    replace = normalizers.Replace(" ", SPACE)
    hf.normalizer = (normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if add_space_prefix
                     else replace)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    hf.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    hf.add_special_tokens(_specials(tokens, types))
    return hf


def tokenizer_from_gguf(metadata: dict[str, Any], vocab_size: int, where: str) -> Tokenizer:
    """The tokenizer of a GGUF file: its tokenizer.json when it carries one, else rebuilt."""
    carried = metadata.get(K.HF_JSON)
    if isinstance(carried, str):
        try:
            return Tokenizer(HFTokenizer.from_str(carried))
        except Exception as err:  # the library raises a bare Exception on malformed JSON
            raise ValueError(f"{where}: {K.HF_JSON} is not a valid tokenizer.json: {err}") from None
    kind = metadata.get(K.MODEL)
    tokens = _list(metadata, K.LIST, where)
    types = [int(t) for t in metadata.get(K.TOKEN_TYPE) or [int(T.NORMAL)] * len(tokens)]
    if len(types) != len(tokens):
        raise ValueError(f"{where}: {K.TOKEN_TYPE} has {len(types)} entries for {len(tokens)} tokens")
    if len(tokens) > vocab_size:
        raise ValueError(f"{where}: the vocabulary lists {len(tokens)} tokens but the embedding has "
                         f"{vocab_size} rows")
    if kind == BYTE_LEVEL_BPE:
        merges = [str(m) for m in metadata.get(K.MERGES) or []]
        hf = _char_tokenizer(tokens, types, merges) or _byte_level_tokenizer(
            tokens, types, merges, str(metadata.get(K.PRE) or "gpt-2"), where)
    elif kind == SENTENCEPIECE:
        scores = [float(s) for s in _list(metadata, K.SCORES, where, len(tokens))]
        hf = _sentencepiece_tokenizer(tokens, types, scores, bool(metadata.get(K.ADD_PREFIX, True)))
    else:
        raise ValueError(f"{where} has tokenizer.ggml.model = {kind!r}; handformer reads "
                         f"{BYTE_LEVEL_BPE!r} (byte-level BPE) and {SENTENCEPIECE!r} (SentencePiece) "
                         "vocabularies")
    return Tokenizer(hf)


def special_tokens_from_gguf(metadata: dict[str, Any], vocab_size: int, notes: list[str]) -> SpecialTokens:
    """BOS (when tokenizer.ggml.add_bos_token, default as llama.cpp: on for SentencePiece), EOS and
    the further stop ids (EOT, EOM), PAD; ids outside the vocabulary are dropped with a note."""
    def token_id(key: str) -> int | None:
        value = metadata.get(key)
        if value is None:
            return None
        if not is_int(value) or not 0 <= value < vocab_size:
            notes.append(f"{key} = {value!r} is outside the vocabulary (0..{vocab_size - 1}); ignored")
            return None
        return value

    add_bos = metadata.get(K.ADD_BOS, metadata.get(K.MODEL) == SENTENCEPIECE)
    bos = token_id(K.BOS_ID) if add_bos else None
    stops = [i for i in (token_id(K.EOS_ID), token_id(K.EOT_ID), token_id(K.EOM_ID)) if i is not None]
    if metadata.get(EOS_STANDS_IN):
        stops = []
    return SpecialTokens(bos_id=bos, eos_id=stops[0] if stops else None, pad_id=token_id(K.PAD_ID),
                         eos_ids=stops)


__all__ = ["Vocab", "byte_level_alphabet", "special_tokens_from_gguf", "tokenizer_from_gguf",
           "vocab_from_tokenizer", "write_tokenizer"]
