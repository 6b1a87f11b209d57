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


def test_old_format_config_loads_and_every_recorded_eos_stops_the_cli(run_dir, capsys):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["tokens"]["eos_ids"] == [config["tokens"]["eos_id"]]
    # A run written before eos_ids existed: no such key. It loads with eos_ids = [eos_id].
    del config["tokens"]["eos_ids"]
    config["tokens"]["eos_id"] = None
    (run_dir / "config.json").write_text(json.dumps(config))
    assert load_lm(run_dir).tokens == SpecialTokens(config["tokens"]["bos_id"], None, config["tokens"]["pad_id"])
    assert cli.main(["generate", str(run_dir), "--prompt", "a", "--max-new-tokens", "20",
                     "--temperature", "0"]) == 0
    full = capsys.readouterr().out

    # The output is the prompt "a", then greedy text (one character a token). Three characters it
    # meets first at generated positions p1 < p2 < p3 become stop ids, listed last-met first: each
    # list stops at the earliest of its ids met, whichever place that id has in the list (the stop
    # token is the last one generated; an ordinary character here, so it is printed).
    text = full.rstrip("\n")[1:]
    tok = load_lm(run_dir).tokenizer
    firsts = sorted((text.index(c), c) for c in set(text) if text.index(c) > 0)[:3]
    assert len(firsts) == 3, f"greedy text {text!r} meets fewer than four characters"
    ids = [tok.encode(c)[0] for _, c in firsts]
    (p1, _), (p2, _), (p3, _) = firsts
    for listed, stop_at in [(ids[::-1], p1), (ids[:0:-1], p2), (ids[2:], p3)]:
        config["tokens"]["eos_ids"] = listed
        config["tokens"]["eos_id"] = listed[0]
        (run_dir / "config.json").write_text(json.dumps(config))
        assert load_lm(run_dir).tokens.eos_ids == listed
        assert cli.main(["generate", str(run_dir), "--prompt", "a", "--max-new-tokens", "20",
                         "--temperature", "0"]) == 0
        assert capsys.readouterr().out.rstrip("\n") == "a" + text[:stop_at + 1], listed
