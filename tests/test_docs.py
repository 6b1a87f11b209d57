"""The docs, as a reader and as CI read them: the READMEs are short and in step, every English page
has a Chinese twin in step with it, no page tells history, every command line parses with the
parser that will read it, and every Python block runs. The conventions are in tests/docs_helpers.py;
each failure names the file, the line and the fix."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest
from docs_helpers import (
    DOCS,
    ROOT,
    Block,
    benchmark_args,
    blocks,
    commands,
    handformer_args,
    headings,
    output_matches,
    outside_fences,
    pages,
    sections,
    shown_output,
    twins,
)
from helpers import require_module

from handformer.cli import build_parser

# Pages that have no Chinese twin yet, and why (the list only shrinks; keep it empty).
NO_TWIN_YET: dict[str, str] = {}
MAX_README_LINES = 250
MAX_PROSE = 110


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_readmes_are_short_and_their_prose_lines_fit():
    for readme in (ROOT / "README.md", ROOT / "README.zh.md"):
        n = readme.read_text(encoding="utf-8").count("\n")
        assert n <= MAX_README_LINES, (
            f"{rel(readme)} has {n} lines, at most {MAX_README_LINES}: move detail to a page under docs/ "
            "(measured tables to docs/benchmarks.md) and link to it")
        long = [f"{rel(readme)}:{i}: {len(line)} characters" for i, line in outside_fences(readme)
                if len(line) > MAX_PROSE]
        assert not long, f"prose lines over {MAX_PROSE} characters; break them:\n" + "\n".join(long)


SHELL = {"bash", "python", "python3", "pip", "torchrun", "time", "cp", "ruff", "pytest", "git", "handformer"}


def is_command(words: list[str]) -> bool:
    """A shell command, not a line of output or of an illustration."""
    return words[0] in SHELL or bool(re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]))


def without_lang_zh(words: list[str]) -> list[str]:
    """The words without `--lang zh` and without `--dir FOLDER` (a page may name the course's folder
    in its own language: `handformer learn --dir 课程`)."""
    return [w for i, w in enumerate(words) if not (w in ("--lang", "--dir") or (i and words[i - 1] == "--lang"
                                                   and w == "zh") or (i and words[i - 1] == "--dir"))]


def block_shape(block: Block) -> object:
    """What must agree between twins: a python block's code (comments dropped), other blocks'
    commands (comments after # dropped; the Chinese page may add --lang zh and name another --dir)."""
    if block.lang == "python":
        return ("python", ast.dump(ast.parse(block.code)))
    return (block.lang, [without_lang_zh(words) for _, words in commands(block) if is_command(words)])


@pytest.mark.parametrize("en,zh", twins(), ids=lambda p: rel(p))
def test_twins_have_the_same_headings_and_code(en, zh):
    assert en.is_file(), f"{rel(zh)} has no English page {rel(en)}: write it, or move the page"
    en_h, zh_h = headings(en), headings(zh)
    assert [lvl for _, lvl, _ in en_h] == [lvl for _, lvl, _ in zh_h], (
        f"{rel(en)} and {rel(zh)} differ in their headings (levels in order):\n"
        + "\n".join(f"  {rel(en)}:{n} {'#' * lvl} {t}" for n, lvl, t in en_h) + "\n"
        + "\n".join(f"  {rel(zh)}:{n} {'#' * lvl} {t}" for n, lvl, t in zh_h)
        + "\ngive both pages the same sections in the same order")
    for (en_line, en_title, en_blocks), (zh_line, zh_title, zh_blocks) in zip(sections(en), sections(zh)):
        where = f"{rel(en)}:{en_line} ({en_title}) and {rel(zh)}:{zh_line} ({zh_title})"
        assert len(en_blocks) == len(zh_blocks), (
            f"{where}: {len(en_blocks)} and {len(zh_blocks)} code blocks; each section needs the same blocks")
        for a, b in zip(en_blocks, zh_blocks):
            assert block_shape(a) == block_shape(b), (
                f"{a.where} and {b.where} differ: the same code (python) or the same commands (other "
                "blocks) in both languages; only comments and prose are translated")


def test_every_english_page_has_a_chinese_twin():
    missing = [rel(p) for p in sorted(DOCS.rglob("*.md"))
               if not p.is_relative_to(DOCS / "zh") and not p.is_relative_to(DOCS / "figures") and not (DOCS / "zh" / p.relative_to(DOCS)).is_file()
               and str(p.relative_to(DOCS)) not in NO_TWIN_YET]
    assert not missing, ("pages without a Chinese twin under docs/zh/ (same name, same headings and code): "
                         + ", ".join(missing))


def nav_pages(nav) -> list[tuple[str, str]]:
    out = []
    for item in nav:
        for title, value in item.items():
            out.extend(nav_pages(value) if isinstance(value, list) else [(title, value)])
    return out


def test_every_page_is_in_the_site_nav_with_a_chinese_title():
    yaml = require_module("yaml", "pip install -e '.[dev]' (PyYAML comes with mkdocs)")
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    nav = nav_pages(config["nav"])
    listed = {page for _, page in nav}
    i18n = next(p["i18n"] for p in config["plugins"] if isinstance(p, dict) and "i18n" in p)
    zh = next(lang for lang in i18n["languages"] if lang["locale"] == "zh")
    for page in sorted(DOCS.glob("*.md")):
        assert page.name in listed, (
            f"{rel(page)} is not in mkdocs.yml's nav: add `- Title: {page.name}` under nav, and the "
            "title's Chinese under plugins.i18n.languages (zh) nav_translations")
    for title, page in nav:
        assert title in zh["nav_translations"], (
            f"mkdocs.yml: the nav title {title!r} ({page}) has no Chinese in nav_translations")


HISTORY = [
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"), "a commit hash"),
    (re.compile(r"\bissue\s*#?\d+|\b(?:the|an|this|that|a later) issue\b", re.I), "an issue"),
    (re.compile(r"flock\s+/tmp|/tmp/[\w.-]*\.lock|\bCPU lock\b|CPU 锁"), "the machine's lock file"),
    (re.compile(r"\b(?:this|another|an earlier|the previous|that|earlier) session\b|\bbefore this "
                r"(?:work|change|session)\b|\bthe code before\b|\bearlier (?:run|measurement|recipe)s?\b"
                r"|\bused to be\b|\bre-?measured\b|\bis met now\b|\bat the time\b", re.I), "history"),
    (re.compile(r"本次工作|此前|会话|当时|之前的表|曾经|重测"), "history"),
]


def history_files() -> list[Path]:
    return [*pages(), *sorted((ROOT / "benchmarks").glob("*.py"))]


def test_no_page_tells_history():
    found = []
    for path in history_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            for pattern, what in HISTORY:
                if m := pattern.search(line):
                    found.append(f"{rel(path)}:{n}: {what} ({m.group(0)!r}): {line.strip()[:100]}")
    assert not found, ("the docs state the current state only: no commit hashes, issue numbers, lock files "
                       "or 'earlier / this session' history; rewrite these lines:\n" + "\n".join(found))


def all_command_lines() -> list[tuple[str, list[str]]]:
    out = []
    for page in pages():
        for block in blocks(page):
            if block.lang != "python":
                out.extend((f"{rel(page)}:{n}", words) for n, words in commands(block))
    return out


def test_every_handformer_command_line_parses():
    parser = build_parser()
    bad, seen = [], 0
    for where, words in all_command_lines():
        args = handformer_args(words)
        if args is None:
            continue
        seen += 1
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(args)
        except SystemExit as exc:
            if exc.code:
                bad.append(f"{where}: handformer {' '.join(args)}\n    {err.getvalue().strip().splitlines()[-1]}")
    assert seen > 40, "the docs lost their handformer commands"
    assert not bad, "command lines the CLI refuses; fix the page (or the CLI):\n" + "\n".join(bad)


class Parsed(Exception):
    pass


def parse_benchmark(script: str, args: list[str]) -> str | None:
    """None when `script`'s own parser takes `args`, else argparse's message. The script's main()
    runs until its parser parses, then stops."""
    path = ROOT / script
    if not path.is_file():
        return f"there is no {script}"
    spec = importlib.util.spec_from_file_location(f"docs_benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    original = argparse.ArgumentParser.parse_args
    err = io.StringIO()

    def parse_then_stop(self, *_a, **_k):
        original(self, args)
        raise Parsed

    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
        argparse.ArgumentParser.parse_args = parse_then_stop
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            module.main()
    except Parsed:
        return None
    except SystemExit as exc:
        return None if not exc.code else (err.getvalue().strip().splitlines() or ["exit 2"])[-1]
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.path[:] = saved
    return f"{script}'s main() returned without parsing its arguments"


def test_every_benchmark_command_line_parses():
    bad, seen = [], 0
    for where, words in all_command_lines():
        found = benchmark_args(words)
        if found is None:
            continue
        seen += 1
        if (message := parse_benchmark(*found)) is not None:
            bad.append(f"{where}: python {found[0]} {' '.join(found[1])}\n    {message}")
    assert seen > 20, "the docs lost their benchmark commands"
    assert not bad, "benchmark command lines their scripts refuse; fix the page:\n" + "\n".join(bad)


def python_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)
            if b.lang == "python" and page.name != "tour.md"]  # tests/test_tour.py runs the tours


