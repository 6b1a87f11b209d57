"""The course (`handformer learn`): the folder it writes and never overwrites, the starter files
that `handformer check` reports as not implemented yet, the solutions (tests/fixtures/course/) that
pass every chapter, and the notebooks: stripped, the same code in English and Chinese, and run top
to bottom in smoke mode on the solutions."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import runpy
import shutil
import sys
import time
from pathlib import Path

import pytest
from helpers import missing, require_module

from handformer.check.core.engine import check_file
from handformer.check.core.result import TODO
from handformer.cli import main
from handformer.course.chapters import CHAPTERS, find_chapter
from handformer.course.folder import learn, notebook_text, reset, starter_text
from handformer.data.lookup import find_folder

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = Path(__file__).parent / "fixtures" / "course"
STORIES = find_folder("stories260K")  # chapter 17's notebook tells its story when the model is here


LOCALE_VARS = ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE")


@pytest.fixture(autouse=True)
def english_locale(monkeypatch):
    """The tests that give no --lang expect English, whatever the machine's locale."""
    for var in LOCALE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "C.UTF-8")


def check_chapter(path: Path):
    """check_file in this process, the chapter's neighbours imported from its own folder."""
    for ch in CHAPTERS:
        sys.modules.pop(ch.stem, None)
    folder = str(path.parent.resolve())
    while folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    try:
        return check_file(str(path))
    finally:
        sys.path.remove(folder)
        for ch in CHAPTERS:
            sys.modules.pop(ch.stem, None)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["learn", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_learn_writes_what_is_missing_and_never_overwrites(tmp_path, capsys):
    folder = tmp_path / "course"
    code, out, _ = run_cli(capsys, "--dir", str(folder))
    assert code == 0 and out.count("written") == 2 * len(CHAPTERS)
    assert "the chapters and the tutorials they follow:" in out and "手写Transformer 03 §5-7" in out
    names = {p.name for p in folder.iterdir()}
    assert names == {"course.json"} | {c.file for c in CHAPTERS} | {c.notebook for c in CHAPTERS}
    mine = folder / "ch03_multi_head.py"
    mine.write_text("# my attention\n")
    (folder / "ch02_attention.py").unlink()
    code, out, _ = run_cli(capsys, "--dir", str(folder))
    assert code == 0 and "kept, changed by you" in out and out.count("written") == 1
    assert mine.read_text() == "# my attention\n"  # never overwritten
    assert (folder / "ch02_attention.py").read_text() == starter_text(find_chapter("2"), "en")
    code, out, _ = run_cli(capsys, "--dir", str(folder), "--reset", "3")
    assert code == 0 and "ch03_multi_head.py.bak" in out and f"`jupyter lab {folder / 'ch03_multi_head.ipynb'}`" in out
    assert (folder / "ch03_multi_head.py.bak").read_text() == "# my attention\n"
    assert mine.read_text() == starter_text(find_chapter("3"), "en")
    mine.write_text("# again\n")
    reset(folder, "multi_head")
    assert (folder / "ch03_multi_head.py.2.bak").read_text() == "# again\n"  # the first .bak is kept


def test_one_chapter_in_chinese(tmp_path):
    folder = tmp_path / "zh"
    done = learn(folder, "zh", "ch07_loss_schedule")
    assert [name for name, _ in done] == ["ch07_loss_schedule.py", "ch07_loss_schedule.ipynb"]
    done = learn(folder, None, "5")  # and the chapters it builds on
    assert [name for name, _ in done][::2] == ["ch02_attention.py", "ch03_multi_head.py", "ch04_ffn_norm.py",
                                               "ch05_layers.py"]
    text = (folder / "ch07_loss_schedule.py").read_text("utf-8")
    assert "损失函数" in text and "#@" not in text and "Fill in" not in text
    assert "学习率" in (folder / "ch07_loss_schedule.ipynb").read_text("utf-8")
    assert json.loads((folder / "course.json").read_text())["lang"] == "zh"


def test_learn_follows_the_system_language(tmp_path, capsys, monkeypatch):
    """Without --lang a new course is in the system's language, by check's rule (LC_ALL, then
    LC_MESSAGES, then LANG); --lang en still forces English."""
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    code, out, _ = run_cli(capsys, "1", "--dir", str(tmp_path / "课程"))
    assert code == 0 and "写入" in out and "下一步" in out
    assert json.loads((tmp_path / "课程" / "course.json").read_text())["lang"] == "zh"
    assert "位置编码" in (tmp_path / "课程" / "ch01_inputs.py").read_text("utf-8")
    code, out, _ = run_cli(capsys, "1", "--dir", str(tmp_path / "en"), "--lang", "en")
    assert code == 0 and "written" in out and json.loads((tmp_path / "en" / "course.json").read_text())["lang"] == "en"
    monkeypatch.setenv("LC_MESSAGES", "en_US.UTF-8")  # LC_MESSAGES before LANG, as check reads them
    learn(tmp_path / "messages", None, "1")
    assert json.loads((tmp_path / "messages" / "course.json").read_text())["lang"] == "en"
    monkeypatch.setenv("LC_ALL", "zh_TW.UTF-8")
    learn(tmp_path / "all", None, "1")
    assert json.loads((tmp_path / "all" / "course.json").read_text())["lang"] == "zh"


@pytest.mark.parametrize("args, message", [
    (["--lang", "fr"], "--lang fr: the course is written in en (English) and zh (Chinese)"),
    (["99"], "unknown chapter '99'; the chapters are: 1 (ch01_inputs)"),
    (["--reset", "attention_maps"], "unknown chapter 'attention_maps'"),
    (["--status", "--dir", "{tmp}/other"], "is not a course folder (it has no course.json)"),
    (["--dir", "{tmp}/other"], "is not a course folder (it has no course.json and is not empty)"),
    (["--dir", "{tmp}/course", "--lang", "zh"], "is a course in English (--lang en); for one in Chinese"),
    (["--status", "--dir", "{tmp}/nowhere"], "no such folder"),
    (["--status", "--dir", "{tmp}/broken"], "course.json: not a course manifest"),
    (["3", "--status", "--dir", "{tmp}/course"], "chapter 3 with --status: --status takes no chapter"),
    (["--dir", "/proc/no-such-folder/course"], "/proc/no-such-folder: No such file or directory; give a "
                                               "path whose folders exist"),  # a folder nobody can make
])
def test_bad_input_is_one_clear_error(tmp_path, capsys, args, message):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    learn(tmp_path / "course", "en", "1")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "course.json").write_bytes(b'{"course": "handf')  # cut short
    capsys.readouterr()
    code, out, err = run_cli(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def code_of(source: str) -> str:
    """The code of a file without its docstrings (comments are gone after parsing)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def test_starters_are_not_implemented_yet_in_both_languages(tmp_path):
    """Every starter's components are found as the chapter's kinds and reported as not implemented
    yet, never as an error; the Chinese starters are the same code."""
    learn(tmp_path, "en")
    for ch in CHAPTERS:
        en, zh = starter_text(ch, "en"), starter_text(ch, "zh")
        assert code_of(en) == code_of(zh), ch.stem
        assert "TODO" in en and "TODO" in zh and any("\u4e00" <= c <= "\u9fff" for c in zh)
        result = check_chapter(tmp_path / ch.file)
        assert result.error is None, (ch.stem, result.error)
        assert {c.kind for c in result.components} == set(ch.kinds), ch.stem
        for c in result.components:
            assert c.status == TODO and c.error.kind == "not_implemented", (ch.stem, c.name, c.error)
            assert c.error.message.startswith("not implemented yet")


def test_the_report_says_not_implemented_yet(tmp_path, capsys):
    learn(tmp_path, "en", "3")
    from handformer.check.core.report import format_report

    result = check_chapter(tmp_path / "ch03_multi_head.py")
    assert "MultiHeadAttention (multi-head attention): NOT IMPLEMENTED YET" in format_report(result, "en")
    assert "1 not implemented yet" in format_report(result, "en")
    assert "MultiHeadAttention（多头注意力）：尚未实现" in format_report(result, "zh")


def test_status_shows_which_chapters_pass(tmp_path, capsys, monkeypatch):
    from handformer.check.core import sandbox

    graded, check_in_child = {}, sandbox.check_in_child

    def graded_once(path: str, **kwargs):  # the grader reads no language: the Chinese status reuses it
        key = Path(path).read_text("utf-8")
        if key not in graded:
            graded[key] = check_in_child(path, **kwargs)
        return graded[key]

    monkeypatch.setattr(sandbox, "check_in_child", graded_once)
    learn(tmp_path, "en")
    shutil.copy(SOLUTIONS / "ch01_inputs.py", tmp_path)
    half = starter_text(find_chapter("7"), "en").replace(
        '    raise NotImplementedError("masked_cross_entropy")',
        "    return torch.nn.functional.cross_entropy(logits, targets)")  # counts the padding
    (tmp_path / "ch07_loss_schedule.py").write_text(half)
    code, out, _ = run_cli(capsys, "--status", "--dir", str(tmp_path))
    lines = {line.split()[1]: line for line in out.splitlines() if ".py " in line}
    assert code == 0 and len(lines) == len(CHAPTERS)
    assert "pass" in lines["ch01_inputs.py"] and "not started" in lines["ch02_attention.py"]
    assert "fail" in lines["ch07_loss_schedule.py"] and "masked_cross_entropy" in lines["ch07_loss_schedule.py"]
    assert out.strip().endswith(f"1 of {len(CHAPTERS)} chapters pass")
    assert "(1 components)" in lines["ch01_inputs.py"]
    zh = tmp_path / "zh"
    learn(zh, "zh")
    shutil.copy(SOLUTIONS / "ch01_inputs.py", zh)
    code, out, _ = run_cli(capsys, "--status", "--dir", str(zh))
    assert code == 0 and "（1 个组件）" in out and "components" not in out
    assert len(graded) == 2  # chapter 1's solution and the half-done chapter 7, each in a child once


def test_notebooks_are_stripped_and_the_same_code_in_both_languages():
    builder = runpy.run_path(str(ROOT / "scripts" / "course_notebooks.py"))
    for ch in CHAPTERS:
        en, zh = (json.loads(notebook_text(ch, lang)) for lang in ("en", "zh"))
        code = [[c["source"] for c in nb["cells"] if c["cell_type"] == "code"] for nb in (en, zh)]
        assert code[0] == code[1] and len(code[0]) == 2, ch.stem
        for nb in (en, zh):
            for cell in nb["cells"]:
                assert cell.get("outputs", []) == [] and cell.get("execution_count") is None, ch.stem
        assert f'lesson.check("{ch.stem}")' in "".join(code[0][0])
        assert [c["source"] for c in en["cells"]][0] != [c["source"] for c in zh["cells"]][0]
        for lang, nb in (("en", en), ("zh", zh)):  # the committed notebooks are the builder's
            assert ["".join(c["source"]) for c in nb["cells"]] == [text for _, text in builder["cells"](ch.stem, lang)]
        assert ch.tutorial[1] in "".join(zh["cells"][0]["source"]), ch.stem
    for doc, lang in (("course.md", 0), ("zh/course.md", 1)):  # the docs' table of chapters and tutorials
        text = (ROOT / "docs" / doc).read_text("utf-8")
        for ch in CHAPTERS:
            title = (ch.en, ch.zh)[lang]
            assert f"| {ch.number} {title} | {ch.tutorial[lang]} | " in text, (doc, ch.stem)


def kernel_or_missing() -> str:
    require_module("nbclient", "pip install nbclient nbformat ipykernel (scripts/install.sh does)")
    require_module("ipykernel", "pip install ipykernel (scripts/install.sh does)")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        missing("no Jupyter kernel python3 is registered; run python3 -m ipykernel install --user")
    return "python3"


def run_notebooks(folder: Path, names: list[str], smoke: bool) -> dict[str, list[dict]]:
    """Run the notebooks one after another in one kernel (its namespace reset before each), in the
    course folder; returns each notebook's code cells with their outputs."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    env = {**os.environ, "HANDFORMER_COURSE_SMOKE": "1" if smoke else "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    km = KernelManager(kernel_name=kernel_or_missing())
    km.start_kernel(cwd=str(folder), env=env)
    out = {}
    try:
        for name in names:
            nb = nbformat.read(folder / name, as_version=4)
            nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))
            NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(folder)}}).execute()
            out[name] = [c for c in nb.cells[1:] if c.cell_type == "code"]
    finally:
        km.shutdown_kernel(now=True)
    return out


