"""A sampling loop driven at the settings its own code shows neutral (fixtures/learners_loop_neutral/):
GPT2-Chinese's form (a filter whose top_k 0 and top_p 0.0 are off by its guards, a repetition penalty
spelled its own way at 1.0, the [UNK] id banned, the context cropped one token short) and a batched loop
(the pad id banned with -1e10, a gain of 1.0 on the logits). A setting that only multiplies or divides,
at 1.0, is neutral by its use; the ids a loop bans are banned in its model's logits too, so the
reference never picks them. Each passes, saying so; each with its temperature multiplied fails, named."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_loop_neutral"
# each correct file -> what its notes must say
NOTES = {"poem_loop": ("never emits token id 1", "at repitition_penalty=1.0", "one token fewer"),
         "batched_gain": ("never emits token id 0", "at logit_gain=1.0")}
PLANTED = {"poem_loop_temperature": 72, "batched_gain_temperature": 51}


@pytest.fixture(scope="module", params=[*NOTES, *PLANTED])
def checked(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["generate"])


def test_a_loop_at_its_neutral_settings_passes_and_a_plant_is_named(checked):
    name, result = checked
    loop = result.components[-1]
    if name in NOTES:
        notes = " ".join(n["en"] for n in loop.notes)
        assert loop.status == "pass", format_report(result)
        assert all(said in notes for said in NOTES[name]), notes
        return
    found = {f.name: f.line for f in loop.findings}
    assert loop.status == "fail" and found.get("temperature_multiplied") == PLANTED[name], format_report(result)


class _Options:  # a settings object handed as a default: unhashable, as a dataclass with eq is
    __hash__ = None  # type: ignore[assignment]


def _loop(logits, options=_Options(), gain=1.0, shift=0.0, handed=1.0):  # noqa: B008
    return max(logits * gain - shift, handed) + [options]


def test_neutral_by_use_reads_only_float_defaults_at_the_identity_of_their_operations():
    """gain only multiplies (1.0) and shift only subtracts (0.0): neutral; handed goes to a call: not;
    an unhashable default (a settings object) is passed over, not raised on."""
    from handformer.check.core.options_object import neutral_by_use

    defaults = {"options": _Options(), "gain": 1.0, "shift": 0.0, "handed": 1.0}
    assert sorted(neutral_by_use(_loop, defaults)) == ["gain", "shift"]
