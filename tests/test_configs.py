"""Every config the project ships (configs/*.toml, the README's `--config` files, and the built-in
demo) loads as `handformer train --config` loads it and builds its model, without reading any data:
a renamed key or a model that cannot be built fails here, not on a user's machine. And
`handformer demo`, the README's first command, runs end to end at smoke size."""

from pathlib import Path

import pytest
import torch

from handformer.cli import main
from handformer.config import Seq2SeqConfig
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.tasks.job_file import apply_overrides, load_job_file
from handformer.tasks.lm.job import LMJob
from handformer.tasks.post.job import POST_TASKS, PostJob
from handformer.tasks.translation.job import TranslationJob

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
README_CONFIGS = ("multi30k_de_en", "lm_default", "shakespeare_char", "tiny_lm", "tiny_seq2seq")

pytestmark = pytest.mark.usefixtures("one_thread")


def build(spec, overrides: dict | None = None) -> torch.nn.Module | None:
    """The job of a config file or built-in name, as the CLI builds it, and its model on the meta
    device (no memory, no data: the vocabulary is a stand-in). None for a post-training job, whose
    model is its base run."""
    job_dict = apply_overrides(load_job_file(spec), overrides or {})
    task = job_dict.pop("task", "translation")
    if task in POST_TASKS:
        PostJob.from_dict({**job_dict, "task": task})
        return None
    assert task in ("lm", "translation"), f"{spec}: unknown task {task!r}"
    job = (LMJob if task == "lm" else TranslationJob).from_dict(job_dict)
    vocab = job.data.vocab_size if job.data.tokenizer == "bpe" else 100
    with torch.device("meta"):
        if task == "lm":
            return CausalLM(job.model_config(vocab_size=getattr(job.data, "shard_vocab_size", 0) or vocab))
        return Seq2SeqTransformer(Seq2SeqConfig.from_dict(
            {**job.model, "src_vocab_size": vocab, "tgt_vocab_size": vocab, "pad_id": 0}, "model"))


def test_the_readme_configs_are_among_them():
    assert {p.stem for p in CONFIGS} >= set(README_CONFIGS)
    readme = (ROOT / "README.md").read_text()
    for name in ("multi30k_de_en", "lm_default"):
        assert f"configs/{name}.toml" in readme


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_loads_and_builds_its_model(config):
    model = build(config)
    assert model is None or sum(p.numel() for p in model.parameters()) > 0


def test_gpt2_124m_has_124m_parameters_with_gpt2s_vocabulary():
    model = build(ROOT / "configs" / "gpt2_124m.toml", {"data.shard_vocab_size": 50257})
    assert 124e6 < sum(p.numel() for p in model.parameters()) < 125e6


def test_the_demo_is_pre_norm_and_set_makes_it_post_norm():
    """README: the demo model is pre-norm; `--set model.norm_placement=post` trains the paper's."""
    assert build("demo").cfg.norm_placement == "pre"
    assert build("demo", {"model.norm_placement": "post"}).cfg.norm_placement == "post"


def test_the_demo_runs_end_to_end_at_smoke_size(tmp_path, capsys):
    """`handformer demo` in process with a few steps: it trains, prints the held-out table and its
    exact match, and draws the cross-attention heatmap and the loss curve."""
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--set", "train.steps=3", "--set", "data.n_train=40",
                 "--set", "data.n_heldout=8", "--set", "train.eval_every=3", "--set", "train.progress=false"]) == 0
    printed = capsys.readouterr().out
    assert "source (held out)" in printed and "held-out exact match:" in printed and "of 8 dates" in printed
    for name in ("model.safetensors", "cross_attention.png", "loss_curve.png", "metrics.jsonl"):
        assert (out / name).is_file(), name
