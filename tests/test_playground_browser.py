"""The playground page in a real headless browser (Debian's chromium driven by Playwright) against the
real server (uvicorn in a thread, on a socket bound to port 0 and handed to it): it loads, generates
(chips appear, equal to `generate` for the seed), the sliders re-filter the bars exactly as
generation/sampling.py does, a click shows the attention, the translation tab translates and shows
the cross-attention, token text stays text, the console stays clean and nothing but the server is
asked for anything.

Skipped when Playwright or chromium is missing, a failure in CI (HANDFORMER_REQUIRE_REFERENCES=1)."""

import tempfile

import pytest
import torch
from helpers import CHROMIUM, CHROMIUM_ARGS, missing, require_module
from serve_helpers import Server
from test_playground import make_lm_run, make_translation_run

from handformer.generation.generate import generate
from handformer.generation.sampling import SamplingOptions, filter_logits
from handformer.serve import playground_lookups as lookups
from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models

sync_api = require_module("playwright.sync_api", "pip install -e '.[dev]'")
require_module("fastapi", "pip install -e .")
uvicorn = require_module("uvicorn", "pip install -e .")
if CHROMIUM is None:
    missing("no chromium browser installed (Debian: apt-get install chromium; scripts/install.sh does it)")

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "open sesame"

# a wait returns as soon as the page is there; the limit only ends a hung page (generous: two busy
# xdist workers and the browser share the cores)
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app on a free port, and the app behind an API key on another:
    (base url, served models, keyed base url)."""
    root = tmp_path_factory.mktemp("playground")
    make_lm_run(root / "tiny")
    make_translation_run(root / "dates")
    models = load_served_models([f"story={root / 'tiny'}", str(root / "dates")])
    running = [Server(create_app(models)), Server(create_app(models, api_key=KEY))]  # each on a socket bound to port 0, handed over
    yield running[0].url, models, running[1].url
    for s in running:
        s.stop()


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    """The playground page, loaded; every request outside the servers is aborted and recorded."""
    base, _, keyed = server
    seen: dict[str, list[str]] = {"requests": [], "errors": []}
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(dir=tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
            (base + "/", keyed + "/")) else route.abort())
        page = context.new_page()
        page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: seen["errors"].append(f"uncaught: {e}"))
        page.on("dialog", lambda d: (seen["errors"].append(f"dialog: {d.message}"), d.dismiss()))
        page.on("request", lambda r: seen["requests"].append(r.url))
        page.goto(base + "/")
        page.wait_for_selector("body[data-ready=true]", state="attached", timeout=WAIT_MS)
        yield page, seen
        context.close()


def set_range(page, selector: str, value: float) -> None:
    page.eval_on_selector(selector, "(e, v) => { e.value = String(v); e.dispatchEvent(new Event('input')); }", value)


def bars(page) -> list[tuple[int, bool, float]]:
    """The shown candidates: (token id, survives every filter, probability after temperature)."""
    return page.eval_on_selector_all("#bars tr.bar-row", "rs => rs.map(r => [Number(r.dataset.id), "
                                     "r.classList.contains('survives'), Number(r.dataset.p)])")


def test_the_page_generates_filters_shows_attention_and_translates(server, page):
    base, models, _ = server
    page, seen = page
    run = models["story"].lm
    assert page.title() == "handformer playground"
    assert page.eval_on_selector_all("#lm-model option", "os => os.map(o => o.value)") == ["story"]
    assert page.eval_on_selector_all("#tr-model option", "os => os.map(o => o.value)") == ["dates"]

    # generate: chips stream in, equal to `generate` for the seed and the sliders' settings
    prompt = "once <b>"
    page.fill("#prompt", prompt)
    page.fill("#max-tokens", "8")
    page.fill("#seed", "4")
    set_range(page, "#temperature", 0.9)
    page.click("#go")
    page.wait_for_selector("body[data-generated]", state="attached", timeout=WAIT_MS)
    ids = run.tokenizer.encode(prompt)
    last = len(ids) + int(page.get_attribute("body", "data-generated")) - 1
    page.wait_for_selector(f"body[data-attention='{last}']", state="attached", timeout=WAIT_MS)  # followed
    expected = generate(run.model, [ids], 8, temperature=0.9, seed=4, stop_tokens=run.tokens.eos_ids)[0]
    chips = page.eval_on_selector_all("#chips .chip", "cs => cs.map(c => [Number(c.dataset.id), "
                                      "c.querySelector('.tt').textContent, c.classList.contains('gen')])")
    assert [c[0] for c in chips] == ids + expected
    assert [c[1] for c in chips][:len(ids)] == [t.replace(" ", "\u2581") for t in run.tokenizer.tokens(ids)]
    assert [c[2] for c in chips] == [False] * len(ids) + [True] * len(expected)
    assert page.eval_on_selector_all("#chips b, #output b", "es => es.length") == 0  # token text is text
    assert "<b>" in "".join(c[1] for c in chips)

    # the steps' logits, as the server computed them
    gen = lookups.Generation(run, ids, 8, SamplingOptions(temperature=0.9, seed=4))
    steps = [gen.step()[1] for _ in expected]

    # click the third generated token: its bars, re-filtered by the sliders as sampling.py filters
    pos = len(ids) + 2
    page.click(f"#chips .chip[data-pos='{pos}']")
    page.wait_for_selector(f"body[data-attention='{pos}']", state="attached", timeout=WAIT_MS)
    logits = steps[2]
    shown = [i for i, _, _ in bars(page)]
    assert shown == torch.sort(logits, descending=True, stable=True).indices[:20].tolist()
    assert page.eval_on_selector("#bars tr.sampled", "r => Number(r.dataset.id)") == expected[2]
    for temperature, k, p in [(1, 0, 1), (0.9, 0, 1), (0.5, 5, 1), (1.5, 0, 0.6), (1.2, 8, 0.8), (0.7, 3, 0.3),
                              (0, 0, 1), (2, 100, 0.95)]:
        set_range(page, "#temperature", temperature)
        set_range(page, "#top-k", k)
        set_range(page, "#top-p", p)
        kept = torch.isfinite(filter_logits(logits, temperature, k or None, p if p < 1 else None))
        probs = torch.softmax(filter_logits(logits, temperature), -1)
        got = bars(page)
        assert [s for _, s, _ in got] == [bool(kept[i]) for i in shown], (temperature, k, p)
        assert [q for _, _, q in got] == pytest.approx([float(probs[i]) for i in shown], abs=1e-5)
    summary = page.text_content("#summary")
    assert "top-p 0.95 keeps" in summary and "temperature 2.00" in summary

    # the attention of the position that chose the token, last layer, mean of heads
    weights = page.eval_on_selector_all("#attn-context .chip", "cs => cs.map(c => Number(c.dataset.w))")
    with torch.no_grad():
        out = run.model(torch.tensor([(ids + expected)[:pos]]), need_weights=True)
    assert weights == pytest.approx(out.attentions[-1][0, :, -1].mean(0).tolist(), abs=2e-5)
    page.click("#attn-grid td[data-layer='0'][data-head='1']")
    weights = page.eval_on_selector_all("#attn-context .chip", "cs => cs.map(c => Number(c.dataset.w))")
    assert weights == pytest.approx(out.attentions[0][0, 1, -1].tolist(), abs=2e-5)
    page.click("#explorer-open")
    frame = page.frame_locator("#explorer")
    frame.locator("body[data-ready=true]").wait_for(state="attached", timeout=WAIT_MS)
    assert frame.locator("#queries .tok").count() == len(ids) + len(expected)

    # translate
    page.click("#tab-translate")
    page.fill("#source", "the first of may")
    page.fill("#beam", "2")
    page.click("#translate-go")
    page.wait_for_selector("body[data-translated]", state="attached", timeout=WAIT_MS)
    translator = models["dates"].translator
    assert page.text_content("#tr-output") == translator.translate(["the first of may"], beam=2)[0]
    page.click("#tr-outputs .chip[data-pos='1']")
    maps = lookups.translate(translator, "the first of may", 2)
    cross = page.eval_on_selector_all("#tr-source .chip", "cs => cs.map(c => Number(c.dataset.w))")
    last = torch.tensor(maps["cross"][-1])  # (H, T, S)
    assert cross == pytest.approx(last[:, 1].mean(0).tolist(), abs=2e-5)
    page.frame_locator("#tr-explorer").locator("body[data-ready=true]").wait_for(state="attached", timeout=WAIT_MS)

    assert seen["errors"] == []
    assert all(url.startswith(base + "/") for url in seen["requests"]), seen["requests"]

    # bad input gets its message on the page, not a broken page
    page.fill("#source", "   ")
    page.click("#translate-go")
    page.wait_for_selector("#tr-status.error", timeout=WAIT_MS)
    assert "text is empty" in page.text_content("#tr-status")
    assert all("status of 400" in e for e in seen["errors"]), seen["errors"]  # the browser logs the 400


def test_the_page_speaks_chinese_on_its_own_switch(server, page):
    """After a generation and a translation (the test above): every word of the page switches to
    Chinese and back, the dynamic lines (summary, titles, menus, status) with it; ?lang=zh opens in
    Chinese."""
    base, _, _ = server
    page, seen = page
    errors = len(seen["errors"])
    page.click("#tab-generate")
    english = page.eval_on_selector_all("[data-i18n]", "es => es.map(e => e.textContent)")
    page.click("#lang button[data-lang=zh]")
    page.wait_for_selector("body[data-lang=zh]", state="attached")
    assert page.get_attribute("html", "lang") == "zh-CN"
    chinese = page.eval_on_selector_all("[data-i18n]", "es => es.map(e => e.textContent)")
    assert len(chinese) == len(english) > 30
    assert all(c != e for c, e in zip(chinese, english)), [e for c, e in zip(chinese, english) if c == e]
    assert page.text_content("#go") == "生成" and page.text_content("#tab-translate") == "翻译"
    assert page.get_attribute("#prompt", "placeholder") == "输入提示词"
    summary = page.text_content("#summary")
    assert summary.startswith("温度 2.00") and "top-p 0.95，保留" in summary and "个 token 中采样" in summary
    assert page.text_content("#dist-title").startswith("位置 ")
    assert "注意力" in page.text_content("#attn-title")
    assert page.eval_on_selector_all("#attn-head option", "os => os.map(o => o.textContent)")[:2] == ["各头平均", "头 0"]
    assert page.text_content("#attn-grid th:nth-child(2)") == "头 0"
    assert page.text_content("#attn-info").startswith("最强：")
    set_range(page, "#top-k", 0)
    assert page.text_content("#top-k-value") == "关" and "top-k 关" in page.text_content("#summary")
    page.click("#tab-translate")
    assert "text is empty" in page.text_content("#tr-status")  # the server's message stays as it came
    assert page.text_content("#tr-info").endswith(tuple("0123456789")) and "看了：" in page.text_content("#tr-info")

    page.click("#lang button[data-lang=en]")
    page.wait_for_selector("body[data-lang=en]", state="attached")
    page.click("#tab-generate")
    assert page.eval_on_selector_all("[data-i18n]", "es => es.map(e => e.textContent)") == english
    assert page.text_content("#summary").startswith("temperature 2.00") and "top-k off of" in page.text_content("#summary")

    page.goto(base + "/?lang=zh")
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=WAIT_MS)
    assert page.get_attribute("body", "data-lang") == "zh" and page.text_content("#go") == "生成"
    assert page.text_content("#summary") == "先生成，再点击一个生成的 token。"
    page.goto(base + "/?lang=en")  # the language is remembered: leave the page in English
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=WAIT_MS)
    assert page.text_content("#go") == "Generate"
    assert len(seen["errors"]) == errors, seen["errors"][errors:]


def test_the_pages_filters_equal_sampling_py_on_known_distributions(page):
    """The page's filterDistribution against filter_logits: ties at the top-k boundary, equal
    probabilities at the top-p boundary, -inf logits, greedy, every slider setting on a grid."""
    page, _ = page
    cases = [
        [2.0, 1.0, 1.0, 1.0, 0.5, 0.0, -1.0, float("-inf")],
        [0.0] * 6,
        [3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0],
        torch.randn(300, generator=torch.Generator().manual_seed(1)).mul(2).tolist(),
        [1.0986123, 0.6931472, 0.0, 0.0],  # probabilities 0.5, 1/3, 1/6 * ... : top-p at exact sums
        # neighbouring float32 logits that become equal once divided by 0.3 (and by 1.7): after
        # temperature torch ranks the lower id first, though its raw logit is the smaller
        [-1.3812798261642456, -1.381279706954956, -3.0, 1.8951212167739868, 1.8951213359832764],
    ]
    for values in cases:
        logits = torch.tensor(values)
        order = torch.sort(logits, descending=True, stable=True).indices
        sorted_logits = [None if v == float("-inf") else v for v in logits[order].tolist()]
        settings = [(t, k, p) for t in (0, 0.3, 1, 1.7) for k in (None, 1, 2, 3, 4)
                    for p in (None, 0.1, 0.5, 0.75, 0.9, 1.0)]
        got = page.evaluate(
            "([l, ids, settings]) => settings.map(([t, k, p]) => Array.from(window.playground"
            ".filterDistribution(Float64Array.from(l, (v) => v ?? -Infinity), ids, t, k, p).survives, Boolean))",
            [sorted_logits, order.tolist(), settings])
        for (t, k, p), survives in zip(settings, got):
            assert survives == torch.isfinite(filter_logits(logits, t, k, p))[order].tolist(), (values, t, k, p)


def test_behind_an_api_key_the_page_asks_for_it_and_sends_it(server, page):
    _, models, keyed = server
    page, seen = page
    seen["errors"].clear()
    page.goto(keyed + "/")
    page.wait_for_selector("body[data-ready=key]", state="attached", timeout=WAIT_MS)
    assert page.is_visible("#key-form")
    page.fill("#api-key", "wrong")
    page.click("#key-form button")
    page.wait_for_function("document.querySelector('#key-status').textContent.includes('API key')")
    page.fill("#api-key", KEY)
    page.click("#key-form button")
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=WAIT_MS)
    assert not page.is_visible("#key-form")
    page.fill("#prompt", "once")
    page.fill("#max-tokens", "3")
    page.click("#go")
    page.wait_for_selector("body[data-generated='3']", state="attached", timeout=WAIT_MS)
    assert len(seen["errors"]) == 2 and all("status of 401" in e for e in seen["errors"]), seen["errors"]
