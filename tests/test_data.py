"""Data for the translation job: reading parallel text, the embedded dates task, truncation,
token-budget batching and the tokenizers."""

import datetime
import gzip
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handformer.data.batching import Seq2SeqData, collate, encode_pairs, token_budget_batches
from handformer.data.dates import date_pairs
from handformer.data.parallel import read_pair, read_parallel, read_tsv
from handformer.data.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


# --- reading parallel text ----------------------------------------------------------------------

TSV_LINES = [
    "hello\tbonjour",  # 1
    "no tab on this line",  # 2: no tab
    "source only\t",  # 3: empty target
    "",  # 4: blank line
    "\ttarget only",  # 5: empty source
    "good day\tbonne journée",  # 6
    "   \t   ",  # 7: both sides blank
    "cat\tchat",  # 8
]


def test_tsv_bad_lines_are_skipped_counted_and_reported(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("\n".join(TSV_LINES) + "\n", encoding="utf-8")
    data = read_tsv(path)
    assert data.pairs == [("hello", "bonjour"), ("good day", "bonne journée"), ("cat", "chat")]
    assert data.skipped == 5
    assert data.skipped_lines == [2, 3, 4, 5, 7]
    report = data.report()
    assert "3 pairs" in report and str(path) in report
    assert "skipped 5 bad line(s) (line 2, 3, 4, 5, 7)" in report


def test_line_endings_and_a_stray_carriage_return(tmp_path):
    """CRLF files read like LF files; a lone "\r" inside a sentence (common in crawled text) is
    part of the sentence, not a line break that would cut it and shift the line numbers."""
    tsv = tmp_path / "crlf.tsv"
    tsv.write_bytes(b"hello\tbon\rjour\r\nno tab\r\ncat\tchat\r\n")
    data = read_tsv(tsv)
    assert data.pairs == [("hello", "bon\rjour"), ("cat", "chat")]
    assert data.skipped_lines == [2]
    src, tgt = tmp_path / "a.txt", tmp_path / "b.txt"
    src.write_bytes(b"one\rhalf\ntwo\n")
    tgt.write_bytes(b"un\r\ndeux\r\n")
    gz = tmp_path / "a.txt.gz"
    with gzip.open(gz, "wb") as f:
        f.write(b"one\rhalf\ntwo\n")
    for source in (src, gz):
        assert read_pair(source, tgt).pairs == [("one\rhalf", "un"), ("two", "deux")]


def test_only_the_first_bad_line_numbers_are_kept(tmp_path):
    path = tmp_path / "many.tsv"
    lines = ["a\tb"] + ["broken"] * 8 + ["c\td"]
    path.write_text("\n".join(lines) + "\n")
    data = read_tsv(path)
    assert data.skipped == 8
    assert data.skipped_lines == [2, 3, 4, 5, 6]
    assert data.report().endswith("(line 2, 3, 4, 5, 6, ...)")


def test_a_file_without_usable_pairs_is_an_error(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("no tabs\nat all\n")
    with pytest.raises(ValueError, match=r"holds no usable pairs \(2 bad lines\)"):
        read_tsv(path)
    with pytest.raises(FileNotFoundError, match="no such data file"):
        read_tsv(tmp_path / "missing.tsv")
    (tmp_path / "empty.tsv").write_text("\n")
    with pytest.raises(ValueError, match=r"empty.tsv is empty: give a TSV file"):
        read_tsv(tmp_path / "empty.tsv")


def test_aligned_files_pair_line_by_line_and_skip_empty_sides(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.fr"
    src.write_text("one\ntwo\n\nfour\n")
    tgt.write_text("un\n\ntrois\nquatre\n")
    data = read_parallel([str(src), str(tgt)])
    assert data.pairs == [("one", "un"), ("four", "quatre")]
    assert data.skipped == 2 and data.skipped_lines == [2, 3]
    assert str(src) in data.source and str(tgt) in data.source


def test_misaligned_files_are_an_error_naming_both(tmp_path):
    src, tgt = tmp_path / "train.de", tmp_path / "train.en"
    src.write_text("eins\nzwei\ndrei\n")
    tgt.write_text("one\ntwo\n")
    with pytest.raises(ValueError, match="misaligned") as info:
        read_pair(src, tgt)
    message = str(info.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "has 2" in message


def test_gzipped_files_are_read(tmp_path):
    tsv = tmp_path / "train.tsv.gz"
    with gzip.open(tsv, "wt", encoding="utf-8") as f:
        f.write("hello\tbonjour\nbroken\nzürich\tzurich\n")
    data = read_parallel(str(tsv))
    assert data.pairs == [("hello", "bonjour"), ("zürich", "zurich")]
    assert data.skipped_lines == [2]
    src, tgt = tmp_path / "a.gz", tmp_path / "b.gz"
    for path, text in ((src, "one\ntwo\n"), (tgt, "un\ndeux\n")):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    assert read_parallel([str(src), str(tgt)]).pairs == [("one", "un"), ("two", "deux")]


def test_a_spec_must_be_one_path_or_two():
    with pytest.raises(ValueError, match=r"\[source, target\]"):
        read_parallel(["a", "b", "c"])


# --- the dates task -----------------------------------------------------------------------------

def test_dates_are_deterministic_from_the_seed():
    assert date_pairs(300, 40, seed=3) == date_pairs(300, 40, seed=3)
    assert date_pairs(300, 40, seed=3) != date_pairs(300, 40, seed=4)


def test_held_out_dates_never_appear_in_training():
    train, heldout = date_pairs(5000, 300, seed=0)
    assert len(train) == 5000 and len(heldout) == 300
    heldout_dates = {t for _, t in heldout}
    assert len(heldout_dates) == 300  # distinct dates
    assert not heldout_dates & {t for _, t in train}
    for source, target in train[:200] + heldout:
        date = datetime.date.fromisoformat(target)
        assert 1900 <= date.year <= 2099
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", target)
        month = date.strftime("%B").lower()
        assert month in source  # the source names the month of its target


# --- truncation ---------------------------------------------------------------------------------

def test_long_examples_are_truncated_keeping_eos_and_counted():
    tok = Tokenizer.train_char(["abcdefghijklmnopqrstuvwxyz "])
    pairs = [("short", "ok"), ("a" * 20, "fine"), ("tiny", "b" * 30), ("abc", "xyz"), ("c" * 9, "d" * 9)]
    enc = encode_pairs(pairs, tok, tok, max_length=10)
    assert enc.truncated == 2  # "c" * 9 + EOS fits exactly; its target too (EOS added later)
    for (src, tgt), s, t in zip(pairs, enc.src, enc.tgt):
        assert s[-1] == tok.eos_id and len(s) <= 10
        assert len(t) + 1 <= 10  # room for the EOS that collate appends
        assert s[:-1] == tok.encode(src)[:9] and t == tok.encode(tgt)[:9]
    batch = collate(enc.src, enc.tgt, tok.pad_id, tok.bos_id, tok.eos_id)
    assert batch.src.size(1) == 10 and batch.tgt_out.size(1) == 10
    assert batch.tgt_out[2, -1].item() == tok.eos_id  # the cut target still ends in EOS


# --- batching -----------------------------------------------------------------------------------

def test_collate_shifts_targets_and_counts_real_tokens():
    batch = collate([[5, 6, 2], [7, 2]], [[8, 9], [4, 5, 6]], pad_id=0, bos_id=1, eos_id=2)
    assert batch.src.tolist() == [[5, 6, 2], [7, 2, 0]]
    assert batch.tgt_in.tolist() == [[1, 8, 9, 0], [1, 4, 5, 6]]
    assert batch.tgt_out.tolist() == [[8, 9, 2, 0], [4, 5, 6, 2]]
    assert batch.n_tokens == 7 == int((batch.tgt_out != 0).sum())


@settings(max_examples=60, deadline=None, derandomize=True)  # the same draws in every run (CI has no database)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=120),
       extra=st.integers(0, 200), shuffle=st.booleans(), seed=st.integers(0, 5))
def test_token_budget_batches_respect_the_budget_and_cover_every_example_once(lengths, extra, shuffle,
                                                                             seed):
    max_tokens = max(lengths) + extra
    batches = token_budget_batches(lengths, max_tokens, shuffle, seed)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert batch and len(batch) * max(lengths[i] for i in batch) <= max_tokens


def test_a_budget_smaller_than_the_longest_example_is_an_error():
    with pytest.raises(ValueError, match="max_tokens=5 is smaller than the longest example"):
        token_budget_batches([3, 9, 2], 5, shuffle=False)


def date_data(n: int = 400, max_tokens: int = 300, seed: int = 0) -> tuple[Seq2SeqData, Tokenizer]:
    train, _ = date_pairs(n, 10, seed=0)
    tok = Tokenizer.train_char([s for s, _ in train] + [t for _, t in train])
    enc = encode_pairs(train, tok, tok, max_length=64)
    return Seq2SeqData(enc, max_tokens, tok.pad_id, tok.bos_id, tok.eos_id, shuffle=True, seed=seed), tok


def test_padded_batches_never_exceed_max_tokens_and_cover_each_epoch():
    data, tok = date_data()
    sources = sorted(tuple(s) for s in data.encoded.src)
    for epoch in range(3):
        batches = data.epoch(epoch)
        seen = []
        for batch in batches:
            assert batch.src.numel() <= data.max_tokens
            assert batch.tgt_in.numel() <= data.max_tokens and batch.tgt_out.numel() <= data.max_tokens
            seen += [tuple(row[row != tok.pad_id].tolist()) for row in batch.src]
        assert sorted(seen) == sources  # every example exactly once
        assert sum(b.n_tokens for b in batches) == sum(len(t) + 1 for t in data.encoded.tgt)


def _signature(batches) -> list:
    return [(b.src.tolist(), b.tgt_in.tolist()) for b in batches]


def test_batches_are_a_pure_function_of_seed_and_epoch():
    data, _ = date_data(seed=7)
    again, _ = date_data(seed=7)
    other_seed, _ = date_data(seed=8)
    assert _signature(data.epoch(2)) == _signature(again.epoch(2))
    assert _signature(data.epoch(0)) != _signature(data.epoch(1))
    assert _signature(data.epoch(0)) != _signature(other_seed.epoch(0))


def test_unshuffled_batches_are_sorted_by_length():
    data, _ = date_data()
    data.shuffle = False
    assert _signature(data.epoch(0)) == _signature(data.epoch(5))
    longest = [max(data.lengths[i] for i in g)
               for g in token_budget_batches(data.lengths, data.max_tokens, shuffle=False)]
    assert longest == sorted(longest)


# --- tokenizers ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def date_texts() -> tuple[list[str], list[str]]:
    train, heldout = date_pairs(500, 50, seed=1)
    return [x for pair in train for x in pair], [x for pair in heldout for x in pair]


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_tokenizers_round_trip_text(kind, date_texts):
    train, heldout = date_texts
    tok = Tokenizer.train(kind, train, vocab_size=400)
    for text in train + heldout:  # held-out dates use the same characters
        ids = tok.encode(text)
        assert tok.special_ids.isdisjoint(ids)
        assert tok.decode(ids) == text
    assert tok.encode_batch(train[:5]) == [tok.encode(t) for t in train[:5]]


def test_bpe_round_trips_text_it_never_saw(date_texts):
    tok = Tokenizer.train("bpe", date_texts[0], vocab_size=400)
    for text in ["Zürich, 3 März — naïve café ☕", "  two  spaces\tand a tab\n", "</s> is text here"]:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_special_token_strings_in_text_stay_text(kind, tmp_path):
    """A literal "</s>" or "<s>" (HTML's strikethrough tag) in the data is text, not a control id:
    otherwise a sentence would carry an EOS in its middle and decode would cut it there."""
    texts = ["a <s>struck</s> word", "plain <pad> and <unk>"] * 20
    tok = Tokenizer.train(kind, texts, vocab_size=300)
    tok.save(tmp_path / "tok.json")
    for t in (tok, Tokenizer.load(tmp_path / "tok.json")):
        for text in texts[:2]:
            ids = t.encode(text)
            assert t.special_ids.isdisjoint(ids)
            assert t.decode(ids) == text
    enc = encode_pairs([(texts[0], texts[1])], tok, tok, max_length=64)
    assert enc.src[0].count(tok.eos_id) == 1 and tok.eos_id not in enc.tgt[0]


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_save_and_load_give_identical_ids(kind, date_texts, tmp_path):
    train, heldout = date_texts
    tok = Tokenizer.train(kind, train, vocab_size=400)
    tok.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.vocab_size == tok.vocab_size
    assert [loaded.encode(t) for t in heldout] == [tok.encode(t) for t in heldout]
    assert [loaded.decode(tok.encode(t)) for t in heldout] == heldout
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_special_token_ids(kind, date_texts):
    tok = Tokenizer.train(kind, date_texts[0], vocab_size=400)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)


def test_decode_stops_at_eos_and_drops_padding_and_bos():
    tok = Tokenizer.train_char(["abc"])
    a, b = tok.encode("a"), tok.encode("b")
    assert tok.decode([tok.bos_id, *a, *b, tok.eos_id, *a, tok.pad_id]) == "ab"
    assert tok.decode([*a, tok.pad_id, *b]) == "ab"


def test_char_tokenizer_maps_unseen_characters_to_unk():
    tok = Tokenizer.train_char(["abc"])
    assert tok.encode("abz") == tok.encode("ab") + [tok.unk_id]
    assert tok.decode(tok.encode("abz")) == "ab<unk>"


@settings(max_examples=200, deadline=None, derandomize=True)  # the same draws in every run
@given(st.text(alphabet=st.sampled_from(list("ab <>/spadunké\n\r\t\u0301😀\x00z")), max_size=40))
def test_char_fast_path_gives_the_librarys_ids(text):
    """encode() of a character tokenizer skips the library for a dict lookup: same ids, including
    unseen characters (<unk>), combining marks, emoji, and special-token spellings in the text."""
    tok = Tokenizer.train_char(["abc <pad> </s> é\n"])
    assert tok.is_char
    assert tok.encode(text) == tok.hf.encode(text, add_special_tokens=False).ids
    assert tok.encode_batch([text, "ab"]) == [tok.encode(text), tok.encode("ab")]


def test_only_exact_character_tokenizers_take_the_fast_path(tmp_path):
    assert not Tokenizer.train_bpe(["hello world"] * 20, 300).is_char
    char = Tokenizer.train_char(["abc"])
    char.save(tmp_path / "tokenizer.json")
    assert Tokenizer.load(tmp_path / "tokenizer.json").is_char  # survives a save and load
    from tokenizers import normalizers

    char.hf.normalizer = normalizers.Lowercase()  # a normalizer changes the ids: no fast path
    assert not Tokenizer(char.hf).is_char


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="BPE vocab_size=100 is too small"):
        Tokenizer.train("bpe", ["abc"], vocab_size=100)
    with pytest.raises(ValueError, match="unknown tokenizer kind 'word'"):
        Tokenizer.train("word", ["abc"])
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a valid tokenizer.json"):
        Tokenizer.load(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        Tokenizer.load(tmp_path / "missing.json")
