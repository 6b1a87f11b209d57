"""The diagnoses of the tutorials' components: attention, multi-head attention, the FFN, LayerNorm,
positional encoding, the encoder and decoder layers, the causal mask."""

from handformer.check.catalog.base import Diagnosis, d
from handformer.check.catalog.llm import SUBLAYER_CALL

DIAGNOSES: list[Diagnosis] = [
    d("no_scaling", "the scores are not scaled by 1/sqrt(d_k)", "注意力分数没有除以 sqrt(d_k)",
      "divide the scores by math.sqrt(d_k) before the softmax: scores = Q @ K^T / math.sqrt(d_k)",
      "在 softmax 之前把分数除以 math.sqrt(d_k)：scores = Q @ K^T / math.sqrt(d_k)",
      r"baddbmm\(", r"(matmul|@).*transpose", r"transpose\(-2, ?-1\)", r"einsum\(",  # BLOOM's alpha
      r"scores\s*="),
    d("scale_by_dk", "the scores are divided by d_k instead of sqrt(d_k)",
      "注意力分数除以了 d_k，而不是 sqrt(d_k)",
      "divide by math.sqrt(d_k), not by d_k", "应除以 math.sqrt(d_k)，而不是 d_k",
      r"/\s*\(?\s*(self\.)?d_k\b", r"/\s*\w*d_k",
      r"/\s*\(?\s*\w+\.(size\(-1\)|shape\[-1\])(?!\s*\)?\s*\*\*)",  # GPT-2: / value.size(-1)
      r"(@|matmul|scores|att\w*)\b.*/\s*(self\.)?(head_dim|head_size|d_head)\b(?!\s*\*\*)",  # GPT-J's
      # a scale kept for later as the head width's inverse (`self.scale = head_dim**-1`)
      r"^\s*(self\.)?\w*scal\w*\s*=.*(\*\*\s*\(?\s*-\s*1(\.0*)?\b(?![.\d])|\b1(\.0*)?\s*/\s*[\w.]*"
      r"(head_dim|head_size|d_head|d_k)\b(?!\s*\*\*))",
      # a divisor kept for later as the head width itself (GPT-J's `self.scale_attn = torch.tensor(head_dim)`)
      r"^\s*(self\.)?\w*(scal|factor|divis)\w*\s*=\s*(torch\.tensor\(|float\()?\s*(self\.)?\w*"
      r"(head_dim|head_size|d_head|d_k)\b(?!\s*\*\*)",
      r"scores\s*="),
    d("softmax_wrong_dim", "the softmax runs over the wrong dimension",
      "softmax 作用在了错误的维度上",
      "take the softmax over the keys, the last dimension: F.softmax(scores, dim=-1)",
      "softmax 应沿键（key）所在的最后一维：F.softmax(scores, dim=-1)",
      r"(?i:softmax)\(.*dim\s*=\s*(?!-1\b)", r"softmax"),
    d("mask_inverted", "the mask is inverted: masked positions are attended, visible ones hidden",
      "掩码用反了：本应屏蔽的位置被关注，可见的位置反而被屏蔽",
      "hide the positions where the mask is 0: scores.masked_fill(mask == 0, -1e9) (with a torch.nn "
      "style bool mask, True = masked, run again with --mask-convention torch)",
      "屏蔽掩码为 0 的位置：scores.masked_fill(mask == 0, -1e9)（若使用 torch.nn 的布尔掩码约定，"
      "True = 屏蔽，请加 --mask-convention torch 重新检查）",
      r"\w*mask\w*\s*[=!]=\s*[01]\b",  # a mask compared with 0 or 1 (`return subsequent_mask == 0`, turned)
      r"masked_fill", r"\w+\[\s*~?\s*keep\s*\]\s*=",
      # BERT's additive mask: + (1 - mask) * -10000, the mask maybe named attention_mask
      r"\w*mask\w*\b.*\*\s*-\s*\d|-\s*\d[\d.e]*\s*\*.*\w*mask",
      # or times the dtype's lowest value (Hugging Face's: (1.0 - mask) * torch.finfo(dtype).min)
      r"\*\s*(?:torch\.)?finfo\([^)]*\)\.min|finfo\([^)]*\)\.min\s*\*",
      # a padding mask's polarity: ids compared with the pad id (`seq_k.eq(0)`, `src != pad_idx`)
      r"\.(?:eq|ne)\(\s*(?:0|\w*pad\w*)\s*\)|[=!]=\s*(?:0|[\w.]*pad\w*)\b",
      # a lengths mask's polarity: positions compared with the lengths (`steps < lengths.unsqueeze(1)`)
      r"[<>]=?\s*[\w.]*len\w*",
      r"^(?!\s*(?:def|if|elif) ).*\bmask\b", r"mask"),
    d("mask_after_softmax", "the mask is applied after the softmax, so the weights no longer sum to 1",
      "掩码在 softmax 之后才应用，注意力权重之和不再为 1",
      "apply masked_fill to the scores before F.softmax, not to the weights after it",
      "在 F.softmax 之前对分数做 masked_fill，而不是在之后对权重做",
      r"masked_fill", r"mask"),
    d("split_no_transpose", "heads are split with view(B, h, T, d_k) and no transpose, "
      "so positions are mixed across heads", "拆分多头时直接 view(B, h, T, d_k) 而没有 transpose，"
      "不同位置的特征被混进了不同的头",
      "split as x.view(B, T, h, d_k).transpose(1, 2)",
      "应写成 x.view(B, T, h, d_k).transpose(1, 2)",
      r"\.view\(.*(n_heads|num_heads|\bh\b|heads).*\)(?!.*(transpose|permute))", r"\.view\(",
      r"reshape\(-1, X\.shape\[\d\], X\.shape\[\d\]\)"),
    d("concat_no_transpose", "heads are concatenated with view(B, T, d_model) without transposing "
      "back first", "拼接多头时没有先 transpose 回来就直接 view(B, T, d_model)",
      "concatenate as x.transpose(1, 2).contiguous().view(B, T, d_model)",
      "应写成 x.transpose(1, 2).contiguous().view(B, T, d_model)",
      r"^(?!.*transpose).*contiguous\(\)\.(view|reshape)\(", r"(view|reshape)\(.*d_model",
      r"reshape\(X\.shape\[0\], X\.shape\[2\]", r"(view|reshape)\(.*-1\)", r"contiguous"),
    d("no_output_projection", "W_O is missing: the concatenated heads are returned without the "
      "output projection", "缺少输出投影 W_O：多头拼接后直接返回了",
      "define self.w_o = nn.Linear(d_model, d_model) and return self.w_o(concat)",
      "定义 self.w_o = nn.Linear(d_model, d_model)，并返回 self.w_o(拼接结果)",
      r"return (self\.)?\w*(transpose|concat|combine|merge)\w*\(", r"^\s*return\b"),
    d("kv_swapped", "the K and V projections are swapped (keys use W_V, values use W_K)",
      "K 与 V 的投影用反了（键用了 W_V，值用了 W_K）",
      "compute K = w_k(k) and V = w_v(v)", "应为 K = w_k(k)，V = w_v(v)",
      r"\bK\b\s*=.*w_?v|\bk\b\s*=.*w_?v|key(?!_value)\w*\s*=.*(w_v|v_proj|\bvalue)", r"(?i)keys\s*=.*\bw_v\(",
      r"\bv\s*,\s*k\s*=.*split",
      # the keys read from the value's slot of a fused q | k | v (InternLM2's wqkv groups: [..., -1, :])
      r"\bk(ey)?\w*\s*=\s*\w+\[(?:[^\]]*,\s*)?(?:2|-1)\s*(?:,\s*:\s*)?\]", r"w_?v\(",
      # a helper that returns q, k, v as slices of a fused tensor, k from the last slot and v from the
      # one before (Falcon's multi-query `_split_heads`: `return x[..., :-2, :], x[..., [-1], :], ...`)
      r"^\s*return\s+\w+\[.*?,\s*\w+\[.*?-1.*?,\s*\w+\[.*?-2"),
    d("no_residual", "a residual connection is missing", "缺少残差连接",
      "add the sublayer's input back: x = norm(x + dropout(sublayer(x)))",
      "把子层输入加回来：x = norm(x + dropout(sublayer(x)))",
      r"^\s*(x\s*=|return)\s*(self\.)?(mlp|attn|ffn|feed_forward|self_attn|attention)\w*\(",
      r"(ln|norm)\w*\((?!.*\+).*dropout\(",
      r"(?i)^\s*([\w.]+\s*=|return)\s*self\.\w*norm\w*\((?![^#]*\+)",  # BERT: self.LayerNorm(h), no sum
      r"norm\w*\((?!.*\bx\s*\+)", r"norm"),
    d("pre_norm", "the norm placement is mixed: one sublayer is pre-norm, another post-norm",
      "层归一化的位置前后不一致：有的子层是 Pre-Norm，有的是 Post-Norm",
      "use one placement for every sublayer: post-norm x = norm(x + f(x)) (the paper) or pre-norm "
      "x = x + f(norm(x))", "所有子层使用同一种位置：Post-Norm x = norm(x + f(x))（论文）或 "
      "Pre-Norm x = x + f(norm(x))",
      r"norm\w*\("),
    d("ffn_no_activation", "the feed-forward network has no activation between its two linear layers",
      "前馈网络的两个线性层之间缺少激活函数",
      "apply the activation between the layers: linear2(dropout(F.relu(linear1(x))))",
      "在两个线性层之间加上激活函数：linear2(dropout(F.relu(linear1(x))))",
      r"linear\w*\(.*linear\w*\(",
      # an nn.Sequential of two linear layers and nothing that activates between them (nlp-tutorial's)
      r"Sequential\((?!.*(?:ReLU|GELU|SiLU|Swish|Mish|Tanh|Sigmoid|Softplus|Act|act)).*Linear\(.*Linear\(",
      # the first linear's output kept as it is (BERT's h = self.intermediate(x), a fc1, w1, c_fc)
      r"^\s*[\w.]+\s*=\s*self\.(\w*intermediate\w*|\w*fc_?1|w_?1|\w*linear_?1|c_fc|up_proj)\(\s*\w+\s*\)\s*(#|$)",
      r"^\s*return\b"),
    d("dropout_in_eval", "dropout is active in eval mode: two runs on the same input differ",
      "eval 模式下 dropout 仍然生效：同一输入两次运行结果不同",
      "use nn.Dropout (it is off after model.eval()) or F.dropout(x, p, training=self.training)",
      "使用 nn.Dropout（model.eval() 后自动关闭），或 F.dropout(x, p, training=self.training)",
      r"F\.dropout|functional\.dropout|torch\.dropout", r"Dropout\(", r"dropout"),
    d("pe_sin_cos_swapped", "sin and cos are swapped in the positional encoding",
      "位置编码中 sin 和 cos 放反了", "even dimensions get sin, odd ones cos: pe[:, 0::2] = sin, "
      "pe[:, 1::2] = cos", "偶数维用 sin，奇数维用 cos：pe[:, 0::2] = sin，pe[:, 1::2] = cos",
      r"0::2.*cos|1::2.*sin", r"cos\(", r"sin\("),
    d("pe_wrong_frequency", "the positional encoding uses the wrong frequency exponent",
      "位置编码的频率指数写错了",
      "use angle = pos / 10000^(2i/d_model) for the pair (2i, 2i+1): div_term = "
      "exp(arange(0, d_model, 2) * (-log(10000) / d_model))",
      "第 (2i, 2i+1) 维的角度为 pos / 10000^(2i/d_model)：div_term = "
      "exp(arange(0, d_model, 2) * (-log(10000) / d_model))",
      r"div\w*\s*=", r"^(?!\s*def ).*10000", r"exp\(", r"10000"),  # a `def` whose default is 10000 last
    d("decoder_masks_swapped", "the decoder's two masks are swapped: self-attention gets the source "
      "mask, cross-attention the target mask", "解码器的两个掩码用反了：自注意力用了源端掩码，"
      "交叉注意力用了目标端掩码",
      "self-attention takes tgt_mask (causal + padding), cross-attention takes src_mask",
      "自注意力使用 tgt_mask（因果 + 填充），交叉注意力使用 src_mask",
      r"self_?att\w*\([^)]*src_mask", r"cross\w*\([^)]*tgt_mask",
      r"attention1\(.*enc_valid|attention2\(.*dec_valid", r"src_mask|tgt_mask"),
    d("greedy_no_stop_at_eos", "greedy decoding goes on after the end symbol", "贪心解码在结束符之后还在继续",
      "stop once EOS is emitted: if next_word == end_symbol: break (in a batch: stop when every row has "
      "emitted it, and pad the rows that ended)",
      "输出 EOS 后就停下：if next_word == end_symbol: break"
      "（批量时等每一行都输出了 EOS 再停，已结束的行补填充）",
      r"^\s*(continue|pass)\s*(#.*)?$",  # `if next_word == EOS: continue`, where `break` was meant
      r"cat\(", r"for .* in range\(|while "),
    d("greedy_eos_not_emitted", "greedy decoding stops at the end symbol but leaves it out",
      "贪心解码在结束符处停下了，但没有输出结束符",
      "append the next token before checking for EOS, so the output ends with it",
      "先把下一个 token 接上，再判断是否是 EOS，这样输出以 EOS 结尾",
      r"cat\(", r"break"),
    d("mask_pad_wrong_sequence", "the padding mask is built from the other sequence (the source's "
      "mask from the target, or the other way)", "填充掩码用错了序列（源端掩码用了目标序列，或者反过来）",
      "build each mask from its own ids: src_mask from src, tgt_mask from tgt",
      "每个掩码用自己的 id 构造：src_mask 用 src，tgt_mask 用 tgt",
      r"src_mask\s*=.*\btgt\b|tgt_mask\s*=.*\bsrc\b", r"mask"),
    d("mask_pad_id", "the padding mask assumes the pad id is 0",
      "填充掩码把填充 id 写死成了 0（没有用传入的 pad id）",
      "compare with the pad id you are given: (ids != pad_idx), not (ids != 0)",
      "和传入的填充 id 比较：(ids != pad_idx)，而不是 (ids != 0)",
      r"[!=]=\s*0\b", r"\.(?:eq|ne)\(\s*0\s*\)", r"[<>]\s*0(?![.\w])", r"mask"),
    d("mask_combined_with_or", "padding and the causal part are combined the wrong way",
      "填充掩码和因果掩码组合错了",
      "a key is seen only when it is real and not in the future: pad_keep & causal_keep (with torch.nn's "
      "True = masked: pad_masked | future_masked)",
      "只有既是真实 token、又不在未来的键才可见：pad_keep & causal_keep（torch.nn 的 True = 屏蔽时："
      "pad_masked | future_masked）",
      r"\|", r"&", r"mask"),
    d("causal_off_by_one", "the causal mask is off by one", "因果掩码差了一位",
      "query t must see keys 0..t: torch.tril(torch.ones(T, T)) (diagonal=0), or "
      "torch.triu(torch.ones(T, T), diagonal=1) == 0 (d2l's valid lengths: torch.arange(1, T + 1))",
      "位置 t 应能看到 0..t：torch.tril(torch.ones(T, T))（diagonal=0），或 "
      "torch.triu(torch.ones(T, T), diagonal=1) == 0（d2l 的有效长度：torch.arange(1, T + 1)）",
      r"tril|triu", r"diagonal", r"valid_lens?\s*=\s*torch\.arange",
      r"arange\(.*\)\.(repeat|expand)\("),  # d2l's lengths 1..T, one row a sentence, by any name
    d("layernorm_unbiased_std", "the LayerNorm divides by the unbiased std plus eps (x.std() + eps)",
      "LayerNorm 除以了无偏标准差再加 eps（x.std() + eps）",
      "use the biased variance with eps inside the square root: (x - mean) / torch.sqrt(x.var(-1, "
      "unbiased=False, keepdim=True) + eps), as nn.LayerNorm and the paper do",
      "使用有偏方差并把 eps 放进根号：(x - mean) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True)"
      " + eps)，与 nn.LayerNorm 和论文一致",
      r"\.std\(", r"unbiased\s*=\s*True|correction\s*=\s*1",
      r"\.var\((?!.*(unbiased\s*=\s*False|correction\s*=\s*0))", r"eps"),
    d("nan_on_masked_rows", "a query whose keys are all masked gives NaN",
      "所有键都被屏蔽的查询输出了 NaN",
      "fill masked scores with -1e9 (the tutorials' way), or keep -inf as handformer does and set "
      "the output of rows whose keys are all masked to zero",
      "用 -1e9 填充被屏蔽的分数（教程的写法）；或者像 handformer 那样用 -inf，"
      "再把所有键都被屏蔽的行的输出置零",
      r"-inf|float\(.-inf.\)|masked_fill"),
]

