"""`handformer trace`: shapes and parameter counts for every preset, through the library and the CLI."""

import json

import pytest
import torch

from handformer.cli import main
from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.see.trace import PRESETS, build_model, format_trace, trace

SMALL_SEQ2SEQ = ["--set", "n_encoder_layers=1", "--set", "n_decoder_layers=1", "--set", "src_vocab_size=40",
                 "--set", "tgt_vocab_size=50", "--set", "d_model=32", "--set", "n_heads=4", "--set", "d_ff=64"]
SMALL_LM = ["--set", "n_layers=1", "--set", "vocab_size=100", "--set", "d_model=64", "--set", "n_heads=8",
            "--set", "d_ff=128"]


def unique_numel(module: torch.nn.Module) -> int:
    unique = {id(p): p for m in module.modules() for p in m.parameters(recurse=False)}
    return sum(p.numel() for p in unique.values())


def run_cli(capsys, *argv: str) -> str:
    assert main(["trace", *argv]) == 0
    return capsys.readouterr().out


def by_name(rows):
    return {r.name: r for r in rows}


def test_paper_base_model_real_size():
    model = build_model(PRESETS["paper-base"]())
    rows = by_name(trace(model))  # batch 2, source length 10, target length 5
    assert "(2, 10, 512)" in rows["encoder.layers.0"].calls[0].outputs
    assert "(2, 8, 5, 10)" in rows["decoder.layers.0.cross_attn"].calls[0].outputs
    assert "cross_attentions=6 x (2, 8, 5, 10)" in rows[""].calls[0].outputs
    # Every row counts its own subtree, shared parameters once; the model row is the model's total.
    assert rows[""].total_params == unique_numel(model) == model.num_parameters()
    for name, row in rows.items():
        assert row.total_params == unique_numel(model.get_submodule(name)), name
    assert rows["encoder.layers.0.self_attn"].total_params == 4 * 512 * 512 + 4 * 512  # 4 D^2 + 4 D
    assert any("tgt_embed.weight" in note for note in rows["generator"].notes)  # tied output head
    text = format_trace(list(rows.values()))
    assert "(2, 8, 5, 10)" in text and "query=(2, 5, 512), key=(2, 10, 512)," in text
    assert "memory_mask=(2, 1, 1, 10)" in text and "self_mask=(2, 1, 5, 5)" in text


def test_shared_embeddings_counted_once():
    cfg = Seq2SeqConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=64,
                        n_encoder_layers=1, n_decoder_layers=1, share_embeddings=True)
    model = Seq2SeqTransformer(cfg)
    rows = by_name(trace(model))
    assert rows[""].total_params == unique_numel(model) == model.num_parameters()
    assert rows[""].total_params < sum(rows[n].total_params for n in ("src_embed", "tgt_embed", "generator",
                                                                      "encoder", "decoder"))
    assert rows["tgt_embed"].notes == ["same module as src_embed"]
    # The one shared embedding runs twice, on the source and on the target: both calls are shown.
    assert [c.inputs for c in rows["src_embed"].calls] == [["(2, 10)"], ["(2, 5)"]]
    assert "* shared with an earlier module:" in format_trace(list(rows.values()))


@pytest.mark.parametrize("preset, extra, expected", [
    ("paper-base", SMALL_SEQ2SEQ, ["Seq2SeqTransformer (seq2seq)", "logits=(2, 5, 50)", "SinusoidalPositions",
                                   "cross_attn", "(2, 5, 32), (2, 4, 5, 5), (2, 4, 5, 10)"]),
    ("gpt2", SMALL_LM, ["CausalLM (causal_lm)", "logits=(2, 10, 100)", "LearnedPositions", "LayerNorm",
                        "lm_head: weight is embed.weight"]),
    ("llama", SMALL_LM, ["CausalLM (causal_lm)", "logits=(2, 10, 100)", "RotaryEmbedding", "RMSNorm",
                         "gate_proj", "rope=2 x (1, 1, 10, 8)"]),
])
def test_cli_presets(capsys, preset, extra, expected):
    out = run_cli(capsys, preset, *extra)
    for text in expected:
        assert text in out, text
    if preset == "llama":  # grouped-query attention: 4 key/value heads of 8 dims
        assert any("k_proj" in line and line.rstrip().endswith("(2, 10, 32)") for line in out.splitlines())


def test_cli_depth_and_sample_sizes(capsys):
    out = run_cli(capsys, "llama", *SMALL_LM, "--depth", "0", "--batch-size", "3", "--src-length", "7")
    table = out.splitlines()[1:]
    assert table[0].startswith("module") and table[2].startswith("(model)")
    assert "embed" not in out and "layers" not in out  # depth 0: the model row only
    assert "(3, 7)" in out and "logits=(3, 7, 100)" in out


def test_long_shape_lists_wrap_and_are_never_cut():
    cfg = Seq2SeqConfig(src_vocab_size=40, tgt_vocab_size=50, d_model=32, n_heads=4, d_ff=64,
                        n_encoder_layers=1, n_decoder_layers=1)
    rows = trace(Seq2SeqTransformer(cfg))
    text = format_trace(rows, shape_width=12)
    for row in rows:
        for call in row.calls:
            for item in call.inputs + call.outputs:
                assert item in text, item


def test_trace_leaves_the_model_as_it_was():
    model = build_model(CausalLMConfig.gpt2_style(n_layers=1, vocab_size=100, d_model=32, n_heads=4, d_ff=64))
    model.train()
    trace(model)
    assert model.training
    assert not any(m._forward_hooks for m in model.modules())
    with pytest.raises(ValueError, match="batch_size"):
        trace(model, batch_size=0)


def test_config_file_and_run_directory(capsys, tmp_path):
    cfg = CausalLMConfig.llama_style(n_layers=1, vocab_size=100, d_model=64, n_heads=8, d_ff=128)
    cfg.save(tmp_path / "model.json")
    out = run_cli(capsys, str(tmp_path / "model.json"), "--depth", "1")
    assert "RotaryEmbedding" in out and "logits=(2, 10, 100)" in out
    out = run_cli(capsys, str(tmp_path / "model.json"), "--set", "vocab_size=77", "--depth", "0")
    assert "logits=(2, 10, 77)" in out

    run_dir = tmp_path / "run"
    run_dir.mkdir()  # a training run's config.json holds a model section next to other sections
    (run_dir / "config.json").write_text(json.dumps({"model": cfg.to_dict(), "training": {"lr": 1e-3}}))
    out = run_cli(capsys, str(run_dir), "--depth", "0")
    assert "CausalLM (causal_lm)" in out


def test_unknown_preset_or_path_is_a_clear_error(capsys):
    assert main(["trace", "no-such-model"]) == 2
    message = capsys.readouterr().err
    assert "'no-such-model'" in message and "paper-base, gpt2, llama" in message


def test_unknown_override_names_the_field(capsys):
    assert main(["trace", "llama", "--set", "n_layer=2"]) == 2
    message = capsys.readouterr().err
    assert "n_layer" in message and "n_layers" in message


def test_invalid_value_or_file_exits_nonzero(capsys, tmp_path):
    assert main(["trace", "paper-base", "--set", "d_model=100"]) == 2
    assert "d_model=100" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["trace", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_command_line_exit_status(capsys):
    """An unknown model is a usage error: one line on stderr, exit status 2 (no traceback)."""
    assert main(["trace", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "neither a preset" in err and err.count("\n") == 1
    assert main(["trace", "gpt2", "--set", "d_model"]) == 2
    assert "--set expects key=value" in capsys.readouterr().err
