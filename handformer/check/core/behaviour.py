"""Components found by what they do, whatever they and their arguments are called: a schedule written
as a class whose `__call__(t)` returns the rate, a scheduler subclassing torch's LRScheduler, a loss
called `token_nll`, a cross-entropy over hidden states and the head's weight a chunk at a time.

Each row of PROBES is one call form (how the object is called), the inputs it is called on (tutorial
sizes) and the property of the output that says the kind: a callable of one integer step returning
rates that rise then fall is a learning-rate schedule; one of logits (B, T, V) and targets, or of
hidden states, the head's weight and targets, returning a number near the cross-entropy is a loss.
The probe finds the kind only: the component is then graded by that kind's runner (its reference
and its catalogue), through the call form the probe found, and reported under its own name.

A probe that raises, returns anything else or runs past PROBE_SECONDS finds nothing; an object whose
code writes files or runs programs is not called.

Shape legend: B batch, T length, D width, V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import math
import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core.argument_names import SCHEDULE_ARGS, call_parameters, names_of
from handformer.check.core.defaults import quietly
from handformer.check.core.processors import own_call, posing_as
from handformer.check.core.source import source_text
from handformer.time_limit import cpu_limit

# each probe's limit (a probe that runs longer finds nothing: a first call may import a part of torch,
# a second or two), and all of a file's probes'
PROBE_SECONDS = 2.0
FILE_SECONDS = 8.0
STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # a schedule read at these
# the settings a probe builds a schedule with: its value by the setting's role (SCHEDULE_ARGS), and one
# of a role no table names (SGDR's T_0, a cycle's length)
SETTINGS = {"warmup": 10, "total": 100, "max_lr": 1.0, "min_lr": 0.1, "d_model": 64, "factor": 1.0,
            "stable": 20, "decay": 40, "init_lr": 0.0}
UNKNOWN_SETTING = 10
ROLE_OF = {alias: role for role, aliases in reversed(SCHEDULE_ARGS.items()) for alias in aliases}
OPTIMIZER_NAMES = ("optimizer", "optim", "opt")
B, T, D, V = 2, 5, 8, 11
# a loss "near" the cross-entropy: within 25% (label smoothing and a z-loss move it this little), or
# within 5% of a count times it (a mean over the batch or over the positions, a sum: a planted mistake)
COUNTS = ((1, 0.25), *((count, 0.05) for count in (B, T, B * T, 1 / B, 1 / T, 1 / (B * T))))
# code whose first run imports torch's compiler: imported before the probe, outside its limit
LAZY_TORCH = re.compile(r"checkpoint|lr_scheduler|LRScheduler")
# code a probe does not call: it writes files, runs programs, reads the keyboard or ends the process, or
# trains (a backward pass, an optimizer's step: a training loop is no schedule and no loss)
SIDE_EFFECTS = re.compile(r"\bopen\(|\.save\(|\.write\(|\bos\.|shutil|subprocess|\binput\(|_exit|sys\.exit"
                          r"|\.backward\(|\.step\(")


class ProbeTimeout(BaseException):  # noqa: N818  (not an Exception: a learner's `except Exception` cannot eat it)
    """A probe ran past PROBE_SECONDS."""


@dataclass(frozen=True)
class Probe:
    kind: str  # the kind it finds
    form: str  # how the object is called
    admits: Callable[[Any], bool]  # whether the object may be called so
    graded: Callable[[Any], Any]  # the object as a callable of the kind's runner's inputs
    identifies: Callable[[Any], bool]  # whether that callable, probed, does what the kind does


@dataclass
class Budget:
    seconds: float = math.inf  # what is left of a file's time for probes


UNLIMITED = Budget()  # a probe's limit alone (what it spends from infinity leaves infinity)


def found(obj: Any, budget: Budget = UNLIMITED) -> tuple[str, Any] | None:
    """(kind, the callable its runner grades) of the first row of PROBES that identifies `obj`; None
    when none does, or the file's probes have spent its `budget`."""
    code = _code(obj)
    if SIDE_EFFECTS.search(code):
        return None
    if LAZY_TORCH.search(code):
        _compiler_imported()
    for row in PROBES:
        graded = row.graded(obj) if _quietly(lambda r=row: r.admits(obj)) else None
        if graded is not None and _quietly(lambda r=row, g=graded: r.identifies(g), budget):
            return row.kind, graded
    return None


