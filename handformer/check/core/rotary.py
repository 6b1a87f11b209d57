"""Rotary positions as the runners meet them: the words that show a learner's source uses them, the
tables handformer compares with, Meta's interleaved pairs turned into handformer's half-split ones,
the layouts a block may use inside, and the note a report gives."""

from __future__ import annotations

import ast
import inspect
import math
import re

import torch
from torch import Tensor, nn

from handformer.check.core.context import MAX_LEN, D, H
from handformer.check.core.result import text
from handformer.check.core.source import code_text, source_text
from handformer.check.reference import variants as V
from handformer.nn.positions import RotaryEmbedding

ROPE_WORDS = re.compile("rotary|rope|freqs_cis|rotate|apply_rotary")


def cos_sin(T: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """Hugging Face's (and minimind's) position_embeddings: (cos, sin), each (T, Dh), the angles
    repeated over the two halves."""
    angles = V.rope_angles(T, head_dim)  # (T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, Dh)
    return angles.cos(), angles.sin()


@torch.no_grad()
def interleaved_to_half_(hf: nn.Module, heads: int = H, swapped: bool = False) -> None:
    """Meta's interleaved rotary pairs (2j, 2j+1) as handformer's half-split (j, j + Dh/2): each head's
    rows of W_Q and W_K permuted, evens then odds (q.k is unchanged). swapped: nanochat's rotation
    the other way, (a, b) -> (a cos + b sin, b cos - a sin), is handformer's on the halves swapped."""
    Dh = D // heads
    order = torch.cat([torch.arange(0, Dh, 2), torch.arange(1, Dh, 2)])  # (Dh,): evens, then odds
    if swapped:
        order = torch.cat([torch.arange(Dh // 2, Dh), torch.arange(0, Dh // 2)])  # (Dh,): second half first
    def rows(width: int) -> Tensor:  # (width,): each head's dims in that order
        return (torch.arange(width // Dh)[:, None] * Dh + order).reshape(-1)

    for proj in (hf.q_proj, hf.k_proj):
        proj.weight.copy_(proj.weight[rows(proj.weight.size(0))])
        if proj.bias is not None:
            proj.bias.copy_(proj.bias[rows(proj.bias.size(0))])
    for norm in (hf.q_norm, hf.k_norm):  # QK-norm: the gains of each head (or of all, OLMo 2's) in that order
        if getattr(norm, "weight", None) is not None:
            norm.weight.copy_(norm.weight[rows(norm.weight.size(0))])


def turned_width(rope: str, head_dim: int) -> int:
    """The dims of each head a rotary layout turns: "half:2" the first 2 (partial rotary), else all."""
    part = rope.partition(":")[2]
    return min(int(part), head_dim) if part else head_dim


# a config's share of each head that rotary turns (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor), with
# its default: `rotary_pct: float = 0.25` in a dataclass, `rotary_pct=0.25` in a signature
FRACTIONS = re.compile(
    r"\b(rotary_pct|partial_rotary_factor|rotary_fraction|rope_pct)\s*(?::\s*\w+\s*)?=\s*([0-9.]+)")


def fraction_unread(source: str) -> str | None:
    """The rotary share below one that a file's config declares and no line of it reads (only
    assigns), as `rotary_pct = 0.25`; None where there is none."""
    unread = [f"{name} = {value}" for name, value in FRACTIONS.findall(source) if float(value) < 1
              and not re.search(rf"\.{name}\b(?!\s*=[^=])|['\"]{name}['\"]", source)]
    return (unread + [None])[0]


def partial_layouts(head_dim: int) -> tuple[str, ...]:
    """Partial rotary (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor) at check's head width: the
    first 2, 4, ... dims of each head turned, half-split pairs within them."""
    return tuple(f"half:{w}" for w in range(2, head_dim, 2))


def rope_tables(T: int, heads: int = H, rope: str = "half") -> tuple[Tensor, Tensor]:
    rotary = RotaryEmbedding(turned_width(rope, D // heads), MAX_LEN)
    cos, sin = rotary(torch.arange(T)[None])  # (1, 1, T, Dh) each
    return cos.double(), sin.double()


SCORE_BIAS_NOTES = {
    "alibi": text("ALiBi inside: each head's slope (BLOOM's, a non-power-of-two head count included) times "
                  "the key's position is added to the scaled scores; compared with handformer's attention "
                  "with that term",
                  "内部使用 ALiBi：每个头的斜率（和 BLOOM 一样，头数不是 2 的幂也算在内）乘以键的"
                  "位置，加到缩放后的分数上；与加上这一项的 handformer 注意力比较"),
    "t5": text("T5's relative-position bias inside: its table's value for each (key - query) bucket "
               "(bidirectional) is added to the scores, which are not divided by sqrt(d_k) (T5 folds the "
               "scale into its initialization): a convention, compared so",
               "内部使用 T5 的相对位置偏置：按 (key - query) 分桶（双向）查表，加到分数上；分数不除以 "
               "sqrt(d_k)（T5 把缩放并进了初始化）：这是约定，按它比较"),
    "t5_causal": text("T5's relative-position bias inside, a decoder's (keys after the query share bucket "
                      "0): added to the scores, which are not divided by sqrt(d_k) (T5 folds the scale into "
                      "its initialization): a convention, compared so",
                      "内部使用 T5 解码器的相对位置偏置（查询之后的键都在 0 号桶）：加到分数上；分数不除以 "
                      "sqrt(d_k)（T5 把缩放并进了初始化）：这是约定，按它比较"),
    "unscaled": text("its forward takes a positional bias for the scores from its caller (T5's "
                     "position_bias) and its scores are not divided by sqrt(d_k), T5's convention (the scale "
                     "folded into the initialization): compared so, with the bias left at its default (zero "
                     "where it has none)",
                     "它的 forward 从调用者接收加到分数上的位置偏置（T5 的 position_bias），分数不除以 "
                     "sqrt(d_k)，这是 T5 的约定（缩放并进了初始化）：按它比较，"
                     "偏置取默认值（没有默认值时取 0）"),
}


# the note on a rotation's layout (the half-split pairs: any other layout of a rotation)
LAYOUT_NOTES = {
    "swapped": text("rotary positions inside, halves rotated the other way, (a, b) -> (a cos + b sin, "
                    "b cos - a sin), as nanochat: a convention, not an error (handformer's rotation on the "
                    "halves swapped); compared with W_Q and W_K permuted accordingly",
                    "内部使用旋转位置编码，两半按相反方向旋转，(a, b) -> (a cos + b sin, b cos - a sin)，"
                    "与 nanochat 相同：这是约定不同，不是错误（等于 handformer 的旋转作用在交换后的两半上）；"
                    "比较时已相应重排 W_Q 和 W_K 的行"),
    "interleaved": text("rotary positions inside, interleaved pairs (2j, 2j+1) as Meta's complex "
                        "freqs_cis: a convention, not an error; handformer pairs j with j + d/2 (as Hugging "
                        "Face), so it was compared with W_Q and W_K permuted accordingly",
                        "内部使用旋转位置编码，按 (2j, 2j+1) 交错配对（Meta 的复数 freqs_cis）："
                        "这是约定不同，不是错误；handformer 把 j 与 j + d/2 配对（与 Hugging Face 一致），"
                        "比较时已相应重排 W_Q 和 W_K 的行")}
HALF_NOTE = text("rotary positions inside, pairs (j, j + d/2) as Hugging Face and handformer",
                 "内部使用旋转位置编码，按 (j, j + d/2) 配对，与 Hugging Face 和 handformer 一致")


def rope_note(rope: str) -> dict[str, str]:
    """The report's note on the positions found inside an attention (a rotation, or a score bias)."""
    if ":" in rope:
        w = rope.partition(":")[2]
        return text(f"rotary positions inside on the first {w} dims of each head, the rest passed through "
                    "(partial rotary, as GPT-NeoX's rotary_pct and Phi's): a convention, compared so",
                    f"内部使用旋转位置编码，只转每个头的前 {w} 维，其余维不变（部分旋转，和 GPT-NeoX 的 "
                    "rotary_pct、Phi 一样）：这是约定，按它比较")
    return {**SCORE_BIAS_NOTES, **LAYOUT_NOTES}.get(rope, HALF_NOTE)


def rope_layouts(module: nn.Module, given_table: bool, given_cos_sin: bool = False,
                   ) -> tuple[str | None, ...]:
    """Positions inside the attention: interleaved when the block is handed Meta's freqs_cis,
    half-split when it is handed Hugging Face's (cos, sin) (on a whole head or its first dims; interleaved
    where the tables it takes pair 2j with 2j+1: rope_tables.paired_tables), else
    a term on the scores its classes hold or speak of (ALiBi's, T5's: in place of none), then either
    rotary layout when the source of one of its classes speaks of them."""
    if given_table:
        return ("interleaved",)
    if given_cos_sin:  # on all of each head, or its first dims (partial rotary, the tables narrowed), or
        return ("half", *partial_layouts(D // H), "interleaved")  # pairs (2j, 2j+1) (Cohere's tables)
    classes = [type(sub) for sub in module.modules() if type(sub).__module__.startswith("learner_")]
    rotary = ("half", "interleaved", *partial_layouts(D // H)) * any(
        map(ROPE_WORDS.search, map(str.lower, map(source_text, classes))))
    return (score_biases_inside(module, list(map(str.lower, map(code_text, classes)))) or (None,)) + rotary


ALIBI_WORDS = re.compile("alibi|slopes")


def score_biases_inside(module: nn.Module, sources: list[str]) -> tuple[str, ...]:
    """A term on the scores inside a block's attention, by what its classes hold and say: T5's
    relative-position table (an nn.Embedding of one value a head), ALiBi's where the code of a class
    speaks of it (`sources`: their code, comments left out)."""
    table = any(isinstance(m, nn.Embedding) and m.embedding_dim == H for m in module.modules())
    alibi = any(map(ALIBI_WORDS.search, sources))
    return ("t5", "t5_causal") * table + ("alibi",) * alibi


BASE_NAMES = ("rope_theta", "theta", "rope_base", "base", "rotary_base", "rotary_emb_base")


def field_value(obj: object, name: str) -> object:
    """A dict's value under `name`, else the object's attribute of that name (None where it has none)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def named_base(module: nn.Module) -> float | None:
    """The rotary base a field of the model, of its config, or of its dict config names (rope_theta,
    theta, base: Raschka's cfg["rope_base"])."""
    for sub in module.modules():
        for obj in [sub, *(v for v in vars(sub).values() if not isinstance(v, (Tensor, nn.Module)))]:
            for name in BASE_NAMES:
                value = field_value(obj, name)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
                    return float(value)
    return None


def table_base(tables: list[Tensor], head_dim: int) -> float | None:
    """The base of the learner's rotary tables, read back from position 1's angles (`_frequencies`)."""
    for t in tables:
        freqs = _frequencies(t, head_dim)
        if freqs is not None and abs(float(freqs[-1]) - 1) < 1e-4 and freqs[-2] > 0:
            return float(f"{float(freqs[-2]) ** -(head_dim / 2):.3g}")  # pair j turns by theta^(-2j/Dh)
    return None


def frequency_base(module: nn.Module, head_dim: int) -> float | None:
    """The base of a rotary module's inverse frequencies, a 1-D buffer of Dh/2 values theta^(-2j/Dh)
    from 1 down (Hugging Face's inv_freq, built from a config the model does not keep), read back from
    the second; None where it holds none."""
    for t in module.buffers():
        if t.dim() == 1 and t.numel() == head_dim // 2 > 1 and t.is_floating_point() and t[0] == 1 \
                and bool((t[1:] < t[:-1]).all()) and t[1] > 0:
            return float(f"{float(t[1]) ** -(head_dim / 2):.3g}")
    return None


def table_frequencies(tables: list[Tensor], head_dim: int) -> Tensor | None:
    """The Dh/2 frequencies of the first of the learner's rotary tables that shows them (`_frequencies`)."""
    found = (_frequencies(t, head_dim) for t in tables)
    return next((f for f in found if f is not None), None)


def _frequencies(table: Tensor, head_dim: int) -> Tensor | None:
    """The Dh/2 frequencies of a rotary table, ascending, read back from position 1's angles (a complex
    table, or a sine table whose row 0 is all zeros: a cosine's is too flat near 0 to say); None where
    it shows another count."""
    if table.is_complex():
        angles = table[1].angle()
    elif table[0].abs().max() == 0:
        angles = table[1].double().asin()
    else:
        return None
    distinct = torch.unique(angles.abs().double())
    return distinct if distinct.numel() == head_dim // 2 else None


def turned_base(module: nn.Module) -> float | None:
    """The rotary base of the 1-D inverse frequencies a module and its children hold as buffers
    (Hugging Face's inv_freq, theta^(-2j/d) for j < d/2, d the width it turns, a partial rotary's
    too), read back from them; None where none holds two or more that start at 1 and fall
    geometrically (Llama 3.1's scaled ones do not), or where they show two bases (Gemma 3's)."""
    bases = {geometric_base(torch.unique(t.double().abs()))
             for t in module.buffers() if t.dim() == 1} - {None}
    return bases.pop() if len(bases) == 1 else None


def geometric_base(freqs: Tensor) -> float | None:
    """The base b of n frequencies b^(-j/n), j < n (the pairs of a width 2n), in any order; None where
    they are not those of a base."""
    n, ordered = freqs.numel(), freqs.sort(descending=True).values
    ratio = float(ordered[min(1, n - 1)])  # f_1 = b^(-1/n): f_j = ratio^j
    expected = ratio ** torch.arange(n, dtype=torch.float64)
    if n < 2 or not 0 < ratio < 1 or (ordered - expected).abs().max() > 1e-4:
        return None
    return float(f"{ratio ** -n:.3g}")


def module_tables(module: nn.Module) -> list[Tensor]:
    """The 2-D tables a module and its children hold, buffers or tensor attributes (not a bool mask)."""
    return [t for sub in module.modules() for t in [*sub.buffers(recurse=False), *vars(sub).values()]
            if isinstance(t, Tensor) and t.dim() == 2 and t.size(0) > 1
            and (t.is_complex() or t.is_floating_point())]


def stated_base(module: nn.Module, head_dim: int) -> float | None:
    """The base a rotary module that is handed none uses: a field naming it, else its tables' base where
    that number, or its square (the exponent j/d where 2j/d is meant: rope_wrong_base), is written in its
    file (a hard-coded 500000.0); None where neither says."""
    base = table_base(module_tables(module), head_dim) or math.nan
    tree = ast.parse(source_text(inspect.getmodule(type(module))))
    written = {float(n.value) for n in ast.walk(tree) if type(getattr(n, "value", None)) in (int, float)}
    return named_base(module) or next((w for w in written if min(abs(w / base - 1), abs(w ** 0.5 / base - 1))
                                       < 1e-3), None)