WIDTH = (r"((self|config|cfg|args|params)\.)?"
         r"(d_model|d_out|emb_dim|n_embd|embed_dim|hidden_size|hidden_dim|num_hiddens|dim|C)\b")
UNSUMMED = (r"^\s*(?!({0})\w*\s*=)(\w+\s*=(?![^#]*\+)\s*(self\.)?\w*drop\w*\(\s*(self\.)?({0})\b"
            r"|(\w+\s*=|return)\s*({0})\w*\s*(#.*)?$)")  # or its output's name alone (`out = mlp_out`)
# forms that give one output at check's sizes, told apart by the learner's line: dividing the scores
# by sqrt(d_model) (a width, or heads times head width) is dividing by d_k when d_k = 4 = sqrt(16)
# a sublayer's output added to the stream on a line of its own (Hugging Face's Gemma 2: `hidden_states =
# self.mlp(...)`, then `hidden_states = residual + hidden_states`): the add is the line quoted for the
# forms here, where the call's line does not add it itself
ADDED_AFTER = {("sandwich_norm_missing", "attn"), ("sandwich_norm_missing", "ffn")}
PLAIN_ADD = r"^\s*\w+\s*=\s*\w+\s*\+\s*\w+\s*$"
# [x2, -x1]: the minus on the second element (an element may index: q[..., 1::2]); or Meta's complex
# product with the table conjugated (`xk_ * freqs_cis.conj()`)
ROTATE_PLUS_MINUS = (r"(?:stack|cat)\(\s*[(\[]\s*(?!-){1}*\b(?:{0})\b{1}*,\s*-"
                     r"|\b(?:{0})_?\b[^=\n]*\.conj\(").replace("{1}", r"(?:[^,\[\]]|\[[^\]]*\])")
