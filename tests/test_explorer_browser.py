"""The attention explorer (attention.html written by `handformer viz`) in a real headless browser:
Debian's chromium driven by Playwright. It renders, the layer / head / view controls change the
matrix to the model's weights, hovering highlights, the console stays clean and nothing is fetched.

Skipped when Playwright or chromium is not installed (scripts/install.sh installs both where apt-get
is available), a failure in CI (HANDFORMER_REQUIRE_REFERENCES=1, set by .ci/run). Never
`playwright install`: the browser is the system's."""

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CHROMIUM, CHROMIUM_ARGS, make_translation_run, missing, require_module

from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.models.causal_lm import CausalLM
from handformer.see.explorer import write_explorer
from handformer.see.viz import attention_report, visualize
from handformer.tasks.lm.run import save_lm_run

sync_api = require_module("playwright.sync_api", "pip install -e '.[dev]'")
if CHROMIUM is None:
    missing("no chromium browser installed (Debian: apt-get install chromium; scripts/install.sh does it)")

# a wait returns as soon as the page is there; the limit only ends a hung page (generous: two busy
# xdist workers and the browser share the cores)
WAIT_MS = 60_000


def make_lm_run(run_dir: Path) -> Path:
    tok = Tokenizer.train_char(["你好世界 hello attention"])
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                         max_positions=32, dropout=0.0)
    save_lm_run(run_dir, CausalLM(cfg), tok, SpecialTokens(None, None, tok.pad_id))
    return run_dir


class Page:
    """A page with its console errors, uncaught exceptions and every request it tried."""

    def __init__(self, context, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready=true]", state="attached", timeout=WAIT_MS)

    def weights(self) -> np.ndarray:
        """The matrix shown now, read back from the cells' data-w attributes."""
        rows = self.page.eval_on_selector_all(
            "#matrix tr", "trs => trs.slice(1).map(tr => [...tr.querySelectorAll('td.cell')]"
                          ".map(td => Number(td.dataset.w)))")
        return np.array(rows)

    def colors(self) -> list[str]:
        return self.page.eval_on_selector_all("#matrix td.cell", "tds => tds.map(td => td.style.backgroundColor)")

    def shaded(self, selector: str) -> list[str]:
        return self.page.eval_on_selector_all(selector, "es => es.map(e => e.style.backgroundColor)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(dir=tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_ARGS, viewport={"width": 1200, "height": 900})
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                      else route.abort())
        yield context
        context.close()


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    run = make_translation_run(tmp_path_factory.mktemp("explorer") / "run")
    report = attention_report(run, "the first of may")  # what `viz` puts in the page, minus PNGs
    return report, write_explorer(report.to_dict(), run / "attention.html")


def test_explorer_renders_the_translation_views(browser, seq2seq):
    report, html = seq2seq
    page = Page(browser, html)
    cross = report.views[0]
    assert page.page.title() == "handformer attention explorer"
    assert page.page.text_content("#text") == "the first of may"
    assert page.page.text_content("#output") == report.output
    assert page.page.eval_on_selector_all(".views button", "bs => bs.map(b => b.textContent)") == [
        "cross", "encoder", "decoder"]
    assert page.page.get_attribute(".views button.active", "data-view") == "cross"
    shown = page.weights()  # default: layer 0, mean of heads
    np.testing.assert_allclose(shown, cross.layers[0].mean(0), atol=1e-4)
    assert page.page.eval_on_selector_all("#queries .tok", "es => es.map(e => e.textContent)") == [
        t.replace(" ", "\u2581", 1) if t.startswith(" ") else t for t in cross.query_tokens]
    assert page.errors == [] and page.requests == [html.as_uri()]


