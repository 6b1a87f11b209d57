"""The documentation site: `mkdocs build --strict` (mkdocs.yml) into a temporary folder, so a broken
link, anchor or nav entry fails the suite; the built pages fetch nothing from elsewhere; and in
Chromium (Debian's, driven by Playwright) both languages show the tour, `check` and search results
for mask / 掩码. MkDocs and its plugins missing fail under HANDFORMER_REQUIRE_REFERENCES=1."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import CHROMIUM, CHROMIUM_ARGS, missing, require_module

ROOT = Path(__file__).resolve().parent.parent
for module in ("mkdocs", "material", "mkdocs_static_i18n", "jieba"):
    require_module(module, "pip install -e '.[dev]' (the documentation tools)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # not --quiet: with it mkdocs does not count the warnings that --strict turns into a failure
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                if re.search(r"WARNING|ERROR|Error|Aborted", line)]
    assert proc.returncode == 0 and not problems, (
        "mkdocs build --strict warned or failed (fix the page it names; a new page goes into mkdocs.yml's nav):\n"
        + "\n".join(problems or (proc.stdout + proc.stderr).splitlines()[-30:]))
    return out


def test_the_site_has_both_languages(site):
    for page in ("index.html", "tour/index.html", "check/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
        assert (site / "zh" / page).is_file(), f"zh/{page}"
    home = (site / "zh" / "index.html").read_text(encoding="utf-8")
    assert "学习路径" in home and 'href="../tour/"' not in home  # the Chinese home links the Chinese tour


def test_the_site_fetches_nothing_from_elsewhere(site):
    remote = re.compile(r"""(?:src|href)=["'](?:https?:)?//[^"']+["'][^>]*>|@import\s+url\(["']?https?:""")
    found = []
    for page in site.rglob("*"):
        if page.suffix not in (".html", ".css", ".js"):
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        for m in remote.finditer(text):
            tag = text[text.rfind("<", 0, m.start()):m.end()]
            if page.suffix == ".html" and tag.startswith("<a "):
                continue  # a link the reader may follow, not something the page loads
            found.append(f"{page.relative_to(site)}: {tag[:120]}")
    assert "fonts.googleapis" not in "".join(found)
    assert not found, "the site loads things from other hosts (it must work offline):\n" + "\n".join(found)




class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser_page(site, tmp_path_factory):
    """A Chromium page and the site's base URL; any request elsewhere is aborted and recorded."""
    sync_api = require_module("playwright.sync_api", "pip install -e '.[dev]'")
    if CHROMIUM is None:
        missing("no chromium browser installed (Debian: apt-get install chromium; scripts/install.sh does it)")
    # bound to port 0 by the server itself: the system's free port, with no moment for another to take it
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    elsewhere: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(dir=tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS)
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base + "/")
                      else (elsewhere.append(route.request.url), route.abort()))
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield page, base, elsewhere, errors
        context.close()
    httpd.shutdown()


def search(page, query: str) -> list[str]:
    """Type `query` into the search box; the titles of the results."""
    box = page.locator("input[data-md-component=search-query]")
    box.click(timeout=60_000)
    box.fill(query)
    page.wait_for_selector(".md-search-result__item", timeout=60_000)
    return page.locator(".md-search-result__item").all_inner_texts()


@pytest.mark.parametrize("lang,tour,check,query", [
    ("en", "The tour", "Check your Transformer", "mask"),
    ("zh", "导览", "检查你的 Transformer", "掩码"),
])
def test_both_languages_show_the_tour_check_and_search(browser_page, lang, tour, check, query):
    page, base, elsewhere, errors = browser_page
    prefix = "" if lang == "en" else "zh/"
    page.goto(f"{base}/{prefix}")
    page.get_by_role("link", name=tour).first.click()
    page.wait_for_url(f"{base}/{prefix}tour/")
    assert page.locator("h1").first.inner_text().strip()
    page.get_by_role("link", name=check, exact=True).first.click()
    page.wait_for_url(f"{base}/{prefix}check/")
    assert "handformer check" in page.locator("h1").first.inner_text()
    results = search(page, query)
    assert results and any(query in r for r in results), results
    assert not elsewhere, f"the site asked other hosts for {elsewhere}"
    assert not errors, errors