LINE_FORMS: dict[tuple[str, str], dict[str, str]] = {  # (name, form found) -> {form shown: its line}
    # the sublayer whose norm after it is missing: the line that keeps its output un-normed
    ("sandwich_norm_missing", "attn"): {"attn": SUBLAYER_CALL.format("self_attn|attn|attention")},
    ("sandwich_norm_missing", "ffn"): {"ffn": SUBLAYER_CALL.format("mlp|ffn|feed_forward")},
    # the sublayer whose residual is missing: the stream set from its output's dropout alone, no sum
    # (labml's `x = self.dropout(ff)`), not the line that names the output (`ff = self.feed_forward(z)`,
    # DistilBERT's `sa_output = self.attention(...)` before its norm adds the residual)
    ("no_residual", "attn"): {"attn": UNSUMMED.format("self_attn|attn|attention")},
    ("no_residual", "ffn"): {"ffn": UNSUMMED.format("mlp|ffn|ff|feed_forward")},
    # a cached loop's position for the next call: bound from the cache's length or a count (not set to a
    # number alone: its start), or written into the model's call as a count plus or minus one
    ("generate_cache_mismatch", "positions_not_offset"): {
        "positions_not_offset": r"^\s*(\w+\s*,\s*)*(start_pos|input_pos|prev_pos|cur_pos|pos|offset|"
                                r"position\w*|past_len\w*|cache_len\w*)\s*(,\s*\w+\s*)*"
                                r"([-+]=|=(?!=)(?=.*[(\[+\-*]))"
                                r"|\b(model|self)\b.*,\s*(\w+\s*=\s*)?\w+\s*[-+]\s*\d+\s*\)\s*$"},
    # a context cropped to its first tokens: the slice that keeps them (`ids[:, :size]`, in a helper too)
    ("generate_no_crop", "first_tokens"): {"first_tokens": r"\[\s*(:\s*,\s*)?:\s*[A-Za-z_][\w.]*\s*\]"},
    # one pair merged at every step: the merge's call whose result is left unused (`merge(ids, pair, idx)`)
    ("bpe_counts_not_updated", "same_pair"): {"same_pair": r"^\s*(self\.)?_?\w*merge\w*\([^=]*\)\s*$"},
    # encode's merge order in the form found: the line that picks the pair (GPT-2's bpe(): max( for min()
    ("bpe_encode_merge_order", "latest"): {"latest": r"\bmax\(.*(?:merge|rank)|\bmax\(\s*\w*pairs?\s*\)"},
    ("bpe_encode_merge_order", "reversed"): {"reversed": r"reversed\(|\[::-1\]"},
    # an attention's own causal mask inverted: the line that builds its triangle, else the one that fills
    # the scores with it
    ("mask_inverted", "causal"): {
        "causal": r"\b(tril|triu)\(|(masked_fill|where)\(.*\b\w*(causal|subsequent|future|ahead)\w*"},
    # the queries (or keys) alone rotated the other way: their own turn, its minus on the second element
    ("rope_rotation_sign", "q"): {"q": ROTATE_PLUS_MINUS.format(r"q|xq|query\w*|queries")},
    ("rope_rotation_sign", "k"): {"k": ROTATE_PLUS_MINUS.format(r"k|xk|key\w*|keys")},
    ("scale_by_dk", ""): {
        "sqrt_d_model": rf"^(?=.*(@|matmul|einsum|bmm|scor|att|wei)).*(/\s*(math\.|np\.|torch\.)?sqrt\("
                        rf"\s*{WIDTH}\s*\)|/\s*\(?\s*{WIDTH}\s*\*\*\s*0?\.5|\*\s*{WIDTH}\s*\*\*\s*\(?-0?\.5|"
                        r"/\s*(math\.)?sqrt\(\s*(self\.)?\w+\s*\*\s*(self\.)?\w*(d_k|d_head|head_dim|head_size|dh)\w*\s*\))"
                        # or a scale kept for later, from the width (Hugging Face's self.scaling)
                        rf"|^\s*(self\.)?\w*scal\w*\s*=.*(sqrt\(\s*{WIDTH}\s*\)|(?<![\w.]){WIDTH}\s*\*\*\s*\(?-0?\.5)"},
}
