"""The planted mistakes of `handformer check`'s proof: each is a text edit of the correct.py of one
fixture family (tests/fixtures/learners*/: the tutorials' style, the LLM chapter's modern block,
d2l's and nanoGPT's styles), and <family folder>/<name>.py is that edit applied (`python
tests/check_plants.py` rewrites them; a test keeps them in sync).

PLANTS[name] = Plant(the diagnosis it must produce, the kind that names it, [(old text, new text),
...], family); each old text must occur in the file, and only its first occurrence is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
CORRECT = FIXTURES / "learners" / "correct.py"

ENC_ATTN = """        attn_output, _ = self.self_attention(x, x, x, mask)
        x = self.norm1(x + self.dropout(attn_output))
"""
ENC_FFN = """        ffn_output = self.ffn(x)
        x = self.norm2(x + self.dropout(ffn_output))
"""
SPLIT = ".view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)"


@dataclass(frozen=True)
class Plant:
    """A planted mistake: the diagnosis it must produce (None: a difference by design), the kind of
    component that names it (checked alone with --component), the edits, and the fixture family
    whose correct.py it edits."""

    diagnosis: str | None
    kind: str
    edits: list[tuple[str, str]]
    family: str = "tutorial"
    also: tuple[str, ...] = ()  # diagnoses the mistake brings with it, named too

    @property
    def expected(self) -> set[str]:
        return ({self.diagnosis} if self.diagnosis else set()) | set(self.also)


FAMILIES = {"tutorial": FIXTURES / "learners", "llm": FIXTURES / "learners_llm",
            "d2l": FIXTURES / "learners_d2l", "nanogpt": FIXTURES / "learners_nanogpt",
            "sampling": FIXTURES / "learners_sampling", "training": FIXTURES / "learners_training",
            "assembly": FIXTURES / "learners_assembly", "model": FIXTURES / "learners_model",
            "gpt": FIXTURES / "learners_gpt", "loop": FIXTURES / "learners_loop", "bpe": FIXTURES / "learners_bpe",
            "cache": FIXTURES / "learners_cache", "minimind_qk": FIXTURES / "learners_minimind_qk",
            "gemma3": FIXTURES / "learners_gemma3", "gpt_oss": FIXTURES / "learners_gpt_oss",
            "deepseek": FIXTURES / "learners_deepseek",
            "adamw": FIXTURES / "learners_adamw",
            "llama_batch": FIXTURES / "learners_llama_batch", "llama_kv": FIXTURES / "learners_llama_kv",
            "moe": FIXTURES / "learners_moe", "wordpiece": FIXTURES / "learners_wordpiece"}

TUTORIAL_PLANTS: dict[str, Plant] = {
    "no_scaling": Plant("no_scaling", "sdpa", [("k.transpose(-2, -1)) / math.sqrt(d_k)", "k.transpose(-2, -1))")]),
    "scale_by_dk": Plant("scale_by_dk", "sdpa", [("k.transpose(-2, -1)) / math.sqrt(d_k)", "k.transpose(-2, -1)) / d_k")]),
    "softmax_wrong_dim": Plant("softmax_wrong_dim", "sdpa", [("F.softmax(scores, dim=-1)", "F.softmax(scores, dim=-2)")]),
    "mask_after_softmax": Plant("mask_after_softmax", "sdpa", [
        ("    if mask is not None:\n        scores = scores.masked_fill(mask == 0, -1e9)\n", ""),
        ("    return torch.matmul(attn, v), attn", "    if mask is not None:\n        attn = attn.masked_fill(mask == 0, 0)\n"
                                                 "    return torch.matmul(attn, v), attn")]),
    "mask_inverted": Plant("mask_inverted", "sdpa", [("mask == 0", "mask == 1")]),
    "split_no_transpose": Plant("split_no_transpose", "mha", [(SPLIT, ".view(batch_size, self.n_heads, -1, self.d_k)")] * 3),
    "concat_no_transpose": Plant("concat_no_transpose", "mha", [("context.transpose(1, 2).contiguous()", "context.contiguous()")]),
    "no_output_projection": Plant("no_output_projection", "mha", [("return self.fc(context), attn", "return context, attn")]),
    "kv_swapped": Plant("kv_swapped", "mha", [("K = self.w_k(k)", "K = self.w_v(k)"), ("V = self.w_v(v)", "V = self.w_k(v)")]),
    "no_residual": Plant("no_residual", "encoder_layer", [(ENC_FFN, """        ffn_output = self.ffn(x)
        x = self.norm2(self.dropout(ffn_output))
""")]),
    "pre_norm": Plant("pre_norm", "encoder_layer", [(ENC_ATTN, """        h = self.norm1(x)
        attn_output, _ = self.self_attention(h, h, h, mask)
        x = x + self.dropout(attn_output)
""")]),
    "ffn_no_activation": Plant("ffn_no_activation", "ffn", [("(F.relu(self.linear1(x))))", "(self.linear1(x)))")]),
    "dropout_in_eval": Plant("dropout_in_eval", "ffn", [("return self.linear2(self.dropout(", "return self.linear2(F.dropout(")]),
    "pe_sin_cos_swapped": Plant("pe_sin_cos_swapped", "positional_encoding", [("pe[:, 0::2] = torch.sin(", "pe[:, 0::2] = torch.cos("),
                                                  ("pe[:, 1::2] = torch.cos(", "pe[:, 1::2] = torch.sin(")]),
    "pe_wrong_frequency": Plant("pe_wrong_frequency", "positional_encoding", [("torch.arange(0, d_model, 2).float() * (-math",
                                                   "torch.arange(0, d_model // 2).float() * (-math")]),
    "decoder_masks_swapped": Plant("decoder_masks_swapped", "decoder_layer", [
        ("self.self_attention(x, x, x, tgt_mask)", "self.self_attention(x, x, x, src_mask)"),
        ("enc_output, enc_output, src_mask)", "enc_output, enc_output, tgt_mask)")]),
    "causal_no_self": Plant("causal_off_by_one", "causal_mask", [("diagonal=0)", "diagonal=-1)")]),
    "causal_sees_next": Plant("causal_off_by_one", "causal_mask", [("diagonal=0)", "diagonal=1)")]),
    "nan_on_masked_rows": Plant("nan_on_masked_rows", "sdpa", [(", -1e9)", ", float('-inf'))")]),
    "layernorm_unbiased_std": Plant("layernorm_unbiased_std", "layernorm", [
        ("(x - mean) / torch.sqrt(var + self.eps)", "(x - mean) / (x.std(dim=-1, keepdim=True) + self.eps)")]),
    # consistently pre-norm: a difference by design, not a mistake
    "pre_norm_consistent": Plant(None, "encoder_layer", [(ENC_ATTN, """        h = self.norm1(x)
        attn_output, _ = self.self_attention(h, h, h, mask)
        x = x + self.dropout(attn_output)
