"""docs/tour.md runs: every ```python block is executed in order in one namespace, and what each
block prints must match its `# prints: TEXT` (or `# -> TEXT`) comments, line by line, in order.
`...` in TEXT matches anything. The convention is documented at the top of the tour."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

TOUR = Path(__file__).resolve().parent.parent / "docs" / "tour.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
EXPECT = re.compile(r"#.*?(?:\bprints:|->)\s?(.*)$")  # the first marker in a comment


def blocks() -> list[tuple[int, str]]:
    """(line number, code) of every python block of the tour."""
    text = TOUR.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def expectations(code: str) -> list[str]:
    return [m.group(1).rstrip() for line in code.splitlines() if (m := EXPECT.search(line))]


def matches(expected: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


def test_the_convention_itself():
    assert expectations("print(1)  # prints: 1\nx = 2\n# -> a ... b") == ["1", "a ... b"]
    assert expectations("f(x)  # the shape (B, T) -> (2, 5)\ny = 1  # a comment") == ["(2, 5)"]
    assert matches("a ... b", "a 0.123 b") and not matches("a ... b", "a 1 c")
    assert matches("(2, 8)", "(2, 8)") and not matches("(2, 8)", "(2, 8, 1)")


def test_every_snippet_prints_what_the_tour_says(tmp_path, monkeypatch):
    found = blocks()
    assert len(found) >= 10, "the tour lost its snippets"
    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace: dict = {"__name__": "tour"}
    try:
        for line, code in found:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{TOUR.name}:{line}", "exec"), namespace)
            printed = [p.rstrip() for p in out.getvalue().splitlines()]
            expected = expectations(code)
            assert len(printed) == len(expected), (
                f"block at docs/tour.md line {line} printed {len(printed)} lines, the tour announces "
                f"{len(expected)}:\nprinted:  {printed}\nexpected: {expected}")
            for want, got in zip(expected, printed):
                assert matches(want, got), f"block at docs/tour.md line {line}: expected {want!r}, got {got!r}"
    finally:
        torch.set_num_threads(threads)


def test_the_tour_shows_the_figures_it_names():
    text = TOUR.read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images, "the tour embeds no figure"
    for image in images:
        assert (TOUR.parent / image).is_file(), image


@pytest.mark.parametrize("code", ["print(1)", "print(1)  # prints: 2"])
def test_a_wrong_expectation_is_caught(code):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    printed = out.getvalue().splitlines()
    expected = expectations(code)
    assert len(printed) != len(expected) or not all(map(matches, expected, printed))
