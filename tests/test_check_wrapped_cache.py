"""A generation loop through a KV cache whose model wraps another model of the file (Hugging Face's
`...ForCausalLM` around `...Model`, GPT-2's LM head around its transformer), both handed the ids: a
cached call that departs is quoted inside the model, at the line that parts, not at the loop's call.
Two forms (tests/fixtures/learners_wrapped_cache/): rotary positions counted from a cache object's
length, and learned positions counted from the keys handed back; each planted with positions that
restart at 0 on a cached call."""

from __future__ import annotations

import pytest
from check_results import FIXTURES, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = FIXTURES / "learners_wrapped_cache"
PLANTS = {  # fixture -> (the loop's component, the positions line as written, as planted)
    "rotary_correct.py": ("TinyForCausalLM.generate", "positions = torch.arange(past, past + input_ids.size(1))",
                          "positions = torch.arange(input_ids.size(1))"),
    "learned_correct.py": ("generate", "pos = torch.arange(past_length, past_length + idx.size(1))",
                           "pos = torch.arange(idx.size(1))"),
}


@pytest.fixture(scope="module", params=PLANTS)
def planted(request, tmp_path_factory):
    name, (loop, written, plant) = request.param, PLANTS[request.param]
    text = (HERE / name).read_text()
    assert written in text, f"{name} no longer holds {written!r}"
    path = tmp_path_factory.mktemp("wrapped_cache") / name.replace("correct", "positions_from_zero")
    path.write_text(text.replace(written, plant))
    line = next(i for i, code in enumerate(text.splitlines(), 1) if written in code)
    return check_file(str(path), only=["generate"]), loop, line


def test_the_loop_fails_quoting_the_positions_line_inside_the_wrapped_model(planted):
    result, loop, line = planted
    found = component(result, loop)
    assert found.status == "fail", format_report(result)
    assert [f.line for f in found.findings] == [line], format_report(result)
