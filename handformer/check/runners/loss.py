"""The runner of the loss: cross-entropy with a pad id, and label-smoothed cross-entropy, as a
function (`masked_cross_entropy(logits, targets, pad_idx)`) or an `nn.Module` criterion (the
Annotated Transformer's `LabelSmoothing(size, padding_idx, smoothing)` with a KL divergence).

The learner's loss is called on log-probabilities (log_softmax is idempotent, so a loss that applies
its own log_softmax to them computes what it would on the logits) of shape (B, T, V) with (B, T)
targets, or flattened to (B * T, V) and (B * T,) when that raises, with the pad id 0 at the end of
two of the three rows, at smoothing 0 and 0.1. It is compared with handformer's
`token_cross_entropy` under each convention, reported as such, never failed: cross-entropy or KL
divergence (they differ by the target distribution's entropy, a constant), the smoothing spread
over all V tokens (PyTorch's label_smoothing), over the V - 1 others, or over the V - 2 that are
neither the target nor the pad (the Annotated Transformer's), and a sum or a mean over the real
tokens. When none matches, the variants with one or two named mistakes are tried (padding counted
in the loss or in its normaliser, a mean over the batch, smoothing mass left on the pad token,
log(0) in a hand-written KL divergence).

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import CRITERION_NAMES, MODEL_NAMES, STEP_MODEL_NAMES
from handformer.check.core.context import (
    Context,
    call_parameters,
    forward_parameters,
    named,
    names_of,
)
from handformer.check.core.conventions import is_lengths_name
from handformer.check.core.defaults import keyword
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import Departure, View, latest_departure, over_axes, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.probe import Found, Probe, Subject, run_probe
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import code_text, locate, source_lines, source_text
from handformer.check.reference.variants import has
from handformer.check.runners.model_loss import check_model_loss
from handformer.check.runners.reward_pair import pairwise
from handformer.training.losses import token_cross_entropy

B, T, V, PAD = 3, 5, 7, 0
LENGTHS = (5, 3, 2)  # real tokens of each row; the rest is padding
INPUT_NAMES = ("logits", "x", "input", "inputs", "pred", "preds", "prediction", "predictions", "output",
               "outputs", "lprobs", "log_probs", "logprobs", "scores", "y_pred", "y_hat", "out")
TARGET_NAMES = ("target", "targets", "labels", "label", "y", "tgt", "gold", "trg", "y_true", "true")
PAD_NAMES = ("pad_idx", "pad_id", "padding_idx", "ignore_index", "pad", "pad_token_id", "pad_index",
             "tgt_pad_idx", "trg_pad_idx")
SMOOTHING_NAMES = ("smoothing", "label_smoothing", "epsilon", "eps", "ls", "alpha", "smooth")
SIZE_NAMES = ("size", "vocab_size", "v", "n_classes", "num_classes", "classes", "tgt_vocab_size",
              "n_vocab", "vocab", "tgt_vocab", "n_class", "num_class")
SPLITS: dict[str, Text] = {
    "v": text("the smoothing spread over all V tokens, the target's too (PyTorch's label_smoothing)",
              "平滑的概率分给全部 V 个 token，包括目标（PyTorch 的 label_smoothing）"),
    "v1": text("the smoothing spread over the V - 1 other tokens", "平滑的概率分给其余 V - 1 个 token"),
    "v2": text("the smoothing spread over the V - 2 tokens that are neither the target nor the pad "
               "(the Annotated Transformer's)",
               "平滑的概率分给既不是目标也不是填充的 V - 2 个 token（Annotated Transformer 的做法）"),
}
FORMS: dict[str, Text] = {
    "ce": text("cross-entropy", "交叉熵"),
    "kl": text("KL divergence (cross-entropy minus the target distribution's entropy, a constant)",
               "KL 散度（交叉熵减去目标分布的熵，是个常数）"),
}
REDUCTIONS: dict[str, Text] = {
    "sum": text("a sum over the real tokens (divide by their number outside, as the Annotated "
                "Transformer's loss compute does)", "对真实 token 求和（在外面再除以 token 数，像 Annotated "
                "Transformer 那样）"),
    "mean": text("a mean over the real tokens", "对真实 token 求平均"),
}
FLAGS = ("loss_counts_padding:normaliser", "loss_counts_padding:loss", "loss_mean_over_batch",
         "smoothing_on_pad", "loss_log_zero")
WHAT = {"loss": (" (the pad targets' losses are in the sum)", "（填充目标的损失算进了总和）"),
        "normaliser": (" (divided by every target, padding included)", "（除以了包括填充在内的全部目标数）")}


def inputs(padded: bool = True) -> tuple[Tensor, Tensor]:
    """(B, T, V) log-probabilities and (B, T) targets, padded with PAD after each row's length (for a
    loss with no way to know the pad, none: its mean over every target is then the right one)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2.0
    targets = torch.randint(1, V, (B, T), generator=g)
    for b, n in enumerate(LENGTHS):
        targets[b, n if padded else T:] = PAD
    return F.log_softmax(logits, dim=-1), targets


