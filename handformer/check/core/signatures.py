"""Free functions found by what they do, whatever their name: a generation loop
`generate_text_simple(model, idx, max_new_tokens, context_size)`, a filter `nucleus(logits, p)`, a
sampler `draw(probs, p)`, a training step `update(model, batch, optimizer)`, an encoder-decoder's
greedy decoder `translate(model, src, src_mask, max_len, start_symbol)`.

A function is taken as a kind only when every argument it requires is one that kind's runner fills
(so a function found this way is never NOT CHECKED for its signature); a function of logits (or
probabilities) only when a call on a few rows returns what that kind returns: token ids (a sampler;
the argmax every time: greedy), the same rows with some entries removed and the others kept as they
were (a filter), or the rows scaled (temperature). A function that is none of these is left alone.

Shape legend: B rows, V vocabulary.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import io
import itertools
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.argument_names import (
    ACCUM_NAMES,
    BATCH_NAMES,
    BEAM_NAMES,
    CACHE_SWITCH_NAMES,
    CLIP_NAMES,
    CONTEXT_NAMES,
    COUNT_NAMES,
    CRITERION_NAMES,
    DECODING_NAMES,
    EOS_NAMES,
    GENERATOR_NAMES,
    K_NAMES,
    LOADER_NAMES,
    LOGITS_NAMES,
    LR_NAMES,
    MESSAGE_NAMES,
    MIN_P_NAMES,
    MODEL_NAMES,
    ONE_CYCLE_ARGS,
    OPTIMIZER_LIST_NAMES,
    OPTIMIZER_NAMES,
    P_NAMES,
    PROBS_NAMES,
    PROMPT_NAMES,
    SCALER_NAMES,
    SCHEDULE_ARGS,
    SCHEDULE_STEP_NAMES,
    SCHEDULER_NAMES,
    SRC_NAMES,
    STEP_MODEL_NAMES,
    TEMPERATURE_NAMES,
    TGT_NAMES,
    TOKENIZER_NAMES,
    X_NAMES,
    Y_NAMES,
    call_parameters,
    named,
    names_of,
)
from handformer.check.core.defaults import quietly
from handformer.check.core.keyed_batch import keyed_batch
from handformer.check.core.processors import PROCESSOR_NAMES, own_call, own_method, posing_as
from handformer.check.core.source import config_reads, source_text
from handformer.check.core.special_ids import DEVICE_NAMES

ROWS = torch.tensor([[2.0, 1.2, 0.8, 0.3, 0.0, -0.4, -1.0, -1.6],
                     [0.5, 2.5, -0.3, 1.1, 0.9, -2.0, 0.2, -0.7]])  # (B, V) logits, no ties
OPTION_VALUES = {"top_k": 3, "top_p": 0.8, "temperature": 0.7, "min_p": 0.1}


def _signature(fn: Any) -> tuple[list[inspect.Parameter], list[str], set[str]]:
    """fn's named parameters, their lowered names and the required ones; none when it has no
    signature Python can read (it is then no kind)."""
    params = quietly(lambda: call_parameters(fn), (TypeError, ValueError), [])
    names, required = names_of(params)
    return params, [n.lower() for n in names], {n.lower() for n in required}


def kind_of(fn: Any) -> str | None:
    """The kind a free function is by its signature (and, for a function of logits, by a call), or
    None."""
    params, names, required = _signature(fn)
    if lm_step(fn):
        return "lm_train_step"
    if lm_loop(fn):
        return "lm_train_loop"
    if mask_kind(fn):
        return mask_kind(fn)
    configs = _config_fields(fn, required - set(names[:1]) - set().union(*SCHEDULE_ARGS.values()))
    if _schedule(names + sum(configs.values(), []), required - set(configs)) or schedule_maker(fn) or (
            _inverse_sqrt(fn, names, required)):
        return "schedule"
    return _loop_kind(names, required) or _logits_kind(fn, params, names, required)


# what a mask function computes: a triangle of positions (tril, triu, or positions compared), and
# padding (a pad id it takes or reads)
# positions against positions
TRIANGLE_CODE = re.compile(r"\b(tril|triu)_?\b|arange\([^\n]*[<>]=?[^\n]*arange\("
                           # two position rows bound apart, then compared (Gemma 2's `causal = j <= i`)
                           r"|arange\([\s\S]*arange\([\s\S]*\n\s*\w+\s*=\s*\w+\s*[<>]=?\s*\w+\s*(#.*)?\n")
# an argument that tells a packed row's documents apart (pieces.DOCUMENTS hands it two documents)
DOCUMENT_ARGUMENT = re.compile(r"(?i)doc|segment|seq_?id|sample_?id|packed")
PAD_CODE = re.compile(r"(?i)pad(?!\s*\()")  # a pad id or padding, not a call padding an array (np.pad)


def mask_kind(fn: Any) -> str | None:
    """A function named as a mask (`make_subsequent_mask`, `get_subsequent_mask`,
    `make_decoder_mask`), taken by what its code computes: a mask helper where it reads padding, a
    causal mask function where it builds a triangle of positions alone; None otherwise (a function
    that applies a mask)."""
    name = getattr(fn, "__name__", "").lower()
    code = source_text(fn)
    if "mask" not in name or not inspect.isfunction(fn) or "softmax" in name or _per_head(fn):
        return None
    if TRIANGLE_CODE.search(code) and any(map(DOCUMENT_ARGUMENT.search, _signature(fn)[1])):
        return "causal_mask"  # a document-causal mask of packed rows (its padding a document of its own)
    if PAD_CODE.search(code):
        return "mask_helper"
    return "causal_mask" if TRIANGLE_CODE.search(code) else None


def _per_head(fn: Any) -> bool:
    """A function handed a number of heads builds a bias per head (Baichuan's _gen_alibi_mask(n_head,
    max_pos): ALiBi with the triangle added), not a mask, the same for every head."""
    return any("head" in name.lower() for name in _signature(fn)[1])


SCHEDULE_FIRST = SCHEDULE_STEP_NAMES + OPTIMIZER_NAMES  # a schedule's step, a scheduler factory's optimizer


def _config_fields(fn: Any, args: set[str]) -> dict[str, list[str]]:
    """The fields fn reads from each of its arguments `args` that it reads fields or keys of (nanoGPT's
    get_lr(it, cfg): cfg.warmup_iters; cfg["grad_clip"]), lowered."""
    fields = {name: sorted(map(str.lower, set().union(*config_reads(fn, name)))) for name in args}
    return dict(filter(lambda item: item[1], fields.items()))  # the arguments it reads fields of


def _schedule(names: list[str], required: set[str]) -> bool:
    """A learning-rate schedule (`warmup_cosine(step, warmup, max_steps, max_lr, min_lr)`), or a factory
    of a torch scheduler (`cosine_with_warmup(optimizer, num_warmup_steps, num_training_steps)`, Hugging
    Face's): the step or the optimizer first, then settings only, a warmup among them and d_model, an
    end, a floor or a stable stage (a warmup-stable-decay schedule)."""
    settings = SCHEDULE_ARGS
    known = set().union(*settings.values())
    has = lambda key: _takes_each(names[1:], [settings[key]])  # noqa: E731
    # a warmup of its own, or one-cycle's: a fraction of the run, from and to divisors of the peak
    cycle = _takes_each(names[1:], list(ONE_CYCLE_ARGS.values())) and has("total")
    ends = has("d_model") or has("total") or has("min_lr") or has("stable")
    return (bool(names) and names[0] in SCHEDULE_FIRST and required - {names[0]} <= known
            and (has("warmup") or cycle) and ends)


INVERSE_SQRT_CODE = re.compile(r"\*\*\s*\(?\s*-\s*0?\.5|\bsqrt\b|rsqrt")


def _inverse_sqrt(fn: Any, names: list[str], required: set[str]) -> bool:
    """fairseq's inverse_sqrt written as a function of the step and its settings (`inverse_sqrt_lr(step,
    base_lr, warmup)`): the step first, a warmup among the settings, and an inverse square root in its
    code."""
    known = set().union(*SCHEDULE_ARGS.values())
    return (bool(names) and names[0] in SCHEDULE_FIRST and required - {names[0]} <= known
            and _takes_each(names[1:], [SCHEDULE_ARGS["warmup"]])
            and bool(INVERSE_SQRT_CODE.search(source_text(fn))))


def schedule_signature(fn: Any) -> bool:
    """Whether a function takes a step and a schedule's settings alone (a warmup among them)."""
    _, names, required = _signature(fn)
    return _schedule(names, required)


def schedule_class(cls: Any) -> type | None:
    """A learning-rate schedule written as a class (the TensorFlow tutorial's `CustomSchedule(d_model,
    warmup_steps)` whose `__call__(step)` returns the rate) as a function of the step and the
    constructor's settings, placed and named as the class (as processors.as_filter); None when its own
    `__call__` takes more or other than a step, or the settings are not a schedule's."""
    step = _one_step(own_call(cls))
    if step is None:
        return stepped_scheduler(cls)

    def new(_: type, **arguments: Any) -> Any:
        at = arguments.pop(step)
        return cls(**arguments)(at)

    try:  # a constructor of C: no schedule of this form
        settings = call_parameters(cls.__init__, ("self",))
    except ValueError:
        return None
    return _posed(cls, new, step, settings)


def stepped_scheduler(cls: Any) -> type | None:
    """A scheduler class built on the optimizer whose own `step(epoch)` takes the step and writes the
    rate into the optimizer (timm's `CosineLRScheduler(optimizer, t_initial, ...)`) as a function of the
    step and the constructor's other settings: built on an SGD of lr 1, stepped to the step, the rate
    its group holds (placed and named as the class); None for any other class."""
    step = _one_step(own_method(cls, "step"))
    try:
        settings = call_parameters(cls.__init__, ("self",))
    except ValueError:  # a constructor of C: no scheduler of the learner's
        return None
    if step is None:
        return counted_scheduler(cls, settings)
    if not settings or settings[0].name.lower() not in OPTIMIZER_NAMES:
        return None

    def new(_: type, **arguments: Any) -> float:
        at = arguments.pop(step)
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        cls(optimizer, **arguments).step(at)
        return optimizer.param_groups[0]["lr"]

    return _posed(cls, new, step, settings[1:])


def counted_scheduler(cls: Any, settings: list[inspect.Parameter]) -> type | None:
    """A class that wraps the optimizer and counts the steps itself (the Annotated Transformer's
    `NoamOpt(model_size, factor, warmup, optimizer)`, `ScheduledOptim(optimizer, lr_mul, d_model,
    n_warmup_steps)`): its one method of no arguments whose name begins with `step` raises the count and
    writes the rate into the optimizer. Read as a function of the step: built on an SGD of lr 1, that
    method called step + 1 times (the rate of the update at that step, counted from 0), the rate its
    group holds; None for any other class."""
    names = [p.name for p in settings]
    wrapped = named(names, OPTIMIZER_NAMES)  # the optimizer's argument, wherever it stands
    steppers = [n for n in dir(cls) if n.startswith("step") and own_method(cls, n).__name__ == n
                and not call_parameters(own_method(cls, n), ("self",))]  # step(), step_and_update_lr()
    if (wrapped is not None, len(steppers)) != (True, 1):  # one optimizer and one stepper
        return None

    def new(_: type, **arguments: Any) -> float:
        at = arguments.pop("step")
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        scheduler = cls(**{wrapped: optimizer}, **arguments)
        for _ in range(int(at) + 1):
            getattr(scheduler, steppers[0])()
        return optimizer.param_groups[0]["lr"]

    return _posed(cls, new, "step", settings[:names.index(wrapped)] + settings[names.index(wrapped) + 1:])


def _one_step(method: Any) -> str | None:
    """The name of a method's one argument where it is a step (`step`, `epoch`, ...); None otherwise."""
    names = [p.name for p in call_parameters(method, ("self",))]
    return names[0] if len(names) == 1 and names[0].lower() in SCHEDULE_STEP_NAMES else None


def _posed(cls: Any, new: Any, step: str, settings: list[inspect.Parameter]) -> type | None:
    """`new` placed and named as the class, taking the step then the settings, where that is a
    schedule's signature; None otherwise (positional-only settings cannot follow the step)."""
    try:
        signature = inspect.Signature([inspect.Parameter(step, inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                       *settings])
    except ValueError:
        return None
    fn = posing_as(cls, new, signature)
    return fn if schedule_signature(fn) else None


def schedule_maker(fn: Any) -> bool:
    """A function of a schedule's settings alone that returns the schedule as a function of the step
    (`linear_warmup_decay(num_warmup_steps, num_training_steps)` returning its `lr_lambda`, for a
    LambdaLR)."""
    _, names, required = _signature(fn)
    return bool(names) and names[0] not in SCHEDULE_FIRST and _schedule(["step", *names], required) and (
        returns_function(fn))


def returns_function(fn: Any) -> bool:
    """Whether a function returns a lambda or a function it defines inside."""
    code = source_text(fn)
    inner = re.findall(r"^\s+def (\w+)\(", code, re.M)
    return bool(re.search(r"\breturn\s+lambda\b", code)) or any(
        re.search(rf"\breturn\s+{name}\s*(#|$)", code, re.M) for name in inner)


DECODER_INPUT = re.compile(r"\[\s*:\s*,\s*:-1\s*\]")  # an encoder-decoder's tgt[:, :-1]
# labels a language model's step moves on by one itself (torchtune's recipe: labels[..., 1:]), scored
# with the loss it is handed (loss_fn)
LABELS_MOVED = re.compile(r"\[\s*(\.\.\.|:)\s*,\s*1\s*:\s*\]")


def lm_step(fn: Any) -> bool:
    """A decoder-only model's training step, whatever its name (`train_step(model, optimizer, x, y)`):
    it takes the model, the optimizer and the windows x and y (y already x moved on by one) or a loader
    it draws them from (drawn_loader), maybe the learning rate, the micro-steps and a scheduler, and
    never shifts a target itself (an encoder-decoder's step feeds tgt[:, :-1]) unless it cuts its
    windows from one batch (token_batch, keyed_batch)."""
    _, names, required = _signature(fn)
    loader = drawn_loader(fn) or iterated_loader(fn)
    windows = ((loader.lower(),),) if loader else (X_NAMES, Y_NAMES)
    tokens = token_batch(fn) or keyed_batch(fn)
    windows = (BATCH_NAMES + TOKEN_NAMES,) if paired_batch(fn) or tokens else windows
    optimizers = OPTIMIZER_NAMES + OPTIMIZER_LIST_NAMES
    groups = (STEP_MODEL_NAMES, optimizers, *windows)
    if not _takes_each(names, groups):
        groups = (STEP_MODEL_NAMES, optimizers)  # its windows drawn from its file's get_batch
        if not (_takes_each(names, groups) and drawn_global(fn)):
            return False
    rest = required - set().union(*groups, LR_NAMES, ACCUM_NAMES, SCHEDULER_NAMES, SCALER_NAMES, CLIP_NAMES)
    # nanoGPT's train_step(model, optimizer, X, Y, iter_num, cfg): the iteration and a configuration
    rest -= set(SCHEDULE_STEP_NAMES) | set(_config_fields(fn, rest)) | set(schedule_settings(fn))
    source = source_text(fn)
    if LABELS_MOVED.search(source):
        rest -= set(CRITERION_NAMES)
    return not rest and (tokens is not None or not DECODER_INPUT.search(source))


def lm_loop(fn: Any) -> bool:
    """A language model's training loop that builds the optimizer it steps (nanoGPT's train.py as a
    function, `optimizer = configure_optimizers(model, ...)`): it takes the model and maybe its data,
    draws its windows from a function of its file (drawn_global) and backpropagates."""
    _, names, required = _signature(fn)
    code = source_text(fn)
    built = re.search(r"(?m)^\s*(\w*opt\w*)\s*=\s*[\w.]+\(", code)
    opt = built and built.group(1)  # stepped itself, or by a loss scaler: scaler.step(optimizer)
    steps = opt and re.search(rf"\b{opt}\.step\(|\.step\(\s*{opt}\s*\)", code) and ".backward(" in code
    data = set(STEP_MODEL_NAMES + BATCH_NAMES + LOADER_NAMES + TOKEN_NAMES)  # what it may be handed
    return bool(steps and _takes_each(names, (STEP_MODEL_NAMES,)) and not required - data
                and not set(names) & set(OPTIMIZER_NAMES) and drawn_global(fn, handed=True))


# what a schedule's settings are handed where a step hands them on (schedule_settings): a few short stages
SETTING_VALUES = {"max_lr": 0.02, "min_lr": 0.002, "init_lr": 0.0, "warmup": 2, "stable": 2, "decay": 4,
                  "total": 10, "d_model": 64, "factor": 1.0}


def schedule_settings(fn: Any) -> dict[str, dict[str, Any]]:
    """The arguments fn hands on as the keyword arguments of a schedule of its file (MiniCPM-style
    `lr = wsd_lr(step, **sched)`), each with the settings that fill it (_settings)."""
    names, own = set(names_of(call_parameters(fn))[0]), getattr(fn, "__globals__", {})
    found = {name: _settings(own.get(callee), before.count(","))
             for callee, before, name in SPLAT.findall(source_text(fn)) if name in names}
    return {name: settings for name, settings in found.items() if settings}


SPLAT = re.compile(r"\b(\w+)\(([^()]*?)\*\*(\w+)\s*\)")  # f(a, b, **name): f, "a, b, ", name
SETTING_OF = {alias: key for key, aliases in reversed(SCHEDULE_ARGS.items()) for alias in aliases}


def _settings(callee: Any, given: int) -> dict[str, Any] | None:
    """A function's parameters after the `given` a call names, those without a default, each a value of
    SETTING_VALUES by its name; None where one has none."""
    params = call_parameters(callee)[given:] if inspect.isfunction(callee) else []
    keys = {p.name: SETTING_OF.get(p.name.lower()) for p in params if p.default is p.empty}
    return None if None in keys.values() else {name: SETTING_VALUES[key] for name, key in keys.items()}


def token_batch(fn: Any) -> str | None:
    """The batch a step takes as one tensor of token windows (B, T + 1) that it cuts into micro-batches
    or shifts itself (`batch.chunk(accum)`, `batch[:, :-1]`): inputs and targets are made from it; or
    token ids it shifts itself where it takes no targets (MiniCPM-style `model(input_ids[:, :-1])`), or
    hands its model as the labels too (Hugging Face's `model(input_ids, labels=input_ids)`)."""
    found = _argument_used(fn, BATCH_NAMES, r"\b{0}\.(?:chunk|split)\(|torch\.(?:chunk|split)\(\s*{0}\b|"
                                            r"\b{0}\[\s*:\s*,\s*(?::-1|1:)\s*\]")
    alone = not set(_signature(fn)[1]) & set(Y_NAMES)  # no targets handed
    return found or _argument_used(fn, TOKEN_NAMES * alone, r"\b{0}\[\s*:\s*,\s*(?::-1|1:)\s*\]|"
                                                            r"\blabels\s*=\s*{0}\b")


TOKEN_NAMES = ("input_ids", "tokens", "ids", "token_ids")  # token ids a step shifts itself


def drawn_loader(fn: Any) -> str | None:
    """The loader a step draws its (x, y) windows from one at a time (build-nanogpt's
    `x, y = train_loader.next_batch()`, `next(data_iter)`), not one it iterates over (an epoch)."""
    return _argument_used(fn, LOADER_NAMES, r"\b{0}\.next_batch\(|\bnext\(\s*{0}\b")


def iterated_loader(fn: Any) -> str | None:
    """The loader an epoch of a language model's steps iterates over, its (x, y) windows handed to the
    model together (`for step, (x, y) in enumerate(loader): _, loss = model(x, y)`: nanoGPT's forward
    scores its own targets), micro-batches to accumulate (`for x, y in micro_batches:`, whatever the
    argument's name: the loop says what it is); a classifier's model takes its inputs alone."""
    handed = {p.name for p in _signature(fn)[0]}
    return _argument_used(fn, None, WINDOWS_LOOP) or next(
        (loader for _, _, loader, loss in re.findall(OWN_LOSS_LOOP, source_text(fn))
         if loader in handed and _flattens_targets(getattr(fn, "__globals__", {}).get(loss))), None)


# `for x, y in {loader}:`, the model handed x alone, then y handed to a function (the file's own loss):
# (the loader, that function's name)
OWN_LOSS_LOOP = (r"for\s+(?:\w+\s*,\s*)?\(?\s*(?P<x>\w+)\s*,\s*(?P<y>\w+)\s*\)?\s+in\s+(?:enumerate\(\s*)?"
                 r"(\w+)\b[\s\S]*?\b\w+\(\s*(?P=x)\s*\)[\s\S]*?\b(\w+)\([^()\n]*\b(?P=y)\b")


def _flattens_targets(loss: Any) -> bool:
    """A function of the learner's file that scores its targets flattened over the tokens (a language
    model's `F.cross_entropy(logits.view(-1, V), targets.reshape(-1))`; a classifier's targets are flat)."""
    flat = re.compile(r"\w\.(?:view|reshape)\(\s*-1\s*\)")
    return inspect.isfunction(loss) and bool(flat.search(source_text(loss)))


def accumulated_loader(fn: Any) -> str | None:
    """The iterated loader of a step that updates once after its loop over it (the optimizer's step
    written outside the loop's body): one step's micro-batches, their gradients accumulated."""
    loader, code = iterated_loader(fn), source_text(fn)
    loop = loader and re.search(rf"(?m)^([ \t]*)for\b[^\n]*\bin\s+(?:enumerate\(\s*)?{loader}\b", code)
    update = re.search(r"(?m)^([ \t]*)(?:\w+\.)*\w*opt\w*\.step\(", code)
    return loader if loop and update and len(update.group(1)) <= len(loop.group(1)) else None


# `for i, (x, y) in enumerate({0})` (or `for x, y in {0}`), then a call handed x and y: model(x, y)
WINDOWS_LOOP = (r"for\s+(?:\w+\s*,\s*)?\(?\s*(\w+)\s*,\s*(\w+)\s*\)?\s+in\s+(?:enumerate\(\s*)?{0}\b"
                r"[\s\S]*\b\w+\(\s*\1\s*(?:,\s*(?:\w+\s*=\s*)?\2\s*\)"
                # or the model handed x alone, its loss scoring y flattened over the tokens (a language
                # model's `F.cross_entropy(logits.view(-1, V), y.view(-1))`; a classifier's y is flat)
                r"|\)[\s\S]*\b\2\.(?:view|reshape)\(\s*-1\s*\))")


def drawn_global(fn: Any, handed: bool = False) -> str | None:
    """The function of the step's own file it draws its (x, y) windows from, handed none of the step's
    arguments (`xb, yb = get_batch('train')` in the Chinese walkthroughs of Karpathy's lecture), or any
    where `handed` (a loop's `get_batch(data)`: its data is handed on): its name, or None."""
    names = {p.name for p in _signature(fn)[0]} - {p.name for p in _signature(fn)[0] if handed}
    called = re.findall(r"(?m)^\s*\w+\s*,\s*\w+\s*=\s*(\w+)\(([^()]*)\)", source_text(fn))
    scope = getattr(fn, "__globals__", {})
    own = (n for n, args in called if n not in names and not names & set(re.findall(r"\w+", args))
           and inspect.isfunction(scope.get(n)) and scope[n].__module__ == fn.__module__)
    return next(own, None)


def paired_batch(fn: Any) -> str | None:
    """The batch a step unpacks into its two windows (`X, Y = batch`, nanoGPT's get_batch pair)."""
    return _argument_used(fn, BATCH_NAMES, r"(?m)^\s*\w+\s*,\s*\w+\s*=\s*{0}\s*(?:#.*)?$")


def _argument_used(fn: Any, aliases: tuple[str, ...] | None, pattern: str) -> str | None:
    """The first argument of fn named as one of `aliases` (None: any) that its code uses as `pattern`
    says (`{0}`: the argument's name); None where none is."""
    code = source_text(fn)
    return next((p.name for p in _signature(fn)[0] if (aliases is None or p.name.lower() in aliases)
                 and re.search(pattern.format(p.name), code)), None)


GENERATE_MODEL = tuple(n for n in MODEL_NAMES if n != "self")
BEAM_WIDTH = ("beam_size", "beam_width", "num_beams", "beam", "n_beams", "beams")  # not k: a sampler's top-k
STEP = (STEP_MODEL_NAMES, OPTIMIZER_NAMES, CRITERION_NAMES, ACCUM_NAMES, CLIP_NAMES)
STEP_BATCH = (*STEP, BATCH_NAMES, SRC_NAMES, TGT_NAMES)
# (kind, what its first argument must be called (any: ()), the groups it must take one of each, the
# groups its runner fills), tried in order
LOOP_KINDS = (
    ("beam_search", (), [BEAM_NAMES["model"], BEAM_NAMES["src"], BEAM_NAMES["beam"], BEAM_NAMES["start"]],
     tuple(BEAM_NAMES.values())),
    ("greedy_decode", (), [DECODING_NAMES["model"], DECODING_NAMES["src"], DECODING_NAMES["start"]],
     (*DECODING_NAMES.values(), DEVICE_NAMES)),
    # a decoder-only model's beam search: a prompt and a beam width, no start symbol
    ("beam_search", GENERATE_MODEL, [PROMPT_NAMES, BEAM_WIDTH],
     (GENERATE_MODEL, PROMPT_NAMES, COUNT_NAMES, BEAM_WIDTH, BEAM_NAMES["end"], BEAM_NAMES["alpha"])),
    ("generate", GENERATE_MODEL, [PROMPT_NAMES, COUNT_NAMES], (GENERATE_MODEL, PROMPT_NAMES, COUNT_NAMES,
                                                               CONTEXT_NAMES, PROCESSOR_NAMES, EOS_NAMES,
                                                               CACHE_SWITCH_NAMES)),
    # a chat loop: the conversation encoded by its tokenizer is the prompt
    ("generate", GENERATE_MODEL, [TOKENIZER_NAMES, MESSAGE_NAMES, COUNT_NAMES],
     (GENERATE_MODEL, TOKENIZER_NAMES, MESSAGE_NAMES, COUNT_NAMES, PROCESSOR_NAMES, EOS_NAMES)),
    ("train_epoch", (), [STEP_MODEL_NAMES, OPTIMIZER_NAMES, LOADER_NAMES], (*STEP, LOADER_NAMES)),
    ("train_step", (), [STEP_MODEL_NAMES, OPTIMIZER_NAMES, BATCH_NAMES], STEP_BATCH),
    ("train_step", (), [STEP_MODEL_NAMES, OPTIMIZER_NAMES, SRC_NAMES, TGT_NAMES], STEP_BATCH),
)


def _takes_each(names: list[str], groups: list[tuple[str, ...]] | tuple[tuple[str, ...], ...]) -> bool:
    """Whether one of the names is in each group of aliases."""
    return all(not set(names).isdisjoint(g) for g in groups)


def _loop_kind(names: list[str], required: set[str]) -> str | None:
    """A function that takes a model: beam search, greedy decoding, a generation loop, a training
    epoch or step, by the arguments their runners fill."""
    for kind, first, takes, fills in LOOP_KINDS:
        if _takes_each(names, takes) and (not first or names[0] in first) and required <= set().union(*fills):
            return kind
    return None


def _logits_kind(fn: Any, params: list[inspect.Parameter], names: list[str], required: set[str],
                 ) -> str | None:
    """A function of logits or probabilities first (by that name, or of any name when it takes k, p
    or a temperature by theirs: lucidrains' `gumbel_sample(t, temperature=1.0)`): what a call says
    (a function written for one 1-D row is called one row at a time)."""
    takes = _options(params)
    if not names or names[0] not in LOGITS_NAMES + PROBS_NAMES and not takes:
        return None
    fillable = {n.lower() for n in takes.values()} | set(GENERATOR_NAMES) | {names[0]}
    if not required <= fillable:
        return None
    probs = names[0] in PROBS_NAMES
    rows = _as_given(ROWS, probs)
    options = {n: OPTION_VALUES[k] for k, n in takes.items()}
    # one 1-D row's code may run on a batch, mixing its rows (llama.cpp's min-p, a softmax over dim 0):
    # what it does is read row by row
    call = _by_row if rows_apart(fn) else _call
    out = call(fn, rows, options)
    if out is None:
        return None
    if not out.is_floating_point():
        ids = out.reshape(-1)
        if ids.numel() != rows.size(0) or not bool(((ids >= 0) & (ids < rows.size(1))).all()):
            return None
        return "greedy" if not takes and _always_argmax(fn, call, probs) else "sample"
    if out.shape != rows.shape:
        return None
    if _filtered(rows, out, probs):
        return _filter_kind(rows, out, takes)
    if set(takes) == {"temperature"} and _scaled(rows, out):
        return "temperature"
    return None


# 32 copies of ROWS: a sampler draws the argmax of all 64 rows with chance 0.45^32 x 0.56^32, below
# 1e-19 (of ROWS alone, with chance 0.25: a sampler read as greedy choice would FAIL its check)
@functools.cache
def argmax_rows() -> Tensor:
    """ROWS 32 times over (made when first asked: the fork server computes nothing, zygote.py)."""
    return ROWS.repeat(32, 1)


def _always_argmax(fn: Any, call: Callable[..., Tensor | None], probs: bool) -> bool:
    """Whether fn, given no option, picks the argmax of every row of ARGMAX_ROWS: greedy choice, not a
    sampler."""
    out = call(fn, _as_given(argmax_rows(), probs), {})
    return out is not None and torch.equal(out.reshape(-1), argmax_rows().argmax(-1))


def _options(params: list[inspect.Parameter]) -> dict[str, str]:
    """The filters a function of logits takes after them, by their names: {"top_k": "k", ...}."""
    options = {"top_k": K_NAMES, "top_p": P_NAMES, "temperature": TEMPERATURE_NAMES, "min_p": MIN_P_NAMES}
    return {key: name for key, aliases in options.items()
            if (name := named([p.name for p in params[1:]], aliases))}


def _filter_kind(rows: Tensor, out: Tensor, takes: dict[str, str]) -> str | None:
    """A filter's kind: top-p or top-k by the setting it takes; a p that keeps what min-p keeps at
    p = 0.8 (the tokens at least 0.8 x the most likely one's probability) is min-p (llama.cpp's
    `sample_min_p(logits, p, min_keep)`)."""
    probs = rows.softmax(-1)
    min_p = probs >= OPTION_VALUES["top_p"] * probs.amax(-1, keepdim=True)
    kept = torch.isfinite(out) & (out > -1e8)
    if takes.get("top_p") == "p" and torch.equal(kept, min_p):  # a plain p, never one named top_p
        return "min_p"
    return next((k for k in ("top_p", "top_k", "min_p") if k in takes), None)


def once_per_function(probe: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """probe(fn) run once a function (kind_of asks, then its runner), and every time for a callable
    object Python cannot hash (a dataclass with __call__ has no __hash__)."""
    cached = functools.lru_cache(maxsize=32)(probe)

    @functools.wraps(probe)
    def probe_once(fn: Any) -> bool:
        return cached(fn) if isinstance(fn, collections.abc.Hashable) else probe(fn)
    return probe_once


@once_per_function
def takes_one_row(fn: Any) -> bool:
    """Whether a function of logits (or probabilities) is written for one 1-D row (written_for_one_row),
    probed with the settings it takes by name."""
    params, names, _ = _signature(fn)
    probs = bool(set(names[:1]) & set(PROBS_NAMES))
    return written_for_one_row(fn, probs, _probe_options(fn, params))


def _probe_options(fn: Any, params: list[inspect.Parameter]) -> dict[str, Any]:
    """The settings a function of logits is probed with: those it takes by name, and a settings
    dataclass it takes (llama.cpp's sample_token(logits, params)) at its defaults."""
    named_in_file = getattr(fn, "__globals__", {})  # a string annotation names a class of the file
    configs = {p.name: named_in_file.get(p.annotation, p.annotation) for p in params[1:]}
    return {**{n: OPTION_VALUES[k] for k, n in _options(params).items()},
            **{n: _quietly_built(c) for n, c in configs.items() if dataclasses.is_dataclass(c)}}


def _quietly_built(cls: Any) -> Any:
    """The dataclass at its defaults; None when a field has none (the probe's call then fails)."""
    return quietly(lambda: cls(), TypeError)


def _as_given(logits: Tensor, probs: bool) -> Tensor:
    """The rows a function of logits is probed with, as probabilities for a function of them."""
    return logits.softmax(-1) if probs else logits


# sharp rows and flat ones: a function reducing over the whole batch (probs.max()) mixes them
@functools.cache
def mixed_rows() -> Tensor:
    """ROWS, then ROWS flattened by 0.25 (made when first asked)."""
    return torch.cat([ROWS, ROWS * 0.25])


@once_per_function
def rows_apart(fn: Any) -> bool:
    """Whether a function of logits runs on each 1-D row alone and a batch of them raises or gives a row
    something else than the row alone gets (`probs.max()` over the whole input, a softmax over dim=0):
    one 1-D row's code, or (where it runs) a batched filter's mistake, as the file's other filters say."""
    params, names, _ = _signature(fn)
    rows = _as_given(mixed_rows(), bool(set(names[:1]) & set(PROBS_NAMES)))
    options = _probe_options(fn, params)
    batch, alone = _call(fn, rows, options), _by_row(fn, rows, options)
    return alone is not None and (batch is None or batch.shape != alone.shape or not torch.equal(
        batch, alone))


def written_for_one_row(fn: Any, probs: bool, options: dict[str, Any]) -> bool:
    """Whether fn takes one 1-D row of logits (llama.cpp's sampler chain ported to a vector): rows given
    one at a time work where a batch raises. A batch that runs is graded as a batch unless the file's
    other filters take one row (rows_apart): one that mixes its rows beside batched filters is a batched
    filter's mistake."""
    rows = _as_given(mixed_rows(), probs)
    out, error = _attempt(fn, rows, options)
    numbers = "probability tensor" in str(error)  # a batch's own NaN or negative probabilities: a batch step
    return out is None and not numbers and _by_row(fn, rows, options) is not None


def _by_row(fn: Any, rows: Tensor, options: dict[str, Any]) -> Tensor | None:
    """fn called on each 1-D row, its outputs (tensors, or token ids) stacked; None when a call raises
    or returns something else."""
    # None: a call gave None, or outputs of different shapes
    return quietly(lambda: torch.stack([_call(fn, row, options) for row in rows]), (TypeError, RuntimeError))


def _call(fn: Any, rows: Tensor, options: dict[str, Any]) -> Tensor | None:
    """fn(rows, **options) as a tensor (a token id returned as an int: a 0-d one), or None when it
    raises (sys.exit too) or returns something else; its prints are not shown. A function that can end
    the process (os._exit) is not called."""
    return _attempt(fn, rows, options)[0]


# each probe call's seed: a sampler draws the same on every run, and apart on rows called one by one
PROBE_SEEDS = itertools.count()


def _attempt(fn: Any, rows: Tensor, options: dict[str, Any]) -> tuple[Tensor | None, BaseException | None]:
    """_call's output, with the exception the call raised (None when it ran, or was not called)."""
    if "_exit" in source_text(fn):
        return None, None
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(io.StringIO()):
            torch.default_generator.manual_seed(next(PROBE_SEEDS))
            out = fn(rows.clone(), **options)
    except (Exception, SystemExit) as error:  # noqa: BLE001  (not a function of this kind; its own check says why)
        return None, error
    out = leading_tensor(out)  # (filtered, indices): the filtered
    out = torch.as_tensor(out) if type(out) is int else out
    return (out.detach() if isinstance(out, Tensor) else None), None


def leading_tensor(value: Any) -> Any:
    """A tuple led by a tensor (a filter's (filtered, indices), gpt-fast's sample's (idx_next, probs))
    as that tensor; any other value as it is."""
    return value[0] if isinstance(value, tuple) and value and isinstance(value[0], Tensor) else value


def _filtered(rows: Tensor, out: Tensor, probs: bool) -> bool:
    """Some entries removed (-inf, very negative, or 0 for probabilities) and in every row some kept,
    the kept ones as they were (probabilities: all scaled by one factor, renormalized)."""
    out = out.to(rows.dtype)
    removed = ~torch.isfinite(out) | (out < -1e8) | ((out == 0) & probs)
    if not bool(removed.any()) or bool(removed.all(-1).any()):
        return False
    kept_rows, kept_out = rows.masked_fill(removed, 0), out.masked_fill(removed, 0)
    factor = (kept_out * kept_rows).sum(-1, keepdim=True) / kept_rows.square().sum(-1, keepdim=True)  # (B, 1)
    factor = factor if probs else torch.ones_like(factor)
    return bool(((kept_out - factor * kept_rows).abs() < 1e-5).all())


def _scaled(rows: Tensor, out: Tensor) -> bool:
    """Every row multiplied by one factor other than 1 (a temperature, or its mistake)."""
    out = out.to(rows.dtype)
    if not bool(torch.isfinite(out).all()):
        return False
    factor = float((out * rows).sum() / rows.square().sum())
    return bool(((out - factor * rows).abs() < 1e-4 * max(1.0, abs(factor))).all()) and abs(factor - 1) > 1e-3


