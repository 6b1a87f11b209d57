"""One Chinese word per concept, across README.zh.md, docs/zh/*.md and the Chinese strings of
handformer (check's messages, the course, the figures' captions, the playground): the glossary in
docs/zh/names.md ("中文术语"), kept by searching for the words it replaced. Prose only: fenced code,
`inline code` and the English half of a message are not read."""

import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CJK = re.compile(r"[\u4e00-\u9fff]")

# (the word to use, a pattern for what it replaced); the glossary's table says the same in words
REPLACED = [
    ("batch", r"批次|每批 ?\d|拼成一批"),
    ("堆叠 (a stack of layers)", r"堆栈"),
    ("Block", r"decoder-only 块|(?<![\w`(（_-])block(?![\w`)）_-]| size)"),
    ("教学代码 (the lesson: nn/, models/)", r"课程代码|课程里的 ?[Bb]lock"),
    ("运行目录 (a run)", r"(?<![\w`/._-])run(?![\w`/._-])"),
    ("模型家族", r"模型族"),
    ("束宽", r"束大小|beam 为|只有一个束|一个束时"),
    ("填充, 填充掩码", r"(?<![\w`（(_-])padding(?![\w`）)_-])"),
    ("Post-Norm, Pre-Norm", r"(?<![\w`-])(post|pre)-norm(?![\w`-])"),
    ("True = 可以看, True = 屏蔽", r"(True|1) ?(=|表示) ?“?(保留|可见)|0 ?(=|表示) ?可见"),
    ("字典序", r"字节序(?!列)"),  # 字节序列 (a byte sequence) is not 字节序 (byte order)
    ("token", r"词元"),
    ("屏蔽", r"遮住"),
    ("标准差", r"离散程度"),
    ("算子, 内核", r"核函数"),
    ("输出层 (the output head, lm_head)", r"输出头"),
    ("混合专家, 对话模板", r"专家混合|聊天模板"),
    ("词嵌入, 可学习的位置编码", r"token 嵌入|可学习位置编码|学出来的位置"),
    ("位置 3, 层 0 (what counts from 0)",
     r"第 ?(0|\d+ ?个(位置|token|头|样本|序列))(?!\d)|第 \$?\{(l|layer|dim|pos|i|j|h|head|row)\}|第 [a-z] 个"),
]


def _prose(text: str) -> list[tuple[int, str]]:
    """A Markdown page's lines outside fenced code, their `inline code` removed; the glossary's
    section (it names the words it replaced) is left out."""
    out, fence = [], False
    text = re.sub(r"\n## 中文术语\n.*?(?=\n## |\Z)", "\n", text, flags=re.S)
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            out.append((number, re.sub(r"`[^`]*`", "", line)))
    return out


def _chinese_literals(text: str) -> list[tuple[int, str]]:
    """The string literals of a source file that hold Chinese, their `inline code` removed."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for s in re.findall(r'"((?:[^"\\]|\\.)*)"', line):
            if CJK.search(s):
                out.append((number, re.sub(r"`[^`]*`", "", s)))
    return out


def _notebook_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(i, line) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            for number, line in _prose("".join(c["source"]))]


@functools.cache
def chinese_text() -> list[tuple[str, str]]:
    """(where, text) for every line of Chinese prose the project shows."""
    pages = [ROOT / "README.zh.md", *sorted((ROOT / "docs" / "zh").glob("*.md"))]
    found = [(f"{p.relative_to(ROOT)}:{n}", t) for p in pages for n, t in _prose(p.read_text(encoding="utf-8"))]
    sources = [p for pattern in ("handformer/check/**/*.py", "handformer/course/*.py", "handformer/see/*.py",
                                 "handformer/serve/static/*.html", "scripts/course_notebooks.py")
               for p in sorted(ROOT.glob(pattern))]
    found += [(f"{p.relative_to(ROOT)}:{n}", t) for p in sources
              for n, t in _chinese_literals(p.read_text(encoding="utf-8"))]
    starters = sorted((ROOT / "handformer" / "course" / "starters").glob("*.py.in"))
    found += [(f"{p.relative_to(ROOT)}:{n}", line) for p in starters
              for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if line.endswith("#@zh")]
    notebooks = sorted((ROOT / "handformer" / "course" / "notebooks" / "zh").glob("*.ipynb"))
    found += [(f"{p.relative_to(ROOT)} cell {i}", t) for p in notebooks for i, t in _notebook_cells(p)]
    return found


def test_the_scan_reads_every_kind_of_chinese_text():
    places = {where.split(":")[0].split(" ")[0] for where, _ in chinese_text()}
    for expected in ("README.zh.md", "docs/zh/check.md", "handformer/check/core/report.py",
                     "handformer/see/captions.py", "handformer/serve/static/playground.html",
                     "handformer/course/starters/ch01_inputs.py.in", "scripts/course_notebooks.py",
                     "handformer/course/notebooks/zh/ch10_decoder_only.ipynb"):
        assert expected in places, expected


@pytest.mark.parametrize("word, replaced", REPLACED, ids=[w for w, _ in REPLACED])
def test_one_chinese_word_per_concept(word, replaced):
    hits = [f"{where}: {t.strip()[:100]}" for where, t in chinese_text() if re.search(replaced, t)]
    assert not hits, f"write {word} (docs/zh/names.md, 中文术语):\n" + "\n".join(hits[:20])
