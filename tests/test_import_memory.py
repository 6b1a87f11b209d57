"""import-hf streams a sharded checkpoint: its peak memory does not grow with the checkpoint.
A fresh process imports a 52 MB checkpoint (three shards saved by transformers) and one of 108 MB
(more layers): the second import's peak resident memory may exceed the first's by at most half
the size difference, where a naive loader, measured the same way in the same test (every shard
copied into memory, then written), grows by the whole difference. Each import also stays under
the bound benchmarks/import_memory.py holds ~1 GB to (1.25 x the checkpoint + 300 MB;
handformer/tasks/lm/import_memory.py measures), and the run it writes holds the checkpoint's tensors."""

import sys

import pytest
import torch
from helpers import require_module
from safetensors.torch import load_file

from handformer.data.tokenizer import Tokenizer
from handformer.tasks.lm.import_memory import IMPORT, checkpoint_bytes, peak_growths, within_bound

transformers = require_module("transformers", "pip install -e '.[dev]'")

# a loader that does not stream: every tensor of every shard copied into memory (load_file alone only
# maps the file) and held while the run's file is written
NAIVE = ("import glob\nfrom safetensors.torch import load_file, save_file\n"
         "held = {{k: t.clone() for f in sorted(glob.glob({hf_dir!r} + '/*.safetensors'))\n"
         "        for k, t in load_file(f).items()}}\n"
         "save_file(held, {run_dir!r} + '.safetensors')")


def save_llama(path, layers: int):
    """A random Llama (hidden 512, vocab 8000: 32 MB of embeddings, 9.4 MB a layer) saved by
    transformers in shards of 20 MB."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=8000, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
                                      intermediate_size=1024, num_hidden_layers=layers, tie_word_embeddings=False)
    hf_model = transformers.LlamaForCausalLM(config)
    hf_model.save_pretrained(path, safe_serialization=True, max_shard_size="20MB")
    Tokenizer.train_char(["a small checkpoint"]).save(path / "tokenizer.json")
    return hf_model, checkpoint_bytes(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory is read from /proc/self")
def test_import_hf_streams_a_sharded_checkpoint(tmp_path):
    hf_model, small = save_llama(tmp_path / "small", layers=2)
    _, large = save_llama(tmp_path / "large", layers=8)
    assert 48 * 2**20 < small < 56 * 2**20 and len(list((tmp_path / "small").glob("*.safetensors"))) == 3
    names = ("small", "large")
    measured = peak_growths([(tmp_path / n, tmp_path / f"run-{n}", IMPORT) for n in names]
                            + [(tmp_path / n, tmp_path / f"naive-{n}", NAIVE) for n in names])
    growth, naive = dict(zip(names, measured[:2])), dict(zip(names, measured[2:]))
    mib = (f"import {growth['small'] / 2**20:.0f} -> {growth['large'] / 2**20:.0f} MiB, naive "
           f"{naive['small'] / 2**20:.0f} -> {naive['large'] / 2**20:.0f} MiB, checkpoints "
           f"{small / 2**20:.0f} -> {large / 2**20:.0f} MiB")
    assert naive["large"] - naive["small"] > 0.9 * (large - small), mib  # the measurement sees a held copy
    assert growth["large"] - growth["small"] <= 0.5 * (large - small), mib
    assert within_bound(growth["small"], small) and within_bound(growth["large"], large), mib
    run = load_file(tmp_path / "run-small" / "model.safetensors")
    expected = hf_model.state_dict()
    assert torch.equal(run["layers.1.ffn.down_proj.weight"], expected["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(run["embed.weight"], expected["model.embed_tokens.weight"])
