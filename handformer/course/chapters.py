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
    tutorial: tuple[str, str]  # the tutorials' chapters it follows (en, zh)
    tour: int  # the section of docs/tour.md (docs/zh/tour.md) that reads the same code in handformer

    @property
    def file(self) -> str:
        return f"{self.stem}.py"

    @property
    def notebook(self) -> str:
        return f"{self.stem}.ipynb"


H3, T3 = "手写Transformer 03", "图解Transformer 03"
NEXT_EN = "the chapter 图解Transformer 03 announces"
NEXT_ZH = "图解Transformer 03 预告的下一章"

CHAPTERS: tuple[Chapter, ...] = (
    Chapter(1, "ch01_inputs", "Inputs and positional encoding", "输入与位置编码", ("positional_encoding",),
            ("手写Transformer 02 (the input layer)", "手写Transformer 02（输入层）"), 3),
    Chapter(2, "ch02_attention", "Attention", "注意力", ("sdpa", "causal_mask"),
            (f"{H3} §1; the causal mask: {NEXT_EN}", f"{H3} 第 1 节；因果掩码：{NEXT_ZH}"), 4),
    Chapter(3, "ch03_multi_head", "Multi-head attention", "多头注意力", ("mha",),
            (f"{H3} §1.4 and §2; {T3} §2-9", f"{H3} 第 1.4、2 节；{T3} 第 2-9 节"), 7),
    Chapter(4, "ch04_ffn_norm", "FFN, residual and norm", "前馈网络、残差与归一化", ("ffn", "layernorm"),
            (f"{H3} §3 and §4; {T3} §10, 12, 13", f"{H3} 第 3、4 节；{T3} 第 10、12、13 节"), 8),
    Chapter(5, "ch05_layers", "Encoder and decoder layers", "编码器层与解码器层",
            ("encoder_layer", "decoder_layer"), (f"{H3} §5-7", f"{H3} 第 5-7 节"), 10),
    Chapter(6, "ch06_model", "The assembled model and masks", "组装模型与掩码",
            ("mask_helper", "transformer"),
            ("手写Transformer 04 (assembling the model)", "手写Transformer 04（模型组装）"), 12),
    Chapter(7, "ch07_loss_schedule", "Loss and schedule", "损失函数与学习率调度", ("loss", "schedule"),
            ("手写Transformer 05 (training)", "手写Transformer 05（训练）"), 13),
    Chapter(8, "ch08_training", "Training", "训练", ("train_step", "train_epoch"),
            ("手写Transformer 05 (training)", "手写Transformer 05（训练）"), 13),
    Chapter(9, "ch09_decoding", "Greedy and beam decoding", "贪心解码与束搜索",
            ("greedy_decode", "beam_search"),
            ("手写Transformer 05 (inference); beam search goes past it",
             "手写Transformer 05（推理）；束搜索是教程之外的一步"), 13),
    Chapter(10, "ch10_decoder_only", "The decoder-only Block", "decoder-only Block",
            ("rmsnorm", "ffn", "block"),
            (f"{T3} §11, 13, 14 (SwiGLU, RMSNorm, the Block); decoder-only: {NEXT_EN}",
             f"{T3} 第 11、13、14 节（SwiGLU、RMSNorm、Block）；decoder-only：{NEXT_ZH}"), 14),
    Chapter(11, "ch11_sampling", "Sampling and generate", "采样与 generate",
            ("temperature", "top_k", "top_p", "sample", "generate"),
            (f"{NEXT_EN} (generation, logits, sampling)", f"{NEXT_ZH}（自回归生成、logits、采样）"), 18),
    Chapter(12, "ch12_bpe", "A BPE tokenizer", "BPE 分词器", ("bpe", "bpe_tokenizer"),
            ("past the tutorials (a tokenizer of your own)", "教程之外（自己写一个分词器）"), 2),
    Chapter(13, "ch13_gpt", "Your GPT", "你自己的 GPT", ("gpt",),
            (f"{NEXT_EN} (a decoder-only model)", f"{NEXT_ZH}（decoder-only 模型）"), 17),
    Chapter(14, "ch14_llama", "RoPE, grouped-query attention and Llama", "RoPE、GQA 与 Llama",
            ("rope", "gqa", "block", "gpt"),
            ("past the tutorials (llama2.c's model)", "教程之外（llama2.c 的模型）"), 17),
    Chapter(15, "ch15_kv_cache", "The KV cache", "KV 缓存", ("kv_cache", "generate"),
            (f"{NEXT_EN} (generation), made fast", f"{NEXT_ZH}（自回归生成）的提速"), 18),
    Chapter(16, "ch16_train_gpt", "Train your GPT on real text", "在真实文本上训练你的 GPT",
            ("lm_train_step",), ("手写Transformer 05 (training), on a language model",
                                 "手写Transformer 05（训练），换成语言模型"), 13),
    Chapter(17, "ch17_stories", "A real model in your code", "真实的模型跑在你的代码里",
            ("llama2c", "generate"),
            ("past the tutorials (llama2.c's stories260K)", "教程之外（llama2.c 的 stories260K）"), 17),
)


def find_chapter(name: str) -> Chapter:
    """A chapter by number (`3`, `03`), stem (`ch03_multi_head`) or the stem's tail (`multi_head`)."""
    key = name.strip().removesuffix(".py").removesuffix(".ipynb")
    for ch in CHAPTERS:
        if key in (str(ch.number), f"{ch.number:02d}", ch.stem, ch.stem.split("_", 1)[1]):
            return ch
    known = ", ".join(f"{ch.number} ({ch.stem})" for ch in CHAPTERS)
    raise ValueError(f"unknown chapter {name!r}; the chapters are: {known}")
