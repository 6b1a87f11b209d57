"""The planted mistakes of `handformer check`'s proof: each is a text edit of
tests/fixtures/learners/correct.py (a learner's code in the tutorials' style), and
tests/fixtures/learners/<name>.py is that edit applied (`python tests/check_plants.py` rewrites them;
a test keeps them in sync).

PLANTS[name] = (the diagnosis it must produce, [(old text, new text), ...]); each old text must occur
in the file, and only its first occurrence is replaced.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "learners"
CORRECT = FIXTURES / "correct.py"

ENC_ATTN = """        attn_output, _ = self.self_attention(x, x, x, mask)
        x = self.norm1(x + self.dropout(attn_output))
"""
ENC_FFN = """        ffn_output = self.ffn(x)
        x = self.norm2(x + self.dropout(ffn_output))
"""
SPLIT = ".view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)"

PLANTS: dict[str, tuple[str | None, list[tuple[str, str]]]] = {
    "no_scaling": ("no_scaling", [("k.transpose(-2, -1)) / math.sqrt(d_k)", "k.transpose(-2, -1))")]),
    "scale_by_dk": ("scale_by_dk", [("k.transpose(-2, -1)) / math.sqrt(d_k)", "k.transpose(-2, -1)) / d_k")]),
    "softmax_wrong_dim": ("softmax_wrong_dim", [("F.softmax(scores, dim=-1)", "F.softmax(scores, dim=-2)")]),
    "mask_after_softmax": ("mask_after_softmax", [
        ("    if mask is not None:\n        scores = scores.masked_fill(mask == 0, -1e9)\n", ""),
        ("    return torch.matmul(attn, v), attn", "    if mask is not None:\n        attn = attn.masked_fill(mask == 0, 0)\n"
                                                 "    return torch.matmul(attn, v), attn")]),
    "mask_inverted": ("mask_inverted", [("mask == 0", "mask == 1")]),
    "split_no_transpose": ("split_no_transpose", [(SPLIT, ".view(batch_size, self.n_heads, -1, self.d_k)")] * 3),
    "concat_no_transpose": ("concat_no_transpose", [("context.transpose(1, 2).contiguous()", "context.contiguous()")]),
    "no_output_projection": ("no_output_projection", [("return self.fc(context), attn", "return context, attn")]),
    "kv_swapped": ("kv_swapped", [("K = self.w_k(k)", "K = self.w_v(k)"), ("V = self.w_v(v)", "V = self.w_k(v)")]),
    "no_residual": ("no_residual", [(ENC_FFN, """        ffn_output = self.ffn(x)
        x = self.norm2(self.dropout(ffn_output))
""")]),
    "pre_norm": ("pre_norm", [(ENC_ATTN, """        h = self.norm1(x)
        attn_output, _ = self.self_attention(h, h, h, mask)
        x = x + self.dropout(attn_output)
""")]),
    "ffn_no_activation": ("ffn_no_activation", [("(F.relu(self.linear1(x))))", "(self.linear1(x)))")]),
    "dropout_in_eval": ("dropout_in_eval", [("return self.linear2(self.dropout(", "return self.linear2(F.dropout(")]),
    "pe_sin_cos_swapped": ("pe_sin_cos_swapped", [("pe[:, 0::2] = torch.sin(", "pe[:, 0::2] = torch.cos("),
                                                  ("pe[:, 1::2] = torch.cos(", "pe[:, 1::2] = torch.sin(")]),
    "pe_wrong_frequency": ("pe_wrong_frequency", [("torch.arange(0, d_model, 2).float() * (-math",
                                                   "torch.arange(0, d_model // 2).float() * (-math")]),
    "decoder_masks_swapped": ("decoder_masks_swapped", [
        ("self.self_attention(x, x, x, tgt_mask)", "self.self_attention(x, x, x, src_mask)"),
        ("enc_output, enc_output, src_mask)", "enc_output, enc_output, tgt_mask)")]),
    "causal_no_self": ("causal_off_by_one", [("diagonal=0)", "diagonal=-1)")]),
    "causal_sees_next": ("causal_off_by_one", [("diagonal=0)", "diagonal=1)")]),
    "nan_on_masked_rows": ("nan_on_masked_rows", [(", -1e9)", ", float('-inf'))")]),
    "layernorm_unbiased_std": ("layernorm_unbiased_std", [
        ("(x - mean) / torch.sqrt(var + self.eps)", "(x - mean) / (x.std(dim=-1, keepdim=True) + self.eps)")]),
    # consistently pre-norm: a difference by design, not a mistake
    "pre_norm_consistent": (None, [(ENC_ATTN, """        h = self.norm1(x)
        attn_output, _ = self.self_attention(h, h, h, mask)
        x = x + self.dropout(attn_output)
"""), (ENC_FFN, """        x = x + self.dropout(self.ffn(self.norm2(x)))
""")]),
}


def plant(source: str, names: list[str]) -> str:
    """`source` with the edits of every plant in `names`, applied in the order of PLANTS."""
    for name in sorted(names, key=list(PLANTS).index):
        for old, new in PLANTS[name][1]:
            if old not in source:
                raise ValueError(f"plant {name}: {old!r} is not in the source (another plant edited it)")
            source = source.replace(old, new, 1)
    return source


def planted_file(name: str) -> Path:
    return FIXTURES / f"{name}.py"


def write_all() -> None:
    source = CORRECT.read_text()
    for name in PLANTS:
        text = plant(source, [name]).replace(
            "with no mistake.", f"with one planted mistake: {name}.", 1)
        planted_file(name).write_text(text)


if __name__ == "__main__":
    write_all()