def texts(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.outputs if o.output_type == "display_data")


def course_with_solutions(folder: Path, lang: str) -> list[str]:
    learn(folder, lang)
    for ch in CHAPTERS:
        shutil.copy(SOLUTIONS / ch.file, folder)
    return [ch.notebook for ch in CHAPTERS]


def test_the_notebooks_run_in_a_jupyter_kernel(tmp_path):
    """Two Chinese notebooks run by nbclient in one Jupyter kernel, as a learner opens them: a solved
    chapter grades its file (it passes) and shows its plot inline; a starter says what to do. (Every
    notebook's cells run in process in the two tests below: a kernel adds 15 s and proves no more.)"""
    learn(tmp_path, "zh")  # the Chinese starters; chapter 1 solved, chapter 4 left to do
    shutil.copy(SOLUTIONS / "ch01_inputs.py", tmp_path)
    zh = run_notebooks(tmp_path, ["ch01_inputs.ipynb", "ch04_ffn_norm.ipynb"], smoke=True)
    assert "共 1 个组件：1 个通过" in texts(zh["ch01_inputs.ipynb"][0]) and images(zh["ch01_inputs.ipynb"][1])
    starter = zh["ch04_ffn_norm.ipynb"]
    assert "尚未实现" in texts(starter[0]) and "把 TODO 写完" in texts(starter[0]) and not images(starter[1])


