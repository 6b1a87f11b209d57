"""`handformer check` on the tokenizer chapter: a byte-level BPE trainer and its encoder and decoder,
graded against the hand-written reference in handformer/check/reference/bpe_reference.py (each planted mistake
is named in tests/test_check.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from check_plants import correct_file, edited_copy, planted_file

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report, to_json
from handformer.check.reference import bpe_reference as R
from handformer.check.reference.bpe_corpus import CORPUS, SPECIAL, VOCAB_SIZE, timing_corpus
from handformer.check.runners import bpe
from handformer.check.runners.bpe_codec import TEXTS, tokenizer_inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_correct_file_passes_in_english_and_chinese():
    result = check_file(str(correct_file("bpe")))
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("train_bpe", "bpe", "pass"), ("Tokenizer", "bpe_tokenizer", "pass")], format_report(result)
    trainer, tokenizer = result.components
    assert trainer.convention["en"] == ("ties broken by the lexicographically greater pair (the reference's rule); "
                                        "special token first (id 0); the 256 bytes in byte order from id 1")
    # timed on the timing corpus: within the limit, or (on a loaded machine) stopped and told it was slow
    assert any(n["en"].startswith(("timing corpus: yours", "slow: ")) for n in trainer.notes), trainer.notes
    assert all(ch.ok for ch in tokenizer.checks) and len(tokenizer.checks) == 2 * len(TEXTS) + 1
    zh = format_report(result, "zh")
    assert "train_bpe（BPE 训练）：通过" in zh and "出现并列时按字节的字典序，取更大的一对" in zh
    assert "Tokenizer（BPE 编码与解码）：通过" in zh and "decode(encode(text)) == text（中文）" in zh
    assert exit_code(result) == 0


def test_ties_to_the_smaller_pair_are_a_convention(monkeypatch):
    import handformer.check.runners.bpe as bpe

    monkeypatch.setattr(bpe, "CEILING", 0.3)  # its speed is not what this test is about
    result = check_file(str(planted_file("bpe_ties_smaller")), only=["bpe"])
    (trainer,) = result.components
    assert trainer.status == "differs" and not trainer.findings, format_report(result)
    assert trainer.convention["en"].startswith("ties broken by the lexicographically smaller pair")
    assert exit_code(result) == 0


def test_the_fast_reference_trains_what_the_plain_one_does():
    """The reference with its counts kept up to date equals the one that recounts after every merge
    (on the fixture corpus and on a slice of the timing corpus), and its merges are GPT-2 style:
    inside a pre-token, never through the special token."""
    for text, size in ((CORPUS, VOCAB_SIZE), (timing_corpus(6000), 256 + 1 + 300)):
        assert R.train(text, size, [SPECIAL]) == R.train_naive(text, size, [SPECIAL])
    vocab, merges = R.train(CORPUS, VOCAB_SIZE, [SPECIAL])
    assert len(vocab) == VOCAB_SIZE and vocab[0] == SPECIAL.encode() and vocab[1 + 65] == b"A"
    assert not any(b"<|" in a + b or b"|>" in a + b for a, b in merges)
    assert R.merge_word((b"a", b"a", b"a"), (b"a", b"a")) == (b"aa", b"a")


def test_the_reference_encoder_round_trips_and_keeps_special_tokens_whole():
    vocab, merges, specials = tokenizer_inputs()
    for s in TEXTS.values():
        assert R.decode(R.encode(s, vocab, merges, specials), vocab) == s
    ids = R.encode(f"a{SPECIAL}{SPECIAL}b{SPECIAL}", vocab, merges, specials)
    assert [vocab[i] for i in ids] == [b"a", (SPECIAL * 2).encode(), b"b", SPECIAL.encode()]
    assert R.decode([vocab_id(vocab, b"\xe4"), vocab_id(vocab, b"\xb8")], vocab) == "\ufffd"


def vocab_id(vocab: dict[int, bytes], token: bytes) -> int:
    return next(i for i, b in vocab.items() if b == token)


OTHER_SHAPES = '''
import regex


def bpe_train(text, num_merges):
    # the text itself, a number of merges, no special tokens, merges returned alone as pairs of ids
    pat = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+""")
    vocab = {i: bytes([i]) for i in range(256)}
    words = {}
    for w in pat.findall(text):
        key = tuple(w.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    merges = []
    for _ in range(num_merges):
        counts = {}
        for w, n in words.items():
            for p in zip(w, w[1:]):
                counts[p] = counts.get(p, 0) + n
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], vocab[p[0]], vocab[p[1]]))
        new = len(vocab)
        vocab[new] = vocab[best[0]] + vocab[best[1]]
        merges.append(best)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = n
        words = merged
    return vocab, merges
