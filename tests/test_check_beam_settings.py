"""A beam search's settings by their names (fixtures/learners_beam_settings/): the pad id, how many
hypotheses come back, early_stopping and a sampling switch are filled at the values that make the search
handformer's, and the report says so. Two forms: Hugging Face's batched search (max_length counting the
prompt, early_stopping and num_return_sequences with defaults) and a search of lists that requires every
one of them. Each passes; each with its scores not summed fails, named."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_beam_settings"
# each file -> the settings its note names, and (for a planted file) the lines of its mistake
FILES = {"hf_batched": ("pad_token_id=0", "num_return_sequences=1", "early_stopping=False"),
         "listed": ("pad_id=0", "n_best=1", "do_sample=False")}
PLANTED = {"hf_batched_not_accumulated": {81}, "listed_not_accumulated": {60, 61}}


@pytest.fixture(scope="module", params=[*FILES, *PLANTED])
def checked(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["beam_search"])


def test_the_settings_are_filled_and_said_and_a_plant_is_named(checked):
    name, result = checked
    search = result.components[-1]
    if name in FILES:
        notes = " ".join(n["en"] for n in search.notes)
        assert search.status == "pass", format_report(result)
        assert all(setting in notes for setting in FILES[name]), notes
        return
    found = {f.name: f.line for f in search.findings}
    assert search.status == "fail", format_report(result)
    assert found.get("beam_scores_not_accumulated") in PLANTED[name], format_report(result)
