"""Two learners' folders checked one after the other in one process (as the tests run check): each
file's `from correct import ...` reads its own folder's `correct.py`, never the one imported first."""

from __future__ import annotations

from handformer.check.core.engine import import_learner


def _folder(root, name: str, value: int):
    folder = root / name
    folder.mkdir()
    (folder / "correct.py").write_text(f"VALUE = {value}\n")
    (folder / "model.py").write_text("from correct import VALUE\n")
    return folder


def test_each_folder_imports_its_own_neighbour(tmp_path):
    first, second = _folder(tmp_path, "first", 1), _folder(tmp_path, "second", 2)
    assert import_learner(str(first / "model.py")).VALUE == 1
    assert import_learner(str(second / "model.py")).VALUE == 2
    assert import_learner(str(first / "model.py")).VALUE == 1
