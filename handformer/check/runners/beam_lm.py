"""Beam search over a decoder-only language model: `beam_search(model, prompt, beam_size,
max_new_tokens, eos_id, length_penalty)`, graded by the encoder-decoder's runner (runners/beam.py:
its scenarios, reference and named mistakes) with the learner's own model in place of the
encoder-decoder.

Their model (it passed its check) is steered on its instance: each call's logits are replaced by
the scenario's log-probabilities after the tokens generated past the prompt, and positions inside
the prompt get another distribution (a search that reads the wrong position at the prefill shows).
A KV cache it hands back (a list of (k, v) per layer, or one tensor) is rewritten to carry the
token ids along its time axis: a search that reorders it by the wrong parents hands the model other
prefixes, which the steering reads back, so the mistake changes its answer as it would with real
logits.

Shape legend: N hypotheses, T new tokens of a call, P tokens in the cache, V vocabulary.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map_only

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import (
    BEAM_NAMES,
    COUNT_NAMES,
    MODEL_NAMES,
    PROMPT_NAMES,
    named,
    named_each,
    names_of,
)
from handformer.check.core.context import Context, forward_names, forward_parameters
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import Component, DiscoveryError, cannot_fill
from handformer.check.core.result import DIFFERS, PASS, ComponentResult, text
from handformer.check.runners.beam_models import (
    BOS,
    SETTING_NAMES,
    Steered,
    Table,
    call_search,
    hypothesis_tokens,
)

VOCAB = 13  # the vocabulary the model is built with; its last id is the scenarios' sink
PROMPT = (9, 10, 11)  # (1, 3): longer than one token, so the prefill's last position matters
INSIDE_PROMPT = {8: 0.9}  # what positions inside the prompt predict: not the scenario's first step
ARGS = {"model": MODEL_NAMES, "prompt": PROMPT_NAMES, "beam": BEAM_NAMES["beam"],
        "max_len": COUNT_NAMES + BEAM_NAMES["max_len"], "end": BEAM_NAMES["end"],
        "alpha": BEAM_NAMES["alpha"], "groups": BEAM_NAMES["groups"], "diversity": BEAM_NAMES["diversity"],
        **SETTING_NAMES}


def decoder_only(comp: Component, ctx: Context) -> bool:
    """A beam search that takes a prompt and no start symbol, in a file with no encoder-decoder (its
    model decoder-only, or none: Hugging Face's causal LMs)."""
    names = forward_names(comp.obj)
    return (named(names, PROMPT_NAMES) is not None and named(names, BEAM_NAMES["start"]) is None
            and "transformer" not in ctx.components)


LMOutput = collections.namedtuple("LMOutput", "logits")  # `.logits` (Hugging Face's), and `out[0]`


class StandInLM(nn.Module):
    """The decoder-only model a search is handed when its file defines none: its logits (N, T, V) are
    all the steering's, in the form the search reads (a tensor, a (logits, cache) tuple, `.logits`)."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style

    def forward(self, idx: Tensor, *args: Any, **kwargs: Any) -> Any:
        logits = torch.zeros(*torch.as_tensor(idx).shape, VOCAB)
        return {"tensor": logits, "tuple": (logits, None), "object": LMOutput(logits)}[self.style]


def _carrying(t: Tensor, ids: Tensor, dim: int) -> Tensor:
    """`t` with every entry at time position s of row n set to ids[n, s]: the same shape, other values."""
    shape = [1] * t.dim()
    shape[0], shape[dim] = ids.size(0), ids.size(1)
    return ids.to(t.dtype).reshape(shape).expand_as(t).clone()


def _carried(t: Tensor, dim: int) -> Tensor:
    """The ids (N, P) a tensor rewritten by `_carrying` holds."""
    return t.movedim(dim, 1).reshape(t.size(0), t.size(dim), -1)[:, :, 0].round().long()


class SteeredLM(Steered):
    """The learner's decoder-only model, its logits the scenario's and its cache the ids, as the
    encoder-decoder's `Steered` is for the search (`batch_logprobs` is the reference's)."""

    def __init__(self, module: nn.Module, time_dim: int | None, table: Table, ctx: Context,
                 by_source: dict[tuple[int, ...], Table] | None = None) -> None:
        super().__init__(None, table, ctx, by_source)
        self.module, self.time_dim, self.lost = module, time_dim, False
        self.parted: set[int] = set()  # the cache's tensors that followed other rows than its first

    @property
    def handed(self) -> Any:
        return self.module

    def prompts(self, src: Tensor) -> Tensor:
        """The prompts a search is handed (R, P): the batch's sources when a table is kept per prompt
        (the row's prompt, read back from its cache, picks the table), else the one PROMPT."""
        return src if self.by_source else torch.tensor([PROMPT])

    def encode(self, src: Tensor, src_mask: Any = None) -> Tensor:
        return torch.zeros(1)  # no memory: the reference reads the table alone

    def batch_logprobs(self, memory: Tensor, prefixes: list[tuple[int, ...]]) -> list[list[float]]:
        return self.steered(prefixes, VOCAB)

    @contextlib.contextmanager
    def steering(self) -> Iterator[None]:
        real = type(self.module).forward.__get__(self.module)
        self.module.forward = lambda *args, **kwargs: self._forward(real, args, kwargs)  # type: ignore[method-assign]
        try:
            yield
        finally:
            del self.module.forward

    def _forward(self, real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        idx = [*args, *kwargs.values()][0]  # (N, T)
        others = [args[1:], {k: v for k, v in kwargs.items() if v is not idx}]  # the cache among them
        cached = tensors(others) if self.time_dim is not None else []
        carried = [_carried(t, self.time_dim) for t in cached if t.shape == cached[0].shape]  # (N, P) each
        # a tensor of the cache that follows other rows than the first: the cache reordered in part
        self.parted |= {i for i, ids in enumerate(carried) if not torch.equal(ids, carried[0])}
        prefix = torch.cat([idx[:, :0], *carried[:1]], dim=1)  # (N, P)
        full = torch.cat([prefix, idx.long()], dim=1)  # (N, P + T)
        out = real(*args, **kwargs)
        logits = tensors(out)[0]
        steered = self._logits(full, idx.size(1)).to(logits.dtype)  # (N, T, V)
        axis = self.time_dim

        def carry(t: Tensor) -> Tensor:  # the logits steered; a cache made to carry the ids
            return steered if t is logits else t if axis is None else _carrying(t, full, axis)
        return tree_map_only(Tensor, carry, out)

    def _logits(self, full: Tensor, T: int) -> Tensor:
        """The steered log-probabilities at the last T positions of each row of `full`."""
        rows = []
        for seq in full.tolist():
            # the known prompt the row starts with (else the first: the row is lost)
            prompt = max([*self.by_source, PROMPT], key=lambda p: tuple(seq[:len(p)]) == p)
            table = self.by_source.get(prompt, self.table)
            steps = []
            for end in range(len(seq) - T + 1, len(seq) + 1):
                self.lost |= tuple(seq[:end][:len(prompt)]) != prompt[:end]
                seen = seq[len(prompt):end]
                steps.append(self.steer(seen, VOCAB, {(): INSIDE_PROMPT} if end < len(prompt) else table))
            rows.append(torch.stack(steps))
        return torch.stack(rows)  # (N, T, V)


def tensors(tree: Any) -> list[Tensor]:
    """The tensors among what a model returns or is handed, in order: its other leaves (nanoGPT's loss
    of None, a length, a flag) are not read as logits or a cache."""
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, Tensor)]


