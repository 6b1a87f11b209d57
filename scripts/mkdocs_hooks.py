"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

1. README.md and README.zh.md become the home pages (index.md and zh/index.md). They link as a
   repository reader sees them (`docs/tour.md`, `docs/zh/tour.md`, `README.zh.md`); on the site
   those pages sit elsewhere, so each link is rewritten. A README link to a file outside docs/ has
   no page on the site: the build stops and names the line.
2. A Chinese paragraph wrapped over several source lines would show a space at each line break
   (browsers put one between two Chinese characters); those line breaks are joined.
3. mkdocs-static-i18n builds each language on its own, so a link from an English page to a Chinese
   one (or back) names a page the build does not have. Such links become plain links to the other
   language's URL, after checking here that the page exists."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
HOMES = {"README.md": "index.md", "README.zh.md": "zh/index.md"}
# [text](target) and ![alt](target); the text may hold `code`; the target runs to ')' or a space
CJK = "\u3000-\u303f\u3400-\u9fff\uff00-\uffef"
WRAP = re.compile(f"(?<=[{CJK}])\n(?=[{CJK}])")
LINK = re.compile(r"(!?\[(?:[^\]`]|`[^`]*`)*\]\()([^)\s]+)(\))?")


def links(markdown: str, replace) -> str:
    """`markdown` with every link outside fenced code blocks passed through replace(match, line)."""
    lines = markdown.split("\n")
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines[i] = LINK.sub(lambda m, n=i + 1: replace(m, n), line)
    return "\n".join(lines)


def external(target: str) -> bool:
    return bool(re.match(r"[a-z]+:", target)) or target.startswith("#")


def home_target(readme: str, target: str, line: int) -> str:
    """Where README `readme`'s link `target` points, relative to its home page in docs/."""
    if external(target):
        return target
    path, _, anchor = target.partition("#")
    anchor = f"#{anchor}" if anchor else ""
    here = posixpath.dirname(HOMES[readme])
    if path in HOMES:
        inside = HOMES[path]
    elif path.startswith("docs/"):
        inside = path[len("docs/"):]
    else:
        raise PluginError(
            f"{readme}:{line}: the link ({target}) points outside docs/, so the site has no page for it; "
            f"link to a page under docs/ or to a web address, or write the path as `code`")
    return posixpath.relpath(inside, here or ".") + anchor


def url_of(src: str) -> str:
    """The site URL (directory style) of the page docs/`src`."""
    stem = src[:-3]
    if stem == "index" or stem.endswith("/index") or stem.endswith("README"):
        return stem.rpartition("/")[0] + "/" if "/" in stem else ""
    return stem + "/"


def language(src: str) -> str:
    return "zh" if src.startswith("zh/") else "en"


def on_files(files: Files, config) -> Files:
    # Pages under docs_dir (as mkdocs-static-i18n expects) whose text on_page_read_source provides
    for page in HOMES.values():
        files.append(File(page, config.docs_dir, config.site_dir, config.use_directory_urls))
    return files


def on_page_read_source(page, config) -> str | None:
    readme = {home: readme for readme, home in HOMES.items()}.get(page.file.src_uri)
    if readme is None:
        return None
    text = (ROOT / readme).read_text(encoding="utf-8")
    return links(text, lambda m, n: m.group(1) + home_target(readme, m.group(2), n) + (m.group(3) or ""))


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    docs = Path(config.docs_dir)
    shown = {home: readme for readme, home in HOMES.items()}.get(src, f"docs/{src}")

    def cross(m: re.Match, line: int) -> str:
        target = m.group(2)
        path, _, anchor = target.partition("#")
        if external(target) or not path.endswith(".md") or m.group(1).startswith("!"):
            return m.group(0)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(src), path))
        if language(resolved) == language(src):
            return m.group(0)
        if resolved not in HOMES.values() and not (docs / resolved).is_file():
            raise PluginError(f"{shown}:{line}: the link ({target}) names docs/{resolved}, which does not "
                              "exist; fix the path or write the page")
        href = posixpath.relpath(url_of(resolved).rstrip("/") or ".", url_of(src).rstrip("/") or ".") + "/"
        text = m.group(1)[1:-2]
        return f'<a href="{href}{"#" + anchor if anchor else ""}">{text}</a>'

    markdown = links(markdown, cross)
    if language(src) == "zh":
        parts = re.split(r"(^```.*?^```[ \t]*$)", markdown, flags=re.S | re.M)
        markdown = "".join(p if p.startswith("```") else WRAP.sub("", p) for p in parts)
    return markdown
