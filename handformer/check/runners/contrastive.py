"""A generation loop that is contrastive search (Su et al., 2022), read from what it does, graded
against a reference of it on the learner's own model.

At each step contrastive search takes the k likeliest next tokens, runs the model once more on the
context with each candidate appended (a batch of B * k rows), and picks the candidate v that
maximises (1 - alpha) * p(v) - alpha * max_j cos(h_v, h_j): h_v the candidate's last hidden state,
h_j the context's. A loop is read as one when its second call to the model is that batch: each row
of the first call's ids k times (row-major), each with one of its k likeliest tokens appended. Its
hidden states are those the model returns beside its logits (TinyGPT's `return logits, hidden`);
alpha is the one argument named for it. Neither greedy decoding nor a sampling loop is its
reference: its tokens are compared with this module's contrastive search on the same model, its
logits left as they are.

Shape legend: B batch, T tokens so far, V vocabulary, C the hidden width, k candidates.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import readable_parameters
from handformer.check.core.context import forward_names
from handformer.check.core.discovery import Component
from handformer.check.core.result import (
    DEPARTS,
    NOT_CHECKED,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    text,
)
from handformer.check.core.source import first_line, functions_called, source_lines
from handformer.check.runners.generate_loop import (
    BLOCK,
    TOTAL_COUNTS,
    VOCAB,
    call_generate,
    new_tokens,
    prompts,
)

STEPS = 4  # new tokens: 3 + 4 (+ 1 candidate) stays within the block of BLOCK tokens


class Recorder:
    """The learner's module as their loop is handed it (`target`), its forward wrapped to record the
    ids of every call, its outputs unchanged."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.target, self.context, self.calls = module, module, BLOCK, []
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:  # the ids of each call recorded
            self.calls += [v.clone() for v in [*args, *kwargs.values()][:1] if isinstance(v, Tensor)]
            return original(*args, **kwargs)
        module.forward = functools.wraps(original)(forward)

    def close(self) -> None:
        vars(self.module).pop("forward", None)


@dataclass
class Read:
    k: int  # the candidates each step
    alpha: float | None  # the argument named for it; None: none found


def _calls(ctx: Any, comp: Component, module: nn.Module, n: int) -> list[Tensor]:
    """The ids of each call the loop makes to `module` for two prompts and a count of n."""
    recorder = Recorder(module)
    try:
        fp.quietly(lambda: call_generate(ctx, comp, recorder, prompts(2), n))
    finally:
        recorder.close()
    return recorder.calls


def read_contrastive(ctx: Any, comp: Component, module: nn.Module) -> Read | None:
    """The loop's k and alpha where it is contrastive search on `module` (its second call's rows are
    each first-call row k times, each with one of its k likeliest tokens appended); None otherwise.
    The second call may feed the candidates alone, with the first call's cache expanded k times.
    A loop that makes no second call for one new token is asked for one past the prompt's length:
    its count is the total length (Hugging Face's max_length), read so from then on (TOTAL_COUNTS).
    Run on a copy: a cache the model keeps inside must stay empty for the checks after."""
    module = fp.quietly(lambda: copy.deepcopy(module))
    if module is None:
        return None
    calls, total = _calls(ctx, comp, module, 1), 1 + prompts(2).size(1)
    calls = calls if len(calls) > 1 else _calls(ctx, comp, module, total)
    first, second = (calls + [torch.zeros(1, 0)] * 2)[:2]  # (B, T) and (B * k, T + 1) ids
    k = second.size(0) // first.size(0)
    top = fp.quietly(lambda: _outputs(module, first)[0][:, -1].topk(k, dim=-1).indices)  # (B, k)
    # each row k times, row-major (repeat_interleave) or candidate-major (repeat: candidate j of every row),
    # or the candidates alone, fed with the cache expanded (Hugging Face's contrastive search)
    layouts = (lambda: torch.cat([first.repeat_interleave(k, 0), top.reshape(-1, 1)], 1),
               lambda: torch.cat([first.repeat(k, 1), top.t().reshape(-1, 1)], 1),
               lambda: top.reshape(-1, 1), lambda: top.t().reshape(-1, 1))
    # k = 1 would be greedy decoding calling its model again on the token it chose
    if k < 2 or all(fp.max_error(fp.quietly(batch), second) != 0.0 for batch in layouts):
        return None
    if len(_calls(ctx, comp, module, 1)) < 2:  # its count includes the prompt
        TOTAL_COUNTS.add(comp.obj)
    return Read(k, _alpha(comp.obj))


def _alpha(fn: Any) -> float | None:
    """The default of the loop's one argument named for alpha (alpha, penalty_alpha)."""
    found = [p.default for p in readable_parameters(fn) if "alpha" in p.name.lower()]
    return found[0] if len(found) == 1 and isinstance(found[0], float) else None


