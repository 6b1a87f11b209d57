"""The tours run: docs/tour.md (English) and docs/zh/tour.md (Chinese). Every ```python block is
executed in order in one namespace, and what each block prints must match its `# prints: TEXT` (or
`# -> TEXT`) comments, line by line, in order. `...` in TEXT matches anything. The convention is
documented at the top of each tour.

The two tours are kept in step: the same sections in the same order, each naming the same tutorial
chapter, with the same code (compared without comments, which are translated) and the same
announced output."""

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

DOCS = Path(__file__).resolve().parent.parent / "docs"
TOURS = {"en": DOCS / "tour.md", "zh": DOCS / "zh" / "tour.md"}
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
EXPECT = re.compile(r"#.*?(?:\bprints:|->)\s?(.*)$")  # the first marker in a comment
SECTION = re.compile(r"^## (\d+)\. ", re.M)
CHAPTER = re.compile(r"(手写Transformer|图解Transformer) (0\d)")  # how both tours name a chapter


def blocks(tour: Path) -> list[tuple[int, str]]:
    """(line number, code) of every python block of the tour."""
    text = tour.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def sections(tour: Path) -> list[tuple[str, str]]:
    """(number, text) of every '## N. ' section of the tour."""
    text = tour.read_text(encoding="utf-8")
    starts = list(SECTION.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return [(m.group(1), text[m.start():end]) for m, end in zip(starts, ends)]


def expectations(code: str) -> list[str]:
    return [m.group(1).rstrip() for line in code.splitlines() if (m := EXPECT.search(line))]


def matches(expected: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


def test_the_convention_itself():
    assert expectations("print(1)  # prints: 1\nx = 2\n# -> a ... b") == ["1", "a ... b"]
    assert expectations("f(x)  # the shape (B, T) -> (2, 5)\ny = 1  # a comment") == ["(2, 5)"]
    assert expectations("print(1)  # 一行注释，输出 -> 1") == ["1"]
    assert matches("a ... b", "a 0.123 b") and not matches("a ... b", "a 1 c")
    assert matches("(2, 8)", "(2, 8)") and not matches("(2, 8)", "(2, 8, 1)")


@pytest.mark.parametrize("lang", TOURS)
def test_every_snippet_prints_what_the_tour_says(lang, tmp_path, monkeypatch):
    tour = TOURS[lang]
    found = blocks(tour)
    assert len(found) >= 10, "the tour lost its snippets"
    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace: dict = {"__name__": "tour"}
    where = tour.relative_to(DOCS.parent)
    try:
        for line, code in found:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{where}:{line}", "exec"), namespace)
            printed = [p.rstrip() for p in out.getvalue().splitlines()]
            expected = expectations(code)
            assert len(printed) == len(expected), (
                f"block at {where} line {line} printed {len(printed)} lines, the tour announces "
                f"{len(expected)}:\nprinted:  {printed}\nexpected: {expected}")
            for want, got in zip(expected, printed):
                assert matches(want, got), f"block at {where} line {line}: expected {want!r}, got {got!r}"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("lang", TOURS)
def test_the_tour_shows_the_figures_it_names(lang):
    tour = TOURS[lang]
    text = tour.read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images, "the tour embeds no figure"
    for image in images:
        assert (tour.parent / image).is_file(), image
    for link in re.findall(r"\]\(([^)#]+\.md)\)", text):
        assert (tour.parent / link).is_file(), link


def test_the_two_tours_have_the_same_sections_in_the_same_order():
    en, zh = sections(TOURS["en"]), sections(TOURS["zh"])
    assert [n for n, _ in en] == [str(i) for i in range(1, len(en) + 1)], "sections numbered 1, 2, ..."
    assert [n for n, _ in zh] == [n for n, _ in en], "the Chinese tour's sections differ from the English"
    for (n, en_text), (_, zh_text) in zip(en, zh):
        chapters = CHAPTER.findall(en_text.split("\n\n")[1])
        assert chapters, f"section {n} of docs/tour.md names no tutorial chapter"
        assert CHAPTER.findall(zh_text.split("\n\n")[1]) == chapters, f"section {n} names another chapter"
        assert len(BLOCK.findall(en_text)) == len(BLOCK.findall(zh_text)), f"section {n}: python blocks"
        assert (re.findall(r"!\[[^\]]*\]\(([^)]+)\)", en_text)
                == [re.sub(r"^\.\./", "", i) for i in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", zh_text)]), (
            f"section {n}: not the same figures")


def test_the_two_tours_run_the_same_code():
    en, zh = blocks(TOURS["en"]), blocks(TOURS["zh"])
    assert len(en) == len(zh)
    for (line, en_code), (zh_line, zh_code) in zip(en, zh):
        # ast.dump ignores comments and layout: only prose and comments may be translated
        assert ast.dump(ast.parse(en_code)) == ast.dump(ast.parse(zh_code)), (
            f"docs/tour.md line {line} and docs/zh/tour.md line {zh_line} run different code")
        assert expectations(en_code) == expectations(zh_code), (
            f"docs/tour.md line {line} and docs/zh/tour.md line {zh_line} announce different output")


@pytest.mark.parametrize("code", ["print(1)", "print(1)  # prints: 2"])
def test_a_wrong_expectation_is_caught(code):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    printed = out.getvalue().splitlines()
    expected = expectations(code)
    assert len(printed) != len(expected) or not all(map(matches, expected, printed))
