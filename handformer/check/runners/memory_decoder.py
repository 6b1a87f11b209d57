"""The runners of an encoder-decoder's decoder that reads the encoder's output and has no KV cache
(Whisper's `TextDecoder.forward(x, xa)`: found by what it builds, token embeddings then a list of
blocks, and what its forward takes, the target ids then encoder outputs, whatever its name), and of a
greedy loop driven through it (`greedy_decode(decoder, audio_features, sot_sequence, eot, max_len)`).

No reference holds its layers (learned positions, its own blocks): the decoder is checked on what
needs none. Its logits are (B, T, vocabulary); eval mode is deterministic; changing target token 3
leaves logits 0..2 unchanged (causality); changing the encoder's output moves them (the cross-attention
reads it); a sequence alone gives its logits in a batch. The loop is driven through that decoder,
given encoder outputs of check's, and its tokens must be the greedy choice of the decoder's own logits
from the start tokens, stopping at the end token.

Shape legend: B batch, T target tokens, S encoder positions, D d_model, V vocabulary.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, check_determinism, error_text, finish, moved_by
from handformer.check.core.discovery import Component, cannot_fill, memory_decoder_parts, own_objects
from handformer.check.core.result import NOT_CHECKED, Check, ComponentResult, LearnerError, text
from handformer.check.runners.cached_decoder import SIZES

B, T, S = 2, 6, 5
START, END, STEPS = (1, 2), 3, 6  # the start tokens handed to a loop, its end token, its new tokens


class Decoder:
    """The learner's decoder built with check's sizes, called with its encoder outputs."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.ctx, self.module = ctx, ctx.build(comp, SIZES)
        self.memory_args = memory_decoder_parts(comp.obj) or []
        embedding = next(m for m in self.module.modules() if isinstance(m, nn.Embedding))
        self.vocab, self.width = embedding.num_embeddings, embedding.embedding_dim
        self.dtype = embedding.weight.dtype

    def memory(self, seed: int, batch: int = B) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {n: torch.randn(batch, S, self.width, generator=g, dtype=self.dtype) for n in self.memory_args}

    def __call__(self, ids: Tensor, memory: dict[str, Tensor]) -> Tensor | None:
        with torch.no_grad(), fp.dropout_off():
            return fp.first_tensor(self.ctx.learner.call("forward", self.module, ids, **memory), 3)


