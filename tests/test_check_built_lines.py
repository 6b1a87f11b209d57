"""A value built in __init__ that departs is quoted at the line that builds it: a mask buffer stored from
a name bound on the line above (`mask = torch.tril(...)` then `register_buffer("bias", mask.view(...))`)
is quoted there, with the storing line; a storing line that moves the entries itself is quoted alone.
And a model holding what the reference has no place for (a learned mix of values) whose causality fails
keeps the mask builder's line, judged by what the mask keeps. Fixtures: tests/fixtures/
learners_built_lines/mixed_values.py (nanoGPT's buffer, value residual scalars) and keep_table.py (a
boolean keep table stored as a plain attribute)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import FIXTURES, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FOLDER = FIXTURES / "learners_built_lines"
MIXED, TABLE = FOLDER / "mixed_values.py", FOLDER / "keep_table.py"
MIXED_BUILT = "mask = torch.tril(torch.ones(config.block_size, config.block_size))"
TABLE_BUILT = "visible = torch.ones(context, context, dtype=torch.bool).tril()"
TABLE_STORED = "self.keep = visible[None, None]"


def _line_of(path: Path, written: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if written in line)


def _planted(folder: Path, source: Path, name: str, written: str, plant: str):
    text = source.read_text()
    assert written in text, f"{source.name} no longer holds {written!r}"
    path = folder / f"{name}.py"
    path.write_text(text.replace(written, plant))
    return check_file(str(path), only=["gpt"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("built_lines")


@pytest.fixture(scope="module")
def mixed_plant(folder):
    return _planted(folder, MIXED, "mixed_diagonal", MIXED_BUILT, MIXED_BUILT[:-1] + ", diagonal=1)")


@pytest.fixture(scope="module")
def table_plant(folder):
    return _planted(folder, TABLE, "table_upper", TABLE_BUILT, TABLE_BUILT.replace("tril", "triu"))


@pytest.fixture(scope="module")
def table_moved(folder):
    return _planted(folder, TABLE, "table_moved", TABLE_STORED, TABLE_STORED + ".transpose(-2, -1)")


def _quoted(result, name: str) -> list[tuple[str, int | None, str | None]]:
    """The findings of the FAIL, the builder's first (a leak found by causality may follow it: at most two
    lines quoted in all)."""
    res = component(result, name)
    assert res.status == "fail", format_report(result)
    assert len({f.line for f in res.findings}) <= 2, format_report(result)
    return [(f.name, f.line, f.code) for f in res.findings][:1]


def test_correct_files_do_not_fail():
    assert component(check_file(str(TABLE), only=["gpt"]), "TinyLM").status == "pass"
    result = check_file(str(MIXED), only=["gpt"])
    assert component(result, "GPT").status != "fail", format_report(result)  # the mix: not checked


def test_buffer_of_a_mixed_model_is_quoted_where_built(mixed_plant):
    """Causality fails and the reference cannot express the mix: the builder's line is evidence still."""
    [(name, line, code)] = _quoted(mixed_plant, "GPT")
    assert (name, line) == ("departs", _line_of(MIXED, MIXED_BUILT))
    assert code.count(" / line ") == 1 and "register_buffer" in code  # the storing line after it


def test_keep_table_is_quoted_where_built(table_plant):
    [(name, line, code)] = _quoted(table_plant, "TinyLM")
    assert (name, line) == ("departs", _line_of(TABLE, TABLE_BUILT))
    assert code.count(" / line ") == 1 and TABLE_STORED in code


def test_a_storing_line_that_moves_the_entries_is_quoted_itself(table_moved):
    [(name, line, code)] = _quoted(table_moved, "TinyLM")
    assert (name, line) == ("departs", _line_of(TABLE, TABLE_STORED))
    assert code.count(" / line ") <= 1
