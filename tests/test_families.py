"""The catalogue of model families (handformer/families): each family lives in one file.

A family's model_type is written as a quoted literal in its spec's module only; every other module
(the converters, the presets, the GGUF tokenizer names equal to a model_type) reads it from the spec.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from handformer.families.catalogue import GGUF_ENTRIES, SPECS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "handformer"


def _home(model_type: str) -> Path:
    return Path(sys.modules[SPECS[model_type].from_hf_config.__module__].__file__).resolve()


def test_every_model_type_is_spelled_in_its_spec_file_only():
    """Quoted in code, comments or docstrings ("qwen2" or 'qwen2'): in one file, its spec's."""
    sources = {path.resolve(): path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")}
    elsewhere = {}
    for model_type in SPECS:
        quoted = re.compile(r"([\"'])" + re.escape(model_type) + r"\1")
        found = sorted(str(p.relative_to(ROOT)) for p, text in sources.items()
                       if quoted.search(text) and p != _home(model_type))
        if found:
            elsewhere[model_type] = found
        assert quoted.search(sources[_home(model_type)]), model_type
    assert not elsewhere, elsewhere


def test_each_spec_is_whole():
    """Every spec names its Hugging Face class, maps its tensors and converts its config both ways;
    a GGUF entry records a model_type of the catalogue."""
    for model_type, spec in SPECS.items():
        assert spec.model_type == model_type and spec.hf_class.endswith(("ForCausalLM", "LMHeadModel"))
        assert spec.tensors.weights  # claims may be empty: an import's recorded model_type leads there
    assert {e.model_type for e in GGUF_ENTRIES} <= set(SPECS)


def test_a_family_of_settings_and_tensor_names_is_one_small_spec_file():
    """StarCoder2 differs from Llama only by settings and tensor names: its spec file is all it
    took, at most 60 non-blank lines."""
    from handformer.families.starcoder2 import STARCODER2

    lines = [line for line in _home(STARCODER2.model_type).read_text().splitlines() if line.strip()]
    assert len(lines) <= 60


def test_starcoder2_matches_transformers_both_ways(tmp_path):
    """A tiny random StarCoder2 (biases, LayerNorm, a sliding window 4 wide over 12 positions):
    imported, the logits equal transformers' at every position; exported, transformers loads the
    directory and gives the same logits again."""
    import json

    import torch
    from helpers import randomize_hf, require_module

    transformers = require_module("transformers", "pip install -e '.[dev]'")
    from safetensors.torch import save_file

    from handformer.convert.hf_export import export_state_dict, hf_config, model_type_for
    from handformer.convert.hf_weights import model_from_hf

    torch.manual_seed(0)
    hf_model = randomize_hf(transformers.Starcoder2ForCausalLM(transformers.Starcoder2Config(
        vocab_size=101, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        num_hidden_layers=2, max_position_embeddings=64, sliding_window=4, bos_token_id=1, eos_token_id=2,
        attn_implementation="eager")), 0.15)
    ours = model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        expected = hf_model(ids).logits
        torch.testing.assert_close(ours(ids).logits, expected, atol=1e-5, rtol=1e-5)
    cfg = ours.cfg
    assert model_type_for(cfg) == "starcoder2"
    save_file(export_state_dict(ours.state_dict(), cfg, "starcoder2"), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf_config(cfg, "starcoder2", {"eos_token_id": 2})))
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_the_families_pages_list_every_spec_file():
    """docs/families.md (both languages): a row for each model_type naming its spec file."""
    for page in (ROOT / "docs" / "families.md", ROOT / "docs" / "zh" / "families.md"):
        rows = {line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("|")}
        for model_type in SPECS:
            spec_file = f"`families/{_home(model_type).name}`"
            assert any(f"`{model_type}`" in row and spec_file in row for row in rows), (page.name, model_type)


def test_decoding_and_serving_know_no_family():
    """generation/ and serve/ name no family's module: LongRoPE's change of frequencies is the
    rotary module's answer (`factor_set`), asked through `generation.engine.frequency_set`."""
    forbidden = re.compile(r"LongRotaryEmbedding|long_rope_start|handformer\.families|from handformer import families")
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}" for room in ("generation", "serve")
             for path in (PACKAGE / room).rglob("*.py")
             for m in [forbidden.search(path.read_text(encoding="utf-8"))] if m]
    assert not found, found
