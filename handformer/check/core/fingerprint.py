"""Shared machinery of the runners: mask conventions, calling the learner's code, comparing outputs
row by row, and the fingerprint search that names mistakes.

The search tries the reference computation with no mistake, then with each single mistake, then
with each pair, and returns the smallest set whose output equals the learner's (in float64, to
1e-6). Nothing is guessed: a mistake is named only when its computed output matches.

Shape legend: B batch, T query length, S key length, D d_model, H heads.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from handformer.check.core.conventions import (  # noqa: F401  (the runners' one import of them)
    AUTO,
    CONVENTIONS,
    SHARED,
    describe_convention,
    encodable,
    encode_mask,
    is_lengths_name,
)
from handformer.check.core.defaults import quietly, then  # noqa: F401  (fp.quietly, as the runners import it)
from handformer.check.core.discovery import DiscoveryError
from handformer.check.core.result import LearnerError
from handformer.check.core.source import learner_error

TOL = 1e-6  # float64: a correct component agrees to ~1e-14, a mistake differs by ~0.1
REL_TOL = 1e-5  # relative_error's bound for values computed in float32 or python floats (losses, schedules)

class LearnerFailure(Exception):
    """The learner's code raised (or returned something unusable); carries the report."""

    def __init__(self, error: LearnerError) -> None:
        super().__init__(error.message)
        self.error = error


def cannot_call(en: str, zh: str, said: dict[str, Any]) -> LearnerFailure:
    """The failure that says check cannot drive the component as it is written (NOT CHECKED, never
    FAIL): the English and Chinese reasons filled from `said`."""
    error = LearnerError("cannot_call", en.format(**said), "forward", message_zh=zh.format(**said))
    return LearnerFailure(error)


