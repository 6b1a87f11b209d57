"""Runner for a learner's generation loop: nanoGPT's `generate(model, idx, max_new_tokens,
temperature=1.0, top_k=None)` (a function, or a method of their model class) and
`generate(model, prompt_ids, max_new_tokens)` variants.

The learner's `generate` is handed a handformer CausalLM on known weights, wrapped as their code
expects it (`LanguageModel`): called on token ids it returns a (B, T, V) tensor, a `(logits, loss)`
tuple or an object with `.logits` (detected from their source, then tried in that order), it has
`config.block_size` (and `block_size`, `max_len`), and it understands a KV cache passed as
`past_key_values=` (Hugging Face) or positions as `start_pos` (Meta). Its logits are scaled so that
the most likely token has all of the probability: a loop that samples is as deterministic as greedy
decoding, and its tokens are compared with handformer's greedy continuation, so that a learner's
`generate` is checked even when their own model is wrong. Every call is recorded, which names the
mistakes: the new token not appended, the context not cropped to the block size, a cache not passed
back or positions not offset by it, a loop that calls the model more than max_new_tokens times.
A loop with an EOS parameter is run once more with EOS set to the token the model makes likeliest
at a step: it must stop there (greedy_no_stop_at_eos otherwise); a loop without one is not charged.

Shape legend: B batch, T tokens so far, V vocabulary.
"""

from __future__ import annotations

import inspect
import itertools
import re
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import (
    CACHE_SWITCH_NAMES,
    CONTEXT_NAMES,
    COUNT_NAMES,
    EOS_NAMES,
    MASK_ARG_NAMES,
    MESSAGE_NAMES,
    MODEL_NAMES,
    PAD_NAMES,
    PROMPT_NAMES,
    TOKENIZER_NAMES,
)
from handformer.check.core.banned_ids import ban, banning
from handformer.check.core.carried import ROLE_NAMES, carried_note, carry, model_argument
from handformer.check.core.context import (
    Context,
    forward_defaults,
    forward_names,
    forward_parameters,
    named,
    raised_at,
)
from handformer.check.core.defaults import given, quietly, then
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.localize import Departure
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.loop_forms import counted_fields, counted_parameter, crops_by_limit
from handformer.check.core.options_object import (
    ARGUMENTS,
    OBJECT,
    build_options,
    neutral_words,
    options_class,
    per_row,
    signature_settings,
    unmapped_words,
)
from handformer.check.core.processors import PROCESSOR_NAMES, NoProcessors
from handformer.check.core.prompt_forms import handed_text, text_prompt, unhanded_model
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.sizes import is_number
from handformer.check.core.source import code_text, locate, locate_form, source_lines
from handformer.check.runners import generate_lossy as lossy
from handformer.check.runners.generate_penalty import check_repetition_penalty
from handformer.check.runners.generate_temperature import SOFT, VOCAB, check_temperature, shifted
from handformer.check.runners.generate_top_k import check_top_k
from handformer.check.runners.generate_top_p import check_top_p
from handformer.check.runners.localize_generate import default_temperature, generate_views, localize_generate
from handformer.config import CausalLMConfig
from handformer.families import build_causal_lm
from handformer.generation.generate import generate as hf_generate
from handformer.models.causal_lm import CausalLM

BLOCK, SEED = 8, 82
NO_LIMIT = 10**9  # the context of a model that runs on any length
PEAK = 1e4  # logits scale: the most likely token gets all of the probability
SHORT, LONG = 4, 7  # new tokens after a prompt of 3: within the block size, and past it

CACHE_NAMES = ("past_key_values", "past", "cache", "kv_cache", "layer_past", "past_kv", "kv")
POSITION_NAMES = ("start_pos", "pos", "offset", "start", "position")


TOP_K_NAMES = ("top_k", "topk", "k")
# how many continuations a loop samples for each prompt (nanoGPT's sample.py: num_samples)
SAMPLES_NAMES = ("num_samples", "n_samples", "num_return_sequences", "num_sequences", "samples")
NEVER = -1  # an EOS id no model generates
# (the names of a default fixed, the largest value kept, the value it is set to) of `fixed_defaults`
FIXED_DEFAULTS = ((EOS_NAMES, float("-inf"), NEVER), (TOP_K_NAMES, VOCAB, VOCAB), (SAMPLES_NAMES, 1, 1))


class StandInTokenizer:
    """What an inference engine reads of its tokenizer while generating: no padding in check's
    prompts, and no EOS among the tokens a model generates."""

    pad_id = pad_token_id = -1
    eos_id = eos_token_id = bos_id = bos_token_id = NEVER
    stop_tokens = frozenset({NEVER})
    n_words = vocab_size = VOCAB
    special_tokens: dict[str, int] = {}


class PromptTokenizer(StandInTokenizer):
    """A chat loop's tokenizer: whatever text its chat template makes of the conversation encodes to
    check's prompt (one list of ids, or a list of them for several), ids decode to themselves (so that
    what the loop returns is the tokens it generated), and every special id it reads (im_end_id) is
    one no model generates."""

    def __init__(self, ids: Any) -> None:
        rows = ids.tolist() if isinstance(ids, Tensor) else list(ids)  # (a ragged list of prompts: as it is)
        self.prompt = rows[0] if len(rows) == 1 else rows  # (one prompt of 3 ids: its list)

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return list(self.prompt)

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> str:
        """Text of one character a token (`TEXT_BASE` + id): what a loop adds to it, slices or joins reads
        back as the ids (`read_text`)."""
        return "".join(chr(TEXT_BASE + i) for i in torch.as_tensor(ids).reshape(-1).tolist())

    def __getattr__(self, name: str) -> int:
        if name.endswith(("_id", "_token_id", "_idx")):
            return NEVER
        raise AttributeError(name)


TEXT_BASE = 0xF0000  # the first character of PromptTokenizer's text (a private-use plane): id 0
# (EOS ids no model makes, -1, decode to the character before it, read back as no token)


def read_text(out: Any) -> Any:
    """What a loop returned as text, read back as the ids PromptTokenizer decoded it from: a string, or
    the pieces a generator function yielded (a streaming loop), each character one id; text of its own
    (a separator, a stop string cut out) is not a token. Anything else as it is."""
    pieces = isinstance(out, list) and bool(out) and all(isinstance(p, str) for p in out)
    out = "".join(out) if pieces else out
    return [ord(c) - TEXT_BASE for c in out if ord(c) >= TEXT_BASE] if isinstance(out, str) else out


# the conversation a chat loop is handed (its ids are the tokenizer's: PromptTokenizer)
CONVERSATION = ({"role": "user", "content": "hi"},)


PAD_ID = 0  # the padding id a loop is handed: no prompt holds it


class ContextTooLong(RuntimeError):
    """What nanoGPT's model raises on more tokens than its block size."""


class TooManyCalls(RuntimeError):
    """The learner's loop called the model far more often than max_new_tokens asks for."""


STALL = 4  # times its budget of calls a loop is stopped at even where it has not gone past its count


def spent(model: Any) -> bool:
    """Whether the loop has spent its model's budget of calls: once it has gone on past the tokens it
    was asked for (`went_on`), and in any case at STALL times the budget (a loop that calls the model
    more than once a token, classifier-free guidance's second pass or a draft verified, finishes
    within it)."""
    return calls_made(model) >= model.budget * (STALL, 1)[went_on(model)]


def went_on(model: Any) -> bool:
    """Whether the loop fed its model a context holding every token it was asked for (it had made
    them all and went on). `asked` is the prompt's length plus the count (0: unknown, any call
    counts); past the block size a cropping loop's context stops growing, so reaching it counts."""
    longest = max((c.seen + c.ids.size(1) for c in model.calls), default=0)
    return longest >= min(getattr(model, "asked", 0), model.block_size)


def witnessed(model: Any) -> bool:
    """Whether a loop stopped for its calls was seen not to stop: it went on past its count, or it fed
    the same tokens at every one of STALL times its budget of calls (it never appends; several passes a
    token, Monte Carlo dropout's, feed the same tokens only within one step)."""
    fed = {(c.seen, repr(c.ids.tolist())) for c in model.calls}  # (one: the same at every call)
    same = fed == {(0, repr(c.ids.tolist())) for c in model.calls[:1]}
    return went_on(model) or (calls_made(model) >= STALL * model.budget) & same


def calls_made(model: Any) -> float:
    """The calls a loop made to the model, each on fewer rows than the prompts it was handed counted as
    that share of one (a loop that runs each prompt through the model on its own: vLLM's lists)."""
    B = getattr(model, "prompts", 0)
    return sum(min(c.ids.size(0) / B, 1.0) if B else 1.0 for c in model.calls)


@dataclass(frozen=True)
class CacheToken:
    """The KV cache the wrapper hands out: the token ids and positions it has seen (B, S) each;
    passing it back continues from there, as a real cache would."""

    ids: Tensor
    positions: Tensor

    @property
    def length(self) -> int:
        return self.ids.size(1)

    def hold(self, ids: Tensor, positions: Tensor) -> None:
        """Hold these ids and positions from now on: a cache the model fills in place (mistral-src's
        rolling cache, made by model.new_cache() and never handed back), where a call returns none."""
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "positions", positions)


