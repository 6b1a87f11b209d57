"""The models beam search's runner hands the learner's search (runners/beam.py): `Steered`, the
stand-in `HandformerModel` with the Annotated Transformer's three methods (and `model(src, tgt)`),
steered by a table of next-token probabilities by prefix; runners/beam_own.py steers the learner's
own model the same way.

Shape legend: N hypotheses, L prefix length, S source length, D d_model, V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import BEAM_SETTINGS, by_name
from handformer.check.core.context import Context
from handformer.check.core.discovery import Component
from handformer.check.core.result import Text, text
from handformer.config import Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer

PAD, BOS, EOS = 0, 1, 2
Table = dict[tuple[int, ...], dict[int, float]]  # prefix -> next-token probabilities


class HandformerModel(nn.Module):
    """A tiny Seq2SeqTransformer with the Annotated Transformer's three methods (masks ignored: the
    sources have no padding, and the model builds its own causal mask)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        cfg = Seq2SeqConfig(src_vocab_size=13, tgt_vocab_size=13, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_positions=32, pad_id=PAD)
        self.inner = Seq2SeqTransformer(cfg).double().eval()

    def encode(self, src: Tensor, src_mask: Any = None) -> Tensor:
        return self.inner.encode(src)[0]  # (B, S, D)

    def decode(self, memory: Tensor, src_mask: Any, ys: Tensor, tgt_mask: Any = None) -> Tensor:
        return self.inner.decode(ys.long(), memory, None)[0]  # (N, L, D)

    def generator(self, x: Tensor) -> Tensor:
        return F.log_softmax(self.inner.generator(x), dim=-1)


