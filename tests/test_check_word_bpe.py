"""A BPE trained on words (text cut at spaces, each word's characters, </w> at its end: a symbol of its
own or glued to the last character), in two styles: a tokenizer class with Chinese comments
(train(texts, vocab_size), encode to symbol strings) and Sennrich's free functions (learn_bpe(corpus,
num_merges) over a {"l o w</w>": 5} vocabulary, encode(text, bpe_codes), decode); and one with no
marker whose train takes a list of texts (it learns nothing from one string); and the paper's snippet
(get_stats and merge_vocab, the loop at the top level: check runs the loop). Each passes with every
component checked; each plant fails at its line: pairs counted once per word, merges across words, and
in one file of the class (graded apart) a pair count, encode by the latest merge, decode dropping </w>."""

from __future__ import annotations

import pytest
from check_results import checked, named, statuses

FILES = {"zh": ("learners_wordbpe_zh", ("correct", "planted")),
         "sennrich": ("learners_wordbpe_sennrich", ("correct", "counts_words_once", "merges_across_words")),
         "plain": ("learners_wordbpe_plain", ("correct",)),
         "snippet": ("learners_wordbpe_snippet", ("correct", "pair_counted_once"))}


@pytest.fixture(scope="module")
def results():
    return {(style, name): checked(folder, name) for style, (folder, names) in FILES.items() for name in names}


@pytest.mark.parametrize("style", FILES)
def test_a_correct_word_level_bpe_passes_with_every_component_checked(results, style):
    assert set(statuses(results[style, "correct"]).values()) == {"pass"}


@pytest.mark.parametrize(("style", "plant", "comp", "finding", "line"), [
    ("zh", "planted", "BPETokenizer", "departs", "pairs[pair] += 1"),
    ("zh", "planted", "BPETokenizer", "departs", 'return "".join(tokens).replace("</w>", "")'),
    ("zh", "planted", "BPETokenizer", "bpe_encode_merge_order", "-self.ranks.get(p, -1)"),
    ("sennrich", "counts_words_once", "learn_bpe", "departs", "pairs[symbols[i], symbols[i + 1]] += 1"),
    ("sennrich", "merges_across_words", "learn_bpe", "bpe_merges_across_pretokens", '" ".join(" ".join([word]'),
    ("sennrich", "merges_across_words", "encode", "bpe_merges_across_pretokens", '" ".join(" ".join([word]'),
    ("snippet", "pair_counted_once", "get_stats", "departs", "pairs[symbols[i], symbols[i + 1]] = freq"),
])
def test_each_plant_fails_at_its_line(results, style, plant, comp, finding, line):
    result = results[style, plant]
    assert statuses(result)[comp] == "fail"
    assert any(name == finding and line in (code or "") for name, code in named(result, comp)), \
        named(result, comp)