def _quietly(probe: Callable[[], Any], budget: Budget = UNLIMITED) -> Any:
    """probe() within PROBE_SECONDS (and what is left of the budget, which it spends), its prints not
    shown; False when it raises or runs past the limit, and not run at all once the budget is spent."""
    seconds, start = min(PROBE_SECONDS, budget.seconds), time.process_time()
    if seconds <= 0:
        return False
    try:
        with cpu_limit(seconds, ProbeTimeout), contextlib.redirect_stdout(io.StringIO()), \
                torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a scheduler stepped before its optimizer says so
            torch.manual_seed(0)
            return probe()
    except (Exception, ProbeTimeout, SystemExit):  # noqa: BLE001  (not this kind: the probe finds nothing)
        return False
    finally:
        budget.seconds -= time.process_time() - start


def _code(obj: Any) -> str:
    return quietly(lambda: source_text(obj), (OSError, TypeError), "")


def _parameters(fn: Any, skip: tuple[str, ...] = ("self",)) -> list[inspect.Parameter]:
    return quietly(lambda: call_parameters(fn, skip), (TypeError, ValueError), [])


def _required(fn: Any) -> list[str]:
    """The names of the arguments fn requires (none where Python cannot read its signature)."""
    return names_of(_parameters(fn))[1]


# -- schedules: the rate at each step --------------------------------------------------------------

def _one_step_function(obj: Any) -> bool:
    return inspect.isfunction(obj) and len(_required(obj)) == 1


def _step_call_class(cls: Any) -> bool:
    return len(_parameters(own_call(cls))) == 1  # a function's __call__ is no function of its file


def _lr_scheduler(cls: Any) -> bool:
    params = _parameters(getattr(cls, "__init__", None))
    return (inspect.isclass(cls) and issubclass(cls, torch.optim.lr_scheduler.LRScheduler)
            and bool(params) and params[0].name.lower() in OPTIMIZER_NAMES)


def _settings(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """The constructor's settings, each given the probe's value (SETTINGS) as its default where it has
    none: the runner fills those it knows by name, and says which it cannot."""
    return [p.replace(default=SETTINGS.get(ROLE_OF.get(p.name.lower(), ""), UNKNOWN_SETTING))
            if p.default is p.empty else p for p in params]


def _stepped_call(cls: Any) -> Any:
    """The class as a function of the step and its constructor's settings: built, then called."""
    settings = _parameters(cls.__init__)

    def new(_: type, step: int, **arguments: Any) -> Any:
        return cls(**arguments)(step)

    return _posed(cls, new, settings)


def _stepped_scheduler(cls: Any) -> Any:
    """An LRScheduler subclass as a function of the step and its other settings: built on an SGD of
    lr 1, stepped `step` times, the rate its group holds."""
    settings = _parameters(cls.__init__)[1:]
    optimizer_name = _parameters(cls.__init__)[0].name
    _compiler_imported()

    def new(_: type, step: int, **arguments: Any) -> float:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # stepped before its optimizer: torch says so
            # the step read runs alone where a run is traced (a localizer's run): built at step 0,
            # built and stepped to the step before untraced at any other
            built = functools.partial(cls, **{optimizer_name: optimizer}, **arguments)
            scheduler = built() if step == 0 else _untraced(lambda: _stepped(built(), int(step) - 1))
            _stepped(scheduler, int(step > 0))
        return optimizer.param_groups[0]["lr"]

    return _posed(cls, new, settings)


def _stepped(scheduler: Any, steps: int) -> Any:
    for _ in range(steps):
        scheduler.step()
    return scheduler


def _untraced(run: Callable[[], Any]) -> Any:
    """run() with no trace function: the steps before the one a traced run reads."""
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        return run()
    finally:
        sys.settrace(tracer)


@functools.cache
def _compiler_imported() -> None:
    """Import torch's compiler outside any probe's limit (seconds): torch's first optimizer, its first
    checkpoint or compile import it."""
    import torch._dynamo  # noqa: F401


def _posed(cls: Any, new: Any, settings: list[inspect.Parameter]) -> Any:
    """`new` placed and named as the class, taking the step then the settings; None where they cannot
    follow a step (positional-only)."""
    try:
        signature = inspect.Signature([inspect.Parameter("step", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                       *settings])
    except ValueError:
        return None
    return posing_as(cls, new, signature)


def _rises_then_falls(fn: Any) -> bool:
    """Rates (numbers, finite, none below 0) at STEPS whose highest is neither the first nor the
    last; a function of the step alone is called as it is, a posed class with the probe's settings."""
    defaults = {p.name: p.default for p in _settings(_parameters(fn)[1:])}
    rates = [_rate(fn(step, **defaults)) for step in STEPS]
    peak = max(range(len(rates)), key=rates.__getitem__)
    return all(math.isfinite(r) and r >= 0 for r in rates) and 0 < peak < len(rates) - 1 and (
        rates[-1] < rates[peak])


def _rate(out: Any) -> float:
    """A number, or a one-element tensor, as a float; anything else raises."""
    if not isinstance(out, (int, float, Tensor)):  # float() of a tensor of more raises too
        raise TypeError("not a rate")
    return float(out)


# -- losses: a number near the cross-entropy ---------------------------------------------------------

def _batch() -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, D) hidden states, a (V, D) head's weight and (B, T) targets (no id 0: a pad id a loss
    ignores by default scores the rest alike)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, T, D, generator=g), torch.randn(V, D, generator=g) / math.sqrt(D),
            torch.randint(1, V, (B, T), generator=g))