def knows_pad(obj: Any) -> bool:
    """Whether a loss has a way to know the pad: a name with "pad" in it (an argument, an attribute, a
    global it reads) or an ignore_index it passes on. CS336's cross_entropy(inputs, targets) has none:
    a mean over every target is right for it."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return True
    words = {getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "arg", None)
             for n in ast.walk(tree)}
    return any("pad" in str(w).lower() or w == "ignore_index" for w in words) or own_ignore(obj) != PAD


# where a loss reads an ignore id: the ignore_index it passes, a label it compares with (a literal, a name)
IGNORE_READS = re.compile(r"(?:\bignore_index\s*=|[!=]=)\s*(-\s*\d+|[A-Za-z_]\w*)")
# a shift inside: one tensor sliced up to its last position, one from position 1 (x[:, :-1], y[..., 1:])
SHIFT_SLICES = (re.compile(r"\[\s*(?:\.\.\.|:)\s*,\s*:\s*-\s*1\s*[],]"),
                re.compile(r"\[\s*(?:\.\.\.|:)\s*,\s*1\s*:\s*[],]"))


def own_ignore(obj: Any) -> int:
    """The negative ignore id a loss reads itself (Hugging Face's labels: -100 outside the scored
    tokens), a literal or a global of its module (IGNORE_INDEX = -100); PAD where it reads none (a
    pad id of the vocabulary is handed as the pad)."""
    names = vars(inspect.getmodule(obj) or object)
    values = [str(names.get(token, token)).replace(" ", "") for token in IGNORE_READS.findall(code_text(obj))]
    return min(map(int, filter(re.compile(r"-\d+").fullmatch, values)), default=PAD)


def shifts_inside(obj: Any) -> bool:
    """Whether a loss shifts its labels itself (Hugging Face's causal LM loss): logits[:, :-1] scored
    against labels[:, 1:]."""
    return all(map(re.Pattern.search, SHIFT_SLICES, [code_text(obj)] * 2))


def target_distribution(targets: Tensor, eps: float, split: str, pad_kept: bool = False) -> Tensor:
    """(..., V) the smoothed distribution the loss compares with; `pad_kept`: the Annotated split
    without zeroing the pad token's column (the mistake smoothing_on_pad)."""
    onehot = F.one_hot(targets, V).double()
    if split == "v":
        return (1 - eps) * onehot + eps / V
    if split == "v1":
        return (1 - eps) * onehot + eps / (V - 1) * (1 - onehot)
    q = (1 - eps) * onehot + eps / (V - 2) * (1 - onehot)
    if not pad_kept:
        q[..., PAD] = 0.0
    return q


def reference(logp: Tensor, targets: Tensor, eps: float, form: str, split: str, reduction: str,
              flags: frozenset[str] = frozenset()) -> float:
    """The loss under a convention, with the named mistakes."""
    counts = has(flags, "loss_counts_padding")
    q = target_distribution(targets, eps, split, "smoothing_on_pad" in flags)
    ce = -(q * logp).sum(-1)  # (B, T)
    if form == "kl":
        if "loss_log_zero" in flags:
            entropy = (q * q.log()).sum(-1)  # 0 * log 0 = NaN, as a hand-written KL computes it
        else:
            entropy = torch.xlogy(q, q).sum(-1)
        per_token = ce + entropy
    else:
        per_token = ce
    real = (targets != PAD).double()
    keep = torch.ones_like(real) if counts == "loss" else real
    total = (per_token * keep).sum()  # a NaN of log(0) spreads: 0 * NaN is NaN
    if "loss_mean_over_batch" in flags:
        return float(total / targets.size(0))
    if reduction == "sum":
        return float(total)
    n = targets.numel() if counts in ("loss", "normaliser") else real.sum()
    return float(total / n)


class StandInGenerator(nn.Module):
    """The generator (hidden states -> log-probabilities) a loss is handed with log-probabilities for
    its states: log_softmax, which leaves them as they are."""

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, dim=-1)


