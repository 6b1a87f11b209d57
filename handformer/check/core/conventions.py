"""Mask conventions: how a learner's code may expect its mask, and each as handformer hands it over.

A mask here is bool (B, 1, T|1, S), True = may attend. The learner's code gets it as
- a mask tensor: 0/1 int (0 = masked, the tutorials' `masked_fill(mask == 0, -1e9)`), bool with
  True = keep, additive float (0 or -1e9), or bool with True = masked (torch.nn's, only when asked
  for: it reads as an inverted mask otherwise); of rank 4 (B, 1, T|1, S), rank 3 (B, T|1, S), or
  rank 2 (B, S), a key padding mask;
- valid lengths (d2l's `valid_lens`): (B,) keys visible to every query of a row, or (B, T) keys
  visible to each query; only masks whose every row keeps a prefix of the keys can be written so.

Shape legend: B batch, T query length, S key length.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

from handformer.check.core.result import DEPARTS, Finding, Text, text
from handformer.check.core.sizes import H

# name -> (description, encode(keep) -> the mask the learner's code receives)
CONVENTIONS: dict[str, tuple[Text, Callable[[Tensor], Tensor]]] = {
    "int": (text("0/1 int, 0 = masked (the tutorials')", "0/1 整数，0 = 屏蔽（教程的约定）"),
            lambda keep: keep.long()),
    "bool": (text("bool, True = keep", "布尔值，True = 可以看"), lambda keep: keep),
    "additive": (text("additive float, 0 = keep, -1e9 = masked", "加性浮点掩码，0 = 保留，-1e9 = 屏蔽"),
                 lambda keep: torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -1e9)),
    "torch": (text("bool, True = masked (torch.nn's)", "布尔值，True = 屏蔽（torch.nn 的约定）"),
              lambda keep: ~keep),
    "lens": (text("valid lengths (d2l's valid_lens)", "有效长度（d2l 的 valid_lens）"),
             lambda keep: keep.sum(-1)),
}
AUTO = ("int", "bool", "additive")
# a forward that reads its stream sequence-first, (T, B, D), tries its masks as nn.MultiheadAttention's
# attn_mask (B * H, T, S) and sequence-first too, (T, S, B)
SEQUENCE_FIRST_CONVENTIONS = ("intx", "boolx", "additivex", "ints", "bools", "additives")
RANKS = {"": text("", ""), "3": text(", rank 3: (B, T, S)", "，三维：(B, T, S)"),
         "n": text(", as nn.MultiheadAttention takes it: a key padding mask (B, S) where every query sees "
                   "the same keys, else an attn_mask (B * H, T, S)",
                   "，按 nn.MultiheadAttention 的要求：所有查询看到的键相同时是键填充掩码 (B, S)，"
                   "否则是 attn_mask (B * H, T, S)"),
         "2": text(", rank 2: (B, S), keys only", "，二维：(B, S)，只屏蔽键"),
         "x": text(", as nn.MultiheadAttention's attn_mask: (B * H, T, S)",
                   "，按 nn.MultiheadAttention 的 attn_mask：(B * H, T, S)"),
         "s": text(", sequence-first as the stream: (T, S, B), labml's [seq_q, seq_k, batch]",
                   "，和输入一样序列维在前：(T, S, B)，即 labml 的 [seq_q, seq_k, batch]"),
         "lens": text(": (B,) for every query alike, (B, T) for one per query",
                      "：所有查询相同时为 (B,)，每个查询各自一个时为 (B, T)"),
         "lens_keys": text(": (B,), every query alike", "：(B,)，所有查询相同"),
         "q": text(", query-first: (B, T, 1, S), GPT-BigCode's for its multi-query scores (B, T, H, S)",
                   "，查询维在前：(B, T, 1, S)，即 GPT-BigCode 多查询注意力的分数 (B, T, H, S) 用的形状"),
         "w": text(", rank 2: (T, S), one mask for the whole batch (Mistral's mask[None, None])",
                   "，二维：(T, S)，整个 batch 共用一个掩码（Mistral 的 mask[None, None]）"),
         "f": text(", as fairseq's layers and torch.nn's take them: a key padding mask (B, S) where every "
                   "query sees the same keys, else one additive attn_mask (T, S) for the whole batch "
                   "(0 = keep, -inf = masked)",
                   "，按 fairseq 的层和 torch.nn 的要求：所有查询看到的键相同时是键填充掩码 (B, S)，"
                   "否则是整个 batch 共用的一个加性 attn_mask (T, S)（0 = 保留，-inf = 屏蔽）")}
# a decoder layer's masks as fairseq's and torch.nn's take them: the source's padding (B, S), the target's
# causal mask one (T, T) for the batch (its padding a separate argument, left out)
ONE_ATTN_MASK = ("torchf",)
# the masks of one (T, S) for the whole batch, tried where every other form mixes the batch's rows
SHARED = ("additivew", "intw", "boolw")  # Meta's and Mistral's, added to the scores, first
# the masks of a layout tried only where the code raises on every other (FALLBACK_AFTER): the
# query-first (B, T, 1, S) of GPT-BigCode, bool for its torch.where first
QUERY_FIRST = ("boolq", "intq", "additiveq")


def split(convention: str) -> tuple[str, str]:
    """("int", "3") for "int3"; ("lens", "lens") or ("lens", "lens_keys") for valid lengths."""
    if convention.startswith("lens"):
        return "lens", convention
    name = convention.rstrip("23nxswfq")
    return name, convention[len(name):]


def conventions_for(mask_name: str | None, forced: str | None = None) -> tuple[str, ...]:
    """The conventions to try for a parameter of this name: valid lengths for `valid_lens` (and
    the like), mask tensors of rank 4, 3 and 2 otherwise; `forced` (--mask-convention) alone."""
    if mask_name is not None and is_lengths_name(mask_name):
        return ("lens", "lens_keys")  # searched with a mask of its own for each query, then with (B,)
    names = (forced,) if forced else AUTO
    return tuple(n + r for r in ("", "3", "2") for n in names if not (r == "2" and n == "additive")) + (
        QUERY_FIRST * (not forced))


def is_lengths_name(name: str) -> bool:
    lowered = name.lower()
    return "valid_len" in lowered or lowered in ("lens", "lengths", "seq_lens", "src_lens", "key_lens")


def is_prefix(keep: Tensor) -> bool:
    """Every row keeps a prefix of the keys (what lengths can say)."""
    n = keep.sum(-1, keepdim=True)  # (..., 1)
    return bool((keep == (torch.arange(keep.size(-1)) < n)).all())


def encodable(keep: Tensor | None, convention: str) -> bool:
    """Whether this mask can be written in this convention: a key padding mask (rank 2) has no
    per-query rows; lengths only say prefixes."""
    if keep is None:
        return True
    return ENCODABLE.get(split(convention)[1], lambda keep: True)(keep)


def _keys_only(keep: Tensor) -> bool:
    """One row for every query (..., 1, S): what a key padding mask says."""
    return keep.size(-2) == 1


def _one_for_batch(keep: Tensor) -> bool:
    """Every row of the batch the same (B, 1, T|1, S): what one (T, S) mask says."""
    return bool((keep == keep[:1]).all())


# a convention's rank -> the masks it can say (any other rank: every mask)
ENCODABLE: dict[str, Callable[[Tensor], bool]] = {
    "2": _keys_only, "w": _one_for_batch, "f": lambda keep: _keys_only(keep) or _one_for_batch(keep),
    "lens": is_prefix,
    "lens_keys": lambda keep: _keys_only(keep) and is_prefix(keep)}


def encode_mask(keep: Tensor | None, convention: str, batch: int | None = None, heads: int = H,
                ) -> Tensor | None:
    """keep: bool (B|1, 1, T|1, S), True = may attend, written in `convention` ("int", "int3",
    "int2", "lens", ...), expanded to `batch` rows, an attn_mask of one row for each of `heads`;
    the caller checks `encodable` first."""
    if keep is None:
        return None
    if batch is not None and keep.size(0) != batch:
        keep = keep.expand(batch, *keep.shape[1:])
    name, rank = split(convention)
    return RANK_FORMS[rank](CONVENTIONS[name][1](keep), heads)


def _key_padding_or_heads(mask: Tensor, heads: int) -> Tensor:
    """nn.MultiheadAttention's: a key padding mask (B, S) where every query sees the same keys, else
    its attn_mask (B * H, T, S)."""
    return mask[:, 0, 0] if mask.size(-2) == 1 else _heads(mask, heads)


def _padding_or_attn_mask(mask: Tensor, heads: int) -> Tensor:
    """fairseq's and torch.nn's: a key padding mask (B, S) where every query sees the same keys, else
    one additive attn_mask (T, S) for the whole batch, -inf where `mask` (True = masked) hides."""
    if mask.size(-2) == 1:
        return mask[:, 0, 0]  # (B, S)
    return torch.zeros(mask.shape[-2:], dtype=torch.float64).masked_fill(mask[0, 0], float("-inf"))  # (T, S)


def _heads(mask: Tensor, heads: int) -> Tensor:
    """(B, 1, T, S) -> (B * H, T, S): nn.MultiheadAttention's attn_mask of one row a head."""
    B, _, T, S = mask.shape
    return mask.expand(B, heads, T, S).reshape(B * heads, T, S)  # (B * H, T, S)


