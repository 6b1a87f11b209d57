"""The learner's course folder: `learn` writes the starter files and notebooks that are missing and
never touches a file that is there; `reset` puts a chapter back to its starter, keeping the old
file as `*.bak`; `status` grades each chapter the learner has started.

The folder holds course.json (what it is, its language, and the hash of every file as written), so
that a folder that is not a course is told apart, and a file the learner changed is known.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from handformer.course.chapters import CHAPTERS, Chapter, find_chapter
from handformer.io import atomic_write_text

MANIFEST = "course.json"
LANGS = {"en": "English", "zh": "Chinese"}
DEFAULT_DIR = "handformer-course"


class CourseError(ValueError):
    """Bad input to learn: one clear message, never a traceback."""


def check_lang(lang: str) -> str:
    if lang not in LANGS:
        raise CourseError(f"--lang {lang}: the course is written in "
                          + " and ".join(f"{k} ({v})" for k, v in LANGS.items()))
    return lang


def system_language() -> str:
    """A new course's language without --lang: the system's, by the rule `handformer check` follows
    (zh when LC_ALL, LC_MESSAGES or LANG says Chinese, else en)."""
    from handformer.check.core.report import default_language

    return default_language()


def starter_text(ch: Chapter, lang: str) -> str:
    """The chapter's starter file in one language: the template's lines tagged `#@en` or `#@zh`
    are kept for that language (the tag removed), the untagged lines for both."""
    template = resources.files("handformer.course").joinpath("starters", f"{ch.stem}.py.in")
    template = template.read_text("utf-8")
    out = []
    for line in template.splitlines():
        body, tag = line[:-5].rstrip(), line[-3:]
        if line.endswith(("  #@en", "  #@zh")):
            if tag == f"@{lang}":
                out.append(body)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def notebook_text(ch: Chapter, lang: str) -> str:
    return resources.files("handformer.course").joinpath("notebooks", lang, ch.notebook).read_text("utf-8")


def chapter_files(ch: Chapter, lang: str) -> dict[str, str]:
    return {ch.file: starter_text(ch, lang), ch.notebook: notebook_text(ch, lang)}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_manifest(folder: Path) -> dict:
    """course.json of an existing course folder; a clear error for anything else."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise CourseError(f"{folder}: no such folder; `handformer learn --dir {folder}` makes a course there")
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise CourseError(f"{folder} is not a course folder (it has no {MANIFEST}); run `handformer learn` "
                          "with --dir pointing at a course folder, or at a new or empty folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CourseError(f"{path}: not a course manifest ({err}); delete it and run `handformer learn` "
                          "again to rewrite it (your files are kept)") from None
    if not isinstance(data, dict) or data.get("course") != "handformer" or data.get("lang") not in LANGS:
        raise CourseError(f"{path}: not a handformer course manifest; delete it and run `handformer learn` "
                          "again to rewrite it (your files are kept)")
    data.setdefault("written", {})
    return data


def open_course(folder: Path, lang: str | None) -> dict:
    """The manifest of the course at FOLDER, a new one when the folder is new or empty (in LANG, or
    in the system's language)."""
    if folder.exists() and not folder.is_dir():
        raise CourseError(f"{folder} is a file, not a folder; pick another --dir")
    if folder.is_dir() and (folder / MANIFEST).exists():
        data = read_manifest(folder)
        if lang is not None and check_lang(lang) != data["lang"]:
            raise CourseError(f"{folder} is a course in {LANGS[data['lang']]} (--lang {data['lang']}); "
                              f"for one in {LANGS[lang]} pick another --dir")
        return data
    if folder.is_dir() and any(folder.iterdir()):
        raise CourseError(f"{folder} is not a course folder (it has no {MANIFEST} and is not empty); "
                          "pick a new or empty folder with --dir")
    return {"course": "handformer", "lang": check_lang(lang or system_language()), "written": {}}


