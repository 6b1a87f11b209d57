"""The diagnoses of the assembled models: the encoder-decoder Transformer (its embeddings,
positional encoding, final norms) and nanoGPT's decoder-only `GPT(config)`."""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d("pe_missing", "the positional encoding is never added to the embeddings",
      "位置编码没有加到嵌入上",
      "add the positions to the token embeddings, on both sides of an encoder-decoder: "
      "x = self.pos(self.src_embed(src)), y = self.pos(self.tgt_embed(tgt)); nanoGPT: tok_emb + pos_emb. "
      "Without them attention sees a bag of tokens",
      "把位置编码加到词嵌入上，编码器-解码器的两端都要加：x = self.pos(self.src_embed(src))，"
      "y = self.pos(self.tgt_embed(tgt))；nanoGPT 是 tok_emb + pos_emb。"
      "没有它，注意力看到的只是一堆没有顺序的 token（词袋）",
      r"^\s*\w+\s*=\s*(tok|token|word)_?emb\w*\s*$",  # `x = tok_emb`, pos_emb computed and left out
      r"=\s*self\.\w*(embed|emb|lut|wte)\w*\(\w+\)\s*$", r"drop\w*\(\s*\w*emb\w*\s*\)",
      r"drop\w*\((?![^#]*\+)[^#]*\bself\.\w*(embed|emb|lut|wte)\w*\(",  # dropout(emb(x) * scale), no sum
      r"embed|emb"),
    d("pe_after_dropout", "the positional encoding is added after the dropout",
      "位置编码是在 dropout 之后才加上的",
      "add the positions first, then drop out the sum: dropout(embed(x) + pe), as the paper applies dropout "
      "to the sums of the embeddings and the positional encodings",
      "先加位置编码，再对和做 dropout：dropout(embed(x) + pe)，论文是对嵌入与位置编码之和做 dropout",
      r"dropout\(\s*[\w.]+(\([^)]*\))?\s*\)\s*\+", r"\+\s*self\.(pe|pos)", r"dropout"),
    d("embedding_scale_unused", "the embedding's sqrt(d_model) is computed but never applied",
      "嵌入的 sqrt(d_model) 算了，却没有乘上",
      "multiply the embedding by it: return self.lut(x) * math.sqrt(self.d_model) (or drop the factor on "
      "purpose: GPT-2 and Llama do not scale)",
      "把它乘到嵌入上：return self.lut(x) * math.sqrt(self.d_model)（或者有意不缩放：GPT-2 和 Llama 都不乘）",
      # the Annotated Transformer's `return self.lut(x)`: an embedding's call returned as it is (not a
      # norm's: Gemma's `return self.norm(hidden_states)` ends a forward whose embedding is unscaled above)
      r"return\s+self\.\w*(tok|embed|emb|lut|wte|word)\w*\(\w+\)\s*$",
      r"^\s*\w+\s*=\s*\w*(embed|emb)\w*\s*$",  # Gemma's `hidden_states = inputs_embeds`, unscaled
      r"=\s*self\.\w*(embed|emb|lut)\w*\(\w+\)\s*$",
      r"self\.[\w.]*(tok|embed|emb|lut|wte)\w*\(\w+\)(?!\s*\*)", r"sqrt\(|\*\*\s*0?\.5\b"),
    d("final_norm_missing", "a pre-norm stack ends without its final norm",
      "Pre-Norm 的层堆叠最后没有归一化层",
      "in a pre-norm stack each layer's output is not normed: end the encoder and the decoder with a norm, "
      "return self.norm(x) (nanoGPT's ln_f)",
      "Pre-Norm 堆叠中每层的输出都没有归一化：编码器和解码器最后都要接一个归一化层，return self.norm(x)"
      "（nanoGPT 的 ln_f）",
      # a tied head applied to the stack's output as it is (OLMo's F.linear(x, self.wte.weight))
      r"F\.linear\(\s*x\s*,",
      r"^\s*\w+\s*=\s*block\(\w+\)\s*$", r"^\s*return\s+[a-z_]\w*\s*$", r"ln_f|norm"),
    d("causal_mask_missing", "the decoder-only model has no causal mask: every position sees the future",
      "decoder-only 模型没有因果掩码：每个位置都看得到后面的 token",
      "mask the scores before the softmax: att = att.masked_fill(self.bias[:, :, :T, :T] == 0, "
      "float('-inf')) (or F.scaled_dot_product_attention(q, k, v, is_causal=True)); without it training "
      "learns to copy the next token",
      "softmax 之前屏蔽得分：att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))"
      "（或 F.scaled_dot_product_attention(q, k, v, is_causal=True)）；没有它，训练学会的是照抄下一个 token",
      r"is_causal\s*=\s*(False|0)\b",  # scaled_dot_product_attention(..., is_causal=False)
      r"(att|scores|attn|weights)\s*=.*(@|matmul).*transpose", r"softmax\(",
      # a torch.nn encoder stack called on the stream alone (PyTorch's tutorial hands it src_mask)
      r"self\.(?!pos)\w*(encoder|transformer|stack|layers|blocks)\w*\(\s*\w+\s*\)"),
    d("beam_no_stop_at_eos", "in the beam search EOS never ends a hypothesis",
      "束搜索里 EOS 不会结束假设",
      "a candidate that ends with EOS is finished: take it out of the beam, score it by score / "
      "length ** alpha and keep it with the finished ones",
      "以 EOS 结尾的候选就结束了：把它移出束，用 score / length ** alpha 打分，放进已结束的假设里",
      r"^\s*if len\(\w+\) < \w+:", r"end_symbol|eos", r"for .* in .*candidates"),
    d("beam_eos_not_emitted", "the beam search returns the best hypothesis without its EOS",
      "束搜索返回的最优假设没有 EOS", "keep EOS in the finished hypothesis: finished.append((score, tokens))",
      "已结束的假设要保留 EOS：finished.append((score, tokens))",
      r"\[:-1\]", r"finished\w*\.append",
      # a finished hypothesis stored (Hugging Face's BeamHypotheses: hyps[b].add(tokens, score))
      r"\b\w*(hyp|finish|final|complete|ended)\w*(\[[^]]*\])?\.(append|add)\(", r"return"),
    d("beam_finished_extended", "finished hypotheses stay in the beam and are extended",
      "已结束的假设还留在束里，继续被扩展",
      "a hypothesis that emitted EOS leaves the beam: only the other candidates (elif) become live beams",
      "输出了 EOS 的假设要离开束：只有其他候选（elif）才进入新的束",
      r"^\s*if len\(\w+\) < \w+:", r"\w+\.append\(\(score", r"beams"),
    d("beam_shortest_returned", "the beam search returns the first finished (shortest) hypothesis, not the "
      "best normalised one", "束搜索返回的是最先结束（最短）的假设，而不是归一化得分最高的",
      "return the finished hypothesis with the best score / length ** alpha: max(finished, key=...)",
      "返回 score / length ** alpha 最高的已结束假设：max(finished, key=...)",
      r"(return|=)\s*finished\w*\[0\]", r"\[0\]", r"return"),
    d("beam_length_penalty_per_step", "the length penalty divides the running score at every step",
      "每一步都把累计得分除以一次长度惩罚",
      "keep the running score a plain sum of log-probabilities; divide by length ** alpha once, when a "
      "hypothesis finishes", "累计得分就是对数概率之和；只在假设结束时除以一次 length ** alpha",
      r"\*\*\s*\(?alpha|\*\*\s*\(?length_penalty", r"alpha"),
    d("beam_scores_not_accumulated", "the beam search ranks candidates by the new token's log-probability "
      "alone, not the hypothesis' summed score",
      "束搜索只按新 token 的对数概率给候选排序，没有加上假设的累计得分",
      "a candidate's score is its hypothesis' score plus the new token's log-probability: "
      "candidates.append((score + log_prob, tokens + [token])) (batched: log_probs + beam_scores[:, None])",
      "候选的得分是它所在假设的得分加上新 token 的对数概率：candidates.append((score + log_prob, tokens + "
      "[token]))（批量写法：log_probs + beam_scores[:, None]）",
      # `scores = log_probs`, `keys = logp` (the ranking keys of gumbel_topk's search)
      r"^\s*\w*(scores?|cand|keys?)\w*\s*=\s*\w*log_?p(rob)?s?\w*(\[[^]]*\])?\s*(#.*)?$",
      # a batched search's scores the log-softmax alone: `scores = F.log_softmax(logits, dim=-1)`
      r"^\s*\w*(scores?|cand)\w*\s*=\s*[\w.]*log_softmax\((?:[^()]|\([^()]*\))*\)(\[[^]]*\])?\s*(#.*)?$",
      r"\.append\(\(\s*\w*log_?probs?\w*\s*,",
      # the tokens first, then the new token's log-probability alone: `append((tokens + [idx], lp))`
      r"\.append\(\(.*,\s*\w*(\blp|log_?probs?|logp)\w*\s*\)\)",
      r"log_?prob"),
    d("beam_one_not_greedy", "with beam size 1 and no length penalty the beam search is not greedy decoding",
      "束宽为 1（beam_size=1）、没有长度惩罚时，束搜索与贪心解码不一致",
      "each step scores the next token from the last position (out[:, -1]), adds log-probabilities and keeps "
      "the best: with one beam that is greedy decoding",
      "每一步用最后一个位置（out[:, -1]）给下一个 token 打分，累加对数概率，保留最好的："
      "束宽为 1 时就是贪心解码",
      r"\[:, 0\s*[,\]]", r"generator\(", r"decode\("),  # out[:, 0] or logits[:, 0, :]
    d("train_step_loss_not_divided", "under gradient accumulation the micro-batches' losses are not divided "
      "by their number", "梯度累加时，各 micro-batch 的损失没有除以它们的个数",
      "backward() adds the gradients of every micro-batch: divide each loss by the number of them, "
      "(loss / accum_steps).backward(), so the update is the one of the whole batch",
      "backward() 会把每个 micro-batch 的梯度加起来：每个损失都要除以 micro-batch 的个数，"
      "(loss / accum_steps).backward()，这样更新才和整个 batch 的一样",
      r"\.backward\(\)", r"loss"),
    d("beam_batched_differs", "the beam search of a batch differs from searching each sentence alone",
      "批量束搜索的结果与逐句单独搜索不同",
      "each sentence's search must see its own source (src[i:i + 1], src_mask[i:i + 1]) and its own beams "
      "only: candidates are ranked within a sentence, never across the batch",
      "每句的搜索只能看到自己的源句（src[i:i + 1]、src_mask[i:i + 1]）和自己的束：候选只在一句之内排序，"
      "不能跨 batch 排序",
      r"\[:1\]|\[0\]", r"for .* in range\(", r"src"),
    d("head_tied_despite_config", "the output head is tied to the token embedding though the config says not",
      "配置说不共享权重，输出层却与词嵌入共享了权重",
      "tie only when the config asks: if config.tie_weights: "
      "self.transformer.wte.weight = self.lm_head.weight",
      "只在配置要求时共享：if config.tie_weights: self.transformer.wte.weight = self.lm_head.weight",
      r"\.weight\s*=\s*self\.[\w.]+\.weight", r"tie"),
]
