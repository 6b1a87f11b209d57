"""handformer computes what tests/golden/behaviour.json recorded: every preset and imported family's
greedy, batched, uncached and sampled tokens, logits and attention checksums, the encoder-decoder's
greedy and beam outputs, and 20 training losses of the two tiny configs (tests/golden/behaviour.py
says how the file is written). The bad-input messages are compared by tests/test_faults.py.

A change of form (moving code, renaming a helper) must leave all of it equal; a change that means
to alter behaviour rewrites the file in the same commit and says why.
"""

import math
import sys
from pathlib import Path

import pytest
from helpers import require_module

require_module("transformers", "pip install -e '.[dev]'")
sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import behaviour  # noqa: E402

LOSS_TOLERANCE = 1e-6
CHECKSUM_TOLERANCE = 1e-5  # relative: the same arithmetic in another order moves the last bits


@pytest.fixture(scope="module")
def recorded():
    return behaviour.read()


@pytest.fixture(scope="module")
def computed():
    from helpers import dataset_file

    dataset_file("stories260K")  # the golden file records it
    return behaviour.collect()


def _compare(path: str, want, got) -> list[str]:
    """Where `got` differs from `want`: lists of ints exactly, floats to CHECKSUM_TOLERANCE."""
    if isinstance(want, dict):
        if set(want) != set(got):
            return [f"{path}: keys {sorted(set(want) ^ set(got))} differ"]
        return [d for k in want for d in _compare(f"{path}.{k}", want[k], got[k])]
    if _is_checksum(want) and _is_checksum(got):
        return _compare_checksum(path, want, got)
    if isinstance(want, list):
        if len(want) != len(got):
            return [f"{path}: {len(got)} items, recorded {len(want)}"]
        return [d for i, (w, g) in enumerate(zip(want, got)) for d in _compare(f"{path}[{i}]", w, g)]
    if isinstance(want, float):
        ok = math.isclose(want, got, rel_tol=CHECKSUM_TOLERANCE, abs_tol=CHECKSUM_TOLERANCE)
        return [] if ok else [f"{path}: {got!r}, recorded {want!r}"]
    return [] if want == got else [f"{path}: {got!r}, recorded {want!r}"]


def _is_checksum(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, float) for v in value)


def _compare_checksum(path: str, want: list[float], got: list[float]) -> list[str]:
    """A checksum is [sum, largest magnitude]: the sum cancels (its terms are up to the largest in size,
    of both signs), so its last bits move with the order a CPU's kernels add in (AVX2 vs AVX-512) by
    more than its own size allows; its tolerance is relative to the largest magnitude."""
    scale = max(abs(want[1]), abs(want[0]))
    close = [math.isclose(w, g, rel_tol=CHECKSUM_TOLERANCE, abs_tol=CHECKSUM_TOLERANCE * scale)
             for w, g in zip(want, got)]
    return [] if all(close) else [f"{path}: {got!r}, recorded {want!r}"]


@pytest.mark.parametrize("section", ["presets", "families", "seq2seq"])
def test_models_compute_what_was_recorded(recorded, computed, section):
    differences = _compare(section, recorded[section], computed[section])
    assert not differences, "\n".join(differences[:20])


def test_the_other_decoding_callers_give_what_they_gave(recorded, computed):
    """Chat, the playground and serve, recorded before they drove the one decoding engine: the same
    tokens and texts; the logits and log-probabilities to CHECKSUM_TOLERANCE (serve now prefills
    the rows that join together, left-padded, which moves the last bits)."""
    differences = _compare("callers", recorded["callers"], computed["callers"])
    assert not differences, "\n".join(differences[:20])


def test_a_seeded_batch_samples_each_prompt_as_alone():
    """generate seeds prompt i with seed + i (as serve seeds choice i): each row of a seeded,
    sampled batch is that prompt's own generation, whatever else is in the batch."""

    from handformer.config import CausalLMConfig
    from handformer.generation.generate import generate
    from handformer.models.causal_lm import CausalLM

    model = behaviour._fill(CausalLM(CausalLMConfig.llama_style(vocab_size=61, d_model=32, n_heads=4, n_kv_heads=2,
                                                                d_ff=48, n_layers=2, max_positions=64)), 7)
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    options = dict(temperature=0.9, top_k=20, top_p=0.9, seed=3)
    batch = generate(model, prompts, 10, **options)
    for i, prompt in enumerate(prompts):
        assert batch[i] == generate(model, [prompt], 10, **{**options, "seed": 3 + i})[0], i
    assert len({tuple(row) for row in batch}) == 3


@pytest.mark.parametrize("config", ["tiny_lm", "tiny_seq2seq", "tiny_moe"])
def test_training_losses_are_the_recorded_ones(recorded, computed, config):
    want, got = recorded["training"][config], computed["training"][config]
    assert len(want) == len(got) == 20
    worst = max(abs(w - g) for w, g in zip(want, got))
    assert worst <= LOSS_TOLERANCE, (worst, got)


def test_every_family_and_preset_is_recorded(recorded):
    """The golden file covers what it says: both presets, every import-hf family, llama2.c."""
    assert {"gpt2", "llama", "llama_window"} <= set(recorded["presets"])
    from handformer.convert.hf_weights import ARCHITECTURES

    families = set(recorded["families"])
    for model_type in ARCHITECTURES:
        assert any(name.startswith(model_type) for name in families), model_type
    assert "llama2c_stories260K" in families
    assert len(recorded["faults"]) == 117
