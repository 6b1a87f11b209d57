"""A decoding loop that feeds its model one token a step must hand it what came before: the cache the
model returned (runners/generate_loop.py `_cache_unused`, runners/generate_lossy.py).

Greedy tokens alone may not show a loop that drops its context: a model whose likeliest next token is
the one it was fed, whatever came before (Falcon's tied embeddings at random weights), decodes the same
tokens either way. Each step's logits are compared with the full forward's on the same tokens, within
float rounding; where every step after the first gives the logits of its one token alone, the loop is
`generate_cache_mismatch`, quoted at the first line of its loop that names a cache. Two forms run end to
end: a model's own generate() that keeps passing `past_key_values=None` and a free function that makes a
fresh cache object every step; and a synthetic run whose tokens are right while its context is lost."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import planted_copy
from torch import nn

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import ComponentResult
from handformer.check.runners import generate_lossy as lossy
from handformer.check.runners.generate_loop import _cache_unused

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_cache_use"
LOOPS = ("TiedLM.generate", "decode_with_cache")
PLANTS = {"method_not_handed_back": "TiedLM.generate", "function_fresh_cache": "decode_with_cache"}
EDITS = {  # each plant: the correct file with these edits
    "method_not_handed_back": [("logits, past = self(fed, past_key_values=past)",
                                "logits, presents = self(fed, past_key_values=past)")],
    "function_fresh_cache": [("    cache = KVCache(len(model.layers))\n    fed = idx\n    for _ in range(max_new_tokens):\n",
                              "    fed = idx\n    for _ in range(max_new_tokens):\n        cache = KVCache(len(model.layers))\n")]}
V = 5


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache_use")
    paths = {"correct": str(HERE / "correct.py")}
    paths |= {name: planted_copy(folder, name, HERE / "correct.py", *edits) for name, edits in EDITS.items()}
    return {name: check_file(path, only=["generate"]) for name, path in paths.items()}


def _loops(result):
    return {c.name: c for c in result.components if c.name in LOOPS}


def test_both_cached_loops_give_the_full_forwards_logits_at_every_step(checked):
    result = checked["correct"]
    loops = _loops(result)
    assert {n: c.status for n, c in loops.items()} == dict.fromkeys(LOOPS, "pass"), format_report(result)
    for c in loops.values():
        assert any("each step's logits" in check.name["en"] and check.ok for check in c.checks), format_report(result)


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_loop_that_drops_its_cache_fails_named(checked, name):
    result = checked[name]
    status = {n: c.status for n, c in _loops(result).items()}
    assert status == {**dict.fromkeys(LOOPS, "pass"), PLANTS[name]: "fail"}, format_report(result)
    assert [f.name for f in _loops(result)[PLANTS[name]].findings] == ["generate_cache_mismatch"]


class Counts(nn.Module):
    """Logits that count each token so far: the last position's depend on the whole context."""


def _counts(ids):
    return F.one_hot(ids, V).cumsum(1).double()  # (B, T, V)


def _loop(model, ids, n):
    past = None
    for _ in range(n):
        logits, cache = model(ids[:, -1:], past_key_values=past)
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
    return ids


def _run(lost):
    """A run of 3 steps with the right tokens, whose model handed the loop the full forward's logits, or
    (lost) those of each step's one token alone after the first."""
    prompt, out = torch.tensor([[1, 2, 1]]), torch.tensor([[1, 1, 3]])
    ids = torch.cat([prompt, out], 1)
    fed = [ids[:, :3], ids[:, 3:4], ids[:, 4:5]] if lost else [ids[:, :3 + k] for k in range(3)]
    model = SimpleNamespace(outputs=[_counts(f)[:, -1] for f in fed], exact=_counts, module=Counts())
    return SimpleNamespace(model=model, prompt=prompt, out=out)


@pytest.mark.parametrize("lost", [False, True])
def test_a_lost_context_is_named_though_the_tokens_agree(lost):
    run, res = _run(lost), ComponentResult("generate", "_loop")
    res.checks += lossy.cache_checks(run)
    _cache_unused(res, SimpleNamespace(obj=_loop), run)
    assert [check.ok for check in res.checks] == [not lost]
    line = inspect.getsourcelines(_loop)[1] + 3  # logits, cache = model(ids[:, -1:], past_key_values=past)
    assert [(f.name, f.line) for f in res.findings] == [("generate_cache_mismatch", line)] * lost