class StandInCriterion(nn.Module):
    """The criterion a loss is handed: the summed cross-entropy of the real tokens (the pad ignored)."""

    def forward(self, scores: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(scores.reshape(-1, V), target.reshape(-1), ignore_index=PAD, reduction="sum")


PARTS = ((("generator",), StandInGenerator), (CRITERION_NAMES, StandInCriterion))


class Loss:
    """The learner's loss, called as its signature says: a function of (input, target, [pad],
    [smoothing]), or a criterion built with (size, pad, smoothing) and called on (input, target)."""

    def __init__(self, comp: Component, ctx: Context) -> None:
        self.comp, self.ctx = comp, ctx
        self.is_class = isinstance(comp.obj, type)
        cls = comp.obj  # a criterion class: built, then called; else a function
        init, params = ((_own_init(cls), call_parameters(cls.forward, ("self",)))
                        if self.is_class else ([], forward_parameters(comp.obj)))
        self.init_names, self.init_required = names_of(init)
        self.names, self.required = names_of(params)
        everything = self.names + self.init_names
        self.smoothing = named(everything, SMOOTHING_NAMES)
        self.pad = named(everything, PAD_NAMES)
        # OpenNMT's compute_loss(output, target, generator, criterion): stand-ins of the parts it is handed
        self.parts = {n: part for n in self.names for names, part in PARTS if n.lower() in names}
        data = [n for n in self.names if n not in self.parts]  # compute_loss(criterion, logits, tgt_out)
        self.input = named(data, INPUT_NAMES) or next(iter(data), None)
        rest = [n for n in data if n != self.input]
        self.target = named(rest, TARGET_NAMES) or next(iter(rest), None)
        size = named(self.init_names, SIZE_NAMES)
        self.lengths = next(filter(is_lengths_name, self.names), None)  # d2l's valid_len: real tokens a row
        known = {self.input, self.target, self.pad, self.smoothing, size, self.lengths, *self.parts}
        found = self.input is not None and self.target is not None
        cannot_fill(comp.name, self.required + self.init_required, known, found, "target", (
            "a loss takes (logits, targets) and optionally a pad id (pad_idx, ignore_index, ...) and a "
            "smoothing (smoothing, label_smoothing, ...); a criterion class takes (size, padding_idx, "
            "smoothing) in its constructor",
            "损失函数接受 (logits, targets)，还可以有 pad id（pad_idx、ignore_index 等）"
            "和平滑系数（smoothing、label_smoothing 等）；"
            "criterion 类在构造函数里接受 (size, padding_idx, smoothing)"))
        self.size = size
        self.flat = self.per_row = False
        self.shifts = shifts_inside(comp.obj)  # logits[:, :-1] against labels[:, 1:], inside
        self.ignore = own_ignore(comp.obj) if self.pad is None else PAD  # -100, read from its own code

    def own_form(self, logp: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """The inputs as the loss reads them: the padding marked with the ignore id it reads itself;
        where it shifts inside, one more position, a last row of logits and a first label that its
        shift drops, so it scores the targets at the positions of the logits (none where it does not)."""
        more = slice(0, int(self.shifts))  # the one position more, or none
        targets = targets.masked_fill(targets == PAD, self.ignore)
        logp = torch.cat([logp, logp[:, -1:][:, more]], dim=1)  # (B, T + 1, V) where it shifts
        return logp, torch.cat([targets[:, :1][:, more], targets], dim=1)  # (B, T + 1) where it shifts

    def options(self, eps: float, pad: int = PAD, size: int = V) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pad id, the smoothing and the vocabulary size it takes (this runner's, or a caller's),
        split into those its constructor takes and those its call takes."""
        given = ((self.pad, pad), (self.smoothing, eps), (self.size, size))  # a name of None: not taken
        init = {name: value for name, value in given if name in self.init_names}
        return init, {name: value for name, value in given if name not in {*init, None}}

    def __call__(self, logp: Tensor, targets: Tensor, eps: float, pad: int = PAD) -> Any:
        def call(x: Tensor, y: Tensor) -> Any:
            init, options = self.options(eps, pad)
            kwargs: dict[str, Any] = {self.input: x.clone(), self.target: y.clone(), **options}
            kwargs.update(keyword(self.lengths, torch.tensor(LENGTHS)))
            kwargs.update({name: part() for name, part in self.parts.items()})
            if self.is_class:
                module = self.ctx.learner.call("__init__", lambda: self.comp.obj(**init))
                if isinstance(module, nn.Module):
                    module.eval()
                fn = module
            else:
                fn = self.comp.obj
            return self.rows(self.ctx.learner.call("forward", fn, **kwargs))

        if not self.flat:
            try:
                return call(*self.own_form(logp, targets))
            except fp.LearnerFailure:
                if self.shifts:  # a loss that shifts inside takes rows: its failure is its own
                    raise
                self.flat = True
        return call(logp.reshape(-1, V), targets.reshape(-1))

    def rows(self, out: Any) -> Any:
        """A loss given valid lengths that returns a loss per row (B,), each its real tokens' losses
        over the length T (d2l's MaskedSoftmaxCELoss: `(loss * weights).mean(dim=1)`), read as their sum
        (the rows' sum times T); any other output as it is."""
        if self.lengths and isinstance(out, Tensor) and tuple(out.shape) == (B,):
            self.per_row = True
            return out.sum() * T
        return out

    def refuses(self, eps: float) -> bool:
        """Whether its constructor raises when built with this smoothing (OpenNMT's LabelSmoothingLoss:
        `assert 0.0 < label_smoothing <= 1.0`)."""
        if self.smoothing not in self.init_names:  # a function's, or a call's: built with none
            return False
        try:
            self.ctx.learner.call("__init__", lambda: self.comp.obj(**self.options(eps)[0]))
        except fp.LearnerFailure:
            return True
        return False


def _own_init(cls: type) -> list[Any]:
    """The constructor's parameters of a criterion class of the learner's file; none for one it
    inherits from torch (d2l's MaskedSoftmaxCELoss(nn.CrossEntropyLoss) keeps torch's defaults: no
    ignore_index, no smoothing given)."""
    init = cls.__init__
    return call_parameters(init, ("self",)) if getattr(init, "__module__", None) == cls.__module__ else []


def _value(ctx: Context, comp: Component, out: Any) -> float:
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], (Tensor, int, float)):
        out = out[0]  # fairseq's (loss, nll_loss): the loss first
    if isinstance(out, Tensor) and out.numel() == 1:
        return float(out.double())
    if isinstance(out, (int, float)):
        return float(out)
    raise ctx.learner.fail("forward", f"{comp.name} returned {_what(out)}; a loss returns one number "
                           "(a scalar tensor)",
                           f"{comp.name} 返回了 {_what(out)}；损失函数返回一个数（标量张量）")


def _what(out: Any) -> str:
    if isinstance(out, Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return type(out).__name__


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "loss")))
    return Finding(name, observed, number, code, form)


