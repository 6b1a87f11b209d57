"""The runner of greedy decoding for the encoder-decoder: `greedy_decode(model, src, src_mask,
max_len, start_symbol)` (the Annotated Transformer's signature) and variants that take an end
symbol.

The learner's decoder is handed a tiny handformer `Seq2SeqTransformer`, wrapped as the Annotated
Transformer's model: `encode(src, src_mask)`, `decode(memory, src_mask, ys, tgt_mask)`,
`generator(x)` (log-probabilities), and `model(src, tgt)` (logits); the masks it is given are
ignored (the model builds its own). The wrapper makes the end symbol the most likely next token once
the target holds EOS_AT tokens, so the right output is known: the start symbol, EOS_AT - 1 greedy
tokens of the model, then EOS. Compared with handformer's greedy choice on the same model, run to
max_len without an end symbol (a decoder that takes none cannot stop), or stopping at EOS. Named:
the loop does not stop at EOS, or stops without emitting it. The file's own encoder-decoder drives
it instead when it passed its check (EOS steered by a hook), or when it failed its check but runs
(its logits replaced by hooks along a fixed path of tokens: the loop judged alone).

Shape legend: B batch (1), S source length, T target length, D d_model, V vocabulary.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import DECODING_NAMES as NAMES  # noqa: F401
from handformer.check.core.argument_names import by_name, named_each
from handformer.check.core.context import Context, finish, forward_parameters, names_of
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import DIFFERS, FAIL, PASS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import locate, source_lines
from handformer.check.core.special_ids import SpecialIds, loop_extras, reads_end
from handformer.check.runners.beam_own import OwnSteered, first_decoder_layer, own_name, own_seq2seq
from handformer.check.runners.localize_generate import position_departure
from handformer.check.runners.model import source_ids, source_mask
from handformer.config import Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer

V, PAD, BOS, EOS, UNK = 13, 0, 1, 2, 3
EOS_AT, MAX_LEN = 4, 8


class AnnotatedModel(nn.Module):
    """A tiny Seq2SeqTransformer as the Annotated Transformer's EncoderDecoder exposes it, whose
    next-token choice is EOS once the target holds EOS_AT tokens."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        cfg = Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_positions=32, pad_id=PAD)
        self.inner = Seq2SeqTransformer(cfg).double().eval()
        self.src_ids: Tensor | None = None
        self.length = 0  # the target length of the last decode

    def encode(self, src: Tensor, src_mask: Any = None) -> Tensor:
        self.src_ids = src
        return self.inner.encode(src)[0]

    def decode(self, memory: Tensor, src_mask: Any, ys: Tensor, tgt_mask: Any = None) -> Tensor:
        assert self.src_ids is not None, "encode first"
        self.length = ys.size(1)
        mask = (self.src_ids != PAD)[:, None, None, :]
        return self.inner.decode(ys.long(), memory, mask)[0]

    def generator(self, x: Tensor) -> Tensor:
        logits = self.inner.generator(x)
        return F.log_softmax(self._steer(logits), dim=-1)

    def _steer(self, logits: Tensor) -> Tensor:
        """+50 on EOS for the position that predicts token EOS_AT (0-based, after the start), and
        -50 on EOS, BOS and PAD everywhere else, so greedy choices elsewhere are ordinary tokens."""
        logits = logits.clone()
        bias = torch.zeros(V, dtype=logits.dtype)
        bias[[PAD, BOS, EOS]] = -50.0
        if logits.dim() == 3:  # (B, T, V): every position; position t predicts token t + 1
            logits += bias
            if logits.size(1) >= EOS_AT:
                logits[:, EOS_AT - 1, EOS] += 100.0
            return logits
        logits += bias  # (B, V): the last position of the last decode
        if self.length == EOS_AT:
            logits[:, EOS] += 100.0
        return logits

    def forward(self, src: Tensor, tgt: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        memory = self.encode(src)
        self.length = tgt.size(1)
        return self._steer(self.inner.generator(self.decode(memory, None, tgt)))


def source() -> Tensor:
    return torch.tensor([[5, 7, 9, 11, 3, 6]])  # (1, S)


def greedy_tokens(next_token: Callable[[Tensor], int], stop: bool) -> list[int]:
    """Greedy decoding by `next_token(ys)` (the most likely token after ys (1, L)): from BOS, max_len
    tokens in all (the start symbol included), or up to and including EOS when it `stop`s there."""
    ys = torch.tensor([[BOS]])
    while ys.size(1) < MAX_LEN:
        nxt = next_token(ys)
        ys = torch.cat([ys, torch.tensor([[nxt]])], dim=1)
        if stop and nxt == EOS:
            break
    return ys[0].tolist()


def reference(stop: bool) -> list[int]:
    """handformer's greedy choice on the wrapped model (see `greedy_tokens`)."""
    model = AnnotatedModel()
    memory = model.encode(source())
    return greedy_tokens(lambda ys: int(model.generator(model.decode(memory, None, ys)[:, -1]).argmax(-1)),
                         stop)


def _finding(ctx: Context, comp: Component, name: str, observed: Text) -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "greedy_decode")))
    return Finding(name, observed, number, code)


