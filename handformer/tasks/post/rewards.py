"""GRPO's reward: a Python function the run names as "module:function", imported and called in
this process. It is code that runs with the trainer's rights, like any module you import: name
only functions you trust.

The function takes the batch as TRL's reward functions do, so one function serves both:

    def exact_answer(prompts, completions, **columns) -> list[float]:
        # prompts:     each completion's prompt (a list of {"role", "content"} messages)
        # completions: each completion's text (the reply, without its end-of-turn token)
        # columns:     each other field of the prompts' JSONL lines, one value per completion,
        #              e.g. answer=[...] for lines {"prompt": ..., "answer": ...}
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, columns["answer"])]

An import that fails, a call that raises, one that runs past `reward_timeout` seconds, or a result
that is not one finite number per completion is an error that names the function.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from handformer.settings import is_number
from handformer.time_limit import time_limit as limit_time

RewardFn = Callable[..., Sequence[float]]


def load_reward(spec: str) -> RewardFn:
    """The function "module:function" names (the module imported from the Python path)."""
    module_name, _, name = spec.partition(":")
    where = f"[grpo] reward={spec!r}"
    if not module_name or not name:
        raise ValueError(f"{where} is invalid: write it as \"module:function\"")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the module's own code may raise anything while it loads
        raise ValueError(f"{where}: importing {module_name!r} failed: {type(err).__name__}: {err} (is its "
                         "folder on PYTHONPATH?)") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{where}: {module_name!r} has no function {name!r}")
    return fn


class RewardTimeout(Exception):
    pass


def time_limit(seconds: float) -> AbstractContextManager[None]:
    """Raise RewardTimeout in the main thread after `seconds`; elsewhere, no limit. A timer the
    caller runs (pytest-timeout's) is kept (handformer/time_limit.py)."""
    return limit_time(seconds, RewardTimeout)


def call_reward(fn: RewardFn, spec: str, prompts: list, completions: list[str], columns: dict[str, list],
                timeout: float) -> list[float]:
    """The rewards of the completions, checked: one finite number each."""
    where = f"the reward {spec}"
    try:
        with time_limit(timeout):
            rewards = fn(prompts=prompts, completions=completions, **columns)
    except RewardTimeout:
        raise ValueError(f"{where} ran past [grpo] reward_timeout={timeout} s on {len(completions)} "
                         "completions; make it faster or raise the limit") from None
    except Exception as err:  # the user's code may raise anything
        raise ValueError(f"{where} raised {type(err).__name__}: {err}") from None
    listlike = isinstance(rewards, Sequence) or hasattr(rewards, "tolist")  # a list, tuple, tensor, array
    if isinstance(rewards, (str, bytes)) or not listlike:
        raise ValueError(f"{where} returned {type(rewards).__name__}; it must return a list of numbers, one "
                         "per completion")
    rewards = list(rewards.tolist() if hasattr(rewards, "tolist") else rewards)
    if len(rewards) != len(completions):
        raise ValueError(f"{where} returned {len(rewards)} rewards for {len(completions)} completions")
    for i, r in enumerate(rewards):
        if not is_number(r) or not math.isfinite(r):
            raise ValueError(f"{where} returned {r!r} for completion {i} ({completions[i][:40]!r}); each "
                             "reward must be a finite number")
    return [float(r) for r in rewards]


__all__ = ["RewardFn", "call_reward", "load_reward", "time_limit"]
