"""`handformer viz` and `handformer plot` on tiny run directories of both families: the files they
write, the maps behind them, token labels in any script (CJK included), and their errors."""

import contextlib
import io
import json
import re
import warnings

import numpy as np
import pytest
import torch
from helpers import references_required
from matplotlib import font_manager

from handformer.cli import main
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.models.causal_lm import CausalLM
from handformer.see import fonts
from handformer.see.explorer import explorer_html
from handformer.see.plots import plot_attention, plot_attention_heads, plot_runs
from handformer.see.viz import attention_report, visualize
from handformer.tasks.lm.run import save_lm_run

TINY_TRANSLATION = ["train.steps=3", "data.n_train=200", "data.n_heldout=10", "data.vocab_size=300",
                    "data.max_tokens=512", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
                    "model.n_encoder_layers=2", "model.n_decoder_layers=1", "train.eval_every=3",
                    "train.log_every=1", "train.warmup=1", "train.progress=false", "train.device=cpu"]
CJK_TEXT = "你好世界，注意力就是你所需要的。こんにちは 안녕 hello"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory, one_thread):
    """A translation run trained for 3 steps: 2 encoder layers, 1 decoder layer, 2 heads."""
    run_dir = tmp_path_factory.mktemp("viz") / "dates"
    sets = [a for s in TINY_TRANSLATION for a in ("--set", s)]
    rc, _, err = run_cli("train", "--config", "demo", *sets, "--out", str(run_dir))
    assert rc == 0, err
    return run_dir


def make_lm_run(run_dir, text=CJK_TEXT, n_layers=2, max_positions=40):
    """A random tiny language model with a character tokenizer over `text`."""
    tok = Tokenizer.train_char([text])
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=n_layers,
                         max_positions=max_positions, dropout=0.0)
    save_lm_run(run_dir, CausalLM(cfg), tok, SpecialTokens(None, None, tok.pad_id))
    return run_dir


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, one_thread):
    return make_lm_run(tmp_path_factory.mktemp("viz") / "lm")


def cjk_font_installed() -> bool:
    return any(any(h in p.lower() for h in fonts.CJK_FILE_HINTS) for p in font_manager.findSystemFonts())


# --- translation runs --------------------------------------------------------------------------

def test_viz_translation_writes_every_map_and_the_explorer(translation_run, tmp_path):
    out = tmp_path / "viz"
    rc, stdout, err = run_cli("viz", str(translation_run), "march third, nineteen ninety", "--out", str(out))
    assert rc == 0, err
    assert "source:      march third, nineteen ninety" in stdout
    assert re.search(r"^translation: ", stdout, re.M)
    expected = {"cross_layer0", "encoder_layer0", "encoder_layer1", "decoder_layer0"}
    names = {p.name for p in out.iterdir()}
    assert names == {f"{s}_{kind}.png" for s in expected for kind in ("heads", "mean")} | {"attention.html"}
    for name in names - {"attention.html"}:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert name in stdout
    assert f"explorer (open in a browser): {out / 'attention.html'}" in stdout


def test_translation_maps_are_the_teacher_forced_translation(translation_run):
    report = attention_report(translation_run, "the first of may, twenty twenty")
    cross, encoder, decoder = report.views
    assert [v.name for v in report.views] == ["cross", "encoder", "decoder"]
    S, T = len(encoder.query_tokens), len(decoder.query_tokens)
    assert cross.query_tokens[-1] == "</s>" and encoder.key_tokens[-1] == "</s>"
    assert decoder.query_tokens[0] == "<s>"  # decoder inputs: BOS + output
    assert len(cross.query_tokens) == T  # one row per decoder position: what it produced
    assert [w.shape for w in encoder.layers] == [(2, S, S)] * 2
    assert [w.shape for w in decoder.layers] == [(2, T, T)]
    assert [w.shape for w in cross.layers] == [(2, T, S)]
    for view in report.views:
        for w in view.layers:
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(decoder.layers[0], k=1) == 0)  # causal: no weight on later targets


def test_viz_layer_and_head_select_the_pictures(translation_run, tmp_path):
    out = tmp_path / "one"
    rc, _, err = run_cli("viz", str(translation_run), "june 2, 1999", "--layer", "1", "--head", "1",
                         "--out", str(out))
    assert rc == 0, err
    # Layer 1 exists only in the encoder; the decoder and cross views have one layer.
    assert sorted(p.name for p in out.glob("*.png")) == ["encoder_layer1_head1.png",
                                                        "encoder_layer1_mean.png"]
    assert (out / "attention.html").is_file()  # the explorer always holds every layer