def time_axis(ctx: Context, module: nn.Module) -> int | None:
    """The axis of the cache the model hands back that grows with the tokens (2 for (B, H, T, Dh)),
    or None when it hands back none."""
    outs = [ctx.learner.call("forward", module, torch.tensor([PROMPT[:n]])) for n in (2, 3)]
    shapes = [tensors(out)[1:2] for out in outs]  # the first tensor after the logits
    grown = [d for a, b in zip(*shapes) for d in range(1, a.dim()) if b.size(d) == a.size(d) + 1]
    return next(iter(grown), None)


@dataclass
class LMCall:
    """How the learner's decoder-only beam search is called: its arguments by name; the src of
    beam.py's calls is replaced by the prompt."""

    comp: Component
    ctx: Context
    arg: dict[str, str | None]
    steps: int

    def __call__(self, model: SteeredLM, src: Tensor, K: int, alpha: float) -> list[int]:
        tokens = hypothesis_tokens(self.ctx, self.comp, self.raw(model, src, K, alpha))
        if model.lost:
            raise DiscoveryError(LOST[0], zh=LOST[1])
        prompt = model.prompts(src)[0].tolist()
        new = tokens[len(prompt):] if tokens[:len(prompt)] == prompt else tokens
        return [BOS, *new]

    def raw(self, model: SteeredLM, src: Tensor, K: int, alpha: float) -> Any:
        """What the search returns, handed the prompt as a (1, T) batch, else (where that raises) as the
        list of ints a search of lists takes (`list(prompt)`); a raise on both is the batch's."""
        values = {"model": model.handed, "max_len": self.steps, "end": 2, "beam": K, "alpha": alpha,
                  "groups": 1, "diversity": 0.0}
        forms = [model.prompts(src), model.prompts(src)[0].tolist()]
        try:
            return call_search(self.ctx, self.comp, model, self.arg, {**values, "prompt": forms[0]})
        except fp.LearnerFailure as failure:
            listed = quietly(lambda: call_search(self.ctx, self.comp, model, self.arg,
                                                 {**values, "prompt": forms[1]}), fp.LearnerFailure)
            if listed is None:
                raise failure from None
            return listed


