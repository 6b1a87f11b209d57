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



def test_a_steered_row_made_once_equals_one_made_afresh():
    """The scenario's log-probabilities for a prefix are made once for each table entry and vocabulary
    (beam_models.steered_row) and copied: each equals the row made afresh, at two vocabularies, and a
    copy written to leaves the next one as made."""
    import math

    import torch

    from handformer.check.runners.beam import MIRRORED, SCENARIOS
    from handformer.check.runners.beam_models import EOS, Steered

    model = Steered(None, {}, None)
    for table in [*SCENARIOS.values(), MIRRORED]:
        for prefix in [*table, (99,)]:  # (99,): a prefix the table lacks, EOS at 0.5
            probs = table.get(prefix, {EOS: 0.5})
            for V in (12, 16):
                fresh = torch.full((V,), math.log(1e-6), dtype=torch.float64)
                for token, p in probs.items():
                    fresh[token] = math.log(p)
                fresh[V - 1] = math.log(max(1.0 - sum(probs.values()), 1e-6))
                row = model.steer(list(prefix), V, table)
                assert torch.equal(row, fresh), (prefix, V)
                row.fill_(0.0)
                assert torch.equal(model.steer(list(prefix), V, table), fresh), (prefix, V)