def save_manifest(folder: Path, data: dict) -> None:
    atomic_write_text(folder / MANIFEST, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def chapters_of(chapter: str | None) -> tuple[Chapter, ...]:
    """Every chapter, or one with the chapters its file and notebook import (chapter 5 builds on
    your attention of chapter 3, which builds on chapter 2, ...)."""
    if chapter is None:
        return CHAPTERS
    wanted, todo = set(), [find_chapter(chapter)]
    while todo:
        ch = todo.pop()
        wanted.add(ch)
        used = starter_text(ch, "en") + notebook_text(ch, "en")
        todo += [c for c in CHAPTERS if c not in wanted and re.search(rf"\b{c.stem}\b", used)]
    return tuple(c for c in CHAPTERS if c in wanted)


def learn(folder: Path, lang: str | None = None, chapter: str | None = None) -> list[tuple[str, str]]:
    """Write the files of the course (or of one chapter and those it imports) that are missing.
    Returns (file, what
    happened): "written", "kept" (as written), "kept, changed by you"."""
    chapters = chapters_of(chapter)
    data = open_course(folder, lang)
    folder.mkdir(parents=True, exist_ok=True)
    done = []
    for ch in chapters:
        for name, content in chapter_files(ch, data["lang"]).items():
            path = folder / name
            if path.exists():
                same = data["written"].get(name) == digest(path.read_text("utf-8", errors="replace"))
                done.append((name, "kept" if same else "kept, changed by you"))
                continue
            atomic_write_text(path, content)
            data["written"][name] = digest(content)
            done.append((name, "written"))
    save_manifest(folder, data)
    return done


def reset(folder: Path, chapter: str) -> list[tuple[str, str]]:
    """Put one chapter's files back to the starter; a file that differs is kept as NAME.bak first."""
    ch = find_chapter(chapter)
    data = read_manifest(folder)
    done = []
    for name, content in chapter_files(ch, data["lang"]).items():
        path = folder / name
        if path.exists() and path.read_bytes() != content.encode("utf-8"):
            backup = folder / f"{name}.bak"
            n = 1
            while backup.exists():
                n += 1
                backup = folder / f"{name}.{n}.bak"
            path.replace(backup)
            done.append((name, f"reset, yours kept as {backup.name}"))
        else:
            done.append((name, "reset"))
        atomic_write_text(path, content)
        data["written"][name] = digest(content)
    save_manifest(folder, data)
    return done


@dataclass
class ChapterStatus:
    chapter: Chapter
    state: str  # missing | not started | pass | not implemented yet | fail | NOT CHECKED
    detail: str = ""


def status(folder: Path, time_limit: float | None = None) -> tuple[str, list[ChapterStatus]]:
    """(the course's language, the state of each chapter): a file still equal to its starter is
    "not started"; every other file is graded by `handformer check` in a child process."""
    from handformer.check.core.result import DIFFERS, DRIVER, NOT_CHECKED, PASS, TODO
    from handformer.check.core.sandbox import TIME_LIMIT, check_in_child

    data = read_manifest(folder)
    out = []
    for ch in CHAPTERS:
        path = folder / ch.file
        if not path.exists():
            hint = (f"`handformer learn {ch.number}` writes it" if data["lang"] == "en"
                    else f"运行 `handformer learn {ch.number}` 生成它")
            out.append(ChapterStatus(ch, "missing", hint))
            continue
        if path.read_text("utf-8", errors="replace") == starter_text(ch, data["lang"]):
            out.append(ChapterStatus(ch, "not started"))
            continue
        result = check_in_child(str(path), time_limit=time_limit or TIME_LIMIT)
        if result.error is not None:
            out.append(ChapterStatus(ch, "fail", result.error.message))
        elif result.ok:
            n, zh = len(result.components), data["lang"] == "zh"
            out.append(ChapterStatus(ch, "pass", f"{n} 个组件" if zh else f"{n} components"))
        else:
            todo = [c.name for c in result.components if c.status == TODO]
            unchecked = [c for c in result.components if c.status == NOT_CHECKED]
            settled = (PASS, DIFFERS, TODO, NOT_CHECKED, DRIVER)
            bad = [c.name for c in result.components if c.status not in settled]
            if bad:
                out.append(ChapterStatus(ch, "fail", ", ".join(bad)))
            elif todo:
                out.append(ChapterStatus(ch, "not implemented yet", ", ".join(todo)))
            else:  # nothing failed, but check could not build or drive some component: the reason
                zh = data["lang"] == "zh"
                why = [(c.name, c.error.message_zh if c.error and zh and c.error.message_zh
                        else c.error.message if c.error else "") for c in unchecked]
                out.append(ChapterStatus(ch, "NOT CHECKED", "; ".join(f"{n}: {m[:160]}" for n, m in why)))
    return data["lang"], out