class Steered(nn.Module):
    """The model the search is handed: the base model's log-probabilities scaled down, plus the
    scenario's table by prefix; every prefix the search decodes is recorded."""

    def __init__(self, base: Any, table: dict[tuple[int, ...], dict[int, float]], ctx: Context,
                 by_source: dict[tuple[int, ...], Table] | None = None) -> None:
        super().__init__()
        self.base, self.table, self.ctx = base, table, ctx
        self.by_source = by_source or {}  # a table per source sentence (a batch of them)
        self.memories: list[tuple[tuple[int, ...], Tensor]] = []  # (source ids, its encoder output)
        self.row_tables: list[Table] = []
        self.ys: Tensor | None = None
        self.out: Tensor | None = None
        self.decoded: list[list[int]] = []
        self.cache: dict[tuple[int, ...], list[float]] = {}  # the reference's log-probabilities by prefix
        self.searches: dict[tuple[Any, ...], tuple[Tensor, list[int]]] = {}  # the reference's searches

    @property
    def handed(self) -> Any:
        """What the learner's search is given (a property: a module's attribute set to itself would make
        it its own child)."""
        return self

    @contextlib.contextmanager
    def steering(self) -> Iterator[None]:
        yield  # the stand-in steers in its own methods

    def usable(self) -> bool:
        return True

    def forward(self, src: Tensor, tgt: Tensor, *masks: Any) -> Tensor:
        """`model(src, tgt)`, the interface of a model that takes both sequences (nn.Transformer's
        tutorial, a course's decoder): the log-probabilities (N, L, V) after each prefix of tgt."""
        return self.generator(self.decode(self.encode(src), None, tgt))

    def encode(self, src: Tensor, src_mask: Any = None) -> Tensor:
        memory = self.ctx.learner.call("forward", self.base.encode, src, src_mask)
        if self.by_source and isinstance(memory, Tensor):
            self.memories += [(tuple(row.tolist()), m) for row, m in zip(src, memory)]
        return memory

    def decode(self, memory: Tensor, src_mask: Any, ys: Tensor, tgt_mask: Any = None) -> Tensor:
        if memory.size(0) != ys.size(0) and memory.size(0) == 1:
            memory = memory.expand(ys.size(0), *memory.shape[1:])  # one source for every hypothesis
        out = self.ctx.learner.call("forward", self.base.decode, memory, src_mask, ys, tgt_mask)
        self.ys, self.out = ys.long(), out
        self.decoded += [row.tolist() for row in ys.long()]
        self.row_tables = list(map(self._table_of, memory)) if self.by_source else []
        return out

    def _table_of(self, memory_row: Tensor) -> Table:
        """The table of the source sentence whose encoder output this row of memory is."""
        for ids, m in reversed(self.memories):
            if m.shape == memory_row.shape and bool((m - memory_row).abs().max() < 1e-12):
                return self.by_source.get(ids, self.table)
        return self.table

    def generator(self, x: Tensor) -> Tensor:
        raw = self.ctx.learner.call("forward", self.base.generator, x)
        V = raw.size(-1)
        if x.dim() == 3:  # (N, L, D): every position
            assert self.ys is not None, "decode first"
            bias = self.every_position(self.ys.size(0), x.size(1), V)  # (N, L, V)
        else:  # (N, D): the position of the decoder's output that x is
            bias = self.last_position(x, V)  # (N, V)
        return F.log_softmax(0.001 * raw + bias.to(raw.dtype), dim=-1)

    def every_position(self, rows: int, length: int, V: int) -> Tensor:
        """(rows, length, V) the steered log-probabilities at each position of each decoded row:
        position l predicts after ys[n, :l + 1]."""
        assert self.ys is not None, "decode first"
        return torch.stack([torch.stack([self.steer(self.ys[n, 1:l + 1].tolist(), V, self._row_table(n))
                                         for l in range(length)]) for n in range(rows)])

    def last_position(self, x: Tensor, V: int) -> Tensor:
        """(N, V) the steered log-probabilities after the prefix each row of x (N, D) stands for."""
        return torch.stack([self.steer(self._prefix(i, x[i]), V, self._row_table(i))
                            for i in range(x.size(0))])

    def _prefix(self, i: int, row: Tensor) -> list[int]:
        assert self.ys is not None and self.out is not None, "decode first"
        n = i if self.out.size(0) > i else 0
        l = int((self.out[n] - row).abs().amax(-1).argmin())  # which decoder position this row is
        return self.ys[n, 1:l + 1].tolist()

    def _row_table(self, i: int) -> Table:
        return self.row_tables[i] if i < len(self.row_tables) else self.table

    def steered(self, prefixes: list[tuple[int, ...]], V: int) -> list[list[float]]:
        """The scenario's log-probabilities (N, V) after BOS + each prefix, the table's alone."""
        return [self.steer(list(p), V).tolist() for p in prefixes]

    def steer(self, prefix: list[int], V: int, table: Table | None = None) -> Tensor:
        """The scenario's log-probabilities after BOS + prefix (V,)."""
        probs = (table or self.table).get(tuple(prefix), {EOS: 0.5})
        return steered_row(tuple(probs.items()), V).clone()  # a copy: made as the caller's mode makes one

    def logprobs(self, memory: Tensor, prefix: list[int]) -> list[float]:
        """The log-probabilities (V,) after BOS + prefix (the reference's), cached by prefix."""
        key = tuple(prefix)
        if key not in self.cache:
            self.cache[key] = self.batch_logprobs(memory, [key])[0]
        return self.cache[key]

    def prefetch(self, memory: Tensor, prefixes: list[list[int]]) -> None:
        """The log-probabilities after each of the prefixes (all of one length: a step's live
        hypotheses) not yet cached, computed in one batch; where the batch raises, each is computed
        alone when it is read."""
        new = sorted(set(map(tuple, prefixes)) - self.cache.keys())
        with contextlib.suppress(fp.LearnerFailure):
            if len(new) > 1:  # one alone is computed where it is read
                self.cache.update(zip(new, self.batch_logprobs(memory, new)))

    def batch_logprobs(self, memory: Tensor, prefixes: list[tuple[int, ...]]) -> list[list[float]]:
        """The log-probabilities (N, V) after BOS + each prefix (N of one length), decoded as one batch."""
        ys = started(prefixes)  # (N, L)
        mask = torch.tril(torch.ones(1, ys.size(1), ys.size(1), dtype=torch.bool))
        out = self.decode(memory, None, ys, mask)
        return self.generator(out[:, -1]).tolist()


@functools.lru_cache(maxsize=4096)
def steered_row(probs: tuple[tuple[int, float], ...], V: int) -> Tensor:
    """(V,) the log-probabilities of a table's entry, its (token, probability) pairs in the table's
    order; every other token at 1e-6, the sink the rest. Made once for each entry and V: a search's
    every decode asks again for each prefix it holds."""
    out = torch.full((V,), math.log(1e-6), dtype=torch.float64)
    for token, p in probs:
        out[token] = math.log(p)
    out[V - 1] = math.log(max(1.0 - sum(p for _, p in probs), 1e-6))  # the sink
    return out