@dataclass
class Call:
    ids: Tensor  # (B, T) the new tokens handed over
    seen: int  # tokens before them: in the cache handed back, or up to start_pos
    positions: Tensor  # (B, T) the positions they were computed at
    cached: bool  # a cache (or start_pos) was passed
    start: int | None = None  # Meta's start_pos, when given


class LanguageModel(nn.Module):
    """handformer's CausalLM as the learner's `generate` expects its model. style: what a call
    returns (tensor | tuple | object); budget: calls allowed before TooManyCalls."""

    def __init__(self, lm: CausalLM, block_size: int, style: str, budget: int) -> None:
        super().__init__()
        self.model = lm
        self.block_size = self.max_len = self.max_seq_len = self.context = block_size
        self.style, self.budget, self.vocab_size = style, budget, VOCAB
        self.calls: list[Call] = []
        self.carried: list[tuple[str, Any]] = []  # what the loop reads off it, given (carried.py)
        self.stream: Tensor | None = None  # Meta's style: the tokens fed so far, by position
        self.config = types.SimpleNamespace(block_size=block_size, max_len=block_size, max_seq_len=block_size,
                                            n_positions=block_size, vocab_size=VOCAB,
                                            max_position_embeddings=block_size)

    @property
    def target(self) -> LanguageModel:
        """What the learner's loop is handed (a property: as an attribute it would be its own child
        module, and model.eval() would recurse)."""
        return self

    def new_cache(self, *args: Any, **kwargs: Any) -> CacheToken:
        empty = torch.zeros(1, 0, dtype=torch.long)
        return CacheToken(empty, empty)

    init_cache = new_cache

    def forward(self, idx: Any = None, *args: Any, input_ids: Any = None, **kwargs: Any) -> Any:
        if spent(self):
            raise TooManyCalls(f"generate called the model {len(self.calls) + 1} times")
        ids = torch.as_tensor(given(idx, input_ids)).long()  # Hugging Face's model(input_ids=...)
        one = ids.dim() == 1  # one sequence, no batch: gpt-oss's model(tokens) gives (T, V)
        ids = ids[None] if one else ids  # (B, T)
        cache, start, positions = _cache_arguments(args, kwargs)
        own = next((type(v).__name__ for k, v in kwargs.items() if k in CACHE_NAMES
                    and v is not None and not isinstance(v, (CacheToken, bool))), None)
        if own is not None:  # their own cache class (Raschka's KVCache): only their model can fill it
            raise TypeError(f"the stand-in model cannot fill a cache object of your own ({own}); check "
                            "generate with your model in the same file, or write the adapter")
        B, T = ids.shape
        prior_ids, prior_pos = self._prior(ids, cache, start)
        pads = _padding(ids, prior_ids.size(1) + T, args, kwargs)  # (B, S + T): the cached tokens' too
        positions = _given_positions(ids, pads, args) if positions is None else positions
        if positions is None:
            first = given(start, prior_ids.size(1))
            positions = torch.arange(first, first + T)[None].expand(B, T)
            counted = then(pads, lambda p: (p.cumsum(-1) - 1).clamp(min=0)[:, -T:])  # left padding
            positions = given(counted, positions)
        positions = positions.long().expand(B, T)  # (one row (1, T) handed for every sequence)
        full_ids, full_pos = torch.cat([prior_ids, ids], 1), torch.cat([prior_pos, positions], 1)
        cached = cache is not None or start is not None
        self.calls.append(Call(ids, prior_ids.size(1), positions, cached, start))
        if full_ids.size(1) > self.block_size or int(full_pos.max()) >= self.block_size:
            raise ContextTooLong(f"Cannot forward sequence of length {full_ids.size(1)}, block size is only "
                                 f"{self.block_size}")
        if start is not None:
            self.stream = full_ids
        with torch.no_grad():
            out = self.model(full_ids, attention_mask=pads, position_ids=full_pos)
            logits = out.logits[:, -T:]  # (B, T, V)
        logits = ban(shifted(logits) * (1.0 if SOFT[0] else PEAK))
        new_cache = CacheToken(full_ids, full_pos) if _cache_asked(cache, args, kwargs) else None
        if self.style in FILLED_IN_PLACE:  # no cache comes back: the one handed (if any) fills
            getattr(cache, "hold", lambda *held: None)(full_ids, full_pos)
        return RETURNS[self.style](logits[0] if one & (self.style == "unbatched") else logits, new_cache)

    def _prior(self, ids: Tensor, cache: CacheToken | None, start: int | None) -> tuple[Tensor, Tensor]:
        """The ids and positions (B, S) seen before this call's: the cache's, or Meta's tokens at
        positions 0 .. start_pos - 1 (the ones fed before), or none."""
        B = ids.size(0)
        if cache is not None:
            return cache.ids.expand(B, -1), cache.positions.expand(B, -1)
        if start is not None:
            stream = given(self.stream, ids[:, :0])
            return stream[:, :start], torch.arange(stream[:, :start].size(1))[None].expand(B, -1)
        return ids[:, :0], ids[:, :0]


# what a call of the model returns, in each style a learner's loop unpacks
RETURNS: dict[str, Callable[[Tensor, CacheToken | None], Any]] = {
    "tensor": lambda logits, cache: logits, "tuple": lambda logits, cache: (logits, cache),
    "loss_first": lambda logits, cache: (None, logits, cache),  # Hugging Face's (loss, logits, presents)
    "unbatched": lambda logits, cache: logits,  # (T, V) for the (T,) ids of one sequence
    "object": lambda logits, cache: types.SimpleNamespace(logits=logits, past_key_values=cache, loss=None)}


# the styles whose call returns logits alone: a cache handed in can only be filled where it is
FILLED_IN_PLACE = ("tensor", "unbatched")


