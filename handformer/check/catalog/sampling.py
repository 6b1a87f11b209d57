"""The diagnoses of the next chapter, from logits to tokens: temperature, top-k, top-p, greedy
choice, a sampling step, and the generation loop."""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d("temperature_multiplied", "the logits are multiplied by the temperature instead of divided",
      "logits 乘以了温度，而不是除以温度",
      "divide: logits / temperature (a temperature above 1 flattens the distribution, below 1 sharpens it)",
      "应除以温度：logits / temperature（温度大于 1 分布更平，小于 1 更尖）",
      r"\*\s*\(?\s*((\w+\.)?temp|tau\b|t\b)", r"temp"),
    d("temperature_after_softmax", "the temperature is applied after the softmax, so it does not change "
      "the distribution", "温度是在 softmax 之后才用的，不改变分布",
      "divide the logits before the softmax: F.softmax(logits / temperature, dim=-1)",
      "在 softmax 之前除以温度：F.softmax(logits / temperature, dim=-1)",
      r"(softmax\(.*\)|probs?)\s*/\s*(self\.)?temp", r"temp"),
    d("filter_fill_finite", "the filtered tokens are filled with a finite value, so they keep some "
      "probability", "被过滤掉的 token 填的是有限值，仍然保留了一些概率",
      "fill with float('-inf'), which the softmax turns into exactly 0 (minGPT's 1e-10 is not -1e10)",
      "用 float('-inf') 填充，softmax 之后正好是 0（minGPT 的 1e-10 不是 -1e10）",
      r"\d(\.\d*)?e-?\d+", r"masked_fill_?\([^,]+,\s*-?\s*\d[\d.]*\s*\)",  # masked_fill(remove, 0.0)
      r"masked_fill|\]\s*=", r"fill"),
    d("top_k_off_by_one", "top-k keeps one token too many or too few", "top-k 多保留或少保留了一个 token",
      "threshold at the k-th largest logit: v = torch.topk(logits, k).values[..., -1:]; "
      "logits.masked_fill(logits < v, float('-inf'))",
      "以第 k 大的 logit 为阈值：v = torch.topk(logits, k).values[..., -1:]；"
      "logits.masked_fill(logits < v, float('-inf'))",
      r"(?i)(<=|>=).*inf|inf.*(<=|>=)", r"(<=|>=)\s*(torch\.)?topk\(",  # compared with the k-th value
      r"<=|>=|\[\s*(\.\.\.|:)\s*,\s*\[?\s*-?\s*\w+\s*[-+]\s*1",
      r"\[\s*:\s*\w+\s*[-+]\s*1\s*\]",  # a sorted list cut one short or long: ranked[:k - 1]
      r"topk|sort", r"<|>"),
    d("top_k_exceeds_vocab", "top-k fails when k is larger than the vocabulary",
      "k 大于词表大小时 top-k 报错", "clamp k to the vocabulary: k = min(k, logits.size(-1))",
      "把 k 限制在词表大小之内：k = min(k, logits.size(-1))",
      r"topk\(", r"\bk\b|top_k"),
    d("top_p_drops_crossing", "top-p drops the token whose probability crosses p",
      "top-p 丢掉了让累计概率越过 p 的那个 token",
      "keep a token while the probability ranked above it is below p: remove = cumsum - probs >= p",
      "只要排在它前面的概率之和还小于 p，就保留这个 token：remove = cumsum - probs >= p",
      r"^(?![^=]*=.*\s-\s).*(cum|sum)\w*(\([^()]*\))?\s*>=?\s*(self\.)?\w*p\b", r"cumsum", r">|<"),
    d("top_p_empty_set", "top-p can remove every token (when the most likely one alone is above p)",
      "top-p 可能把所有 token 都去掉（最可能的 token 自己的概率就超过 p 时）",
      "always keep the most likely token: sorted_to_remove[..., 0] = False",
      "始终保留最可能的那个 token：sorted_to_remove[..., 0] = False",
      r"cumsum", r"remove|mask"),
    d("min_p_not_scaled",
      "min-p's threshold is min_p itself, not min_p x the most likely token's probability",
      "min-p 的阈值是 min_p 本身，而不是 min_p × 最可能 token 的概率",
      "scale the threshold by the largest probability: "
      "probs < min_p * probs.max(dim=-1, keepdim=True).values",
      "阈值要乘上最大的概率：probs < min_p * probs.max(dim=-1, keepdim=True).values",
      r"min_p\s*\*(?!.*\b(max|amax)\b)",
      # not __init__ storing it; llama.cpp's sample_min_p(logits, p) names it p
      r"^(?!\s*self\.min_p\s*=).*[=<>]\s*\(?\s*(self\.)?(min_p|p)\s*\)?\s*(#|$)",
      r"^(?!\s*def ).*\bmin_p\b"),
    d("temperature_twice",
      "the temperature is applied twice, so the distribution is sharpened (or flattened) by t squared",
      "温度用了两次，分布按 t 的平方变尖（或变平）",
      "divide the logits by the temperature once: after logits = logits / temperature, take "
      "F.softmax(logits, dim=-1)",
      "logits 只除以一次温度：logits = logits / temperature 之后直接 F.softmax(logits, dim=-1)",
      r"softmax\(.*/\s*\(?\s*(self\.)?temp", r"/\s*\(?\s*(self\.)?temp"),
    d("repetition_penalty_inverted", "the repetition penalty is the wrong way round: positive logits of "
      "seen tokens are multiplied and negative ones divided, so repeats become likelier",
      "重复惩罚方向反了：见过的 token 正 logit 被乘、负 logit 被除，重复反而更可能",
      "divide a positive logit, multiply a negative one: torch.where(score > 0, score / penalty, "
      "score * penalty)",
      "正 logit 除以惩罚系数，负 logit 乘以惩罚系数：torch.where(score > 0, score / penalty, "
      "score * penalty)",
      r"where\(.*>\s*0\s*,[^,]*\*", r"where\(.*<\s*0\s*,[^,]*/", r"\*=?\s*(self\.)?\w*penalty", r"penalty"),
    d("repetition_penalty_sign_ignored", "the repetition penalty divides every seen token's logit, so a "
      "negative one moves toward 0 and the token becomes likelier",
      "重复惩罚把见过的 token 的 logit 一律除以惩罚系数，负 logit 向 0 靠近，这个 token 反而更可能",
      "look at the sign: a positive logit is divided by the penalty, a negative one multiplied by it "
      "(CTRL's rule, Hugging Face's RepetitionPenaltyLogitsProcessor)",
      "要看符号：正 logit 除以惩罚系数，负 logit 乘以惩罚系数（CTRL 的规则，Hugging Face 的 "
      "RepetitionPenaltyLogitsProcessor）",
      r"/=?\s*(self\.)?\w*penalty", r"penalty"),
    d("sampling_softmax_wrong_dim", "the sampling step's softmax runs over the wrong dimension",
      "采样时的 softmax 作用在了错误的维度上",
      "take the softmax over the vocabulary: probs = F.softmax(logits, dim=-1)",
      "softmax 应沿词表维度：probs = F.softmax(logits, dim=-1)",
      r"softmax"),
    d("sampling_from_logits", "the sampling step samples from the logits, not from probabilities",
      "采样时直接对 logits 采样，而不是对概率采样",
      "turn logits into probabilities first: torch.multinomial(F.softmax(logits, dim=-1), 1)",
      "先把 logits 变成概率：torch.multinomial(F.softmax(logits, dim=-1), 1)",
      r"multinomial\(", r"sample"),
    d("argmax_wrong_dim", "argmax runs over the wrong dimension", "argmax 作用在了错误的维度上",
      "take the most likely token of each row: logits.argmax(dim=-1)",
      "取每一行最可能的 token：logits.argmax(dim=-1)",
      r"argmax|\.max\("),
    d("generate_not_appended", "the new token is never appended: every step sees the same input",
      "新生成的 token 没有拼接回输入，每一步看到的都是同样的输入",
      "append it inside the loop: idx = torch.cat((idx, idx_next), dim=1)",
      "在循环里把它拼接回去：idx = torch.cat((idx, idx_next), dim=1)",
      r"torch\.cat|\bcat\(", r"for .* in range|while"),
    d("generate_no_crop", "the context is not cropped to the block size",
      "上下文没有裁剪到 block_size",
      "keep the last block_size tokens: idx_cond = idx if idx.size(1) <= block_size else "
      "idx[:, -block_size:]",
      "只保留最后 block_size 个 token：idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]",
      r"\w+_cond\w*\s*=", r"\[:,\s*-\s*\w*(block_size|max_len)", r"model\(|self\("),
    d("generate_cache_mismatch", "with the KV cache, the tokens differ from those generated without it",
      "用了 KV 缓存之后，生成的 token 与不用缓存时不同",
      "after the prompt, feed only the new token, with the cache the previous step returned, at position "
      "= the number of tokens already seen",
      "处理完提示词之后，每一步只输入新 token，带上上一步返回的缓存，位置等于已经看过的 token 数",
      r"model\(\s*(next|new|last|tok)\w*(?![^)]*past)", r"\binput_pos\s*=\s*torch\.tensor\(",  # gpt-fast's
      r"past|cache|start_pos|position", r"model\(|self\("),
    d("generate_prompt_overwritten", "generated tokens overwrite the prompt of a longer row (a batch of "
      "prompts of different lengths)", "生成的 token 覆盖了较长那一行的提示词（一批提示词长短不一时）",
      "keep the prompt where there is one: next_token = torch.where(input_text_mask[:, cur_pos], "
      "tokens[:, cur_pos], next_token)",
      "有提示词的位置保留提示词：next_token = torch.where(input_text_mask[:, cur_pos], tokens[:, cur_pos], "
      "next_token)",
      r"torch\.where\(.*mask", r"\w+\[\s*:\s*,\s*\w+\s*\]\s*=\s*\w+"),
    d("generate_reads_padding", "a shorter prompt's row is fed padding as if it were text (decoding does not "
      "start after the shortest prompt)",
      "较短提示词的那一行把填充当成文本送进了模型（解码没有从最短的提示词之后开始）",
      "start at the shortest prompt, for cur_pos in range(min_prompt_len, total_len), and keep the longer "
      "prompts' tokens with input_text_mask",
      "从最短的提示词之后开始：for cur_pos in range(min_prompt_len, total_len)，"
      "较长的提示词用 input_text_mask 保留",
      r"range\(\s*max\w*", r"for .* in range\("),
    d("generate_eos_in_prompt", "an EOS inside a longer prompt marks its row finished (the EOS test ignores "
      "the prompt mask)", "较长提示词里的 EOS 把这一行标成了已结束（判断 EOS 时没有排除提示词）",
      "count only generated tokens: eos_reached |= (~input_text_mask[:, cur_pos]) & (next_token == eos_id)",
      "只算生成的 token：eos_reached |= (~input_text_mask[:, cur_pos]) & (next_token == eos_id)",
      r"eos\w*\s*\|=", r"eos\w*\s*=.*==", r"==\s*\w*eos"),
    d("generate_prefix_refed", "the start position never moves on: every step feeds the whole prefix again "
      "from position 0, and the KV cache serves nothing", "起始位置一直没有前进：每一步都从位置 0 "
      "重新送入整个前缀，KV 缓存没有起作用",
      "move on after each step: prev_pos = cur_pos, so the next call feeds tokens[:, prev_pos:cur_pos] at "
      "start_pos = prev_pos",
      "每一步之后前进：prev_pos = cur_pos，下一次调用送入 tokens[:, prev_pos:cur_pos]，start_pos = prev_pos",
      r"\[\s*:\s*,\s*\w+\s*:\s*\w+\s*\]\s*,\s*\w+", r"forward\("),
    d("generate_does_not_stop", "generate calls the model more times than max_new_tokens asks for",
      "generate 调用模型的次数超过了 max_new_tokens",
      "run the loop exactly max_new_tokens times: for _ in range(max_new_tokens)",
      "循环恰好执行 max_new_tokens 次：for _ in range(max_new_tokens)",
      r"while", r"for .* in range"),
]
