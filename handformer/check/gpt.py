"""Runner for the assembled decoder-only model: nanoGPT's `GPT(config)` with `forward(idx)`
returning logits, or `forward(idx, targets)` returning (logits, loss) as nanoGPT does (logits of the
last position only when there are no targets, which is compared as such).

The learner's parameters are mapped onto handformer's `CausalLM` (GPT-2 style): the token and
position embeddings by their shapes, the blocks by the ModuleList that holds them (inside each as
the block runner maps it: a fused c_attn is split in three), the norm outside the blocks as the
final norm, and the (vocab, d_model) head, tied to the token embedding or not. Choices reported:
tied or separate head, with a bias or not, the FFN's activation, pre- or post-norm. The
fingerprint search names: the causal mask missing or off by one, the position embedding never
added, the final norm missing. The loss, when forward returns one, is compared with the
cross-entropy of handformer's logits.

Shape legend: B batch, T length, D d_model, V vocabulary.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check import fingerprint as fp
from handformer.check import variants as V
from handformer.check.context import (
    SIZES,
    Context,
    D,
    H,
    check_determinism,
    error_text,
    finish,
    forward_parameters,
)
from handformer.check.discovery import Component
from handformer.check.model import _layer_modules, _map_layer, as_written_, exact_norms_
from handformer.check.pieces import FFN_ACTIVATIONS, HF_NAME
from handformer.check.result import NOT_CHECKED, Check, ComponentResult, Finding, LearnerError, Text, text
from handformer.check.source import locate, source_lines
from handformer.check.weights import (
    Leaf,
    MappingError,
    Slot,
    copy_attention,
    copy_ffn,
    copy_weights,
    is_gated,
    leaves,
)
from handformer.check.weights import norm_weights as learner_norm
from handformer.config import CausalLMConfig
from handformer.families import build_causal_lm
from handformer.models.causal_lm import CausalLM
from handformer.nn.masks import as_attention_mask

VOCAB, BLOCK = 29, 16
GPT_SIZES = {**SIZES, "src_vocab": VOCAB, "n_layers": 2, "max_len": BLOCK}
TARGET_NAMES = ("targets", "target", "labels", "y", "tgt")
FLAGS = ("causal_mask_missing", "causal_off_by_one:no_self", "causal_off_by_one:sees_next", "pe_missing",
         "final_norm_missing")


@dataclass
class GPTMap:
    wte: Leaf
    wpe: Leaf | None
    blocks: list[Any]  # model.LayerMap, one per block
    ln_f: Slot | None
    head: Leaf | None
    tied: bool
    bias: bool
    built: dict[Any, CausalLM] = field(default_factory=dict)  # handformer's, by choices

    def describe(self) -> list[str]:
        rows = [f"{self.wte.name} -> token embedding"]
        rows += [f"{self.wpe.name} -> position embedding"] if self.wpe is not None else []
        rows += [f"{b.name} -> block {i}" for i, b in enumerate(self.blocks)]
        rows += [f"{self.ln_f.leaf.name} -> final norm"] if self.ln_f is not None else []
        if self.head is not None:
            tied = " (tied to the token embedding)" if self.tied else ""
            rows.append(f"{self.head.name} -> output head{tied}")
        return rows


def map_gpt(module: nn.Module) -> GPTMap:
    layers = _layer_modules(module)
    blocks = [_map_layer(path, child, SIZES["d_ff"]) for path, child in layers]
    if not blocks or any(b.decoder for b in blocks):
        raise MappingError("expected the blocks in an nn.ModuleList (nanoGPT's transformer.h), each with one "
                           "attention and an MLP")
    inside = {id(m) for _, child in layers for m in child.modules()}
    outer = [leaf for leaf in leaves(module) if id(leaf.module) not in inside]
    embeds = [leaf for leaf in outer if leaf.kind == "embedding"]
    wte = next((e for e in embeds if e.weight.size(0) == VOCAB), None)
    if wte is None:
        raise MappingError(f"expected nn.Embedding(vocab_size={VOCAB}, n_embd); found "
                           f"{[(e.name, tuple(e.weight.shape)) for e in embeds]}")
    wpe = next((e for e in embeds if e is not wte), None)
    head = next((x for x in outer if x.kind == "linear" and tuple(x.weight.shape) == (VOCAB, D)), None)
    norms = [x for x in outer if x.kind == "norm"]
    extra = [x for x in outer if x.kind == "linear" and x is not head] + norms[1:]
    if extra:
        raise MappingError("parameters outside the blocks that a GPT does not have: "
                           + ", ".join(f"{x.name} {tuple(x.weight.shape)}" for x in extra))
    return GPTMap(wte, wpe, blocks, Slot("final norm", norms[0]) if norms else None, head,
                  head is None or head.weight is wte.weight, head is not None and head.bias is not None)


@dataclass(frozen=True)
class Choices:
    placement: str
    activation: str

    def describe(self, m: GPTMap) -> Text:
        head_en = ("tied to the token embedding" if m.tied else "separate") + (
            ", with a bias" if m.bias else "")
        head_zh = ("与词嵌入共享权重" if m.tied else "独立的权重") + ("，有偏置" if m.bias else "")
        pos_en, pos_zh = (("learned positions", "可学习的位置编码") if m.wpe is not None
                          else ("no positions", "没有位置编码"))
        return text(f"output head {head_en}; {self.placement}-norm blocks; {self.activation} FFN; {pos_en}",
                    f"输出层{head_zh}；{self.placement}-norm 块；{self.activation} 前馈网络；{pos_zh}")


def comparable(m: GPTMap, module: nn.Module) -> None:
    """MappingError when the reference, a GPT-2 style CausalLM, cannot hold the learner's model:
    rotary positions (a model without a position embedding whose classes speak of them)."""
    from handformer.check.layers import _rope_settings

    if m.wpe is None and _rope_settings(module, False) != (None,):
        raise MappingError("the whole model's reference is GPT-2 style (learned positions) and your model "
                           "applies rotary positions inside its attention; its blocks, attention, norms "
                           "and FFN are checked one by one")


def reference_model(m: GPTMap, ch: Choices) -> CausalLM:
    """handformer's CausalLM with the learner's weights and choices (a final norm of weight 1 and
    bias 0 where the learner has none); built once for each set of choices."""
    if ch not in m.built:
        m.built[ch] = _reference_model(m, ch)
    return m.built[ch]


def _reference_model(m: GPTMap, ch: Choices) -> CausalLM:
    first = learner_norm(m.blocks[0].norms[0])
    gated = is_gated(m.blocks[0].ffn)
    cfg = CausalLMConfig.gpt2_style(
        vocab_size=VOCAB, d_model=D, n_heads=H, d_ff=m.blocks[0].ffn[0].leaf.weight.size(0),
        n_layers=len(m.blocks), dropout=0.0, activation=HF_NAME[(gated, ch.activation)],
        norm_placement=ch.placement, norm=first.kind, norm_eps=first.eps,  # LayerNorm or RMSNorm, as theirs
        position="learned" if m.wpe is not None else "none",
        max_positions=m.wpe.weight.size(0) if m.wpe is not None else BLOCK, tie_embeddings=m.tied)
    hf = build_causal_lm(cfg)  # (a GPT-2 style config: the plain CausalLM)
    if m.bias:
        hf.lm_head = nn.Linear(D, VOCAB, bias=True)
        if m.tied:
            hf.lm_head.weight = hf.embed.weight
    hf = hf.double().eval()
    with torch.no_grad():
        hf.embed.weight.copy_(m.wte.weight)
        if m.wpe is not None:
            hf.positions.weight.copy_(m.wpe.weight)
        if m.head is not None:
            copy_weights(hf.lm_head, Slot("head", m.head))
    for target, block in zip(hf.layers, m.blocks):
        copy_attention(target.self_attn, block.attn[0])
        copy_ffn(target.ffn, block.ffn)
    written = []
    for target, block in zip(hf.layers, m.blocks):
        for name, slot in zip(("attn_norm", "ffn_norm"), block.norms):
            copy_weights(getattr(target, name), slot)
            written.append((target, name, slot))
    if m.ln_f is not None and hasattr(hf.norm, "weight"):
        copy_weights(hf.norm, m.ln_f)
        written.append((hf, "norm", m.ln_f))
    exact_norms_(hf)
    as_written_(written)
    return hf


def keep_of(T: int, flags: frozenset[str]) -> Tensor:
    """(T, T) the keys each query sees with these mistakes."""
    if "causal_mask_missing" in flags:
        return torch.ones(T, T, dtype=torch.bool)
    return V.causal_keep(T, flags)


def variant(hf: CausalLM, idx: Tensor, flags: frozenset[str]) -> Tensor:
    """The logits (B, T, V) with the named mistakes."""
    T = idx.size(1)
    x = hf.embed(idx)  # (B, T, D)
    if "pe_missing" not in flags:
        x = x + hf.positions(torch.arange(T)[None])
    mask = as_attention_mask(keep_of(T, flags)[None, None])
    for layer in hf.layers:
        x = layer(x, mask)[0]
    if "final_norm_missing" not in flags:
        x = hf.norm(x)
    return hf.lm_head(x)


class Caller:
    """idx (B, T) -> (logits (B, T, V) or (B, 1, V), loss or None), with targets when forward takes them."""

    def __init__(self, module: nn.Module, ctx: Context) -> None:
        self.module, self.ctx = module, ctx
        params = forward_parameters(module)
        self.target = next((p.name for p in params if p.name in TARGET_NAMES), None)
        # Meta's forward(tokens, start_pos): the whole sequence from position 0
        self.start = next((p.name for p in params if p.name == "start_pos" and p.default is p.empty), None)

    def __call__(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        kwargs: dict[str, Any] = {self.target: targets} if self.target and targets is not None else {}
        if self.start:
            kwargs[self.start] = 0
        raw = self.ctx.learner.call("forward", self.module, idx, **kwargs)
        if not isinstance(raw, (Tensor, tuple, list)) and isinstance(getattr(raw, "logits", None), Tensor):
            raw = (raw.logits, getattr(raw, "loss", None))  # Hugging Face's output object (minimind's)
        logits = fp.first_tensor(raw, 3)
        first = raw[0] if isinstance(raw, (tuple, list)) and raw else raw
        if logits is None and isinstance(first, Tensor) and first.dim() == 2 and first.size(0) == idx.numel():
            logits = first.view(*idx.shape, -1)  # Karpathy's: (B * T, V) when given targets
        pair = isinstance(raw, (tuple, list)) and len(raw) > 1
        loss = raw[1] if pair and isinstance(raw[1], Tensor) else None
        return logits, loss


def _rows(B: int, T: int, flags: frozenset[str]) -> Tensor:
    return keep_of(T, flags).any(-1)[None].expand(B, T)  # (B, T): queries that see a key


def check_gpt(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp, GPT_SIZES)
    call = Caller(module, ctx)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (2, 8), generator=g)
    targets = torch.randint(0, VOCAB, (2, 8), generator=g)
    check_determinism(res, ctx, comp, lambda: call(idx, targets)[0], "causal_attention", "block", "ffn")
    with fp.dropout_off():
        out, loss = call(idx, targets)
        last_only = out is not None and out.size(1) == 1
        want = (2, 1 if last_only else 8, VOCAB)
        ok = out is not None and tuple(out.shape) == want
        res.checks.append(Check(text(f"logits of shape (B, T, vocab_size) = {want}",
                                     f"logits 的形状为 (B, T, vocab_size) = {want}"), ok,
                                text(f"got {tuple(out.shape) if out is not None else None}",
                                     f"实际得到 {tuple(out.shape) if out is not None else None}")))
        if not ok:
            return finish(res)
        if last_only:
            res.notes.append(text("forward returns the last position's logits only: compared there",
                                  "forward 只返回最后一个位置的 logits：只比较这一个位置"))
        try:
            m = map_gpt(module)
            comparable(m, module)
        except MappingError as err:  # the checks above ran; the comparison could not: NOT CHECKED
            res.status = NOT_CHECKED
            res.error = LearnerError("mapping", f"not compared with handformer's CausalLM: {err}", "__init__",
                                     message_zh=f"没有与 handformer 的 CausalLM 比较：{err}")
            return finish(res)
        res.mapping = m.describe()
        _tied_despite_config(res, ctx, comp, m)
        _compare(res, ctx, comp, m, call, out, loss, idx, targets, last_only)
    return finish(res)


def _compare(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap, call: Caller, out: Tensor,
             loss: Tensor | None, idx: Tensor, targets: Tensor, last_only: bool) -> None:
    def view(logits: Tensor) -> Tensor:
        return logits[:, -1:] if last_only else logits

    gated = is_gated(m.blocks[0].ffn)
    settings = [Choices(p, a) for p in ("pre", "post") for a in FFN_ACTIVATIONS[gated]]
    B, T = idx.shape
    found = None
    for lo, hi in ((0, 1), (2, 2)):
        for ch in settings:
            hf = reference_model(m, ch)
            hit = fp.search(out, lambda fl, hf=hf: view(variant(hf, idx, fl)), FLAGS,
                            lambda fl: view(_rows(B, T, fl)[..., None])[..., 0], hi, lo)
            if hit is not None:
                found = (ch, hit[0], hit[1])
                break
        if found:
            break
    if found is None:
        res.notes.append(text("no known mistake (or pair of them) reproduces your logits; the blocks' own "
                              "checks show where they differ from handformer's",
                              "没有任何已知错误（或两个错误的组合）能复现你的 logits；"
                              "各块自己的检查会指出它们与 handformer 的差别"))
        ch = settings[0]
    else:
        ch, flags, matched = found
        res.convention = ch.describe(m)
        hf = reference_model(m, ch)
        rows = view(_rows(B, T, flags)[..., None])[..., 0]
        correct = fp.max_error(out, view(variant(hf, idx, frozenset())), rows)
        lines = source_lines(ctx.objects(comp, "causal_attention", "block", "causal_mask"))
        for flag in sorted(flags):
            name, _, form = flag.partition(":")
            number, code = locate(name, lines)
            res.findings.append(Finding(name, text(
                f"your logits equal the model's with this mistake (max abs difference {matched:.1e}); they "
                f"differ from the correct ones by {correct:.3g}",
                f"你的 logits 与带有这个错误的模型一致（最大绝对误差 {matched:.1e}），与正确结果相差 "
                f"{correct:.3g}"), number, code, form))
    hf = reference_model(m, ch)
    errors = []
    for i, (B2, T2) in enumerate([(3, 5), (1, 1), (2, BLOCK)]):
        x = torch.randint(0, VOCAB, (B2, T2), generator=torch.Generator().manual_seed(10 + i))
        y = torch.randint(0, VOCAB, (B2, T2), generator=torch.Generator().manual_seed(20 + i))
        mine, ref = call(x, y)[0], hf(x).logits
        if mine is not None and mine.size(1) == 1:
            ref = ref[:, -1:]
        errors.append(fp.max_error(mine, ref))
    res.max_abs_error = max(errors)
    res.checks.append(Check(text("matches handformer's CausalLM on your weights and choices on 3 shapes",
                                 "在 3 种形状上与使用你的权重和写法的 handformer CausalLM 一致"),
                            max(errors) < 1e-5, error_text(max(errors))))
    if loss is not None and not last_only:
        ref = F.cross_entropy(hf(idx).logits.reshape(-1, VOCAB), targets.reshape(-1))
        err = abs(float(loss) - float(ref))
        res.checks.append(Check(text("the loss equals the cross-entropy of handformer's logits",
                                     "损失等于 handformer 的 logits 的交叉熵"), err < 1e-6, error_text(err)))
    _causality(res, call, idx)


TIE_FIELD = re.compile(r"\b(tie_weights|tie_word_embeddings|tie_embeddings)\b")


def _tied_despite_config(res: ComponentResult, ctx: Context, comp: Component, m: GPTMap) -> None:
    """head_tied_despite_config: the file's config (or the GPT) has a tying field, the GPT was
    built with it False, and its head is the token embedding all the same."""
    try:
        source = inspect.getsource(ctx.module)
    except (OSError, TypeError):
        return
    field_name = TIE_FIELD.search(source)
    if field_name is None:
        return
    res.notes.append(text(f"built with config.{field_name.group(1)} = False",
                          f"构造时 config.{field_name.group(1)} = False"))
    if m.head is not None and m.head.weight is m.wte.weight:
        number, code = locate("head_tied_despite_config", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("head_tied_despite_config", text(
            f"config.{field_name.group(1)} is False, yet {m.head.name}.weight is {m.wte.name}.weight (one "
            f"{tuple(m.wte.weight.shape)} matrix)", f"config.{field_name.group(1)} 为 False，"
            f"{m.head.name}.weight 却就是 {m.wte.name}.weight（同一个 {tuple(m.wte.weight.shape)} 矩阵）"),
            number, code))


def _causality(res: ComponentResult, call: Caller, idx: Tensor) -> None:
    """Changing token 5 leaves the logits before it unchanged (only when all positions come back)."""
    a = call(idx, idx)[0]
    bumped = idx.clone()
    bumped[:, 5] = (bumped[:, 5] + 1) % VOCAB
    b = call(bumped, idx)[0]
    if a is None or b is None or a.size(1) != idx.size(1) or a.shape != b.shape:
        return
    moved = (a - b)[:, :5].abs().nan_to_num(float("inf")).max().item()
    res.checks.append(Check(text("causality: changing token 5 leaves logits 0..4 unchanged",
                                 "因果性：改变第 5 个 token 不影响位置 0..4 的 logits"), moved < 1e-9,
                            text(f"moved by {moved:.3g}", f"变化了 {moved:.3g}")))

