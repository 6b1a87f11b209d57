"""The probe engine: a kind stated as data, run through one sequence.

A `Probe` says what a kind's check needs: how to build the learner's component and read its weights
(`build`), the input the search drives it with (`inputs`), what a well-formed output is (`shape`),
the reference it is compared with (`reference`, from `reference/variants.py`) and the mistakes the
search may apply to it (`universe`), and the steps after the search: the findings, comparisons on
more shapes, reference-free properties, the localization of a departure no mistake explains.
`run_probe` runs every probe the same way:

    build -> determinism -> detect (call, shape) -> search (fewest mistakes, each reading) -> steps -> finish
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, check_determinism, finish
from handformer.check.core.discovery import Component
from handformer.check.core.localize import Departure
from handformer.check.core.localize_kinds import note_departure, place_findings
from handformer.check.core.result import ComponentResult
from handformer.check.core.source import source_lines


@dataclass
class Subject:
    """The learner's component as a probe drives it: `run` calls their code on one input (returns
    the tensor it gives, or None), `readings` are the ways its weights can be read as the
    reference's ((key, weights); the search tries each, in order), `facts` what the build learned."""

    run: Callable[[Any], Tensor | None]
    readings: list[tuple[Any, Any]]
    module: Any = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Found:
    """What the search found: the reading of the weights that explains the output with the fewest
    mistakes (`key`, `weights`), the mistakes (`flags`, empty when it is correct) and how close
    (`matched`); `matched` is None when no reading and no set of mistakes explains it. `reference`
    computes the reference with that reading and a set of mistakes (none: the correct output)."""

    key: Any
    weights: Any
    flags: frozenset[str]
    matched: float | None
    out: Tensor
    x: Any
    reference: Callable[[frozenset[str]], Tensor]

    @property
    def named(self) -> bool:
        return bool(self.flags)


Step = Callable[[ComponentResult, Context, Component, Subject, Found], None]


@dataclass(frozen=True)
class Probe:
    """One kind's check as data (see the module's docstring for the sequence that runs it)."""

    inputs: Callable[[Subject], Any]
    shape: Callable[[Context, Component, Subject, Any, Tensor | None], tuple[str, str] | None]
    reference: Callable[[Any, Any, frozenset[str]], Tensor]
    universe: Callable[[Subject], Sequence[str]]
    steps: tuple[Step, ...]
    # the learner's component and its readings; None: the kind builds its subjects and drives each
    build: Callable[[Component, Context, ComponentResult], Subject] | None = None
    observe: Callable[[Tensor], Tensor] = lambda out: out  # the part of the output the search reads
    depth: int = 2  # the most mistakes the search combines
    error: Callable[[Tensor, Tensor], float] = fp.max_error  # how far the output is from a variant's
    tol: float = fp.TOL  # an error below it: the variant is the learner's
    deterministic: bool = True  # checked for dropout left on in eval mode (a module's; not a function's)
    dropout_kinds: tuple[str, ...] = ()  # the kinds whose dropout_in_eval a finding names (with its own)
    # how the output is explained: None, `search` below; a kind run under several mask conventions
    # searches each convention's output (attention's `by_convention`)
    search: Callable[[Probe, Subject, Tensor | None, Any], Found] | None = None


def run_probe(probe: Probe, comp: Component, ctx: Context) -> ComponentResult:
    """The kind's check: its component built, its output detected and searched, its steps run."""
    res = ctx.result(comp)
    drive(probe, res, ctx, comp, probe.build(comp, ctx, res))
    return finish(res)


def drive(probe: Probe, res: ComponentResult, ctx: Context, comp: Component, subject: Subject) -> None:
    """The sequence after the build, into res (a kind that checks several subjects in one result,
    as the mask helper that makes both masks, drives each)."""
    x = probe.inputs(subject)
    if probe.deterministic:
        check_determinism(res, ctx, comp, lambda: subject.run(x), *probe.dropout_kinds)
    with fp.dropout_off():
        out = subject.run(x) if probe.search is None else None  # a search by convention runs each itself
        wrong = probe.shape(ctx, comp, subject, x, out)
        if wrong is not None:
            raise ctx.learner.fail("forward", *wrong)
        found = (probe.search or search)(probe, subject, probe.observe(out), x)
        for step in probe.steps:
            step(res, ctx, comp, subject, found)


def search(probe: Probe, subject: Subject, out: Tensor, x: Any) -> Found:
    """The reading and the smallest set of mistakes that reproduce `out`: the sets tried smallest
    first, in the universe's order, each with every reading in order; the first reading, unmatched,
    when none does."""
    computes = [(key, weights, _computer(probe, weights, x)) for key, weights in subject.readings]
    for flags in fp.flag_sets(probe.universe(subject), probe.depth):
        for key, weights, compute in computes:
            err = fp.combo_error(out, compute, flags, error=probe.error)
            if err < probe.tol:
                return Found(key, weights, flags, err, out, x, compute)
    key, weights, compute = computes[0]
    return Found(key, weights, frozenset(), None, out, x, compute)


def _computer(probe: Probe, weights: Any, x: Any) -> Callable[[frozenset[str]], Tensor]:
    return lambda flags: probe.reference(weights, x, flags)


def name_findings(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found,
                  ) -> None:
    """The step that names the mistakes the search found, with how far the output is from correct."""
    if found.named:
        correct = fp.max_error(found.out, found.reference(frozenset()))
        res.findings += ctx.findings(found.flags, found.matched, correct, comp)


def localize_step(localize: Callable[[Subject, Found], Departure | None], place: bool = True) -> Step:
    """The step that, on a FAIL no catalogued mistake explains, notes where the learner's
    computation first parts from the reference (its line, the form of the difference); with `place`,
    a finding whose patterns match several lines is placed at the one that departs (see
    `place_findings`): not for a localizer that cannot see every line a mistake may be on."""
    def step(res: ComponentResult, ctx: Context, comp: Component, subject: Subject, found: Found) -> None:
        if found.named and place:
            place_findings(res, lambda: localize(subject, found), source_lines(ctx.objects(comp)))
        elif res.max_abs_error is not None and res.max_abs_error >= 1e-5:
            note_departure(res, lambda: localize(subject, found))
    return step
