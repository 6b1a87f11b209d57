"""README: "`ruff check .` lints". The whole project passes it, with pyproject.toml's rules."""

import subprocess
import sys
from pathlib import Path

from helpers import require_module

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes_on_the_whole_project():
    require_module("ruff", "pip install -e '.[dev]' (ruff is a dev dependency)")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
