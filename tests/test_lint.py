"""README: "`ruff check .` lints": the whole project passes it, with pyproject.toml's rules; and a plain
`pytest` from the root collects (no test module imports `tests.` as a package)."""

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


def test_no_test_module_imports_the_tests_folder_as_a_package():
    """`from tests.helpers import ...` works only under `python3 -m pytest` (the root on sys.path); a
    plain `pytest` stops at collection. pytest puts tests/ itself on sys.path: `from helpers import`."""
    import re

    found = [f"{path.name}:{i}" for path in sorted((ROOT / "tests").glob("*.py"))
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.match(r"\s*(from|import) tests[.\s]", line)]
    assert not found, found
