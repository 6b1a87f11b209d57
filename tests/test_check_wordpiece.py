"""The WordPiece kind (BERT's tokenizer): a class with train, encode and decode as a reader of the
Hugging Face course writes it (tests/fixtures/learners_wordpiece/, its plants run by test_check.py),
and free functions with Chinese comments whose names say nothing of a kind
(tests/fixtures/learners_wordpiece_zh/: fit_wordpiece, wordpiece_encode, encode_text,
decode_tokens). Each correct file PASSes with its trainer, encoders and decoder checked; each plant
FAILs at its line, named. The reference is pinned on small cases of its own."""

from pathlib import Path

import pytest

from handformer.check.core.discovery import refine
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.reference import wordpiece_reference as R
from handformer.check.runners.wordpiece import CORPUS

FIXTURES = Path(__file__).parent / "fixtures"
ZH = FIXTURES / "learners_wordpiece_zh"
ZH_PLANTS = {  # file -> (diagnosis, form, the line planted)
    "shortest_match": ("wordpiece_shortest_match", "shortest", "for end in range(start + 1, len(word) + 1):"),
    "frequency_score": ("wordpiece_pair_score", "frequency", "scores = dict(pair_freq)"),
    "unk_skip": ("wordpiece_unk_piece", "unk_skip", "out.append(unk)  # 切不开的字符记成 [UNK]"),
    "decode_keeps_prefix": ("wordpiece_decode_continuation", "glued_kept", "words[-1] += t"),
}


BERT = FIXTURES / "learners_wordpiece_bert" / "correct.py"
BERT_SHORTEST = [("                end = len(chars)\n", "                end = start + 1\n"),
                 ("                while start < end:\n", "                while end <= len(chars):\n"),
                 ("                    end -= 1\n", "                    end += 1\n")]


@pytest.fixture(scope="module", params=["learners_wordpiece", "learners_wordpiece_zh"])
def correct(request):
    return check_file(str(FIXTURES / request.param / "correct.py"))


def test_a_correct_wordpiece_passes_with_every_part_checked(correct):
    (tok,) = correct.components
    assert tok.kind == "wordpiece" and tok.status == "pass", format_report(correct)
    names = " ".join(c.name["en"] for c in tok.checks)
    assert "tokens learnt" in names and "reference's pieces" in names and "words back" in names
    assert all(c.ok for c in tok.checks) and "counted first" in tok.convention["en"]


@pytest.fixture(scope="module", params=["correct", "shortest"])
def bert(request, tmp_path_factory):
    """BERT's tokenization.py as a reader rewrites it (no trainer: its classes built on a vocabulary),
    and the same with its WordpieceTokenizer taking the shortest piece first."""
    source = BERT.read_text()
    for old, new in BERT_SHORTEST * (request.param == "shortest"):
        source = source.replace(old, new)
    path = tmp_path_factory.mktemp("bert") / "tokenization.py"
    path.write_text(source)
    return request.param, check_file(str(path))


def test_bert_s_tokenizers_built_on_a_vocabulary_are_graded_on_it(bert):
    name, result = bert
    by_name = {c.name: c for c in result.components}
    assert set(by_name) == {"WordpieceTokenizer", "FullTokenizer"}, format_report(result)
    if name == "correct":
        assert {c.status for c in by_name.values()} == {"pass"}, format_report(result)
        return
    for tok in by_name.values():  # FullTokenizer runs the WordpieceTokenizer too
        assert [(f.name, f.code) for f in tok.findings] == [("wordpiece_shortest_match", "end += 1")]


def test_a_vocabulary_handed_back_sorted_differs_by_convention_and_never_fails(tmp_path):
    """`enumerate(sorted(vocab))`: the tokens learnt are the reference's, their order lost (DIFFERS)."""
    source = (FIXTURES / "learners_wordpiece" / "correct.py").read_text()
    assert "enumerate(vocab)}" in source
    path = tmp_path / "sorted_vocab.py"
    path.write_text(source.replace("enumerate(vocab)}", "enumerate(sorted(vocab))}"))
    (tok,) = check_file(str(path)).components
    assert tok.status == "differs" and "comes back sorted" in tok.convention["en"], tok


@pytest.fixture(scope="module", params=sorted(ZH_PLANTS))
def planted(request):
    return request.param, check_file(str(ZH / f"{request.param}.py"))


def test_a_planted_mistake_fails_named_at_its_line(planted):
    name, result = planted
    diagnosis, form, line = ZH_PLANTS[name]
    (tok,) = result.components
    assert tok.status == "fail", format_report(result)
    assert [(f.name, f.form, f.code) for f in tok.findings] == [(diagnosis, form, line)], format_report(result)


def test_the_reference_encodes_longest_first_and_a_word_it_cannot_split_whole():
    vocab = {"un", "##aff", "##able", "##a", "##f", "##b", "##l", "##e", "u", "##n"}
    assert R.encode_word("unaffable", vocab) == ["un", "##aff", "##able"]
    assert R.encode_word("unaffable", vocab, frozenset({"shortest"})) == ["u", "##n", "##a", "##f", "##f", "##a",
                                                                           "##b", "##l", "##e"]
    assert R.encode_word("unaffx", vocab) == ["[UNK]"]
    assert R.encode_word("unaffx", vocab, frozenset({"unk_piece"})) == ["un", "##aff", "[UNK]"]
    assert R.encode_word("unaffable", vocab, max_chars=8) == ["[UNK]"]
    assert R.decode(["un", "##aff", "##able", ",", "un"]) == "unaffable , un"


def test_the_reference_scores_pairs_by_their_parts_and_replays_its_own_tokens():
    merges = R.train(CORPUS, 30)
    tokens = list(dict.fromkeys(R.joined(*p) for p in merges))
    assert R.replay(CORPUS, tokens) is None
    assert R.replay(CORPUS, tokens, rule="frequency") is not None
    freqs = R.word_freqs(["ab ab ac"])
    scores = R.scores({w: R.spell(w) for w in freqs}, freqs)
    assert scores[("a", "##b")] == R.Fraction(2, 3 * 2) and scores[("a", "##c")] == R.Fraction(1, 3 * 1)


class Tokenizer:
    """A BPE kind's name (`Tokenizer`) on a WordPiece tokenizer that trains itself."""

    def train(self, corpus, vocab_size):
        self.vocab = {"a": 0, "##" + "b": 1}

    def encode(self, text):
        return [0]

    def decode(self, ids):
        return "a"


def encode(word, vocab):
    """A BPE kind's name (`encode`) on a WordPiece encoder beside its trainer."""
    return [word[0]] + ["##" + c for c in word[1:]]


def test_a_bpe_name_on_wordpiece_code_is_the_wordpiece_kind():
    assert refine("bpe_tokenizer", Tokenizer) == "wordpiece" and refine("bpe_tokenizer", encode) == ""