"""), (ENC_FFN, """        x = x + self.dropout(self.ffn(self.norm2(x)))
""")]),
}

RMS = "        x_hat = x * torch.rsqrt(mean_square + self.eps)\n"
BLOCK_ATTN = "        x = x + self.dropout(self.attn(self.attn_norm(x), mask))\n"
GATE = "F.silu(self.gate_proj(x)) * self.up_proj(x)"

LLM_PLANTS: dict[str, Plant] = {
    "rmsnorm_sum_squares": Plant("rmsnorm_sum_squares", "rmsnorm", [("x.pow(2).mean(", "x.pow(2).sum(")], "llm"),
    "rmsnorm_no_sqrt": Plant("rmsnorm_no_sqrt", "rmsnorm", [
        (RMS, "        x_hat = x / (mean_square + self.eps)\n")], "llm"),
    "norm_eps_outside_sqrt": Plant("norm_eps_outside_sqrt", "rmsnorm", [
        (RMS, "        x_hat = x / (torch.sqrt(mean_square) + self.eps)\n")], "llm"),
    "norm_no_gain": Plant("norm_no_gain", "rmsnorm", [("        return self.weight * x_hat\n", "        return x_hat\n")],
                          "llm"),
    "norm_wrong_dim": Plant("norm_wrong_dim", "rmsnorm", [
        ("(dim=-1, keepdim=True)\n        x_hat", "(dim=1, keepdim=True)\n        x_hat")], "llm"),
    "gated_act_after_product": Plant("gated_act_after_product", "ffn", [
        (GATE, "F.silu(self.gate_proj(x) * self.up_proj(x))")], "llm"),
    "gated_activation_wrong_branch": Plant("gated_activation_wrong_branch", "ffn", [
        (GATE, "self.gate_proj(x) * F.silu(self.up_proj(x))")], "llm"),
    "ffn_wrong_activation": Plant("ffn_wrong_activation", "ffn", [("F.silu(", "F.gelu(")], "llm"),
    "ffn_no_down_projection": Plant("ffn_no_down_projection", "ffn", [
        ("        return self.down_proj(hidden)\n", "        return hidden\n")], "llm"),
    "residual_from_normed": Plant("residual_from_normed", "block", [
        (BLOCK_ATTN, "        h = self.attn_norm(x)\n        x = h + self.dropout(self.attn(h, mask))\n")], "llm"),
    "shared_norm": Plant("shared_norm", "block", [("self.ffn(self.ffn_norm(x))", "self.ffn(self.attn_norm(x))")],
                         "llm"),
    "dropout_on_residual": Plant("dropout_on_residual", "block", [
        ("x = x + self.dropout(self.ffn(", "x = self.dropout(x + self.ffn(")], "llm"),
    "rope_wrong_base": Plant("rope_wrong_base", "rope", [
        ("torch.arange(0, dim, 2).float() / dim", "torch.arange(0, dim // 2).float() / dim")], "llm"),
    "rope_no_offset": Plant("rope_no_offset", "rope", [
        ("self.cos_cached[offset:offset + seq_len], self.sin_cached[offset:offset + seq_len]",
         "self.cos_cached[:seq_len], self.sin_cached[:seq_len]")], "llm"),
    "rope_rotation_sign": Plant("rope_rotation_sign", "rope", [
        ("torch.cat((-x2, x1), dim=-1)", "torch.cat((x2, -x1), dim=-1)")], "llm"),
    "kv_repeat_order": Plant("kv_repeat_order", "gqa", [
        ("    b, h, t, d = x.shape\n    return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)",
         "    return x.repeat(1, n_rep, 1, 1)")], "llm"),
    "mask_not_applied": Plant("mask_not_applied", "gqa", [
        ("scores = scores.masked_fill(mask == 0, -1e9)", "scores.masked_fill(mask == 0, -1e9)")], "llm"),
}

STYLE_PLANTS: dict[str, Plant] = {
    "causal_mask_not_cropped": Plant("causal_mask_not_cropped", "causal_attention", [
        ("self.bias[:, :, :T, :T] == 0", "self.bias == 0")], "nanogpt"),
    # with -inf, a padded query row that is hidden whole comes out NaN: named too
    "mask_hides_queries": Plant("mask_hides_queries", "causal_attention", [
        ("attention_mask[:, None, None, :] == 0", "attention_mask[:, None, :, None] == 0")], "nanogpt",
        ("nan_on_masked_rows",)),
    "mask_repeat_order": Plant("mask_repeat_order", "mha", [
        ("torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)", "valid_lens.repeat(self.num_heads)")],
        "d2l"),
    # diagnoses of the tutorials' style planted in the other styles too (the covering pairs need two
    # mistakes of one file)
    "d2l_add_norm_no_residual": Plant("no_residual", "add_norm", [
        ("return self.ln(self.dropout(Y) + X)", "return self.ln(self.dropout(Y))")], "d2l"),
    "nanogpt_no_scaling": Plant("no_scaling", "causal_attention", [
        ("att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))", "att = q @ k.transpose(-2, -1)")],
        "nanogpt"),
    "nanogpt_mlp_no_activation": Plant("ffn_no_activation", "ffn", [
        ("self.c_proj(self.gelu(self.c_fc(x)))", "self.c_proj(self.c_fc(x))")], "nanogpt"),
    **{f"d2l_{name}": Plant(p.diagnosis, p.kind, p.edits, "d2l", p.also) for name, p in {
        "no_scaling": Plant("no_scaling", "sdpa", [("keys.transpose(1, 2)) / math.sqrt(d)", "keys.transpose(1, 2))")]),
        "scale_by_dk": Plant("scale_by_dk", "sdpa", [("keys.transpose(1, 2)) / math.sqrt(d)",
                                                      "keys.transpose(1, 2)) / d")]),
        "softmax_wrong_dim": Plant("softmax_wrong_dim", "masked_softmax", [
            ("return nn.functional.softmax(X, dim=-1)", "return nn.functional.softmax(X, dim=-2)"),
            ("softmax(X.reshape(shape), dim=-1)", "softmax(X.reshape(shape), dim=-2)")]),
        "mask_inverted": Plant("mask_inverted", "masked_softmax", [("X[~keep] = value", "X[keep] = value")]),
        "kv_swapped": Plant("kv_swapped", "mha", [
            ("self.transpose_qkv(self.W_k(keys))", "self.transpose_qkv(self.W_v(keys))"),
            ("self.transpose_qkv(self.W_v(values))", "self.transpose_qkv(self.W_k(values))")]),
        "split_no_transpose": Plant("split_no_transpose", "mha", [
            ("        X = X.permute(0, 2, 1, 3)\n        return X.reshape(-1, X.shape[2], X.shape[3])",
             "        return X.reshape(-1, X.shape[1], X.shape[3])")]),
        "concat_no_transpose": Plant("concat_no_transpose", "mha", [
            ("        X = X.permute(0, 2, 1, 3)\n        return X.reshape(X.shape[0], X.shape[1], -1)",
             "        return X.reshape(X.shape[0], X.shape[2], -1)")]),
        # W_o, a LazyLinear the forward never calls, gets its (n, n) shape from the grader
        "no_output_projection": Plant("no_output_projection", "mha", [
            ("return self.W_o(self.transpose_output(output))", "return self.transpose_output(output)")]),
        "ffn_no_activation": Plant("ffn_no_activation", "ffn", [
            ("self.dense2(self.relu(self.dense1(X)))", "self.dense2(self.dense1(X))")]),
        "pe_sin_cos_swapped": Plant("pe_sin_cos_swapped", "positional_encoding", [
            ("self.P[:, :, 0::2] = torch.sin(angles)", "self.P[:, :, 0::2] = torch.cos(angles)"),
            ("self.P[:, :, 1::2] = torch.cos(angles)", "self.P[:, :, 1::2] = torch.sin(angles)")]),
        "pe_wrong_frequency": Plant("pe_wrong_frequency", "positional_encoding", [
            ("torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens",
             "torch.arange(0, num_hiddens // 2, dtype=torch.float32) / num_hiddens")]),
        "decoder_masks_swapped": Plant("decoder_masks_swapped", "decoder_layer", [
            ("self.attention1(X, key_values, key_values, dec_valid_lens)",
             "self.attention1(X, key_values, key_values, enc_valid_lens)"),
            ("self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens)",
             "self.attention2(Y, enc_outputs, enc_outputs, dec_valid_lens)")]),
        # the decoder builds its causal mask from valid lengths: 0..T-1 (no self), 2..T+1 (sees next)
        "causal_no_self": Plant("causal_off_by_one", "decoder_layer", [
            ("torch.arange(1, num_steps + 1", "torch.arange(0, num_steps")]),
        "causal_sees_next": Plant("causal_off_by_one", "decoder_layer", [
            ("torch.arange(1, num_steps + 1", "torch.arange(2, num_steps + 2")]),
    }.items()},
    **{f"nanogpt_{name}": plant for name, plant in {
        "kv_swapped": Plant("kv_swapped", "causal_attention", [
            ("q, k, v = self.c_attn(x).split(", "q, v, k = self.c_attn(x).split(")], "nanogpt"),
        # nanoGPT fills with -inf: a padded query row hidden whole by the softmax over queries is NaN
        "softmax_wrong_dim": Plant("softmax_wrong_dim", "causal_attention", [
            ("att = F.softmax(att, dim=-1)", "att = F.softmax(att, dim=-2)")], "nanogpt", ("nan_on_masked_rows",)),
        "concat_no_transpose": Plant("concat_no_transpose", "causal_attention", [
            ("y = y.transpose(1, 2).contiguous().view(B, T, C)", "y = y.contiguous().view(B, T, C)")], "nanogpt"),
        "no_output_projection": Plant("no_output_projection", "causal_attention", [
            ("return self.resid_dropout(self.c_proj(y))", "return self.resid_dropout(y)")], "nanogpt"),
        "no_residual": Plant("no_residual", "block", [
            ("x = x + self.mlp(self.ln_2(x))", "x = self.mlp(self.ln_2(x))")], "nanogpt"),
        "causal_sees_next": Plant("causal_off_by_one", "causal_attention", [
            ("mask = torch.tril(torch.ones(config.block_size, config.block_size))",
             "mask = torch.tril(torch.ones(config.block_size, config.block_size), diagonal=1)")], "nanogpt"),
    }.items()},
}

TOP_P_RULE = "    mass_above = torch.cumsum(probs, dim=-1) - probs\n    remove = mass_above >= p\n"
GEN_LOOP = "    for _ in range(max_new_tokens):\n        block_size = model.config.block_size\n"

SAMPLING_PLANTS: dict[str, Plant] = {
    "temperature_multiplied": Plant("temperature_multiplied", "temperature", [
        ("return logits / temperature", "return logits * temperature")], "sampling"),
    "temperature_after_softmax": Plant("temperature_after_softmax", "temperature", [
        ("return logits / temperature", "return F.softmax(logits, dim=-1) / temperature")], "sampling"),
    "filter_fill_finite": Plant("filter_fill_finite", "top_k", [
        ('logits.masked_fill(logits < kth, float("-inf"))', "logits.masked_fill(logits < kth, 1e-10)")], "sampling"),
    "top_k_off_by_one": Plant("top_k_off_by_one", "top_k", [("logits < kth", "logits <= kth")], "sampling"),
    "repetition_penalty_inverted": Plant("repetition_penalty_inverted", "repetition_penalty", [
        ("score > 0, score / penalty, score * penalty", "score > 0, score * penalty, score / penalty")],
        "sampling"),
    "repetition_penalty_sign_ignored": Plant("repetition_penalty_sign_ignored", "repetition_penalty", [
        ("torch.where(score > 0, score / penalty, score * penalty)", "score / penalty")], "sampling"),
    "top_k_exceeds_vocab": Plant("top_k_exceeds_vocab", "top_k", [("    k = min(k, logits.size(-1))\n", "")],
                                 "sampling"),
    "top_p_drops_crossing": Plant("top_p_drops_crossing", "top_p", [
        (TOP_P_RULE, "    remove = torch.cumsum(probs, dim=-1) > p\n")], "sampling"),
    # keeping the token whose mass above equals p exactly (Hugging Face's classic rule): a convention
    "top_p_keeps_at_equality": Plant(None, "top_p", [("remove = mass_above >= p", "remove = mass_above > p")],
                                     "sampling"),
    "top_p_empty_set": Plant("top_p_empty_set", "top_p", [
        (TOP_P_RULE + "    remove[..., 0] = False\n",
         "    remove = torch.cumsum(probs, dim=-1) >= p\n    remove[..., 1:] = remove[..., :-1].clone()\n")],
        "sampling"),
    # no early return at p = 1: a token of probability 1e-26 is dropped by rounding, no mistake (PASS)
    "top_p_one_rounding": Plant(None, "top_p", [("    if p >= 1.0:\n        return logits\n", "")], "sampling"),
    "min_p_not_scaled": Plant("min_p_not_scaled", "min_p", [
        ("threshold = min_p * probs.max(dim=-1, keepdim=True).values", "threshold = min_p")], "sampling"),
    "temperature_twice": Plant("temperature_twice", "sample", [
        ("    probs = F.softmax(logits, dim=-1)\n    return torch.multinomial",
         "    probs = F.softmax(logits / temperature, dim=-1)\n    return torch.multinomial")], "sampling"),
    "sampling_softmax_wrong_dim": Plant("sampling_softmax_wrong_dim", "sample", [
        ("    probs = F.softmax(logits, dim=-1)\n    return torch.multinomial",
         "    probs = F.softmax(logits, dim=0)\n    return torch.multinomial")], "sampling"),
    "sampling_from_logits": Plant("sampling_from_logits", "sample", [
        ("torch.multinomial(probs, num_samples=1)", "torch.multinomial(logits, num_samples=1)")], "sampling"),
    "argmax_wrong_dim": Plant("argmax_wrong_dim", "greedy", [("logits.argmax(dim=-1)", "logits.argmax(dim=0)")],
                              "sampling"),
    "generate_not_appended": Plant("generate_not_appended", "generate", [
        ("        idx = torch.cat((idx, idx_next), dim=1)\n", "        idx_new = torch.cat((idx, idx_next), dim=1)\n")],
        "sampling"),
    "generate_no_crop": Plant("generate_no_crop", "generate", [
        ("idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]", "idx_cond = idx")], "sampling"),
    "generate_cache_mismatch": Plant("generate_cache_mismatch", "generate", [
        ("out = model(next_id, past_key_values=past, use_cache=True)", "out = model(next_id, use_cache=True)")],
        "sampling"),
    "generate_does_not_stop": Plant("generate_does_not_stop", "generate", [
        (GEN_LOOP, GEN_LOOP.replace("for _ in range(max_new_tokens):", "while idx.size(1) < 10**6:"))], "sampling"),
}

COSINE = "    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)\n"

TRAINING_PLANTS: dict[str, Plant] = {
    "train_step_no_zero_grad": Plant("train_step_no_zero_grad", "train_step", [
        ("    optimizer.zero_grad()\n    loss.backward()\n", "    loss.backward()\n")], "training"),
    "train_step_clip_after_step": Plant("train_step_clip_after_step", "train_step", [
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n    optimizer.step()\n",
         "    optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n")], "training"),
    "train_step_eval_mode": Plant("train_step_eval_mode", "train_step", [("    model.train()\n", "")], "training"),
    "train_step_no_shift": Plant("train_step_no_shift", "train_step", [
        ("logits = model(src, tgt_in)", "logits = model(src, tgt)"),
        ("tgt_out.reshape(-1))", "tgt.reshape(-1))")], "training"),
    "loss_counts_padding": Plant("loss_counts_padding", "loss", [
        ("return (nll * real).sum() / real.sum()", "return (nll * real).sum() / targets.numel()")], "training"),
    "loss_counts_padding_in_the_loss": Plant("loss_counts_padding", "loss", [
        ("return (nll * real).sum() / real.sum()", "return nll.mean()")], "training"),
    "loss_mean_over_batch": Plant("loss_mean_over_batch", "loss", [
        ("return (nll * real).sum() / real.sum()", "return (nll * real).sum() / targets.size(0)")], "training"),
    "smoothing_on_pad": Plant("smoothing_on_pad", "loss", [("        smoothed[:, self.padding_idx] = 0.0\n", "")],
                              "training"),
    "loss_log_zero": Plant("loss_log_zero", "loss", [
        ("return self.criterion(x, smoothed.detach())", "return (smoothed * (smoothed.log() - x)).sum()")],
        "training"),
    "schedule_step_zero": Plant("schedule_step_zero", "schedule", [
        ("    # LambdaLR calls this with step 0 first: count it as step 1\n    if step == 0:\n        step = 1\n", "")],
        "training"),
    "schedule_exponent_sign": Plant("schedule_exponent_sign", "schedule", [
        ("min(step ** (-0.5), step", "min(step ** (0.5), step")], "training"),
    "schedule_no_d_model": Plant("schedule_no_d_model", "schedule", [
        ("return factor * (model_size ** (-0.5) * min(", "return factor * (min(")], "training"),
    "schedule_warmup_off_by_one": Plant("schedule_warmup_off_by_one", "schedule", [
        ("    if it < warmup_iters:\n", "    warmup_iters = warmup_iters - 1  # the index of the last warmup step\n"
                                      "    if it < warmup_iters:\n")], "training"),
    "cosine_from_step_zero": Plant("cosine_from_step_zero", "schedule", [
        (COSINE, "    progress = it / cosine_cycle_iters\n")], "training"),
    "cosine_no_floor": Plant("cosine_no_floor", "schedule", [
        ("    if it > cosine_cycle_iters:\n        return min_learning_rate\n", "")], "training"),
    "cosine_min_lr_ignored": Plant("cosine_min_lr_ignored", "schedule", [
        ("return min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (max_learning_rate - min_learning_rate)",
         "return 0.5 * (1 + math.cos(math.pi * progress)) * max_learning_rate")], "training"),
}

ASSEMBLY_PLANTS: dict[str, Plant] = {
    "greedy_no_stop_at_eos": Plant("greedy_no_stop_at_eos", "greedy_decode", [
        ("        if next_word == end_symbol:\n            break\n", "")], "assembly"),
    "greedy_eos_not_emitted": Plant("greedy_eos_not_emitted", "greedy_decode", [
        ("        ys = torch.cat([ys, torch.full((1, 1), next_word, dtype=src.dtype)], dim=1)\n"
         "        if next_word == end_symbol:\n            break\n",
         "        if next_word == end_symbol:\n            break\n"
         "        ys = torch.cat([ys, torch.full((1, 1), next_word, dtype=src.dtype)], dim=1)\n")], "assembly"),
    "mask_pad_id": Plant("mask_pad_id", "mask_helper", [
        ("return (src != pad_idx).unsqueeze(1)", "return (src != 0).unsqueeze(1)")], "assembly"),
    "mask_pad_wrong_sequence": Plant("mask_pad_wrong_sequence", "mask_helper", [
        ("src_mask = (src != pad_idx)[:, None, None, :]", "src_mask = (tgt != pad_idx)[:, None, None, :]")],
        "assembly"),
    "mask_combined_with_or": Plant("mask_combined_with_or", "mask_helper", [
        ("return pad_mask & causal", "return pad_mask | causal")], "assembly"),
    "mask_helper_causal_sees_next": Plant("causal_off_by_one", "mask_helper", [
        ("causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=tgt.device))",
         "causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=tgt.device), diagonal=1)")], "assembly"),
}

BEAM_ENDS = """            if tokens[-1] == end_symbol:
                if rank < beam_size:  # among the best: it ends here and leaves the beam
                    finished.append((score / (len(tokens) - 1) ** alpha, tokens))
            elif len(beams) < beam_size:
