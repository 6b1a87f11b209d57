"""The corpora `handformer check` trains a learner's BPE on: a small text written for it (English,
Chinese, emoji, digits, runs of spaces, special tokens between documents) on which every merge is
compared, and a larger generated one that times the trainer."""

from __future__ import annotations

import functools
import random

SPECIAL = "<|endoftext|>"

DOCUMENTS = [
    "The tokenizer reads the text as bytes. Each byte is a token at first, and the trainer joins the "
    "pair of tokens that is seen most often. Then it counts the pairs again, and joins the next one. "
    "After a few hundred merges the common words are single tokens: the, and, token, train.",
    "A learner writes the trainer in an evening. The first version is slow: it counts every pair of the "
    "whole corpus after every merge. The second version keeps the counts and changes only the words "
    "that hold the pair it merged. Both versions must learn the same merges, in the same order.",
    "Numbers are pre-tokens of their own: 2026, 12 01, 3.14159, 1000000. So are the marks, like ?! and "
    "..., and the spaces in front of a word stay with it.   Three spaces here,\tand a tab there.\n\n"
    "New lines are kept too.",
    "我们今天训练一个分词器。分词器先把文本看成字节，每个字节是一个 token。训练时，它把出现次数最多的"
    "一对 token 合并成一个新的 token，然后重新数一遍，再合并下一对。中文的一个字是三个字节，"
    "所以常见的字很快就会变成一个 token。训练、分词、合并、字节，这些词在这里出现了很多次。",
    "Emoji are four bytes each: 🙂 🙂 👍 👍🏽 🎉 and a family 👨‍👩‍👧 joined by zero width joiners. "
    "The flag 🇨🇳 is two symbols. Café, naïve and Ångström have letters of two bytes.",
    "It's a test, isn't it? We'll see. They've trained it, and you're right: the contractions 's 't "
    "'ll 've 're 'd 'm are pre-tokens of their own in GPT-2's pattern.",
    "the the the the and and and token token tokens tokenizer tokenizers train trainer training "
    "merge merges merged merging pair pairs byte bytes text texts word words count counts counted",
    "def count(words):\n    counts = {}\n    for word in words:\n        for pair in zip(word, word[1:]):\n"
    "            counts[pair] = counts.get(pair, 0) + 1\n    return counts\n\n\nclass Merge:\n"
    "    def __init__(self, pair):\n        self.pair = pair\n        self.count = 0\n",
    "aaaa aaaa aaaaaa bbb bbbb abab abab ababab: a pair that overlaps itself is merged left to right, "
    "so aaa becomes aa and a.",
]
CORPUS = SPECIAL.join(DOCUMENTS)
VOCAB_SIZE = 256 + 1 + 180  # the bytes, the special token and 180 merges

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "su",
    "ta",
    "ri",
    "po",
    "el",
    "an",
    "or",
    "is",
    "qu",
    "zh",
    "th",
    "er",
    "on",
    "ve",
    "ly",
    "ing",
    "ed",
    "st",
    "ch",
    "sh",
    "ou",
    "ai",
    "ue",
    "ex",
    "ph",
    "gr",
]


@functools.cache  # the same text each time: made once a process
def timing_corpus(n_bytes: int = 40_000, seed: int = 0, lexicon: int = 6000) -> str:
    """About `n_bytes` of made-up words of one to four syllables (`lexicon` different ones), in documents
    separated by the special token: enough pairs that recounting all of them after every merge is
    slow, while updating the counts of the words a merge changes stays fast."""
    rng = random.Random(seed)
    made_up = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(lexicon)]
    out, size = [], 0
    while size < n_bytes:
        words = [rng.choice(made_up) for _ in range(rng.randint(20, 60))]
        doc = " ".join(words) + "."
        out.append(doc)
        size += len(doc) + len(SPECIAL)
    return SPECIAL.join(out)


TIMING_VOCAB_SIZE = 256 + 1 + 2500  # 2500 merges
