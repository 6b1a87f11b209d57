"""The catalogue of named mistakes, one module a chapter: the tutorials' components, the LLM
chapter's (RMSNorm, gated FFNs, the pre-norm block, RoPE, grouped-query attention, masks as attention
applies them), and the next chapter's (from logits to tokens)."""
