"""The diagnoses of the assembled models: the encoder-decoder Transformer (its embeddings,
positional encoding, final norms) and nanoGPT's decoder-only `GPT(config)`."""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d("pe_missing", "the positional encoding is never added to the embeddings",
      "位置编码没有加到嵌入上",
      "pass the embeddings through the positional encoding on both sides: x = self.pos(self.src_embed(src)), "
      "y = self.pos(self.tgt_embed(tgt)); without it attention sees a bag of tokens",
      "两端的嵌入都要经过位置编码：x = self.pos(self.src_embed(src))，y = self.pos(self.tgt_embed(tgt))；"
      "没有它，注意力看到的只是一袋 token",
      r"=\s*self\.\w*(embed|emb|lut|wte)\w*\(\w+\)\s*$", r"embed|emb"),
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
      r"return\s+self\.\w+\(\w+\)\s*$", r"=\s*self\.\w*(embed|emb|lut)\w*\(\w+\)\s*$", r"sqrt\("),
    d("final_norm_missing", "a pre-norm stack ends without its final norm",
      "pre-norm 的堆栈最后没有归一化层",
      "in a pre-norm stack each layer's output is not normed: end the encoder and the decoder with a norm, "
      "return self.norm(x) (nanoGPT's ln_f)",
      "pre-norm 堆栈中每层的输出都没有归一化：编码器和解码器最后都要接一个归一化层，return self.norm(x)"
      "（nanoGPT 的 ln_f）",
      r"^\s*return\s+[a-z_]\w*\s*$", r"ln_f|norm"),
]