def first_comment(block: Block) -> str:
    first = block.code.split("\n", 1)[0].strip()
    return first[1:].strip() if first.startswith("#") else ""


def test_every_excerpt_is_in_the_file_it_names():
    excerpts = [b for b in python_blocks() if first_comment(b).startswith("from ")]
    assert excerpts, "no `# from FILE` excerpts found (docs/check.md has them)"
    squash = re.compile(r"\s+")
    for block in excerpts:
        source = ROOT / first_comment(block).removeprefix("from ").strip()
        assert source.is_file(), f"{block.where}: the excerpt names {rel(source)}, which does not exist"
        text = squash.sub("", source.read_text(encoding="utf-8"))
        for i, line in enumerate(block.code.split("\n")[1:], block.line + 2):
            code = line.split("  #")[0].strip()
            assert squash.sub("", code) in text, (
                f"{rel(block.path)}:{i}: `{code}` is not in {rel(source)}; copy the line as it is there")


def runnable_blocks() -> list[Block]:
    return [b for b in python_blocks() if not first_comment(b).startswith("from ")]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """servers(names): a server of those tiny models, started once for the module (18 blocks talk to
    three sets of models) and stopped after its last block."""
    from serve_helpers import Server, make_lm_run

    from handformer.serve.app import create_app
    from handformer.serve.registry import load_served_models

    started = {}

    def server(names: tuple[str, ...]) -> Server:
        if names not in started:
            root = tmp_path_factory.mktemp("served")
            specs = [f"{name}={make_lm_run(root / name, max_positions=1024)}" for name in names]
            started[names] = Server(create_app(load_served_models(specs)))
        return started[names]

    yield server
    for running in started.values():
        running.stop()


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.where)
def test_every_python_block_runs(block, tmp_path, monkeypatch, servers):
    from serve_helpers import make_lm_run, seed_by_default

    monkeypatch.chdir(tmp_path)
    code, needs = block.code, first_comment(block)
    if needs.startswith("needs:"):
        kind, *names = re.split(r"[(（]", needs.removeprefix("needs:"))[0].split()
        if kind == "llama.cpp":  # run by the slow llama.cpp test, which this checks
            slow = (ROOT / "tests" / "test_gguf_llamacpp.py").read_text(encoding="utf-8")
            assert "needs: llama.cpp" in slow and rel(block.path) in slow, (
                f"{block.where}: tests/test_gguf_llamacpp.py must run this block ({rel(block.path)})")
            return
        assert kind in ("lm-run", "chat-run", "server") and names, (
            f"{block.where}: `# needs: {needs}`: say `lm-run PATH`, `chat-run PATH`, `server ID...` or "
            "`llama.cpp`")
        if kind in ("lm-run", "chat-run"):
            make_lm_run(tmp_path / names[0], chat=kind == "chat-run", max_positions=256)
        else:
            seed_by_default(monkeypatch)
            server = servers(tuple(names))
            assert "http://127.0.0.1:8000" in code, f"{block.where}: a server block talks to 127.0.0.1:8000"
            code = code.replace("http://127.0.0.1:8000", server.url)
    printed: dict[int, str] = {}  # line of the block -> what its print calls printed there

    def record(*args, sep=" ", end="\n", **_) -> None:  # the block's print
        line = sys._getframe(1).f_lineno
        printed[line] = printed.get(line, "") + sep.join(map(str, args)) + end

    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, block.where, "exec"), {"__name__": "docs", "print": record})
    # every print of the block ran and showed the reader something (a reply, generated text, an
    # embedding's size; a streamed reply's pieces together): an empty one means the call behind it
    # returned nothing
    lines = {i for i, text in enumerate(code.split("\n"), 1) if text.lstrip().startswith("print(")}
    assert lines <= printed.keys() and all(text.strip() for text in printed.values()), (block.where, printed)
    assert_prints_what_it_shows(block, code, printed)