@pytest.mark.parametrize("args, message", [
    (["--layer", "2"], "--layer 2 is out of range; valid layers: cross 0-0, encoder 0-1, decoder 0-0"),
    (["--layer", "-1"], "valid layers: cross 0-0, encoder 0-1, decoder 0-0"),
    (["--head", "2"], "--head 2 is out of range; valid heads: 0-1 (2 heads"),
    (["--head", "-3"], "valid heads: 0-1"),
])
def test_viz_translation_selection_errors_name_the_valid_range(translation_run, tmp_path, args, message):
    rc, stdout, err = run_cli("viz", str(translation_run), "may 1, 2020", *args, "--out", str(tmp_path / "x"))
    assert rc == 2 and stdout == ""
    assert message in err
    assert not (tmp_path / "x").exists()  # checked before any work


@pytest.mark.parametrize("text", ["", "   \n"])
def test_viz_rejects_text_that_tokenizes_to_nothing(translation_run, lm_run, tmp_path, text):
    for run in (translation_run, lm_run):
        rc, _, err = run_cli("viz", str(run), text, "--out", str(tmp_path / "x"))
        assert rc == 2 and "error: TEXT is empty" in err


def test_viz_rejects_what_is_not_a_run_directory(tmp_path):
    rc, _, err = run_cli("viz", str(tmp_path / "missing"), "hello")
    assert rc == 2 and "missing is not a run directory (nothing is there)" in err
    rc, _, err = run_cli("viz", str(tmp_path), "hello")
    assert rc == 2 and "is not a run directory (no config.json)" in err
    (tmp_path / "config.json").write_text("{not json")
    rc, _, err = run_cli("viz", str(tmp_path), "hello")
    assert rc == 2 and "config.json is not valid JSON" in err
    (tmp_path / "config.json").write_text(json.dumps({"task": "classify", "model": {}}))
    rc, _, err = run_cli("viz", str(tmp_path), "hello")
    assert rc == 2 and "expected 'translation' or 'lm'" in err


# --- language-model runs -----------------------------------------------------------------------

def test_viz_lm_prompt_and_generated_tokens(lm_run, tmp_path):
    out = tmp_path / "lm"
    rc, stdout, err = run_cli("viz", str(lm_run), "你好", "--max-new-tokens", "5", "--out", str(out),
                              "--lang", "zh")
    assert rc == 0, err
    assert "prompt:    你好" in stdout and "(greedy)" in stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "attention.html", "self_layer0_heads.png", "self_layer0_mean.png", "self_layer1_heads.png",
        "self_layer1_mean.png"]
    assert '<html lang="zh">' in (out / "attention.html").read_text(encoding="utf-8")  # --lang zh
    report = attention_report(lm_run, "你好", max_new_tokens=5)
    (view,) = report.views
    assert view.name == "self" and view.split == 2
    assert view.query_tokens[:2] == ["你", "好"] and len(view.query_tokens) == 7  # no EOS: all 5 made
    for w in view.layers:
        assert w.shape == (2, 7, 7)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(w, k=1) == 0)


def test_viz_explorer_follows_the_locale_without_lang(lm_run, tmp_path, monkeypatch):
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        monkeypatch.delenv(var, raising=False)
    for locale_name, lang in (("zh_CN.UTF-8", "zh"), ("en_US.UTF-8", "en")):
        monkeypatch.setenv("LANG", locale_name)
        out = tmp_path / lang
        rc, _, err = run_cli("viz", str(lm_run), "ab", "--max-new-tokens", "1", "--out", str(out))
        assert rc == 0, err
        assert f'<html lang="{lang}">' in (out / "attention.html").read_text(encoding="utf-8")


def test_viz_lm_generation_stops_at_the_context(tmp_path):
    run = make_lm_run(tmp_path / "short", max_positions=6)
    report = attention_report(run, "hello", max_new_tokens=8)
    assert len(report.views[0].query_tokens) == 6  # 5 prompt tokens + the 1 that fits
    rc, _, err = run_cli("viz", str(run), "hello hello", "--out", str(tmp_path / "x"))
    assert rc == 2 and "TEXT is 11 tokens but the model's context is 6 tokens" in err


def test_viz_lm_selection_errors(lm_run, tmp_path):
    rc, _, err = run_cli("viz", str(lm_run), "hello", "--layer", "5", "--out", str(tmp_path / "x"))
    assert rc == 2 and "--layer 5 is out of range; valid layers: 0-1 (2 layers, counted from 0)" in err
    rc, _, err = run_cli("viz", str(lm_run), "hello", "--head", "9", "--out", str(tmp_path / "x"))
    assert rc == 2 and "valid heads: 0-1" in err


def test_default_output_is_inside_the_run(tmp_path):
    run = make_lm_run(tmp_path / "lm", n_layers=1)
    _, files = visualize(run, "hello", head=0, max_new_tokens=2)
    assert [f.relative_to(run).as_posix() for f in files] == [
        "viz/self_layer0_head0.png", "viz/self_layer0_mean.png", "viz/attention.html"]


