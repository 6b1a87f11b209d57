"""A model whose stack ends without its final norm (final_norm_missing) is quoted at the line of its
forward that applies the head to the stream, the line the norm was left out of, where only a guess of
the diagnosis' patterns found a line (`self.norm = ...` in __init__, a `return logits`): Hugging
Face's Llama and MiniMind (`logits = self.lm_head(hidden_states)`); lucidrains' PaLM
(`return self.to_logits(x)`) in test_check_model_styles.py. One check run per fixture file."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module", params=[("learners_hf", "LlamaForCausalLM"),
                                        ("learners_minimind", "MiniMindForCausalLM")])
def planted(request, tmp_path_factory):
    """The fixture checked as a copy in a folder of its own (no fixture folder put on sys.path)."""
    folder, name = request.param
    path = tmp_path_factory.mktemp("head") / "final_norm_missing.py"
    path.write_text((FIXTURES / folder / "final_norm_missing.py").read_text())
    return check_file(str(path), only=["gpt"]), name


def test_final_norm_missing_is_quoted_where_the_head_meets_the_stream(planted):
    result, name = planted
    (comp,) = [c for c in result.components if c.name == name]
    assert comp.status == "fail", format_report(result)
    (finding,) = comp.findings
    assert (finding.name, finding.code) == ("final_norm_missing", "logits = self.lm_head(hidden_states)"), \
        format_report(result)
