"""The diagnoses of the tokenizer chapter: a byte-level BPE trainer, its encoder and its decoder; a
WordPiece trainer, its encoder and its decoder (BERT's)."""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d(
        "bpe_merges_across_pretokens",
        "merges cross pre-token boundaries: the text is not split by the pre-tokenizer first",
        "合并跨过了预分词的边界：文本没有先用预分词切开",
        "split each piece of text with the pre-tokenizer first (GPT-2's pattern for a byte-level BPE: "
        "regex.finditer(PAT, text); for WordPiece the words and each punctuation mark: re.findall(r\"\\w+|"
        "[^\\w\\s]\", text)) and count pairs only inside each pre-token, in training and in encode",
        "先用预分词把每段文本切开（字节级 BPE 用 GPT-2 的正则：regex.finditer(PAT, text)；WordPiece 切成"
        "单词，每个标点单独一个：re.findall(r\"\\w+|[^\\w\\s]\", text)），训练和 encode 都只在"
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
        "bpe_pairs_not_weighted",
        "the pair counts ignore how often each pre-token occurs: each distinct one counts once",
        "数相邻的对时没有乘上预分词出现的次数：每个不同的预分词只算了一次",
        "add the pre-token's count for each of its pairs: counts[pair] += freq (and subtract it when a "
        "merge changes the pre-token)",
        "每个预分词的每一对都加上它的出现次数：counts[pair] += freq（合并改变这个预分词时再减去）",
        r"\[\s*\w+(\[[^\]]*\])?\s*,\s*\w+(\[[^\]]*\])?\s*\]\s*[-+]=\s*1\b",  # pairs[a, b] += 1
        r"\[\s*\w*pair\w*\s*\]\s*[-+]=\s*1\b",  # counts[pair] += 1
        r"Counter\(\s*zip\(|\.update\(\s*zip\(",
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

WORDPIECE_DIAGNOSES: list[Diagnosis] = [
    d(
        "wordpiece_pair_score",
        "the pair score is not freq(pair) / (freq(first) * freq(second))",
        "一对的得分不是 freq(pair) / (freq(first) * freq(second))",
        "score each pair by its frequency divided by the product of its two parts' frequencies, all counted "
        "with each word's frequency: pair_freq / (freq[a] * freq[b]); merge the best score, not the most "
        "frequent pair",
        "每一对的得分是它的次数除以两部分各自次数的乘积，都按词频计数：pair_freq / (freq[a] * freq[b])；"
        "合并得分最高的一对，而不是出现最多的一对",
        r"/\s*\(?\s*(self\.)?\w*freq\w*\[",
        r"\{\s*\w+\s*:\s*\w*freq\w*\s+for\b",  # a table of scores that are the frequencies
        r"max\(.*freq",
        r"/.*freq",
        r"/\s*\(\s*[\w.]+\[[^\]]*\]\s*[-+*]",  # a division by two counts combined: n / (c[a] + c[b])
        r"score",
    ),
    d(
        "wordpiece_shortest_match",
        "encode takes the shortest piece of the vocabulary first, not the longest",
        "encode 先取词表里最短的片段，而不是最长的",
        "at each position try the whole rest of the word first and shorten it by one until a piece of the "
        "vocabulary matches: end = len(word), then end -= 1",
        "在每个位置先试剩下的整段，再每次缩短一个字符，直到词表里有这个片段：end = len(word)，然后 end -= 1",
        r"range\(\s*\w+\s*\+\s*1",
        r"\bend\s*\+=\s*1",
        r"\bend\s*=\s*\w+\s*\+\s*1",
        r"while.*\bend\b",
    ),
    d(
        "wordpiece_missing_prefix",
        'the pieces inside a word are looked up or learnt without their "##" prefix',
        "词中间的片段查词表（或训练）时没有加 \"##\" 前缀",
        'a piece that does not start its word is "##" + the piece: substr = "##" + word[start:end] when '
        'start > 0; in training spell a word as [word[0]] + ["##" + c for c in word[1:]]',
        '不在词首的片段要写成 "##" + 片段：start > 0 时 substr = "##" + word[start:end]；训练时把词拆成 '
        '[word[0]] + ["##" + c for c in word[1:]]',
        r"\w+\s*=\s*\w+\[\s*\w+\s*:\s*\w+\s*\]\s*$",
        r"\[\s*\w+\s*:\s*\w+\s*\]",
        r"list\(\s*\w+\s*\)",
        r"in\s+(self\.)?\w*vocab",
    ),
    d(
        "wordpiece_unk_piece",
        "a word that cannot be split keeps pieces beside [UNK], instead of becoming [UNK] whole",
        "切不开的词留下了 [UNK] 之外的片段，而不是整个词变成 [UNK]",
        "when no piece of the vocabulary matches at some position, the whole word is [UNK]: return "
        "[unk_token] (BERT's is_bad)",
        "某个位置上词表里没有能匹配的片段时，整个词就是 [UNK]：return [unk_token]（BERT 的 is_bad）",
        r"\+\s*\[\s*(self\.)?\w*unk",
        r"(append|extend)\(\s*\[?\s*(self\.)?\w*unk",
        r"(?i)unk",
    ),
    d(
        "wordpiece_decode_continuation",
        'decode does not glue a "##" piece onto the word before it',
        'decode 没有把 "##" 开头的片段接到前一个词上',
        'a piece that starts with "##" goes onto the last word without its "##": words[-1] += token[2:]; the '
        "words are joined with spaces",
        '以 "##" 开头的片段去掉 "##" 后接到最后一个词上：words[-1] += token[2:]；词与词之间用空格连接',
        r"append\(\s*\w+\[\s*2\s*:",
        r"append\(\s*\w+\.(removeprefix|lstrip)\(",
        r"\[\s*-1\s*\]\s*\+=\s*\w+\s*$",  # words[-1] += token: the "##" glued on with it
        r"replace\(\s*['\"]\s*$",  # replace("##", ...): a line is read up to its first "#"
        r"append\(",
        r"join\(",
    ),
]
DIAGNOSES += WORDPIECE_DIAGNOSES
# where a WordPiece trainer or encoder cuts its text by spaces alone (`for word in text.split():`), the
# line the BPE's mistake of the same name is quoted at in a WordPiece file
WORDPIECE_LINES = {"bpe_merges_across_pretokens": (r"\.split\(\s*\)", r"for \w+ in \[\s*\w+\s*\]\s*:",
                                                   r"for \w+ in \w+\s*:")}
# the lines a word-level BPE's findings are quoted at (runners/bpe_words.py): its pair count, its joins
# across words (pairs counted over the whole text), its decode
WORD_BPE_LINES = {
    "count": (r"pair.*\+=\s*1\s*$", r"pair.*\+=", r"\+=\s*1\s*$", r"\+=", r"pair\w*\[.*\]\s*=[^=]",
              r"Counter\("),
    "bpe_merges_across_pretokens": (r"\.join\(.*\)\.split\(\s*\)", r"\.split\(\s*\)", r"zip\("),
    "decode": (r"replace\([^)]*</w>", r"</w>", r"\.replace\(", r"^\s*return\b"),
}
