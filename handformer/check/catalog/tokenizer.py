"""The diagnoses of the tokenizer chapter: a byte-level BPE trainer, its encoder and its decoder."""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d(
        "bpe_merges_across_pretokens",
        "merges cross pre-token boundaries: the text is not split by the pre-tokenizer first",
        "合并跨过了预分词的边界：文本没有先用预分词切开",
        "split each piece of text with GPT-2's pattern first (regex.finditer(PAT, text)) and count pairs "
        "only inside each pre-token, in training and in encode",
        "先用 GPT-2 的正则把每段文本切成预分词（regex.finditer(PAT, text)），训练和 encode 都只在"
        "一个预分词内部数相邻的对",
        r"for \w+ in \[\s*\w+\s*\]\s*:",  # `for token in [text]:` the whole text one pre-token
        r"for \w+ in (?!match)\w+\.encode\(",
        r"\.append\(\s*(?:chunk|text|piece|part|doc|document|segment)\w*\s*\)",  # a whole piece as one word
        r"\b(chunk|text|piece|part|doc|document|segment)\w*\.encode\(",
        r"finditer|findall",
        r"encode\(",
    ),
    d(
        "bpe_special_tokens_merged",
        "the special tokens' text is trained on: its bytes get merged",
        "特殊 token 的文本也参与了训练，它的字节被合并了",
        "cut the text at the special tokens before pre-tokenizing (regex.split over their escaped forms) and "
        "train only on the pieces between them",
        "预分词之前先在特殊 token 处把文本切开"
        "（用转义后的特殊 token 做 regex.split），只在它们之间的文本上训练",
        r"=\s*\[\s*text\s*\]\s*$",
        r"re\.split|regex\.split|\.split\(",
        r"special",
    ),
    d(
        "bpe_ties_not_by_bytes",
        "ties between equally frequent pairs are broken by the order the pairs "
        "were counted in, not by their bytes",
        "出现次数相同的对，按被数到的先后选，而不是按字节比较",
        "break ties by the lexicographically greater pair: max(counts, key=lambda p: (counts[p], p))",
        "并列时按字节的字典序，取更大的一对：max(counts, key=lambda p: (counts[p], p))",
        r"max\(.*key\s*=\s*\w+\.get",
        r"max\(|most_common\(",
        r"sorted\(",
    ),
    d(
        "bpe_counts_not_updated",
        "the pair counts are never updated after a merge",
        "合并之后没有更新各对的出现次数",
        "after each merge, recount the pairs of the words that hold it (subtract their old pairs, add their "
        "new ones), then pick the next most frequent pair",
        "每次合并之后，把含有这一对的词重新计数（减去它们原来的对，加上新的对），再选下一对出现最多的",
        r"del \w*counts?\w*\[",
        r"\.pop\((best|pair|top)",
        r"merges\.append\(",
    ),
    d(
        "bpe_vocab_size_ignores_specials",
        "the number of merges leaves the special tokens out of vocab_size, so the vocabulary is too big",
        "合并次数没有把特殊 token 算进 vocab_size，词表超出了 vocab_size",
        "vocab_size counts everything: stop when len(vocab) == vocab_size, i.e. after vocab_size - 256 - "
        "len(special_tokens) merges",
        "vocab_size 包括全部 token：len(vocab) == vocab_size 时停下，也就是"
        "合并 vocab_size - 256 - len(special_tokens) 次",
        r"vocab_size\s*-\s*256",
        r"vocab_size",
    ),
    d(
        "bpe_special_token_split",
        "encode splits the special tokens into ordinary tokens",
        "encode 把特殊 token 拆成了普通 token",
        "cut the text at the special tokens first (regex.split with a capturing group) and emit each one's "
        "own id",
        "先在特殊 token 处把文本切开（带捕获组的 regex.split），每个特殊 token 直接输出它自己的 id",
        # a piece of text looked up in the table keyed by id (decode's lookup of an id is right)
        r"\bif\s+(?!(?:i|idx|id|ids|token_id|tid)\b)\w+\s+in\s+(?:self\.)?\w*(?:inverse|id_to|itos|by_id|id2)\w*",
        r"=\s*\[\s*text\s*\]",
        r"special",
    ),
    d(
        "bpe_overlapping_specials",
        "a special token inside a longer one wins: the longer special token is split",
        "较短的特殊 token 抢先匹配，较长的、包含它的特殊 token 被拆开了",
        "try the longer special tokens first: sorted(special_tokens, key=len, reverse=True)",
        "先匹配较长的特殊 token：sorted(special_tokens, key=len, reverse=True)",
        r"self\.\w*special\w*\s*=",
        r"special_tokens\s*=(?!\s*None)",
        r"re\.split|regex\.split",
        r"special",
    ),
    d(
        "bpe_encode_merge_order",
        "encode applies the merges in the wrong order",
        "encode 合并的顺序错了",
        "in each pre-token, merge the pair with the lowest rank (the earliest learnt) first, again until "
        "no pair has a rank: min(pairs, key=ranks.get)",
        "在每个预分词里，先合并排名最靠前（最早学到）的那一对，重复到没有能合并的对为止：min(pairs, "
        "key=ranks.get)",
        r"pairs\[0\]|\[0\]\s*$",
        r"reversed\(|\[::-1\]",
        r"\bmax\(.*(?:merge|rank)",  # the pair learnt last first
        r"min\(",
        r"rank",
    ),
    d(
        "bpe_decode_per_token",
        "decode turns each token into text on its own, so characters whose bytes "
        "are split over tokens become U+FFFD",
        "decode 逐个 token 转成文本，字节分在几个 token 里的字变成了 U+FFFD",
        'join the bytes of every id first, then decode once: b"".join(vocab[i] for i in ids).decode("utf-8", '
        'errors="replace")',
        '先把所有 id 的字节拼起来，再解码一次：b"".join(vocab[i] for i in ids).decode("utf-8", '
        'errors="replace")',
        r"join\(.*decode\(",
        r"\.decode\(",  # a call, not decode's `def decode(`
        r"decode\(",
    ),
    d(
        "bpe_decode_strict",
        "decode raises on bytes that are not UTF-8",
        "遇到不是合法 UTF-8 的字节，decode 抛出异常",
        'decode with errors="replace": ids can end halfway through a character, or hold bytes that are not '
        "UTF-8 at all",
        '解码时用 errors="replace"：id 序列可能停在一个字的中间，也可能含有根本不是 UTF-8 的字节',
        r"\.decode\((?!.*errors)",
        r"\.decode\(",
    ),
]