def assert_prints_what_it_shows(block: Block, code: str, printed: dict[int, str]) -> None:
    """Each print line that shows its output (`# prints: TEXT`, `# -> TEXT`) printed that."""
    said = {n: printed[n].removesuffix("\n") for n in shown_output(code)}
    wrong = [f"{rel(block.path)}:{block.line + n}: the page shows {shown!r}, the line printed {said[n]!r}"
             for n, shown in shown_output(code).items() if not output_matches(shown, said[n])]
    assert not wrong, ("a block prints something other than what its page shows; fix the page (both "
                       "languages):\n" + "\n".join(wrong))


def report_block(readme: Path) -> tuple[list[str], str]:
    """The `$ handformer check ...` example of a README: (its arguments, the report it shows)."""
    for block in blocks(readme):
        first, _, rest = block.code.partition("\n")
        if first.startswith("$ handformer check "):
            return first.removeprefix("$ handformer ").split(), rest
    raise AssertionError(f"{rel(readme)} shows no `$ handformer check` report")


def test_the_readmes_check_reports_are_what_check_prints(monkeypatch):
    """`handformer check` as the README runs it, from the project root (in this process: the learner's
    code still runs in check's own child process). The grader reads no language: the two READMEs
    check the same file, graded in a child once; the Chinese report prints that result in Chinese."""
    from handformer.check.core import sandbox
    from handformer.cli import main

    graded, check_in_child = {}, sandbox.check_in_child

    def graded_once(*args, **kwargs):
        key = repr((args, kwargs))
        if key not in graded:
            graded[key] = check_in_child(*args, **kwargs)
        return graded[key]

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sandbox, "check_in_child", graded_once)
    for readme in (ROOT / "README.md", ROOT / "README.zh.md"):
        args, shown = report_block(readme)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
        assert code == 1, f"handformer check exited {code}: {err.getvalue()}"
        assert out.getvalue() == shown, (f"{rel(readme)}: the check report differs from what `handformer check` "
                                         f"prints now; paste the new one:\n{out.getvalue()}")


