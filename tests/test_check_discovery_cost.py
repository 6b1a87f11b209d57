"""What every `handformer check` run pays once: the learner's components are found once for a whole
file (the kinds it checks are all of them), and a kind's table of names is matched against the
file's versioned names and class methods alone, with what it finds unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core import engine
from handformer.check.core.discovery import _matching

pytestmark = pytest.mark.usefixtures("one_thread")
ADAMW = Path(__file__).parent / "fixtures" / "learners_adamw" / "correct.py"


@pytest.fixture
def discoveries(monkeypatch) -> list[list[str] | None]:
    """The `only` of each find_components call the engine makes."""
    calls: list[list[str] | None] = []
    original = engine.find_components

    def counted(module, overrides=None, only=None, adapters=None):
        calls.append(only)
        return original(module, overrides, only, adapters)

    monkeypatch.setattr(engine, "find_components", counted)
    return calls


def test_a_whole_file_is_discovered_once_and_a_chosen_kind_beside_every_component(discoveries):
    whole = engine.check_file(str(ADAMW))
    assert whole.components and all(c.status == "pass" for c in whole.components)
    assert discoveries == [None]
    kind = whole.components[0].kind
    alone = engine.check_file(str(ADAMW), only=[kind])
    assert [c.kind for c in alone.components] == [kind] and discoveries == [None, [kind], None]


def test_versioned_names_and_class_methods_stand_for_a_kinds_names():
    def f():
        pass

    own = {"SelfAttention_v1": f, "SelfAttention_v2": f, "SelfAttention": f, "GPT.generate_cached": f,
           "GPT.generate": f, "Batch.make_std_mask": f, "make_std_mask2": f, "Attention3x": f, "top_k": f,
           "_top_k": f, "layer12": f}
    assert _matching(("SelfAttention",), own) == ["SelfAttention", "SelfAttention_v1", "SelfAttention_v2"]
    assert _matching((".generate",), own) == ["GPT.generate", "GPT.generate_cached"]
    assert _matching(("make_std_mask",), own) == ["Batch.make_std_mask"]
    assert _matching(("top_k", "layer"), own, "top_k") == ["top_k", "_top_k"]