'''


def test_a_trainer_of_the_text_with_a_number_of_merges_and_id_pairs_is_graded(tmp_path, monkeypatch):
    """bpe_train(text, num_merges) without special tokens, returning pairs of ids: the corpus is
    passed as text, the merges are read through its vocabulary, and it is compared with the
    reference trained without the special token. It recounts every pair after each merge (minbpe's
    way): slow, not wrong, so it passes on its merges and a note gives the measured factor."""
    import handformer.check.runners.bpe as bpe

    monkeypatch.setattr(bpe, "CEILING", 1.0)  # stopped after 1 s, whatever the reference took
    path = tmp_path / "other.py"
    path.write_text(OTHER_SHAPES)
    result = check_file(str(path))
    (trainer,) = result.components
    assert trainer.kind == "bpe" and trainer.checks[0].ok, format_report(result)
    assert any("takes no special tokens" in n["en"] for n in trainer.notes)
    assert not trainer.findings and trainer.status == "pass" and exit_code(result) == 0, format_report(result)
    slow = next(n for n in trainer.notes if n["en"].startswith("slow:"))
    assert re.search(r"fixture corpus it took \d+\.\d\d s, \d+\.\d x the reference's", slow["en"])
    assert re.search(r"stopped after 1\.0 s, more than \d+ x the reference's \d+\.\d\d s", slow["en"])
    assert "慢：" in slow["zh"] and json.loads(to_json(result))["components"][0]["status"] == "pass"


def test_a_runaway_trainer_is_stopped_in_the_sandbox_and_named(tmp_path, monkeypatch):
    """A trainer that never ends: stopped by the fixture's limit (the sandbox's step limit is the
    backstop: tests/test_check.py's broken file), named, and the JSON says so."""
    path = tmp_path / "runaway.py"
    path.write_text("def train_bpe(input_path, vocab_size, special_tokens):\n    while True:\n"
                    "        counts = {}\n\n\nclass Tokenizer:\n    def __init__(self, vocab, merges, special_tokens):\n"
                    "        pass\n\n    def encode(self, text):\n        while text:\n            pass\n\n"
                    "    def decode(self, ids):\n        return ''\n")
    import handformer.check.runners.bpe as bpe
    import handformer.check.runners.bpe_codec as codec_module

    monkeypatch.setattr(bpe, "FIXTURE_LIMIT", 1.0)  # each limit put back as it was, on its own module
    monkeypatch.setattr(codec_module, "CODEC_LIMIT", 1.0)
    result = check_file(str(path))
    trainer, codec = result.components
    assert trainer.status == "error" and trainer.error.kind == "timeout" and not trainer.findings
    assert codec.status == "error" and codec.error.kind == "timeout", format_report(result)
    assert "did not end within 1 s" in trainer.error.message and "1 秒内没有结束" in trainer.error.message_zh
    data = json.loads(to_json(check_file(str(planted_file("bpe_decode_strict")), only=["bpe_tokenizer"])))
    assert data["exit_code"] == 1 and data["components"][0]["findings"][0]["name"] == "bpe_decode_strict"
    assert data["components"][0]["findings"][0]["fix"]["zh"].startswith("解码时用 errors=")


def test_a_named_trainer_and_function_encoders_are_found(tmp_path, monkeypatch):
    """--component bpe=NAME points the trainer kind at any name; encode/decode as functions."""
    import handformer.check.runners.bpe as bpe

    monkeypatch.setattr(bpe, "CEILING", 0.3)  # its speed is not what this test is about
    source = correct_file("bpe").read_text().replace("def train_bpe(", "def my_trainer(")
    source += ('\n\ndef encode(text, vocab, merges, special_tokens):\n'
               '    return Codec(vocab, merges, special_tokens).encode(text)\n\n\n'
               'def decode(ids, vocab):\n    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")\n')
    path = tmp_path / "named.py"
    path.write_text(source.replace("class Tokenizer", "class Codec"))
    result = check_file(str(path), overrides={"bpe": "my_trainer"})
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("my_trainer", "bpe", "pass"), ("encode", "bpe_tokenizer", "pass")], format_report(result)


def test_the_vocabularys_layout_is_reported_as_a_convention(tmp_path, monkeypatch):
    """The 256 bytes first and the special tokens after the merges (GPT-2's layout) passes too; the
    report names the layout."""
    import handformer.check.runners.bpe as bpe

    monkeypatch.setattr(bpe, "CEILING", 0.3)  # its speed is not what this test is about
    source = correct_file("bpe").read_text()
    source = source.replace('''    vocab = {i: token.encode("utf-8") for i, token in enumerate(special_tokens)}
    for b in range(256):
        vocab[len(vocab)] = bytes([b])