def _cache_asked(cache: CacheToken | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call gets a new cache back: one handed back, use_cache set, an argument named for a
    cache given at all (Hugging Face's first call, past_key_values=None), or a None handed in a place
    after the ids (`model(ids, mask, position_ids, past_key_values)` with past_key_values=None)."""
    named = bool(kwargs.get("use_cache") or set(kwargs) & set(CACHE_NAMES))
    return cache is not None or named or any(v is None for v in args)


def _padding(ids: Tensor, total: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The attention mask (B, total) a loop hands the model, by name or as a 0/1 tensor that covers the
    cached tokens and the new ones (Hugging Face's model(input_ids, attention_mask), the mask one
    column longer at each cached step); None when it hands none."""
    given = list(map(kwargs.get, MASK_ARG_NAMES)) + list(args)
    return next((v.long() for v in given if isinstance(v, Tensor) and v.shape == (ids.size(0), total)
                 and not v.is_floating_point() and bool(v.long().clamp(0, 1).eq(v).all())), None)


def _given_positions(ids: Tensor, pads: Tensor | None, args: tuple[Any, ...]) -> Tensor | None:
    """The position ids (B, T) a loop hands the model in place (`model(ids, mask, position_ids)`): an
    integer tensor shaped as the ids that is not the mask; None when it hands none."""
    return next((v for v in args if isinstance(v, Tensor) and v.shape == ids.shape and v is not pads
                 and not v.is_floating_point() and v.dtype != torch.bool), None)


def _cache_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[CacheToken | None, int | None,
                                                                             Tensor | None]:
    """(the cache handed back, Meta's start_pos, position_ids) from a call's extra arguments."""
    cache = next((v for v in list(args) + list(kwargs.values()) if isinstance(v, CacheToken)), None)
    given = [v for k, v in kwargs.items() if k in POSITION_NAMES] + list(args)  # by name first
    start = next((v for v in given if is_number(v, int)), None)
    positions = kwargs.get("position_ids")
    if not isinstance(positions, Tensor):  # mistral-src's model(ids, positions, cache): one row (T,)
        positions = next((v[None] for v in args if _position_row(v)), None)
    return cache, start, positions


def _position_row(value: Any) -> bool:
    """Whether a value handed to the model is one row of positions (T,): integers counting up by one
    (a prompt's 0..T-1, or the one position of a decoding step)."""
    return isinstance(value, Tensor) and value.dim() == 1 and not value.is_floating_point() \
        and value.numel() > 0 and bool((value.diff() == 1).all()) and int(value[0]) >= 0


@torch.no_grad()
def known_model() -> CausalLM:
    """A one-block GPT-2 style model on constructed weights whose greedy choice depends on the last
    token and its position, with a clear margin: the blocks add nothing (zero weights), a token is
    one-hot in the first 24 dimensions and its position (mod the block size) in the last 8, and the
    head is random. On the checks' prompts its greedy tokens vary and every step's two most likely
    tokens are more than 1 apart."""
    cfg = CausalLMConfig.gpt2_style(vocab_size=VOCAB, d_model=VOCAB + BLOCK, n_layers=1, n_heads=2, d_ff=32,
                                    max_positions=2 * BLOCK, dropout=0.0, tie_embeddings=False)
    model = build_causal_lm(cfg).eval()
    for name, p in model.named_parameters():
        p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
    model.embed.weight[:, :VOCAB] = 3.0 * torch.eye(VOCAB)
    model.positions.weight[:, VOCAB:] = 3.0 * torch.eye(BLOCK).repeat(2, 1)
    head = torch.randn(VOCAB, VOCAB + BLOCK, generator=torch.Generator().manual_seed(SEED))
    model.lm_head.weight.copy_(head)
    return model


def prompts(B: int) -> Tensor:
    return torch.tensor([[3, 17, 9], [11, 2, 20]])[:B]  # (B, 3)


def greedy(model: CausalLM, ids: Tensor, n: int, crop: int = BLOCK) -> Tensor:
    """n greedy tokens, each from the last `crop` tokens (nanoGPT's cropping), recomputed in full."""
    for _ in range(n):
        with torch.no_grad():
            logits = ban(model(ids[:, -crop:]).logits[:, -1])  # (B, V)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


# --- calling the learner's generate ---------------------------------------------------------------

def styles_read(fn: Any) -> tuple[str, ...]:
    """What the learner's loop unpacks: a (logits, loss) tuple, `.logits`, a tensor, or three things
    (Hugging Face's (loss, logits, presents)); the one their source shows first, then the others; last,
    a tensor (T, V) for the ids (T,) of one sequence (a loop of gpt-oss's, whose model takes no batch)."""
    source = code_text(fn)  # what its code unpacks, not what a comment says (`# p.logits shape ...`)
    order = ["tensor", "tuple", "object", "unbatched", "loss_first"]
    unpacked = r"\w+\s*,\s*\w+\s*=\s*(self|model|\w+)\s*\("
    shows = (("object", r"\.logits\b"), ("loss_first", r"\w+\s*,\s*" + unpacked), ("tuple", unpacked))
    shown = next((style for style, code in shows if re.search(code, source)), None)
    return tuple(sorted(order, key=lambda style: style != shown))


def call_generate(ctx: Context, comp: Component, model: LanguageModel, ids: Tensor, n: int,
          extra: dict[str, Any] | None = None) -> Any:
    """generate(model, ids, n): the learner's parameters filled by name, or else by position (by
    position up to the first one left to its default: `self` of a method cannot go by name)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    n += prompt_length(ids) * (comp.obj in TOTAL_COUNTS)  # Hugging Face's max_length: prompt included
    roles = ((MODEL_NAMES, model.target), (PROMPT_NAMES, ids), (COUNT_NAMES, n),
             (CONTEXT_NAMES, model.context), (PROCESSOR_NAMES, NoProcessors()),  # each argument's, by name
             (TOKENIZER_NAMES, PromptTokenizer(ids)), (MESSAGE_NAMES, list(map(dict, CONVERSATION))))
    # and where it has no default: an EOS no model makes, a padding id, a mask of real tokens only, the
    # model's cache on, one continuation a prompt (build-nanogpt's num_return_sequences)
    ones = torch.ones_like(torch.as_tensor(ids)) if _rectangular(ids) else None  # (a ragged list: none)
    needed = ((EOS_NAMES, NEVER), (PAD_NAMES, PAD_ID), (MASK_ARG_NAMES, ones), (CACHE_SWITCH_NAMES, True),
              (SAMPLES_NAMES, 1))
    # the first role that names it; a setting of no role, its neutral value
    by_name, if_needed = {**_own_arguments(ctx, comp), **_by_names(roles[::-1])}, _by_names(needed)
    by_name[counted_parameter(comp.obj).lower()] = n  # range(max_steps) (none: "", no parameter's name)
    extra, model.counted = extra or {}, False
    for i, p in enumerate(forward_parameters(comp.obj)):
        value = extra.get(p.name, by_name.get(p.name.lower(), [if_needed.get(p.name.lower()), None][
            p.default is not p.empty]))
        if value is None and p.default is p.empty:  # a settings object of their own class
            value = _own_options(ctx, comp, p, model, n, extra, _rows(ids))
        model.counted |= _counts(comp.obj, p, i, value)
        if value is None and p.default is not p.empty:
            continue
        if value is None and i >= 3:
            raise DiscoveryError(f"cannot fill the argument {p.name!r} of {comp.name}: handformer calls "
                                 "generate(model, idx, max_new_tokens) (and fills context_size or block_size "
                                 "with the model's block size)",
                                 zh=f"填不了 {comp.name} 的参数 {p.name!r}：handformer 调用 generate(model, "
                                    "idx, max_new_tokens)（context_size 或 block_size 填模型的 block size）")
        value = (model.target, ids, n)[i] if value is None else value
        if kwargs or len(args) != i:
            kwargs[p.name] = value
        else:
            args.append(value)
    _handed(comp, model, n, [*args, *kwargs.values()])
    return ctx.learner.call("forward", drained(comp.obj), *args, **kwargs)


def _handed(comp: Component, model: LanguageModel, n: int, values: list[Any]) -> None:
    """Before the loop runs: a function none of whose arguments is check's model runs a model of its
    file's own (NOT CHECKED, prompt_forms.py); what it reads off the model it is handed (`_carry`)."""
    if "." not in comp.name and all(v is not model.target for v in values):
        raise unhanded_model(comp.name, [p.name for p in forward_parameters(comp.obj)])
    _carry(comp, model, n)
    model.counted |= n in dict(getattr(model, "carried", [])).values()  # self.args.max_len


def _counts(fn: Any, p: inspect.Parameter, i: int, value: Any) -> bool:
    """Whether the parameter p (at position i, filled with value) hands the loop its count: named for a
    count, counted by (`counted_parameter`), the third one filled by position, or a settings object."""
    positional = (i, value, p.default) == (2, None, p.empty)
    return p.name.lower() in {*COUNT_NAMES, counted_parameter(fn).lower()} or positional or (
        options_class(fn, p.name) is not None)


def _carry(comp: Component, model: Any, n: int) -> None:
    """The stand-in given what the loop reads off it (`model.config.eos_token_id`, `self.args.max_len`):
    carried.py, at this run's sizes (n new tokens, no EOS)."""
    if isinstance(model, LanguageModel):
        sizes = {"context": model.context, "vocab": VOCAB, "count": n, "eos": NEVER, "pad": PAD_ID}
        model.carried = carry(model, comp.obj, model_argument(comp.obj), sizes)


def _rows(ids: Any) -> int:
    """How many prompts a loop is handed: one for a list of ints or ids (T,), else the batch's rows."""
    return 1 if fp.token_list(ids) or getattr(ids, "dim", lambda: 2)() < 2 else len(ids)


def _own_options(ctx: Context, comp: Component, p: inspect.Parameter, model: LanguageModel, n: int,
                 extra: dict[str, Any], rows: int) -> Any:
    """A settings object of the learner's own class that the loop reads (vLLM's SamplingParams), built
    at its defaults, the count n, no EOS, the block size, every neutral setting, and what a check asks
    for by name (a temperature) (options_object.py); the settings left at values the reference has no
    place for kept as the component's unmapped state."""
    own = options_class(comp.obj, p.name)
    if own is None:
        return None
    counted = dict.fromkeys(map(str.lower, counted_fields(comp.obj)), n)  # range(request.max_new)
    given = {**counted, **dict.fromkeys(COUNT_NAMES, n), **dict.fromkeys(EOS_NAMES, NEVER),
             **dict.fromkeys(TOP_K_NAMES, VOCAB), **dict.fromkeys(CONTEXT_NAMES, model.context),
             **{name.lower(): value for name, value in extra.items()}}
    options, left, neutral = build_options(own, given)
    left = [word for word in left if word.split("=")[0].lower() not in counted]  # its count: check's n
    holder = (OBJECT[0].format(p.name), OBJECT[1].format(p.name))
    ctx.unmapped[comp.name] += unmapped_words(holder, left)  # after its arguments' (`_own_arguments`)
    ctx.neutral[comp.name] += neutral_words(holder, neutral)
    return [options] * rows if per_row(comp.obj, p.name) else options  # one a prompt: vLLM's list of them


def _own_arguments(ctx: Context, comp: Component) -> dict[str, Any]:
    """The loop's own arguments that have a neutral value, by name, set to it; those left at a value the
    reference has no place for, and those set so, kept for the report (options_object.py)."""
    neutral, left, shown = signature_settings(comp.obj)
    ctx.unmapped[comp.name] = unmapped_words(ARGUMENTS, left)
    ctx.neutral[comp.name] = neutral_words(ARGUMENTS, shown)
    return neutral


# the loops whose count is read as the total length, prompt included (`_total_length`)
TOTAL_COUNTS: weakref.WeakSet[Any] = weakref.WeakSet()


def prompt_length(ids: Any) -> int:
    """The prompt's length: a (B, T) tensor's T, a list of ints', the longest of lists'."""
    return torch.as_tensor(ids).size(-1) if _rectangular(ids) else max(map(len, ids))


def _rectangular(ids: Any) -> bool:
    """Prompts of one length (a tensor, or lists as long as each other)."""
    return isinstance(ids, Tensor) or len({len(row) if isinstance(row, list) else 1 for row in ids}) < 2


def _by_names(table: Any) -> dict[str, Any]:
    """{name: value} from ((names, value), ...)."""
    return {name: v for names, v in table for name in names}


def drained(fn: Any) -> Any:
    """A generator function (nanochat's generate, which yields one token at a time) as a function
    that returns the tokens it yields."""
    return (lambda *a, **k: list(fn(*a, **k))) if inspect.isgeneratorfunction(fn) else fn


def new_tokens(out: Any, prompt: Tensor, n: int) -> Tensor | None:
    """The tokens a generate returned after the prompt, (B, n'), from (B, T + n) ids (nanoGPT), (B, n)
    new ones, or lists of them."""
    B, T = prompt.shape
    out = read_text(_ids_in(out) if isinstance(out, dict) else out)
    if isinstance(out, tuple) and len(out) == 2 and _beside_ids(out[1]) and not _scores(out[0]) \
            and isinstance(out[0], (Tensor, list)):
        out = out[0]  # Meta's (tokens, logprobs), (tokens, None); (tokens, forward passes) of a parallel loop
    if fp.token_list(out) and out:  # a non-empty list of ids: one sequence
        out = [out]
    if isinstance(out, (list, tuple)) and out and all(isinstance(v, (list, tuple, Tensor)) for v in out):
        out = quietly(lambda: torch.stack([torch.as_tensor(v).reshape(-1).long() for v in out]), RuntimeError)
    if not isinstance(out, Tensor) or out.is_floating_point() or out.dim() not in (1, 2) or out.numel() % B:
        return None
    out = out.reshape(B, -1).long()
    if out.size(1) >= T and torch.equal(out[:, :T], prompt):
        return out[:, T:]
    return out


def _ids_in(out: dict[Any, Any]) -> Any:
    """A loop that returns a dict ({"tokens": ids, "steps": n}, {"sequences": ids, "scores": ...}): its
    one value that is not what a loop returns beside its ids, else the dict as it is (read as no tokens)."""
    ids = [v for v in out.values() if not _beside_ids(v)]
    return ids[0] if len(ids) == 1 else out


def _beside_ids(value: Any) -> bool:
    """What a loop returns beside its tokens: nothing, their scores, a count (the forward passes a
    loop that accepts several tokens a step made, Jacobi or lookahead decoding), or why it stopped
    (an API's finish_reason, "stop" or "length")."""
    return value is None or _scores(value) or is_number(value) or isinstance(value, str)


def _scores(value: Any) -> bool:
    """Whether a value a generate returns is float scores (the log-probabilities of its tokens, a
    sampler's state at each step: Mirostat's mu): a float tensor, or a non-empty list of floats."""
    floats = isinstance(value, list) and bool(value) and all(isinstance(v, float) for v in value)
    return floats or getattr(value, "is_floating_point", lambda: False)()  # (not None, not ids)


@dataclass
class Run:
    label: Text
    model: LanguageModel
    prompt: Tensor
    n: int
    out: Tensor | None = None  # the new tokens
    failure: fp.LearnerFailure | None = None
    as_list: bool | str = False  # the prompt was handed over as a list of ints (ROWS: a list of them each)
    extra: dict[str, Any] | None = None  # the arguments it was given besides model, prompt and count


ROWS = "rows"  # the prompts handed as a list of lists of ints (vLLM's prompts of several lengths)
ONE = "one"  # one prompt handed as a tensor of its ids (T,) (gpt-fast's generate(model, prompt, ...))


def handed(prompt: Tensor, as_list: bool | str) -> Any:
    """The (B, T) prompts as a loop is handed them: the tensor, one prompt's list of ints, (ROWS) a
    list of each prompt's, or (ONE) one prompt's ids (T,)."""
    return {False: prompt.clone, True: prompt[0].tolist, ROWS: prompt.tolist, ONE: prompt[0].clone}[as_list]()


def run_generate(ctx: Context, comp: Component, driver: Any, n: int, B: int, as_list: bool | str = False,
                 extra: dict[str, Any] | None = None) -> Run:
    """The learner's generate on B prompts of 3 tokens (a (B, 3) tensor, or one prompt as a list of
    ints) for n new tokens, each return style tried in turn (their first failure kept), with a fresh
    model from `driver` (StandIn, or generate_own.OwnDriver) for each try."""
    first: Run | None = None
    for style in driver.styles(comp.obj):
        model = driver.new_model(style, budget=n + 3)
        model.prompts = B  # a loop may run each prompt through the model on its own (`calls_made`)
        prompt = prompts(B)
        model.asked = prompt.size(1) + n  # the tokens it must stop at (`went_on`)
        label = text(f"{B} prompt{'s' if B > 1 else ''}, {n} new tokens", f"{B} 个提示词、{n} 个新 token")
        run = Run(label, model, prompt, n, as_list=as_list, extra=extra)
        try:
            raw = call_generate(ctx, comp, model, handed(prompt, as_list), n,
                        {**fixed_defaults(comp.obj), **(extra or {})})
        except fp.LearnerFailure as failure:
            if failure.error.kind == "cannot_call":  # the model handed is not the one it is written for
                raise
            _unwitnessed(comp, model, failure)
            if getattr(driver, "lower_precision", lambda _: False)(failure):  # a float32 of theirs: again so
                getattr(model, "close", lambda: None)()  # its hooks off before the new model's go on
                return run_generate(ctx, comp, driver, n, B, as_list, extra)
            run.failure = failure
            if _named(run):
                return run
            first = first or run
            continue
        finally:
            getattr(model, "close", lambda: None)()  # the hooks on the learner's own model
        run.out = new_tokens(raw, prompt, n)
        if run.out is not None:
            return run
        first = first or run
    assert first is not None
    return first




def _unwitnessed(comp: Component, model: Any, failure: fp.LearnerFailure) -> None:
    """A run that check's stand-in stopped (too many calls, too long a context) where the loop's
    mistake was not witnessed: it was handed no count (it ran with one of its own, `counted`), or it
    called the model STALL times its budget without going past its count: NOT CHECKED, said so."""
    message = failure.error.message
    stopped = message.startswith((TooManyCalls.__name__, ContextTooLong.__name__))
    uncounted = stopped > getattr(model, "counted", True)  # (a > b of two truths: a and not b)
    stalled = message.startswith(TooManyCalls.__name__) > witnessed(model)
    said = {"name": comp.name, "names": ", ".join(COUNT_NAMES[:3]), "calls": len(model.calls)}
    for en, zh in [(UNCOUNTED, UNCOUNTED_ZH)] * uncounted + [(STALLED, STALLED_ZH)] * stalled:
        raise fp.cannot_call(en, zh, said)


UNCOUNTED = ("{name} takes no count of new tokens check can hand it (by a name such as {names}, or a "
             "parameter its loop counts its steps by), so it ran with its own: what it made past check's "
             "count is not its mistake: write an adapter that hands it the count")
UNCOUNTED_ZH = ("{name} 没有 check 能传入的新 token 个数（名字如 {names}，或循环按它计步的参数），"
                "所以它按自己的个数运行，超出 check 要求的部分不算它的错误：请写一个传入个数的适配函数")
STALLED = ("{name} called the model {calls} times without going past the tokens it was asked for: many "
           "passes a token in a form check does not read: write an adapter")
STALLED_ZH = ("{name} 调用了模型 {calls} 次，生成的 token 还没有超过要求的个数：每个 token 多次前向，"
              "check 读不出它的写法：请写一个适配函数")


def fixed_defaults(fn: Any) -> dict[str, int]:
    """Defaults of the loop that are sizes of a real vocabulary, set for check's small one: an EOS id
    (minimind's eos_token_id=2) to an id no model generates, so that a loop is not stopped by a token
    it was never told is EOS (the EOS check sets its own); a top-k larger than the vocabulary
    (top_k=50) to the vocabulary's size, which keeps every token as 50 does in a real one; the number
    of samples drawn for each prompt (nanoGPT's sample.py num_samples=10) to 1, one continuation a
    prompt as every check asks for. And a StreamingLLM cache's window widened (`kept_whole`)."""
    return {p.name: value for p in forward_parameters(fn) if is_number(p.default, int)
            for names, above, value in FIXED_DEFAULTS if p.name.lower() in names and p.default > above
            } | kept_whole(fn)


# a StreamingLLM loop's window of recent tokens (beside its attention sinks), by name, and what it is set to
WINDOW_NAMES = ("window", "window_size", "recent", "recent_size", "recent_window", "window_length",
                "cache_size", "max_cache_len", "max_cache_size", "kv_window")
WIDE = 4 * BLOCK


def kept_whole(fn: Any) -> dict[str, int]:
    """The window of a loop whose cache keeps attention sinks and the most recent tokens (a parameter
    named for sinks: n_sink, sink_size, ...), set wide enough that its cache drops nothing in check's
    runs: full-context greedy decoding is then its reference, and its cache and positions are checked
    as they are; what it drops past the window is not."""
    params = forward_parameters(fn)
    sinks = any("sink" in p.name.lower() for p in params)
    return {p.name: WIDE for p in params if sinks and p.name.lower() in WINDOW_NAMES}


def sinks_note(fn: Any) -> list[Text]:
    """What check set a StreamingLLM loop's window to, and what it leaves unchecked."""
    said = ", ".join(f"{k}={v}" for k, v in kept_whole(fn).items())
    return [text(f"its cache keeps attention sinks and a window of recent tokens: run with {said}, so that "
                 "it drops nothing and its tokens are full-context decoding's; what it drops past the window "
                 "is not compared",
                 f"它的缓存保留注意力汇聚点（attention sinks）和最近的一段窗口：运行时设 {said}，"
                 "这样什么都不丢，token 就是完整上下文解码的结果；超出窗口时丢掉的部分不做比较")] * bool(said)


def defaults_note(fn: Any) -> Text | None:
    fixed = {k: v for k, v in fixed_defaults(fn).items() if k not in kept_whole(fn)}
    if not fixed:
        return None
    said = ", ".join(f"{k}={v}" for k, v in fixed.items())
    return text(f"run with {said} (its defaults are for a real vocabulary and a demo: an EOS no token "
                f"here is, a top-k that keeps all {VOCAB} tokens, one sample a prompt); the EOS check sets "
                "its own EOS",
                f"运行时设 {said}（默认值是按真实词表和演示定的：这里 EOS 设为不会生成的 id，"
                f"top-k 保留全部 {VOCAB} 个 token，每个提示词只采样一次）；EOS 检查另设 EOS")


def _overflowed(model: LanguageModel) -> bool:
    if not model.calls:
        return False
    last = model.calls[-1]
    return last.seen + last.ids.size(1) > model.block_size or int(last.positions.max()) >= model.block_size


def _runaway(model: LanguageModel) -> bool:
    """A loop that did not stop: handed its count, it spent its budget of calls after going on past it."""
    return getattr(model, "counted", True) and calls_made(model) >= model.budget and witnessed(model)


# --- the check ---------------------------------------------------------------------------------------

class StandIn:
    """The driver of a loop when the learner's own model cannot drive it: handformer's one-block GPT
    on known weights, wrapped as their loop calls a model (LanguageModel). `own_context`: the context
    the learner's model enforces (NO_LIMIT: none; None: no model of theirs could be built)."""

    def __init__(self, own_context: int | None = BLOCK) -> None:
        self.own_context = own_context
        self.model = known_model()
        short = hf_generate(self.model, prompts(2).tolist(), SHORT, temperature=0.0, threads=None)
        with banning([]):  # (handformer's bans no id)
            assert short == self.reference(2, SHORT).tolist()  # the wrapper's greedy is handformer's

    def new_model(self, style: str, budget: int) -> LanguageModel:
        return LanguageModel(known_model(), BLOCK, style, budget)

    def logits(self, ids: Tensor) -> Tensor:
        """The logits (B, t, V) the loop's model gives for ids (B, t), as scaled as in the loop."""
        return LanguageModel(self.model, BLOCK, "tensor", budget=1)(ids)

    def reference(self, B: int, n: int, crop: int = BLOCK) -> Tensor:
        return greedy(self.model, prompts(B), n, crop)[:, prompts(B).size(1):]

    def alternative(self, B: int, n: int) -> Tensor | None:
        return None

    def styles(self, fn: Any) -> tuple[str, ...]:
        return styles_read(fn)

    def driven(self) -> Text:
        return text("a stand-in: handformer's one-block GPT on known weights, its most likely token "
                    "made certain, so that a sampling loop is as deterministic as greedy decoding; it "
                    "is called as your loop calls a model (tokens -> logits, a (logits, loss) tuple or "
                    ".logits)", "替身：handformer 的单层 GPT，权重已知，最可能的 token 概率为 1，所以采样"
                    "循环和贪心解码一样确定；按你的循环调用模型的方式调用它（token -> logits、"
                    "(logits, loss) 元组或 .logits）")


def check_with(res: ComponentResult, ctx: Context, comp: Component, driver: Any) -> None:
    res.notes += [*filter(None, [defaults_note(comp.obj)]), *sinks_note(comp.obj), *counted(comp.obj)]
    short = _in_forms(ctx, comp, driver, first := run_generate(ctx, comp, driver, SHORT, 2))
    if short.out is None and not _named(first) and first.failure is not None and (
            first.failure.error.kind == "stand_in" or _own_method(comp, driver)):
        raise first.failure  # the stand-in could not serve their loop: not a prompt shape of theirs
    if short.out is None and short.failure is None:
        raise ctx.learner.fail("forward", f"{comp.name} returned no token ids for a prompt of 3 tokens and "
                               f"max_new_tokens={SHORT}",
                               f"提示为 3 个 token、max_new_tokens={SHORT} 时，{comp.name} 没有返回 token id")
    B = (short := _total_length(res, ctx, comp, driver, short)).prompt.size(0)  # its count read as it counts
    if B == 1:
        en, zh = HANDED.get(short.as_list, ("", ""))
        res.notes.append(text(f"it generates for one prompt at a time (a batch of 2 failed){en}",
                              f"它一次只能为一个提示词生成（2 个一批时失败了）{zh}"))
    reference = driver.reference(B, SHORT)
    _no_search(comp, short, reference)  # a search greedy decoding does not judge: NOT CHECKED, never FAIL
    _judge(res, ctx, comp, short, reference)
    tried = [(short, reference)]  # the runs and the tokens each is judged against
    if any(c.cached for c in short.model.calls):
        res.notes.append(CACHED_NOTE)
        if getattr(short.model, "resets", None) is not None:  # a cache kept in their own model: empty again?
            again = run_generate(ctx, comp, driver, SHORT, B, short.as_list)
            again.label = text(f"{again.label['en']}, again (the cache your model keeps must start empty)",
                               f"{again.label['zh']}，再来一次（模型自己保存的缓存必须先清空）")
            _judge(res, ctx, comp, again, reference)
    elif not res.has("generate_not_appended", "generate_does_not_stop"):
        tried += _top_one(res, ctx, comp, driver, short, reference)
        if not knows_block_size(comp):
            res.notes.append((NO_BLOCK_NOTE, READ_ONLY_NOTE)[crops_by_limit(comp.obj, *LIMITS) is False])
        elif (not_due := _stand_in_context(comp, driver)) is not None:
            res.notes.append(not_due)
        else:
            tried.append(_long(res, ctx, comp, driver, B, short.as_list))
    _steps_checked(res, comp, short)
    # each driven once more on soft logits
    for probe in (check_temperature, check_top_p, check_top_k, check_repetition_penalty):
        probe(res, ctx, comp, driver, short, run_generate)
    _ending(res, ctx, comp, driver, tried)


def _in_forms(ctx: Context, comp: Component, driver: Any, short: Run) -> Run:
    """The first run in a prompt form the loop takes (PROMPT_FORMS, after (2, T)); where none runs, a
    loop its file hands text is NOT CHECKED (prompt_forms.py), not a form check has."""
    for B, as_list in PROMPT_FORMS:
        if short.out is not None or _named(short):
            break
        short = run_generate(ctx, comp, driver, SHORT, B, as_list)
    if short.out is None and handed_text(comp.obj):
        raise text_prompt(comp.name)
    return short


# one prompt (1, T), its ids (T,), a list of ints; lists of them: the forms tried after (2, T)
PROMPT_FORMS = ((1, False), (1, ONE), (1, True), (2, ROWS))
HANDED = {True: (", given as a list of ints", "，提示词是整数列表"),
          ONE: (", given as one tensor of ids (T,)", "，提示词是一维的 id 张量 (T,)")}


def counted(fn: Any) -> list[Text]:
    """The note naming the parameter read as the count by the loop's form (`counted_parameter`)."""
    name = counted_parameter(fn)
    return [text(f"its {name} is handed the number of new tokens: its loop counts its steps by it",
                 f"它的 {name} 传入新 token 的个数：它的循环按它计步")] * bool(name)


def _steps_checked(res: ComponentResult, comp: Component, run: Run) -> None:
    """Each step's logits against the full forward's (generate_lossy.cache_checks) and a context lost
    (`_cache_unused`), where the loop decodes with a cache or feeds its model one token a step (the
    calls after the first hold fewer tokens than the prompt) without one."""
    calls = run.model.calls
    short = len(calls) > 1 and all(c.ids.size(1) < calls[0].ids.size(1) for c in calls[1:])
    if any(c.cached for c in calls) or short:
        res.checks += lossy.cache_checks(run)
        _cache_unused(res, comp, run)


def _cache_unused(res: ComponentResult, comp: Component, run: Run) -> None:
    """A loop whose every step after the first computes its token from the token it fed alone, where its
    tokens did not show it (a model whose likeliest next token is the one it was fed, whatever came
    before): the cache its model hands back is never handed in again (generate_cache_mismatch, at the
    first line of its loop that names a cache)."""
    if res.findings or all(check.ok is not False for check in res.checks) or not lossy.context_lost(run):
        return
    number, code = cache_line(list(source_lines([comp.obj])))
    res.findings.append(Finding("generate_cache_mismatch", text(
        "each step after the first gives the logits of the token it fed alone, at position 0: the cache "
        "the model returned was not handed back", "第一步之后每一步的 logits 都是只输入那一个 token、"
        "位置为 0 时的结果：模型返回的缓存没有再传回去"), number, code))


CACHE_WORDS = re.compile(r"cache|past|kv", re.IGNORECASE)
LOOP_START = re.compile(r"^\s*(for|while)\b")


def cache_line(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first line of a loop's body that names a cache (`cache = KVCache(...)` made afresh, a model
    call handed `past_key_values=past`), where a loop that never hands back its cache parts from one that
    does; else the catalogued patterns' line."""
    body = itertools.dropwhile(lambda line: not LOOP_START.match(line[1]), lines)
    found = next((line for line in itertools.islice(body, 1, None)
                  if CACHE_WORDS.search(line[1].split("#")[0])), None)
    return (found[0], found[1].strip()) if found else locate("generate_cache_mismatch", lines)


CACHED_NOTE = text("it decodes with a KV cache: after the prompt it feeds one token at a time",
                   "它用 KV 缓存解码：处理完提示词之后每次只输入一个 token")


def _no_search(comp: Component, run: Run, reference: Tensor) -> None:
    """NOT CHECKED (a cannot_call) where the loop calls the model on more rows than it was given prompts:
    a search over candidates or beams (contrastive search in a form not read as one, a beam search
    in a generate), whose tokens greedy decoding is no reference for (asked where they differ from
    greedy decoding's, or the loop called the model too often: a search calls it more than once a
    token)."""
    B, rows = run.prompt.size(0), max((c.ids.size(0) for c in run.model.calls), default=0)
    made, wrong = calls_made(run.model), run.out is None or not torch.equal(run.out, reference)
    if rows > B and max(wrong, made > run.n + 1):  # (a search: wrong, or more calls than tokens)
        said = {"name": comp.name, "rows": rows, "B": B}
        raise fp.cannot_call(SEARCH, SEARCH_ZH, said)
    if made > run.n + 1 and wrong and not _runaway(run.model):
        said = {"name": comp.name, "calls": round(made), "n": run.n}
        raise fp.cannot_call(PASSES, PASSES_ZH, said)


SEARCH = ("{name} calls the model on {rows} rows for {B} prompts: a search over candidates (contrastive "
          "search, beams) in a form check does not read, so greedy decoding is not its reference")
PASSES = ("{name} called the model {calls} times for {n} new tokens and stopped: more than one pass a "
          "token (the unconditional pass of classifier-free guidance, a draft verified) in a form check does "
          "not read, so greedy decoding is not its reference: write an adapter that runs it with it off")
PASSES_ZH = ("{name} 为 {n} 个新 token 调用了模型 {calls} 次后停下：每个 token 不止一次前向"
             "（无分类器引导的无条件前向、对草稿的验证），check 读不出它的写法，贪心解码不是它的参考："
             "请写一个关掉这次前向的适配函数")
SEARCH_ZH = ("{name} 对 {B} 个提示词用 {rows} 行调用模型：这是对候选的搜索（对比搜索、束搜索），"
             "check 读不出它的写法，贪心解码不是它的参考")


def _total_length(res: ComponentResult, ctx: Context, comp: Component, driver: Any, short: Run) -> Run:
    """A loop whose count, by a name that does not say new tokens (max_length), is the total length,
    prompt included (Hugging Face's max_length): asked for SHORT tokens it gave SHORT - T after a prompt
    of T. Read so (TOTAL_COUNTS) where, handed T + SHORT, it gives SHORT; noted. Else `short`. (What
    the stand-in of the run carried for the loop is noted first: carried.py.)"""
    res.notes += carried_note(getattr(short.model, "carried", []))
    # a count no name says (litgpt's max_returned_tokens, read as the count by its loop): its own name
    name = named(forward_names(comp.obj), COUNT_NAMES) or counted_parameter(comp.obj) or "new"
    T = short.prompt.size(1)
    if short.out is None or short.out.size(1) != SHORT - T or "new" in name.lower():
        return short
    TOTAL_COUNTS.add(comp.obj)
    again = run_generate(ctx, comp, driver, SHORT, short.prompt.size(0), short.as_list)
    if again.out is None or again.out.size(1) != SHORT:
        TOTAL_COUNTS.discard(comp.obj)
        return short
    res.notes = [n for n in res.notes if n not in counted(comp.obj)]  # not the new tokens alone: the total
    res.notes.append(text(f"its {name} counts the prompt too (Hugging Face's max_length): asked for {SHORT} "
                          f"it gave only {SHORT - T} after a prompt of {T}, so it is handed the prompt's "
                          "length plus the new tokens",
                          f"它的 {name} 把提示词也算进去（Hugging Face 的 max_length）：要 {SHORT} 个时，"
                          f"提示词 {T} 个之后只给了 {SHORT - T} 个，所以传入提示词长度加新 token 数"))
    return again


def _own_method(comp: Component, driver: Any) -> bool:
    """A class's own method (`GemmaForCausalLM.generate`) handed check's stand-in as its `self`: where
    every try fails, the first one's error is the stand-in's (gemma_pytorch's reads self.config)."""
    return "." in comp.name and isinstance(driver, StandIn)


def _top_one(res: ComponentResult, ctx: Context, comp: Component, driver: Any, short: Run, reference: Tensor,
             ) -> list[tuple[Run, Tensor]]:
    """A loop that takes a top-k driven again with top_k = 1: the one token it keeps is the likeliest,
    so its tokens are greedy's (a filter that drops the k-th token keeps none); the run, judged. A loop
    whose top-k serves one prompt at a time (Raschka's `logits < top_logits[:, -1]`) is judged so."""
    name = named(forward_names(comp.obj), TOP_K_NAMES)
    if name is None or short.out is None:
        return []
    for B in dict.fromkeys((short.prompt.size(0), 1)):
        run = run_generate(ctx, comp, driver, SHORT, B, short.as_list, {name: 1})
        if run.out is not None:
            break
    run.label = text(f"{run.label['en']}, {name}=1 (the likeliest token alone kept)",
                     f"{run.label['zh']}，{name}=1（只保留最可能的 token）")
    _judge(res, ctx, comp, run, reference[:B])
    _kept_none(res, ctx, comp, run, name)
    return [(run, reference[:B])]


# what sampling from a row of logits that are all -inf raises (torch.multinomial on NaN probabilities)
KEPT_NONE = re.compile(r"probability tensor contains|invalid multinomial distribution")


def _kept_none(res: ComponentResult, ctx: Context, comp: Component, run: Run, name: str) -> None:
    """top_k_off_by_one (k-1) when the run with top_k = 1 raised as sampling from no token does (its
    filter dropped the k-th logit too: `logits <= v[:, [-1]]`)."""
    said = str(getattr(run.failure, "error", None) and run.failure.error.message)
    if KEPT_NONE.search(said) and not res.has("top_k_off_by_one"):
        number, code = locate("top_k_off_by_one", source_lines(ctx.objects(comp, "sample", "top_k", "top_p")))
        res.findings.append(Finding("top_k_off_by_one", text(
            f"with {name}=1 it kept no token: sampling raised {said}",
            f"{name}=1 时一个 token 都没有保留：采样时报错 {said}"), number, code, "k-1"))


def _ending(res: ComponentResult, ctx: Context, comp: Component, driver: Any, tried: list[tuple[Run, Tensor]],
            ) -> None:
    """After the runs `tried` (the short one first): its failure when nothing names it, the EOS check
    when its tokens are right, and where a wrong run departs when no mistake names it."""
    short, reference = tried[0]
    if short.failure and not res.findings and short.out is None:
        raise short.failure
    if short.out is not None and not res.findings:
        _eos(res, ctx, comp, driver, short, reference[0])
    wrong = next((run for run in tried if _wrong(*run)), None)
    if wrong:  # a mistake the localizing names wins over a probe's own line (generate_top_k's filter)
        probed = [f for f in res.findings if f.name == DEPARTS]
        res.findings = [f for f in res.findings if f.name != DEPARTS]
        note_departure(res, lambda: _localize(ctx, comp, driver, *wrong))
        named = [f for f in res.findings if f.name != DEPARTS]
        res.findings = named or probed or [f for f in res.findings if f.name == DEPARTS]


def _wrong(run: Run, expected: Tensor) -> bool:
    return run.out is not None and not torch.equal(run.out, expected)


def _localize(ctx: Context, comp: Component, driver: Any, run: Run, expected: Tensor) -> Departure | None:
    """Where the loop of `run` parts from greedy decoding (localize_generate.py), run again as it was."""
    crop = getattr(driver, "limit", BLOCK)  # their own model's: the block size, or none (a huge one)
    views, forms = generate_views(driver.logits, run.prompt, expected, crop, default_temperature(comp.obj),
                                  _top_k_of(comp, run))
    model = driver.new_model(getattr(run.model, "style", "own"), budget=run.n + 3)
    prompt = handed(run.prompt, run.as_list)
    try:
        given = {**fixed_defaults(comp.obj), **(run.extra or {})}
        return localize_generate(lambda: call_generate(ctx, comp, model, prompt, run.n, given),
                                 comp.obj, views, forms)
    finally:
        getattr(model, "close", lambda: None)()  # the hooks on the learner's own model


def _top_k_of(comp: Component, run: Run) -> int:
    """The k the run's top-k filter keeps: the one it was given, else its parameter's default (1:
    none, or no number)."""
    given = {**forward_defaults(comp.obj), **(run.extra or {})}
    k = given.get(named(list(given), TOP_K_NAMES))
    return k if isinstance(k, int) and not isinstance(k, bool) and 0 < k < VOCAB else 1


def knows_block_size(comp: Component) -> bool:
    """Whether the loop has a block size to crop to: a loop whose code crops by one it reads (a
    block_size argument, model.config.block_size, a module-level block_size) in a slice or a helper of
    its own, or takes one it never uses (loop_forms.py); else a method of the learner's model that
    reads none (nanoGPT's GPT.generate: the model is its own). A free loop that names none (GPT-2's
    sample_sequence(model, context, length)), or reads one only for something else (prompt lookup's
    room for a draft), leaves the context's length to its caller: not charged."""
    crops = crops_by_limit(comp.obj, *LIMITS)
    return {None: "." in comp.name}.get(crops, crops)


def _stand_in_context(comp: Component, driver: Any) -> Text | None:
    """Why a loop the stand-in drives is not run past its block size, where the stand-in's block is not
    the learner's model's (None where it is due): their model runs on any length (rotary positions, no
    position table), so a loop that does not crop by a limit it reads needs no crop; or the loop names
    no limit and their model could not be built to read one."""
    return NOT_DUE.get((getattr(driver, "own_context", BLOCK), crops_by_limit(comp.obj, *LIMITS)))


UNLIMITED_NOTE = text(
    f"your model runs on any length (it ran on {BLOCK + 2} tokens where the stand-in stops at {BLOCK}: no "
    "position table of that size), so the loop needs no crop: past the block size was not run",
    f"你的模型可以处理任意长度（它在 {BLOCK + 2} 个 token 上照常运行，而替身到 {BLOCK} 为止："
    "没有那么大的位置表），所以循环不需要裁剪：没有运行超过 block_size 的情形")
UNKNOWN_CONTEXT_NOTE = text(
    "the loop names no block size and your model could not be built to read its context, so past the "
    "block size was not run (the stand-in's block size is not your model's)",
    "循环没有提到 block_size，而检查程序构建不了你的模型来读出它的上下文长度，"
    "所以没有运行超过 block_size 的情形（替身的 block_size 不是你模型的）")
# (their model's context, whether the loop crops by a limit it reads) -> why it is not run past the block
NOT_DUE = {(NO_LIMIT, None): UNLIMITED_NOTE, (NO_LIMIT, False): UNLIMITED_NOTE,
           (None, None): UNKNOWN_CONTEXT_NOTE}


LIMIT_NAMES = CONTEXT_NAMES + ("max_len", "n_ctx", "n_positions")
LIMITS = (LIMIT_NAMES, ROLE_NAMES["context"])  # a limit's names, and its attributes' (a config's .seq_length)


NO_BLOCK_NOTE = text("it names no block size, so it feeds the whole context: past the block size was not "
                     "run (the caller keeps the prompt and new tokens within the model's context); a "
                     "loop that crops reads it: idx[:, -block_size:]",
                     "它没有提到 block_size，所以输入的是整个上下文：没有运行超过 block_size 的情形"
                     "（由调用者保证提示词加新 token 不超过模型的上下文）；会裁剪的循环要读取它："
                     "idx[:, -block_size:]")

READ_ONLY_NOTE = text("it reads the block size but neither crops by it nor stops at it (no slice of the "
                      "tokens by it, no helper handed it, no comparison with it), so it feeds the whole "
                      "context: past the block size was not run (the caller keeps the prompt and new tokens "
                      "within the model's context)",
                      "它读取了 block_size，但既不用它裁剪，也不在它那里停下（没有按它切片 token，"
                      "没有把它交给辅助函数，也没有和它比较），所以输入的是整个上下文："
                      "没有运行超过 block_size 的情形（由调用者保证提示词加新 token 不超过模型的上下文）")


def _long(res: ComponentResult, ctx: Context, comp: Component, driver: Any, B: int, as_list: bool | str,
          ) -> tuple[Run, Tensor]:
    """LONG new tokens: past the block size, where a model with a position table needs the crop; a
    crop that a model without one does not need is a choice (noted), not a mistake. The run and the
    tokens it is judged against."""
    long = run_generate(ctx, comp, driver, LONG, B, as_list)
    expected, cropped = driver.reference(B, LONG), driver.alternative(B, LONG)
    if refused(comp, long):
        res.notes.append(text(f"it refuses more than the block's {BLOCK} tokens with its own assert or raise "
                              f"({long.failure.error.message}): a stated limit, not a mistake",
                              f"超过块长 {BLOCK} 个 token 时它用自己的 assert 或 raise 拒绝"
                              f"（{long.failure.error.message}）：这是明说的限制，不是错误"))
        return Run(long.label, long.model, long.prompt, long.n), expected
    expected = _past_block(res, long, expected, cropped, _shorter(driver, B))
    _judge(res, ctx, comp, long, expected)
    return long, expected


CROPPED_NOTE = text(f"it crops the context to the last {BLOCK} tokens, which your model does not need "
                    "(it has no position table of that size): a choice",
                    f"它把上下文裁剪到最后 {BLOCK} 个 token，而你的模型并不需要"
                    "（它没有这么大的位置表）：这是一种选择")
FULL_NOTE = text(f"it stops once the context holds the block's {BLOCK} tokens instead of cropping it "
                 "(as Hugging Face's generate stops at max_length): a convention",
                 f"上下文到了块长 {BLOCK} 个 token 时它就停下，而不是裁剪上下文"
                 "（和 Hugging Face 的 generate 在 max_length 处停下一样）：这是一种约定")


SHORTER_NOTE = text("it crops the context to one token fewer than its model takes (GPT2-Chinese's "
                    "`generated[0][-(n_ctx - 1):]`): a choice, compared so",
                    "它把上下文裁剪到比模型能接受的少一个 token（GPT2-Chinese 的 "
                    "`generated[0][-(n_ctx - 1):]`）：这是一种选择，按它比较")


def _shorter(driver: Any, B: int) -> Tensor | None:
    """The tokens of a loop that crops the context one token short of its model's limit (the stand-in's
    BLOCK; none where that crop cuts nothing: a model with no limit)."""
    limit = getattr(driver, "limit", BLOCK)
    return driver.reference(B, LONG, limit - 1) if limit - 1 < prompts(B).size(1) + LONG else None


def _past_block(res: ComponentResult, long: Run, expected: Tensor, cropped: Tensor | None,
                shorter: Tensor | None = None) -> Tensor:
    """The tokens a run past the block size is judged against: handformer's greedy ones, or the
    convention it matches (noted): the context cropped where the model needs no crop, cropped one
    token short, or the loop stopped once the context is full (the new tokens that fill it, no more)."""
    full = expected[:, :max(BLOCK - long.prompt.size(-1), 0)]  # (B, BLOCK - T)
    for tokens, note in ((cropped, CROPPED_NOTE), (shorter, SHORTER_NOTE), (full, FULL_NOTE)):
        if tokens is not None and long.out is not None and torch.equal(long.out, tokens) and not torch.equal(
                tokens, expected):
            res.notes.append(note)
            return tokens
    return expected


def refused(comp: Component, run: Run) -> bool:
    """Their loop refused the request itself: its one frame an assert or raise in the loop's own body
    (gpt-fast's `assert T_new <= model.config.block_size`), before any model ran."""
    frames = getattr(getattr(run.failure, "error", None), "traceback", [])
    own = rf"line \d+, in {re.escape(comp.obj.__name__)}: (assert|raise)\b"
    return len(frames) == 1 and bool(re.match(own, frames[0]))


def _eos(res: ComponentResult, ctx: Context, comp: Component, driver: Any, short: Run, reference: Tensor,
         ) -> None:
    """A loop with an EOS parameter is given as EOS the token the model makes likeliest at a step
    (the first new token not seen before it): it must stop there (EOS kept, EOS repeated after it
    read as padding, or EOS left out). A loop that takes a padding id is given one the model does not
    make here: a finished row filled with it to max_new_tokens (a batched loop that never breaks) has
    stopped too. A loop with no EOS parameter is not charged."""
    eos_name = named(forward_names(comp.obj), EOS_NAMES)
    if eos_name is None:
        return
    seen = reference.tolist()
    k = next((i for i in range(1, len(seen) - 1) if seen[i] not in seen[:i]), None)
    if k is None:
        return
    eos, pad = int(reference[k]), min(set(range(VOCAB)) - set(seen))  # (a padding id it does not make)
    pad_name = named(forward_names(comp.obj), PAD_NAMES)
    given = {name: value for name, value in ((eos_name, eos), (pad_name, pad)) if name}
    run = run_generate(ctx, comp, driver, SHORT, 1, short.as_list, given)
    want = reference[:k + 1].tolist()
    got = then(run.out, lambda o: o[0].tolist())
    dropped = got == want[:k]  # stopped before appending EOS (Raschka's loop): a convention
    stopped = dropped or (got is not None and got[:k + 1] == want and set(got[k + 1:]) <= {eos, pad})
    if dropped:
        res.notes.append(text(f"at EOS ({eos_name}={eos}) it stops without appending EOS, a convention",
                              f"遇到 EOS（{eos_name}={eos}）时它不把 EOS 加进结果就停下，这是一种约定"))
    res.checks.append(Check(text(f"with {eos_name}={eos}, the token the model makes likeliest at new token "
                                 f"{k}, it stops there: {want}",
                                 f"{eos_name}={eos}（模型在新 token 位置 {k} 最可能给出的 token）时"
                                 f"在那里停下：{want}"),
                            stopped, text(f"got {got}", f"实际得到 {got}")))
    if not stopped and got is not None and got[:k + 1] == want:
        number, code = locate("greedy_no_stop_at_eos", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("greedy_no_stop_at_eos", text(
            f"with {eos_name}={eos} emitted as new token {k}, it went on to {len(got)} new tokens: {got}",
            f"{eos_name}={eos} 作为新 token {k} 输出之后，它继续生成到 {len(got)} 个新 token：{got}"),
            number, code))


def _named(run: Run) -> bool:
    """Whether the run's calls name its mistake: past the block size, or more calls than allowed."""
    return _overflowed(run.model) or _runaway(run.model)


def _judge(res: ComponentResult, ctx: Context, comp: Component, run: Run, expected: Tensor) -> None:
    """The check of one run against handformer's greedy tokens, and the finding that explains a
    difference (from the calls the loop made)."""
    broken = _positions_break(run)  # right tokens, by luck, from positions that do not follow on
    exact = run.out is not None and torch.equal(run.out, expected)
    # rounding may change which token, never how many (a loop that stops early or runs on is no rounding)
    same_size = getattr(run.out, "shape", None) == expected.shape
    ok = (exact or same_size and lossy.excused(run)) and broken is None
    got = run.out.tolist() if run.out is not None else (run.failure.error.message if run.failure else None)
    want = expected.tolist()
    en, zh = getattr(run.model, "words", ("handformer's greedy decoding", " handformer 贪心解码"))
    res.checks.append(Check(text(f"{run.label['en']}: the tokens of {en} {want}",
                                 f"{run.label['zh']}：与{zh}的 token 相同 {want}"), ok,
                            text(f"got {got}", f"实际得到 {got}")))
    if ok:
        res.notes += [LOSSY_NOTE] * (not exact and LOSSY_NOTE not in res.notes)
        return
    # their code raised on a request it takes: that line
    raised = raised_at(run.failure.error) if run.out is None and run.failure and not res.findings else None
    res.findings += [raised] * bool(raised)
    lines = source_lines(ctx.objects(comp, "sample", "top_k", "top_p", "temperature"))
    for name, observed, form in _explain(run, expected):
        if not res.has(name):
            form, number, code = locate_form(name, form, lines)
            res.findings.append(Finding(name, observed, number, code, form))


LOSSY_NOTE = text(
    "its tokens part from exact greedy decoding only where the two likeliest tokens lie within the measured "
    "error of your model's cached steps (lossy arithmetic: a quantized cache, low precision): each is the "
    "likeliest of the full forward on its own path, within that error",
    "它的 token 与精确的贪心解码不同的地方，只在最可能的两个 token 相差不超过你的模型缓存步骤实测误差之处"
    "（有损运算：量化缓存、低精度）：在它自己的路径上，每个 token 都是完整前向里最可能的，误差之内")


def _positions_break(run: Run) -> tuple[str, Text, str] | None:
    """A cached loop's positions (Meta's start_pos, gpt-fast's input_pos) must go on from the call
    before (or start again at 0 with more than one token): gpt-fast's first new token at T - 1
    overwrites the prompt's last."""
    pairs = zip(run.model.calls, run.model.calls[1:])
    return next((("generate_cache_mismatch", text(
        f"at step {i} it passed position {b.start} after {a.ids.size(1)} tokens from position {a.start}",
        f"步 {i}：前一次从位置 {a.start} 输入了 {a.ids.size(1)} 个 token，这一次却传了位置 {b.start}"),
        "positions_not_offset") for i, (a, b) in enumerate(pairs, start=1)
        if None not in (a.start, b.start)  # 0 again: a whole sequence fed again, never one token
        and b.start not in (a.start + a.ids.size(1), (0, -1)[b.ids.size(1) == 1])), None)


def _explain(run: Run, expected: Tensor) -> list[tuple[str, Text, str]]:
    """The findings the calls of a run explain its tokens by: a loop that does not stop (and whose
    calls all saw the prompt alone), else the first other mistake the calls show."""
    calls, T = run.model.calls, run.prompt.size(1)
    same = len(calls) > 1 and all(c.ids.size(1) == T and c.seen == 0 and torch.equal(c.ids, run.prompt)
                                  for c in calls)
    not_appended = ("generate_not_appended", text(
        f"each of its {len(calls)} calls fed the model the same {T} prompt tokens",
        f"它的 {len(calls)} 次调用输入的都是同样的 {T} 个提示词 token"), "")
    if _runaway(run.model):
        runaway = ("generate_does_not_stop", text(
            f"asked for {run.n} new tokens, it called the model {len(calls)} times and went on",
            f"要求 {run.n} 个新 token，它调用了模型 {len(calls)} 次还没有停"), "")
        return [runaway] + ([not_appended] if same else [])
    if same:
        return [not_appended]
    found = _explain_calls(run, expected)
    return [found] if found else []


def _explain_calls(run: Run, expected: Tensor) -> tuple[str, Text, str] | None:
    calls, model, prompt = run.model.calls, run.model, run.prompt
    T = prompt.size(1)
    if _overflowed(model):
        steps, fed = len(calls) - 1, calls[-1].seen + calls[-1].ids.size(1)
        return "generate_no_crop", text(
            f"after {steps} steps it fed the model {fed} tokens; the block size is {model.block_size}",
            f"走了 {steps} 步之后它给模型输入了 {fed} 个 token；block_size 是 {model.block_size}"), \
            "not_cropped"
    stream = torch.cat([prompt, expected], 1)
    for i, c in enumerate(calls):
        fed = c.seen + c.ids.size(1)
        if not c.cached and c.ids.size(1) == model.block_size and fed < stream.size(1) and torch.equal(
                c.ids, stream[:, :model.block_size]) and i > 0 and T + i > model.block_size:
            return "generate_no_crop", text(
                f"past the block size it feeds the first {model.block_size} tokens, not the last ones",
                f"超过 block_size 之后它输入的是前 {model.block_size} 个 token，而不是最后的"), "first_tokens"
    broken = _positions_break(run)
    if broken:
        return broken
    for i, c in enumerate(calls[1:], start=1):
        before = T + i - 1  # tokens the model had seen before this call, in a cached loop
        if c.ids.size(1) == 1 and c.seen != before and c.cached:
            return "generate_cache_mismatch", text(
                f"at step {i} it fed one token with a cache of {c.seen} tokens where {before} were seen",
                f"步 {i} 输入一个 token 时缓存里只有 {c.seen} 个 token，应为 {before} 个"), \
                "cache_not_passed"
        if c.ids.size(1) == 1 and not c.cached and c.seen == 0:
            return "generate_cache_mismatch", text(
                f"at step {i} it fed one token and no cache: the model saw that token alone",
                f"步 {i} 只输入了一个 token 却没有带缓存：模型只看到了这一个 token"), "cache_not_passed"
        if c.ids.size(1) == 1 and int(c.positions[0, 0]) != c.seen:
            position = int(c.positions[0, 0])
            return "generate_cache_mismatch", text(
                f"at step {i} the new token got position {position}, after {c.seen} cached tokens",
                f"步 {i} 新 token 的位置是 {position}，而缓存里已有 {c.seen} 个 token"), \
                "positions_not_offset"
    return None