def _tokens(ctx: Context, comp: Component, out: Any) -> list[int]:
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], (Tensor, list)):
        out = out[0]  # the first of a batch: [tensor], [[ids]]
    tokens = fp.one_sequence(out)
    if tokens is not None:
        return tokens
    raise ctx.learner.fail("forward", f"{comp.name} returned {type(out).__name__}; expected the token ids, "
                           "a (1, T) tensor (or a list of ints)",
                           f"{comp.name} 返回了 {type(out).__name__}；应当返回 token id：(1, T) 张量（或 "
                           "int 列表）")


def steer(module: nn.Module, column: int, first: float, later: float) -> Any:
    """Add `first` to one column of the learner's output layer (every nn.Linear to TGT_V) at its
    first call, `later` at every other: EOS impossible throughout, or certain at the first step and
    impossible after it (a loop that runs on past EOS then emits other tokens, which no padding
    explains). Returns the hooks' handles."""
    from handformer.check.runners.model import TGT_V

    calls = [0]

    def hook(_mod: nn.Module, _inp: Any, out: Tensor) -> Tensor:
        out = out.clone()
        out[..., column] += first if calls[0] == 0 else later
        calls[0] += 1
        return out

    return [m.register_forward_hook(hook) for m in module.modules()
            if isinstance(m, nn.Linear) and m.out_features == TGT_V]


def own_reference(call: Any, src: Tensor, stop: bool) -> list[int]:
    """Greedy tokens of the learner's own model through its forward (which passed its check)."""
    return greedy_tokens(lambda ys: int(call(src, ys)[:, -1].argmax(-1)), stop)