class Impossible(RuntimeError):
    """A mistake that cannot go with a convention (smoothing on the pad needs the V - 2 split, a
    log(0) a KL divergence): the search skips the pair."""


Conv = tuple[str, str, str]  # (form, split, reduction)
Inputs = tuple[Tensor, Tensor, tuple[float, ...]]  # log-probabilities, targets, smoothings


def _build(comp: Component, ctx: Context, res: ComponentResult) -> Subject:
    """The learner's loss as its values at each smoothing it takes; its readings the conventions."""
    loss = Loss(comp, ctx)
    splits = SPLITS if loss.smoothing else ("v",)
    convs = [(conv, conv) for conv in itertools.product(FORMS, splits, REDUCTIONS)]

    def run(x: Inputs) -> Tensor:
        logp, targets, smoothings = x
        return torch.tensor([_value(ctx, comp, loss(logp, targets, eps)) for eps in smoothings],
                            dtype=torch.float64)

    padded = knows_pad(comp.obj) or loss.lengths is not None  # lengths say where each row's padding is
    return Subject(run, convs, loss, {"smoothings": _smoothings(loss, res), "padded": padded})


def _smoothings(loss: Loss, res: ComponentResult) -> tuple[float, ...]:
    """The smoothings the loss is read at: 0 and 0.1, 0.1 alone when its constructor refuses 0 (said
    in a note), 0 alone when it takes none."""
    if not loss.smoothing:
        return (0.0,)
    if not loss.refuses(0.0):
        return (0.0, 0.1)
    res.notes.append(text(f"its constructor refuses {loss.smoothing}=0: checked at smoothing 0.1 only",
                          f"它的构造函数不接受 {loss.smoothing}=0：只在平滑系数 0.1 下检查"))
    return (0.1,)


