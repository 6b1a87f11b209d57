"""`handformer check` on a batched beam search driven through the learner's own model with its KV cache:
two prompts of different content in one batch, each row compared with that prompt searched alone (the
prompt a row continues read back from the cache it is handed); and every tensor of the cache it hands the
model following the beams kept. Two forms: the beams of every prompt in one flattened (B * K) batch with a
vectorised offset and a (key, value) pair a layer, and a loop over the batch writing b * K + beam with one
tensor a layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_batched_beam"
BATCH_CHECK = "a batch of 2 sentences gives what each gives alone"
CACHE_CHECK = "the KV cache handed to your model follows the beams kept"


@pytest.fixture(scope="module", params=["flat", "looped"])
def correct(request):
    return check_file(str(FAMILY / f"{request.param}.py"), only=["beam_search"])


@pytest.fixture(scope="module", params=[
    ("flat_no_offset", "beam_batched_differs", 75, "parents = flat // V"),
    ("looped_no_offset", "beam_batched_differs", 89, "parent_row = beam"),
    # the values of every layer left in their old rows; the second layer's cache left so
    ("flat_keys_only", "departs", 93, "(k.index_select(0, rows), v)"),
    ("looped_first_layer", "departs", 96, "[cache[0][torch.tensor(rows)], *cache[1:]]")])
def planted(request):
    plant, name, line, code = request.param
    return check_file(str(FAMILY / f"{plant}.py"), only=["beam_search"]), name, line, code


def test_a_correct_batched_search_passes_with_its_batch_and_cache_checked(correct):
    assert [c.status for c in correct.components] == ["pass"], format_report(correct)
    search = correct.components[-1]
    assert [c.ok for c in search.checks if BATCH_CHECK in c.name["en"] or CACHE_CHECK in c.name["en"]] \
        == [True, True]
    assert not any("was not tried" in n["en"] for n in search.notes)


def test_a_planted_search_fails_at_its_line(planted):
    """The batch offset left out (two forms), or a cache reordered in part (two forms)."""
    result, name, line, code = planted
    search = result.components[-1]
    assert [c.status for c in result.components] == ["fail"], format_report(result)
    assert [(f.name, f.line) for f in search.findings] == [(name, line)]
    assert code in search.findings[0].code