def _lengths(counts: Tensor, heads: int = H) -> Tensor:
    """Valid lengths from the keys each query sees (B, 1, T|1): (B,) when every query sees the same
    keys, else (B, T)."""
    lengths = counts[:, 0]  # (B, T|1)
    return lengths[:, 0] if lengths.size(1) == 1 else lengths


# each rank's form of a mask (B, 1, T|1, S) in its convention (valid lengths: of their counts (B, 1, T|1))
RANK_FORMS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "": lambda mask, heads: mask,
    "3": lambda mask, heads: mask[:, 0],  # (B, T|1, S)
    "2": lambda mask, heads: mask[:, 0, 0],  # (B, S)
    "n": _key_padding_or_heads,
    "x": _heads,  # (B * H, T|1, S) whatever the mask
    "s": lambda mask, heads: mask[:, 0].permute(1, 2, 0),  # sequence-first: (T|1, S, B)
    "w": lambda mask, heads: mask[0, 0],  # (T|1, S): one for every row of the batch
    "q": lambda mask, heads: mask.transpose(1, 2),  # (B, T|1, 1, S): query-first
    "f": _padding_or_attn_mask,
    "lens": _lengths, "lens_keys": _lengths,
}


def describe_convention(convention: str) -> Text:
    name, rank = split(convention)
    words = CONVENTIONS[name][0]
    return text(words["en"] + RANKS[rank]["en"], words["zh"] + RANKS[rank]["zh"])