''', "    vocab = {b: bytes([b]) for b in range(256)}\n").replace(
        "    while len(vocab) < vocab_size and counts:",
        "    while len(vocab) < vocab_size - len(special_tokens) and counts:").replace(
        "    return vocab, merges",
        '    for token in special_tokens:\n        vocab[len(vocab)] = token.encode("utf-8")\n    return vocab, merges')
    path = tmp_path / "gpt2_layout.py"
    path.write_text(source)
    result = check_file(str(path), only=["bpe"])
    (trainer,) = result.components
    assert trainer.status == "pass", format_report(result)
    assert trainer.convention["en"].endswith("special token last (id 436); the 256 bytes in byte order from id 0")


BYTE_LEVEL = Path(__file__).parent / "fixtures" / "learners_byte_bpe" / "gpt2_style.py"


def test_a_byte_level_bpe_over_gpt2s_printable_characters_is_read_back_in_bytes(tmp_path):
    """GPT-2's encoder.py style (merges of strings such as ("Ġ", "t"), an encoder {string: id}; checked
    against transformers' bytes_to_unicode and the tokenizers library's BPE in /tmp/dev_e60k): its merges
    and vocabulary mapped back to bytes, trained and graded in full; a decode that turns the characters
    into UTF-8 directly (a space comes out as Ġ) FAILs."""
    (tok,) = check_file(str(BYTE_LEVEL)).components
    assert tok.status == "pass" and len(tok.checks) == 14, format_report(check_file(str(BYTE_LEVEL)))
    planted = tmp_path / "gpt2_style_decode.py"
    planted.write_text(BYTE_LEVEL.read_text().replace("bytes(self.to_byte[c] for c in s)", "s.encode()"))
    (tok,) = check_file(str(planted)).components
    assert tok.status == "fail" and any("decode(encode(text)) == text" in c.name["en"] and not c.ok
                                        for c in tok.checks), format_report(check_file(str(planted)))


RANKS = Path(__file__).parent / "fixtures" / "learners_bpe_ranks"


def test_a_trainer_of_tiktoken_ranks_is_graded_under_its_own_pre_tokenizer(monkeypatch):
    """learn_bpe returns mergeable ranks (bytes -> rank) and splits words by hand, not by GPT-2's
    pattern: its merges are read off the ranks and the reference is trained with its split (its
    timing run cut short: this fixture recounts every merge, as the learner's file does)."""
    monkeypatch.setattr(bpe, "CEILING", 0.5)
    result = check_file(str(RANKS / "correct.py"), only=["bpe"])
    (trainer,) = result.components
    assert trainer.status == "pass", format_report(result)
    assert any("your own pre-tokenizer (split_words)" in n["en"] for n in trainer.notes)
    planted = check_file(str(RANKS / "counts_words_once.py"), only=["bpe"])
    assert planted.components[0].status == "fail", format_report(planted)


GPT2_TEXT = '''

def bytes_to_unicode():
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shown, n = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            shown.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, shown)))


def as_text(token):
    return "".join(bytes_to_unicode()[b] for b in token)


def train_gpt2_style(input_path, vocab_size, special_tokens):
    vocab, merges = train_bpe(input_path, vocab_size, special_tokens)
    return {as_text(t): i for i, t in vocab.items()}, [(as_text(a), as_text(b)) for a, b in merges]
'''


def test_a_trainer_returning_gpt2s_text_encoder_and_merges_is_read_back_in_bytes(tmp_path, monkeypatch):
    """GPT-2's encoder.py keeps its vocabulary as {"Ġt": id} and its merges as ("Ġ", "t"): the
    printable characters of bytes_to_unicode; read back in bytes, the merges are graded as any."""
    monkeypatch.setattr(bpe, "CEILING", 0.3)  # its speed is not what this test is about
    path = tmp_path / "gpt2_text.py"
    path.write_text(correct_file("bpe").read_text() + GPT2_TEXT)
    result = check_file(str(path), overrides={"bpe": "train_gpt2_style"}, only=["bpe"])
    (trainer,) = result.components
    assert trainer.status == "pass" and trainer.checks[0].ok, format_report(result)
    assert bpe.gpt2_bytes("Ġt") == b" t" and bpe.gpt2_bytes("中") == "中".encode()


def test_a_tiktoken_style_encoder_of_mergeable_ranks_is_graded_without_special_tokens(tmp_path):
    """Built from mergeable_ranks alone (bytes -> rank; no special tokens) and splitting text with its
    own pattern: handed the ranks, graded under its pre-tokenizer and without special tokens; merging
    the pair of highest rank first fails."""
    result = check_file(str(RANKS / "encoder.py"))
    (codec,) = result.components
    assert codec.status == "pass", format_report(result)
    assert any("takes no special tokens" in n["en"] for n in codec.notes)
    assert any("own pre-tokenizer (pretokenize)" in n["en"] for n in codec.notes)
    planted = edited_copy(tmp_path, RANKS / "encoder.py", [("_, i = min(ranked)", "_, i = max(ranked)")])
    assert check_file(planted).components[0].status == "fail", format_report(check_file(planted))
