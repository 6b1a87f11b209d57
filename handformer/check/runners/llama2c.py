"""Runner of a llama2.c checkpoint read into the learner's own model: `load_llama2c(path)` returns
their model (their RMSNorm, RoPE, SwiGLU, grouped-query attention) with the file's weights.

The probe is data: CONFIG, a tiny llama2.c model (legacy format, fewer key/value heads than query
heads, the classifier shared with the embedding) whose random weights the runner writes to a file
in llama2.c's order (`Llama2cHeader.tensor_shapes`); the learner's loader reads it, and the logits
of their model on ids() must equal those of handformer's import of the same file
(`convert.llama2c_weights.read_llama2c`). Where they do not, handformer's first-divergence helper
(`convert.compare.first_divergence`) runs both stage by stage and names the first that departs
(the embeddings, a layer's attention, FFN or output, the final norm, the logits), and HINTS says
which of llama2.c's arrays feed that stage.

Shape legend: B batch, T length, V vocabulary, D dim.
"""

from __future__ import annotations

import functools
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, text
from handformer.convert.compare import first_divergence
from handformer.convert.llama2c_weights import Llama2cHeader, read_llama2c
from handformer.families import build_causal_lm
from handformer.models.causal_lm import CausalLM

CONFIG = Llama2cHeader(version=0, dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=29,
                       seq_len=16, shared_classifier=True)


@functools.cache
def ids() -> Tensor:
    """(B, T): made when first asked, not at import (the fork server computes nothing: zygote.py)."""
    return torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))


ATOL = 1e-4  # float32 through two layers
SCALES = {"token_embedding": 0.02, "rms_att": 0.1, "rms_ffn": 0.1, "rms_final": 0.1}  # norms: 1 + 0.1 * noise
HEAD_NAMES = ("output", "lm_head", "head", "classifier", "wcls")
HINTS = {  # stage -> (en, zh): the arrays of llama2.c's file that feed it
    "embeddings": ("token_embedding, the first array of the file (vocab_size x dim)",
                   "token_embedding，文件里的第一个数组（vocab_size x dim）"),
    "attention": ("rms_att (the attention norm, eps 1e-5), wq, wk, wv, wo of this layer, and RoPE's pairs "
                  "(llama2.c's are interleaved: no permutation of wq and wk for an interleaved RoPE)",
                  "这一层的 rms_att（注意力前的归一化，eps 1e-5）、wq、wk、wv、wo，以及 RoPE 的配对"
                  "（llama2.c 是交错配对：用交错配对的 RoPE 时 wq、wk 不用重排）"),
    "ffn": ("rms_ffn (the FFN norm) and w1 (the gate), w3 (up), w2 (down): down(silu(w1 x) * w3 x)",
            "rms_ffn（前馈网络前的归一化）和 w1（门控）、w3（up）、w2（down）：down(silu(w1 x) * w3 x)"),
    "output": ("the layer's two residual sums", "这一层的两个残差相加"),
    "final norm": ("rms_final (after the last layer; the RoPE tables freq_cis_real and freq_cis_imag come "
                   "after it and are skipped)",
                   "rms_final（最后一层之后；它后面的 RoPE 表 freq_cis_real、freq_cis_imag 跳过不用）"),
    "logits": ("the classifier: the token embedding again when the header's vocab_size is positive "
               "(shared), else the last array",
               "分类头：表头的 vocab_size 为正时就是词嵌入（共用），否则是文件最后一个数组"),
}


def write_checkpoint(path: Path, h: Llama2cHeader = CONFIG, seed: int = 0) -> None:
    """A llama2.c legacy checkpoint of random weights: 7 int32 (vocab_size positive: the classifier
    shared), then each array in the file's order, float32."""
    g = torch.Generator().manual_seed(seed)
    parts = [struct.pack("<7i", h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads,
                         h.vocab_size if h.shared_classifier else -h.vocab_size, h.seq_len)]
    for name, shape in h.tensor_shapes():
        kind = name.split(".")[0]
        w = torch.randn(shape, generator=g) * SCALES.get(kind, 0.3)
        if kind.startswith("rms"):
            w = w + 1.0
        parts.append(w.float().numpy().astype("<f4").tobytes())
    path.write_bytes(b"".join(parts))


def handformer_import(path: Path) -> CausalLM:
    """handformer's import of the file (`handformer import-llama2c` reads it so), built on the CPU."""
    header, state = read_llama2c(path)
    model = build_causal_lm(header.config())
    model.load_state_dict(state, strict=not header.shared_classifier)  # a shared head is the embedding
    return model.eval()