def test_switching_layer_head_and_view_changes_the_matrix(browser, seq2seq):
    report, html = seq2seq
    page = Page(browser, html)
    cross, encoder, decoder = report.views
    mean_colors = page.colors()
    page.page.select_option("#head", "1")
    np.testing.assert_allclose(page.weights(), cross.layers[0][1], atol=1e-4)
    assert page.colors() != mean_colors
    page.page.select_option("#layer", "1")
    np.testing.assert_allclose(page.weights(), cross.layers[1][1], atol=1e-4)
    assert "layer 1, head 1" in page.page.text_content("#info")
    page.page.click(".views button[data-view=encoder]")  # layer and head are kept
    assert page.page.get_attribute(".views button.active", "data-view") == "encoder"
    np.testing.assert_allclose(page.weights(), encoder.layers[1][1], atol=1e-4)
    page.page.click(".views button[data-view=decoder]")
    page.page.select_option("#head", "mean")
    shown = page.weights()
    np.testing.assert_allclose(shown, decoder.layers[1].mean(0), atol=1e-4)
    assert np.all(np.triu(shown, k=1) == 0)  # the causal triangle is visible
    assert page.errors == []


def test_hovering_a_token_highlights_what_it_attends_to_and_what_attends_to_it(browser, seq2seq):
    report, html = seq2seq
    page = Page(browser, html)
    cross = report.views[0]
    assert set(page.shaded("#keys .tok")) == {""}
    page.page.hover("#queries .tok[data-i='1']")
    key_shades = page.shaded("#keys .tok")
    assert all(s.startswith(("rgba(9, 105, 218", "rgb(9, 105, 218")) for s in key_shades)
    strongest = int(np.argmax(cross.layers[0].mean(0)[1]))
    assert key_shades[strongest] == "rgb(9, 105, 218)"  # the strongest key at full colour
    assert page.page.eval_on_selector_all("#matrix td.cell.hl", "es => es.map(e => e.dataset.q)") == \
        ["1"] * len(cross.key_tokens)
    assert "(query 1) attends to:" in page.page.text_content("#info")

    page.page.hover("#keys .tok[data-i='0']")
    assert all(s.startswith("rgb") for s in page.shaded("#queries .tok"))
    assert set(page.shaded("#keys .tok")) == {""}  # the previous highlight is cleared
    assert page.page.eval_on_selector_all("#matrix td.cell.hl", "es => es.map(e => e.dataset.k)") == \
        ["0"] * len(cross.query_tokens)
    assert "(key 0) is attended to by:" in page.page.text_content("#info")

    page.page.hover("#matrix td.cell[data-q='2'][data-k='3']")
    info = page.page.text_content("#info")
    assert info.startswith(f"{cross.query_tokens[2]} (query 2) \u2192 ")
    assert float(info.rsplit(": ", 1)[1]) == pytest.approx(cross.layers[0].mean(0)[2, 3], abs=2e-4)
    page.page.hover("h1")  # leaving the matrix clears every highlight
    assert page.page.eval_on_selector_all(".hl", "es => es.length") == 0
    assert page.errors == []


def test_language_model_page_marks_generated_tokens(browser, tmp_path):
    run = make_lm_run(tmp_path / "lm")
    report, files = visualize(run, "你好", max_new_tokens=4, out_dir=tmp_path / "viz")
    page = Page(browser, files[-1])
    (view,) = report.views
    assert page.page.eval_on_selector_all(".views button", "bs => bs.map(b => b.textContent)") == ["self"]
    tokens = page.page.eval_on_selector_all("#queries .tok", "es => es.map(e => e.textContent)")
    assert tokens[:2] == ["你", "好"] and len(tokens) == 6
    assert page.page.eval_on_selector_all("#queries .tok.gen", "es => es.length") == 4
    np.testing.assert_allclose(page.weights(), view.layers[0].mean(0), atol=1e-4)
    page.page.hover("#queries .tok[data-i='5']")
    assert "(query 5) attends to:" in page.page.text_content("#info")
    assert page.errors == [] and page.requests == [files[-1].as_uri()]
