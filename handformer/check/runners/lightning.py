"""The runner of a Lightning module's training step (`training_step(batch, batch_idx)`, as the
PyTorch Lightning tutorials write it around a language model): the loss it returns (a tensor, or a
dict with "loss") must be the cross-entropy of the module's own logits of the inputs against the next
tokens.

The module is built with check's sizes, its dropout off. A window of tokens (B, T + 1) is handed in
the forms the tutorials unpack, tried in order until one runs: a one-tuple of the tokens
(`(tokens,) = batch`), the pair (x, y) with y the tokens after x, the tokens alone. Its logits are its
own forward's (`self(x)`). A loss that scores each position against its own token is
`train_step_no_shift`, at the line that makes the targets.

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines

SIZES = {"src_vocab": 29, "d_model": 16, "n_heads": 4, "d_ff": 40, "n_layers": 2, "max_len": 16,
         "dropout": 0.0}
B, T = 3, 8  # three rows: a bare (B, T + 1) tensor is never unpacked as a pair by mistake
LOSS_CALL = re.compile(r"(cross_entropy|nll_loss|criterion|loss_fn|loss_fct|CrossEntropyLoss\(\))\s*\((.*)")


def check_lightning(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp, SIZES)
    vocab = next(m for m in module.modules() if isinstance(m, nn.Embedding)).num_embeddings
    tokens = torch.randint(0, vocab, (B, T + 1), generator=torch.Generator().manual_seed(3))  # (B, T + 1)
    x, y = tokens[:, :-1], tokens[:, 1:]  # (B, T) each
    with fp.dropout_off():
        with torch.no_grad():
            logits = _logits(comp, module, x)  # (B, T, V)
            right = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            unshifted = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x.reshape(-1))
        label, loss = _driven(ctx, comp, module, tokens)
    err = fp.relative_error(loss, right)
    res.max_abs_error = float((loss - right).abs())
    res.checks.append(Check(text(f"training_step({label}, 0) returns the cross-entropy of its logits of the "
                                 "inputs against the next tokens",
                                 f"training_step({label}, 0) 返回它对输入算出的 logits "
                                 "与下一个 token 的交叉熵"),
                            err < fp.REL_TOL, error_text(err)))
    if err >= fp.REL_TOL and fp.relative_error(loss, unshifted) < fp.REL_TOL:
        res.findings.append(_unshifted(ctx, comp))
    return finish(res)


def _logits(comp: Component, module: nn.Module, x: Tensor) -> Tensor:
    """Its forward's logits (B, T, V) of the ids x; NOT CHECKED where it gives none (a classifier's, a
    translation model's): the step of a language model is what is read here."""
    out = fp.first_tensor(fp.quietly(lambda: module(x)), 3)
    if out is None or tuple(out.shape[:2]) != tuple(x.shape):
        raise DiscoveryError(f"{comp.name}(x) gives no logits (B, T, vocab_size) for token ids x (B, T): "
                             "check reads the training step of a language model",
                             zh=f"{comp.name}(x) 对 token id x (B, T) 没有给出 logits (B, T, vocab_size)："
                                "check 读的是语言模型的训练一步")
    return out


FORMS = (("(tokens,)", lambda t: (t,)), ("(x, y)", lambda t: (t[:, :-1].contiguous(), t[:, 1:].contiguous())),
         ("tokens", lambda t: t))


def _driven(ctx: Context, comp: Component, module: nn.Module, tokens: Tensor) -> tuple[str, Tensor]:
    """(the batch's form, the loss) of the first form its training_step runs on; their first
    exception where it runs on none."""
    failures: list[fp.LearnerFailure] = []
    for label, form in FORMS:
        try:
            out = ctx.learner.call("forward", module.training_step, form(tokens.clone()), 0)
        except fp.LearnerFailure as err:
            failures.append(err)
            continue
        loss = out.get("loss") if isinstance(out, dict) else out
        if isinstance(loss, Tensor) and loss.numel() == 1:
            return label, loss.detach().double().reshape(())
        kind = type(out).__name__
        raise DiscoveryError(f"{comp.name}.training_step returned {kind}, not the loss (a tensor, or a dict "
                             "with \"loss\"): not compared",
                             zh=f"{comp.name}.training_step 返回了 {kind}，不是损失（张量，或带 \"loss\" 的 "
                                "dict）：无法比较")
    error = failures[0].error.message  # every form raised
    raise DiscoveryError(f"{comp.name}.training_step ran on none of the batches check hands it "
                         f"({', '.join(label for label, _ in FORMS)}): {error}",
                         zh=f"{comp.name}.training_step 在 check 给的几种 batch（"
                            f"{'、'.join(label for label, _ in FORMS)}）上都没有跑通：{error}")


def _unshifted(ctx: Context, comp: Component) -> Finding:
    """train_step_no_shift, at the line that makes the targets the loss is handed (the last line before
    the loss's call that assigns the name of its second argument), else where the catalogue finds it."""
    lines = source_lines(ctx.objects(comp))
    number, code = _targets_line(lines)
    if number is None:
        number, code = locate("train_step_no_shift", lines)
    return Finding("train_step_no_shift", text(
        "your loss equals the cross-entropy of each position against its own token, not the next one",
        "你的损失等于每个位置对它自己那个 token 的交叉熵，而不是对下一个 token 的"), number, code)


def _targets_line(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    for i, (_, line) in enumerate(lines):
        call = LOSS_CALL.search(line.split("#")[0])
        target = re.match(r"\s*([A-Za-z_]\w*)", _second_argument(call.group(2))) if call else None
        if target is None:
            continue
        assigned = re.compile(rf"^\s*(\(?\s*\w+\s*,\s*)*{target.group(1)}\s*(,[^=]*)?\)?\s*=[^=]")
        found = [(n, s.strip()) for n, s in lines[:i] if assigned.match(s.split("#")[0])]
        if found:  # unpacked beside the inputs (x, y = batch): the call picked the wrong one
            return (lines[i][0], lines[i][1].strip()) if "," in found[-1][1].split("=")[0] else found[-1]
    return None, None


def _second_argument(args: str) -> str:
    """The text of a call's second argument (its arguments' text after the opening bracket), "" if none."""
    depth = 0
    for i, ch in enumerate(args):
        depth += (ch in "([{") - (ch in ")]}")
        if depth < 0:
            return ""
        if ch == "," and depth == 0:
            return args[i + 1:]
    return ""
