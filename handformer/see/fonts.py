"""Fonts for token labels in any script: DejaVu Sans first, then a CJK font as matplotlib's per-glyph
fallback, so that a Chinese or Japanese token renders as itself and never as an empty box.

A CJK font is looked up among the fonts matplotlib knows and, since matplotlib's font cache predates
fonts installed later (e.g. by scripts/install.sh), among the system's font files too. When some
label still has characters no available font can draw, `label_fonts` says so in one warning line
and silences matplotlib's one-warning-per-glyph noise.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from collections.abc import Iterable, Iterator

import matplotlib
from matplotlib import font_manager

BASE_FONT = "DejaVu Sans"  # matplotlib's bundled font: Latin, Greek, Cyrillic, arrows, '▁'

# Families with CJK glyphs, best first (Debian: fonts-noto-cjk, fonts-wqy-zenhei, fonts-arphic-*).
CJK_FAMILIES = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Sans CJK KR",
    "Source Han Sans SC", "Source Han Sans CN", "Noto Sans SC", "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei", "Droid Sans Fallback", "AR PL UMing CN", "AR PL UKai CN",
    "Microsoft YaHei", "SimHei", "PingFang SC", "Hiragino Sans GB", "Arial Unicode MS",
)
# Parts of file names of such fonts, for files matplotlib's cache does not list yet.
CJK_FILE_HINTS = ("notosanscjk", "notoserifcjk", "sourcehansans", "wqy", "droidsansfallback",
                  "uming", "ukai", "msyh", "simhei", "notosanssc")

_warned: set[str] = set()  # missing-glyph sets already reported

INSTALL_HINT = ("install a font that has them (Chinese, Japanese, Korean: apt-get install "
                "fonts-noto-cjk)")


def _known_families() -> set[str]:
    return {f.name for f in font_manager.fontManager.ttflist}


@functools.lru_cache(maxsize=1)
def cjk_font() -> str | None:
    """The family name of an installed font with CJK glyphs, or None when there is none."""
    for name in CJK_FAMILIES:
        if name in _known_families():
            return name
    for path in font_manager.findSystemFonts():
        if any(hint in os.path.basename(path).lower() for hint in CJK_FILE_HINTS):
            with contextlib.suppress(Exception):  # an unreadable font file is simply skipped
                font_manager.fontManager.addfont(path)
    known = _known_families()
    return next((name for name in CJK_FAMILIES if name in known), None)


def font_families() -> list[str]:
    """The font list for labels: the base font, then the CJK fallback when one is installed."""
    cjk = cjk_font()
    return [BASE_FONT] + ([cjk] if cjk else [])


@functools.lru_cache(maxsize=8)
def _charmap(family: str) -> frozenset[int]:
    path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
    return frozenset(font_manager.get_font(path).get_charmap())


def missing_glyphs(texts: Iterable[str]) -> str:
    """The characters of `texts` that no font in `font_families()` can draw (whitespace aside)."""
    covered: set[int] = set()
    for family in font_families():
        with contextlib.suppress(ValueError):
            covered |= _charmap(family)
    missing = {c for text in texts for c in text if not c.isspace() and ord(c) not in covered}
    return "".join(sorted(missing))


@contextlib.contextmanager
def label_fonts(texts: Iterable[str] = ()) -> Iterator[None]:
    """Draw with `font_families()` inside this block. If `texts` hold characters no font has, say
    so in one line on stderr (once per process for the same characters) instead of letting them
    become silent boxes."""
    missing = missing_glyphs(list(texts))
    if missing and missing not in _warned:
        _warned.add(missing)
        shown = missing if len(missing) <= 12 else missing[:12] + "…"
        print(f"warning: no installed font has glyphs for {shown!r}; they will show as boxes; "
              f"{INSTALL_HINT}", file=sys.stderr)
    with matplotlib.rc_context({"font.family": font_families()}), warnings.catch_warnings():
        if missing:  # already reported above, once
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
        yield
