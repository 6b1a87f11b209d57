"""Beam search driven through the learner's own encoder-decoder, through its own interface (their
`decode(tgt, memory, src)` as much as the Annotated Transformer's `decode(memory, src_mask, ys,
tgt_mask)`): their model is handed to their search as it is, and steered by hooks, as greedy
decoding's is. A pre-hook on the target embedding (nn.Embedding(tgt_vocab, d_model)) records the
prefix being decoded; a hook on the output layer (every nn.Linear to tgt_vocab) replaces the
network's logits by a scenario's log-probabilities for that prefix (the network's, scaled by 1e-6,
only break ties). The reference reads the same steered log-probabilities through the model's forward,
which passed its own check. For a batch of sentences, a pre-hook on the first decoder layer tells
which sentence each row decodes: its memory row equals that sentence's memory decoded alone.

Shape legend: N hypotheses, L prefix length, S source length, D d_model, V vocabulary.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import SIZES, Context
from handformer.check.core.defaults import quietly
from handformer.check.core.result import DIFFERS, FAIL, PASS
from handformer.check.core.weights import MappingError
from handformer.check.runners.beam_models import BOS, Steered, Table, started
from handformer.check.runners.model import TAKEN_FORM, TGT_V, map_model, one_vocabulary

TIE = 1e-6  # the network's share of the steered logits: ties broken, nothing else


def _memories(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The float (N, S, D) tensors a decoder layer is given besides its input: the memory."""
    given = list(args[1:]) + list(kwargs.values())
    return [t for t in given if isinstance(t, Tensor) and t.dim() == 3 and t.is_floating_point()]


