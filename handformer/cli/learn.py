"""`handformer learn`: the course, from the first tensor to a trained model, graded at every step."""

from __future__ import annotations

import argparse
import unicodedata
from pathlib import Path

STATES = {"en": {}, "zh": {"missing": "缺少文件", "not started": "还没开始", "pass": "通过",
                           "not implemented yet": "尚未实现", "fail": "未通过", "NOT CHECKED": "未检查"}}
ACTIONS = {"written": "写入", "kept": "保留", "kept, changed by you": "保留（你改过）", "reset": "已重置"}


def columns(text: str) -> int:
    """The columns TEXT takes on a terminal, where a Chinese character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def padded(text: str, width: int) -> str:
    """TEXT padded to WIDTH columns of a terminal."""
    return text + " " * max(0, width - columns(text))


def title_width(lang: str) -> int:
    """The columns of the course's longest chapter title in LANG: the title column's width."""
    from handformer.course.chapters import CHAPTERS

    return max(columns(ch.en if lang == "en" else ch.zh) for ch in CHAPTERS)


def cmd_learn(args: argparse.Namespace) -> int:
    from handformer.course.folder import check_lang, learn, reset, status

    folder = Path(args.dir)
    if args.lang is not None:
        check_lang(args.lang)
    if args.status or args.reset:
        if args.chapter is not None:
            raise ValueError(f"chapter {args.chapter} with {'--status' if args.status else '--reset'}: "
                             "--status takes no chapter, --reset takes its own (--reset 3)")
    if args.status:
        lang, states = status(folder)
        for s in states:
            title = s.chapter.en if lang == "en" else s.chapter.zh
            state = STATES[lang].get(s.state, s.state)
            detail = "" if not s.detail else f"  ({s.detail})" if lang == "en" else f"（{s.detail}）"
            print(f"{s.chapter.number:>2}  {s.chapter.file:<24} {padded(title, title_width(lang))}  "
                  f"{state}{detail}")
        passed = sum(s.state == "pass" for s in states)
        print(f"{passed} of {len(states)} chapters pass" if lang == "en"
              else f"共 {len(states)} 章，{passed} 章通过")
        return 0
    done = reset(folder, args.reset) if args.reset else learn(folder, args.lang, args.chapter)
    from handformer.course.chapters import find_chapter
    from handformer.course.folder import read_manifest

    lang = read_manifest(folder)["lang"]
    for name, action in done:
        if lang == "zh":
            action = ACTIONS.get(action, action.replace("reset, yours kept as", "已重置，你的旧文件保存为"))
        print(f"{action:<28} {folder / name}")
    if not (args.reset or args.chapter):
        print_tutorials(lang)
    ch = find_chapter(args.reset or args.chapter or "1")
    notebook, file = folder / ch.notebook, folder / ch.file
    print(f"next: `jupyter lab {notebook}` (or open it in VS Code), or fill in {file} and run "
          f"`handformer check {file}`" if lang == "en" else
          f"下一步：`jupyter lab {notebook}`（或者用 VS Code 打开），"
          f"或者写完 {file} 再运行 `handformer check {file}`")
    return 0


def print_tutorials(lang: str) -> None:
    """The course's chapters against the tutorials' chapters they follow."""
    from handformer.course.chapters import CHAPTERS

    print("the chapters and the tutorials they follow:" if lang == "en" else "各章对应的教程章节：")
    for ch in CHAPTERS:
        title, tutorial = (ch.en, ch.tutorial[0]) if lang == "en" else (ch.zh, ch.tutorial[1])
        print(f"{ch.number:>4}  {padded(title, title_width(lang))}  {tutorial}")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from handformer.course.folder import DEFAULT_DIR

    p = sub.add_parser(
        "learn", help="write the course: a starter file and a notebook per chapter, graded by check",
        description="Write a folder with one starter file per chapter of the tutorial series (signatures, "
        "docstrings and TODOs) and a Jupyter notebook per chapter that grades your file with "
        "`handformer check` and, once it passes, plots what the chapter is about. Only missing files "
        "are written: a file that is there is never overwritten.")
    p.add_argument("chapter", nargs="?", default=None,
                   help="write only this chapter (a number such as 3, or its file's name); default: all")
    p.add_argument("--lang", default=None, metavar="{en,zh}",
                   help="language of the starter files and notebooks (default: the system's, zh under a "
                   "Chinese locale, else en; a course keeps its own)")
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"the course folder (default {DEFAULT_DIR})")
    p.add_argument("--status", action="store_true", help="show which chapters pass (runs handformer check)")
    p.add_argument("--reset", metavar="CHAPTER", default=None,
                   help="put CHAPTER's files back to the starter; yours are kept as *.bak")
    p.set_defaults(func=cmd_learn)