@pytest.mark.slow
def test_the_full_course_trains_and_translates(tmp_path):
    """Chapters 8 and 9 at full size: 3000 steps on the dates task, 200 held-out dates translated."""
    names = course_with_solutions(tmp_path, "en")
    start = time.perf_counter()
    cells = run_notebooks(tmp_path, [n for n in names if n.startswith(("ch08", "ch09"))], smoke=False)
    result = texts(cells["ch09_decoding.ipynb"][1]).strip().splitlines()[-1]
    print(f"\nfull size, chapters 8 and 9: {time.perf_counter() - start:.0f} s; {result}")
    words = result.replace(",", "").split()  # greedy: N of 200 right beam: M of 200 right
    # measured: 97 of 200 greedy after 1500 steps; 67 of the first 100 after 3000
    assert words[3] == words[8] == "200" and int(words[1]) >= 80


def test_every_text_the_cells_print_or_label_is_in_the_chinese_table():
    """Every `tr("...")` of the notebooks' code has its Chinese in handformer/course/texts.py, and the
    table holds nothing the notebooks do not use."""
    from handformer.course.texts import ZH

    used = set()
    for ch in CHAPTERS:
        code = "\n".join("".join(c["source"]) for c in json.loads(notebook_text(ch, "en"))["cells"]
                          if c["cell_type"] == "code")
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tr":
                assert isinstance(node.args[0], ast.Constant), (ch.stem, ast.unparse(node))
                used.add(node.args[0].value)
    assert used - ZH.keys() == set() and ZH.keys() - used == set()


CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
SAME_IN_BOTH = {"x + FFN(x)", "LayerNorm(x + FFN(x))"}  # formulas, not words


def run_in_process(folder: Path, notebook: str) -> tuple[list[str], list[str]]:
    """A notebook's code cells run in this process, in its folder: what each prints, and the titles,
    axis labels and legend entries of every figure they show."""
    import matplotlib.pyplot as plt

    labels: list[str] = []

    def show(*_, **__) -> None:
        for num in plt.get_fignums():
            for ax in plt.figure(num).axes:
                legend = ax.get_legend()
                labels.extend([ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
                              + [t.get_text() for t in (legend.get_texts() if legend else [])])
            plt.close(num)

    nb = json.loads((folder / notebook).read_text("utf-8"))
    printed, namespace = [], {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "show", show)
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    exec("".join(cell["source"]), namespace)
                printed.append(out.getvalue())
    return printed, [label for label in labels if label]


# (chapter file, its text, the text of every chapter file beside it) -> the grader's result. The
# grader reads no language: the English and the Chinese course, each on the same solutions, are
# graded once (the Chinese run prints the English run's results in Chinese).
GRADED: dict[tuple[str, str, tuple[str, ...]], object] = {}


def run_course(folder: Path, monkeypatch) -> tuple[dict, dict, dict]:
    """Every notebook of the course in `folder` (the solutions in it) run in process in smoke mode, in
    chapter order: {notebook: (what each code cell printed, the labels of its figures)}, {chapter
    file: the grader's result} and {notebook: matplotlib's font family after it}."""
    import dataclasses

    import matplotlib

    from handformer.check.core import engine as runners

    graded = {}
    course = tuple((folder / ch.file).read_text("utf-8") for ch in CHAPTERS)

    def check_file(path: str, *args, **kwargs):
        key = (Path(path).name, Path(path).read_text("utf-8"), course)
        if args or kwargs or key not in GRADED:
            GRADED[key] = check(path, *args, **kwargs)
        graded[Path(path).name] = result = dataclasses.replace(GRADED[key], path=path)
        return result

    check = runners.check_file
    monkeypatch.setattr(runners, "check_file", check_file)  # lesson.check imports it when called
    monkeypatch.chdir(folder)
    monkeypatch.setenv("HANDFORMER_COURSE_SMOKE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))  # lesson.fresh puts the course folder on it
    cells, fonts = {}, {}
    try:
        with matplotlib.rc_context({"backend": "Agg"}):
            for ch in CHAPTERS:
                cells[ch.notebook] = run_in_process(folder, ch.notebook)
                fonts[ch.notebook] = list(matplotlib.rcParams["font.family"])
        return cells, graded, fonts
    finally:
        for ch in CHAPTERS:
            sys.modules.pop(ch.stem, None)


def test_every_notebook_runs_top_to_bottom_in_smoke_mode(tmp_path, monkeypatch):
    """The English notebooks on the solutions: each grades its file (it passes, every kind of the
    chapter found) and plots or prints what the chapter is about; chapter 8 trains the learner's
    model on the dates task for 50 steps and chapter 9 translates 5 held-out dates with it."""
    course_with_solutions(tmp_path, "en")
    start = time.perf_counter()
    cells, graded, _ = run_course(tmp_path, monkeypatch)
    seconds = time.perf_counter() - start
    for ch in CHAPTERS:
        (report, shown), labels = cells[ch.notebook]
        result = graded[ch.file]
        assert result.ok, (ch.stem, [(c.name, c.status, c.findings, c.error) for c in result.components])
        assert {c.kind for c in result.components} == set(ch.kinds), ch.stem
        assert "0 failed, 0 raised" in report and "not implemented" not in report, ch.stem
        assert labels or ch.stem == "ch09_decoding" or ch.stem == "ch17_stories" and not STORIES, ch.stem
    assert "50 steps, last loss" in cells["ch08_training.ipynb"][0][1]
    decoded = cells["ch09_decoding.ipynb"][0][1]
    assert "greedy: " in decoded and decoded.strip().endswith("of 5 right")
    assert (tmp_path / "dates_model.pt").exists()
    assert "round trip: True" in cells["ch12_bpe.ipynb"][0][1]
    trained = cells["ch16_train_gpt.ipynb"][0][1]
    assert "your Llama: 20 steps" in trained and "handformer's Llama: 20 steps" in trained
    assert "sampled with your generate_with_cache: " in trained
    told = cells["ch17_stories.ipynb"][0][1]
    if STORIES:  # 50 tokens of stories260K, greedy with the learner's cache: llama2.c's story
        assert "handformer's import chose the same: True" in told and "the same story: True" in told, told
    else:
        assert "stories260K is not on this machine" in told
    print(f"\n{len(CHAPTERS)} notebooks in smoke mode: {seconds:.1f} s")


def test_the_chinese_notebooks_print_and_label_in_chinese(tmp_path, monkeypatch):
    """The Chinese course's notebooks, run on the solutions: every line the chapter's cells print and
    every label of their plots is Chinese, and the plots draw with the CJK font. What the cells print
    and label does not depend on how long they run: `lesson.steps` gives 12 here, not the smoke mode's
    50 (chapter 8 trains 12 steps, the English test 50; chapter 15's context of that many positions
    still holds its 4 + 8 generated tokens)."""
    from handformer.course import lesson
    from handformer.see.fonts import cjk_font

    monkeypatch.setattr(lesson, "SMOKE_STEPS", 12)
    course_with_solutions(tmp_path, "zh")
    cells, _, fonts = run_course(tmp_path, monkeypatch)
    for ch in CHAPTERS:
        (report, shown), labels = cells[ch.notebook]
        assert "个通过" in report, (ch.stem, report)
        lines = [line for line in shown.splitlines() if line.strip()]
        assert all(CJK.search(line) for line in lines), (ch.stem, lines)
        assert labels or ch.stem == "ch09_decoding" or ch.stem == "ch17_stories" and not STORIES, ch.stem
        assert all(CJK.search(label) or label in SAME_IN_BOTH for label in labels), (ch.stem, labels)
        if cjk_font():
            assert cjk_font() in fonts[ch.notebook], ch.stem
