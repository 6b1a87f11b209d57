"""Loading a run: run directories of every kind written before runs recorded their loading pipeline
(tests/fixtures/runs, made by its make_runs.py) load unchanged and generate the tokens they did."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from handformer.generation.generate import generate
from handformer.tasks.lm.run import load_lm

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
sys.path.insert(0, str(FIXTURES))
import make_runs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A copy of the fixtures, so that no test can write into tests/fixtures."""
    root = tmp_path_factory.mktemp("runs")
    for kind in make_runs.KINDS:
        shutil.copytree(FIXTURES / kind, root / kind)
    return root


@pytest.mark.parametrize("kind", make_runs.KINDS)
def test_a_run_written_before_pipelines_loads_and_generates_as_it_did(runs, kind):
    run = load_lm(runs / kind)
    ids = ([run.tokens.bos_id] if run.tokens.bos_id is not None else []) + run.tokenizer.encode(make_runs.PROMPT)
    assert generate(run.model, [ids], 12, temperature=0, stop_tokens=[])[0] == EXPECTED[kind]["tokens"]
    with torch.no_grad():
        logits = run.model(torch.tensor([ids])).logits.double()
    total, largest = EXPECTED[kind]["logits"]
    assert math.isclose(float(logits.sum()), total, rel_tol=1e-4, abs_tol=1e-3)
    assert math.isclose(float(logits.abs().max()), largest, rel_tol=1e-4)


def test_the_fixtures_are_tiny_and_every_kind_is_there():
    assert set(EXPECTED) == set(make_runs.KINDS)
    size = sum(f.stat().st_size for f in FIXTURES.rglob("*") if f.is_file())
    assert size < 1_000_000
    config = json.loads((FIXTURES / "lora" / "config.json").read_text())
    assert config["init_from"]["relative"] == "../plain" and not (FIXTURES / "lora" / "model.safetensors").exists()
