"""import-hf streams a sharded checkpoint: a fresh process importing a 52 MB checkpoint (three
shards saved by transformers) grows its peak resident memory by at most 1.25 x the checkpoint +
300 MB (handformer/tasks/lm/import_memory.py measures it; benchmarks/import_memory.py does the same for
~1 GB beside transformers' own loading), and the run it writes holds the checkpoint's tensors."""

import sys

import pytest
import torch
from helpers import require_module
from safetensors.torch import load_file

from handformer.data.tokenizer import Tokenizer
from handformer.tasks.lm.import_memory import checkpoint_bytes, peak_growth, within_bound

transformers = require_module("transformers", "pip install -e '.[dev]'")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory is read from /proc/self")
def test_importing_a_sharded_checkpoint_stays_within_the_memory_bound(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=8000, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
                                      intermediate_size=1024, num_hidden_layers=2, tie_word_embeddings=False)
    hf_model = transformers.LlamaForCausalLM(config)
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True, max_shard_size="20MB")
    Tokenizer.train_char(["a small checkpoint"]).save(tmp_path / "hf" / "tokenizer.json")
    size = checkpoint_bytes(tmp_path / "hf")
    assert 48 * 2**20 < size < 56 * 2**20 and len(list((tmp_path / "hf").glob("*.safetensors"))) == 3
    growth = peak_growth(tmp_path / "hf", tmp_path / "run")
    assert within_bound(growth, size), f"peak growth {growth / 2**20:.0f} MiB for {size / 2**20:.0f} MiB"
    run = load_file(tmp_path / "run" / "model.safetensors")
    expected = hf_model.state_dict()
    assert torch.equal(run["layers.1.ffn.down_proj.weight"], expected["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(run["embed.weight"], expected["model.embed_tokens.weight"])