# the mistakes that go with one convention only: (the part of the convention, the one they need)
NEEDS = {"smoothing_on_pad": (1, "v2"), "loss_log_zero": (0, "kl")}  # the V - 2 split; a KL divergence


def _reference(conv: Conv, x: Inputs, flags: frozenset[str]) -> Tensor:
    form, split, reduction = conv
    if any(conv[i] != needed for flag, (i, needed) in NEEDS.items() if flag in flags):
        raise Impossible(conv)
    logp, targets, smoothings = x
    return torch.tensor([reference(logp, targets, eps, form, split, reduction, flags) for eps in smoothings],
                        dtype=torch.float64)


STAND_INS = text("its {} handed stand-ins: a generator that is log_softmax (it is given log-probabilities), "
                 "a criterion that sums the real tokens' cross-entropy; what your function adds (the "
                 "normalisation, the targets' layout) is checked",
                 "它的 {} 传入替身：生成器就是 log_softmax（输入已经是对数概率），criterion 对真实 token "
                 "的交叉熵求和；检查的是你的函数自己做的事（归一化、目标的排布）")


OWN_FORM = {
    "shift": text("it shifts the labels itself (logits[:, :-1] scored against labels[:, 1:]): handed one "
                  "position more, a last row of logits and a first label its shift drops, and compared on "
                  "the positions it scores",
                  "它自己把标签错开一位（logits[:, :-1] 对 labels[:, 1:]）：多给它一个位置，最后一行 logits "
                  "和第一个标签会被它的移位丢掉，只比较它打分的位置"),
    "ignore": text("it reads its own ignore id for the positions it leaves out (-100, Hugging Face's "
                   "labels): the padding handed so marked",
                   "它自己读取不计入损失的 id（-100，Hugging Face 的 labels）：传入的填充位置用它标记"),
}


