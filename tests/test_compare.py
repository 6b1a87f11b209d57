"""`first_divergence` and `handformer compare`: a port beside transformers, stage by stage, names the
first layer that departs. A change planted in one layer is found in that layer, and nowhere before."""

import pytest
import torch
from helpers import randomize_hf, require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.cli import main  # noqa: E402
from handformer.config import CausalLMConfig  # noqa: E402
from handformer.convert.compare import first_divergence  # noqa: E402
from handformer.convert.hf_weights import model_from_hf  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.families import build_causal_lm  # noqa: E402
from handformer.tasks.lm.exports import export_hf  # noqa: E402
from handformer.tasks.lm.run import save_lm_run  # noqa: E402


def _pair():
    torch.manual_seed(0)
    hf_model = randomize_hf(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=101, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        num_hidden_layers=3, attn_implementation="eager")), 0.15)
    return model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()), hf_model


@pytest.mark.parametrize("planted, stage", [
    ("layers.1.ffn.down_proj.weight", "layers.1.ffn"),
    ("layers.2.self_attn.o_proj.weight", "layers.2.attention"),
    ("layers.0.attn_norm.weight", "layers.0.attention"),
    ("norm.weight", "final norm"),
])
def test_a_planted_change_is_found_in_its_layer(planted, stage):
    ours, hf_model = _pair()
    ids = torch.randint(0, 101, (1, 9))
    same = first_divergence(ours, hf_model, ids)
    assert same.first is None and len(same.stages) == 1 + 3 * 3 + 2, same.report()
    with torch.no_grad():
        ours.get_parameter(planted).add_(0.05)
    found = first_divergence(ours, hf_model, ids)
    assert found.first == stage, found.report()
    names = [name for name, _ in found.stages]
    assert all(diff <= 1e-4 for name, diff in found.stages[:names.index(stage)])


def test_compare_names_the_layer_of_a_changed_checkpoint(tmp_path, capsys):
    """A run exported with export-hf agrees with the export; after one FFN matrix of the export is
    changed, `handformer compare` exits 1 and names that layer."""
    tok = Tokenizer.train_char(["to be or not to be, that is the question\n"])
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_kv_heads=2,
                                     n_layers=2, d_ff=48, max_positions=32)
    save_lm_run(tmp_path / "run", build_causal_lm(cfg), tok, SpecialTokens(eos_id=2, pad_id=0))
    export_hf(tmp_path / "run", tmp_path / "hf")
    args = ["compare", str(tmp_path / "run"), str(tmp_path / "hf"), "--prompt", "to be or not"]
    assert main(args) == 0
    assert "agree within 1e-04 at every stage" in capsys.readouterr().out
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        hf_model.model.layers[1].mlp.up_proj.weight.mul_(1.1)
    hf_model.save_pretrained(tmp_path / "hf")
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "first divergence: layers.1.ffn" in out and "layers.0.output" in out
