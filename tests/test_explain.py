"""`handformer explain`: every figure is drawn, small, from the real code; the measurements behind
the scaling figure say what the tutorials say; docs/figures holds every figure."""

import contextlib
import functools
import io
import math
import re
from pathlib import Path

import matplotlib
import pytest
import torch

from handformer.cli import main
from handformer.see import captions, explain
from handformer.see.captions import TEXTS, Captions
from handformer.see.explain import (
    FIGURES,
    TEMPERATURES,
    measure_scaling,
    sample_masks,
    sampling_filters,
    softmax_at,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"
DOCS_FIGURES = DOCS / "figures"
# from trained models, not from `explain` (docs/figures/README.md has the commands)
TRAINED_FIGURES = ("demo_cross_attention.png", "playground.png", "moe_experts.png")
ZH_TRAINED_FIGURES = ("moe_experts.png",)
CJK = re.compile(r"[\u4e00-\u9fff]")


def texts_of(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


@pytest.fixture(scope="module", autouse=True)
def traced_once():
    """The data-flow figure traces two full-size models (a second a language on the 2-core machine);
    the shapes do not depend on the language, so the module traces each preset once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(explain, "traced_shapes", functools.cache(explain.traced_shapes))
        yield


@pytest.fixture(scope="module")
def drawn(tmp_path_factory, traced_once):
    """`handformer explain` once for the module: its exit code, what it printed, the folder, and
    every text each figure drew (kept as it is saved), and what it printed on stderr."""
    out = tmp_path_factory.mktemp("figures")
    buf, err, texts, save = io.StringIO(), io.StringIO(), {}, explain._save

    def keep_texts_and_save(fig, path):
        texts[Path(path).stem] = texts_of(fig)
        return save(fig, path)

    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        mp.setattr(explain, "_save", keep_texts_and_save)
        rc = main(["explain", "--lang", "en", "--out", str(out)])
    return rc, buf.getvalue(), out, texts, err.getvalue()


def test_explain_writes_every_figure(drawn):
    rc, stdout, out, _, _ = drawn
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{name}.png" for name in FIGURES)
    assert stdout.splitlines() == [f"wrote {out / name}.png" for name in FIGURES]
    for path in out.iterdir():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width <= 1400 and height <= 800, (path.name, width, height)  # dpi 100
        assert len(data) < 300_000, path.name


def test_the_committed_figures_are_all_there():
    drawn = [f"{n}.png" for n in FIGURES]
    assert sorted(p.name for p in DOCS_FIGURES.glob("*.png")) == sorted(drawn + list(TRAINED_FIGURES))
    assert sorted(p.name for p in (DOCS / "zh" / "figures").glob("*.png")) == sorted(drawn + list(ZH_TRAINED_FIGURES))


def drawn_texts(monkeypatch, lang: str) -> tuple[dict[str, list[str]], str]:
    """Every text each figure draws, with `explain(lang=...)`, and what it printed on stderr."""
    texts: dict[str, list[str]] = {}

    def keep_texts(fig, out):
        texts[Path(out).stem] = texts_of(fig)
        matplotlib.pyplot.close(fig)
        return out

    monkeypatch.setattr(explain, "_save", keep_texts)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        explain.explain("unused", lang=lang)
    return texts, err.getvalue()


def test_chinese_titles_and_labels(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(captions, "cjk_font", lambda: "Noto Sans CJK SC")
    texts, err = drawn_texts(monkeypatch, "zh")
    assert err == ""
    assert sorted(texts) == sorted(FIGURES)
    for name, found in texts.items():
        assert any(CJK.search(t) for t in found), f"{name}.png has no Chinese text: {found[:5]}"
    assert "概率" in texts["top_k_top_p"] and "因果掩码，句子 0" in texts["masks"]


def test_english_stays_english(drawn):
    texts, err = drawn[3:]
    assert err == "" and sorted(texts) == sorted(FIGURES)
    assert not any(CJK.search(t) for found in texts.values() for t in found)
    assert "causal mask, sentence 0" in texts["masks"]


def test_chinese_without_a_cjk_font_warns_once_and_keeps_english(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(captions, "cjk_font", lambda: None)
    monkeypatch.setattr(explain, "FIGURES", {k: FIGURES[k] for k in ("masks", "top_k_top_p")})
    texts, err = drawn_texts(monkeypatch, "zh")
    assert err.count("\n") == 1 and err.startswith("warning: no Chinese (CJK) font installed")
    assert "fonts-noto-cjk" in err
    assert not any(CJK.search(t) for found in texts.values() for t in found)


def test_every_caption_exists_in_both_languages_with_the_same_fields():
    fields = re.compile(r"{(\w*)}")
    for key, by_lang in TEXTS.items():
        assert sorted(by_lang) == ["en", "zh"], key
        assert sorted(fields.findall(by_lang["en"])) == sorted(fields.findall(by_lang["zh"])), key
    assert Captions("zh")("temp.panel", t=0.5) == "T = 0.5"
    with pytest.raises(ValueError, match="unknown language 'fr'; choose one of en, zh"):
        Captions("fr")


def test_explain_lang_on_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(explain, "FIGURES", {"top_k_top_p": explain.figure_top_k_top_p})
    assert main(["explain", "--lang", "zh", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'top_k_top_p.png'}\n"
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--lang", "fr"])
    assert exc.value.code == 2
    assert "invalid choice: 'fr'" in capsys.readouterr().err


def test_explain_writes_under_runs_by_default_never_over_the_committed_figures(tmp_path, monkeypatch, capsys):
    """...in the locale's language without --lang, as viz and check choose it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs" / "figures").mkdir(parents=True)  # as in a checkout of the repository
    monkeypatch.setattr(explain, "FIGURES", {"top_k_top_p": explain.figure_top_k_top_p})
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    assert main(["explain"]) == 0
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert main(["explain"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {Path('runs/explain/top_k_top_p.png')}", f"wrote {Path('runs/explain/zh/top_k_top_p.png')}"]
    assert (tmp_path / "runs/explain/zh/top_k_top_p.png").is_file()
    assert not any((tmp_path / "docs").rglob("*.png"))


def test_explain_into_a_file_is_one_clear_error(tmp_path, capsys):
    target = tmp_path / "figures.png"
    target.write_text("not a folder")
    assert main(["explain", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {target} is a file, not a directory; give a directory for the figures\n"


def test_top_k_and_top_p_keep_what_they_promise():
    probs = sampling_filters()
    full = probs["full"]
    assert (probs["top_k"] > 0).sum() == 3 and torch.allclose(probs["top_k"][:3], full[:3] / full[:3].sum())
    kept = int((probs["top_p"] > 0).sum())
    assert full[:kept].sum() >= 0.8 > full[: kept - 1].sum()  # the smallest prefix reaching p
    for dist in probs.values():
        assert dist.sum().item() == pytest.approx(1.0)


def test_scaling_keeps_softmax_from_saturating():
    m = measure_scaling((4, 64, 1024), n_keys=16, samples=256)
    for d, raw, scaled in zip((4, 64, 1024), m["raw_std"], m["scaled_std"]):
        assert raw == pytest.approx(math.sqrt(d), rel=0.15)  # q.k of unit vectors: std sqrt(d_k)
        assert scaled == pytest.approx(1.0, rel=0.15)
    assert m["max_unscaled"][-1] > 0.9 and m["entropy_unscaled"][-1] < 0.3  # nearly one-hot
    assert max(m["max_scaled"]) < 0.4 and min(m["entropy_scaled"]) > 2.0  # log(16) = 2.77
    assert m["max_unscaled"] == sorted(m["max_unscaled"])  # saturates more as d_k grows


def test_softmax_temperature_endpoints():
    scores = torch.tensor([3.0, 1.5, 1.0])
    assert softmax_at(scores, 0.0).tolist() == [1.0, 0.0, 0.0]
    probs = [softmax_at(scores, t)[0].item() for t in TEMPERATURES]
    assert probs == sorted(probs, reverse=True)  # the top score loses mass as T grows


def test_sample_masks_follow_the_convention():
    batch, masks = sample_masks()
    T = len(batch[0])
    pad = masks["padding"]
    assert pad.shape == (2, T, T) and pad.dtype == torch.bool
    assert pad[0, :, -2:].sum() == 0 and pad[1].all()  # sentence 0 ends in two <pad>
    assert torch.equal(masks["causal"][0], torch.ones(T, T, dtype=torch.bool).tril())
    assert torch.equal(masks["padding & causal"], pad & masks["causal"])