LOST = ("your model keeps its cache inside itself (none is handed back), so check cannot tell which tokens "
        "each row continues; write the adapter below",
        "你的模型把缓存留在自己内部（没有返回），检查程序分不清每一行接着哪些 token；请写下面的 adapter")


def lm_call(comp: Component, ctx: Context, steps: int) -> LMCall:
    names, required = names_of(forward_parameters(comp.obj))
    arg = named_each(names, ARGS)
    cannot_fill(comp.name, required, arg.values(), arg["beam"], "beam_size", (
        "a language model's beam search takes (model, prompt, beam_size, max_new_tokens, eos_id, "
        "length_penalty)",
        "语言模型的束搜索接受 (model, prompt, beam_size, max_new_tokens, eos_id, length_penalty)"))
    return LMCall(comp, ctx, arg, steps)


def lm_maker(res: ComponentResult, ctx: Context, comp: Component) -> LMMaker:
    """The learner's own decoder-only model, steered; NOT CHECKED when it failed its check (one not
    checked in this run, `--component beam_search`, is built and used); a stand-in when the file
    defines none."""
    gpt = ctx.components.get("gpt")
    if gpt is None:
        return _stand_in(res, ctx, comp)
    if getattr(ctx.results.get(gpt.name), "status", PASS) not in (PASS, DIFFERS):  # not run: built here
        raise DiscoveryError("your decoder-only model did not pass its check, so it cannot drive your beam "
                             "search; fix it first",
                             zh="你的 decoder-only 模型没有通过检查，不能用来驱动你的束搜索；请先改好它")
    from handformer.check.runners.gpt import gpt_sizes

    module = ctx.build(gpt, {**gpt_sizes(ctx), "src_vocab": VOCAB, "max_len": 64})
    axis = time_axis(ctx, module)
    res.driven = text(f"your own {gpt.name} (it passed its check), its logits replaced by each scenario's "
                      "table, and a KV cache it hands back made to carry the token ids",
                      f"你自己的 {gpt.name}（它通过了检查），logits 换成每个场景的概率表，"
                      "它返回的 KV 缓存改成带着 token id")
    return LMMaker(module, axis, ctx)


@dataclass
class LMMaker:
    """Makes the steered models a search is handed, and keeps them: what their caches showed (`parted`)
    is read after the search's checks."""

    module: nn.Module
    axis: int | None  # None: the model hands back no cache
    ctx: Context
    made: list[SteeredLM] = field(default_factory=list)

    def __call__(self, table: Table, by_source: dict[tuple[int, ...], Table] | None = None) -> SteeredLM:
        self.made.append(SteeredLM(self.module, self.axis, table, self.ctx, by_source))
        return self.made[-1]

    def parted(self) -> list[int]:
        """The cache's tensors (from 0, in the order the model hands them back) that some call was handed
        following other rows than the first."""
        return sorted(set().union(*(model.parted for model in self.made)))


def _stand_in(res: ComponentResult, ctx: Context, comp: Component) -> LMMaker:
    from handformer.check.runners.generate_loop import styles_read

    module = StandInLM(styles_read(comp.obj)[0])
    res.driven = text("a stand-in decoder-only model (your file defines none) whose logits are each "
                      "scenario's table, read as your search reads a model's output",
                      "替身 decoder-only 模型（你的文件里没有定义模型），logits 就是每个场景的概率表，"
                      "按你的搜索读取模型输出的方式返回")
    return LMMaker(module, None, ctx)
