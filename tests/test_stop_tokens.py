"""Every EOS id of a run stops generation (Llama 3 instruct lists three), the run's config.json
records them all, and runs written before `eos_ids` existed still load."""

from __future__ import annotations

import json

import pytest
import torch

from handformer import cli
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.generate import generate
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import load_lm, save_lm_run


def test_eos_ids_hold_eos_id_first_without_repeats():
    assert SpecialTokens(1, 2, None).eos_ids == [2]
    assert SpecialTokens(1, 2, None, eos_ids=[7, 2, 9]).eos_ids == [2, 7, 9]
    assert SpecialTokens(eos_ids=[7, 9]).eos_id == 7
    assert SpecialTokens().eos_ids == []


@pytest.mark.parametrize("tokens, field", [({"eos_ids": [1, "x"]}, "tokens.eos_ids"),
                                           ({"eos_ids": 3}, "tokens.eos_ids"),
                                           ({"bos_id": -1}, "tokens.bos_id"),
                                           ({"eos_id": True}, "tokens.eos_id"),
                                           ({"stop": [1]}, "unknown field.*stop")])
def test_bad_tokens_section_is_a_clear_error(tokens, field):
    with pytest.raises(ValueError, match=field):
        SpecialTokens.from_dict(tokens)


@pytest.fixture
def run_dir(tmp_path):
    tok = Tokenizer.train_char(["abcdefgh"])
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_kv_heads=2,
                                     d_ff=64, n_layers=1, max_positions=64)
    torch.manual_seed(0)
    save_lm_run(tmp_path / "run", CausalLM(cfg), tok, SpecialTokens(tok.bos_id, tok.eos_id, tok.pad_id))
    return tmp_path / "run"


def _greedy_ids(run_dir, n=20):
    run = load_lm(run_dir)
    return generate(run.model, [[run.tokens.bos_id]], n, temperature=0)[0]


def test_old_format_config_loads_and_every_recorded_eos_stops_the_cli(run_dir, capsys):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["tokens"]["eos_ids"] == [config["tokens"]["eos_id"]]
    free = _greedy_ids(run_dir)
    # A run written before eos_ids existed: no such key. It loads with eos_ids = [eos_id].
    del config["tokens"]["eos_ids"]
    config["tokens"]["eos_id"] = None
    (run_dir / "config.json").write_text(json.dumps(config))
    assert load_lm(run_dir).tokens == SpecialTokens(config["tokens"]["bos_id"], None, config["tokens"]["pad_id"])
    assert cli.main(["generate", str(run_dir), "--prompt", "a", "--max-new-tokens", "20",
                     "--temperature", "0"]) == 0
    full = capsys.readouterr().out

    # Three stop ids, the third being the one greedy decoding meets first: generation ends there.
    stop = next(t for t in free[3:] if t not in free[:3])
    config["tokens"]["eos_ids"] = [free[0] + 100, free[0] + 101, stop]
    config["tokens"]["eos_id"] = free[0] + 100
    (run_dir / "config.json").write_text(json.dumps(config))
    assert load_lm(run_dir).tokens.eos_ids == [free[0] + 100, free[0] + 101, stop]
    assert cli.main(["generate", str(run_dir), "--prompt", "a", "--max-new-tokens", "20",
                     "--temperature", "0"]) == 0
    short = capsys.readouterr().out
    assert len(short) < len(full) and full.startswith(short.rstrip("\n"))
