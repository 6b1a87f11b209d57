"""The learner's `generate` driven through their own decoder-only model, when the file defines one
that was built and did not fail its own check (Karpathy's `BigramLanguageModel.generate`, nanoGPT's
`GPT.generate`, Raschka's `generate(model, idx, ...)` with his `GPTModel`).

Their model is built at check's sizes (vocabulary VOCAB, block size BLOCK, on scrambled weights) and
hooked: every call is recorded as the stand-in's are (`generate_loop.Call`), and its logits are
scaled so that the likeliest token has all of the probability, so a sampling loop is as
deterministic as greedy decoding. Whether the model needs its context cropped is read from what it
does, not assumed: a model that raises on more than BLOCK tokens (a position table of BLOCK rows)
must be handed the last BLOCK; one that runs on longer contexts (a bigram table) needs no crop, and a
loop that crops it anyway is not charged.

Shape legend: B batch, T tokens so far, V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import MODEL_NAMES, readable_parameters
from handformer.check.core.banned_ids import ban, banned_ids, banned_note, banning
from handformer.check.core.carried import chains_read, methods_called, model_argument
from handformer.check.core.context import (
    Context,
    finish,
    forward_names,
    forward_parameters,
    globals_set,
    module_sizes,
)
from handformer.check.core.defaults import given, quietly
from handformer.check.core.discovery import Component, own_objects
from handformer.check.core.precision import DTYPE_MISMATCH
from handformer.check.core.result import DIFFERS, NOT_CHECKED, PASS, ComponentResult, Text, text
from handformer.check.runners import contrastive
from handformer.check.runners.generate_loop import (
    BLOCK,
    CACHE_NAMES,
    POSITION_NAMES,
    SOFT,
    VOCAB,
    Call,
    ContextTooLong,
    LanguageModel,
    StandIn,
    StandInTokenizer,
    TooManyCalls,
    check_with,
    prompts,
    spent,
)
from handformer.check.runners.generate_padded import check_padded, padded
from handformer.check.runners.generate_ragged import check_ragged
from handformer.check.runners.generate_temperature import shifted

PEAK = 1e6  # the learner's logits are not built with a margin: a wider scale keeps near ties certain
NO_LIMIT = 10**9
CACHED_LEN = 4 * BLOCK  # the max_len of a model that decodes with a cache


class OwnModel:
    """The learner's module as their loop is handed it, with the stand-in's bookkeeping: `calls`,
    `block_size` (the longest context it runs on), `context` (the block size their loop is told) and
    `budget` (calls allowed before TooManyCalls). Its forward is wrapped on the instance, so that a
    loop that calls `self.forward(...)` (minimind's, Meta's) is recorded and steered as `model(...)` is."""

    def __init__(self, module: nn.Module, limit: int, budget: int, holder: type | None = None,
                 methods: tuple[str, ...] = ()) -> None:
        self.module, self.block_size, self.context, self.budget = module, limit, BLOCK, budget
        self.target = engine(holder, module) if holder else module  # what `model` (or `self`) is
        self.calls: list[Call] = []
        self.held = 0  # tokens in the cache since it was last empty (a cache handed back or kept inside)
        self.words = ("your model's own greedy decoding", "你的模型自己贪心解码")
        self.original = module.forward
        self.signature = inspect.signature(self.original)
        self.outputs: list[Tensor] = []  # the last logits (B, V) of each call, as the loop was handed them
        self.exact: Any = None  # the full forward's scaled logits of ids (OwnDriver.logits)
        def forward(*args: Any, **kwargs: Any) -> Any:
            self._record(args, kwargs)
            kept: list[Tensor] = []
            out = steered(self.original(*args, **kwargs), kept)
            self.outputs += [logits[:, -1].detach().clone() for logits in kept[:1] if logits.dim() == 3]
            return out
        module.forward = functools.wraps(self.original)(forward)
        self.methods, self.stepped = methods, 0  # the loop's calls of them, counted against its budget
        for name in methods:  # model.step(token, t, states): its logits steered as forward's are
            setattr(module, name, self._steered(getattr(module, name)))
        self.resets = [name for name in dir(type(module)) if "reset" in name and "cache" in name
                       and callable(getattr(module, name, None))]
        for name in self.resets:  # reset_kv_cache(): the module's own cache starts empty again
            setattr(module, name, self._reset(getattr(module, name)))

    def _steered(self, method: Any) -> Any:
        def stepped(*args: Any, **kwargs: Any) -> Any:
            self.stepped += 1
            if self.stepped > 2 * self.budget:  # a prompt fed one token at a time counts too
                raise TooManyCalls(f"generate called the model's {method.__name__} {self.stepped} times")
            return steered(method(*args, **kwargs))
        return functools.wraps(method)(stepped)

    def _reset(self, method: Any) -> Any:
        def reset(*args: Any, **kwargs: Any) -> Any:
            self.held = 0
            return method(*args, **kwargs)
        return reset

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        unknown = [k for k in kwargs if not _takes(self.signature, k)]
        if unknown:  # their loop is written for another model (Medusa's heads on a base): not the one handed
            said = {"model": type(self.module).__name__, "arg": unknown[0]}
            raise fp.cannot_call(OTHER_MODEL, OTHER_MODEL_ZH, said)
        if spent(self):
            raise TooManyCalls(f"generate called the model {len(self.calls) + 1} times")
        ids = next((v for v in list(args) + list(kwargs.values()) if isinstance(v, Tensor)), None)
        if ids is None or ids.is_floating_point():
            return
        ids = ids[None] if ids.dim() == 1 else ids  # (B, T)
        B, T = ids.shape
        start, held = self._seen(args, kwargs)
        self.calls.append(Call(ids.clone(), held, torch.arange(held, held + T)[None].expand(B, T), held > 0,
                               start))
        if held or start is None and self._cached(args, kwargs):
            self.held = held + T
        if held + T > self.block_size:
            raise ContextTooLong(f"Cannot forward sequence of length {T}, block size is only "
                                 f"{self.block_size}")

    def _seen(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | None, int]:
        """(Meta's start_pos, the tokens before this call's): start_pos; else the tokens fed since the
        cache was last empty, when a cache is handed back (Hugging Face's past_key_values) or kept
        inside (Raschka's use_cache=True); else none."""
        bound = self._bound(args, kwargs)
        start = next((POSITION_READERS[type(v)](v) for k, v in bound.items()
                      if k in POSITION_NAMES + ("input_pos",) and type(v) in POSITION_READERS), None)
        if start is not None:
            return start, start
        return None, self.held if self._cached(args, kwargs) else 0

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return quietly(lambda: dict(self.signature.bind(*args, **kwargs).arguments), TypeError, dict(kwargs))

    def _cached(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        bound = self._bound(args, kwargs)
        return bound.get("use_cache") is True or any(
            k in CACHE_NAMES and v is not None and not isinstance(v, bool) for k, v in bound.items())

    def close(self) -> None:
        vars(self.module).pop("forward", None)
        for name in self.resets + list(self.methods):
            vars(self.module).pop(name, None)


OTHER_MODEL = ("the loop calls its model with {arg}=..., which {model}.forward does not take: it is written "
               "for another model of the file (one check could not build: see its report), so {model} cannot "
               "drive it")
OTHER_MODEL_ZH = ("循环调用模型时传了 {arg}=...，而 {model}.forward 不接受它："
                  "这个循环是为文件里另一个模型写的（check 构建不了的那个，见它的报告），"
                  "所以不能用 {model} 驱动它")


def _takes(signature: inspect.Signature, name: str) -> bool:
    """Whether a forward of this signature takes the keyword `name` (by name, or in its **kwargs)."""
    params = signature.parameters.values()
    return name in signature.parameters or any(p.kind is p.VAR_KEYWORD for p in params)


# a call's first position: Meta's start_pos (an int), gpt-fast's input_pos (the positions, a tensor)
POSITION_READERS: dict[type, Any] = {int: int, Tensor: lambda v: int(v.reshape(-1)[0])}


def _certain(logits: Tensor) -> Tensor:
    return ban(shifted(logits) * (1.0 if SOFT[0] else PEAK))


def steered(out: Any, kept: list[Tensor] | None = None) -> Any:
    """The learner's output with its logits (the first float tensor whose last size is VOCAB) scaled:
    a tensor, a (logits, loss) tuple, or an object with `.logits`; the scaled logits added to `kept`."""
    certain = functools.partial(_kept_certain, given(kept, []))
    if isinstance(out, Tensor):
        return certain(out) if out.is_floating_point() and out.size(-1) == VOCAB else out
    if isinstance(out, (tuple, list)):
        items = list(out)
        for i, item in enumerate(items):
            if isinstance(item, Tensor) and item.is_floating_point() and item.size(-1) == VOCAB:
                items[i] = certain(item)
                break
        return type(out)(items) if isinstance(out, tuple) else items
    if isinstance(getattr(out, "logits", None), Tensor):
        out.logits = certain(out.logits)
    return out


def _kept_certain(kept: list[Tensor], logits: Tensor) -> Tensor:
    kept.append(_certain(logits))
    return kept[-1]


class OwnDriver:
    """What check_generate needs from the model that drives a loop: a fresh recorded model, the
    greedy tokens it gives, and the words for the report."""

    def __init__(self, ctx: Context, model_comp: Component, module: nn.Module, limit: int,
                 holder: type | None = None, max_len: int = BLOCK, methods: tuple[str, ...] = ()) -> None:
        from handformer.check.runners.gpt import Caller

        self.methods = methods  # the model's methods beyond forward the loop calls (model.step)
        self.module, self.limit, self.name = module, limit, model_comp.name
        self.holder, self.max_len = holder, max_len  # the engine class generate is a method of
        self.call = Caller(module, ctx)
        self.float32 = False  # moved to float32 (lower_precision)

    def new_model(self, style: str, budget: int) -> OwnModel:
        model = OwnModel(self.module, self.limit, budget, self.holder, self.methods)
        model.exact = self.logits
        return model

    def lower_precision(self, failure: fp.LearnerFailure) -> bool:
        """Their model in float32 when their loop raised a dtype mismatch on check's float64 one (a cache
        that keeps its scales or values in float32 by a dtype it writes): True when so moved."""
        if not DTYPE_MISMATCH.search(failure.error.message) or self.float32:  # (engine.float64_refused)
            return False
        self.float32 = True
        self.module.float()
        torch.set_default_dtype(torch.float32)  # own_driver puts the default back
        return True

    def logits(self, ids: Tensor) -> Tensor:
        """The logits (B, t, V) their model gives for ids (B, t), as scaled as in the loop."""
        return _certain(self.call(ids)[0])

    def reference(self, B: int, n: int, crop: int | None = None) -> Tensor:
        """n greedy tokens after prompts(B), each from the last `crop` tokens (the limit by default)."""
        crop = crop or self.limit
        ids = prompts(B)
        for _ in range(n):
            logits, _ = self.call(ids[:, -crop:])
            ids = torch.cat([ids, ban(logits[:, -1]).argmax(-1, keepdim=True)], 1)  # (B, T + 1)
        return ids[:, prompts(B).size(1):]

    def driven(self) -> Text:
        limited = self.limit < NO_LIMIT
        crop, crop_zh = (
            (f"it raises on more than {BLOCK} tokens, so the context must be cropped",
             f"超过 {BLOCK} 个 token 它会报错，所以上下文必须裁剪") if limited
            else (f"it runs on contexts longer than {BLOCK} tokens, so no crop is needed (a crop is not "
                  "charged)", f"它能处理超过 {BLOCK} 个 token 的上下文，所以不必裁剪（裁剪了也不算错）"))
        f32, f32_zh = ((", in float32 (your loop keeps tensors in a float32 it names: float64 raised a "
                        "dtype mismatch)", "，用 float32（你的循环有写明 float32 的张量："
                        "float64 下 dtype 不匹配）")
                       if self.float32 else ("", ""))
        held, held_zh = ((f" in your {self.holder.__name__} (with a stand-in tokenizer)",
                          f"（放在你的 {self.holder.__name__} 里，分词器是替身）")
                         if self.holder else ("", ""))
        return text(f"your own {self.name}{held}, built with vocab_size {VOCAB} and block size "
                    f"{self.max_len}{f32}, its logits scaled so that the likeliest token is certain; {crop}",
                    f"你自己的 {self.name}{held_zh}，按 vocab_size {VOCAB}、block size {self.max_len} 构建"
                    f"{f32_zh}，logits 被放大，最可能的 token 概率为 1；{crop_zh}")

    def alternative(self, B: int, n: int) -> Tensor | None:
        """The tokens of a loop that crops to BLOCK a model that needs no crop: not charged."""
        return self.reference(B, n, BLOCK) if self.limit == NO_LIMIT else None

    def styles(self, fn: Any) -> tuple[str, ...]:
        return ("own",)  # their model returns what it returns


def _model_component(ctx: Context, comp: Component) -> Component | None:
    """The model that drives `comp`: the class whose method it is; the model an engine class holds
    (Meta's `Llama(model: Transformer, tokenizer)`, its Transformer imported from their model.py);
    else the file's decoder-only model."""
    gpt = ctx.components.get("gpt")
    if "." not in comp.name:
        return gpt
    cls = own_objects(ctx.module).get(comp.name.split(".")[0])
    if gpt is not None and gpt.obj is cls:
        return gpt
    if inspect.isclass(cls) and issubclass(cls, nn.Module):
        return Component("gpt", cls.__name__, cls)
    held = held_model(cls, ctx.module) if inspect.isclass(cls) else None
    if held is None:
        return None
    return gpt if gpt is not None and gpt.obj is held else Component("gpt", held.__name__, held)


def held_model(cls: type, module: Any) -> type | None:
    """The nn.Module class an engine class's constructor takes (its annotation, read in the file's
    namespace when it is a string)."""
    params = readable_parameters(cls.__init__)[1:]
    return next((hint for p in params if (hint := _module_hint(p, module)) is not None), None)


def _module_hint(p: inspect.Parameter, module: Any) -> type | None:
    hint = vars(module).get(p.annotation) if isinstance(p.annotation, str) else p.annotation
    return hint if inspect.isclass(hint) and issubclass(hint, nn.Module) else None


TOKENIZER_NAMES = ("tokenizer", "tok", "tokeniser")


def engine(cls: type, model: nn.Module) -> Any:
    """An instance of the engine class whose method generate is (Meta's `Llama`), built by its own
    constructor with the learner's model and a stand-in tokenizer: padding -1 and EOS ids no model
    generates (the EOS check is for loops that take an EOS argument)."""
    namespace = sys.modules.get(cls.__module__)
    kwargs: dict[str, Any] = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if _module_hint(p, namespace) is not None or p.name.lower() in MODEL_NAMES:
            kwargs[p.name] = model
        elif p.name.lower() in TOKENIZER_NAMES:
            kwargs[p.name] = StandInTokenizer()
        elif p.default is p.empty:
            raise TypeError(f"cannot fill the argument {p.name!r} of {cls.__name__}")
    return cls(**kwargs)


def _usable(ctx: Context, model_comp: Component) -> bool:
    """Built and not failed: passed, differs by design, or ran its checks but could not be compared
    (a bigram model has no blocks to map); a model not checked in this run is probed here."""
    result = ctx.results.get(model_comp.name)
    if result is None or result.status in (PASS, DIFFERS):
        return True
    return result.status == NOT_CHECKED and bool(result.checks) and all(c.ok for c in result.checks) and \
        not result.findings


@contextlib.contextmanager
def own_driver(ctx: Context, comp: Component) -> Iterator[OwnDriver | None]:
    """The driver of the learner's own model for `comp` (None: the stand-in drives it), with their
    module-level sizes set for it (Karpathy's n_embd, block_size) while it runs, then put back."""
    from handformer.check.runners.gpt import gpt_sizes

    model_comp, methods = _model_component(ctx, comp), beyond_forward(ctx, comp)
    if model_comp is None or not (methods or _usable(ctx, model_comp)):  # (their model's step: theirs alone)
        yield None
        return
    # a model that decodes with a KV cache or start_pos runs to its max_len, which is not a block its
    # loop must crop to, nor is the length of a table it computes (rotary angles, a causal mask): built
    # long enough for every check's tokens; a learned position table is a block to crop to
    cached = inspect.isclass(model_comp.obj) and bool(_cache_parameters(model_comp.obj.forward))
    sizes = {**gpt_sizes(ctx), "src_vocab": VOCAB, "max_len": BLOCK}
    long = cached or bool(methods) or not learned_positions(ctx, model_comp, sizes)
    sizes["max_len"] = CACHED_LEN if long else BLOCK
    dtype = torch.get_default_dtype()
    with globals_set(ctx.module, module_sizes(ctx.module, model_comp, sizes)):
        torch.set_default_dtype(torch.float64)  # their model float64 here: a cache it allocates must be too
        try:
            yield _build(ctx, model_comp, sizes, _engine_class(ctx, comp), methods)
        finally:
            torch.set_default_dtype(dtype)


def learned_positions(ctx: Context, model_comp: Component, sizes: dict[str, Any]) -> bool:
    """Whether the model's parameters grow with its max_len (a learned position table: nanoGPT's wpe
    cannot embed a position past it, so a loop must crop its context); not where only its buffers do
    (rotary angles, a causal mask: tables of a function of the position, computed to that length).
    Read by building it at two lengths; a model that cannot be built is taken to have one."""
    partial, shapes = ctx.partial, []
    for max_len in (BLOCK, CACHED_LEN):
        at = {**sizes, "max_len": max_len}
        try:
            with globals_set(ctx.module, module_sizes(ctx.module, model_comp, at)):
                shapes.append([tuple(p.shape) for p in ctx.build(model_comp, at).parameters()])
        except Exception:  # noqa: BLE001  (not built here: _build says why, or the stand-in drives the loop)
            return True
        finally:
            ctx.partial = partial
    return shapes[0] != shapes[1]


def _cache_parameters(forward: Any) -> set[str]:
    """The parameters of a model's forward that hand it a KV cache or positions (past_key_values,
    Meta's start_pos)."""
    return set(forward_names(forward)) & set(CACHE_NAMES + POSITION_NAMES)


def _drivable(module: nn.Module) -> bool:
    """Called on token ids alone: every cache or position parameter has a default (Hugging Face's
    past_key_values=None), except Meta's start_pos, which check passes (0 for the whole sequence)."""
    return all(p.default is not p.empty or p.name == "start_pos" for p in forward_parameters(module)
               if p.name in _cache_parameters(module))


def _engine_class(ctx: Context, comp: Component) -> type | None:
    """The class `comp` is a method of when it is not a model (Meta's `Llama.generate`)."""
    cls = own_objects(ctx.module).get(comp.name.split(".")[0]) if "." in comp.name else None
    return cls if inspect.isclass(cls) and not issubclass(cls, nn.Module) else None


def _build(ctx: Context, model_comp: Component, sizes: dict[str, Any], holder: type | None,
           methods: tuple[str, ...] = ()) -> OwnDriver | None:
    """Their model at check's sizes (in their engine class, when generate is its method), when it can
    be called on token ids alone, returns VOCAB logits and runs on BLOCK tokens; its limit read by
    feeding it BLOCK + 2 tokens."""
    partial = ctx.partial
    try:
        module = ctx.build(model_comp, sizes)
        if not _drivable(module):
            return None
        driver = OwnDriver(ctx, model_comp, module, BLOCK, holder, sizes["max_len"], methods)
        if holder is not None:
            engine(holder, module)
        logits, _ = driver.call(torch.zeros(1, BLOCK, dtype=torch.long))
        if logits is None or logits.size(-1) != VOCAB:
            return None
    except Exception:  # noqa: BLE001  (their model cannot be built or run here: the stand-in drives the loop)
        return None
    finally:
        ctx.partial = partial
    try:
        driver.call(torch.zeros(1, BLOCK + 2, dtype=torch.long))
        driver.limit = NO_LIMIT
    except fp.LearnerFailure:
        pass
    return driver


def check_generate(comp: Component, ctx: Context) -> ComponentResult:
    """The learner's loop driven through their own model when it was built and did not fail
    (generate_own.py), else through the stand-in."""
    res = ctx.result(comp)
    banned = banned_ids(comp.obj)
    res.notes += banned_note(banned)
    with banning(banned), own_driver(ctx, comp) as own:
        found = own and not own.holder and contrastive.read_contrastive(ctx, comp, own.module)
        if found:  # contrastive search: neither greedy nor sampling (contrastive.py)
            contrastive.check_contrastive(res, ctx, comp, own.module, found, own.name)
            return finish(res)
        driver = own or StandIn()
        _served(comp, own, methods := beyond_forward(ctx, comp))
        res.notes += [_methods_note(getattr(own, "name", ""), methods)] * bool(getattr(own, "methods", ()))
        res.driven = driver.driven()
        check_with(res, ctx, comp, driver)
        res.driven = driver.driven()  # as it was driven in the end (in float32 where float64 raised)
        if padded(comp.obj):  # a left-padded batch (generate_padded.py); one it cannot take is passed over
            check_padded(res, ctx, comp, driver, driver.styles(comp.obj)[0])
        check_ragged(res, ctx, comp, driver)  # prompts of different lengths a loop pads itself (Meta's)
    return finish(res)


def beyond_forward(ctx: Context, comp: Component) -> tuple[str, ...]:
    """The methods of its model the loop calls beyond forward (`model.step(...)`, `model.init_state(B)`):
    ones neither an nn.Module nor the stand-in has (nor, for a method of a class, that class or what its
    constructor sets: an engine's `self.model(ids)` calls the model it holds)."""
    owner = own_objects(ctx.module).get(comp.name.split(".")[0]) if "." in comp.name else None
    held = {attrs[0] for attrs in chains_read(getattr(owner, "__init__", None), "self")}  # self.model = model
    called = methods_called(comp.obj, model_argument(comp.obj), owner or LanguageModel)
    return tuple(sorted(set(called) - held))


def _served(comp: Component, own: OwnDriver | None, methods: tuple[str, ...]) -> None:
    """NOT CHECKED (cannot_call), naming the method, where the loop calls one its model must have and
    no model check built has it: the stand-in has only forward."""
    module = getattr(own, "module", None)
    missing = sorted(set(methods) - set(dir(module)))
    if missing:
        said = {"name": comp.name, "method": f"{model_argument(comp.obj)}.{missing[0]}"}
        raise fp.cannot_call(BEYOND, BEYOND_ZH, said)


BEYOND = ("{name} calls {method}(...), a method of its model beyond forward: only a model class of "
          "your file can have it, and check built none that has it (your file defines none, or check could "
          "not build it: see its report); check's stand-in, which has only forward, cannot drive the loop")
BEYOND_ZH = ("{name} 调用了 {method}(...)，这是模型在 forward 之外的方法："
             "只有你文件里的模型类才会有它，而检查程序没有构建出带这个方法的模型"
             "（你的文件没有定义，或者检查程序构建不了它：见它的报告）；替身只有 forward，驱动不了这个循环")


def _methods_note(model: str, methods: tuple[str, ...]) -> Text:
    said = ", ".join(f"model.{m}(...)" for m in methods)
    return text(f"it calls {said}, beyond forward: driven with your own {model}, and each token it emits "
                f"is judged against that model's full forward on the sequence so far (its {said} must agree "
                "with it)",
                f"它调用了 forward 之外的 {said}：用你自己的 {model} 驱动，它给出的每个 token 都与同一个模型"
                f"对目前整个序列做完整 forward 的结果比较（它的 {said} 必须与之一致）")
