"""benchmarks/baseline.py, the `--baseline DIR` worker of the decode, training and beam benchmarks:
the worker imports only the checkout it is given, and its generation, training and beam search are
the same work as this checkout's (same tokens, same losses, same hypotheses)."""

import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import make_translation_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from baseline import BaselineWorker, comparison_table  # noqa: E402

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.generation.decoding import beam_search  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.translation.translator import Translator  # noqa: E402


@pytest.fixture(scope="module")
def copy_of_checkout(tmp_path_factory):
    """A second checkout: this one's handformer package copied elsewhere."""
    root = tmp_path_factory.mktemp("baseline")
    shutil.copytree(ROOT / "handformer", root / "handformer", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def worker(copy_of_checkout):
    """One worker process for the module (each start imports torch): the tests load their models
    under their own names."""
    with BaselineWorker(copy_of_checkout, threads=1) as worker:
        yield worker


def tiny_model() -> CausalLM:
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2,
                                     max_positions=64)
    return CausalLM(cfg).eval()


def test_worker_imports_only_its_checkout_and_generates_the_same_tokens(copy_of_checkout, worker):
    model = tiny_model()
    prompts = [[1, 2, 3, 4], [5, 6]]
    assert Path(worker.handformer_file).is_relative_to(copy_of_checkout.resolve())
    for how in ("as loaded", "prepare_for_decoding", "int8"):
        worker.load(how, model, how)
    seconds, tokens, cpu_seconds = worker.generate("as loaded", prompts, 8, threads=1)
    assert seconds > 0 and cpu_seconds > 0
    assert tokens == generate(model, prompts, 8, temperature=0)
    assert worker.generate("prepare_for_decoding", prompts, 8, threads=1).result == tokens
    assert len(worker.generate("int8", prompts, 8, threads=1).result[0]) == 8


def test_worker_trains_from_the_same_weights_to_the_same_loss(worker):
    model = tiny_model()
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 64, (2, 9), generator=gen) for _ in range(3)]  # (B, T + 1)
    worker.load("training", model, "as loaded")
    worker.batches("training", batches)
    _, loss, _ = worker.train("training", "training", warmup=1)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    model.train()
    for batch in batches:  # the worker's loop, here
        logits = model(batch[:, :-1]).logits  # (B, T, V)
        ours = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 64), batch[:, 1:].reshape(-1))
        ours.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
    assert loss == pytest.approx(ours.item(), abs=1e-6)


def test_worker_beam_search_gives_this_checkouts_hypotheses(worker, tmp_path):
    run = tmp_path / "run"
    make_translation_run(run)
    translator = Translator.load(run)
    src = [torch.tensor([[4, 5, 6, 2], [7, 8, 2, 0]])]  # (B, S), right-padded
    ours = beam_search(translator.model, src[0], translator.limits(), 3, 0.6)
    worker.translator(run, src)
    assert worker.beam(3, 0.6).result == ours


def test_bad_baseline_and_bad_preparation_are_one_clear_error(tmp_path, worker):
    with pytest.raises(SystemExit, match="no handformer/__init__.py there"):
        BaselineWorker(tmp_path)
    with pytest.raises(ValueError, match="choose one of"):
        worker.load("x", tiny_model(), "int3")
    worker.load("after the error", tiny_model(), "as loaded")  # the worker goes on
    assert worker.generate("after the error", [[1, 2]], 1, threads=1).result


def test_comparison_table_gives_ratio_and_verdict():
    table = comparison_table("t", [("a", [1.0, 1.0, 1.0], [1.0, 1.02, 0.98], True),
                                   ("b", [2.0, 2.0], [1.0, 1.0], False)], "DIR")
    a, b = table.splitlines()[2:]
    assert "1.000" in a and "within 5 %" in a and "same" in a
    assert "2.000" in b and "100% SLOWER" in b and "DIFFERENT" in b
