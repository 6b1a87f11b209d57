"""The chapters of the course, in the order of the tutorial series: each one starter file, the
`handformer check` kinds that grade it, and a notebook."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    number: int
    stem: str  # the starter file is STEM.py, the notebook STEM.ipynb
    en: str  # the title
    zh: str
    kinds: tuple[str, ...]  # the kinds of handformer check its components are graded as

    @property
    def file(self) -> str:
        return f"{self.stem}.py"

    @property
    def notebook(self) -> str:
        return f"{self.stem}.ipynb"


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(1, "ch01_inputs", "Inputs and positions", "输入与位置编码", ("positional_encoding",)),
    Chapter(2, "ch02_attention", "Attention", "注意力", ("sdpa", "causal_mask")),
    Chapter(3, "ch03_multi_head", "Multi-head attention", "多头注意力", ("mha",)),
    Chapter(4, "ch04_ffn_norm", "FFN, residual and norm", "前馈网络、残差与归一化", ("ffn", "layernorm")),
    Chapter(5, "ch05_layers", "Encoder and decoder layers", "编码器层与解码器层",
            ("encoder_layer", "decoder_layer")),
    Chapter(6, "ch06_model", "The assembled model and masks", "组装模型与掩码",
            ("mask_helper", "transformer")),
    Chapter(7, "ch07_loss_schedule", "Loss and schedule", "损失函数与学习率调度", ("loss", "schedule")),
    Chapter(8, "ch08_training", "Training", "训练", ("train_step", "train_epoch")),
    Chapter(9, "ch09_decoding", "Greedy and beam decoding", "贪心解码与束搜索",
            ("greedy_decode", "beam_search")),
    Chapter(10, "ch10_decoder_only", "The decoder-only block", "decoder-only 块",
            ("rmsnorm", "ffn", "block")),
    Chapter(11, "ch11_sampling", "Sampling and generate", "采样与 generate",
            ("temperature", "top_k", "top_p", "sample", "generate")),
    Chapter(12, "ch12_bpe", "A BPE tokenizer", "BPE 分词器", ("bpe", "bpe_tokenizer")),
)


def find_chapter(name: str) -> Chapter:
    """A chapter by number (`3`, `03`), stem (`ch03_multi_head`) or the stem's tail (`multi_head`)."""
    key = name.strip().removesuffix(".py").removesuffix(".ipynb")
    for ch in CHAPTERS:
        if key in (str(ch.number), f"{ch.number:02d}", ch.stem, ch.stem.split("_", 1)[1]):
            return ch
    known = ", ".join(f"{ch.number} ({ch.stem})" for ch in CHAPTERS)
    raise ValueError(f"unknown chapter {name!r}; the chapters are: {known}")
