"""Every step of a check starts from the same random state: torch's, Python's `random` and numpy's
global generators seeded with SEED, the caller's states put back after it. What ran before a step in
its process (the fork server's imports, the components checked before it, or none where a new child
checks the rest after a hang) changes neither the inputs it draws, nor the weights the learner's
modules start with, nor its dropout: its verdict is the same whatever ran before it."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

SEED = 0


@contextlib.contextmanager
def seeded(seed: int = SEED) -> Iterator[None]:
    """The block's draws from the global generators (torch's, random's, numpy's) start from `seed`."""
    kept = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(kept[0])
            np.random.set_state(kept[1])