def check_memory_decoder(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    dec = Decoder(comp, ctx)
    ids = torch.randint(0, dec.vocab, (B, T), generator=torch.Generator().manual_seed(0))
    memory = dec.memory(1)
    out = dec(ids, memory)
    check_determinism(res, ctx, comp, lambda: dec(ids, memory), "decoder_layer", "mha")
    shaped = out is not None and tuple(out.shape) == (B, T, dec.vocab)
    res.checks.append(Check(text(f"logits of shape (B, T, vocabulary) = {(B, T, dec.vocab)}",
                                 f"logits 的形状为 (B, T, 词表) = {(B, T, dec.vocab)}"), shaped))
    if not shaped:
        return finish(res)
    changed = ids.clone()
    changed[:, 3] = (changed[:, 3] + 1) % dec.vocab
    moved = moved_by(dec(changed, memory), out, (slice(None), slice(0, 3)))
    res.checks.append(Check(text("causality: changing target token 3 leaves logits 0..2 unchanged",
                                 "因果性：改变目标端位置 3 的 token，不影响位置 0..2 的 logits"),
                            moved < 1e-9, text(f"moved by {moved:.2g}", f"变化了 {moved:.2g}")))
    reads = moved_by(dec(ids, dec.memory(2)), out, slice(None))
    res.checks.append(Check(text("the encoder's output reaches the logits (cross-attention reads it)",
                                 "编码器的输出会影响 logits（交叉注意力读到了它）"), reads > 1e-6))
    alone = dec(ids[1:], {n: m[1:] for n, m in memory.items()})
    apart = moved_by(alone, out[1:], slice(None))
    res.checks.append(Check(text("batch invariance: a sequence alone gives its logits in a batch",
                                 "batch 不变性：一个序列单独输入和放进 batch 里，得到的 logits 相同"),
                            apart < 1e-9, error_text(apart)))
    return finish(res)


# a greedy loop's arguments after the decoder and the encoder's output, by the words of their names
LOOP_ROLES = {"start": r"(?i)sot|start|bos|prompt|prefix|initial|begin",
              "end": r"(?i)eot|eos|end|stop", "max": r"(?i)max|len|steps|limit|^n_|num"}
MANY = r"(?i)seq|tokens|prompt|prefix|ids|list"  # a start argument that is a list of tokens
BOOST_AT = len(START) + 3  # from this many tokens on, the end token is made the most likely


def _loop_arguments(comp: Component) -> dict[str, Any]:
    """The loop's arguments after the first two, by role (the start tokens a list or one id, as its name
    says); DiscoveryError where one it requires plays no role."""
    params = list(inspect.signature(comp.obj).parameters.values())[2:]
    given: dict[str, Any] = {}
    for p in params:
        role = next((r for r, words in LOOP_ROLES.items() if re.search(words, p.name)), None)
        if role is not None and role not in given.values():
            many = role == "start" and re.search(MANY, p.name)
            given[p.name] = {"start": list(START) if many else START[0], "end": END, "max": STEPS}[role]
    required = [p.name for p in params if p.default is p.empty]
    cannot_fill(comp.name, required, set(given), True, "", LOOP_TAKES)
    return given


LOOP_TAKES = ("a greedy loop over a decoder takes (decoder, encoder output, start tokens, end token, "
              "max length)", "解码器上的贪心循环接受（解码器、编码器输出、起始 token、结束 token、最大长度）")


def _steer(module: nn.Module, out: Any) -> Any:
    """A hook that makes the end token the most likely at each position from BOOST_AT on."""
    if isinstance(out, Tensor) and out.dim() == 3 and out.size(1) >= BOOST_AT:
        out = out.clone()
        out[:, BOOST_AT - 1:, END] += 1e4
    return out


def greedy_reference(dec: Decoder, start: list[int], memory: dict[str, Tensor]) -> list[int]:
    """The decoder's own greedy choice from `start`, STEPS new tokens at most, stopping at END."""
    tokens = list(start)
    for _ in range(STEPS):
        logits = dec(torch.tensor([tokens]), memory)
        tokens.append(int(logits[0, -1].argmax()))
        if tokens[-1] == END:
            break
    return tokens


def check_memory_greedy(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    given = _loop_arguments(comp)
    decoders = [(name, obj) for name, obj in own_objects(inspect.getmodule(comp.obj)).items()
                if memory_decoder_parts(obj)]
    if not decoders:
        return _no_decoder(res)
    dec = Decoder(Component("memory_decoder", *decoders[0]), ctx)
    dec.module.register_forward_hook(lambda m, args, out: _steer(m, out))
    memory = dec.memory(3, batch=1)
    start = next((v for v in given.values() if isinstance(v, list)), [START[0]])
    want = greedy_reference(dec, start, memory)
    with torch.no_grad(), fp.dropout_off():
        out = ctx.learner.call("forward", comp.obj, dec.module, *memory.values(), **given)
    got = torch.as_tensor(fp.first_tensor(out) if not isinstance(out, list) else out).reshape(-1).tolist()
    ok = got in (want, want[len(start):])
    name = decoders[0][0]
    res.notes.append(text(f"driven through your own {name}, given an encoder output of check's (1, {S}, "
                          f"{dec.width}); the end token {END} made the most likely from {BOOST_AT} tokens on",
                          f"用你自己的 {name} 驱动，编码器输出由 check 给出（1, {S}, {dec.width}）；"
                          f"序列长度达到 {BOOST_AT} 起，结束 token {END} 最可能"))
    res.checks.append(Check(text(f"the tokens equal the greedy choice of your decoder's logits, stopping "
                                 f"at the end token ({' '.join(map(str, want))})",
                                 f"生成的 token 与你的解码器 logits 的贪心选择一致，在结束 token 处停下"
                                 f"（{' '.join(map(str, want))}）"), ok,
                            text(f"yours: {' '.join(map(str, got))}", f"你的：{' '.join(map(str, got))}")))
    return finish(res)


def _no_decoder(res: ComponentResult) -> ComponentResult:
    res.status = NOT_CHECKED
    res.error = LearnerError(
        "mapping", "its file has no decoder to drive it with (a class that builds token embeddings and a "
        "list of blocks, whose forward takes the ids and the encoder's output)", "forward",
        message_zh="它的文件里没有可以驱动它的解码器（构造词嵌入和一列块、forward 接受 id 和编码器输出的类）")
    return finish(res)