def _head(model: nn.Module) -> nn.Module:
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    shaped = [m for m in model.modules() if isinstance(m, nn.Linear)
              and tuple(m.weight.shape) == (CONFIG.vocab_size, CONFIG.dim)]
    if not shaped:
        raise ValueError(f"no output head: expected one of {', '.join(HEAD_NAMES)}, or an "
                         f"nn.Linear({CONFIG.dim}, {CONFIG.vocab_size})")
    return shaped[-1]


def _plain_forward(model: nn.Module) -> Any:
    """The forward that runs the blocks themselves: the first of the learner's classes (from the
    base up) that defines one (a CachedLlama's forward calls its attention by hand; its base
    Llama's calls each block, so the stages can be caught)."""
    for cls in reversed(type(model).__mro__):
        if "forward" in vars(cls) and not cls.__module__.startswith("torch"):
            return vars(cls)["forward"]
    return type(model).forward


class Stages(nn.Module):
    """The learner's model as `first_divergence` reads one: `model.layers`, the output head, and a
    forward that runs each block."""

    def __init__(self, learner: nn.Module) -> None:
        super().__init__()
        self.model = learner
        self.forward_of = _plain_forward(learner)

    def get_output_embeddings(self) -> nn.Module:
        return _head(self.model)

    def forward(self, ids: Tensor) -> Any:
        return self.forward_of(self.model, ids)


def check_llama2c(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny_llama2c.bin"
        write_checkpoint(path)
        model = ctx.learner.call("forward", comp.obj, str(path))
        if not isinstance(model, nn.Module):
            raise ctx.learner.fail("forward", f"{comp.name}(path) returned {type(model).__name__}, not the "
                                   "model (an nn.Module) with the file's weights",
                                   f"{comp.name}(path) 返回了 {type(model).__name__}，"
                                   "不是装好文件权重的模型（nn.Module）")
        ours = handformer_import(path)
    model.eval()
    with torch.no_grad():
        logits = fp.first_tensor(ctx.learner.call("forward", model, ids()), 3)
        right = ours(ids()).logits  # (B, T, V)
    if logits is None or logits.shape != right.shape:
        raise ctx.learner.fail("forward", f"the loaded model returned no logits of shape (B, T, vocab_size) "
                               f"= {tuple(right.shape)} for ids of shape {tuple(ids().shape)}",
                               f"对形状为 {tuple(ids().shape)} 的 id，装好的模型没有返回形状为 (B, T, "
                               f"vocab_size) = {tuple(right.shape)} 的 logits")
    err = fp.max_error(logits.double(), right.double())
    res.max_abs_error = err
    c = CONFIG
    res.checks.append(Check(text(
        f"a {c.n_layers}-layer llama2.c file ({c.n_heads} heads, {c.n_kv_heads} key/value heads, the "
        "classifier shared): your model's logits equal handformer's import of the same file",
        f"一个 {c.n_layers} 层的 llama2.c 文件（{c.n_heads} 个头，{c.n_kv_heads} 个键/值头，"
        "分类头与嵌入共用）："
        "你的模型的 logits 与 handformer 导入同一文件的结果一致"), err < ATOL, error_text(err)))
    if err >= ATOL:
        _divergence(res, model, ours)
    return finish(res)


def _divergence(res: ComponentResult, model: nn.Module, ours: nn.Module) -> None:
    """The first stage where the learner's model departs from handformer's, as a failed check."""
    try:
        found = first_divergence(ours, Stages(model), ids(), atol=ATOL)
    except (ValueError, AttributeError, KeyError, StopIteration) as err:
        res.notes.append(text(f"the stages could not be compared ({err}); compare the logits only",
                              f"没法逐段比较（{err}）；只比较了 logits"))
        return
    if found.first is None:
        return
    part = found.first.split(".")[-1] if found.first.startswith("layers.") else found.first
    en, zh = HINTS[part]
    diff = dict(found.stages)[found.first]
    res.checks.append(Check(text(f"the first stage that departs from handformer's: {found.first} (max abs "
                                 f"difference {diff:.3g}); it reads {en}",
                                 f"第一个与 handformer 不一致的环节：{found.first}"
                                 f"（最大绝对误差 {diff:.3g}）；它用到的是 {zh}"), False, error_text(diff)))
