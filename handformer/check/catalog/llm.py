"""The diagnoses of the LLM chapter's components (RMSNorm, gated FFNs, the pre-norm block, rotary
positions, grouped-query attention) and of masks as attention applies them."""

from handformer.check.catalog.base import Diagnosis, d

# a line that keeps a sublayer's output without norming it: h = self.mlp(h), x = x + self.attn(...)
SUBLAYER_CALL = r"^\s*\w+\s*=\s*(\w+\s*\+\s*)?self\.({})\w*\("

DIAGNOSES: list[Diagnosis] = [
    d("rmsnorm_sum_squares", "RMSNorm sums the squares instead of averaging them",
      "RMSNorm 对平方求了和，而不是求平均",
      "use the mean of the squares: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
      "应对平方求平均：x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
      r"(pow\(2\)|\*\* ?2\)?|square\(\))\.sum", r"\.sum\(", r"sum"),
    d("rmsnorm_no_sqrt", "RMSNorm divides by the mean square, without the square root",
      "RMSNorm 除以的是均方，没有开平方",
      "divide by the root of the mean square: x / torch.sqrt(ms + eps), or x * torch.rsqrt(ms + eps)",
      "应除以均方的平方根：x / torch.sqrt(ms + eps)，或 x * torch.rsqrt(ms + eps)",
      r"/\s*\(\s*\w+\s*\+\s*(self\.)?\w*eps", r"mean\(", r"eps"),
    d("norm_eps_outside_sqrt", "eps is added outside the square root",
      "eps 加在了平方根外面",
      "put eps inside the root, as nn.RMSNorm and nn.LayerNorm do: torch.sqrt(ms + eps) or "
      "torch.sqrt(var + eps)",
      "把 eps 放进根号里，与 nn.RMSNorm、nn.LayerNorm 一致：torch.sqrt(ms + eps) 或 torch.sqrt(var + eps)",
      r"(sqrt\([^()]*(\([^()]*\))?[^()]*\)|\.std\([^)]*\))\s*\+\s*(self\.)?\w*eps",
      r"\+\s*(self\.)?\w*eps", r"eps"),
    d("norm_no_gain", "the norm's weight (or bias) is not applied", "归一化层的权重（或偏置）没有用上",
      "scale by the learned weight (and, for LayerNorm, add the bias): return self.weight * x_hat "
      "(+ self.bias)",
      "乘上可学习的权重（LayerNorm 还要加偏置）：return self.weight * x_hat（+ self.bias）",
      r"^\s*return\b"),
    d("norm_wrong_dim", "the norm's statistics are taken over the wrong dimension",
      "归一化的统计量沿错误的维度计算",
      "normalise each token over its features, the last dimension: x.pow(2).mean(-1, keepdim=True)",
      "每个 token 沿自己的特征维度（最后一维）归一化：x.pow(2).mean(-1, keepdim=True)",
      r"(mean|var|std|sum)\((dim\s*=\s*)?(-2|0|1)\b|(mean|var|std)\(\)", r"mean\(", r"var\(|std\("),
    d("gated_act_after_product", "the activation is applied after the gate's product: act(gate(x) * up(x))",
      "激活函数放在了门控乘积之后：act(gate(x) * up(x))",
      "activate the gate alone, then multiply: down(F.silu(gate(x)) * up(x))",
      "只对门控分支做激活，再相乘：down(F.silu(gate(x)) * up(x))",
      r"(silu|gelu|swish|act\w*)\(.*\*", r"\*"),
    d("gated_activation_wrong_branch", "the activation is on the up branch, not on the gate",
      "激活函数用在了 up 分支上，而不是门控分支",
      "the gate is the activated branch: down(act(gate(x)) * up(x)) (Llama: w2(F.silu(w1(x)) * w3(x)))",
      "门控分支才是做激活的那一支：down(act(gate(x)) * up(x))（Llama：w2(F.silu(w1(x)) * w3(x))）",
      r"(silu|gelu|swish|act\w*)\(", r"\*"),
    d("ffn_wrong_activation", "the FFN uses another activation than its code says (SiLU for SwiGLU, "
      "GELU for GEGLU, the tanh GELU in a Gemma model's MLP, GELU for an attribute named gelu or in "
      "GPT-2's MLP)",
      "前馈网络用的激活函数和代码说的不符（SwiGLU 用 SiLU，GEGLU 用 GELU，Gemma 模型的 MLP 用 "
      "tanh 近似的 GELU，属性名叫 gelu 或 GPT-2 的 MLP 用 GELU）",
      "SwiGLU: F.silu(gate(x)) * up(x); GEGLU: F.gelu(gate(x)) * up(x) (Gemma's: F.gelu(gate(x), "
      "approximate=\"tanh\") * up(x)); GPT-2's MLP: nn.GELU(approximate=\"tanh\"); or, if the other "
      "activation is meant, name it so",
      "SwiGLU：F.silu(gate(x)) * up(x)；GEGLU：F.gelu(gate(x)) * up(x)（Gemma 的："
      "F.gelu(gate(x), approximate=\"tanh\") * up(x)）；GPT-2 的 MLP："
      "nn.GELU(approximate=\"tanh\")；如果本来就想用另一种激活函数，就让名字与它一致",
      r"(?i)self\.\w*(gelu|relu|silu|swish)\w*\s*=", r"(silu|gelu|swish)\(", r"act"),
    d("ffn_no_down_projection", "the FFN has no down projection back to d_model",
      "前馈网络缺少投影回 d_model 的 down 投影",
      "define self.down_proj = nn.Linear(d_ff, d_model) and return self.down_proj(hidden)",
      "定义 self.down_proj = nn.Linear(d_ff, d_model)，并返回 self.down_proj(hidden)",
      r"^\s*return\b"),
    d("residual_from_normed", "the residual starts from the normed input: h = norm(x); x = h + f(h)",
      "残差从归一化之后的输入开始：h = norm(x); x = h + f(h)",
      "add the sublayer to the un-normed input: x = x + f(norm(x))",
      "把子层输出加到归一化之前的输入上：x = x + f(norm(x))",
      r"=\s*self\.\w*(norm|ln)\w*\([^()]*\)\s*\+",  # x = self.norm(x) + f(...)
      r"=\s*(h|hn|normed|y|z)\s*\+", r"=\s*\w*(norm|ln)\w*\s*\+",  # BLOOM's layernorm_output +
      r"\+\s*self\.\w*(attn|attention|ffn|mlp|feed)"),
    d("shared_norm", "one norm is shared by the sublayers", "多个子层共用了同一个归一化层",
      "give each sublayer its own norm: self.attn_norm = RMSNorm(d_model); self.ffn_norm = "
      "RMSNorm(d_model)",
      "每个子层用自己的归一化层：self.attn_norm = RMSNorm(d_model)；self.ffn_norm = RMSNorm(d_model)",
      r"(ffn|mlp|feed_forward)\w*\(\s*self\.(attn\w*norm|norm_?1|ln_?1|input_layernorm)",
      r"(attn|attention)\w*\(\s*self\.(ffn\w*norm|norm_?2|ln_?2|post_attention_layernorm)",
      r"self\.\w*norm\w*\s*=", r"norm"),
    d("sandwich_norm_missing", "a sublayer's output is not normed before the add (its sandwich norm is "
      "missing)", "子层的输出在相加之前没有归一化（缺少 sandwich 里子层之后的那个归一化）",
      "norm each sublayer's output too, as Gemma's four norms do: x = x + post_norm(f(pre_norm(x)))",
      "子层的输出也要归一化，和 Gemma 的四个归一化一样：x = x + post_norm(f(pre_norm(x)))",
      SUBLAYER_CALL.format("mlp|ffn|feed_forward"), SUBLAYER_CALL.format("self_attn|attn|attention"),
      r"norm"),
    d("moe_weights_not_renormalized", "the chosen experts' weights are not renormalized to sum to 1, "
      "though the layer's setting (norm_topk_prob) says they are",
      "选出的专家权重没有重新归一化到和为 1，而这一层的设置（norm_topk_prob）要求归一化",
      "divide by the sum of the chosen weights: topk_weight / topk_weight.sum(dim=-1, keepdim=True)",
      "除以选出的权重之和：topk_weight / topk_weight.sum(dim=-1, keepdim=True)",
      r"/.*\b(scores|probs|gates|routing_weights|logits|router_probs)\w*\.sum\(",
      r"^(?!.*\btopk_weight\.sum).*=\s*\b(scores|probs|gates|routing_weights)\w*\.sum\(",
      r"\bif\b.*\b(norm_topk_prob|normalize)\b",  # the condition that reads the setting
      r"\bnorm_topk_prob\b|\bnormalize\b"),
    d("sink_not_in_softmax", "the attention sinks do not join the softmax (gpt-oss's sink logit is one more "
      "key of each head's softmax)", "注意力 sink 没有参与 softmax（gpt-oss 的 sink logit 是每个头的 softmax "
      "里多出来的一个键）",
      "join each head's sink logit to the scores before the softmax and drop its column after: "
      "w = torch.cat([scores, sinks], -1).softmax(-1)[..., :-1]",
      "在 softmax 之前把每个头的 sink logit 拼到分数上，softmax 之后再去掉这一列："
      "w = torch.cat([scores, sinks], -1).softmax(-1)[..., :-1]",
      r"softmax\(", r"sink"),
    d("latent_split_swapped", "the latent and the RoPE key are taken from the wrong ends of wkv_a's output",
      "潜在向量和 RoPE 键从 wkv_a 输出的错误一端取出",
      "the latent comes first, the shared RoPE key last: kv, k_pe = torch.split(self.wkv_a(x), "
      "[self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)",
      "潜在向量在前，共享的 RoPE 键在后：kv, k_pe = torch.split(self.wkv_a(x), "
      "[self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)",
      r"k_pe\s*,\s*\w+\s*=", r"split\(.*rope_head_dim\s*,", r"k_pe\s*=.*\[", r"split\("),
    d("latent_scale_wrong_width", "the softmax scale is taken from another head width, not the query/key "
      "head's (qk_nope_head_dim + qk_rope_head_dim)", "softmax 的缩放用了别的头宽度，不是查询/键头的宽度"
      "（qk_nope_head_dim + qk_rope_head_dim）",
      "scale by the width of a query and key head: self.softmax_scale = self.qk_head_dim ** -0.5",
      "按查询和键每个头的宽度缩放：self.softmax_scale = self.qk_head_dim ** -0.5",
      r"scal\w*\s*=.*(v_head_dim|nope_head_dim|rope_head_dim)", r"scal\w*\s*="),
    d("latent_key_not_rotated", "the shared RoPE key k_pe is not rotated", "共享的 RoPE 键 k_pe 没有旋转",
      "rotate the decoupled key like the queries' RoPE part: k_pe = apply_rotary_emb(k_pe.unsqueeze(2), "
      "freqs_cis)",
      "像查询的 RoPE 部分一样旋转解耦的键：k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)",
      r"k_pe\s*=.*(unsqueeze|\[:, :, None|view)", r"k_pe\s*=", r"k_pe"),
    d("dropout_on_residual", "dropout is applied to the residual path", "dropout 用在了残差通路上",
      "drop only the sublayer's output: x = x + dropout(f(norm(x))) (pre-norm) or x = norm(x + "
      "dropout(f(x))) (post-norm)",
      "只对子层输出做 dropout：x = x + dropout(f(norm(x)))（Pre-Norm）或 x = norm(x + dropout(f(x)))"
      "（Post-Norm）",
      r"dropout\w*\(\s*(x|X)\s*[),+]", r"dropout\w*\([^)]*\+", r"dropout"),
    d("rope_wrong_base", "the rotary frequencies use the wrong base or exponent",
      "旋转位置编码的频率用错了底数或指数",
      "inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), with the base you are given "
      "(10000 by default)",
      "inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))，底数用传进来的 base"
      "（默认 10000）",
      r"\*\*", r"10000|theta|base"),
    d("rope_no_offset", "the rotary positions do not start at the offset (the tokens already in the cache)",
      "旋转位置没有从偏移量（缓存里已有的 token 数）开始",
      "rotate positions offset .. offset + T - 1: freqs_cis[start_pos : start_pos + T] (Meta), "
      "cos[offset : offset + T]",
      "应旋转位置 offset .. offset + T - 1：freqs_cis[start_pos : start_pos + T]（Meta），"
      "cos[offset : offset + T]",
      r"\[\s*:\s*(\w+\.)?(seq_len|seqlen|T|t|n|length)\b",
      r"arange\(\s*(\w+\.)?(seq_len|seqlen|T|t|n|length)\b",  # positions 0 .. T - 1 that index the table
      r"\[\s*:", r"offset|start"),
    d("rope_rotation_sign", "the rotation goes the wrong way (rotate_half's minus sign on the wrong half)",
      "旋转方向反了（rotate_half 的负号加在了另一半上）",
      "rotate_half(x) = torch.cat((-x2, x1), dim=-1), with x1, x2 = x.chunk(2, dim=-1); a table of the "
      "angles themselves, not their negatives: torch.polar(torch.ones_like(freqs), freqs)",
      "rotate_half(x) = torch.cat((-x2, x1), dim=-1)，其中 x1, x2 = x.chunk(2, dim=-1)；表里用角度本身，"
      "不要取负：torch.polar(torch.ones_like(freqs), freqs)",
      r"cat\(\s*[\(\[]\s*x2\s*,\s*-\s*x1", r"polar\([^,]*,\s*-",  # Meta's table of -angles
      # ChatGLM's pairs: x0 * cos + x1 * sin, where x0 * cos - x1 * sin is meant
      r"\[\.\.\.,\s*0\]\s*\*\s*\w+\[\.\.\.,\s*0\]\s*\+",
      r"stack\(", r"cat\("),
    d("kv_repeat_order", "the key/value heads are repeated in the wrong order (repeat where "
      "repeat_interleave is meant)", "键/值头的复制顺序错了（该用 repeat_interleave 的地方用了 repeat）",
      "each key/value head serves consecutive query heads: k.repeat_interleave(n_rep, dim=1), or "
      "k[:, :, None].expand(B, Hkv, n_rep, S, Dh).reshape(B, H, S, Dh)",
      "每个键/值头服务相邻的若干个查询头：k.repeat_interleave(n_rep, dim=1)，或 "
      "k[:, :, None].expand(B, Hkv, n_rep, S, Dh).reshape(B, H, S, Dh)",
      r"\.repeat\(", r"expand\([^)]*n_rep\w*\s*,\s*\w*(kv|n_kv)", r"\.expand\(", r"expand|repeat"),
    d("mask_not_applied", "the mask is never applied: the result of masked_fill is thrown away",
      "掩码没有生效：masked_fill 的结果被丢掉了",
      "masked_fill returns a new tensor: scores = scores.masked_fill(mask == 0, -1e9) (or masked_fill_ "
      "in place)",
      "masked_fill 返回一个新张量：scores = scores.masked_fill(mask == 0, -1e9)（或原地的 masked_fill_）",
      r"^\s*[\w.]+\.masked_fill\(", r"masked_fill", r"mask"),
    d("mask_hides_queries", "the mask hides queries instead of keys: shape (B, 1, S, 1) where (B, 1, 1, S) "
      "is meant", "掩码屏蔽了查询而不是键：形状是 (B, 1, S, 1)，应为 (B, 1, 1, S)",
      "put the key axis last: mask[:, None, None, :] of shape (B, 1, 1, S), so every query hides the "
      "same padded keys",
      "把键的维度放在最后：mask[:, None, None, :]，形状 (B, 1, 1, S)，这样每个查询都屏蔽同样的填充键",
      r"\[:,\s*None,\s*:,\s*None\]", r"mask\w*\.unsqueeze\(-1\)", r"mask\w*\.transpose\(-[12],\s*-[12]\)",
      r"\(\s*\w+,\s*1,\s*\w+,\s*1\s*\)",  # DistilBERT's shape tuple (bs, 1, k_length, 1)
      r"unsqueeze|None\]", r"^(?!\s*def ).*mask"),
    d("causal_mask_not_cropped", "the causal mask is built once for the maximum length and not cropped to T",
      "因果掩码按最大长度建好，却没有裁剪到当前长度 T",
      "crop it to the input: self.mask[:T, :T] (nanoGPT: self.bias[:, :, :T, :T])",
      "裁剪到当前输入长度：self.mask[:T, :T]（nanoGPT：self.bias[:, :, :T, :T]）",
      r"masked_fill\([^,]*self\.\w+\s*==", r"masked_fill\(", r"register_buffer"),
    d("mask_repeat_order", "the mask is repeated over the heads in the wrong order (repeat where "
      "repeat_interleave is meant)",
      "掩码在多个头上的复制顺序错了（该用 repeat_interleave 的地方用了 repeat）",
      "valid_lens = torch.repeat_interleave(valid_lens, repeats=num_heads, dim=0): row b * num_heads + h "
      "of the (B * num_heads) layout belongs to batch row b",
      "valid_lens = torch.repeat_interleave(valid_lens, repeats=num_heads, dim=0)：(B * num_heads) 排布中"
      "行 b * num_heads + h 属于样本 b",
      r"\.repeat\(", r"repeat"),
    d("qk_norm_after_rope", "the queries and keys are normed after the rotation (QK-norm goes before RoPE)",
      "查询和键在旋转之后才归一化（QK-norm 应在 RoPE 之前）",
      "norm each head's queries and keys first, then rotate them: q, k = q_norm(q), k_norm(k); then "
      "q, k = apply_rotary_pos_emb(q, k, cos, sin) (Qwen3, minimind)",
      "先对每个头的查询和键归一化，再旋转：q, k = q_norm(q), k_norm(k)；然后 "
      "q, k = apply_rotary_pos_emb(q, k, cos, sin)（Qwen3、minimind）",
      r"(q|query)_?(norm|layernorm|ln)\(", r"_norm\("),
]
