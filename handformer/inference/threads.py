"""The intra-op thread count for decoding: one thread for a model whose weight matrices are all
small, torch's setting otherwise (`handformer.generation.generate` asks for it with threads="auto")."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator

import torch
from torch import nn

from handformer.inference.packed_linear import PackedLinear

# A matrix this small (elements; 1 MiB in fp32) is read by one core in about a microsecond: splitting
# its product across threads costs more in fork/join than it saves, and on a shared machine a second
# thread waits for a core at every op. `generate` decodes models whose every weight matrix is smaller
# with one thread (the 5-layer, 64-wide Llama of benchmarks/decode_limit.py: see the README).
SMALL_MATRIX = 2**18


def default_threads(model: nn.Module) -> int | None:
    """The intra-op threads `generate` uses for `model`: 1 when every weight matrix is small, else
    None (torch's setting, unchanged)."""
    matrices = [p.numel() for p in model.parameters() if p.dim() == 2]
    # packed weights are no parameters (inference/packed_linear.py): count them by their layer's shape
    matrices += [m.in_features * m.out_features for m in model.modules() if isinstance(m, PackedLinear)]
    largest = max(matrices, default=0)
    return 1 if largest < SMALL_MATRIX else None


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run with `threads` torch intra-op threads (process-wide, as `torch.set_num_threads`), then
    restore the previous count; None changes nothing."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class StepThreads:
    """The thread count of a fused decoding step (inference/fused_step.py), chosen by the steps' own
    times: torch's count (`wanted`) while it runs at its usual pace, one thread while a team of
    `wanted` is slower than one. On a shared machine a team of threads waits at every barrier for a
    thread whose core another process holds (48 barriers a GPT-2-124M token; a step can take 10x its
    quiet time), where one thread only shares its core. The rule, step by step:
      - at `wanted` threads, the fastest step so far is the reference; SLOW_STEPS (2) steps in a row
        slower than SLOW times it, and the next step runs on one thread (a probe);
      - if that step beat the slow one, decoding stays on one thread; else the slow pace becomes the
        reference and the team goes on;
      - on one thread, a step of the team every `retry` steps (16, doubled after each probe the team
        loses, up to 64): the team takes over again when it is faster than MARGIN times the median
        of the one-thread steps since the last probe.
    Each output row is computed by the same code whatever the thread count, so the tokens do not
    depend on the choice (tests/test_fused_step.py). On a quiet machine the team keeps its pace: a
    fall back is rare (docs/benchmarks.md, benchmarks/step_threads_ab.py) and ends at the next probe.
    The gap stops at 64 so that a neighbour's burst that ends while decoding runs alone costs at most
    64 one-thread steps, not a whole call; the margin keeps a busy core's lucky team step (as fast as
    one thread) from taking the step back."""

    SLOW = 1.5
    SLOW_STEPS = 2
    MARGIN = 0.9  # a probe of the team wins under MARGIN x the one-thread steps' median
    FIRST_RETRY, LAST_RETRY = 16, 64

    def __init__(self) -> None:
        self.wanted = 0
        self.reset(0)

    def reset(self, wanted: int) -> None:
        """Start over for a team of `wanted` threads (torch's count changed)."""
        self.wanted, self.alone, self.probe = wanted, False, False
        self.reference, self.slow_steps, self.last = float("inf"), 0, float("inf")
        self.retry = self.countdown = self.FIRST_RETRY
        self.spell: list[float] = []  # the one-thread steps since the last probe of the team

    def choose(self, wanted: int) -> int:
        """The threads of the next step, for torch's count `wanted`."""
        if wanted != self.wanted:
            self.reset(wanted)
        if wanted == 1:
            return 1
        return 1 if self.alone != self.probe else wanted  # alone, or a probe of one from the team

    def record(self, threads: int, seconds: float) -> None:
        """The wall time of a step just run at `threads` (the count `choose` gave)."""
        if self.wanted <= 1:
            return
        if not self.alone and not self.probe:
            self._team_step(seconds)
        elif not self.alone:
            self._probe_of_one(seconds)
        elif not self.probe:
            self._alone_step(seconds)
        else:
            self._probe_of_team(seconds)

    def _team_step(self, seconds: float) -> None:
        self.slow_steps = self.slow_steps + 1 if seconds > self.SLOW * self.reference else 0
        self.reference, self.last = min(self.reference, seconds), seconds
        self.probe = self.slow_steps >= self.SLOW_STEPS

    def _probe_of_one(self, seconds: float) -> None:
        self.probe, self.slow_steps = False, 0
        if seconds < self.last:  # one thread beat the slow team
            self.alone, self.last, self.retry = True, seconds, self.FIRST_RETRY
            self.countdown = self.retry
        else:
            self.reference = self.last  # the slow pace is the team's pace for now

    def _alone_step(self, seconds: float) -> None:
        self.last, self.countdown = seconds, self.countdown - 1
        self.spell.append(seconds)
        self.probe = self.countdown <= 0

    def _probe_of_team(self, seconds: float) -> None:
        self.probe, pace = False, statistics.median(self.spell or [self.last])
        self.spell = []
        if seconds < self.MARGIN * pace:  # the team is back to beating one thread
            self.alone, self.reference, self.last, self.slow_steps = False, seconds, seconds, 0
        else:
            self.retry = min(2 * self.retry, self.LAST_RETRY)
            self.countdown = self.retry