# what may follow a mask's name before it is used: indexing, a view of it, a cast (fairseq's
# key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool))
RESHAPED = (r"(?:\[[^\]]*\]|\.(?:bool|unsqueeze|view|reshape|expand|expand_as|to|type|transpose|permute"
            r"|contiguous|squeeze)\((?:[^()]|\([^()]*\))*\))")


def masks_where_true(source: str, name: str | None) -> bool:
    """Whether code fills where its mask is True (`scores.masked_fill(mask[:n, :n], -inf)`, Raschka's
    causal mask of ones above the diagonal): torch.nn's True = masked, read from the source, tried
    first; a mask compared with 0 or inverted (`mask == 0`, `~mask`) reads the other way, unless it is
    the mask the code builds for itself when none is given (ChatGLM's `if attention_mask is None:` a
    causal mask of ones, then `attention_mask = ~attention_mask`): that says nothing of the one handed."""
    if not name:
        return False
    m = re.escape(name)
    direct = re.search(rf"masked_fill_?\(\s*{m}({RESHAPED})*\s*,{NOT_ONE}"
                       rf"|{FUNCTIONAL_FILL}{m}({RESHAPED})*\s*,{NOT_ONE}"
                       rf"|torch\.where\(\s*{m}({RESHAPED})*\s*,\s*{LARGE_NEGATIVE}", source)
    inverted = re.search(rf"{m}\s*==\s*0|~\s*{m}|logical_not\(\s*{m}", _given_only(source, m))
    return bool(direct or scaled_by_large_negative(source, m)) and not inverted


# a fill of 1 where the mask holds marks what may be seen (GLM's build_mask_matrix fills its prefix's
# columns with 1 in a mask of ones below the diagonal): no sign of True = masked
NOT_ONE = r"(?!\s*(?:1(?:\.0*)?|True)\s*\))"
# torch.masked_fill(scores, mask, value): the mask the second argument (BLOOM's)
FUNCTIONAL_FILL = r"torch\.masked_fill\(\s*(?:[^,()]|\([^()]*\))+,\s*"


def _given_only(source: str, m: str) -> str:
    """The source without the blocks under `if <name> is None` (the mask the code builds when none is
    handed): the `if` line and the lines indented deeper or blank after it; m: the name, escaped."""
    block = rf"^([ \t]*)if\s+{m}\s+is\s+None\b[^\n]*:[ \t]*(?:#[^\n]*)?\n(?:(?:\1[ \t]+[^\n]*|[ \t]*)\n)*"
    return re.sub(block, "", source + "\n", flags=re.M)