def started(prefixes: list[tuple[int, ...]]) -> Tensor:
    """(N, L) BOS followed by each prefix (N of one length)."""
    return torch.tensor([[BOS, *p] for p in prefixes])


SETTING_NAMES = {role: names for role, (names, _) in BEAM_SETTINGS.items()}
SETTING_VALUES = {role: value for role, (_, value) in BEAM_SETTINGS.items()}
assert SETTING_VALUES["pad"] == PAD
SETTING_WHY = {"pad": ("the pad id", "pad 的 id"), "returns": ("one hypothesis back", "只返回一条假设"),
               "early": ("it searches on while a live hypothesis may still beat the worst finished one, as "
                         "handformer's search does", "还有活着的假设可能胜过最差的已完成假设时继续搜索，"
                         "和 handformer 的搜索一样"),
               "sample": ("no sampling", "不采样")}


def call_search(ctx: Context, comp: Component, model: Steered, arg: dict[str, str | None],
                values: dict[str, Any]) -> Any:
    """What the learner's search returns, as it is, called with `values` under the names it takes
    (`arg`: each role's name), its model steered; its settings (SETTING_NAMES) at SETTING_VALUES."""
    with model.steering():
        return ctx.learner.call("forward", comp.obj, **by_name(arg, {**SETTING_VALUES, **values}))


def settings_note(arg: dict[str, str | None]) -> list[Text]:
    """The report's note on the settings a search takes that were filled at handformer's values."""
    said = [(arg[role], SETTING_VALUES[role], SETTING_WHY[role]) for role in SETTING_NAMES if arg.get(role)]
    return [text("it was handed " + "; ".join(f"{name}={value!r} ({why[0]})" for name, value, why in said),
                 "传入的设置：" + "；".join(f"{name}={value!r}（{why[1]}）" for name, value, why in said))
            ] * bool(said)


def hypotheses(out: Any) -> Any:
    """What a search returns less its scores: (tokens, score) or (score, tokens) -> tokens; a list of
    such pairs (the hypotheses a diverse beam search keeps, each group's), or of the tokens with several
    numbers ((tokens, perplexity, score): the score last) -> the tokens of the one of the highest score."""
    if isinstance(out, list) and len(out) > 1 and all(map(_scored, out)):
        out = max(out, key=lambda pair: float(_by_kind(pair)[-1]))
    out = _by_kind(out) if _scored(out) else out  # (tokens, score)
    return out[0] if isinstance(out, tuple) and out and not isinstance(out[0], int) else out


def _is_number(x: Any) -> bool:
    """A score: a Python number or a tensor of one element."""
    return isinstance(x, (int, float, Tensor)) and torch.as_tensor(x).numel() == 1


def _scored(pair: Any) -> bool:
    """A (tokens, score) or (score, tokens) pair, or the tokens with several scores ((tokens, log_prob,
    score)): two items or more, all numbers but one."""
    return isinstance(pair, tuple) and len(pair) >= 2 and [*map(_is_number, pair)].count(False) == 1


def _by_kind(pair: tuple[Any, ...]) -> tuple[Any, ...]:
    """A scored tuple as (tokens, score, ...)."""
    return tuple(sorted(pair, key=_is_number))


def hypothesis_tokens(ctx: Context, comp: Component, out: Any) -> list[int]:
    out = hypotheses(out)
    if isinstance(out, list) and len(out) == 1 and isinstance(out[0], (list, tuple, Tensor)):
        out = hypotheses(out[0])  # a batch of one: [tokens], or [(tokens, score)]
    tokens = fp.one_sequence(out)
    if tokens is not None:
        return tokens
    raise ctx.learner.fail("forward", f"{comp.name} returned {type(out).__name__}; expected the best "
                           "hypothesis' token ids: a list of ints or a (1, L) tensor (or a (tokens, score) "
                           "tuple)",
                           f"{comp.name} 返回了 {type(out).__name__}；应当返回最好那条候选的 token id：int "
                           "列表或 (1, L) 张量（或 (tokens, score) 元组）")


__all__ = ["BOS", "EOS", "PAD", "SETTING_NAMES", "HandformerModel", "Steered", "Table", "call_search",
           "hypotheses", "hypothesis_tokens", "settings_note", "started"]