def _near_cross_entropy(loss: Callable[[Tensor, Tensor, Tensor], Any]) -> bool:
    """Whether loss(hidden, weight, targets) is a number near the mean cross-entropy of the logits
    hidden @ weight.T (within 25%, or near a count times it: a planted mean over the batch
    or a sum is still a loss), lower where the targets are each row's likeliest token than where they
    are its least likely (as a cross-entropy is: a perplexity is never a count times it)."""
    hidden, weight, targets = _batch()
    logits = hidden @ weight.T  # (B, T, V)
    want = float(F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)))
    got = _number(loss(hidden, weight, targets)) / want
    near = any(abs(got / count - 1) <= tolerance for count, tolerance in COUNTS)
    best, worst = (_number(loss(hidden, weight, pick(-1))) for pick in (logits.argmax, logits.argmin))
    return near and best < worst


def _number(out: Any) -> float:
    """A loss's number: the first of a tuple it returns (loss, its parts)."""
    return _rate(out[0] if isinstance(out, (tuple, list)) else out)


def _logits_loss(obj: Any) -> bool:
    """A function, or a criterion module built with its defaults (it holds no parameters), whose call
    takes logits and targets and nothing else it requires."""
    call = obj.forward if inspect.isclass(obj) and issubclass(obj, nn.Module) else obj
    takes = len(_required(call)) == 2
    if inspect.isfunction(obj) or not takes:
        return takes
    return not _required(obj.__init__) and not LAYERS.search(_code(obj))


LAYERS = re.compile(r"nn\.(Linear|Embedding|Conv\w*|Parameter)\(")  # what a criterion never builds


def _scores_logits(obj: Any) -> bool:
    """A loss of logits (built with its defaults where it is a class) near the cross-entropy."""
    loss = obj() if inspect.isclass(obj) else obj
    return _near_cross_entropy(lambda hidden, weight, targets: loss(hidden @ weight.T, targets))


def _head_loss(fn: Any) -> bool:
    """A function of hidden states, the head's weight and targets (three it requires)."""
    return inspect.isfunction(fn) and len(_required(fn)) == 3


# the orders a hidden-state loss may take its three inputs in: hidden, weight, targets by position
HEAD_ORDERS = ((0, 1, 2), (0, 2, 1))


def _with_head(fn: Any) -> Any:
    """The loss as a function of the logits (B, T, V) and the targets: handed the logits as its hidden
    states and the identity as its head's weight (hidden @ I.T are the logits), in the order of its
    arguments that a probe on the hidden states finds; None where no order gives the cross-entropy."""
    params = _parameters(fn)
    order = next((o for o in HEAD_ORDERS if _quietly(lambda o=o: _near_cross_entropy(
        lambda *inputs: fn(*[inputs[o.index(i)] for i in range(3)])))), None)
    if order is None:
        return None
    names = [params[order.index(i)].name for i in range(3)]  # hidden's, weight's, targets' argument

    def new(_: type, logits: Tensor, targets: Tensor, **rest: Any) -> Any:
        if logits.dim() != 3:
            raise ValueError("hidden states are (B, T, D)")  # the runner then hands (B, T, V)
        eye = torch.eye(logits.shape[-1], dtype=logits.dtype)
        return fn(**{names[0]: logits, names[1]: eye, names[2]: targets}, **rest)

    rest = params[3:]  # the three it requires come first
    given = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature([inspect.Parameter("logits", given), inspect.Parameter("targets", given),
                                   *rest])
    return posing_as(fn, new, signature)


PROBES = (
    Probe("schedule", "a function of the step alone", _one_step_function, lambda fn: fn, _rises_then_falls),
    Probe("schedule", "a class whose __call__ takes the step", _step_call_class, _stepped_call,
          _rises_then_falls),
    Probe("schedule", "a subclass of torch's LRScheduler", _lr_scheduler, _stepped_scheduler,
          _rises_then_falls),
    Probe("loss", "logits and targets", _logits_loss, lambda obj: obj, _scores_logits),
    Probe("chunked_ce", "hidden states, the head's weight and targets", _head_loss, _with_head,
          lambda posed: posed is not None),
)
KINDS = {row.kind for row in PROBES}
