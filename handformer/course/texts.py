"""What the course's notebooks print and write on their plots, in Chinese: the code cells are the same
in both languages and call `lesson.tr("english text", **values)`, which looks the text up here in a
Chinese course (its language is in course.json) and fills in the values as `str.format` does."""

from __future__ import annotations

ZH: dict[str, str] = {
    # chapter 1
    "position": "位置",
    "dimension": "维度",
    # chapter 2
    "no mask": "不加掩码",
    "causal mask": "因果掩码",
    "key": "键",
    "query": "查询",
    # chapter 3
    "output {out}, attention weights {weights}": "输出 {out}，注意力权重 {weights}",
    "head {h}": "头 {h}",
    # chapter 4
    "before the norm: mean {mean:.2f}, std {std:.2f}": "归一化之前：均值 {mean:.2f}，标准差 {std:.2f}",
    "after the norm:  mean {mean:.2f}, std {std:.2f}": "归一化之后：均值 {mean:.2f}，标准差 {std:.2f}",
    "value": "数值",
    "count": "个数",
    # chapter 5
    "source position": "源端位置",
    "target position": "目标端位置",
    "cross-attention, averaged over the heads": "交叉注意力（各头平均）",
    # chapter 6
    "shapes: src_mask {src}, tgt_mask {tgt}, logits {logits}":
        "形状：src_mask {src}，tgt_mask {tgt}，logits {logits}",
    "src_mask (the same for every query)": "src_mask（每个查询都一样）",
    "tgt_mask (causal and padding)": "tgt_mask（因果 + 填充）",
    # chapter 7
    "warmup {warmup}": "预热 {warmup} 步",
    "step / 50": "步数 / 50",
    "learning rate": "学习率",
    "loss over the two real tokens: {loss:.4f}": "两个真实 token 上的损失：{loss:.4f}",
    # chapters 8 and 9
    "{n} steps, last loss {loss:.3f}": "训练了 {n} 步，最后的损失 {loss:.3f}",
    "step": "步数",
    "loss": "损失",
    "{source:45} -> greedy {greedy}, beam {beam} (expected {target})":
        "{source:45} -> 贪心 {greedy}，束搜索 {beam}（应为 {target}）",
    "greedy: {greedy} of {n} right, beam: {beam} of {n} right":
        "{n} 个日期：贪心解码对了 {greedy} 个，束搜索对了 {beam} 个",
    # chapter 10
    "the token at position 5 changed": "改动位置 5 的 token",
    "largest change of the output": "输出的最大变化",
    # chapter 11
    "temperature {t:g}": "温度 {t:g}",
    "top-k (k = {k})": "top-k（k = {k}）",
    "top-p (p = {p:g})": "top-p（p = {p:g}）",
    "token id": "token id（编号）",
    "probability": "概率",
    "temperature {t:g}: {text}": "温度 {t:g}：{text}",
    # chapter 12
    "the first merges: {merges}": "最早的几次合并：{merges}",
    "one sentence's tokens: {tokens}": "一句话切成的 token：{tokens}",
    "round trip: {same}": "编码再解码能还原：{same}",
    "vocab_size (tokens in the vocabulary)": "vocab_size（词表里的 token 数）",
    "bytes per token": "每个 token 平均几个字节",
    # chapter 13
    "{n} parameters; loss at initialisation {loss:.3f}, ln(vocab_size) = {ln:.3f}":
        "参数 {n} 个；初始化时的损失 {loss:.3f}，ln(vocab_size) = {ln:.3f}",
    "largest change of the logits": "logits 的最大变化",
    # chapter 14
    "distance m - n": "距离 m - n",
    "query at position {m}": "查询在位置 {m}",
    "score q·k after the rotation": "旋转之后的得分 q·k",
    "attention parameters: {gqa} with 2 key/value heads, {mha} with 8":
        "注意力的参数：2 个键/值头时 {gqa} 个，8 个时 {mha} 个",
    # chapter 15
    "last position: logits with and without the cache differ by {err:.1e}":
        "最后一个位置：用缓存和不用缓存的 logits 相差 {err:.1e}",
    "without the cache": "不用缓存",
    "with the cache": "用缓存",
    "position of the new token": "新 token 的位置",
    "milliseconds": "毫秒",
    "generated with the cache: {ids}": "用缓存生成的 token：{ids}",
    # chapter 16
    "your Llama": "你的 Llama",
    "handformer's Llama": "handformer 的 Llama",
    "{name}: {steps} steps in {s:.0f} s, validation loss {val:.3f}":
        "{name}：训练 {steps} 步，用时 {s:.0f} 秒，验证损失 {val:.3f}",
    "sampled with your generate_with_cache: {text!r}": "用你的 generate_with_cache 采样：{text!r}",
    # chapter 17
    "the story: {story!r}": "讲出的故事：{story!r}",
    "{n} tokens in {s:.2f} s; handformer's import chose the same: {same}":
        "{n} 个 token，用时 {s:.2f} 秒；handformer 导入的模型选的 token 完全相同：{same}",
    "llama2.c's run.c tells the same story: {same}": "和 llama2.c 的 run.c 讲的故事一样：{same}",
    "probability of the chosen token": "选中的 token 的概率",
}
