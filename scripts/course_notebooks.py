"""Write the course's notebooks (handformer/course/notebooks/{en,zh}/*.ipynb) from the cells below:
the code cells are shared, the markdown cells are in each language, outputs are empty.

    python3 scripts/course_notebooks.py
"""

from __future__ import annotations

import json
from pathlib import Path

from handformer.course.chapters import find_chapter

OUT = Path(__file__).resolve().parent.parent / "handformer" / "course" / "notebooks"

TRAIN = '''task = lesson.dates_task()
V_SRC, V_TGT, D = len(task.src_vocab), len(task.tgt_vocab), 64
torch.manual_seed(0)
model = Transformer(V_SRC, V_TGT, d_model=D, num_heads=4, num_layers=2, d_ff=128, max_len=64)
optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: rate(step, D, 1.0, 200))

def criterion(logits, targets):
    return masked_cross_entropy(logits, targets, task.pad)

batches = task.batches(lesson.batch_size(64), lesson.steps(3000))
losses = train_epoch(model, batches, optimizer, criterion, scheduler)
print(tr("{n} steps, last loss {loss:.3f}", n=len(losses), loss=losses[-1]))'''


def check_cell(stem: str, plot: str) -> str:
    """The first code cell: the imports the chapter's plot cell uses, then the check."""
    std = "import math\n" * ("math." in plot) + "import time\n" * ("time." in plot)
    imports = "import matplotlib.pyplot as plt\n" * ("plt." in plot) + "import torch\n" * ("torch." in plot)
    imports = f"{std}\n{imports}" if std else imports
    tr = "from handformer.course.lesson import tr  # printed lines and labels in the course's language\n"
    return f"{imports}\nfrom handformer.course import lesson\n{tr}\nok = lesson.check(\"{stem}\")"


