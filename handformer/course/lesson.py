"""What the course's notebooks call: grade a chapter's file with `handformer check` (in the notebook's
own process, in the course's language), import the learner's freshly edited files, and the dates
task (dates written out in words -> ISO dates) as tensors for training their own model.

HANDFORMER_COURSE_SMOKE=1 (set by the tests) makes the notebooks small: at most 50 training steps
(`steps`) of at most 16 sentences (`batch_size`), and 5 sentences to translate (`sentences`); the
LLM chapters' data (tiny Shakespeare, stories260K) is then never downloaded: found through the data
lookup, or a small text in its place (`shakespeare`), or the cell says it is missing (`stories260k`).

Shape legend: B batch, S source length, T target length.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from handformer.course.chapters import CHAPTERS, find_chapter
from handformer.course.texts import ZH
from handformer.data.dates import date_pairs

SMOKE_STEPS, SMOKE_SENTENCES, SMOKE_BATCH = 50, 5, 16
PAD, BOS, EOS = 0, 1, 2


def smoke() -> bool:
    return os.environ.get("HANDFORMER_COURSE_SMOKE", "0") not in ("", "0")


def steps(n: int) -> int:
    """n training steps, or at most 50 in smoke mode."""
    return min(n, SMOKE_STEPS) if smoke() else n


def batch_size(n: int) -> int:
    """n sentences a training batch, or at most 16 in smoke mode."""
    return min(n, SMOKE_BATCH) if smoke() else n


def sentences(n: int) -> int:
    """n sentences to translate, or at most 5 in smoke mode."""
    return min(n, SMOKE_SENTENCES) if smoke() else n


def small(n: int, smoke_n: int) -> int:
    """n, or smoke_n in smoke mode (a size of the LLM chapters' models and runs)."""
    return smoke_n if smoke() else n


def course_dir() -> Path:
    """The folder of the notebook (Jupyter starts the kernel there)."""
    return Path.cwd()


def language() -> str:
    try:
        return json.loads((course_dir() / "course.json").read_text("utf-8"))["lang"]
    except (OSError, ValueError, KeyError):
        return "en"


def tr(text: str, /, **values: object) -> str:
    """What a notebook prints or writes on a plot, in the course's language: TEXT (English) itself, or
    its Chinese from handformer/course/texts.py in a Chinese course; VALUES are filled in as
    `str.format` fills them. The code cells stay the same in both languages."""
    if language() == "zh":
        text = ZH.get(text, text)
    return text.format(**values)


def use_course_fonts() -> None:
    """In a Chinese course, matplotlib draws with the project's font list (a CJK font after the base
    font), so the Chinese labels are not empty boxes; without a CJK font, one line says how to get one."""
    if language() != "zh":
        return
    import matplotlib

    from handformer.see.fonts import cjk_font, font_families

    matplotlib.rcParams["font.family"] = font_families()
    if cjk_font() is None:
        print("没有找到中文字体，图上的中文会显示成方框；"
              "安装一个再重启内核（apt-get install fonts-noto-cjk）", file=sys.stderr)


def fresh(stem: str) -> ModuleType:
    """Import the learner's chapter file anew (and the chapters it imports), so an edit shows."""
    for ch in CHAPTERS:
        sys.modules.pop(ch.stem, None)
    folder = str(course_dir())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()
    return importlib.import_module(stem)


def check(chapter: str) -> bool:
    """Grade the chapter's file with `handformer check`, print the report; True when it passes. In a
    Chinese course it also sets matplotlib's fonts for the chapter's plots (`use_course_fonts`)."""
    from handformer.check.core.engine import check_file
    from handformer.check.core.report import format_report

    ch = find_chapter(chapter)
    use_course_fonts()
    for c in CHAPTERS:  # their neighbours, imported by the file, as they are now
        sys.modules.pop(c.stem, None)
    result = check_file(str(course_dir() / ch.file))
    result.path = ch.file
    print(format_report(result, language()))
    if not result.ok:
        print("Fill in the TODOs (or fix what the report names), then run this cell again."
              if language() == "en" else "把 TODO 写完（或者改掉报告里指出的问题），再运行这个单元格。")
    return result.ok


@dataclass
class DatesTask:
    """Dates in words -> ISO dates, one character a token. Ids: 0 pad, 1 BOS, 2 EOS."""

    train: list[tuple[str, str]]
    test: list[tuple[str, str]]
    src_vocab: list[str]
    tgt_vocab: list[str]
    pad: int = PAD
    bos: int = BOS
    eos: int = EOS

    def encode_src(self, text: str) -> list[int]:
        return [self.src_vocab.index(c) for c in text]

    def encode_tgt(self, text: str) -> list[int]:
        return [BOS] + [self.tgt_vocab.index(c) for c in text] + [EOS]

    def decode_tgt(self, ids: list[int]) -> str:
        return "".join(self.tgt_vocab[i] for i in ids if i > EOS)

    def batch(self, pairs: list[tuple[str, str]]) -> tuple[Tensor, Tensor]:
        """(src (B, S), tgt (B, T)) padded with 0; tgt starts with BOS and ends with EOS."""
        srcs = [self.encode_src(s) for s, _ in pairs]
        tgts = [self.encode_tgt(t) for _, t in pairs]
        src = torch.zeros(len(pairs), max(map(len, srcs)), dtype=torch.long)
        tgt = torch.zeros(len(pairs), max(map(len, tgts)), dtype=torch.long)
        for i, (s, t) in enumerate(zip(srcs, tgts)):
            src[i, : len(s)] = torch.tensor(s)
            tgt[i, : len(t)] = torch.tensor(t)
        return src, tgt

    def batches(self, batch_size: int, n: int, seed: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """n random training batches."""
        rng = random.Random(seed)
        for _ in range(n):
            yield self.batch(rng.sample(self.train, batch_size))


def dates_task(n_train: int = 20000, n_test: int = 500, seed: int = 0) -> DatesTask:
    train, test = date_pairs(n_train, n_test, seed)
    specials = ["<pad>", "<s>", "</s>"]
    src_chars = sorted({c for s, _ in train + test for c in s})
    tgt_chars = sorted({c for _, t in train + test for c in t})
    return DatesTask(train, test, specials + src_chars, specials + tgt_chars)


CHINESE = ["我们从第一个张量写起，一直写到一个训练好的模型。", "每一章都先写代码，再检查，最后画图。",
           "注意力让每个 token 去看别的 token。", "分词器把文本切成 token，再把 token 变成 id。"]


def write_corpus(path: str | Path, n: int, special: str = "<|endoftext|>") -> str:
    """A small corpus for the BPE chapter: n dates in words and a few Chinese sentences, one document
    each, joined by the special token; written to path and returned."""
    train, _ = date_pairs(n, 10, seed=1)
    text = special.join([source for source, _ in train] + CHINESE)
    Path(path).write_text(text, encoding="utf-8")
    return text


class CycleLM(torch.nn.Module):
    """A toy language model for the sampling chapter: it predicts the next character of TEXT after
    the last token with logit `confidence` (the others 0), so sampling at a higher temperature or
    with a wider filter visibly leaves the text. `model(idx (B, T))` -> logits (B, T, V)."""

    def __init__(self, text: str = "abcdefghij", confidence: float = 4.0, block_size: int = 16) -> None:
        super().__init__()
        self.vocab = sorted(set(text))
        following = [text[(text.index(c) + 1) % len(text)] for c in self.vocab]
        self.next = torch.tensor([self.vocab.index(c) for c in following])
        self.confidence = confidence
        self.config = type("Config", (), {"block_size": block_size, "vocab_size": len(self.vocab)})()

    def forward(self, idx: Tensor) -> Tensor:
        logits = torch.zeros(*idx.shape, len(self.vocab))
        return logits.scatter(-1, self.next[idx].unsqueeze(-1), self.confidence)

    def encode(self, text: str) -> Tensor:
        return torch.tensor([[self.vocab.index(c) for c in text]])

    def decode(self, idx: Tensor) -> str:
        return "".join(self.vocab[i] for i in idx[0].tolist())


# --- chapters 16 and 17: real text, a real model ----------------------------------------------------

SMOKE_CHARS = 20_000
SMOKE_TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
              "First Citizen:\nYou are all resolved rather to die than to famish?\n\n")
RUN_C_STORY = (  # llama2.c's run.c: `./run stories260K.bin -z tok512.bin -t 0 -n 256` (tests/test_llama2c.py)
    'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, '
    'she saw a big, red ball. She wanted to play with it, but it was too high.\nLily\'s mom said, "Lily, '
    'let\'s go to the park." Lily was sad and didn\'t know what to do. She said, "I want to play with your '
    'ball, but I can\'t find it."\nLily was sad and didn\'t know what to do. She said, "I\'m sorry, Lily. I '
    'didn\'t know what to do."\nLily didn\'t want to help her mom, so she said, "I\'m sorry, mom. I didn\'t '
    'know what to do." Her mom said, "Don\'t worry, Lily. We can help you.')


def shakespeare() -> str:
    """Tiny Shakespeare through handformer's data lookup (`handformer data get tinyshakespeare`;
    downloaded into the cache when it is nowhere). In smoke mode: its first 20,000 characters when it
    is on this machine, else a few of its lines repeated (nothing is downloaded)."""
    from handformer.data import lookup

    if not smoke():
        return lookup.text_file("tinyshakespeare").read_text("utf-8")
    found = lookup.find("tinyshakespeare", "input.txt")
    if found is None:
        print("tinyshakespeare is not on this machine: a few of its lines stand in (smoke mode)"
              if language() == "en" else "本机没有 tinyshakespeare：用其中几行代替（smoke 模式）")
        return SMOKE_TEXT * 40
    return found.read_text("utf-8")[:SMOKE_CHARS]


@dataclass
class CharText:
    """A text one character a token: the vocabulary, and the ids of its first 90% (train) and the
    rest (val) as 1-D tensors."""

    chars: list[str]
    train: Tensor
    val: Tensor

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


def char_text(text: str) -> CharText:
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    return CharText(chars, data[:n], data[n:])


class HandformerLM(torch.nn.Module):
    """handformer's own Llama (`CausalLM`) of the sizes the course's Llama takes, its forward
    returning the logits (B, T, V) as the learner's does: the model to set theirs beside."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
                 max_len: int) -> None:
        super().__init__()
        from handformer.config import CausalLMConfig
        from handformer.families import build_causal_lm

        cfg = CausalLMConfig.llama_style(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
                                         n_kv_heads=n_kv_heads, d_ff=d_ff, n_layers=n_layers,
                                         max_positions=max_len, norm_eps=1e-6, tie_embeddings=False)
        self.model = build_causal_lm(cfg)

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx).logits


def stories260k() -> Path | None:
    """The folder of llama2.c's stories260K (the model and its tokenizer) through handformer's data
    lookup, downloaded into the cache when it is nowhere; in smoke mode only when it is on this
    machine (else None, and one line says so)."""
    from handformer.data import lookup

    if not smoke():
        return lookup.folder("stories260K")
    found = lookup.find_folder("stories260K")
    if found is None:
        print("stories260K is not on this machine (`handformer data get stories260K`): skipped in smoke "
              "mode" if language() == "en" else "本机没有 stories260K（`handformer data get stories260K`）："
              "smoke 模式下跳过")
    return found


def story_tokenizer(folder: Path) -> Any:
    """stories260K's 512-token tokenizer (tok512.bin), read by handformer."""
    from handformer.convert.llama2c_tokenizer import llama2c_tokenizer

    return llama2c_tokenizer(folder / "tok512.bin", 512)


@torch.no_grad()
def handformer_story(folder: Path, n: int) -> list[int]:
    """handformer's import of stories260K.bin, greedy from BOS (id 1) for n tokens: the ids."""
    from handformer.check.runners.llama2c import handformer_import

    model = handformer_import(folder / "stories260K.bin")
    idx = torch.tensor([[BOS]])
    for _ in range(n):
        idx = torch.cat([idx, model(idx).logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # (1, T + 1)
    return idx[0].tolist()
