"""The words on `handformer explain`'s figures, in English and in Chinese.

Every title and label a figure draws is a template here, looked up by key and filled with
`str.format` values, so both languages show the same numbers. Chinese uses the tutorials' terms
(注意力, 掩码, 因果掩码, 位置编码, ...).
"""

from __future__ import annotations

import sys

from handformer.see.fonts import cjk_font

LANGUAGES = ("en", "zh")

TEXTS: dict[str, dict[str, str]] = {
    # softmax_temperature.png
    "temp.panel": {"en": "T = {t}", "zh": "T = {t}"},
    "temp.argmax": {"en": " (argmax)", "zh": "（取最大值）"},
    "temp.xlabel": {"en": "score", "zh": "分数"},
    "temp.ylabel": {"en": "probability", "zh": "概率"},
    "temp.title": {"en": "softmax(scores / T): low temperature sharpens, high temperature flattens",
                   "zh": "softmax(分数 / T)：温度低分布变尖，温度高分布变平"},
    # scaling.png
    "scale.raw": {"en": "raw q·k", "zh": "未缩放的 q·k"},
    "scale.spread": {"en": "spread (std) of the scores", "zh": "分数的标准差"},
    "scale.std": {"en": "std over random q, k", "zh": "随机 q、k 上的标准差"},
    "scale.max": {"en": "largest attention weight in a row", "zh": "一行中最大的注意力权重"},
    "scale.entropy": {"en": "entropy of a row (nats)", "zh": "一行的熵（nat）"},
    "scale.onehot": {"en": "one-hot", "zh": "one-hot"},
    "scale.uniform": {"en": "uniform over {n} keys", "zh": "{n} 个键上的均匀分布"},
    "scale.title": {"en": "without the 1/√d_k scale, scores grow like √d_k and softmax saturates to "
                          "one-hot (measured: random vectors, {n} keys)",
                    "zh": "不除以 √d_k 时，分数随 √d_k 增长，softmax 饱和成 one-hot"
                          "（实测：随机向量，{n} 个键）"},
    # positional_encoding.png
    "pe.dim": {"en": "dimension i of the encoding", "zh": "编码的第 i 维"},
    "pe.position": {"en": "position", "zh": "位置"},
    "pe.curve": {"en": "dim {dim} (sin)", "zh": "维 {dim}（sin）"},
    "pe.slow": {"en": "low dimensions change fast, high ones slowly",
                "zh": "低维变化快，高维变化慢"},
    "pe.title": {"en": "PE[pos, 2i] = sin(pos / 10000^(2i/D)),  PE[pos, 2i+1] = cos(pos / 10000^(2i/D))",
                 "zh": "位置编码：PE[pos, 2i] = sin(pos / 10000^(2i/D))，"
                       "PE[pos, 2i+1] = cos(pos / 10000^(2i/D))"},
    # masks.png
    "mask.padding": {"en": "padding", "zh": "填充掩码"},
    "mask.causal": {"en": "causal", "zh": "因果掩码"},
    "mask.both": {"en": "padding & causal", "zh": "填充掩码与因果掩码"},
    "mask.panel": {"en": "{name} mask, sentence {row}", "zh": "{name}，句子 {row}"},
    "mask.query": {"en": "query (row)", "zh": "查询（行）"},
    "mask.key": {"en": "key (column)", "zh": "键（列）"},
    "mask.title": {"en": "masks in handformer: True (green) = may attend; padding hides <pad> keys, "
                         "causal hides the future",
                   "zh": "handformer 的掩码：True（绿色）= 可以看；填充掩码屏蔽 <pad> 键，"
                         "因果掩码屏蔽未来位置"},
    # top_k_top_p.png
    "sample.full": {"en": "softmax(logits): all {n} tokens", "zh": "softmax(logits)：全部 {n} 个 token"},
    "sample.top_k": {"en": "top-k, k = {k}: {kept} tokens kept",
                     "zh": "top-k，k = {k}：保留 {kept} 个 token"},
    "sample.top_p": {"en": "top-p, p = {p}: {kept} tokens kept (nucleus)",
                     "zh": "top-p，p = {p}：保留 {kept} 个 token（核采样）"},
    "sample.token": {"en": "token (most likely first)", "zh": "token（按概率从高到低）"},
    "sample.prob": {"en": "probability", "zh": "概率"},
    "sample.before": {"en": "before filtering", "zh": "过滤前"},
    "sample.after": {"en": "kept, renormalised", "zh": "保留后重新归一化"},
    "sample.cumulative": {"en": "cumulative probability", "zh": "累计概率"},
    "sample.title": {"en": "sampling filters on the same logits (handformer.generation.sampling): "
                           "top-k keeps a fixed count, top-p the smallest set reaching p",
                     "zh": "同一组 logits 上的采样过滤（handformer.generation.sampling）："
                           "top-k 保留固定个数，top-p 保留累计概率达到 p 的最小集合"},
    # data_flow.png
    "flow.src_ids": {"en": "source ids", "zh": "源端 token id"},
    "flow.tgt_ids": {"en": "target ids (BOS + output so far)", "zh": "目标端 token id（BOS + 已生成的输出）"},
    "flow.embed": {"en": "{name} × √{d} + positions", "zh": "{name} × √{d} + 位置编码"},
    "flow.encoder": {"en": "{n} × EncoderLayer\n\nself-attention\nweights {w}\n\nfeed-forward\n{f} inside"
                           "\n\nout {o}",
                     "zh": "{n} × EncoderLayer\n\n自注意力\n权重 {w}\n\n前馈网络\n内部 {f}\n\n输出 {o}"},
    "flow.decoder": {"en": "{n} × DecoderLayer\n\nmasked self-attention\nweights {w}\n\ncross-attention "
                           "(K, V from memory)\nweights {c}\n\nfeed-forward\n{f} inside\n\nout {o}",
                     "zh": "{n} × DecoderLayer\n\n带掩码的自注意力\n权重 {w}\n\n交叉注意力（K、V 来自"
                           "编码器输出）\n权重 {c}\n\n前馈网络\n内部 {f}\n\n输出 {o}"},
    "flow.memory": {"en": "memory (encoder output)", "zh": "memory（编码器输出）"},
    "flow.generator": {"en": "generator (Linear to the vocabulary)", "zh": "generator（线性层映射到词表）"},
    "flow.prompt": {"en": "token ids (prompt)", "zh": "token id（提示词）"},
    "flow.lm_embed": {"en": "embed + {position} positions", "zh": "词嵌入 + {position}位置编码"},
    "pos.sinusoidal": {"en": "sinusoidal", "zh": "正弦"},
    "pos.learned": {"en": "learned", "zh": "可学习"},
    "pos.rope": {"en": "rotary", "zh": "旋转"},
    "pos.none": {"en": "no", "zh": "无"},
    "flow.block": {"en": "{n} × DecoderOnlyBlock ({placement}-norm)\n\ncausal self-attention\nweights {w}"
                         "\n\nfeed-forward\n{f} inside\n\nout {o}",
                   "zh": "{n} × DecoderOnlyBlock（{placement}-norm）\n\n因果自注意力\n权重 {w}"
                         "\n\n前馈网络\n内部 {f}\n\n输出 {o}"},
    "flow.final_norm": {"en": "final norm", "zh": "最后的归一化"},
    "flow.lm_head": {"en": "lm_head (Linear to the vocabulary)", "zh": "lm_head（线性层映射到词表）"},
    "flow.logits": {"en": "logits", "zh": "logits"},
    "flow.seq2seq": {"en": "encoder-decoder, paper-base preset (translation)",
                     "zh": "编码器-解码器，paper-base 预设（翻译）"},
    "flow.decoder_only": {"en": "decoder-only, gpt2 preset (language model)",
                          "zh": "Decoder-only，gpt2 预设（语言模型）"},
    "flow.title": {"en": "data flow with the shapes handformer.see.trace records for a batch of 2 "
                         "(source/prompt length 10, target length 5)",
                   "zh": "数据流，形状由 handformer.see.trace 在一个 batch 上记录"
                         "（batch 2，源句/提示词长 10，目标长 5）"},
    "experts.title": {"en": "where the router sends each token (handformer experts)",
                      "zh": "路由器把每个 token 送往哪些专家（handformer experts）"},
    "experts.layer": {"en": "layer {layer}", "zh": "层 {layer}"},
    "experts.balanced": {"en": "balanced: k T / E = {k} x {T} / {E}",
                         "zh": "均衡时：k T / E = {k} × {T} / {E}"},
    "experts.expert": {"en": "expert", "zh": "专家"},
    "experts.tokens": {"en": "tokens routed to the expert", "zh": "送到该专家的 token 数"},
    "experts.counts": {"en": "tokens per expert (top-k choices)", "zh": "每个专家收到的 token（top-k 选择）"},
    "experts.weights": {"en": "router weights, layer {layer} (top-{k} outlined)",
                        "zh": "路由权重，层 {layer}（框出的是 top-{k}）"},
}


class Captions:
    """Looks up `TEXTS[key][lang]` and fills it: `text("temp.panel", t=0.5)`."""

    def __init__(self, lang: str = "en") -> None:
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; choose one of {', '.join(LANGUAGES)}")
        self.lang = lang

    def __call__(self, key: str, **values: object) -> str:
        return TEXTS[key][self.lang].format(**values)


def captions_for(lang: str) -> Captions:
    """Captions in `lang`; for Chinese without an installed CJK font, one warning line on stderr and
    English captions (a figure of empty boxes helps nobody)."""
    captions = Captions(lang)
    if lang == "zh" and cjk_font() is None:
        print("warning: no Chinese (CJK) font installed, so the figures keep English labels; for "
              "Chinese ones install a CJK font (apt-get install fonts-noto-cjk)", file=sys.stderr)
        return Captions("en")
    return captions
