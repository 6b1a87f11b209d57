"""Reading `check`'s results in tests, one home for what the style tests each wrote out (imported as
`check_results`: pytest puts this folder on sys.path): a fixture file checked, its components'
statuses, findings and notes, and a copy of a fixture with one written line planted."""

from pathlib import Path

from handformer.check.core.engine import check_file

FIXTURES = Path(__file__).parent / "fixtures"


def checked(folder: str, name: str = "correct", only: list[str] | None = None):
    """tests/fixtures/FOLDER/NAME.py checked (only those kinds where `only` is given)."""
    return check_file(str(FIXTURES / folder / f"{name}.py"), only=only)


def statuses(result) -> dict[str, str]:
    return {c.name: c.status for c in result.components}


def component(result, name: str):
    return next(c for c in result.components if c.name == name)


def named(result, name: str) -> list[tuple[str, str]]:
    """(diagnosis, quoted code) of each finding of one component."""
    return [(f.name, f.code) for f in component(result, name).findings]


def notes(result, name: str) -> str:
    return " ".join(n["en"] for n in component(result, name).notes)


def planted_copy(source: Path, folder: Path, name: str, *replacements: tuple[str, str]):
    """`source` checked as NAME.py in `folder` with each (written, plant) replaced; each written text
    must be in the source, so a fixture edited apart from its test fails loudly."""
    text = source.read_text()
    for written, plant in replacements:
        assert written in text, f"{source.name} no longer holds {written!r}"
        text = text.replace(written, plant)
    path = folder / f"{name}.py"
    path.write_text(text)
    return check_file(str(path))
