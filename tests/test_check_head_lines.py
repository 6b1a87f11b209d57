"""A model whose stack ends without its final norm (final_norm_missing) is quoted at the line of its
forward that applies the head to the stream, the line the norm was left out of, where only a guess of
the diagnosis' patterns found a line (`self.norm = ...` in __init__, a `return logits`): Hugging
Face's Llama and MiniMind (`logits = self.lm_head(hidden_states)`); lucidrains' PaLM
(`return self.to_logits(x)`) in test_check_model_styles.py. One check run per fixture file."""

from __future__ import annotations

import pytest
from check_results import checked

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=[("learners_hf", "LlamaForCausalLM"),
                                        ("learners_minimind", "MiniMindForCausalLM")])
def planted(request):
    folder, name = request.param
    return checked(folder, "final_norm_missing", only=["gpt"]), name


def test_final_norm_missing_is_quoted_where_the_head_meets_the_stream(planted):
    result, name = planted
    (comp,) = [c for c in result.components if c.name == name]
    assert comp.status == "fail", format_report(result)
    (finding,) = comp.findings
    assert (finding.name, finding.code) == ("final_norm_missing", "logits = self.lm_head(hidden_states)"), \
        format_report(result)
