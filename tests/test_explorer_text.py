"""The attention explorer's words per language (see/explorer.py): the Chinese page shows the zh
table and no English UI string, the English page keeps its words. No browser."""

import json
import re
from html.parser import HTMLParser

import pytest

from handformer.see import explorer
from handformer.see.explorer import TEXTS, explorer_html

DATA = {"task": "lm", "text": "ab", "output": "c", "output_label": "greedy continuation",
        "views": [{"name": "self", "title": "causal self-attention over the prompt and the generated tokens",
                   "queries": ["a", "b"], "keys": ["a", "b"], "query_title": "token (query)",
                   "key_title": "tokens it may attend to (keys)", "split": 1,
                   "layers": [[[[1.0, 0.0], [0.5, 0.5]]]]}]}


def blob(page: str, element_id: str):
    found = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def shown_outside_scripts(page: str) -> str:
    """The page's HTML without its scripts: the words the body itself holds."""
    return re.sub(r"<script\b.*?</script>", "", page, flags=re.S)


class TextNodes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.words: list[str] = []

    def handle_data(self, data: str) -> None:
        self.words.append(data)


def visible_words(page: str, data: dict) -> str:
    """What a reader sees of the page: its text outside scripts, and the words the data shows."""
    nodes = TextNodes()
    nodes.feed(shown_outside_scripts(page))
    shown = [data["output_label"]] + [v[k] for v in data["views"]
                                      for k in ("label", "title", "query_title", "key_title")]
    return "\n".join(nodes.words + shown)


def english_fragments() -> list[str]:
    """Every English UI string of the table, cut at its {placeholders}, that is a word or more."""
    parts = (re.split(r"\{\w+\}", value) for value in TEXTS["en"].values())
    return sorted({p.strip(" :,.()\n") for ps in parts for p in ps if len(p.strip(" :,.()\n")) >= 4})


def test_the_chinese_page_holds_the_zh_table_and_no_english_ui_string():
    page = explorer_html(DATA, lang="zh")
    assert page.startswith('<!DOCTYPE html>\n<html lang="zh">')
    assert blob(page, "explorer-text") == TEXTS["zh"]
    body = shown_outside_scripts(page)
    for key in ("heading", "input", "layer", "head"):
        assert f"{TEXTS['zh'][key]}" in body
    assert "层和头都从 0 开始计数" in body and "<title>handformer 注意力浏览器</title>" in body
    data = blob(page, "attention-data")
    (view,) = data["views"]
    assert (view["label"], view["query_title"], data["output_label"]) == ("自注意力", "token（查询）", "续写（贪心）")
    words = visible_words(page, data)
    leaked = [f for f in english_fragments() if f in words and f != "handformer"]
    assert not leaked, f"English UI strings on the Chinese page: {leaked}"
    # the script's own strings all come from the table: no English phrase is left in its literals
    literals = "\n".join(re.findall(r'"[^"\n]*"|`[^`]*`', explorer.SCRIPT))
    leaked = [f for f in english_fragments() if " " in f and f in literals]
    assert not leaked, f"English strings written into the script: {leaked}"


def test_the_english_page_keeps_its_words():
    page = explorer_html(DATA)
    assert page.startswith('<!DOCTYPE html>\n<html lang="en">')
    assert blob(page, "explorer-text") == TEXTS["en"] and blob(page, "attention-data") == DATA
    body = shown_outside_scripts(page)
    for words in ("<title>handformer attention explorer</title>", "<b>input:</b>",
                  "<label>layer <select", "<label>head <select", "Layers and heads are counted from 0."):
        assert words in body
    assert not re.search(r"[\u4e00-\u9fff]", page)


def test_an_unknown_language_is_refused():
    with pytest.raises(ValueError, match="lang must be one of en, zh, got 'fr'"):
        explorer_html(DATA, lang="fr")
