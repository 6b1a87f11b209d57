"""The runner of a training step: `train_step(model, batch, optimizer, criterion)` (or with `src`
and `tgt` in place of the batch) on a tiny handformer `Seq2SeqTransformer` handed over in eval mode,
an SGD optimizer and a cross-entropy criterion that ignores the pad id.

The learner's step runs twice, on two batches, and the parameters after each step are compared with
handformer's step from the same start: the decoder fed the target shifted right (`tgt[:, :-1]`),
the loss against `tgt[:, 1:]`, `zero_grad`, `backward`, the gradient clipped (when the learner's code
clips, at the norm it writes) and `step`. The model records each call: the mode it was in and the
target it was fed. Named: `zero_grad` missing (gradients of step 1 still in step 2), clipping after
`step()` (the update is the unclipped one), `model.train()` forgotten (the model ran in eval mode),
the decoder fed the unshifted target (input and label at the same positions).

Shape legend: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import re
import types
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from handformer.check.context import Context, error_text, finish, forward_parameters
from handformer.check.discovery import Component, DiscoveryError
from handformer.check.result import Check, ComponentResult, Finding, Text, text
from handformer.check.source import locate, source_lines
from handformer.config import Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer

PAD, V, LR = 0, 11, 0.5
MODEL_NAMES = ("model", "net", "transformer", "m")
OPTIMIZER_NAMES = ("optimizer", "opt", "optim")
CRITERION_NAMES = ("criterion", "loss_fn", "loss_func", "loss_compute", "compute_loss", "loss_function",
                   "criteria")
BATCH_NAMES = ("batch", "data", "sample", "b", "example")
SRC_NAMES = ("src", "source", "x", "src_ids", "inputs", "input_ids")
TGT_NAMES = ("tgt", "trg", "target", "y", "tgt_ids", "targets", "labels")


def batches() -> list[tuple[Tensor, Tensor]]:
    """Two (src (B, S), tgt (B, T)) batches, the targets starting with BOS (1) and padded with 0."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(2):
        src = torch.randint(2, V, (2, 5), generator=g)
        tgt = torch.randint(2, V, (2, 6), generator=g)
        tgt[:, 0] = 1
        tgt[1, 4:] = PAD
        src[1, 4:] = PAD
        out.append((src, tgt))
    return out


def tiny_model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                        n_decoder_layers=1, dropout=0.0, max_positions=16, pad_id=PAD)
    return Seq2SeqTransformer(cfg).double()


class Recorded(nn.Module):
    """The model handed to the learner: `model(src, tgt, ...)` returns (B, T, V) logits (masks and
    other arguments are ignored: the model builds its own); every call is recorded."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        self.calls: list[tuple[bool, int]] = []  # (training, target length)

    def forward(self, src: Tensor, tgt: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        self.calls.append((self.training, tgt.size(1)))
        return self.model(src, tgt).logits


def reference_step(model: nn.Module, opt: torch.optim.Optimizer, src: Tensor, tgt: Tensor,
                   clip: float | None, *, zero_grad: bool = True, clip_after: bool = False,
                   shift: bool = True) -> None:
    """handformer's step, with the named mistakes on request."""
    criterion = nn.CrossEntropyLoss(ignore_index=PAD)
    tgt_in, tgt_out = (tgt[:, :-1], tgt[:, 1:]) if shift else (tgt, tgt)
    logits = model(src, tgt_in)
    loss = criterion(logits.reshape(-1, V), tgt_out.reshape(-1))
    if zero_grad:
        opt.zero_grad()
    loss.backward()
    if clip is not None and not clip_after:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    if clip is not None and clip_after:  # clips the gradients already used (kept, without zero_grad)
        nn.utils.clip_grad_norm_(model.parameters(), clip)


