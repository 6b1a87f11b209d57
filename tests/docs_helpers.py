"""Reading the Markdown docs for the doc tests: pages, sections, fenced blocks, command lines.

The conventions the tests hold every page to (a new page follows them too):
- English pages are docs/X.md, each with a Chinese twin docs/zh/X.md; README.md / README.zh.md too.
  Twins have the same headings (levels, in order) and the same code: ```python blocks equal as code
  (comments may be translated), other blocks the same commands (comments after `#` may differ).
- A ```python block runs as it is, in a fresh namespace and a temporary directory, unless its first
  line says what it needs or where it comes from:
    # needs: lm-run PATH        a language-model run at PATH (the test makes a tiny one)
    # needs: chat-run PATH      the same, with a chat template
    # needs: server ID [ID...]  `handformer serve` with those model ids, at http://127.0.0.1:8000
    # needs: llama.cpp ...      llama-cpp-python (a 4-minute source build, not in the default run):
                                the slow tests/test_gguf_llamacpp.py runs these blocks
    # from FILE                 an excerpt: every line is in FILE (a path in the repository)
  A `print(...)` line may show what it prints in a comment that ends with `# prints: TEXT` (or
  `-> TEXT`), as the tours do, on the line or on a comment line right after it; `...` in TEXT stands for any text (a model's words, a count that
  depends on the model). The test compares what that line printed (all its calls together, the
  last newline dropped) with TEXT.
- Every command line in a fenced block that runs `handformer ...` (also after `$ `, `time `,
  `VAR=value ` or `torchrun ... -m handformer`) is parsed by the CLI's own parser, and every
  `python benchmarks/X.py ...` line by that script's parser."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
HEADING = re.compile(r"^(#{1,6}) +(.+)$")


@dataclass
class Block:
    path: Path  # the page
    line: int  # line of the opening fence
    lang: str  # "python", "bash", "" ...
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page: the READMEs and docs/**/*.md."""
    return [ROOT / "README.md", ROOT / "README.zh.md", *sorted(DOCS.rglob("*.md"))]


def twins() -> list[tuple[Path, Path]]:
    """(English page, Chinese twin) for the READMEs and every docs/X.md that has a docs/zh/X.md."""
    pairs = [(ROOT / "README.md", ROOT / "README.zh.md")]
    for zh in sorted((DOCS / "zh").glob("*.md")):
        pairs.append((DOCS / zh.name, zh))
    return pairs


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def outside_fences(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced blocks."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def headings(path: Path) -> list[tuple[int, int, str]]:
    """(line, level, text) of every heading outside fenced blocks."""
    return [(n, len(m.group(1)), m.group(2)) for n, line in outside_fences(path) if (m := HEADING.match(line))]


def sections(path: Path) -> list[tuple[int, str, list[Block]]]:
    """(line, heading, blocks) per heading; the blocks before the first heading go with line 0."""
    marks = [(0, "(top)")] + [(n, text) for n, _, text in headings(path)]
    found = blocks(path)
    out = []
    for i, (n, text) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else 1 << 30
        out.append((n, text, [b for b in found if n < b.line < end]))
    return out


def logical_lines(code: str) -> list[tuple[int, str]]:
    """(offset of the first line, line) with backslash continuations joined."""
    out, pending, start = [], "", 0
    for i, line in enumerate(code.split("\n")):
        if not pending:
            start = i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def command_words(line: str, env: dict[str, str]) -> list[str] | None:
    """The shell words of a command line, comments dropped and $VARS of the block expanded;
    None for a line that is not a command (output, a blank line, a comment)."""
    line = line.strip()
    if line.startswith("$ "):
        line = line[2:]
    for name, value in env.items():
        line = line.replace(f"${name}", value)
    try:
        return shlex.split(line, comments=True) or None
    except ValueError:
        return None


def commands(block: Block) -> list[tuple[int, list[str]]]:
    """(line in the page, words) of each command line of a non-python block: where some lines start
    with `$ `, only those (the rest is output). `NAME="..."` lines set variables for the lines after."""
    env: dict[str, str] = {}
    out = []
    lines = logical_lines(block.code)
    prompted = any(line.startswith("$ ") for _, line in lines)  # then the other lines are output
    for offset, line in lines:
        if prompted and not line.startswith("$ "):
            continue
        words = command_words(line, env)
        if not words:
            continue
        if len(words) == 1 and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, _, value = words[0].partition("=")
            env[name] = value
            continue
        out.append((block.line + 1 + offset, words))
    return out


SHOWN = re.compile(r"#.*?(?:\bprints:|->)\s?(.*)$")  # the first marker in a print line's comment


def shown_output(code: str) -> dict[int, str]:
    """{line of the block (1-based): the TEXT its `# prints: TEXT` / `# -> TEXT` comment shows}, for
    print lines; a comment line of its own right after a print line shows that line's output."""
    out, last = {}, 0
    for n, line in enumerate(code.split("\n"), 1):
        text = line.lstrip()
        last = n if text.startswith("print(") else (last if text.startswith("#") and last == n - 1 else 0)
        if last and (m := SHOWN.search(line)):
            out[last] = m.group(1).rstrip()
    return out


def output_matches(shown: str, printed: str) -> bool:
    """Whether `printed` is what `shown` says, `...` in `shown` matching any text."""
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return re.fullmatch(pattern, printed, re.S) is not None


def handformer_args(words: list[str]) -> list[str] | None:
    """The arguments after `handformer` when the words run the handformer CLI, else None."""
    while words and (words[0] == "time" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
        words = words[1:]
    if words[:1] == ["handformer"]:
        return words[1:]
    if words[:1] == ["torchrun"] and "-m" in words:
        i = words.index("-m")
        if words[i + 1:i + 2] == ["handformer"]:
            return words[i + 2:]
    return None


def benchmark_args(words: list[str]) -> tuple[str, list[str]] | None:
    """(script path, its arguments) when the words run `python benchmarks/X.py`, else None."""
    if len(words) >= 2 and words[0] in ("python", "python3") and re.fullmatch(r"benchmarks/\w+\.py", words[1]):
        return words[1], words[2:]
    return None