class OwnSteered(Steered):
    """The learner's passing model steered by hooks while `steering()` is on; `handed` is what their
    search is given (their module itself). Its "memory" for the reference is the source."""

    def __init__(self, module: nn.Module, call: Any, table: Table, ctx: Context,
                 by_source: dict[tuple[int, ...], Table] | None, layer: nn.Module | None) -> None:
        super().__init__(None, table, ctx, by_source)
        self.own, self.call = [module], call  # a list: their model is no child of this one
        mods = list(module.modules())
        self.outs = [m for m in mods if isinstance(m, nn.Linear) and m.out_features == TGT_V]
        self.embeds = [m for m in mods if isinstance(m, nn.Embedding) and m.num_embeddings == TGT_V]
        # the modules whose outputs `_states` reads (which position a row is); none for a model with no
        # call of its own (a GRU's decode reads its last position itself): read at the last one
        self.states = [m for m in mods if m not in self.outs] * (call is not None)
        self.layer = layer  # its first decoder layer (first_decoder_layer), found once by the maker
        # whether the output layer was handed rows alone ((N, D), not (N, L, D)) in the last call, and in
        # a call of the reference's: those rows are read by the states recorded, so the reference's calls
        # record them from then on
        self.rows_alone = self.reference_reads_rows = False
        self.known: list[tuple[Tensor, Table]] = []  # (a sentence's memory (S, D), its table)
        for ids, tab in (by_source or {}).items():
            self.known += [(self._batch_first(m)[0], tab) for m in self._recorded(torch.tensor([ids]))]

    @property
    def handed(self) -> Any:
        return self.own[0]

    def _batch_first(self, t: Tensor) -> Tensor:
        """A tensor the model holds (L, N, ...) read as (N, L, ...) where it took its inputs
        sequence-first (nn.Transformer's default layout, PyTorch's translation tutorial)."""
        return t.transpose(0, 1) if TAKEN_FORM.get(self.handed) == "torch_first" and t.dim() >= 2 else t

    def usable(self) -> bool:
        return bool(self.outs and self.embeds) and (not self.by_source or bool(self.known))

    def _recorded(self, src: Tensor) -> list[Tensor]:
        """The memories the first decoder layer is given when the model decodes BOS after src."""
        seen: list[Tensor] = []
        if self.layer is None:
            return seen
        handle = self.layer.register_forward_pre_hook(
            lambda _m, a, k: seen.extend(_memories(a, k)), with_kwargs=True)
        with fp.hooked([handle]):
            self.call(src, torch.tensor([[BOS]]))
        return seen

    def steering(self, states: bool = True) -> AbstractContextManager[None]:
        """The hooks that steer the model; `states`: those that record the decoder's output states too
        (a hook on every module: about half the cost of a call of a tiny model), read only where the
        output layer is handed rows alone (`_steer_out`)."""
        handles = [e.register_forward_pre_hook(self._record) for e in self.embeds]
        handles += [m.register_forward_hook(self._states) for m in self.states * states]
        handles += [o.register_forward_hook(self._steer_out) for o in self.outs]
        if self.known:  # read through the first decoder layer (none known without one: `_recorded`)
            handles.append(self.layer.register_forward_pre_hook(self._rows, with_kwargs=True))
        return fp.hooked(handles)

    def _record(self, _m: nn.Module, inp: tuple[Any, ...]) -> None:
        ys = self._batch_first(inp[0].long())
        self.ys = ys.reshape(-1, ys.size(-1))  # (N, L)
        self.decoded += self.ys.tolist()
        self.out = None

    def _states(self, _m: nn.Module, _inp: Any, out: Any) -> None:
        """The decoder's output states (N, L, D), the last ones computed: which position a row handed
        to the output layer alone is (a search that reads out[:, 0] instead of out[:, -1]). A nested
        tensor (nn.TransformerEncoder's fast path over a padded source in eval mode) has no shape: it is
        an encoder's output, never the decoder's states."""
        shape = tuple(out.shape) if isinstance(out, Tensor) and not out.is_nested else ()
        if self.ys is not None and shape[-1:] == (SIZES["d_model"],) and len(shape) == 3:  # read first: cheap
            out = self._batch_first(out)
            if out.shape[:2] == self.ys.shape:
                # set as nn.Module's __setattr__ sets a tensor that is no buffer, without its checks: this
                # hook runs after every module of every decode the search makes
                self.__dict__["out"] = out

    def _rows(self, _m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Each decoded row's table: the sentence whose memory its memory row is."""
        for memory in _memories(args, kwargs):
            self.row_tables = list(map(self._table_of, self._batch_first(memory)))

    def _table_of(self, memory_row: Tensor) -> Table:
        same = (tab for m, tab in self.known if m.shape == memory_row.shape
                and bool((m - memory_row).abs().max() < 1e-9))
        return next(same, self.table)

    def _prefix(self, n: int, row: Tensor) -> list[int]:
        """The prefix a row handed to the output layer alone stands for: read off the decoder's output
        states where they were recorded (`_states`), else the last position's."""
        assert self.ys is not None
        return super()._prefix(n, row) if self.out is not None else self.ys[n, 1:].tolist()

    def _steer_out(self, _m: nn.Module, inp: Any, out: Tensor) -> Tensor:
        assert self.ys is not None, "the target embedding was not called before the output layer"
        flipped = self._batch_first(out) if out.dim() == 3 else out  # (N, L, V) or (N, V)
        V, rows = out.size(-1), min(flipped.size(0), self.ys.size(0))
        self.rows_alone |= out.dim() != 3
        if out.dim() == 3:  # (N, L, V): every position
            bias = self.every_position(rows, flipped.size(1), V)
            bias = self._batch_first(bias.expand_as(flipped))  # back in the layout it returned
        else:  # (N, V): the position of the decoder's output that its input row is
            bias = self.last_position(inp[0][:rows], V)
        return TIE * (self.call is not None) * out + bias.to(out.dtype).expand_as(out)

    def encode(self, src: Tensor, src_mask: Any = None) -> Tensor:
        return src  # the reference decodes through forward(src, tgt)

    def batch_logprobs(self, memory: Tensor, prefixes: list[tuple[int, ...]]) -> list[list[float]]:
        if self.call is None:  # a model with no forward of its own: its logits are the table's alone
            return self.steered(prefixes, TGT_V)
        for states in (self.reference_reads_rows, True):  # no state hooks first, till rows come alone
            self.rows_alone = False
            with self.steering(states):
                out = self.call(memory.repeat(len(prefixes), 1), started(prefixes))  # (N, L, V)
            self.reference_reads_rows |= self.rows_alone
            if states or not self.rows_alone:  # the states were recorded, or never read
                break
        return F.log_softmax(out[:, -1].double(), dim=-1).tolist()


def own_seq2seq(ctx: Context, accepted: tuple[str, ...] = (PASS, DIFFERS)) -> tuple[nn.Module, Any] | None:
    """The learner's encoder-decoder when its own check ended in one of `accepted` (passed, by
    default): (the model, a call (src, tgt) -> logits); None when there is none, or it did not."""
    from handformer.check.runners.model import Caller, build_model, check_model, inputs

    comp = ctx.components.get("transformer")
    if comp is None:
        return hooked_seq2seq(ctx) if FAIL in accepted else None
    # their model raising in its check, or unable to be built: the stand-in drives the search
    if getattr(ctx.checked(comp, check_model), "status", None) not in accepted:
        return None
    module, _ = build_model(comp, ctx)
    call = Caller(module, ctx)
    # the masks' rank is found on a batch of two: with one row, the Annotated Transformer's attention
    # runs on (B, 1, 1, S) masks too (a 5-D score tensor) and gives a (1, T, V) output of wrong values
    try:
        call(*inputs(6, 5, [0, 2], [0, 1], seed=0))
    except fp.LearnerFailure:  # a model that failed its check may not run at all
        return None
    return module, call


def hooked_seq2seq(ctx: Context) -> tuple[nn.Module, None] | None:
    """The file's one encoder-decoder that is no transformer (a GRU seq2seq with its own encode and
    decode), built with the target's vocabulary on both sides: driven by hooks alone, with no call of
    its own (no forward(src, tgt)); None when there is none, or it cannot be built."""
    from handformer.check.core.discovery import Component, own_objects
    from handformer.check.runners.model import MODEL_SIZES

    found = [c for c in own_objects(ctx.module).values() if isinstance(c, type) and issubclass(c, nn.Module)
             and all(callable(getattr(c, m, None)) for m in ("encode", "decode"))]
    if len(found) != 1:
        return None
    # None: it cannot be built at check's sizes (the stand-in drives the search)
    return quietly(lambda: (ctx.build(Component("transformer", found[0].__name__, found[0]),
                                      {**MODEL_SIZES, "src_vocab": TGT_V}, checked=False), None))


def own_name(ctx: Context, module: nn.Module) -> str:
    comp = ctx.components.get("transformer")
    return comp.name if comp is not None else type(module).__name__


def first_decoder_layer(module: nn.Module) -> nn.Module | None:
    """The learner's model's first decoder layer, as its map names it; None when it cannot be mapped."""
    return quietly(lambda: module.get_submodule(
        map_model(module, SIZES["d_ff"], one_vocabulary(module)).decoder[0].name), MappingError)


def own_steered(ctx: Context) -> tuple[Any, bool | None] | None:
    """A maker of OwnSteered(table, by_source) on the learner's own model, and whether it passed its
    check, when its output layer and target embedding can be hooked; None otherwise (a stand-in drives
    the search). A model that failed its check but runs will do: the steering replaces its logits, so
    its mistakes do not reach the search; so will one that is no transformer (hooked_seq2seq: None)."""
    for accepted in ((PASS, DIFFERS), (FAIL,)):
        own = own_seq2seq(ctx, accepted)
        if own is None:
            continue
        module, call = own
        layer = first_decoder_layer(module)  # mapped once: every scenario's model hooks the same layer

        def make(table: Table, by_source: dict[tuple[int, ...], Table] | None = None,
                 module: nn.Module = module, call: Any = call, layer: nn.Module | None = layer) -> OwnSteered:
            return OwnSteered(module, call, table, ctx, by_source, layer)

        if make({}).usable():
            return make, (accepted[0] != FAIL) if call is not None else None
    return None