CHAPTERS = {
    "ch01_inputs": (
        ("Fill in `PositionalEncoding` in `ch01_inputs.py`, then run "
         "the cells below. The first grades your file with `handformer check`; once it passes, the second "
         "draws your position table.",
         "在 `ch01_inputs.py` 里写完 `PositionalEncoding`，然后运行下面的单元格。"
         "第一个用 `handformer check` 检查你的文件；通过之后，第二个画出你的位置编码表。"),
        ("Each column is a position, each row a dimension: low dimensions change fast (high frequency), high ones slowly.",
         "图里每一列是一个位置，每一行是一个维度：低维变化快（频率高），高维变化慢。"),
        '''if ok:
    PositionalEncoding = lesson.fresh("ch01_inputs").PositionalEncoding
    pe = PositionalEncoding(d_model=64, max_len=100, dropout=0.0).eval()
    table = pe(torch.zeros(1, 100, 64))[0]  # (T, D): the table itself, added to zeros
    plt.figure(figsize=(8, 4))
    plt.imshow(table.T, aspect="auto", cmap="RdBu")
    plt.xlabel(tr("position"))
    plt.ylabel(tr("dimension"))
    plt.colorbar()
    plt.show()'''),
    "ch02_attention": (
        ("Fill in `scaled_dot_product_attention` and `subsequent_mask` in "
         "`ch02_attention.py`.",
         "在 `ch02_attention.py` 里写完 `scaled_dot_product_attention` 和 `subsequent_mask`。"),
        ("Your attention weights with and without the causal mask: with it, nothing above the diagonal.",
         "你的注意力权重，加因果掩码和不加：加了之后，对角线上方全是 0。"),
        '''if ok:
    chapter = lesson.fresh("ch02_attention")
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 8, 16).unbind(0)  # (B, T, d_k)
    _, plain = chapter.scaled_dot_product_attention(q, k, v)
    _, causal = chapter.scaled_dot_product_attention(q, k, v, chapter.subsequent_mask(8))
    fig, axes = plt.subplots(1, 2, figsize=(8, 4))
    for ax, weights, title in zip(axes, (plain, causal), (tr("no mask"), tr("causal mask"))):
        ax.imshow(weights[0], cmap="viridis", vmin=0)
        ax.set_title(title)
        ax.set_xlabel(tr("key"))
        ax.set_ylabel(tr("query"))
    plt.show()'''),
    "ch03_multi_head": (
        ("Fill in `MultiHeadAttention` in `ch03_multi_head.py` "
         "(it uses your attention of chapter 2).",
         "在 `ch03_multi_head.py` 里写完 `MultiHeadAttention`（它用第 2 章你写的注意力）。"),
        ("Each head has its own W_Q and W_K, so each looks at the same sentence differently.",
         "每个头有自己的 W_Q 和 W_K，所以同一句话每个头看的地方都不一样。"),
        '''if ok:
    MultiHeadAttention = lesson.fresh("ch03_multi_head").MultiHeadAttention
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=32, num_heads=4).eval()
    x = torch.randn(1, 10, 32)  # (B, T, D)
    out, weights = mha(x, x, x)  # weights: (B, H, T, T)
    print(tr("output {out}, attention weights {weights}", out=tuple(out.shape), weights=tuple(weights.shape)))
    fig, axes = plt.subplots(1, 4, figsize=(12, 3))
    for h, ax in enumerate(axes):
        ax.imshow(weights[0, h].detach(), cmap="viridis", vmin=0)
        ax.set_title(tr("head {h}", h=h))
    plt.show()'''),
    "ch04_ffn_norm": (
        ("Fill in `PositionwiseFeedForward` and `LayerNorm` in "
         "`ch04_ffn_norm.py`.",
         "在 `ch04_ffn_norm.py` 里写完 `PositionwiseFeedForward` 和 `LayerNorm`。"),
        ("A residual adds the FFN's output to its input; your LayerNorm then brings every position back to "
         "mean 0 and standard deviation 1.",
         "残差把 FFN 的输出加回它的输入；然后你的 LayerNorm 把每个位置拉回均值 0、标准差 1。"),
        '''if ok:
    chapter = lesson.fresh("ch04_ffn_norm")
    torch.manual_seed(0)
    ffn = chapter.PositionwiseFeedForward(d_model=64, d_ff=256, dropout=0.0).eval()
    norm = chapter.LayerNorm(64)
    x = 3 * torch.randn(1, 50, 64) + 2  # (B, T, D)
    residual = x + ffn(x)
    normed = norm(residual)
    print(tr("before the norm: mean {mean:.2f}, std {std:.2f}", mean=residual.mean(), std=residual.std()))
    print(tr("after the norm:  mean {mean:.2f}, std {std:.2f}", mean=normed.mean(), std=normed.std()))
    plt.hist(residual.flatten().detach(), bins=50, alpha=0.5, label="x + FFN(x)")
    plt.hist(normed.flatten().detach(), bins=50, alpha=0.5, label="LayerNorm(x + FFN(x))")
    plt.xlabel(tr("value"))
    plt.ylabel(tr("count"))
    plt.legend()
    plt.show()'''),
    "ch05_layers": (
        ("Fill in `EncoderLayer` and `DecoderLayer` in "
         "`ch05_layers.py` (they use your chapters 3 and 4).",
         "在 `ch05_layers.py` 里写完 `EncoderLayer` 和 `DecoderLayer`"
         "（它们用第 3、4 章你写的模块）。"),
        ("The decoder layer's cross-attention: each target position (a row) looks at the source (columns); "
         "the source's last two tokens are padding, so no row looks at them.",
         "解码器层的交叉注意力：目标端每个位置（一行）去看源端（列）；源端最后两个 token 是填充，所以没有一行看它们。"),
        '''if ok:
    chapter = lesson.fresh("ch05_layers")
    torch.manual_seed(0)
    encoder = chapter.EncoderLayer(d_model=32, num_heads=4, d_ff=64, dropout=0.0).eval()
    decoder = chapter.DecoderLayer(d_model=32, num_heads=4, d_ff=64, dropout=0.0).eval()
    src, tgt = torch.randn(1, 9, 32), torch.randn(1, 6, 32)  # (B, S, D), (B, T, D)
    src_mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    src_mask[..., 7:] = False  # the last two source tokens are padding
    tgt_mask = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    memory = encoder(src, src_mask)
    out, cross = decoder(tgt, memory, src_mask, tgt_mask)  # cross: (B, H, T, S)
    plt.imshow(cross[0].mean(0).detach(), cmap="viridis", vmin=0)
    plt.title(tr("cross-attention, averaged over the heads"))
    plt.xlabel(tr("source position"))
    plt.ylabel(tr("target position"))
    plt.colorbar()
    plt.show()'''),
    "ch06_model": (
        ("Fill in `make_src_mask`, `make_tgt_mask` and "
         "`Transformer` in `ch06_model.py`.",
         "在 `ch06_model.py` 里写完 `make_src_mask`、`make_tgt_mask` 和 `Transformer`。"),
        ("Your masks for a padded batch (white = may attend), and the shape of your model's logits for it.",
         "一个带填充的 batch 的掩码（白色 = 可以看），以及你的模型对它算出的 logits 的形状。"),
        '''if ok:
    chapter = lesson.fresh("ch06_model")
    src = torch.tensor([[5, 6, 7, 8, 0, 0]])  # 0 is padding
    tgt = torch.tensor([[1, 9, 10, 11, 0]])
    src_mask, tgt_mask = chapter.make_src_mask(src, 0), chapter.make_tgt_mask(tgt, 0)
    model = chapter.Transformer(20, 20, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=16).eval()
    logits = model(src, tgt)
    print(tr("shapes: src_mask {src}, tgt_mask {tgt}, logits {logits}", src=tuple(src_mask.shape),
             tgt=tuple(tgt_mask.shape), logits=tuple(logits.shape)))
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    axes[0].imshow(src_mask[0, 0].expand(5, -1), cmap="gray", vmin=0, vmax=1)
    axes[0].set_title(tr("src_mask (the same for every query)"))
    axes[1].imshow(tgt_mask[0, 0], cmap="gray", vmin=0, vmax=1)
    axes[1].set_title(tr("tgt_mask (causal and padding)"))
    plt.show()'''),
    "ch07_loss_schedule": (
        ("Fill in `masked_cross_entropy` and `rate` in "
         "`ch07_loss_schedule.py`.",
         "在 `ch07_loss_schedule.py` 里写完 `masked_cross_entropy` 和 `rate`。"),
        ("Your schedule: a linear warmup, then a decay as 1 / sqrt(step); a larger warmup peaks later and lower.",
         "你的调度：先线性预热（warmup），再按 1 / sqrt(step) 衰减；预热步数越多，峰值越晚、越低。"),
        '''if ok:
    chapter = lesson.fresh("ch07_loss_schedule")
    for warmup in (1000, 4000, 8000):
        values = [chapter.rate(step, 512, 1.0, warmup) for step in range(1, 20000, 50)]
        plt.plot(values, label=tr("warmup {warmup}", warmup=warmup))
    plt.xlabel(tr("step / 50"))
    plt.ylabel(tr("learning rate"))
    plt.legend()
    plt.show()
    logits, targets = torch.randn(4, 10), torch.tensor([3, 1, 0, 0])  # the last two are padding
    loss = chapter.masked_cross_entropy(logits, targets, 0)
    print(tr("loss over the two real tokens: {loss:.4f}", loss=float(loss)))'''),
    "ch08_training": (
        ("Fill in `train_step` and `train_epoch` in `ch08_training.py`. Once they pass, the notebook "
         "trains your own model (chapters 1-7) on the dates task: dates in words -> ISO dates.",
         "在 `ch08_training.py` 里写完 `train_step` 和 `train_epoch`。通过之后，notebook 在日期任务上训练你自己的模型"
         "（第 1-7 章）：把用英文单词写的日期翻译成 ISO 日期。"),
        ("Training your model; the loss should fall well below 1 (the model is saved for chapter 9).",
         "训练你的模型；损失应当降到远低于 1（模型会保存下来，第 9 章接着用）。"),
        f'''if ok:
    Transformer = lesson.fresh("ch06_model").Transformer
    loss_schedule = lesson.fresh("ch07_loss_schedule")
    masked_cross_entropy, rate = loss_schedule.masked_cross_entropy, loss_schedule.rate
    train_epoch = lesson.fresh("ch08_training").train_epoch
{chr(10).join("    " + line if line else "" for line in TRAIN.splitlines())}
    torch.save(model.state_dict(), "dates_model.pt")
    plt.plot(losses)
    plt.xlabel(tr("step"))
    plt.ylabel(tr("loss"))
    plt.yscale("log")
    plt.show()'''),
    "ch09_decoding": (
        ("Fill in `greedy_decode` and `beam_search` in `ch09_decoding.py`. Once they pass, "
         "your model (trained in chapter 8, or now) translates dates it has never seen.",
         "在 `ch09_decoding.py` 里写完 `greedy_decode` 和 `beam_search`。通过之后，你的模型（第 8 章训练的，"
         "或者现在训练）翻译它没见过的日期。"),
        ("Your model, your decoders: held-out dates and how many come out right, greedy and with a beam of 4.",
         "你的模型、你的解码：没见过的日期，以及贪心解码和束宽 4 的束搜索各翻译对了多少。"),
        f'''if ok:
    Transformer = lesson.fresh("ch06_model").Transformer
    loss_schedule = lesson.fresh("ch07_loss_schedule")
    masked_cross_entropy, rate = loss_schedule.masked_cross_entropy, loss_schedule.rate
    train_epoch = lesson.fresh("ch08_training").train_epoch
    decoding = lesson.fresh("ch09_decoding")
    from pathlib import Path

    if Path("dates_model.pt").exists():  # saved by chapter 8
        task = lesson.dates_task()
        model = Transformer(len(task.src_vocab), len(task.tgt_vocab), d_model=64, num_heads=4, num_layers=2,
                            d_ff=128, max_len=64)
        model.load_state_dict(torch.load("dates_model.pt"))
    else:
{chr(10).join("        " + line if line else "" for line in TRAIN.splitlines())}
    model.eval()
    right = {{"greedy": 0, "beam": 0}}
    tests = task.test[: lesson.sentences(200)]
    for n, (source, target) in enumerate(tests):
        src = torch.tensor([task.encode_src(source)])
        src_mask = src != task.pad
        with torch.no_grad():
            greedy = decoding.greedy_decode(model, src, src_mask, 16, task.bos, task.eos)
            beam = decoding.beam_search(model, src, src_mask, 16, task.bos, task.eos, beam_size=4)
        guesses = {{"greedy": task.decode_tgt(greedy[0].tolist()), "beam": task.decode_tgt(beam[0].tolist())}}
        for name, guess in guesses.items():
            right[name] += guess == target
        if n < 5:
            print(tr("{{source:45}} -> greedy {{greedy}}, beam {{beam}} (expected {{target}})", source=repr(source),
                     greedy=guesses["greedy"], beam=guesses["beam"], target=target))
    print(tr("greedy: {{greedy}} of {{n}} right, beam: {{beam}} of {{n}} right", n=len(tests), **right))'''),
    "ch10_decoder_only": (
        ("Fill in `RMSNorm`, `SwiGLU` and `DecoderOnlyBlock` in "
         "`ch10_decoder_only.py`.",
         "在 `ch10_decoder_only.py` 里写完 `RMSNorm`、`SwiGLU` 和 `DecoderOnlyBlock`。"),
        ("Causality, measured on your Block: changing the token at position 5 (0-based) leaves the outputs at positions 0-4 unchanged.",
         "在你的 Block 上实测因果性：改动位置 5 的 token（第 6 个；位置从 0 数起），位置 0-4 的输出一点都不变。"),
        '''if ok:
    DecoderOnlyBlock = lesson.fresh("ch10_decoder_only").DecoderOnlyBlock
    torch.manual_seed(0)
    block = DecoderOnlyBlock(d_model=32, num_heads=4, d_ff=64, dropout=0.0).eval()
    x = torch.randn(1, 10, 32)  # (B, T, D)
    bumped = x.clone()
    bumped[0, 5] += 1.0
    moved = (block(bumped) - block(x)).abs().amax(dim=-1)[0].detach()  # (T,)
    plt.bar(range(10), moved)
    plt.title(tr("the token at position 5 changed"))
    plt.xlabel(tr("position"))
    plt.ylabel(tr("largest change of the output"))
    plt.show()'''),
    "ch11_sampling": (
        ("Fill in the functions of `ch11_sampling.py`.",
         "在 `ch11_sampling.py` 里写完各个函数。"),
        ("What your filters keep of one distribution, and your `generate` on a toy model that knows one "
         "sentence: at a higher temperature it wanders off it.",
         "你的过滤从一个分布里留下了什么；再在一个只会一句话的玩具模型上跑你的 `generate`：温度越高，越容易跑偏。"),
        '''if ok:
    chapter = lesson.fresh("ch11_sampling")
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0]])  # (B, V)
    shown = {tr("temperature {t:g}", t=1): logits,
             tr("temperature {t:g}", t=0.5): chapter.apply_temperature(logits, 0.5),
             tr("top-k (k = {k})", k=3): chapter.top_k_filter(logits, 3),
             tr("top-p (p = {p:g})", p=0.9): chapter.top_p_filter(logits, 0.9)}
    fig, axes = plt.subplots(1, 4, figsize=(12, 3), sharey=True)
    for ax, (title, values) in zip(axes, shown.items()):
        ax.bar(range(8), torch.softmax(values, dim=-1)[0])
        ax.set_title(title)
        ax.set_xlabel(tr("token id"))
    axes[0].set_ylabel(tr("probability"))
    plt.show()
    lm = lesson.CycleLM()
    torch.manual_seed(0)
    for temperature in (0.5, 1.0, 2.0):
        out = chapter.generate(lm, lm.encode("abc"), 20, temperature=temperature)
        print(tr("temperature {t:g}: {text}", t=temperature, text=lm.decode(out)))'''),
    "ch12_bpe": (
        ("Fill in `train_bpe` and `Tokenizer` in `ch12_bpe.py`.",
         "在 `ch12_bpe.py` 里写完 `train_bpe` 和 `Tokenizer`。"),
        ("Your tokenizer on a corpus of dates and a few Chinese sentences: the more merges, the more bytes a "
         "token holds; then the tokens of one sentence, and the round trip.",
         "在一个由日期和几句中文组成的语料上跑你的分词器：合并越多，一个 token 装的字节越多；"
         "再看一句话切成的 token，以及编码再解码能不能还原。"),
        '''if ok:
    chapter = lesson.fresh("ch12_bpe")
    special = ["<|endoftext|>"]
    text = lesson.write_corpus("corpus.txt", lesson.sentences(2000))
    sizes, ratios = (300, 400, 600, 800), []
    for vocab_size in sizes:
        vocab, merges = chapter.train_bpe("corpus.txt", vocab_size, special)
        tokenizer = chapter.Tokenizer(vocab, merges, special)
        ratios.append(len(text.encode("utf-8")) / len(tokenizer.encode(text)))
    print(tr("the first merges: {merges}", merges=merges[:8]))
    sample = "the twenty-third of march, nineteen ninety-seven<|endoftext|>分词器把文本切成 token"
    ids = tokenizer.encode(sample)
    tokens = [vocab[i].decode("utf-8", errors="replace") for i in ids]
    print(tr("one sentence's tokens: {tokens}", tokens=tokens))
    print(tr("round trip: {same}", same=tokenizer.decode(ids) == sample))
    plt.plot(sizes, ratios, marker="o")
    plt.xlabel(tr("vocab_size (tokens in the vocabulary)"))
    plt.ylabel(tr("bytes per token"))
    plt.show()'''),
    "ch13_gpt": (
        ("Fill in `GPT` in `ch13_gpt.py`: your chapter-10 blocks between the embeddings and the head.",
         "在 `ch13_gpt.py` 里写完 `GPT`：第 10 章的 Block 放在嵌入和输出层之间。"),
        ("Your GPT before any training: its loss is close to ln(vocab_size), the loss of a uniform guess; and "
         "changing the token at position 5 leaves the logits at positions 0-4 unchanged.",
         "还没训练的 GPT：损失接近 ln(vocab_size)，也就是均匀乱猜的损失；改动位置 5 的 token，"
         "位置 0-4 的 logits 一点都不变。"),
        '''if ok:
    chapter = lesson.fresh("ch13_gpt")
    torch.manual_seed(0)
    config = chapter.GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, d_ff=128)
    model = chapter.GPT(config).eval()
    idx = torch.randint(0, 65, (4, 32))  # (B, T)
    logits = model(idx)  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 65), idx[:, 1:].reshape(-1))
    n = sum(p.numel() for p in model.parameters())
    print(tr("{n} parameters; loss at initialisation {loss:.3f}, ln(vocab_size) = {ln:.3f}", n=n,
             loss=loss.item(), ln=math.log(65)))
    bumped = idx.clone()
    bumped[:, 5] = (bumped[:, 5] + 1) % 65
    moved = (model(bumped) - logits).abs().amax(dim=(0, 2)).detach()  # (T,)
    plt.bar(range(32), moved)
    plt.title(tr("the token at position 5 changed"))
    plt.xlabel(tr("position"))
    plt.ylabel(tr("largest change of the logits"))
    plt.show()'''),
    "ch14_llama": (
        ("Fill in the functions and classes of `ch14_llama.py`: RoPE, `repeat_kv`, `GroupedQueryAttention`, "
         "`LlamaBlock` and `Llama`.",
         "在 `ch14_llama.py` 里写完 RoPE、`repeat_kv`、`GroupedQueryAttention`、`LlamaBlock` 和 `Llama`。"),
        ("RoPE, measured with your functions: after the rotation the score of a query at position m and a key "
         "at position n depends on m - n only, so the curves of different m lie on one another. Then what "
         "grouped-query attention saves.",
         "用你写的函数实测 RoPE：旋转之后，位置 m 的查询和位置 n 的键的得分只和 m - n 有关，"
         "所以不同 m 的曲线叠在一起。再看分组查询注意力省了多少参数。"),
        '''if ok:
    chapter = lesson.fresh("ch14_llama")
    torch.manual_seed(0)
    freqs_cis = chapter.precompute_freqs_cis(16, 64)  # (P, Dh/2)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)  # (B, T, H, Dh)
    for m in (20, 40, 60):
        scores = []
        for n in range(m + 1):
            qm, _ = chapter.apply_rotary_emb(q, q, freqs_cis[m:m + 1])
            _, kn = chapter.apply_rotary_emb(k, k, freqs_cis[n:n + 1])
            scores.append((qm * kn).sum().item())
        plt.plot([m - n for n in range(m + 1)], scores, label=tr("query at position {m}", m=m))
    plt.xlabel(tr("distance m - n"))
    plt.ylabel(tr("score q·k after the rotation"))
    plt.legend()
    plt.show()
    gqa = chapter.GroupedQueryAttention(d_model=64, n_heads=8, n_kv_heads=2)
    mha = chapter.GroupedQueryAttention(d_model=64, n_heads=8, n_kv_heads=8)
    print(tr("attention parameters: {gqa} with 2 key/value heads, {mha} with 8",
             gqa=sum(p.numel() for p in gqa.parameters()), mha=sum(p.numel() for p in mha.parameters())))'''),
    "ch15_kv_cache": (
        ("Fill in `KVCache.update`, `attend`, `CachedLlama.forward` and `generate_with_cache` in "
         "`ch15_kv_cache.py`.",
         "在 `ch15_kv_cache.py` 里写完 `KVCache.update`、`attend`、`CachedLlama.forward` 和 "
         "`generate_with_cache`。"),
        ("The time of one new token, with your cache and without it: without it each token runs the whole "
         "sequence again and the time grows with the position; with it, a call runs one token.",
         "一个新 token 要花多少时间，用你的缓存和不用缓存对比：不用缓存时每个 token 都要把整个序列重算一遍，"
         "时间随位置增长；用缓存时每次只算一个 token。"),
        '''if ok:
    chapter = lesson.fresh("ch15_kv_cache")
    torch.manual_seed(0)
    n = lesson.steps(256)
    model = chapter.CachedLlama(vocab_size=65, d_model=128, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=256,
                                max_len=n).eval()
    idx = torch.randint(0, 65, (1, n))  # (B, T)
    cache, with_cache, without = model.new_cache(), [], []
    with torch.no_grad():
        for t in range(n):
            start = time.perf_counter()
            logits, cache = model(idx[:, t:t + 1], cache)
            with_cache.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            full, _ = model(idx[:, :t + 1])
            without.append((time.perf_counter() - start) * 1000)
    err = (logits[:, -1] - full[:, -1]).abs().max().item()
    print(tr("last position: logits with and without the cache differ by {err:.1e}", err=err))
    plt.plot(without, label=tr("without the cache"))
    plt.plot(with_cache, label=tr("with the cache"))
    plt.xlabel(tr("position of the new token"))
    plt.ylabel(tr("milliseconds"))
    plt.legend()
    plt.show()
    out = chapter.generate_with_cache(model, idx[:, :4], 8)
    print(tr("generated with the cache: {ids}", ids=out[0].tolist()))'''),
    "ch16_train_gpt": (
        ("Fill in `get_batch`, `lm_train_step`, `train` and `estimate_loss` in `ch16_train_gpt.py`: your "
         "chapter-7 loss and schedule, `torch.optim.AdamW`, your loop.",
         "在 `ch16_train_gpt.py` 里写完 `get_batch`、`lm_train_step`、`train` 和 `estimate_loss`："
         "用第 7 章的损失和学习率调度、`torch.optim.AdamW`，再加上你的训练循环。"),
        ("Your Llama of chapter 14 trained on tiny Shakespeare, one character a token, and beside it "
         "handformer's own Llama of the same size trained by the same loop on the same batches; then a sample "
         "with your `generate_with_cache` (chapter 15) from the trained weights. The first run downloads the "
         "text (`handformer data get tinyshakespeare` does it ahead).",
         "在 tiny Shakespeare 上（一个字符一个 token）训练你第 14 章的 Llama，旁边是同样大小的 handformer "
         "自己的 Llama，用同一个训练循环、同样的 batch 训练；然后用训练好的权重和你的 `generate_with_cache`"
         "（第 15 章）采样。第一次运行会下载这份文本（也可以先运行 `handformer data get tinyshakespeare`）。"),
        '''if ok:
    chapter = lesson.fresh("ch16_train_gpt")
    llama, kv = lesson.fresh("ch14_llama"), lesson.fresh("ch15_kv_cache")
    text = lesson.char_text(lesson.shakespeare())
    sizes = dict(vocab_size=len(text.chars), d_model=lesson.small(128, 32), n_layers=lesson.small(4, 1),
                 n_heads=4, n_kv_heads=2, d_ff=lesson.small(344, 64), max_len=lesson.small(64, 32))
    run = dict(steps=lesson.small(1500, 20), batch_size=lesson.batch_size(32), block_size=sizes["max_len"],
               d_model=sizes["d_model"], warmup=lesson.small(100, 5), factor=1.0)
    curves, val = {}, {}
    for name, make in ((tr("your Llama"), llama.Llama), (tr("handformer's Llama"), lesson.HandformerLM)):
        torch.manual_seed(0)
        model = make(**sizes)
        start = time.perf_counter()
        curves[name] = chapter.train(model, text.train, **run)  # the same seed: the same batches
        seconds = time.perf_counter() - start
        val[name] = chapter.estimate_loss(model, text.val, sizes["max_len"], run["batch_size"],
                                          lesson.small(50, 2))
        print(tr("{name}: {steps} steps in {s:.0f} s, validation loss {val:.3f}", name=name,
                 steps=run["steps"], s=seconds, val=val[name]))
        if make is llama.Llama:
            mine = model
    for name, losses in curves.items():
        plt.plot(losses, label=name)
    plt.xlabel(tr("step"))
    plt.ylabel(tr("loss"))
    plt.legend()
    plt.show()
    cached = kv.CachedLlama(**sizes).eval()
    cached.load_state_dict(mine.state_dict())  # the same parameters; forward(idx, cache) -> (logits, cache)
    torch.manual_seed(0)
    out = kv.generate_with_cache(cached, torch.tensor([[text.chars.index("\\n")]]), sizes["max_len"] - 1,
                                 temperature=0.8)
    print(tr("sampled with your generate_with_cache: {text!r}", text=text.decode(out[0].tolist())))'''),
    "ch17_stories": (
        ("Fill in `read_llama2c`, `load_llama2c` and `greedy_with_cache` in `ch17_stories.py`: llama2.c's "
         "stories260K in your own Llama, your RoPE, your cache.",
         "在 `ch17_stories.py` 里写完 `read_llama2c`、`load_llama2c` 和 `greedy_with_cache`："
         "把 llama2.c 的 stories260K 装进你自己的 Llama，用你的 RoPE、你的缓存。"),
        ("A real model (260K parameters, trained by Karpathy on TinyStories) in your code: greedy from BOS, it "
         "tells the story llama2.c's run.c tells at temperature 0, token for token. The plot shows how sure the "
         "model was of each token it chose. The first run downloads the model (`handformer data get "
         "stories260K` does it ahead).",
         "一个真实的模型（26 万个参数，Karpathy 在 TinyStories 上训练的）跑在你的代码里：从 BOS 开始贪心解码，"
         "它讲出的故事和 llama2.c 的 run.c 在温度 0 下讲的一模一样，一个 token 都不差。图上是模型对自己选的每个 "
         "token 有多大把握。第一次运行会下载这个模型（也可以先运行 `handformer data get stories260K`）。"),
        '''if ok:
    chapter = lesson.fresh("ch17_stories")
    folder = lesson.stories260k()
    if folder is not None:
        model = chapter.load_llama2c(folder / "stories260K.bin")
        n = lesson.steps(256)
        start = time.perf_counter()
        ids = chapter.greedy_with_cache(model, torch.tensor([[1]]), n)[0].tolist()  # BOS is id 1
        seconds = time.perf_counter() - start
        story = lesson.story_tokenizer(folder).decode(ids)
        print(tr("the story: {story!r}", story=story))
        same = ids == lesson.handformer_story(folder, n)
        print(tr("{n} tokens in {s:.2f} s; handformer's import chose the same: {same}", n=n, s=seconds,
                 same=same))
        print(tr("llama2.c's run.c tells the same story: {same}", same=lesson.RUN_C_STORY.startswith(story)))
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids]))  # (1, T, V)
        chosen = logits[0, :-1].softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]  # (T - 1,)
        plt.plot(chosen)
        plt.xlabel(tr("position"))
        plt.ylabel(tr("probability of the chosen token"))
        plt.show()'''),
}