def _flat_note(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    loss = subject.module
    if subject.module.parts:
        names = ", ".join(subject.module.parts)
        res.notes.append(text(STAND_INS["en"].format(names), STAND_INS["zh"].format(names)))
    if subject.module.per_row:
        res.notes.append(text(f"{comp.name} is handed valid lengths {list(LENGTHS)} and returns a loss per "
                              f"row, read as the rows' sum times T = {T} (d2l's: each row's real tokens' "
                              "losses over the length)",
                              f"{comp.name} 拿到有效长度 {list(LENGTHS)}，返回每行一个损失，按各行之和乘以 "
                              f"T = {T} 来读（d2l 的写法：每行真实 token 的损失除以长度）"))
    res.notes += [OWN_FORM["shift"]] * loss.shifts + [OWN_FORM["ignore"]] * (loss.ignore != PAD)
    if subject.module.flat:
        res.notes.append(text(f"{comp.name} takes flattened (B * T, V) inputs and (B * T,) targets",
                              f"{comp.name} 接受展平的 (B * T, V) 输入和 (B * T,) 目标"))


def _unexplained(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                 ) -> None:
    """The step that, when no convention and no named mistakes give the loss, says so and localizes."""
    if found.matched is not None:
        return _found(res, ctx, comp, subject.module, found)
    res.notes.append(text("no known mistake (or pair of them) reproduces your loss; see the values "
                          "below", "没有任何已知错误（或两个错误的组合）能复现你的损失；请看下面的数值"))
    res.checks.append(Check(text("the loss equals handformer's token_cross_entropy in some convention",
                                 "损失在某种约定下等于 handformer 的 token_cross_entropy"), False))
    logp, targets, smoothings = found.x
    eps, loss = smoothings[-1], subject.module
    note_departure(res, lambda: localize_loss(lambda x: loss(x, targets, eps), comp.obj, logp, targets, eps,
                                              PAD))


RELABEL = torch.tensor([3, 1, 2, 0, 4, 5, 6])  # ids 0 and 3 swapped: the pad is 3, a real target 0


def _relabelled(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    """The step that, for a correct loss handed its pad id, relabels the vocabulary (the pad id 3, a
    real token id 0, the log-probabilities' columns swapped alike): cross-entropy is the same, so the
    loss must be; a mask written as targets != 0 (or > 0) drops the real 0s and counts the pads."""
    loss, (logp, targets, smoothings) = subject.module, found.x
    if found.matched is None or found.flags or loss.pad is None or not subject.facts["padded"] or loss.parts:
        return  # (stand-ins handed for its generator or criterion hold the pad id 0 themselves)
    pad = int(RELABEL[PAD])
    got = torch.tensor([_value(ctx, comp, loss(logp[..., RELABEL], RELABEL[targets], eps, pad))
                        for eps in smoothings], dtype=torch.float64)
    err = fp.relative_error(got, found.out)
    ok = err < fp.REL_TOL
    res.checks.append(Check(text(f"with the vocabulary relabelled (the pad id {pad}, a real token id 0), "
                                 "the loss is the same",
                                 f"词表重新编号后（填充 id 为 {pad}，真实 token 的 id 为 0），损失不变"), ok))
    res.findings += [] if ok else [_finding(ctx, comp, "mask_pad_id", text(
        f"relabelled, the loss is {got[-1]:.5g}, not {found.out[-1]:.5g}: the real targets of id 0 are "
        f"left out or the pads of id {pad} counted",
        f"重新编号后损失是 {got[-1]:.5g}，不是 {found.out[-1]:.5g}：id 为 0 的真实目标被去掉了，"
        f"或者 id 为 {pad} 的填充被算了进去"))]


def _values_step(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
    res.notes.append(_values(found))
    res.max_abs_error = 0.0 if found.matched is not None and not found.flags and not res.findings else None


# the mistakes searched, by whether the loss takes flattened inputs (then no batch to take a mean over)
UNIVERSE = {False: FLAGS, True: tuple(f for f in FLAGS if f != "loss_mean_over_batch")}
LOSS = Probe(
    build=_build,                           # the function or criterion, called as its signature says
    inputs=lambda s: (*inputs(s.facts["padded"]), s.facts["smoothings"]),
    shape=lambda ctx, comp, s, x, out: None,  # one number per smoothing: _value refuses anything else
    reference=_reference,                   # handformer's cross-entropy in a convention, with mistakes
    universe=lambda s: UNIVERSE[s.module.flat],
    steps=(_flat_note, _unexplained, _relabelled, _values_step),
    error=fp.relative_error, tol=fp.REL_TOL, deterministic=False,
)


def check_loss(comp: Component, ctx: Context) -> ComponentResult:
    """Cross-entropy with a pad id, or label-smoothed, as the LOSS probe states it. A loss that calls
    its first argument, named as a model, takes the model, not the logits (`compute_loss(model,
    tokens)`): driven with a stand-in model (model_loss)."""
    first = next(iter(call_parameters(comp.obj)), None)
    name = getattr(first, "name", "")
    used = re.search(rf"(?<![.\w]){name}\s*[(,)]", source_text(comp.obj))  # model(x), or yours(model, tokens)
    if name in MODEL_NAMES + STEP_MODEL_NAMES and used or pairwise(comp.obj) and used:
        return check_model_loss(comp, ctx)  # (a reward model's pairwise loss, whatever its model's name)
    return run_probe(LOSS, comp, ctx)


def _found(res: ComponentResult, ctx: Context, comp: Component, loss: Loss, found: Found) -> None:
    """The convention found, the check against handformer's in it, and each named mistake."""
    (form, split, reduction), flags, (_, targets, smoothings) = found.key, found.flags, found.x
    got = dict(zip(smoothings, found.out.tolist()))
    at = ", ".join(f"{e:g}" for e in smoothings)
    parts = [FORMS[form]] + ([SPLITS[split]] if loss.smoothing else []) + [REDUCTIONS[reduction]]
    res.convention = text("; ".join(p["en"] for p in parts), "；".join(p["zh"] for p in parts))
    res.checks.append(Check(text(f"the loss equals handformer's token_cross_entropy in your convention "
                                 f"at smoothing {at}",
                                 f"平滑为 {at} 时，按你的约定，损失等于 handformer 的 token_cross_entropy"),
                            not flags))
    correct = dict(zip(smoothings, found.reference(frozenset()).tolist()))
    shown = ", ".join(f"{got[e]:.4g} (right: {correct[e]:.4g})" for e in smoothings)
    shown_zh = "，".join(f"{got[e]:.4g}（正确值 {correct[e]:.4g}）" for e in smoothings)
    pads, n = int((targets == PAD).sum()), targets.numel()
    for flag in sorted(flags):
        name, _, fform = flag.partition(":")
        en, zh = WHAT.get(fform, ("", ""))
        res.findings.append(_finding(ctx, comp, name, text(
            f"your loss equals the one with this mistake{en} at smoothing {at} (relative difference "
            f"< 1e-5): {shown}, with {pads} of {n} targets padding",
            f"平滑为 {at} 时你的损失与带这个错误的损失一致{zh}（相对误差 < 1e-5）：{shown_zh}；"
            f"{n} 个目标里有 {pads} 个是填充"), fform))


def _values(found: Found) -> Text:
    """The learner's values beside handformer's mean over the real tokens."""
    logp, targets, smoothings = found.x
    got = dict(zip(smoothings, found.out.tolist()))
    right = {eps: token_cross_entropy(logp.float(), targets, PAD, eps).item() / int((targets != PAD).sum())
             for eps in smoothings}
    values_en = "; ".join(f"smoothing {e:g}: {got[e]:.6g} (handformer's mean over real tokens {right[e]:.6g})"
                          for e in smoothings)
    values_zh = "；".join(f"平滑 {e:g}：{got[e]:.6g}（handformer 对真实 token 的平均 {right[e]:.6g}）"
                          for e in smoothings)
    return text(f"values: {values_en}", f"数值：{values_zh}")


# --- the loss -------------------------------------------------------------------------------------

def loss_views(logp: Tensor, targets: Tensor, eps: float, conv: tuple[str, str, str], pad: int,
               ) -> list[View]:
    """The loss under one convention (cross-entropy or KL; the smoothing's split; sum or mean): the
    target distribution, q·log p, the per-token loss and its parts, the real-token mask, the sum and
    the mean; each in the (B, T, ...) and the flattened (N, ...) layout."""
    form, split, reduction = conv
    q = target_distribution(targets, eps, split)  # (B, T, V)
    nll = -logp.gather(-1, targets[..., None])[..., 0]  # (B, T)
    real = (targets != pad).double()  # (B, T)
    per_token = -(q * logp).sum(-1)
    views = [("the log-probabilities", logp), ("the target distribution q", q), ("q·log p", q * logp),
             ("-log p of the target", nll), ("the smoothing term -mean(log p)", -logp.mean(-1)),
             ("the real-token mask (1 = a real target)", real), ("the cross-entropy per token", per_token)]
    if form == "kl":
        per_token = per_token + torch.xlogy(q, q).sum(-1)
        views += [("q (log q - log p)", torch.xlogy(q, q) - q * logp),
                  ("the KL divergence per token", per_token)]
    total = (per_token * real).sum()
    views += [("the per-token loss, padding zeroed", per_token * real),
              ("the sum over the real tokens", total)]
    if reduction == "mean":
        views.append(("the mean over the real tokens", total / real.sum()))
    return views + [(f"{what} (flattened)", t.reshape(-1, *t.shape[2:])) for what, t in views if t.dim() >= 2]


def localize_loss(call: Callable[[Tensor], Any], fn: Any, logp: Tensor, targets: Tensor, eps: float,
                  pad: int) -> Departure | None:
    """Run the learner's loss on logp traced (constants too: a target distribution built in place);
    the first step that no convention explains."""
    filename = inspect.getsourcefile(fn)
    x = logp.detach().clone().requires_grad_()
    steps = trace_steps(lambda: call(x), filename, None, (), constants=True)
    readings = [loss_views(logp, targets, eps, conv, pad)
                for conv in itertools.product(FORMS, SPLITS if eps else ("v",), REDUCTIONS)]
    n, real = targets.numel(), int((targets != pad).sum())
    sizes = {"V": logp.size(-1), "B": targets.size(0), "N (every target)": n, "the real targets": real,
             "real / every target": real / n}
    forms = over_axes("the log-softmax", "log-softmax", lambda d: torch.log_softmax(logp, d), logp.dim())
    return latest_departure(steps, readings, filename, sizes, forms=forms)
