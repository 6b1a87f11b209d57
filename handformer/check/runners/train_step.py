"""The runners of a training step, `train_step(model, batch, optimizer, criterion)` (or with `src`
and `tgt` in place of the batch, and optionally a number of micro-batches to accumulate), and of a
training epoch, `train_epoch(model, loader, optimizer, criterion)`, on a tiny handformer
`Seq2SeqTransformer` handed over in eval mode and an SGD optimizer. The criterion handed in is the
learner's own when the file defines a loss that passes its check (called with the pad id, and a
smoothing of 0.1 when it takes one), else a cross-entropy that ignores the pad id; handformer's step
uses the same one.

The learner's step runs twice, on two batches, and the parameters after each step are compared with
handformer's step from the same start: the decoder fed the target shifted right (`tgt[:, :-1]`),
the loss against `tgt[:, 1:]`, `zero_grad`, `backward`, the gradient clipped (when the learner's code
clips, at the norm it writes) and `step`. The model records each call: the mode it was in and the
target it was fed. Named: `zero_grad` missing (gradients of step 1 still in step 2), clipping after
`step()` (the update is the unclipped one), `model.train()` forgotten (the model ran in eval mode),
the decoder fed the unshifted target or scored on its own input (input and label at the same
positions), a summed loss divided by the number of sentences, and with
accumulation the micro-batches' losses not divided by their number (the update is that many times
too large). An epoch runs once over the same two batches and is compared after it. A step that
clips runs again with the logits scaled down until the gradients stay well under its clipping norm:
at full size the clipping gives a loss of the wrong scale the right update, here the scale shows.

Shape legend: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
import re
import textwrap
import types
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import (
    ACCUM_NAMES,
    BATCH_NAMES,
    CLIP_NAMES,
    CRITERION_NAMES,
    DECODER_INPUT_NAMES,
    LOADER_NAMES,
    OPTIMIZER_NAMES,
    SCALER_NAMES,
    SCHEDULE_STEP_NAMES,
    SCHEDULER_NAMES,
    SRC_NAMES,
    TGT_NAMES,
)
from handformer.check.core.argument_names import STEP_MODEL_NAMES as MODEL_NAMES  # noqa: F401
from handformer.check.core.clipping import ValueClip, clip_norm
from handformer.check.core.context import (
    SEQUENCE_FIRST,
    Context,
    error_text,
    finish,
    forward_parameters,
    named,
    names_of,
)
from handformer.check.core.defaults import given
from handformer.check.core.discovery import Component, DiscoveryError, cannot_fill, own_objects, size_of
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.objective import not_next_token
from handformer.check.core.result import (
    FAIL,
    NOT_CHECKED,
    PASS,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.source import locate, source_lines, source_text
from handformer.check.core.step_updates import (
    gradient_norm,
    largest_difference,
    largest_differences,
    parameters_of,
    update,
)
from handformer.check.runners.classifier_step import check_classifier_step
from handformer.check.runners.classifier_step import roles as classifier_roles
from handformer.check.runners.localize_train import localize_train_step
from handformer.check.runners.own_classifier_step import check_own_classifier_step, step_reads
from handformer.check.runners.reward_pair import check_pairwise_step, pairwise_step
from handformer.check.runners.step_parts import calls_with_norm, own_batch, own_loss_compute
from handformer.config import Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer

PAD, V, LR = 0, 11, 0.5
# the stand-in model's widths (tiny_model), by the size an argument's name stands for (a vocabulary
# argument may be a tokenizer's: not filled)
STAND_IN_SIZES = {"d_model": 8, "n_heads": 2, "d_ff": 16}

# the next tokens handed beside the decoder's input (`train_step(model, opt, src, tgt_in, tgt_out)`)
TARGET_OUT_NAMES = ("tgt_out", "tgt_output", "trg_output", "target_output", "tgt_y", "trg_y")
ACCUM = 2  # micro-batches a step is asked to accumulate, when it takes their number


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


def unpacked(source: str, model: str | None) -> int:
    """How many values the step unpacks its model's call into (bentrevett's `output, _ = model(src,
    trg[:, :-1])`: 2, its model returns the attention too); 1 when it takes the call whole."""
    match = re.search(rf"^\s*(\w+(?:\s*,\s*\w+)+)\s*,?\s*=\s*{re.escape(model or '')}\s*\(", source, re.M)
    return len(match.group(1).split(",")) if match and model else 1


# a tensor batch-first, (B, L, ...), as a step reads it: as it is (False), or sequence-first (True)
LAYOUT = {False: lambda t: t, True: lambda t: t.transpose(0, 1)}


class Recorded(nn.Module):
    """The model handed to the learner: `model(src, tgt, ...)` returns (B, T, V) log-probabilities
    (masks and other arguments are ignored: the model builds its own); every call is recorded.
    Log-probabilities suit every loss a step applies: a cross-entropy takes them as logits (the
    log-softmax of log-probabilities changes nothing), and a KLDivLoss or NLLLoss (the Annotated
    Transformer's label smoothing, its generator ending in log_softmax) needs them."""

    def __init__(self, model: Seq2SeqTransformer, outputs: int = 1, first: bool = False) -> None:
        super().__init__()
        self.model = model
        self.first = first  # ids (S, B) in and logits (T, B, V) out: nn.Transformer's default layout
        self.calls: list[tuple[bool, int]] = []  # (training, target length)
        self.scale = 1.0  # the logits' factor: small, the gradients stay under the clipping norm
        self.outputs = outputs  # a step that unpacks `output, _ = model(...)`: a tuple, the logits first

    def forward(self, src: Tensor, tgt: Tensor, *args: Any, **kwargs: Any) -> Any:
        src, tgt = LAYOUT[self.first](src), LAYOUT[self.first](tgt)  # (B, S), (B, T)
        self.calls.append((self.training, tgt.size(1)))
        out = (self.model(src, tgt).logits * self.scale).log_softmax(-1)  # (B, T, V)
        out = LAYOUT[self.first](out)  # (T, B, V) for a sequence-first step
        return out if self.outputs == 1 else (out,) + (None,) * (self.outputs - 1)


class TokenCrossEntropy(nn.CrossEntropyLoss):
    """torch's cross-entropy that also takes the model's (B, T, V) output with (B, T) targets as they
    are (a step written for a criterion of its own that flattens them: fairseq's), read as B * T
    tokens; torch's own layouts, (N, V) and (B, V, T), unchanged."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.padding_idx = self.pad_idx = self.ignore_index  # the names criteria give their pad id

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        if input.dim() > 2 and input.shape[:-1] == target.shape:
            input, target = input.reshape(-1, input.size(-1)), target.reshape(-1)  # (B * T, V), (B * T,)
        return super().forward(input, target)


def reference_step(model: nn.Module, opt: torch.optim.Optimizer, src: Tensor, tgt: Tensor,
                   clip: float | None, *, zero_grad: bool = True, clip_after: bool = False,
                   shift: bool = True, shift_labels: bool = True, accum: int = 1, divide: bool = True,
                   criterion: Any = None, per_token: bool = False, per_sentence: bool = False,
                   lr: float | None = None) -> None:
    """handformer's step, with the named mistakes on request: with accum > 1 the batch is split in
    that many micro-batches along the batch, each loss divided by accum (unless `divide` is off)
    and backpropagated, then one update. per_token: a summed loss divided by the number of real
    target tokens (the Annotated Transformer's SimpleLossCompute), per_sentence: by the number of
    sentences (the mistake); shift_labels off: the decoder fed tgt[:, :-1] and scored on it too; lr:
    the rate the update uses (the one the learner's step set from its update count)."""
    criterion = criterion or TokenCrossEntropy(ignore_index=PAD)
    if zero_grad:
        opt.zero_grad()
    for src_part, tgt_part in zip(src.chunk(accum), tgt.chunk(accum)):
        fed, moved = tgt_part.size(1) - shift, min(shift, shift_labels)  # positions fed; labels moved on by
        tgt_in, tgt_out = tgt_part[:, :fed], tgt_part[:, moved:moved + fed]
        logits = model(src_part, tgt_in)
        # log-probabilities: what the Annotated LabelSmoothing takes, and the same loss for a
        # cross-entropy (log_softmax of log-probabilities changes nothing)
        loss = criterion(logits.log_softmax(-1).reshape(-1, V), tgt_out.reshape(-1))
        loss = loss / (tgt_out != PAD).sum() if per_token else loss
        loss = loss / src_part.size(0) ** per_sentence  # divided by the sentences: per_sentence
        (loss / accum if divide else loss).backward()
    update(model, opt, clip, clip_after, lr)


class ConstantScheduler(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR whose factor is 1 at every step, that also answers fairseq's scheduler calls
    (`step_update(num_updates)`, `get_lr()`'s number): the rate stays the optimizer's."""

    def step_update(self, num_updates: int) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


def constant_scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """The scheduler a step that takes one is handed: a LambdaLR whose factor is 1 at every step, so
    the learning rate stays the optimizer's whenever the step calls scheduler.step() (or fairseq's
    scheduler.step_update(num_updates))."""
    return ConstantScheduler(opt, lambda _step: 1.0)


def grad_scaler() -> torch.amp.GradScaler:
    """The loss scaler a step that takes one is handed: torch.amp's on the CPU, whose scale (a power
    of two) and unscaling are exact in float64, so a step that unscales before it clips updates as
    an unscaled step does."""
    return torch.amp.GradScaler("cpu")


SCALER_NOTE = text("your step takes a loss scaler: it was handed torch.amp.GradScaler(\"cpu\") (the loss "
                   "scaled by a power of two, exact in float64), so its clipping must see the unscaled "
                   "gradients (scaler.unscale_(optimizer) first) to match handformer's step",
                   "你的一步接受一个损失缩放器：交给它的是 torch.amp.GradScaler(\"cpu\")（损失乘以 2 的幂，"
                   "在 float64 下没有误差），所以梯度裁剪要在反缩放之后（先 scaler.unscale_(optimizer)）"
                   "才与 handformer 的一步一致")
SCHEDULER_NOTE = text("your step takes a scheduler: it was handed a LambdaLR whose factor is 1 at every step "
                      "(the learning rate stays the optimizer's), so the schedule itself and where the step "
                      "calls scheduler.step() are not graded here; the schedule has a check of its own",
                      "你的一步接受一个调度器：交给它的是每一步系数都为 1 的 LambdaLR"
                      "（学习率保持优化器的值），所以这里不检查调度本身，"
                      "也不检查 scheduler.step() 放在哪里；调度有自己的检查")


# a step that computes in float32 (`.float()`, autocast) is compared at float32's precision: its
# parameters differ from a float64 step's by ~1e-8, every named mistake by far more
FLOAT32 = re.compile(r"\.float\(\)|float32|autocast")
TOLERANCE = {False: 1e-9, True: 1e-6}
FLOAT32_NOTE = text("your step computes in float32 (.float() or autocast): its parameters are compared to "
                    "1e-6, float32's precision, not to 1e-9",
                    "你的一步用 float32 计算（.float() 或 autocast）：参数按 float32 的精度比较，"
                    "误差限为 1e-6，而不是 1e-9")


def clip_note(clip: float) -> Text:
    if isinstance(clip, ValueClip):
        return text(f"your step clips each gradient element at {clip:g} (clip_grad_value_); handformer's "
                    "step clipped the same way",
                    f"你的一步把梯度的每个元素裁剪到 {clip:g}（clip_grad_value_）；"
                    "handformer 的一步也这样裁剪")
    return text(f"your step clips the gradient norm at {clip:g}; handformer's step clipped at the same norm",
                f"你的一步把梯度范数裁剪到 {clip:g}；handformer 的一步按同样的范数裁剪")


def _called_sources(ctx: Context, source: str) -> list[str]:
    """The sources of the file's own functions that SOURCE calls by name (a `train_epoch` that calls
    the learner's `train_step`)."""
    own = own_objects(ctx.module).items()
    return [source_text(obj) for name, obj in own if "." not in name and inspect.isfunction(obj)
            and re.search(rf"\b{re.escape(name)}\s*\(", source)]


DATA_ARGUMENTS = {True: {"loader": LOADER_NAMES},  # by epoch (True) or step (False)
                  False: {"batch": BATCH_NAMES, "src": SRC_NAMES, "tgt": TGT_NAMES}}
# what a training step (False) or epoch (True) takes, and its name in English and Chinese
TAKES = {True: ("(model, loader, optimizer, criterion)", "epoch", "训练一个 epoch"),
         False: ("(model, batch, optimizer, criterion), the batch as (src, tgt), batch.src / batch.tgt or a "
                 "dict, or src and tgt themselves", "step", "训练一步")}


def fed_apart(names: list[str], tgt: str | None) -> tuple[str | None, str | None]:
    """(the decoder's input handed apart, the target beside it) of a step's arguments: fairseq's
    (prev_output_tokens, target), (tgt_in, tgt_out); (None, tgt) where it takes no such input."""
    fed = named(names, DECODER_INPUT_NAMES)
    tgt = tgt or (named(names, TARGET_OUT_NAMES) if fed else None)
    return (fed, tgt) if tgt else (None, tgt)


class Step:
    """How to call the learner's step (or epoch): its model, batch (a tuple, an object with fields, or a
    dict, as its source reads it), optimizer, criterion and accumulation arguments, by name."""

    def __init__(self, comp: Component, ctx: Context, epoch: bool = False) -> None:
        self.comp, self.ctx, self.epoch = comp, ctx, epoch
        params = forward_parameters(comp.obj)
        self.names, required = names_of(params)
        find = lambda aliases: named(self.names, aliases)  # noqa: E731
        self.model, self.opt, self.criterion = find(MODEL_NAMES), find(OPTIMIZER_NAMES), find(CRITERION_NAMES)
        self.accum, self.sched, self.scaler = find(ACCUM_NAMES), find(SCHEDULER_NAMES), find(SCALER_NAMES)
        self.clip_arg = find(CLIP_NAMES)  # the clipping norm it is handed: the one it is read to clip at
        wanted = DATA_ARGUMENTS[epoch]  # an epoch's loader; a step's batch, or src and tgt
        self.loader, self.batch, self.src, self.tgt = (find(wanted.get(key, ()))
                                                       for key in ("loader", "batch", "src", "tgt"))
        self.fed, self.tgt = fed_apart(self.names, self.tgt) if not epoch else (None, self.tgt)
        # the update count a step sets its rate from (fairseq's num_updates): 1, then 2
        self.count = named([n for n in required if n not in self.names[:1]], SCHEDULE_STEP_NAMES)
        known = {self.model, self.opt, self.criterion, self.batch, self.src, self.tgt, self.fed, self.accum,
                 self.loader, self.sched, self.scaler, self.count, self.clip_arg, *self.sizes(required)}
        data = self.loader or self.batch or (self.src and self.tgt)  # an epoch's loader, a step's batch
        what, en, zh = TAKES[epoch]
        found = self.model and self.opt and data
        cannot_fill(comp.name, required, known, found, "model / optimizer / batch", (
            f"a training {en} takes {what}, and optionally the number of micro-batches to accumulate "
            "(accum_steps, ...), a scheduler and a loss scaler (scaler)",
            f"{zh}接受 {what}，还可以有要累积的 micro-batch 个数（accum_steps 等）、"
            "调度器（scheduler）和损失缩放器（scaler）"))
        self.source = source_text(comp.obj)
        clipping = "\n".join(map(textwrap.dedent, [self.source, *_called_sources(ctx, self.source)]))
        self.clip = clip_norm(clipping, {})
        self.tol = TOLERANCE[bool(FLOAT32.search(clipping))]
        if epoch:  # the loop's variable is what a batch is called (the loader: required of an epoch)
            loader = re.escape(self.loader)
            loop = re.search(rf"for\s+(\w+)\s+in\s+(?:enumerate\()?\s*{loader}\b|"
                             rf"for\s+\w+\s*,\s*(\w+)\s+in\s+enumerate\(\s*{loader}\b", self.source)
            self.batch = loop.group(loop.lastindex) if loop else None  # for i, batch in enumerate(loader)
        self._criterion(ctx)
        self.outputs = unpacked(self.source, self.model)
        self.scale = 1.0  # the logits' factor in both steps (unclipped_scale: clipping out of reach)
        self.per_token = False  # handformer's step divides a summed loss by the real tokens (per_token_step)
        self.rates: list[tuple[float, float]] = []  # the optimizer's rate before and after each call
        self.set_before = True  # the step sets its rate before its update (else after: the next step's)
        self.first = False  # the batches handed sequence-first, (S, B) and (T, B) (laid_out)

    def _criterion(self, ctx: Context) -> None:
        """The criterion the step is handed: the file's loss (learner_criterion); a step calling it with
        a norm (`loss_compute(out, y, ntokens)`) gets it inside the file's wrapper, and without a loss
        of the file's own a summed cross-entropy, since the wrapper divides by the norm."""
        self.make_criterion, self.criterion_name = learner_criterion(ctx)
        self.loss_compute = calls_with_norm(self.source, str(self.criterion))  # None: no call of that name
        if self.loss_compute and self.criterion_name is None:
            self.make_criterion = lambda: TokenCrossEntropy(ignore_index=PAD, reduction="sum")

    def sizes(self, names: list[str] | None = None) -> dict[str, int]:
        """The stand-in's width for each required argument that names one (an epoch's
        noam_lr(step, d_model, warmup) sets its rate from it), and check's pad id for any argument
        that names the pad (fairseq's `padding_idx=1`: its default is another vocabulary's)."""
        all_names, required = names_of(forward_parameters(self.comp.obj))
        names = given(names, required)
        pads = {n: PAD for n in all_names if size_of(n) == "pad_id"}
        return {**{n: STAND_IN_SIZES[size_of(n)] for n in names if size_of(n) in STAND_IN_SIZES}, **pads}

    def laid(self, ids: Tensor) -> Tensor:
        """Ids (B, L) as the step is handed them: (L, B) for a sequence-first step."""
        return LAYOUT[self.first](ids).clone()

    def _batch(self, src: Tensor, tgt: Tensor) -> Any:
        src, tgt = self.laid(src), self.laid(tgt)
        if not self.batch:  # an epoch whose loop variable was not found
            return (src.clone(), tgt.clone())
        name = re.escape(self.batch)
        fields = re.findall(rf"\b{name}\.(\w+)", self.source)
        keys = re.findall(rf"\b{name}\[[\"'](\w+)[\"']\]", self.source)
        # a field neither the source, the target nor a mask (tgt_y, ntokens): the file's own batch class
        extra = {f.lower() for f in fields if "mask" not in f.lower()} - set(SRC_NAMES + TGT_NAMES)
        own = own_batch(self.ctx, self.comp.obj, fields, src, tgt, PAD) if extra else None
        if own is not None:
            return own
        if fields or keys:
            values = {}
            for name in fields or keys:
                low = name.lower()
                is_src = low in SRC_NAMES or low.startswith("src")
                values[name] = src.clone() if is_src else tgt.clone()
            return types.SimpleNamespace(**values) if fields else values
        return (src.clone(), tgt.clone())

    def guessed(self) -> list[str]:
        """The batch's fields or keys the step reads (not those of the file's own batch class) that name
        neither a source, a target nor a mask: each handed the target by guess."""
        if not self.batch:
            return []
        name = re.escape(self.batch)
        fields = re.findall(rf"\b{name}\.(\w+)", self.source)
        if fields and own_batch(self.ctx, self.comp.obj, fields, *batches()[0], PAD) is not None:
            return []
        read = re.findall(rf"\b{name}\.(\w+)\b(?!\s*\()", self.source) or re.findall(
            rf"\b{name}\[[\"'](\w+)[\"']\]", self.source)  # its fields, not its methods (.to())
        known = SRC_NAMES + TGT_NAMES + ("input", "label", "src", "tgt", "trg", "target")
        return list(dict.fromkeys(n for n in read
                                  if "mask" not in n.lower() and not n.lower().startswith(known)))

    def __call__(self, model: nn.Module, opt: torch.optim.Optimizer, src: Tensor, tgt: Tensor) -> Any:
        data = ({self.batch: self._batch(src, tgt)} if self.batch
                else {self.src: self.laid(src), self.tgt: self.laid(tgt)})
        if self.fed and not self.batch:  # the decoder's input apart (the target shifted right), then the rest
            data.update({self.fed: self.laid(tgt[:, :-1]), self.tgt: self.laid(tgt[:, 1:])})
        return self._call(model, opt, data)

    def run_epoch(self, model: nn.Module, opt: torch.optim.Optimizer, data: list[tuple[Tensor, Tensor]],
                  ) -> Any:
        return self._call(model, opt, {self.loader: [self._batch(src, tgt) for src, tgt in data]})

    def _call(self, model: nn.Module, opt: torch.optim.Optimizer, data: dict[str, Any]) -> Any:
        """Their step or epoch on the model, the optimizer, the data, and the criterion and the
        accumulation count when it takes them."""
        kwargs: dict[str, Any] = {self.model: model, self.opt: opt, **data, **self.sizes()}
        given = {self.criterion: self.make_criterion, self.accum: lambda: ACCUM,
                 self.sched: lambda: constant_scheduler(opt), self.scaler: grad_scaler,
                 self.count: lambda: len(self.rates) % 2 + 1, self.clip_arg: lambda: self.clip}
        kwargs.update({name: make() for name, make in given.items() if name})
        if self.loss_compute:  # loss_compute(out, y, norm): the file's wrapper around the criterion
            kwargs[self.criterion] = own_loss_compute(self.ctx, self.comp.obj, kwargs[self.criterion])
        before = float(opt.param_groups[0]["lr"])
        out = self.ctx.learner.call("forward", self.comp.obj, **kwargs)
        self.rates.append((before, float(opt.param_groups[0]["lr"])))
        return out

    def used_rates(self) -> list[float | None]:
        """The rate each of the last two updates used, where the step sets it from its update count:
        the one it set (before its update), or the one in place when it was called (a rate set after
        the update is the next step's); None each where it takes no count."""
        if not self.count:  # a rate it sets itself all the same (an epoch's noam_lr): each update's
            return self.read_rates[-2:] if len(self.read_rates) == 2 else [None, None]
        return [pair[int(self.set_before)] for pair in self.rates[-2:]]

    def uses_own_criterion(self) -> bool:
        """The learner's loss is handed in, or (no criterion argument) the step calls it by name."""
        name = self.criterion_name
        return bool(self.criterion) or bool(name and re.search(rf"\b{name}\s*\(", self.source))

    def reference_criterion(self) -> Any:
        """The criterion handformer's step uses: the one handed to the learner, or (a step without a
        criterion argument) the learner's loss when its step calls it by name, else cross-entropy."""
        if self.uses_own_criterion():
            return self.make_criterion()
        return TokenCrossEntropy(ignore_index=PAD)


class OwnCriterion:
    """The learner's loss called as criterion(input, target), its attributes read through (a step reads
    `criterion.ignore_index` or `criterion.padding_idx` to count the real tokens)."""

    def __init__(self, ctx: Context, fn: Any, arguments: Any) -> None:
        self.ctx, self.fn, self.arguments = ctx, fn, arguments

    def __call__(self, input: Tensor, target: Tensor) -> Any:
        out = self.ctx.learner.call("forward", self.fn, **self.arguments(input, target))
        return out[0] if isinstance(out, tuple) else out  # fairseq's (loss, nll_loss): the loss

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["fn"], name)


def learner_criterion(ctx: Context) -> tuple[Any, str | None]:
    """A factory of the learner's loss as a criterion(input, target) when the file defines one that
    passes its own check, with the name it has; else of handformer's cross-entropy."""
    from handformer.check.runners.loss import Loss, check_loss

    fallback = (lambda: TokenCrossEntropy(ignore_index=PAD)), None
    comp = ctx.components.get("loss")
    if comp is None or not ctx.passes(comp, check_loss):
        return fallback
    try:
        spec = Loss(comp, ctx)
    except DiscoveryError:
        return fallback
    if (spec.shifts, spec.ignore) != (False, PAD):  # its own shift or ignore id: the step's are not so
        return fallback

    def make() -> Any:
        init, fixed = spec.options(0.1, PAD, V)  # the step's pad id and vocabulary
        fn = ctx.learner.call("__init__", lambda: comp.obj(**init)) if spec.is_class else comp.obj

        return OwnCriterion(ctx, fn, lambda input, target: {spec.input: input, spec.target: target, **fixed})

    return make, comp.name


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    """The finding, with the likely line in the step (or epoch) itself, else in the rest of the file;
    the labels left unshifted (form "labels") at no line: the step's localizer finds the line of the
    labels, where a pattern would find the model's call."""
    if form == "labels":
        return Finding(name, observed, None, None, form)
    number, code = locate(name, source_lines([comp.obj]))
    if number is None:
        number, code = locate(name, source_lines(ctx.objects(comp, "train_step", "train_epoch")))
    return Finding(name, observed, number, code, form)


def _run(step: Step, base: Seq2SeqTransformer, **mistakes: Any) -> list[list[Tensor]]:
    """handformer's steps (with the mistakes asked for) from the same start: the parameters after
    each batch (one list for an epoch, after both)."""
    model = Recorded(copy.deepcopy(base))
    model.scale = step.scale
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    accum = ACCUM if step.accum else 1
    out = []
    for (src, tgt), lr in zip(batches(), step.used_rates()):
        reference_step(model, opt, src, tgt, step.clip, accum=accum, criterion=step.reference_criterion(),
                       lr=lr, **{"per_token": step.per_token, **mistakes})
        out.append(parameters_of(model))
    return out[-1:] if step.epoch else out


def check_train_step(comp: Component, ctx: Context) -> ComponentResult:
    if pairwise_step(comp):  # a reward model's step on pairs (reward_pair.py)
        return check_pairwise_step(comp, ctx)
    not_next_token(comp)
    reinforced(comp, ctx)
    return _check(comp, ctx, epoch=False)


# what a reinforcement-learning step takes beside the model, and the objectives it may be written for
RL_ARGUMENTS = re.compile(r"(?i)reward|rollout|advantage|old_?log")  # not prompts alone: an SFT step's
OBJECTIVES = ("GSPO", "DAPO", "CISPO", "GRPO", "RLOO", "REINFORCE", "PPO")


def reinforced(comp: Component, ctx: Context) -> None:
    """A step that takes rewards, rollouts, advantages or old log-probabilities (and maybe prompts) is a
    reinforcement-learning step, which check does not drive whole: NOT CHECKED, naming the objective
    its file names (its pieces are checked apart)."""
    names = names_of(forward_parameters(comp.obj))[1]
    rl = [n for n in names if RL_ARGUMENTS.search(n) or "prompt" in n] * any(map(RL_ARGUMENTS.search, names))
    said = source_text(ctx.module).upper()
    objective = next((f" ({o})" for o in OBJECTIVES if re.search(rf"\b{o}", said)), "")
    if rl:
        raise DiscoveryError(
            f"{comp.name} is a reinforcement-learning step{objective} (it takes {', '.join(rl)}): check does "
            "not drive such a step whole; the pieces it calls (a policy loss, the advantages) are checked on "
            "their own", zh=f"{comp.name} 是强化学习的训练一步{objective}（它接受 {', '.join(rl)}）："
            "check 不整体运行这样的一步；它调用的部分（策略损失、优势）各自检查")


def check_train_epoch(comp: Component, ctx: Context) -> ComponentResult:
    return _check(comp, ctx, epoch=True)


Drive = tuple[Recorded, list[list[Tensor]], list[list[Tensor]], list[float]]


def laid_out(step: Step, base: Seq2SeqTransformer) -> Drive:
    """`_drive` with the batches batch-first, (B, L); where that raises and a part of the file was checked
    sequence-first (nn.Transformer's default, PyTorch's translation tutorial), sequence-first, (L, B),
    the model handed taking and giving them so (its error, where that raises too)."""
    try:
        return _drive(step, base)
    except fp.LearnerFailure:
        if not file_reads_sequence_first(step.ctx):
            raise
    step.first, step.rates = True, []
    return _drive(step, base)


def file_reads_sequence_first(ctx: Context) -> bool:
    """Whether the file's parts checked before the step take their ids or stream sequence-first, as
    their checks found: its encoder-decoder model, its mask helper or its positional encoding."""
    from handformer.check.runners.mask_helpers import SEQUENCE_FIRST_NOTE

    return any(note in (SEQUENCE_FIRST, SEQUENCE_FIRST_NOTE)
               for r in ctx.results.values() for note in r.notes)


def _drive(step: Step, base: Seq2SeqTransformer) -> Drive:
    """The learner's step (or epoch) from `base`, handed in eval mode (as after an evaluation), and
    handformer's from the same start: the model handed, both parameter lists, the largest difference
    after each step."""
    model = Recorded(copy.deepcopy(base), step.outputs, step.first).eval()
    model.scale = step.scale
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    step.read_rates: list[float] = []  # the rate the optimizer held at each of its updates
    opt.register_step_pre_hook(lambda o, *_: step.read_rates.append(float(o.param_groups[0]["lr"])))
    got = []
    if step.epoch:
        step.run_epoch(model, opt, batches())
        got.append(parameters_of(model))
    else:
        for src, tgt in batches():
            step(model, opt, src, tgt)
            got.append(parameters_of(model))
    step.tol = _rate_scaled(step)
    return (model, got, *_compared(step, base, got))


def _compared(step: Step, base: Seq2SeqTransformer, got: list[list[Tensor]],
              ) -> tuple[list[list[Tensor]], list[float]]:
    """handformer's steps and their differences from `got`, read as the learner's step computes: its
    rate set before its update or after it (the next step's: a step that takes its update count), its
    summed loss divided by the real tokens or not (a criterion that sums); the first reading that
    matches, else the plain one."""
    readings = [(before, divided) for divided in (False, True) for before in (True, False)
                if (before or step.count) and (not divided or sums(step.reference_criterion()))]
    for step.set_before, step.per_token in readings + [(True, False)]:
        right = _run(step, base)
        errs = largest_differences(got, right)
        if max(errs) < step.tol:
            break
    return right, errs


def _rate_scaled(step: Step) -> float:
    """The tolerance of a step that sets its own rate from its update count (fairseq's inverse_sqrt at
    update 1 is ~1e-9): scaled with the smallest rate it used, as its updates are, down to 1e-14 (float64's
    rounding of the parameters is ~1e-17); a float32 step's is its own."""
    if not step.count or step.tol != TOLERANCE[False]:
        return step.tol
    rates = list(itertools.chain(*step.rates[-2:]))  # before and after each of its two calls
    return max(step.tol * min(1.0, min(rates, default=LR) / LR), 1e-14)


def sums(criterion: Any) -> bool:
    """Whether a criterion sums over the tokens (the Annotated Transformer's KLDivLoss(reduction="sum")):
    twice the rows give twice the loss."""
    x = torch.randn(4, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64).log_softmax(-1)
    t = torch.arange(1, 5)
    try:
        one, two = float(criterion(x, t)), float(criterion(x.repeat(2, 1), t.repeat(2)))
    except Exception:  # noqa: BLE001  (their loss, on inputs it may not take: not a sum then)
        return False
    return abs(two - 2 * one) < 1e-6 * max(1.0, abs(one))


# what the first check compares, after an epoch (True) or after each step (False)
COMPARED = {True: ("the parameters after an epoch of two batches equal handformer's two steps on them",
                   "一个 epoch（两个 batch）之后的参数与 handformer 在这两个 batch 上走两步的结果一致"),
            False: ("the parameters after one and after two steps equal handformer's step on the same "
                    "batches",
                    "走完一步、两步之后的参数，都与 handformer 的训练一步在同样 batch 上的结果一致")}


def _check(comp: Component, ctx: Context, epoch: bool) -> ComponentResult:
    classifier = None if epoch else classifier_roles(comp.obj)
    if classifier:  # train_step(model, images, labels, optimizer): model(images) -> (B, C) logits
        return check_classifier_step(comp, ctx, classifier, clip_norm(source_text(comp.obj), {}))
    own = None if epoch else _on_own_classifier(comp, ctx)
    if own:  # train_step(model, batch, optimizer) on the file's classifier, the batch read by key
        return own
    res = ctx.result(comp)
    step = Step(comp, ctx, epoch)
    base = tiny_model()
    with torch.enable_grad():
        model, got, right, errs = laid_out(step, base)
        res.max_abs_error = max(errs)
        res.checks.append(Check(text(*COMPARED[epoch]), max(errs) < step.tol, error_text(max(errs))))
        _notes(res, step)
        trained = [t for t, _ in model.calls]
        if model.calls and not any(trained):
            res.findings.append(_finding(ctx, comp, "train_step_eval_mode", text(
                f"the model was handed over in eval mode and your step ran all {len(trained)} of its calls "
                "so: dropout stays off in training",
                f"模型交给你时处于 eval 模式，你的一步在全部 {len(trained)} 次调用里都这样运行它："
                "训练时 dropout 一直关着")))
        if max(errs) >= step.tol:
            _search(res, ctx, comp, step, base, got, right, errs, {n for _, n in model.calls})
            note_departure(res, lambda: localize_train_step(
                step, Recorded(copy.deepcopy(base), step.outputs, step.first), *batches()[0], LR))
        if step.clip is not None and not _named(res):  # a loss scale clipping hid, or no mistake named
            _unclipped(res, ctx, comp, step, base)
    if not all(c.ok for c in res.checks) and not _named(res):
        if step.guessed() and not res.named():
            return _guessed(res, step)
        res.notes.append(NO_MISTAKE_NOTE)
    return finish(res)


def _on_own_classifier(comp: Component, ctx: Context) -> ComponentResult | None:
    """The step run on the file's own classifier (own_classifier_step.py) where it takes (model, optimizer,
    batch) and reads the batch by key or field, and the file's classifier was built and run by its own
    check (passing or failing: both steps drive the same model); else None."""
    from handformer.check.runners.classifier import CLASSES, CLASSIFIER_SIZES, check_classifier

    reads = step_reads(comp.obj)
    classifier = ctx.components.get("classifier")
    ran = classifier and getattr(ctx.checked(classifier, check_classifier), "status", None) in (PASS, FAIL)
    said = {"name": comp.name, "model": getattr(classifier, "name", "")}
    if reads is not None and classifier and not ran:  # its classifier, which check could not build: not ours
        raise fp.cannot_call(UNBUILT, UNBUILT_ZH, said)
    if reads is None or not ran:
        return None
    base = ctx.build(classifier, CLASSIFIER_SIZES)
    return check_own_classifier_step(comp, ctx, reads, base, CLASSES, clip_norm(source_text(comp.obj), {}))


UNBUILT = ("{name} reads its batch by key as a classifier's step does, and the file's classifier {model}, "
           "which it trains, could not be built or run (see its own report): write {model}'s adapter")
UNBUILT_ZH = ("{name} 像分类器的训练一步那样按键读取 batch，而它训练的本文件分类器 {model} 无法构建或运行"
              "（见它自己的报告）：给 {model} 写适配函数")


def _guessed(res: ComponentResult, step: Step) -> ComponentResult:
    """A step that departs, no mistake named, whose batch holds fields that name neither a source nor
    a target (a preference pair's chosen_ids and rejected_ids): check filled them by guess, so the
    departure may be its own guess: NOT CHECKED, saying so."""
    said = ", ".join(step.guessed())
    res.findings = []  # its failed check stays: a departure from what check guessed
    res.status = NOT_CHECKED
    res.error = LearnerError("cannot_call", f"its batch holds {said}, which name neither a source nor a "
                             "target: check filled them by guess, and cannot tell what your step computes "
                             "from them (another objective than next-token cross-entropy?), so its update "
                             "was not compared", "forward",
                             message_zh=f"它的 batch 里有 {said}，既不是源序列也不是目标序列：检查只能猜着"
                             "填，无法知道你的一步用它们算什么（不是下一个 token 的交叉熵？），所以没有比较"
                             "它的更新")
    return finish(res)


NO_MISTAKE_NOTE = text("no known mistake (or pair of them) reproduces your parameters; see the checks",
                       "没有任何已知错误（或两个错误的组合）能复现你的参数；请看检查项")


def _named(res: ComponentResult) -> bool:
    """Whether the search named the step's mistake."""
    return any(f.name in NAMED for f in res.findings)


PROBE_SCALE = 1e-3  # the logits' factor at which the gradient norm is measured (it scales with it there)
UNDER_CLIP = 8.0  # the gradients are kept this many times under the clipping norm


def unclipped_scale(step: Step, base: Seq2SeqTransformer) -> float:
    """A factor on the logits that keeps the gradient norm of handformer's first step under
    1/UNDER_CLIP of the clipping norm: a loss k times too large (k <= 8) is then never clipped."""
    model = Recorded(copy.deepcopy(base))
    model.scale = PROBE_SCALE
    src, tgt = batches()[0]
    out = model(src, tgt[:, :-1])  # (B, T - 1, V) log-probabilities
    loss = step.reference_criterion()(out.reshape(-1, V), tgt[:, 1:].reshape(-1))
    norm = gradient_norm(loss, list(model.parameters()))
    return PROBE_SCALE * min(1.0, float(step.clip or 1.0) / (UNDER_CLIP * max(norm, 1e-12)))


def _unclipped(res: ComponentResult, ctx: Context, comp: Component, step: Step, base: Seq2SeqTransformer,
               ) -> None:
    """The step again with its clipping out of reach (the logits scaled down, so the gradients are well
    under the norm it clips to): at full size, clipping gives a loss doubled, or micro-batch losses
    not divided by their number, the same update as the right loss; here the loss's scale shows."""
    step.scale = unclipped_scale(step, base)
    model, got, right, errs = _drive(step, base)
    ok = max(errs) < step.tol
    res.checks.append(rescaled_check("under", float(step.clip or 1.0), step.scale, max(errs), step.tol))
    if not ok:
        res.notes.append(factor_note(base, got[0], right[0]))
        _search(res, ctx, comp, step, base, got, right, errs, {n for _, n in model.calls})


# a step run again with its gradients under the clipping norm (a loss scale shows) or, with SGD, over it
# (a clipping shows): what its parameters equalling handformer's says, en and zh
RESCALED = {
    "under": ("with the gradients under the clipping norm {clip:g} (the logits scaled by {scale:.1e}), "
              "the parameters still equal handformer's: the loss is not scaled",
              "梯度小于裁剪范数 {clip:g} 时（logits 乘以 {scale:.1e}），参数仍与 handformer 的一致："
              "损失没有被放大或缩小"),
    "over": ("with SGD and the gradients over the clipping norm {clip:g} (the logits scaled by {scale:.1e}), "
             "the parameters still equal handformer's: the gradient is clipped",
             "用 SGD、梯度大于裁剪范数 {clip:g} 时（logits 乘以 {scale:.1e}），参数仍与 handformer 的一致："
             "梯度确实被裁剪了"),
}


def rescaled_check(side: str, clip: float, scale: float, err: float, tol: float) -> Check:
    """The check of a step run again with its gradients on one `side` of the clipping norm (RESCALED),
    the logits scaled by `scale`."""
    en, zh = RESCALED[side]
    return Check(text(en.format(clip=clip, scale=scale), zh.format(clip=clip, scale=scale)), err < tol,
                 error_text(err))


def factor_note(base: nn.Module, got: list[Tensor], right: list[Tensor]) -> Text:
    """How many times handformer's first update the learner's is (their projection on it)."""
    start = parameters_of(base)
    mine = torch.cat([(g - s).flatten() for g, s in zip(got, start)])
    theirs = torch.cat([(r - s).flatten() for r, s in zip(right, start)])
    k = float(mine @ theirs / (theirs @ theirs).clamp_min(1e-300))
    return text(f"with clipping out of reach your update is {k:.3g} times handformer's: the loss your step "
                f"backpropagates is {k:.3g} times the batch's mean loss (a loss doubled, or micro-batch "
                "losses not divided by their number: clipping at full size hides it)",
                f"梯度裁剪不起作用时，你的更新量是 handformer 的 {k:.3g} 倍：你的一步反向传播的损失是"
                f"整个 batch 平均损失的 {k:.3g} 倍（损失被乘了 2，或 micro-batch 的损失没有除以它们的个数；"
                "正常大小时梯度裁剪把它掩盖了）")


def _notes(res: ComponentResult, step: Step) -> None:
    if step.clip is not None:
        res.notes.append(clip_note(step.clip))
    res.notes += [SCHEDULER_NOTE] * bool(step.sched) + [SCALER_NOTE] * bool(step.scaler)
    res.notes += [FLOAT32_NOTE] * (step.tol > 1e-9) + [FIRST_NOTE] * step.first
    if step.accum:
        res.notes.append(text(f"{step.accum}={ACCUM}: each batch of 2 sentences in {ACCUM} micro-batches, "
                              "their gradients accumulated before one update",
                              f"{step.accum}={ACCUM}：每个 2 句的 batch 分成 {ACCUM} 个 micro-batch，"
                              "梯度累加后更新一次"))
    res.notes += [PER_TOKEN_NOTE] * step.per_token
    if step.count:
        rates = ", ".join(f"{r:.4g}" for r in step.used_rates())
        when = (("after", "之后"), ("before", "之前"))[step.set_before]
        res.notes.append(text(
            f"your step sets its learning rate from its update count ({step.count}: 1, then 2), {when[0]} "
            f"its update: handformer's step updated at the rates yours used ({rates})",
            f"你的一步按更新次数（{step.count}：先 1 后 2）设置学习率，设置在更新{when[1]}："
            f"handformer 的一步按你用的学习率更新（{rates}）"))
    if step.criterion_name and step.uses_own_criterion():
        res.notes.append(text(f"the criterion is your own {step.criterion_name} (it passes its check), in "
                              "your step and in handformer's", f"损失用的是你自己的 {step.criterion_name}"
                              "（它通过了自己的检查），你的一步和 handformer 的一步都用它"))


FIRST_NOTE = text("your step reads its batches sequence-first, (S, B) and (T, B), as the rest of your file "
                  "lays them out (nn.Transformer's default layout, PyTorch's translation tutorial): handed "
                  "so, the model taking (S, B) and (T, B) ids and giving (T, B, V) log-probabilities",
                  "你的一步按序列维在前的 (S, B) 和 (T, B) 读取 batch，和你文件里其余部分的布局一样"
                  "（nn.Transformer 的默认布局，PyTorch 翻译教程的写法）：按这种布局交给它，"
                  "模型接收 (S, B) 和 (T, B) 的 id，返回 (T, B, V) 的对数概率")
PER_TOKEN_NOTE = text(
    "your loss sums over the tokens and your step divides it by the number of real target tokens (the "
    "Annotated Transformer's SimpleLossCompute): handformer's step divided the same way",
    "你的损失对 token 求和，你的一步再除以目标端真实 token 的个数"
    "（Annotated Transformer 的 SimpleLossCompute）：handformer 的一步也这样除")
VARIANTS: dict[str, dict[str, Any]] = {  # reference_step's arguments that plant each mistake (name:form)
    "train_step_no_zero_grad": {"zero_grad": False}, "train_step_clip_after_step": {"clip_after": True},
    "train_step_no_shift": {"shift": False}, "train_step_loss_not_divided": {"divide": False},
    # the decoder fed tgt[:, :-1] as it should be, but scored on it too, not on tgt[:, 1:]
    "train_step_no_shift:labels": {"shift_labels": False},
    "loss_mean_over_batch": {"per_sentence": True}}  # a summed loss divided by the sentences
NAMED = {key.partition(":")[0] for key in VARIANTS}


def _reproduces(step: Step, base: Seq2SeqTransformer, got: list[list[Tensor]], right: list[list[Tensor]],
                mistakes: dict[str, Any]) -> float:
    """How far the learner's parameters are from handformer's step with the mistakes (inf where the
    mistakes change nothing on these batches)."""
    theirs = _run(step, base, **mistakes)
    if all(largest_difference(t, r) < 1e-12 for t, r in zip(theirs, right)):
        return math.inf
    return max(largest_differences(got, theirs))


def _search(res: ComponentResult, ctx: Context, comp: Component, step: Step, base: Seq2SeqTransformer,
            got: list[list[Tensor]], right: list[list[Tensor]], errs: list[float], lengths: set[int]) -> None:
    full = batches()[0][1].size(1)
    summed = not step.per_token and sums(step.reference_criterion())  # a summed loss, not divided by tokens
    possible = {"train_step_clip_after_step": step.clip is not None,  # the mistakes this step can make
                "train_step_no_shift": lengths == {full}, "train_step_no_shift:labels": lengths == {full - 1},
                "train_step_loss_not_divided": bool(step.accum), "loss_mean_over_batch": summed}
    variants = {name: v for name, v in VARIANTS.items() if possible.get(name, True)}
    combos = [c for n in (1, 2) for c in itertools.combinations(variants, n)]
    # a summed loss read as divided by the real tokens too: the labels' count is the learner's then
    readings = [{}] + [{"per_token": True}] * summed
    for combo in combos:
        mistakes = {k: v for name in combo for k, v in variants[name].items()}
        off = min(_reproduces(step, base, got, right, {**mistakes, **reading}) for reading in readings)
        if off >= step.tol:
            continue
        after = (f"after the epoch they differ from handformer's by {errs[0]:.3g}", f"与 handformer 的相比，"
                 f"epoch 之后相差 {errs[0]:.3g}") if step.epoch else (
            f"after step 1 they differ from handformer's by {errs[0]:.3g}, after step 2 by {errs[1]:.3g}",
            f"与 handformer 的相比，一步之后相差 {errs[0]:.3g}，两步之后相差 {errs[1]:.3g}")
        for key in combo:
            name, _, form = key.partition(":")
            said = text(f"your parameters equal those of a step with this mistake (max abs difference "
                        f"{off:.1e}); {after[0]}",
                        f"你的参数与带这个错误的一步结果一致（最大绝对误差 {off:.1e}）；{after[1]}")
            res.findings.append(_finding(ctx, comp, name, said, form))
        return