@torch.no_grad()
def _outputs(module: nn.Module, ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """(logits (B, T, V), last hidden states (B, T, C)) as the model returns them: its first two
    tensors of three axes (`return logits, hidden`), or an output's `.logits` and the last of its
    `.hidden_states` (Hugging Face's, asked for by `output_hidden_states=True` where its forward takes
    it); None for what it does not return."""
    asked = {"output_hidden_states": True} if "output_hidden_states" in forward_names(module) else {}
    out = module(ids, **asked)
    if hasattr(out, "logits"):
        hidden = getattr(out, "hidden_states", None) or [getattr(out, "last_hidden_state", None)]
        return out.logits, hidden[-1]
    items = fp.outputs(out)
    wide = [t for t in items if fp.first_tensor([t], 3) is not None] + [None, None]
    return wide[0], wide[1]


@torch.no_grad()
def reference(module: nn.Module, ids: Tensor, n: int, k: int, alpha: float, sign: float = -1.0,
              reduce: str = "amax") -> Tensor:
    """n tokens of contrastive search after ids (B, T): the new tokens (B, n); `sign` +1: the mistake of
    adding the degeneration penalty; `reduce` "mean": of averaging the similarities, not their max."""
    start = ids.size(1)
    for _ in range(n):
        logits, hidden = _outputs(module, ids)  # (B, T, V), (B, T, C)
        probs, top = logits[:, -1].softmax(-1).topk(k, dim=-1)  # (B, k) each
        candidates = torch.cat([ids.repeat_interleave(k, 0), top.reshape(-1, 1)], 1)  # (B * k, T + 1)
        h = _outputs(module, candidates)[1][:, -1]  # (B * k, C)
        context = hidden.repeat_interleave(k, 0)  # (B * k, T, C)
        similar = getattr(F.cosine_similarity(context, h[:, None], dim=-1), reduce)(-1).view(-1, k)  # (B, k)
        best = ((1 - alpha) * probs + sign * alpha * similar).argmax(-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, top.gather(1, best)], 1)
    return ids[:, start:]


def check_contrastive(res: ComponentResult, ctx: Any, comp: Component, module: nn.Module, found: Read,
                      name: str) -> None:
    """Its tokens for two prompts against the reference's, with its k and alpha; NOT CHECKED where
    the model returns no hidden states or no argument names alpha."""
    res.driven = text(f"your own {name}, built with vocab_size {VOCAB} and block size {BLOCK}, its logits "
                      "as they are (contrastive search is neither greedy nor sampling)",
                      f"你自己的 {name}，按 vocab_size {VOCAB}、block size {BLOCK} 构建，logits 保持原样"
                      "（对比搜索既不是贪心解码也不是采样）")
    ids = prompts(2)
    if found.alpha is None or _outputs(module, ids)[1] is None:
        res.status = NOT_CHECKED
        res.error = LearnerError("mapping", f"{comp.name} is contrastive search (k = {found.k}), but "
                                 "check reads no alpha from its arguments or no hidden states from your "
                                 "model's output (logits, hidden)", "forward",
                                 message_zh=f"{comp.name} 是对比搜索（k = {found.k}），但 check 从它的参数里"
                                            "读不到 alpha，或从模型输出 (logits, hidden) 里读不到隐藏状态")
        return
    want = reference(module, ids, STEPS, found.k, found.alpha)
    if comp.obj in TOTAL_COUNTS:
        res.notes.append(TOTAL_NOTE)
    recorder = Recorder(module)
    try:
        got = new_tokens(call_generate(ctx, comp, recorder, ids.clone(), STEPS), ids, STEPS)
    finally:
        recorder.close()
    shown, ok = getattr(got, "tolist", lambda: None)(), fp.max_error(got, want) == 0.0
    res.checks.append(Check(text(
        f"2 prompts, {STEPS} new tokens: the tokens of contrastive search (k = {found.k}, alpha = "
        f"{found.alpha:g}: argmax of (1 - alpha) p(v) - alpha max cos(h_v, h_context)) {want.tolist()}",
        f"2 个提示词、{STEPS} 个新 token：对比搜索（k = {found.k}，alpha = {found.alpha:g}：取 "
        f"(1 - alpha) p(v) - alpha max cos(h_v, h_context) 最大者）的 token {want.tolist()}"),
        ok, text(f"got {shown}", f"得到 {shown}")))
    lines = source_lines([comp.obj, *functions_called(comp.obj)])[1:]  # the loop's, then its helpers'
    for sign, reduce, patterns, says in [] if ok else VARIANTS:
        if fp.max_error(got, reference(module, ids, STEPS, found.k, found.alpha, sign, reduce)) == 0.0:
            res.findings.append(Finding(DEPARTS, says, *first_line(patterns, lines)))
            break


ADDED = text("your tokens are those of contrastive search with the degeneration penalty added, not "
             "subtracted: candidates like the context are preferred",
             "你的 token 是把退化惩罚加上（而不是减去）时对比搜索的结果：与上下文相似的候选反而被优先选中")
TOTAL_NOTE = text("its count includes the prompt (Hugging Face's max_length): it is handed the prompt's "
                  "length plus the new tokens",
                  "它的长度参数把提示词也算进去（Hugging Face 的 max_length）：传入提示词长度加新 token 数")
AVERAGED = text("your tokens are those of contrastive search with the degeneration penalty the mean of the "
                "cosine similarities with the context, not their max",
                "你的 token 是把退化惩罚取成与上下文余弦相似度的平均值（而不是最大值）时对比搜索的结果")
# the mistakes read from the tokens: (the penalty's sign, how the similarities are reduced, the patterns of
# the line to quote, what the finding says)
VARIANTS = ((1.0, "amax", [r"=.*alpha"], ADDED),
            (-1.0, "mean", [r"\.mean\(", r"=.*alpha"], AVERAGED))