def check_greedy_decode(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    params = forward_parameters(comp.obj)
    names, required = names_of(params)
    arg = named_each(names, NAMES)
    extras = loop_extras(params, SpecialIds(BOS, EOS, PAD, UNK))
    cannot_fill(comp.name, required, {*arg.values(), *extras}, arg["model"] and arg["src"], "model / src", (
        "greedy decoding takes (model, src, src_mask, max_len, start_symbol), and optionally an end symbol "
        "(end_symbol, eos_idx, ...)",
        "贪心解码接受 (model, src, src_mask, max_len, start_symbol)，"
        "还可以有结束符（end_symbol、eos_idx 等）"))
    eos_name = None if arg["end"] else global_eos(comp.obj)
    stop = arg["end"] is not None or eos_name is not None or reads_end(comp.obj, extras)
    values = getattr(inspect.unwrap(comp.obj), "__globals__", {})  # its module's, under @torch.no_grad() too
    patched: AbstractContextManager[Any] = contextlib.nullcontext()
    if eos_name:
        patched = mock.patch.dict(values, {eos_name: EOS})
        res.notes.append(text(f"{comp.name} takes no end symbol; your module's {eos_name} is the one it must "
                              f"stop at, set to check's EOS ({EOS}) for the check",
                              f"{comp.name} 没有结束符参数；你的模块级 {eos_name} 就是它该停下的符号，"
                              f"检查时把它设成检查程序的 EOS（{EOS}）"))
    with patched:
        for model, steering, right in _scenarios(res, ctx, stop):
            with steering():
                _compare_tokens(res, ctx, comp, (arg, extras), model, right, stop)
    return finish(res)


def global_eos(fn: Any) -> str | None:
    """The module-level end symbol of a loop without an end argument (PyTorch's translation
    tutorial's EOS_IDX = 3): one it reads, else one its module defines; None when there is none."""
    fn = inspect.unwrap(fn)  # under @torch.no_grad()
    values = getattr(fn, "__globals__", {})
    read = getattr(getattr(fn, "__code__", None), "co_names", ())
    names = [*read, *values]
    return next((n for n in names if n.lower() in NAMES["end"] and type(values.get(n)) is int), None)


Scenario = tuple[Any, Callable[[], AbstractContextManager[Any]], list[int]]  # model, its steering, tokens


def _eos_steered(model: nn.Module, bias: tuple[float, float]) -> AbstractContextManager[None]:
    return fp.hooked(steer(model, EOS, *bias))


def _scenarios(res: ComponentResult, ctx: Context, stop: bool) -> list[Scenario]:
    """(model, its steering, the right tokens) for each run: the learner's own model when it passed,
    steered never to end and to end at once; when it failed its check but runs, steered along fixed
    token paths (the loop judged alone); else a stand-in."""
    own = own_seq2seq(ctx)
    if own is None:
        return _failed_own(res, ctx, stop) or _stand_in(res, stop)
    model, call = own
    name = ctx.components["transformer"].name
    res.driven = text(f"your own {name} (it passed its check), its output layer steered: EOS ({EOS}) "
                      "never, then at the first step only, then along a fixed path of tokens",
                      f"你自己的 {name}（它通过了检查），输出层被调整：先让 EOS（{EOS}）从不出现，"
                      "再让它只在第一步出现，再沿一条固定的 token 路径")
    scenarios = []
    for bias in ((-1e4, -1e4), (1e4, -1e4)):
        with _eos_steered(model, bias), fp.dropout_off():
            scenarios.append((model, lambda bias=bias: _eos_steered(model, bias),
                              own_reference(call, source(), stop)))
    return scenarios + _path(ctx, stop, (PASS, DIFFERS))


def _stand_in(res: ComponentResult, stop: bool) -> list[Scenario]:
    res.driven = text("a stand-in: handformer's tiny Seq2SeqTransformer wrapped as the Annotated "
                      "Transformer's model (encode, decode, generator); your own model has no passing "
                      "check (nor one that runs with an output layer to steer)",
                      "替身：handformer 的小 Seq2SeqTransformer，包装成 Annotated Transformer 的模型接口"
                      "（encode、decode、generator）；你自己的模型没有通过检查（也没有能运行、"
                      "能引导输出层的模型）")
    return [(AnnotatedModel(), contextlib.nullcontext, reference(stop))]


# The token paths a failed model is steered along (each token nearly certain after the one before):
# with an end symbol, EOS at position 3 and other tokens after it (a loop that runs on shows them);
# without, MAX_LEN - 1 tokens and no EOS.
PATHS = {True: [5, 7, EOS, 9, 4, 6, 8], False: [5, 7, 9, 4, 6, 8, 3]}


WHY_PATH = {True: ("it failed its own check", "它没有通过自己的检查"),
            False: ("it is no transformer, with no check of its own",
                    "它不是 Transformer，没有自己的检查")}


def _failed_own(res: ComponentResult, ctx: Context, stop: bool) -> list[Scenario]:
    """The learner's own model that failed its check but runs, steered along a fixed path (_path):
    their model's mistakes do not reach the loop; no scenario when there is none, or it cannot be
    hooked."""
    scenarios = _path(ctx, stop, (FAIL,))
    if scenarios:
        name = own_name(ctx, scenarios[0][0])
        en, zh = WHY_PATH["transformer" in ctx.components]
        res.driven = text(f"your own {name}: {en}, so its output layer was steered by hooks along a fixed "
                          "path of tokens and greedy decoding is judged as a loop only (where it stops, what "
                          "it returns)",
                          f"你自己的 {name}：{zh}，所以用钩子把输出层引导到一条固定的 token "
                          "路径上，贪心解码只按循环本身检查（在哪里停、返回什么）")
    return scenarios


def _path(ctx: Context, stop: bool, accepted: tuple[str, ...]) -> list[Scenario]:
    """The learner's own model (its check ended in one of `accepted`), its logits replaced by hooks
    with a table that makes PATHS[stop] the greedy choice: each position's likeliest token differs, so
    a loop that reads the wrong position shows; none when it cannot be hooked or does not follow."""
    own = own_seq2seq(ctx, accepted)
    path = PATHS[stop]
    table = {tuple(path[:i]): {t: 0.9} for i, t in enumerate(path)}  # prefix -> next token
    steered = OwnSteered(*own, table, ctx, None, first_decoder_layer(own[0])) if own else None
    right = [BOS] + (path[:path.index(EOS) + 1] if stop else path)[:MAX_LEN - 1]
    followed = steered is not None and (steered.call is None or _steered_reference(steered, stop) == right)
    if not followed or not steered.usable():
        return []  # no hooks to steer it by, or its own forward does not follow the path when steered
    return [(steered.handed, steered.steering, right)]


def _steered_reference(steered: Any, stop: bool) -> list[int] | None:
    """handformer's greedy choice through the steered model's own forward; None when it raises."""
    try:
        with steered.steering(), fp.dropout_off():
            return own_reference(steered.call, source(), stop)
    except fp.LearnerFailure:
        return None


def _one_more(got: list[int], right: list[int], stop: bool) -> bool:
    """The right tokens, run to max_len without an end, then one more: bentrevett's `for i in
    range(max_len)`, whose max_len counts the tokens after the start symbol."""
    ended = right[-1:] == [EOS] * stop  # it stops at EOS, and did
    return len(right) == MAX_LEN and not ended and got[:-1] == right and len(got) == MAX_LEN + 1


NEW_TOKENS = text(f"its max_len counts the new tokens (the start symbol apart): asked for {MAX_LEN - 1}, "
                  f"so that it gives {MAX_LEN} tokens in all, as handformer's max_len does",
                  f"它的 max_len 数的是新生成的 token（不算起始符号）：检查时传入 {MAX_LEN - 1}，"
                  f"让它一共给出 {MAX_LEN} 个 token，与 handformer 的 max_len 相同")


def _compare_tokens(res: ComponentResult, ctx: Context, comp: Component,
                    given: tuple[dict[str, str | None], dict[str, Any]], model: Any, right: list[int],
                    stop: bool) -> None:
    """`given`: the argument names by key, and the tokenizers and device (`loop_extras`) by name."""
    values = {"model": model, "src": source_ids(model, source()), "src_mask": source_mask(model, source()),
              "max_len": MAX_LEN, "start": BOS, "end": EOS}
    kwargs = by_name(given[0], values) | given[1]
    def run() -> Any:
        return ctx.learner.call("forward", comp.obj, **kwargs)
    got = _tokens(ctx, comp, run())
    notes = []
    if _one_more(got, right, stop) and given[0]["max_len"]:  # its max_len counts the new tokens
        notes.append(NEW_TOKENS)
        shorter = kwargs | {given[0]["max_len"]: MAX_LEN - 1}
        got = _tokens(ctx, comp, ctx.learner.call("forward", comp.obj, **shorter))
    if got[:1] != [BOS]:  # some loops return the new tokens only
        right = right[1:]
        notes.append(text("it returns the new tokens, without the start symbol",
                          "它返回的是新生成的 token，不含起始符号"))
    if not stop:
        notes.append(text(f"{comp.name} takes no end symbol, so it cannot stop at EOS (the Annotated "
                          "Transformer's): compared with max_len tokens",
                          f"{comp.name} 没有结束符参数，所以不能在 EOS 处停下"
                          "（Annotated Transformer 的写法）：按 max_len 个 token 比较"))
    res.notes += [note for note in notes if note not in res.notes]  # once, over every scenario
    end = got.index(EOS) + 1 if stop and EOS in got else len(got)
    ok = got[:end] == right and set(got[end:]) <= {PAD, EOS}  # padding after EOS (a batch-style loop) is fine
    shown = " ".join(map(str, got))
    want = " ".join(map(str, right))
    res.checks.append(Check(text(f"the tokens equal handformer's greedy choice on the same model ({want})",
                                 f"生成的 token 与 handformer 在同一模型上的贪心选择一致（{want}）"),
                            ok, text(f"yours: {shown}", f"你的：{shown}")))
    if not ok and not res.findings:
        _explain(res, ctx, comp, (got, right, stop), run, model)


def _explain(res: ComponentResult, ctx: Context, comp: Component, tokens: tuple[list[int], list[int], bool],
             run: Callable[[], Any], model: nn.Module) -> None:
    """A FAIL named where the tokens show it (the loop does not stop at EOS, or leaves it out), else
    placed at the line where the loop reads its next token from another position than the last."""
    got, upto, stop = tokens  # upto: the right tokens, ending with EOS when it stops
    shown = " ".join(map(str, got))
    if stop and got[:len(upto)] == upto != got:  # the right tokens, then more
        res.findings.append(_finding(ctx, comp, "greedy_no_stop_at_eos", text(
            f"your tokens go on after EOS ({EOS}) at position {len(upto) - 1}: {shown}",
            f"你的输出在位置 {len(upto) - 1} 的 EOS（{EOS}）之后还在继续：{shown}")))
    elif stop and got == upto[:-1]:
        res.findings.append(_finding(ctx, comp, "greedy_eos_not_emitted", text(
            f"your tokens stop where EOS ({EOS}) comes but leave it out: {shown}",
            f"你的输出在该出现 EOS（{EOS}）的位置停下了，但没有输出它：{shown}")))
    elif set(got[1:]) == {0} != set(upto[1:]):  # the only index of an axis of size 1: the batch's
        res.findings.append(_finding(ctx, comp, "argmax_wrong_dim", text(
            f"every new token is 0, the only index of an axis of size 1 (the batch of one): {shown}",
            f"每个新 token 都是 0，即大小为 1 的轴（只有一句的 batch）唯一的下标：{shown}")))
    else:
        note_departure(res, lambda: position_departure(run, comp.obj, model))