@dataclass
class Learner:
    """Calls into the learner's code, turning their exceptions into `LearnerFailure`."""

    path: str
    calls: int = 0  # calls of the component being checked (reset by the runner of each one)
    nan_calls: int = 0  # of them, those whose output had a NaN (-inf is a filter's fill: not counted)

    def call(self, where: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
        except (LearnerFailure, DiscoveryError):
            raise  # ours: their constructor's arguments could not be matched
        except (Exception, SystemExit) as err:  # their code (sys.exit too): a finding, never a crash of ours
            raise LearnerFailure(learner_error(err, self.path, where)) from err
        self.calls += 1
        if _has_nan(out):
            self.nan_calls += 1
        return out

    def fail(self, where: str, message: str, zh: str = "") -> LearnerFailure:
        """A failure of the learner's code that check saw (a wrong return), said in English and `zh`."""
        return LearnerFailure(LearnerError("exception", message, where, message_zh=zh))


def _has_nan(value: Any) -> bool:
    """Whether a returned tensor (or one in a returned tuple or list) has a NaN."""
    if isinstance(value, Tensor):
        return value.is_floating_point() and bool(torch.isnan(value).any())
    if isinstance(value, (tuple, list)):
        return any(map(_has_nan, value[:8]))
    return False


def one_sequence(out: Any) -> list[int] | None:
    """The token ids of one sequence: a (T,) or (1, T) tensor (or (T, 1), sequence-first), or a list (or
    tuple) of ints; None for anything else."""
    if isinstance(out, Tensor) and out.dim() in (1, 2) and max(out.shape, default=0) == out.numel():
        return list(map(int, out.reshape(-1).tolist()))
    return list(out) if token_list(out) else None


def token_list(out: Any) -> bool:
    """A list (or tuple) of ints: token ids as plain Python numbers."""
    return isinstance(out, (list, tuple)) and all(isinstance(t, int) for t in out)


def outputs(value: Any) -> list[Any]:
    """What a learner call returns, as a list: a tuple's or a list's items, else the value alone."""
    return list(value) if isinstance(value, (tuple, list)) else [value]


def first_tensor(value: Any, ndim: int | None = None) -> Tensor | None:
    """The output tensor of a learner call that returns a tensor or a tuple (output, weights)."""
    items = [value] if isinstance(value, Tensor) else value if isinstance(value, (tuple, list)) else ()
    found = next((t for t in items if isinstance(t, Tensor) and (ndim is None or t.dim() == ndim)), None)
    # (output, bias) with the bias not yet added (Megatron's skip_bias_add: its caller adds it): a vector
    # as long as the output's last axis, of an output of two axes or more
    shape, bias = getattr(found, "shape", ()), (None, *items[1:2])[-1]  # the second item, if any
    return found + bias if getattr(bias, "shape", None) == shape[-1:] != shape else found


def returned_cache(value: Any, default: Any = None) -> Any:
    """The cache a learner's call hands back after its logits: the first thing after a tuple's first
    item that is neither a tensor nor None ((logits, presents), Hugging Face's (loss, logits, presents));
    `default` where there is none."""
    after = value[1:] if isinstance(value, tuple) else ()
    return next((o for o in after if o is not None and not isinstance(o, Tensor)), default)


def reads_one_mask(run: Callable[[Tensor, Tensor | None], Any], x: Tensor, convs: Sequence[str]) -> bool:
    """Whether a learner's module reads its mask as one for the whole batch (Baichuan's attention puts a
    batch axis in front of its (H, T, S) ALiBi mask): handed every key visible in the first of `convs`
    it runs with, row 0 of the batch `x` (B, T, D) differs from row 0 run alone, and with one (T, S)
    mask (SHARED) it does not. run(x, mask): its output."""
    firsts = (apart for conv in convs if (apart := _rows_apart(run, x, conv)) is not None)
    return (next(firsts, True), _rows_apart(run, x, SHARED[0])) == (False, True)


def _rows_apart(run: Callable[[Tensor, Tensor | None], Any], x: Tensor, conv: str) -> bool | None:
    """Whether row 0 of `x` comes out the same in the batch and alone, every key visible in `conv`;
    None when it raises there."""
    everything = torch.ones(x.size(0), 1, x.size(1), x.size(1), dtype=torch.bool)  # (B, 1, T, S)
    both, alone = (quietly(lambda v=v: first_tensor(run(v, encode_mask(everything[:len(v)], conv, len(v))),
                                                    3)) for v in (x, x[:1]))
    return then(both, lambda b: max_error(b[:1], alone) < 1e-9)  # (alone None: inf)


def mask_like(mask: Tensor | None, x: Tensor) -> Tensor | None:
    """A mask handed with the input x: an additive (float) one in x's dtype (float32 at the tutorial's
    sizes, where check's masks are float64); any other as it is."""
    return mask.to(x.dtype) if isinstance(mask, Tensor) and mask.is_floating_point() else mask


def weights_of(value: Any, skip_first: bool = True) -> Tensor | None:
    """The attention weights (B, H, T, S) in a returned tuple, if any: not a tensor with moderate
    negative entries, or none above 0, which no softmax gives (a mask filled after it gives -1e9 or
    -inf), such as T5's position bias handed on to the next layer."""
    items = list(value)[int(skip_first):] if isinstance(value, (tuple, list)) else []
    return next(filter(_softmax_like, items), None)


def _softmax_like(item: Any) -> bool:
    """A 4-D tensor with no moderate negative entry and some above 0."""
    return isinstance(item, Tensor) and item.dim() == 4 and not bool(((item < 0) & (item > -1e6)).any()) \
        and bool((item > 0).any())


def max_error(a: Tensor | None, b: Tensor | None, rows: Tensor | None = None) -> float:
    """Largest |a - b| over the rows that are compared; inf if shapes differ or a NaN appears.

    rows: bool, broadcastable to a's shape without its last dimension (which rows are defined).
    A search calls it once for every set of mistakes it tries: the few operations of a comparison without
    NaN come first, the NaN's rules (`_max_error_nan`) only where the difference holds one."""
    if a is None or b is None or a.shape != b.shape:
        return math.inf
    diff = (a.double() - b.double()).abs().amax(-1)  # NaN where either is NaN (or inf - inf)
    if rows is not None:
        rows = rows[:, 0] if rows.dim() > diff.dim() else rows  # (B, 1, T) -> (B, T) for a (B, T, D) output
        diff = torch.where(rows.expand_as(diff), diff, 0.0)  # the rows not compared: 0 (each |a - b| >= 0)
    worst = diff.max().item() if diff.numel() else math.nan
    return _max_error_nan(a, b, rows) if math.isnan(worst) else worst


def _max_error_nan(a: Tensor, b: Tensor, rows: Tensor | None) -> float:
    """max_error where a NaN appears (or nothing is compared): a NaN in both agrees, in one only is inf."""
    diff = (a.double() - b.double()).abs().nan_to_num(math.inf, posinf=math.inf)  # a NaN in one of them: inf
    both = torch.isnan(a) & torch.isnan(b)  # a variant that reproduces the NaN reproduces the output
    diff = diff.masked_fill_(both, 0.0).amax(-1)
    if rows is not None:
        if rows.dim() > diff.dim():
            rows = rows[:, 0]  # (B, 1, T) -> (B, T) for a (B, T, D) output
        diff = diff[rows.expand_as(diff)]
    return diff.max().item() if diff.numel() else 0.0


def visible_rows(keep: Tensor | None, batch: int, length: int) -> Tensor | None:
    """(B, 1, T) or (B, T): True for queries that see at least one key. None when no mask."""
    if keep is None:
        return None
    keep = keep.expand(batch, keep.size(1), length, keep.size(-1))  # (B, H|1, T, S)
    return keep.any(-1).all(1, keepdim=True)  # (B, 1, T): a query row sees a key in every head


Rows = Tensor | None | Callable[[frozenset[str]], Tensor | None]


def rows_for(rows: Rows, flags: frozenset[str]) -> Tensor | None:
    """The rows to compare under a set of mistakes: fixed, or (for a component that builds its own
    causal mask) a function of the flags, since an off-by-one mask hides every key of a query."""
    return rows(flags) if callable(rows) else rows


def flag_sets(universe: Sequence[str], most: int = 2, least: int = 0) -> Iterator[frozenset[str]]:
    """Every set of `least` to `most` mistakes of `universe`, the smaller sets first, each in the
    universe's order; one form per name ("causal_off_by_one:no_self" and ":sees_next" never together)."""
    for n in range(least, most + 1):
        for combo in itertools.combinations(universe, n):
            if len({flag.partition(":")[0] for flag in combo}) == n:
                yield frozenset(combo)


def search(target: Tensor, compute: Callable[[frozenset[str]], Tensor], universe: Sequence[str],
           rows: Rows, max_flags: int = 2, min_flags: int = 0,
           ) -> tuple[frozenset[str], float] | None:
    """The smallest set of mistakes (from `min_flags` to `max_flags` of them, one form per name)
    whose computed output equals `target` on the rows that set leaves visible; None when no set
    does."""
    for combo in flag_sets(universe, max_flags, min_flags):
        err = combo_error(target, compute, combo, rows)
        if err < TOL:
            return combo, err
    return None


Setting = TypeVar("Setting")


def search_settings(settings: Sequence[Setting],
                    search_one: Callable[[Setting, int, int], tuple[frozenset[str], float] | None],
                    fewest: bool = False, rounds: slice = slice(None),
                    ) -> tuple[Setting, frozenset[str], float] | None:
    """The setting (a reading of the learner's weights, the choices it made) whose output the
    fewest mistakes explain: at most one mistake in every setting first, pairs only once no setting
    matched so; `search_one(setting, least, most)` searches one. The first setting that matches wins,
    or with `fewest` the first with the fewest mistakes: no mistake in any setting first, then one,
    then a pair (a setting is not searched for a mistake while another one matches with none).
    `rounds` picks some of the rounds (FEWEST_FIRST[:2]: no pair; a caller with another reading to try
    before the pairs runs the pairs' round, FEWEST_FIRST[2:], alone after it)."""
    for least, most in (FEWEST_FIRST if fewest else ((0, 1), (2, 2)))[rounds]:
        for setting in settings:
            hit = search_one(setting, least, most)
            if hit is not None:
                return setting, *hit
    return None


FEWEST_FIRST = ((0, 0), (1, 1), (2, 2))  # the rounds of a search for the fewest mistakes


def combo_error(target: Tensor, compute: Callable[[frozenset[str]], Tensor], combo: frozenset[str],
                rows: Rows = None, error: Callable[[Tensor, Tensor], float] | None = None) -> float:
    """How far `target` is from the output computed with the mistakes `combo` (`error`, else
    max_error on the rows it leaves visible); inf when that variant cannot run (it cannot be the
    learner's) or hides every query (it would match anything: it explains nothing)."""
    try:
        out = compute(combo)
    except RuntimeError:
        return math.inf
    visible = rows_for(rows, combo)
    if visible is not None and not bool(visible.any()):
        return math.inf
    return error(target, out) if error else max_error(target, out, visible)


def relative_error(a: Tensor | None, b: Tensor | None) -> float:
    """Largest |a - b| / |b| (|b| at least 1e-12); a NaN in both agrees, in one only is inf."""
    if b is None:
        return math.inf
    scale = b.double().abs().nan_to_num(1.0).clamp_min(1e-12)
    return max_error(then(a, lambda a: a.double() / scale), b.double() / scale)


@contextlib.contextmanager
def hooked(handles: list[Any]) -> Iterator[None]:
    """The block runs with the hooks `handles` (torch's RemovableHandle) in place; they are removed
    after it, whether it raised or not."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _dropout_as(replacement: Callable[..., Tensor], given: Any = None) -> Iterator[Any]:
    """F.dropout (which nn.Dropout calls) and torch.dropout replaced inside the block; it is `given`."""
    saved = F.dropout, torch.dropout
    F.dropout, torch.dropout = replacement, replacement
    try:
        yield given
    finally:
        F.dropout, torch.dropout = saved


def _identity(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return x


def dropout_off() -> contextlib.AbstractContextManager[None]:
    """Dropout as the identity: lets the other checks run on a component whose dropout stays on in
    eval mode."""
    return _dropout_as(_identity)


def dropout_recorder() -> contextlib.AbstractContextManager[list[Tensor]]:
    """Like dropout_off, and every tensor handed to dropout is recorded (detached) in the list the
    block is given."""
    seen: list[Tensor] = []

    def record(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        seen.append(x.detach().clone())
        return x

    return _dropout_as(record, seen)


def randn(*shape: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)
