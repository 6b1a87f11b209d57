"""A raise on check's input form is not the learner's (core/prompt_forms.py, core/whole_topk.py).

- One prompt, copied num_samples times: a loop that takes one prompt's ids and repeats them
  (`torch.tensor(prompt).unsqueeze(0).repeat(num_samples, 1)`) raises on check's (2, T) batch; check
  tries one row, its ids (T,), a list of ints, hands a required count of samples 1, and a top-k written
  for a real vocabulary (`probs.topk(40)`) keeps the whole of check's 24 tokens. It passes; the same
  loop reading the first position's logits FAILs at that line.
- A prompt as text (the file calls the loop with a string and encodes it itself): NOT CHECKED, naming
  the form; a mistake in the model beside it still FAILs.
- No model (a loop over a dict of weights of its file's own, `generate(ids, steps)`): NOT CHECKED,
  naming its parameters, never compared with check's model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_failed_at, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_prompt_forms"
FILES = {"one_prompt.py": ["generate"], "one_prompt_first_position.py": ["generate"],
         "text_prompt.py": ["generate"], "text_prompt_scale_by_dk.py": ["causal_attention", "generate"],
         "weight_dict.py": ["generate"]}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FIXTURES / name), only=kinds) for name, kinds in FILES.items()}


def test_a_one_prompt_loop_passes_in_the_form_it_takes(results):
    loop = component(results["one_prompt.py"], "generate")
    assert loop.status == "pass", format_report(results["one_prompt.py"])
    assert any("one prompt at a time" in n["en"] for n in loop.notes)


def test_a_one_prompt_loop_with_a_mistake_fails_at_its_line(results):
    result = results["one_prompt_first_position.py"]
    assert component(result, "generate").status == "fail"
    assert_failed_at(result, "", "logits = logits[:, 0, :]")


def test_a_text_prompt_is_not_checked_naming_the_form(results):
    for name in ("text_prompt.py", "text_prompt_scale_by_dk.py"):
        loop = component(results[name], "generate")
        assert loop.status == "not_checked", format_report(results[name])
        assert "takes its prompt as text" in loop.error.message and "提示词是文本" in loop.error.message_zh
    assert_failed_at(results["text_prompt_scale_by_dk.py"], "scale_by_dk", "")


def test_a_loop_that_takes_no_model_is_not_checked(results):
    loop = component(results["weight_dict.py"], "generate")
    assert loop.status == "not_checked", format_report(results["weight_dict.py"])
    assert "takes no model (its parameters: ids, steps)" in loop.error.message
    assert "不接收模型" in loop.error.message_zh