# --- labels in any script ----------------------------------------------------------------------

def test_cjk_labels_render_without_missing_glyphs(tmp_path, capsys):
    if not cjk_font_installed():
        reason = "no CJK font installed (Debian: fonts-noto-cjk; scripts/install.sh installs it)"
        if references_required():
            pytest.fail(f"{reason} (HANDFORMER_REQUIRE_REFERENCES is set)", pytrace=False)
        pytest.skip(reason)
    assert fonts.cjk_font() is not None
    assert fonts.missing_glyphs([CJK_TEXT]) == ""
    tokens = list("你好世界注意力")
    weights = np.full((2, 7, 7), 1 / 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_attention(weights[0], tokens, tokens, tmp_path / "a.png", title="注意力 " + CJK_TEXT)
        plot_attention_heads(weights, tokens, tokens, tmp_path / "b.png", title="多头注意力")
    glyph_warnings = [str(w.message) for w in caught if "Glyph" in str(w.message)]
    assert glyph_warnings == []
    assert capsys.readouterr().err == ""


def test_without_a_cjk_font_one_warning_line_replaces_the_boxes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fonts, "cjk_font", lambda: None)
    monkeypatch.setattr(fonts, "_warned", set())
    tokens = ["你", "好", "a"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_attention(np.eye(3), tokens, tokens, tmp_path / "a.png")
        plot_attention_heads(np.ones((2, 3, 3)) / 3, tokens, tokens, tmp_path / "b.png")  # said once
    assert [str(w.message) for w in caught if "Glyph" in str(w.message)] == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no installed font has glyphs for '你好'" in err and "fonts-noto-cjk" in err
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG_MAGIC


def test_heatmap_labels_must_match_the_map(tmp_path):
    with pytest.raises(ValueError, match="does not match 2 query labels x 3 key labels"):
        plot_attention(np.zeros((3, 3)), ["a", "b", "c"], ["a", "b"], tmp_path / "x.png")


def test_explorer_page_is_self_contained_and_escapes_tokens():
    evil = "</script><script>alert(1)</script>"
    data = {"task": "lm", "text": evil, "output": "&amp;", "output_label": "continuation",
            "views": [{"name": "self", "title": "t", "queries": [evil, "b"], "keys": [evil, "b"],
                       "query_title": "q", "key_title": "k", "split": 1,
                       "layers": [[[[1.0, 0.0], [0.5, 0.5]]]]}]}
    page = explorer_html(data)
    assert evil not in page and page.count("</script>") == 3  # the data, the words, the script
    assert not re.search(r"https?://|<link|\ssrc=", page)
    assert "Content-Security-Policy" in page
    blob = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)
    assert json.loads(blob.group(1)) == data
    with pytest.raises(ValueError, match="at least one attention view"):
        explorer_html({"views": []})


# --- handformer plot ---------------------------------------------------------------------------

def write_metrics(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_plot_overlays_several_runs(translation_run, tmp_path):
    other = write_metrics(tmp_path / "b" / "dates", [
        {"step": s, "elapsed_s": 0.5 * s, "lr": 1e-3 * s, "train_loss": 5.0 / s} for s in (1, 2, 3)]
        + [{"step": 3, "elapsed_s": 1.5, "lr": 3e-3, "val_loss": 2.0}])
    out = tmp_path / "compare.png"
    rc, stdout, err = run_cli("plot", str(translation_run), str(other), "--out", str(out))
    assert rc == 0, err
    assert stdout == f"wrote {out}\n" and out.read_bytes()[:8] == PNG_MAGIC
    rc, stdout, _ = run_cli("plot", str(translation_run))  # default: inside the run
    assert rc == 0 and (translation_run / "training_curves.png").is_file()


def test_plot_errors(tmp_path):
    rc, _, err = run_cli("plot", str(tmp_path), "--out", str(tmp_path / "x.png"))
    assert rc == 2 and f"{tmp_path} is not a training run directory (no metrics.jsonl)" in err
    rc, _, err = run_cli("plot", str(tmp_path / "nope"), "--out", str(tmp_path / "x.png"))
    assert rc == 2 and "nope is not a training run directory (nothing is there)" in err
    write_metrics(tmp_path / "empty", [])
    rc, _, err = run_cli("plot", str(tmp_path / "empty"), "--out", str(tmp_path / "x.png"))
    assert rc == 2 and "has no records yet" in err
    # A run still writing its last line is plotted without it.
    run = write_metrics(tmp_path / "live", [{"step": 1, "elapsed_s": 0.1, "lr": 1e-3, "train_loss": 3.0}])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "elap')
    assert plot_runs([run], tmp_path / "live.png").is_file()
    assert not (tmp_path / "x.png").exists()