"""

MODEL_PLANTS: dict[str, Plant] = {
    "pe_missing": Plant("pe_missing", "transformer", [
        ("x = self.pos(self.src_embed(src))", "x = self.src_embed(src)")], "model"),
    "pe_after_dropout": Plant("pe_after_dropout", "transformer", [
        ("return self.dropout(x + self.pe[:, : x.size(1)])", "return self.dropout(x) + self.pe[:, : x.size(1)]")],
        "model"),
    "embedding_scale_unused": Plant("embedding_scale_unused", "transformer", [
        ("return self.lut(x) * self.scale", "return self.lut(x)")], "model"),
    "final_norm_missing": Plant("final_norm_missing", "transformer", [
        ("        return self.encoder_norm(x)\n", "        return x\n")], "model"),
    "model_mask_wrong_sequence": Plant("mask_pad_wrong_sequence", "transformer", [
        ("src_mask = self.make_src_mask(src)", "src_mask = self.make_src_mask(tgt)")], "model"),
    "beam_no_stop_at_eos": Plant("beam_no_stop_at_eos", "beam_search", [(BEAM_ENDS, "            if len(beams) < beam_size:\n")],
                                 "model"),
    "beam_eos_not_emitted": Plant("beam_eos_not_emitted", "beam_search", [
        ("finished.append((score / (len(tokens) - 1) ** alpha, tokens))",
         "finished.append((score / (len(tokens) - 1) ** alpha, tokens[:-1]))")], "model"),
    "beam_finished_extended": Plant("beam_finished_extended", "beam_search", [
        ("            elif len(beams) < beam_size:\n", "            if len(beams) < beam_size:\n")], "model"),
    "beam_shortest_returned": Plant("beam_shortest_returned", "beam_search", [
        ("    return max(finished, key=lambda f: f[0])[1]\n", "    return finished[0][1]\n")], "model"),
    "beam_length_penalty_per_step": Plant("beam_length_penalty_per_step", "beam_search", [
        ("candidates.append((score + log_prob, tokens + [token]))",
         "candidates.append(((score + log_prob) / len(tokens) ** alpha, tokens + [token]))")], "model"),
    "beam_scores_not_accumulated": Plant("beam_scores_not_accumulated", "beam_search", [
        ("candidates.append((score + log_prob, tokens + [token]))", "candidates.append((log_prob, tokens + [token]))")],
        "model"),
    "beam_batched_differs": Plant("beam_batched_differs", "beam_search", [
        ("return [beam_search(model, src[i:i + 1],", "return [beam_search(model, src[:1],")], "model"),
    "beam_one_not_greedy": Plant("beam_one_not_greedy", "beam_search", [
        ("model.generator(out[:, -1])", "model.generator(out[:, 0])")],
        "model"),
}

GPT_PLANTS: dict[str, Plant] = {
    "gpt_causal_mask_missing": Plant("causal_mask_missing", "gpt", [
        ('        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))\n', "")], "gpt"),
    "gpt_causal_sees_next": Plant("causal_off_by_one", "gpt", [
        ("torch.tril(torch.ones(config.block_size, config.block_size))",
         "torch.tril(torch.ones(config.block_size, config.block_size), diagonal=1)")], "gpt"),
    "gpt_pe_missing": Plant("pe_missing", "gpt", [("self.transformer.drop(tok_emb + pos_emb)", "self.transformer.drop(tok_emb)")],
                            "gpt"),
    "head_tied_despite_config": Plant("head_tied_despite_config", "gpt", [
        ("        if config.tie_weights:\n            self.transformer.wte.weight = self.lm_head.weight\n",
         "        self.transformer.wte.weight = self.lm_head.weight\n")], "gpt"),
    "gpt_final_norm_missing": Plant("final_norm_missing", "gpt", [("        x = self.transformer.ln_f(x)\n", "")], "gpt"),
}

LOOP_PLANTS: dict[str, Plant] = {
    "train_step_loss_not_divided": Plant("train_step_loss_not_divided", "train_step", [
        ("        (loss / accum_steps).backward()\n", "        loss.backward()\n")], "loop"),
    "epoch_no_zero_grad": Plant("train_step_no_zero_grad", "train_epoch", [
        ("        optimizer.zero_grad()\n        loss.backward()\n", "        loss.backward()\n")], "loop"),
    "epoch_eval_mode": Plant("train_step_eval_mode", "train_epoch", [
        ("    model.train()\n    total = 0.0\n", "    total = 0.0\n")], "loop"),
}

UPDATE = "        update_counts(words, counts, where, best)\n"
SPLIT_SPECIALS = ('        if self.special_tokens:\n            parts = re.split("(" + "|".join(re.escape(t) for t in '
                  'self.special_tokens) + ")", text)\n        else:\n            parts = [text]\n')

BPE_PLANTS: dict[str, Plant] = {
    "bpe_merges_across_pretokens": Plant("bpe_merges_across_pretokens", "bpe", [
        ('        for match in re.finditer(PAT, chunk):\n            words[tuple(bytes([b]) for b in '
         'match.group().encode("utf-8"))] += 1\n',
         '        words[tuple(bytes([b]) for b in chunk.encode("utf-8"))] += 1\n')], "bpe"),
    "bpe_special_tokens_merged": Plant("bpe_special_tokens_merged", "bpe", [
        ('    chunks = re.split("|".join(re.escape(t) for t in special_tokens), text) if special_tokens else [text]\n',
         "    chunks = [text]\n")], "bpe"),
    "bpe_ties_not_by_bytes": Plant("bpe_ties_not_by_bytes", "bpe", [
        ("best = max(counts, key=lambda pair: (counts[pair], pair))", "best = max(counts, key=counts.get)")], "bpe"),
    # ties to the smaller pair: a convention, not a mistake
    "bpe_ties_smaller": Plant(None, "bpe", [
        ("best = max(counts, key=lambda pair: (counts[pair], pair))",
         "best = min(counts, key=lambda pair: (-counts[pair], pair))")], "bpe"),
    "bpe_counts_not_updated": Plant("bpe_counts_not_updated", "bpe", [(UPDATE, "        del counts[best]\n")], "bpe"),
    # each distinct pre-token's pairs counted once, in the first count and in each update
    "bpe_pairs_not_weighted": Plant("bpe_pairs_not_weighted", "bpe", [
        ("            counts[pair] += freq\n            where.setdefault(pair, set()).add(word)\n",
         "            counts[pair] += 1\n            where.setdefault(pair, set()).add(word)\n"),
        ("            counts[pair] -= freq\n", "            counts[pair] -= 1\n"),
        ("            counts[pair] += freq\n            where.setdefault(pair, set()).add(new)\n",
         "            counts[pair] += 1\n            where.setdefault(pair, set()).add(new)\n")], "bpe"),
    # recounting every pair after each merge (minbpe's): slow, not wrong; a note says how slow
    "bpe_recounts_every_merge": Plant(None, "bpe", [
        (UPDATE, "        words = Counter({merge_word(w, best): n for w, n in words.items()})\n"
                 "        counts, where = count_pairs(words)\n")], "bpe"),
    "bpe_vocab_size_ignores_specials": Plant("bpe_vocab_size_ignores_specials", "bpe", [
        ("while len(vocab) < vocab_size and counts:", "while len(merges) < vocab_size - 256 and counts:")], "bpe"),
    "bpe_special_token_split": Plant("bpe_special_token_split", "bpe_tokenizer", [
        (SPLIT_SPECIALS, "        parts = [text]\n")], "bpe"),
    "bpe_overlapping_specials": Plant("bpe_overlapping_specials", "bpe_tokenizer", [
        ("self.special_tokens = sorted(special_tokens or [], key=len, reverse=True)",
         "self.special_tokens = list(special_tokens or [])")], "bpe"),
    "bpe_encode_merge_order": Plant("bpe_encode_merge_order", "bpe_tokenizer", [
        ("best = min(pairs, key=lambda pair: self.ranks[pair])", "best = pairs[0]")], "bpe"),
    "bpe_encode_across_pretokens": Plant("bpe_merges_across_pretokens", "bpe_tokenizer", [
        ("            for match in re.finditer(PAT, part):\n                word = tuple(bytes([b]) for b in "
         'match.group().encode("utf-8"))\n                ids.extend',
         '            for word in [tuple(bytes([b]) for b in part.encode("utf-8"))]:\n                ids.extend')],
        "bpe"),
    "bpe_decode_per_token": Plant("bpe_decode_per_token", "bpe_tokenizer", [
        ('        data = b"".join(self.vocab[i] for i in ids)\n        return data.decode("utf-8", errors="replace")\n',
         '        return "".join(self.vocab[i].decode("utf-8", errors="replace") for i in ids)\n')], "bpe"),
    "bpe_decode_strict": Plant("bpe_decode_strict", "bpe_tokenizer", [
        ('return data.decode("utf-8", errors="replace")', 'return data.decode("utf-8")')], "bpe"),
}

WORDPIECE_PLANTS: dict[str, Plant] = {
    "wordpiece_pair_score": Plant("wordpiece_pair_score", "wordpiece", [
        ("return {pair: freq / (symbol_freqs[pair[0]] * symbol_freqs[pair[1]])\n                for pair, freq in "
         "pair_freqs.items()}", "return {pair: freq for pair, freq in pair_freqs.items()}")], "wordpiece"),
    "wordpiece_across_words": Plant("bpe_merges_across_pretokens", "wordpiece", [
        ('return re.findall(r"\\w+|[^\\w\\s]", text)', "return text.split()")], "wordpiece"),
    # ties to the greater pair: a convention, not a mistake
    "wordpiece_ties_greater": Plant(None, "wordpiece", [
        ("best = max(scores, key=scores.get)", "best = max(scores, key=lambda pair: (scores[pair], pair))")],
        "wordpiece"),
    "wordpiece_shortest_match": Plant("wordpiece_shortest_match", "wordpiece", [
        ("            end = len(word)\n", "            end = start + 1\n"),
        ("            while start < end:\n", "            while end <= len(word):\n"),
        ("                end -= 1\n", "                end += 1\n")], "wordpiece"),
    "wordpiece_missing_prefix": Plant("wordpiece_missing_prefix", "wordpiece", [
        ('                if start > 0:\n                    candidate = "##" + candidate\n', "")], "wordpiece"),
    "wordpiece_unk_piece": Plant("wordpiece_unk_piece", "wordpiece", [
        ("            if piece is None:\n                return [self.unk_token]\n",
         "            if piece is None:\n                return pieces + [self.unk_token]\n")], "wordpiece"),
    "wordpiece_decode_continuation": Plant("wordpiece_decode_continuation", "wordpiece", [
        ('return text.replace(" ##", "")', 'return text.replace("##", "")')], "wordpiece"),
}

CACHE_UPDATE = "        k, v = cache.update(layer, k, v)  # (B, S, Hkv, Dh): the cached tokens, then these\n"
CACHE_PLANTS: dict[str, Plant] = {
    "kv_rope_no_offset": Plant("rope_no_offset", "kv_cache", [("freqs_cis[start:start + T])", "freqs_cis[:T])")],
                               "cache"),
    "kv_cache_not_advanced": Plant("kv_cache_not_advanced", "kv_cache", [
        ("            cache.length += T\n", "            length = cache.length + T\n")], "cache"),
    "kv_keys_rotated_twice": Plant("kv_keys_rotated_twice", "kv_cache", [
        (CACHE_UPDATE, CACHE_UPDATE + "        _, k = apply_rotary_emb(k, k, freqs_cis[:k.size(1)])\n")], "cache"),
    # the keys cached before RoPE, all of them rotated at their positions on reading: a convention
    "kv_rotate_after_cache": Plant(None, "kv_cache", [
        ("    q, k = apply_rotary_emb(q, k, freqs_cis[start:start + T])  # positions start .. start + T - 1\n"
         + "    if cache is not None:\n" + CACHE_UPDATE,
         "    if cache is not None:\n" + CACHE_UPDATE
         + "    q, _ = apply_rotary_emb(q, q, freqs_cis[start:start + T])\n"
         + "    _, k = apply_rotary_emb(k, k, freqs_cis[:k.size(1)])\n")], "cache"),
    # chapter 16's training step of a language model
    "lm_train_step_lr_not_set": Plant("train_step_lr_not_set", "lm_train_step", [
        ('    for group in optimizer.param_groups:\n        group["lr"] = lr\n', "")], "cache"),
    "lm_train_step_no_zero_grad": Plant("train_step_no_zero_grad", "lm_train_step", [
        ("    optimizer.zero_grad()\n", "")], "cache"),
    "lm_train_step_clip_after_step": Plant("train_step_clip_after_step", "lm_train_step", [
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", ""),
        ("    optimizer.step()\n", "    optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n")],
        "cache"),
    "lm_train_step_not_clipped": Plant("train_step_not_clipped", "lm_train_step", [
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
         "    max_norm = 0.0\n    if max_norm > 1.0:\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n")],
        "cache"),
}

# minimind's newer style (tests/fixtures/learners_minimind_qk/): QK-norm inside the attention, a
# Hugging Face past_key_values cache, generate a method of the model that calls self.forward
QK_PLANTS: dict[str, Plant] = {
    "qk_norm_after_rope": Plant("qk_norm_after_rope", "block", [(
        "        xq, xk = self.q_norm(xq), self.k_norm(xk)  # QK-norm：先归一化\n"
        "        cos, sin = position_embeddings\n"
        "        xq, xk = apply_rotary_pos_emb(xq, xk, cos, sin, unsqueeze_dim=1)  # 再旋转\n",
        "        cos, sin = position_embeddings\n"
        "        xq, xk = apply_rotary_pos_emb(xq, xk, cos, sin, unsqueeze_dim=1)  # 先旋转\n"
        "        xq, xk = self.q_norm(xq), self.k_norm(xk)  # 再归一化\n")], "minimind_qk"),
    "qk_generate_no_stop_at_eos": Plant("greedy_no_stop_at_eos", "generate", [
        ("            finished |= next_token.squeeze(-1) == eos_token_id\n", "")], "minimind_qk"),
}
M_LINE = "            self.m[i] = self.beta1 * self.m[i] + (1 - self.beta1) * g\n"
ADAMW_PLANTS: dict[str, Plant] = {
    "adamw_no_bias_correction": Plant("adamw_no_bias_correction", "optimizer", [
        ("m_hat = self.m[i] / (1 - self.beta1 ** self.t)", "m_hat = self.m[i]"),
        ("v_hat = self.v[i] / (1 - self.beta2 ** self.t)", "v_hat = self.v[i]")], "adamw"),
    "adamw_coupled_weight_decay": Plant("adamw_coupled_weight_decay", "optimizer", [
        ("            g = p.grad\n", "            g = p.grad + self.weight_decay * p  # L2 in the gradient\n"),
        ("            p -= self.lr * self.weight_decay * p  # decoupled: the decay never enters m or v\n", "")],
        "adamw"),
    "adamw_eps_inside_sqrt": Plant("adamw_eps_inside_sqrt", "optimizer", [
        ("(torch.sqrt(v_hat) + self.eps)", "torch.sqrt(v_hat + self.eps)")], "adamw"),
    "adamw_beta2_for_m": Plant("adamw_beta2_for_m", "optimizer", [
        (M_LINE, M_LINE.replace("beta1", "beta2"))], "adamw"),
}
# the 2025-26 families as learners copy them: Gemma 3's sandwich norms and QK-norm (Hugging Face's
# modeling file), gpt-oss's attention sinks (OpenAI's model.py), DeepSeek's latent attention (its model.py)
FAMILY_PLANTS: dict[str, Plant] = {
    "gemma3_sandwich_norm_missing": Plant("sandwich_norm_missing", "block", [
        ("        hidden_states = self.post_feedforward_layernorm(hidden_states)\n", "")], "gemma3"),
    "gemma3_qk_norm_after_rope": Plant("qk_norm_after_rope", "gqa", [(
        "        query_states = self.q_norm(query_states)\n        key_states = self.k_norm(key_states)\n\n"
        "        cos, sin = position_embeddings\n"
        "        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)\n",
        "        cos, sin = position_embeddings\n"
        "        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)\n"
        "        query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)\n")],
        "gemma3"),
    "gptoss_sink_not_in_softmax": Plant("sink_not_in_softmax", "block", [
        ("    QK = torch.cat([QK, S], dim=-1)\n    W = torch.softmax(QK, dim=-1)\n",
         "    W = torch.softmax(QK, dim=-1)\n    W = torch.cat([W, S], dim=-1)\n")], "gpt_oss"),
    "gptoss_rmsnorm_sum_squares": Plant("rmsnorm_sum_squares", "rmsnorm", [
        ("torch.mean(t**2, dim=-1, keepdim=True)", "torch.sum(t**2, dim=-1, keepdim=True)")], "gpt_oss"),
    "deepseek_latent_split_swapped": Plant("latent_split_swapped", "mla", [
        ("kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)",
         "k_pe, kv = torch.split(kv, [self.qk_rope_head_dim, self.kv_lora_rank], dim=-1)")], "deepseek"),
    "deepseek_latent_scale_wrong_width": Plant("latent_scale_wrong_width", "mla", [
        ("self.softmax_scale = self.qk_head_dim ** -0.5", "self.softmax_scale = self.v_head_dim ** -0.5")],
        "deepseek"),
    "deepseek_latent_key_not_rotated": Plant("latent_key_not_rotated", "mla", [
        ("k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)", "k_pe = k_pe.unsqueeze(2)")], "deepseek"),
}
# A Chinese tutorial's Llama (tests/fixtures/learners_llama_batch/): Meta's pre-allocated KV cache and
# llama generation.py's batched generate over prompts of different lengths; its attention alone
# (tests/fixtures/learners_llama_kv/) for the cache's slices
BATCH_PLANTS: dict[str, Plant] = {
    "batch_prefix_refed": Plant("generate_prefix_refed", "generate", [("        prev_pos = cur_pos\n", "")],
                                "llama_batch"),
    "batch_prompt_overwritten": Plant("generate_prompt_overwritten", "generate", [(
        "        next_token = torch.where(input_text_mask[:, cur_pos], tokens[:, cur_pos], next_token)\n", "")],
        "llama_batch"),
    "batch_reads_padding": Plant("generate_reads_padding", "generate", [
        ("for cur_pos in range(min_prompt_len, total_len):", "for cur_pos in range(max_prompt_len, total_len):")],
        "llama_batch"),
    "batch_eos_in_prompt": Plant("generate_eos_in_prompt", "generate", [
        ("eos_reached |= (~input_text_mask[:, cur_pos]) & (next_token == eos_id)",
         "eos_reached |= next_token == eos_id")], "llama_batch"),
    "kv_cache_write_offset": Plant("kv_cache_write_offset", "mha", [
        ("self.k_cache[:bsz, start_pos: start_pos + seqlen] = xk",
         "self.k_cache[:bsz, start_pos + 1: start_pos + 1 + seqlen] = xk"),
        ("self.v_cache[:bsz, start_pos: start_pos + seqlen] = xv",
         "self.v_cache[:bsz, start_pos + 1: start_pos + 1 + seqlen] = xv")], "llama_kv"),
    "kv_cache_read_range": Plant("kv_cache_read_range", "mha", [
        ("keys = self.k_cache[:bsz, : start_pos + seqlen]", "keys = self.k_cache[:bsz, : start_pos]"),
        ("values = self.v_cache[:bsz, : start_pos + seqlen]", "values = self.v_cache[:bsz, : start_pos]")],
        "llama_kv"),
}
MOE_PLANTS: dict[str, Plant] = {
    "moe_weights_not_renormalized": Plant("moe_weights_not_renormalized", "moe", [
        ("topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)",
         "topk_weight / (scores.sum(dim=-1, keepdim=True) + 1e-20)")], "moe"),
    "moe_rmsnorm_sum_squares": Plant("rmsnorm_sum_squares", "rmsnorm", [
        ("x.pow(2).mean(-1, keepdim=True)", "x.pow(2).sum(-1, keepdim=True)")], "moe"),
}
PLANTS: dict[str, Plant] = {**TUTORIAL_PLANTS, **LLM_PLANTS, **STYLE_PLANTS, **SAMPLING_PLANTS, **TRAINING_PLANTS,
                            **ASSEMBLY_PLANTS, **MODEL_PLANTS, **GPT_PLANTS, **LOOP_PLANTS, **BPE_PLANTS,
                            **CACHE_PLANTS, **QK_PLANTS, **ADAMW_PLANTS, **FAMILY_PLANTS,
                            **BATCH_PLANTS, **MOE_PLANTS, **WORDPIECE_PLANTS}

# Pairs of plants that are three mistakes: nanoGPT fills with -inf, so a softmax over the queries, or
# a mask over them, brings NaN rows (nan_on_masked_rows) with it, and with a second mistake in the
# same attention that is more than the search's pairs (docs/check.md lists them).
THREE_MISTAKES: list[tuple[str, str]] = [
    ("nanogpt_no_scaling", "nanogpt_softmax_wrong_dim"), ("nanogpt_kv_swapped", "nanogpt_softmax_wrong_dim"),
    ("nanogpt_softmax_wrong_dim", "nanogpt_concat_no_transpose"),
    ("nanogpt_softmax_wrong_dim", "nanogpt_no_output_projection"),
    ("nanogpt_softmax_wrong_dim", "nanogpt_causal_sees_next"), ("mask_hides_queries", "nanogpt_softmax_wrong_dim"),
    ("mask_hides_queries", "nanogpt_concat_no_transpose"),
]
# Pairs of plants that hide every key of every query on the check's inputs (d2l's valid lengths
# inverted and repeated in the wrong order): nothing is left to compare, so the search takes no
# set of mistakes as the explanation (docs/check.md lists them).
HIDE_EVERY_QUERY: list[tuple[str, str]] = [("mask_repeat_order", "d2l_mask_inverted")]

# A covering set of pairs, run by default: every diagnosis in one pair at least, preferring two
# mistakes in one component (tests/test_check.py runs every pair of one family, marked slow).
COVERING_PAIRS: list[tuple[str, str]] = [
    ("gemma3_sandwich_norm_missing", "gemma3_qk_norm_after_rope"),
    ("gptoss_sink_not_in_softmax", "gptoss_rmsnorm_sum_squares"),
    ("deepseek_latent_split_swapped", "deepseek_latent_scale_wrong_width"),
    ("deepseek_latent_key_not_rotated", "deepseek_latent_scale_wrong_width"),
    ("no_scaling", "kv_swapped"), ("scale_by_dk", "split_no_transpose"), ("softmax_wrong_dim", "nan_on_masked_rows"),
    ("mask_after_softmax", "mask_inverted"), ("concat_no_transpose", "no_residual"),
    ("no_output_projection", "decoder_masks_swapped"), ("pre_norm", "ffn_no_activation"),
    ("dropout_in_eval", "layernorm_unbiased_std"), ("pe_sin_cos_swapped", "pe_wrong_frequency"),
    ("causal_sees_next", "dropout_in_eval"),
    ("rmsnorm_sum_squares", "norm_wrong_dim"), ("rmsnorm_no_sqrt", "norm_no_gain"),
    ("norm_eps_outside_sqrt", "residual_from_normed"), ("gated_act_after_product", "ffn_wrong_activation"),
    ("gated_activation_wrong_branch", "shared_norm"), ("ffn_no_down_projection", "kv_repeat_order"),
    ("dropout_on_residual", "rope_rotation_sign"), ("rope_wrong_base", "rope_no_offset"),
    ("kv_repeat_order", "mask_not_applied"),
    ("mask_repeat_order", "d2l_add_norm_no_residual"), ("causal_mask_not_cropped", "nanogpt_mlp_no_activation"),
    ("mask_hides_queries", "nanogpt_no_scaling"),
    ("temperature_multiplied", "top_k_off_by_one"), ("temperature_after_softmax", "generate_cache_mismatch"),
    ("filter_fill_finite", "top_k_exceeds_vocab"), ("top_p_drops_crossing", "argmax_wrong_dim"),
    ("top_k_off_by_one", "sampling_softmax_wrong_dim"), ("top_p_empty_set", "generate_no_crop"),
    ("min_p_not_scaled", "generate_not_appended"), ("repetition_penalty_inverted", "top_k_off_by_one"),
    ("repetition_penalty_sign_ignored", "temperature_multiplied"),
    ("moe_weights_not_renormalized", "moe_rmsnorm_sum_squares"), ("temperature_twice", "top_k_exceeds_vocab"), ("sampling_from_logits", "generate_cache_mismatch"),
    ("generate_not_appended", "generate_does_not_stop"),
    ("schedule_step_zero", "cosine_from_step_zero"), ("schedule_exponent_sign", "cosine_no_floor"),
    ("schedule_no_d_model", "schedule_warmup_off_by_one"), ("cosine_min_lr_ignored", "schedule_step_zero"),
    ("loss_counts_padding", "smoothing_on_pad"), ("loss_mean_over_batch", "loss_log_zero"),
    ("train_step_no_zero_grad", "train_step_eval_mode"), ("train_step_clip_after_step", "train_step_no_shift"),
    ("mask_pad_id", "greedy_no_stop_at_eos"), ("mask_combined_with_or", "greedy_eos_not_emitted"),
    ("mask_pad_wrong_sequence", "mask_helper_causal_sees_next"),
    ("pe_missing", "final_norm_missing"), ("pe_after_dropout", "embedding_scale_unused"),
    ("beam_no_stop_at_eos", "beam_length_penalty_per_step"), ("beam_eos_not_emitted", "beam_shortest_returned"),
    ("beam_finished_extended", "beam_eos_not_emitted"), ("beam_one_not_greedy", "pe_missing"),
    ("beam_batched_differs", "embedding_scale_unused"), ("beam_scores_not_accumulated", "final_norm_missing"),
    ("gpt_causal_mask_missing", "gpt_final_norm_missing"), ("gpt_causal_sees_next", "gpt_pe_missing"),
    ("train_step_loss_not_divided", "epoch_no_zero_grad"), ("head_tied_despite_config", "gpt_pe_missing"),
    ("bpe_merges_across_pretokens", "bpe_special_token_split"), ("bpe_special_tokens_merged", "bpe_encode_merge_order"),
    ("bpe_ties_not_by_bytes", "bpe_decode_per_token"), ("bpe_counts_not_updated", "bpe_decode_strict"),
    ("bpe_counts_not_updated", "bpe_overlapping_specials"), ("bpe_pairs_not_weighted", "bpe_special_token_split"), ("bpe_vocab_size_ignores_specials", "bpe_encode_across_pretokens"),
    ("kv_rope_no_offset", "kv_keys_rotated_twice"), ("kv_cache_not_advanced", "kv_keys_rotated_twice"),
    ("lm_train_step_lr_not_set", "lm_train_step_clip_after_step"), ("kv_rope_no_offset", "lm_train_step_not_clipped"),
    ("qk_norm_after_rope", "qk_generate_no_stop_at_eos"),
    ("adamw_no_bias_correction", "adamw_coupled_weight_decay"), ("adamw_eps_inside_sqrt", "adamw_beta2_for_m"),
    ("kv_cache_write_offset", "kv_cache_read_range"), ("batch_prefix_refed", "batch_prompt_overwritten"),
    ("batch_prefix_refed", "batch_reads_padding"), ("batch_prefix_refed", "batch_eos_in_prompt"),
    ("wordpiece_pair_score", "wordpiece_shortest_match"), ("wordpiece_missing_prefix", "wordpiece_decode_continuation"),
    ("wordpiece_unk_piece", "wordpiece_across_words"),
]


# Learner files written here in the styles learners copy (each one's correct.py is code of this
# project's, written in that style, never copied): Karpathy's "Let's build GPT" lecture, Raschka's
# LLMs from scratch, Meta's llama model.py, minimind, and the first tutorial's code carried on into
# the assembled model, label smoothing, the Noam rate and greedy decoding. Their plants are checked
# by tests/test_check_styles.py, one kind each.
WRITTEN = {"karpathy": FIXTURES / "learners_karpathy", "raschka": FIXTURES / "learners_raschka",
           "llama": FIXTURES / "learners_llama", "minimind": FIXTURES / "learners_minimind",
           "carried": FIXTURES / "learners_carried", "hf": FIXTURES / "learners_hf",
           "decoding": FIXTURES / "learners_decoding_zh", "lmloop": FIXTURES / "learners_lm_loop",
           "kvcache": FIXTURES / "learners_kvcache", "llamagen": FIXTURES / "learners_llama_gen",
           "torchnn": FIXTURES / "learners_torchnn"}
WRITTEN_PLANTS: dict[str, Plant] = {
    "karpathy_no_scaling": Plant("no_scaling", "causal_attention", [(" * k.shape[-1] ** -0.5", "")], "karpathy"),
    "karpathy_generate_no_crop": Plant("generate_no_crop", "generate", [
        ("idx_cond = idx[:, -block_size:]", "idx_cond = idx")], "karpathy"),
    "raschka_softmax_wrong_dim": Plant("softmax_wrong_dim", "causal_attention", [
        ("keys.shape[-1] ** 0.5, dim=-1)", "keys.shape[-1] ** 0.5, dim=-2)")], "raschka"),
    "raschka_layernorm_unbiased": Plant("layernorm_unbiased_std", "layernorm", [
        ("unbiased=False", "unbiased=True")], "raschka"),
    "llama_kv_repeat_order": Plant("kv_repeat_order", "gqa", [
        ("x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim)",
         "x[:, :, None, :, :].expand(bs, slen, n_rep, n_kv_heads, head_dim)")], "llama"),
    "llama_ffn_no_activation": Plant("ffn_no_activation", "ffn", [
        ("self.w2(F.silu(self.w1(x)) * self.w3(x))", "self.w2(self.w1(x) * self.w3(x))")], "llama"),
    "minimind_rope_rotation_sign": Plant("rope_rotation_sign", "rope", [
        ("torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)",
         "torch.cat((x[..., x.shape[-1] // 2:], -x[..., : x.shape[-1] // 2]), dim=-1)")], "minimind"),
    "llama_rope_no_offset": Plant("rope_no_offset", "gpt", [
        ("freqs_cis = self.freqs_cis[start_pos: start_pos + seqlen]", "freqs_cis = self.freqs_cis[:seqlen]")], "llama"),
    "llama_causal_off_by_one": Plant("causal_off_by_one", "gpt", [
        ("mask = torch.triu(mask, diagonal=1)", "mask = torch.triu(mask, diagonal=2)")], "llama"),
    "minimind_rope_wrong_base": Plant("rope_wrong_base", "gpt", [
        ("end=config.max_position_embeddings, theta=config.rope_theta)",
         "end=config.max_position_embeddings, theta=10000.0)")], "minimind"),
    "minimind_final_norm_missing": Plant("final_norm_missing", "gpt", [
        ("self.lm_head(self.norm(hidden_states))", "self.lm_head(hidden_states)")], "minimind"),
    "hf_rope_rotation_sign": Plant("rope_rotation_sign", "rope", [
        ("return torch.cat((-x2, x1), dim=-1)", "return torch.cat((x2, -x1), dim=-1)")], "hf"),
    "hf_final_norm_missing": Plant("final_norm_missing", "gpt", [
        ("logits = self.lm_head(self.norm(hidden_states))", "logits = self.lm_head(hidden_states)")], "hf"),
    "hf_kv_repeat_order": Plant("kv_repeat_order", "gqa", [
        ("k = k.repeat_interleave(self.num_key_value_groups, dim=1)  # (B, heads, T, head_dim)\n"
         "        v = v.repeat_interleave(self.num_key_value_groups, dim=1)",
         "k = k.repeat(1, self.num_key_value_groups, 1, 1)  # (B, heads, T, head_dim)\n"
         "        v = v.repeat(1, self.num_key_value_groups, 1, 1)")], "hf"),
    "decoding_top_k_off_by_one": Plant("top_k_off_by_one", "top_p", [
        ("logits = logits.masked_fill(logits < kth, filter_value)",
         "logits = logits.masked_fill(logits <= kth, filter_value)")], "decoding"),
    "decoding_top_k_exceeds_vocab": Plant("top_k_exceeds_vocab", "top_p", [
        ("    top_k = min(top_k, logits.size(-1))  # k 比词表大时，等于不过滤\n", "")], "decoding"),
    "decoding_top_p_drops_crossing": Plant("top_p_drops_crossing", "top_p", [
        ("remove = above >= top_p", "remove = probs.cumsum(-1) > top_p")], "decoding"),
    "decoding_sample_drops_crossing": Plant("top_p_drops_crossing", "sample", [
        ("mask = probs_sum - probs_sort > p", "mask = probs_sum > p")], "decoding"),
    "decoding_train_step_clip_after_step": Plant("train_step_clip_after_step", "train_step", [
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # 先裁剪，再 step\n"
         "    optimizer.step()\n",
         "    optimizer.step()\n"
         "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n")], "decoding"),
    "carried_greedy_no_stop_at_eos": Plant("greedy_no_stop_at_eos", "greedy_decode", [
        ("        if next_word == end_symbol:\n            break\n", "")], "carried"),
    "lmloop_schedule_warmup_off_by_one": Plant("schedule_warmup_off_by_one", "schedule", [
        ("    if step < warmup:  # linear", "    warmup = warmup - 1  # the last warmup step's index\n"
                                        "    if step < warmup:  # linear")], "lmloop"),
    "lmloop_cosine_min_lr_ignored": Plant("cosine_min_lr_ignored", "schedule", [
        ("    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
         "    return 0.5 * (1.0 + math.cos(math.pi * progress)) * max_lr")], "lmloop"),
    "lmloop_train_step_no_zero_grad": Plant("train_step_no_zero_grad", "lm_train_step", [
        ("    optimizer.zero_grad(set_to_none=True)\n", "")], "lmloop"),
    "lmloop_train_step_clip_after_step": Plant("train_step_clip_after_step", "lm_train_step", [
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    optimizer.step()\n",
         "    optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n")], "lmloop"),
    "kvcache_softmax_wrong_dim": Plant("softmax_wrong_dim", "causal_attention", [
        ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)")], "kvcache"),
    "kvcache_rope_no_offset": Plant("rope_no_offset", "rope", [
        ("cos[offset:offset + t][None, None], sin[offset:offset + t][None, None]",
         "cos[:t][None, None], sin[:t][None, None]")], "kvcache"),
    "kvcache_rmsnorm_sum_squares": Plant("rmsnorm_sum_squares", "rmsnorm", [
        ("x.float().pow(2).mean(dim=self.dim, keepdim=True)", "x.float().pow(2).sum(dim=self.dim, keepdim=True)")],
        "kvcache"),
    "llamagen_start_pos_zero": Plant("generate_cache_mismatch", "generate", [
        ("logits = self.model.forward(tokens[:, prev_pos:cur_pos], prev_pos)",
         "logits = self.model.forward(tokens[:, prev_pos:cur_pos], 0)")], "llamagen"),
    "torchnn_causal_off_by_one": Plant("causal_off_by_one", "causal_mask", [("diagonal=1)", "diagonal=0)")],
                                       "torchnn"),
    "torchnn_no_residual": Plant("no_residual", "encoder_layer", [
        ("x = self.norm_a(x + self.dropout(h))", "x = self.norm_a(self.dropout(h))")], "torchnn"),
    "torchnn_beam_shortest_returned": Plant("beam_shortest_returned", "beam_search", [
        ("    return max(done + live, key=lambda c: c[1])[0]", "    return (done + live)[0][0]")], "torchnn"),
    "torchnn_train_step_clip_after_step": Plant("train_step_clip_after_step", "train_step", [
        ("    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n    scaler.step(optimizer)\n",
         "    scaler.step(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n")],
        "torchnn"),
}



def edited_copy(tmp_path: Path, source: Path, edits: list[tuple[str, str]]) -> str:
    """`source` written under tmp_path with each (old, new) replaced once; each old must be in it."""
    text = source.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, f"{old!r} is not in {source.name}"
        text = text.replace(old, new, 1)
    path = tmp_path / source.name
    path.write_text(text, encoding="utf-8")
    return str(path)

def written_file(name: str) -> Path:
    return WRITTEN[WRITTEN_PLANTS[name].family] / f"{name.split('_', 1)[1]}.py"


def written_source(name: str) -> str:
    p = WRITTEN_PLANTS[name]
    source = (WRITTEN[p.family] / "correct.py").read_text()
    for old, new in p.edits:
        if old not in source:
            raise ValueError(f"plant {name}: {old!r} is not in the source")
        source = source.replace(old, new, 1)
    return source


def correct_file(family: str) -> Path:
    return FAMILIES[family] / "correct.py"


def plant(source: str, names: list[str]) -> str:
    """`source` with the edits of every plant in `names` (one family), applied in the order of PLANTS."""
    for name in sorted(names, key=list(PLANTS).index):
        for old, new in PLANTS[name].edits:
            if old not in source:
                raise ValueError(f"plant {name}: {old!r} is not in the source (another plant edited it)")
            source = source.replace(old, new, 1)
    return source


def planted_source(names: list[str]) -> str:
    (family,) = {PLANTS[n].family for n in names}
    return plant(correct_file(family).read_text(), names).replace(
        "with no mistake.", f"with {'one planted mistake' if len(names) == 1 else 'planted mistakes'}: "
        f"{', '.join(names)}.", 1)


def planted_file(name: str) -> Path:
    return FAMILIES[PLANTS[name].family] / f"{name}.py"


def write_all() -> None:
    for name in PLANTS:
        planted_file(name).write_text(planted_source([name]))
    for name in WRITTEN_PLANTS:
        written_file(name).write_text(written_source(name))


if __name__ == "__main__":
    write_all()