def _params(model: nn.Module) -> list[Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _diff(a: list[Tensor], b: list[Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


class Step:
    """How to call the learner's step: its model, batch (a tuple, an object with fields, or a dict,
    as its source reads it), optimizer and criterion arguments, by name."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        params = forward_parameters(comp.obj)
        self.names = [p.name for p in params]
        find = lambda aliases: next((n for n in self.names if n.lower() in aliases), None)  # noqa: E731
        self.model, self.opt = find(MODEL_NAMES), find(OPTIMIZER_NAMES)
        self.criterion, self.batch = find(CRITERION_NAMES), find(BATCH_NAMES)
        self.src, self.tgt = find(SRC_NAMES), find(TGT_NAMES)
        known = {self.model, self.opt, self.criterion, self.batch, self.src, self.tgt}
        unknown = [p.name for p in params if p.default is p.empty and p.name not in known]
        if unknown or not self.model or not self.opt or not (self.batch or (self.src and self.tgt)):
            raise DiscoveryError(
                f"{comp.name}: cannot fill the argument {(unknown or ['model / optimizer / batch'])[0]!r}; "
                "a training step takes (model, batch, optimizer, criterion), the batch as (src, tgt), "
                "batch.src / batch.tgt or a dict, or src and tgt themselves")
        try:
            self.source = inspect.getsource(comp.obj)
        except (OSError, TypeError):
            self.source = ""
        match = re.search(r"clip_grad_norm_?\([^,]+,\s*(?:max_norm\s*=\s*)?([0-9.eE+-]+)", self.source)
        self.clip = float(match.group(1)) if match else (1.0 if "clip_grad" in self.source else None)

    def _batch(self, src: Tensor, tgt: Tensor) -> Any:
        name = re.escape(self.batch or "")
        fields = re.findall(rf"\b{name}\.(\w+)", self.source) if self.batch else []
        keys = re.findall(rf"\b{name}\[[\"'](\w+)[\"']\]", self.source) if self.batch else []
        if fields or keys:
            values = {}
            for name in fields or keys:
                low = name.lower()
                is_src = low in SRC_NAMES or low.startswith("src")
                values[name] = src.clone() if is_src else tgt.clone()
            return types.SimpleNamespace(**values) if fields else values
        return (src.clone(), tgt.clone())

    def __call__(self, model: nn.Module, opt: torch.optim.Optimizer, src: Tensor, tgt: Tensor) -> Any:
        kwargs: dict[str, Any] = {self.model: model, self.opt: opt}
        if self.criterion:
            kwargs[self.criterion] = nn.CrossEntropyLoss(ignore_index=PAD)
        if self.batch:
            kwargs[self.batch] = self._batch(src, tgt)
        else:
            kwargs[self.src], kwargs[self.tgt] = src.clone(), tgt.clone()
        return self.ctx.learner.call("forward", self.comp.obj, **kwargs)


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "train_step")))
    return Finding(name, observed, number, code, form)


def _run(step_fn: Any, base: Seq2SeqTransformer, clip: float | None, **mistakes: bool) -> list[list[Tensor]]:
    model = Recorded(copy.deepcopy(base))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for src, tgt in batches():
        step_fn(model, opt, src, tgt, clip, **mistakes)
        out.append(_params(model))
    return out


def check_train_step(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    step = Step(comp, ctx)
    base = tiny_model()
    model = Recorded(copy.deepcopy(base)).eval()  # handed in eval mode, as after an evaluation
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    got = []
    with torch.enable_grad():
        for src, tgt in batches():
            step(model, opt, src, tgt)
            got.append(_params(model))
        right = _run(reference_step, base, step.clip)
        errs = [_diff(g, r) for g, r in zip(got, right)]
        res.max_abs_error = max(errs)
        res.checks.append(Check(text("the parameters after one and after two steps equal handformer's step "
                                     "on the same batches",
                                     "一步和两步之后的参数与 handformer 在同样的 batch 上走一步的结果一致"),
                                max(errs) < 1e-9, error_text(max(errs))))
        if step.clip is not None:
            res.notes.append(text(f"your step clips the gradient norm at {step.clip:g}; handformer's step "
                                  "clipped at the same norm", f"你的一步把梯度范数裁剪到 {step.clip:g}；"
                                  "handformer 的一步按同样的范数裁剪"))
        trained = [t for t, _ in model.calls]
        lengths = {n for _, n in model.calls}
        if model.calls and not any(trained):
            res.findings.append(_finding(ctx, comp, "train_step_eval_mode", text(
                f"the model was handed over in eval mode and your step ran all {len(trained)} of its calls "
                "so: dropout stays off in training",
                f"模型交给你时处于 eval 模式，你的一步在全部 {len(trained)} 次调用里都这样运行它："
                "训练时 dropout 一直关着")))
        if max(errs) >= 1e-9:
            variants = {"train_step_no_zero_grad": {"zero_grad": False},
                        "train_step_clip_after_step": {"clip_after": True},
                        "train_step_no_shift": {"shift": False}}
            if step.clip is None:
                del variants["train_step_clip_after_step"]
            if lengths != {batches()[0][1].size(1)}:
                del variants["train_step_no_shift"]
            combos = [c for n in (1, 2) for c in itertools.combinations(variants, n)]
            for combo in combos:
                mistakes = {k: v for name in combo for k, v in variants[name].items()}
                theirs = _run(reference_step, base, step.clip, **mistakes)
                if _diff(theirs[0], right[0]) < 1e-12 and _diff(theirs[1], right[1]) < 1e-12:
                    continue  # these mistakes change nothing on these batches
                off = max(_diff(g, t) for g, t in zip(got, theirs))
                if off >= 1e-9:
                    continue
                for name in combo:
                    res.findings.append(_finding(ctx, comp, name, text(
                        f"your parameters equal those of a step with this mistake (max abs difference "
                        f"{off:.1e}); after step 1 they differ from handformer's by {errs[0]:.3g}, after "
                        f"step 2 by {errs[1]:.3g}",
                        f"你的参数与带这个错误的一步结果一致（最大绝对误差 {off:.1e}）；"
                        f"与 handformer 的相比，第 1 步之后相差 {errs[0]:.3g}，"
                        f"第 2 步之后相差 {errs[1]:.3g}")))
                break
            else:
                res.notes.append(text("no known mistake (or pair of them) reproduces your parameters; see "
                                      "the checks",
                                      "没有任何已知错误（或两个错误的组合）能复现你的参数；请看检查项"))
    return finish(res)
