"""Each step of a check starts from the same random state (handformer/check/core/seeded.py): the
learner's feed-forward is built with the same random weights when it is checked alone and after a
temperature that draws from torch's global generator, and the caller's random state is kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from handformer.check.core.engine import check_file

FIXTURE = Path(__file__).parent / "fixtures" / "learners_seeded_steps" / "draws.py"


def _weights_when_checked(path: Path, only: list[str]) -> tuple[list[str], dict[str, str]]:
    """The sums of the feed-forward's first weights each time check built it, and the verdicts."""
    Path(f"{path}.weights").unlink(missing_ok=True)
    result = check_file(str(path), only=only)
    return Path(f"{path}.weights").read_text().split(), {c.name: c.status for c in result.components}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("seeded") / "draws.py"
    shutil.copy(FIXTURE, path)
    torch.manual_seed(123)
    kept = torch.rand(3)
    torch.manual_seed(123)
    alone = _weights_when_checked(path, ["ffn"])
    after = _weights_when_checked(path, ["temperature", "ffn"])
    return alone, after, (kept, torch.rand(3))


def test_a_component_is_built_with_the_same_weights_alone_and_after_another(runs):
    (alone, alone_status), (after, after_status), _ = runs
    assert after_status == {"apply_temperature": "pass", "FeedForward": "pass"}
    assert alone_status == {"FeedForward": "pass"}
    assert alone and alone == after


def test_the_callers_random_state_is_kept(runs):
    *_, (kept, drawn) = runs
    assert torch.equal(kept, drawn)