def test_the_checks_catch_what_they_should(tmp_path):
    assert "unrecognized arguments: --nope" in parse_benchmark("benchmarks/decode_limit.py", ["--nope"])
    assert parse_benchmark("benchmarks/decode_limit.py", ["--rounds", "3"]) is None
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        build_parser().parse_args(handformer_args(["time", "handformer", "generate", "RUN", "--top-k", "N"]))
    page = tmp_path / "page.md"
    page.write_text("```bash\nSET=\"--steps 3\"\nhandformer train --config x \\\n    $SET  # comment\n```\n")
    assert [w for _, w in commands(blocks(page)[0])] == [["handformer", "train", "--config", "x", "--steps", "3"]]
    hits = [what for line in ("measured at commit 2e69f33", "issue 16's target", "flock /tmp/x.lock python",
                              "before this work", "在本次工作之前")
            for pattern, what in HISTORY if pattern.search(line)]
    assert hits == ["a commit hash", "an issue", "the machine's lock file", "history", "history"]
    assert not any(p.search("an earlier module; 1e-5; sha256; 0.85 of the bound") for p, _ in HISTORY)
    assert shown_output("print(1)  # prints: 1\nx = 2  # (B, T) -> (2, 5)\nprint(2)\n# -> a ... b") == {
        1: "1", 3: "a ... b"}
    assert output_matches("2 ... ...", "2 32 31") and not output_matches("2 ... ...", "3 32 31")
    one, two = tmp_path / "a.md", tmp_path / "b.md"
    one.write_text("```python\nx = 1  # one\n```\n```bash\nhandformer demo  # a\n```\n")
    two.write_text("```python\nx = 1  # 一\n```\n```bash\nhandformer demo --lang zh  # 甲\n```\n")
    assert [block_shape(b) for b in blocks(one)] == [block_shape(b) for b in blocks(two)]
    two.write_text("```python\nx = 2\n```\n")
    assert block_shape(blocks(one)[0]) != block_shape(blocks(two)[0])


def test_ci_runs_the_test_command_the_readmes_show():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    for readme in (ROOT / "README.md", ROOT / "README.zh.md"):
        shown = [words for block in blocks(readme) if block.lang == "bash" for _, words in commands(block)]
        assert ["python3", "-m", "pytest", "-q"] in shown, (
            f"{rel(readme)} must show the test command CI runs: python3 -m pytest -q")
    assert ci[-1] == "python3 -m pytest -q", ".ci/run must end by running the README's test command"