def file_masks_where_true(source: str) -> bool:
    """Whether the file fills where a mask of its is True (see masks_where_true): the TensorFlow
    tutorial's attention, Raschka's; or hands its masks to torch's own attention layers alone
    (PyTorch's translation tutorial: `nn.Transformer(...)(src, tgt, tgt_mask=...)`, whose bool masks
    are True = masked) and never fills or reads one the other way. Its mask functions then write
    1 = masked, and are read so."""
    return (any(masks_where_true(source, n) for n in set(re.findall(r"\b\w*mask\w*\b", source)))
            or bool(TORCH_LAYERS.search(source) and not KEEP_READ.search(source)))


# torch's attention layers, whose bool masks are True = masked (F.scaled_dot_product_attention's
# are True = keep: a file that calls it reads its masks that way)
TORCH_LAYERS = re.compile(r"\bnn\.(Transformer(Encoder|Decoder)?(Layer)?|MultiheadAttention)\s*\(")
KEEP_READ = re.compile(r"\w*mask\w*\s*==\s*0|~\s*\w*mask|logical_not\(\s*\w*mask|masked_fill_?\(|"
                       r"scaled_dot_product_attention")


# a large negative: -1e9, -10000.0, torch.finfo(dtype).min
LARGE_NEGATIVE = r"\(?\s*(?:-\s*(?:1e\d+|\d{4,}\.?\d*)|torch\.finfo)"


def scaled_by_large_negative(source: str, m: str) -> bool:
    """The TensorFlow tutorial's `logits += (mask * -1e9)` (1 = masked, added): the mask itself
    times a large negative, either way round; `(1.0 - mask) * -10000.0` (BERT's, 1 = keep) is not."""
    times = rf"\b{m}\b(\[[^\]]*\])?\s*\*\s*{LARGE_NEGATIVE}"
    before = rf"-\s*(?:1e\d+|\d{{4,}}\.?\d*)\s*\*\s*\(?\s*{m}\b"
    return bool(re.search(f"{times}|{before}", source))


# the words of a file that handles padding: a query whose keys are all masked comes only with it
PADDING_WORDS = re.compile(r"pad|src_mask|tgt_mask|trg_mask|attention_mask|valid_len|key_padding|lengths")
UNPADDED_NAN = text("a query whose keys are all masked gives NaN here; such a row comes only with padding, "
                    "which nothing in your file builds or mentions, so it is not charged (handformer gives "
                    "zeros there; fill with -1e9 if you add padding)",
                    "所有键都被屏蔽的查询在这里得到 NaN；只有填充（padding）才会产生这样的行，"
                    "而你的文件没有构造也没有提到填充，所以不算错误（handformer 在那里给出 0；"
                    "加上填充时请用 -1e9 填充）")
PADDED_NAN = ("nan_on_masked_rows{}: a query whose keys are all masked (a sentence that is all padding) "
              "gives NaN here, as torch.nn.MultiheadAttention and F.scaled_dot_product_attention give "
              "with -inf; allowed, not a mistake. It spreads: the NaN row becomes a key and value of the "
              "next layer. handformer gives zeros there; -1e9 instead of -inf keeps the row finite",
              "nan_on_masked_rows{}：所有键都被屏蔽的查询（整句都是填充）在这里得到 NaN，"
              "和 torch.nn.MultiheadAttention、F.scaled_dot_product_attention 用 -inf 时一样；"
              "允许，不算错误。它会扩散：这一行在下一层成为键和值。handformer 在那里给出 0；"
              "用 -1e9 代替 -inf 可以让这一行保持有限")


def nan_only_on_masked_rows(source: str, findings: list[Finding], notes: list[Text]) -> str | None:
    """The status of a component whose only finding is nan_on_masked_rows, dropped and noted instead
    (with its line): what torch.nn's attention computes is never a failure. "pass" in a file that never
    speaks of padding (such a row never comes), "differs" in one that does; None, and nothing dropped,
    beside another finding (a causal mask off by one hides row 0: the NaN is that mistake's). The line
    where the output departs on rows that see a key stays (then the component still fails)."""
    names = [f.name for f in findings]
    if set(names) - {DEPARTS} != {"nan_on_masked_rows"}:
        return None
    nan = findings[names.index("nan_on_masked_rows")]
    line, code = nan.line, nan.code
    findings[:] = [f for f, name in zip(findings, names) if name != "nan_on_masked_rows"]
    if not PADDING_WORDS.search(source):
        notes.append(UNPADDED_NAN)
        return "pass"
    en, zh = PADDED_NAN
    where = (f" (line {line}: {code.strip()})", f"（第 {line} 行：{code.strip()}）") if line else ("", "")
    notes.append(text(en.format(where[0]), zh.format(where[1])))
    return "differs"