NOTE = {
    "en": "Run the cells from the top (Shift+Enter). The code cells are the same in the English and the Chinese "
          "course; what they print and the labels of their plots come from `tr(...)`, in the course's language.",
    "zh": "从上往下运行各个单元格（Shift+Enter）。代码单元格在中英文课程里完全一样；打印出来的内容和图上的文字"
          "由 `tr(...)` 按课程的语言给出（中文放在 `handformer/course/texts.py` 里）。",
}


def intro_text(stem: str, lang: str) -> str:
    """The first markdown cell: the chapter's title, the tutorials' chapters it follows and the tour's
    section with the same code, what to fill in, and how the cells work."""
    ch = find_chapter(stem)
    body = CHAPTERS[stem][0][lang == "zh"]
    if lang == "zh":
        head = (f"# 第 {ch.number} 章：{ch.zh}\n\n> 对应教程：{ch.tutorial[1]}。"
                f"handformer 里同样的代码：导览第 {ch.tour} 节（`docs/zh/tour.md`）。")
    else:
        head = (f"# Chapter {ch.number}: {ch.en}\n\n> Tutorial: {ch.tutorial[0]}. "
                f"The same code in handformer: the tour, section {ch.tour} (`docs/tour.md`).")
    return f"{head}\n\n{body}\n\n{NOTE[lang]}"


def cells(stem: str, lang: str) -> list[tuple[str, str]]:
    """A chapter's notebook in one language: (kind, source) of each cell."""
    _, after, plot = CHAPTERS[stem]
    return [("markdown", intro_text(stem, lang)), ("code", check_cell(stem, plot)),
            ("markdown", after[lang == "zh"]), ("code", plot)]


def notebook(cells: list[tuple[str, str]]) -> dict:
    return {"cells": [{"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True),
                       **({"execution_count": None, "outputs": []} if kind == "code" else {})}
                      for kind, text in cells],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def main() -> None:
    for stem in CHAPTERS:
        for lang in ("en", "zh"):
            nb = notebook(cells(stem, lang))
            for n, cell in enumerate(nb["cells"]):
                cell["id"] = f"{stem}-{n}"
            path = OUT / lang / f"{stem}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
