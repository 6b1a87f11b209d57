"""`handformer check` quotes the line a learner wrote wrong, named where the catalogue has the mistake:
a projection left out where the heads come back (`out = self.dropout(out)`), a gate on the numbered
up branch (fc2), a sinusoidal exponent doubled, AdamW's step size that is the rate alone, a top-p fill
of 0.0, an in-place fill of 0 under torch.inference_mode, a softmax over the batch in a loop that keeps
a tensor of ones, `is_causal=False` in nanoGPT's fused path (the causal mask missing, not a
masked_fill thrown away), a BPE merge whose result is never assigned, a scale bound in __init__ as
head_dim**-1, rotary frequencies without their reciprocal. One check run per fixture file, each
component of it planted with one mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def _run(style: str):
    path = FIXTURES / style / "planted.py"
    result = check_file(str(path))
    lines = path.read_text().splitlines()
    return result, lines, format_report(result)


@pytest.fixture(scope="module")
def lecture():
    return _run("learners_lecture_mix")


@pytest.fixture(scope="module")
def sampling():
    return _run("learners_sampling_loops")


@pytest.fixture(scope="module")
def attention():
    return _run("learners_llama_attention")


def _finding(result, component: str):
    (comp,) = [c for c in result.components if c.name == component]
    assert comp.status == "fail", comp
    (finding,) = comp.findings
    return finding


def _quotes(lines: list[str], finding, planted: str) -> bool:
    """The finding's line is the one that holds `planted` (its code may quote a second line after it)."""
    return planted in lines[finding.line - 1] and planted in finding.code


@pytest.mark.parametrize("component, name, planted", [
    ("SwiGLU", "gated_activation_wrong_branch", "gate * F.silu(up)"),
    ("PositionalEncoding", "pe_wrong_frequency", "div = torch.exp(2 * torch.arange"),
    ("AdamW", "adamw_no_bias_correction", "step_size = lr"),
])
def test_a_lecture_file_s_mistakes_are_named_at_their_lines(lecture, component, name, planted):
    result, lines, report = lecture
    finding = _finding(result, component)
    assert finding.name == name and _quotes(lines, finding, planted), report


def test_the_missing_projection_quotes_the_return_and_the_line_that_lost_it(lecture):
    result, _, report = lecture
    finding = _finding(result, "MultiHeadAttention")
    assert (finding.line, finding.code) == (50, "return out / line 49: out = self.dropout(out)"), report


@pytest.mark.parametrize("component, name, planted", [
    ("TopPWarper", "filter_fill_finite", "masked_fill(remove, 0.0)"),
    ("generate", "filter_fill_finite", "logits[logits < v[:, [-1]]] = 0"),  # in place, inference_mode
    ("sample", "sampling_softmax_wrong_dim", "F.softmax(scores, dim=0)"),  # after `torch.ones(B)`
])
def test_sampling_mistakes_are_named_at_their_lines(sampling, component, name, planted):
    result, lines, report = sampling
    finding = _finding(result, component)
    assert finding.name == name and _quotes(lines, finding, planted), report


@pytest.mark.parametrize("component, name, planted", [
    ("Attention", "scale_by_dk", "self.scale = self.head_dim**-1"),  # bound in __init__, used later
    ("RotaryAttention", "rope_wrong_base", "inv_freq = 10000 **"),  # the reciprocal left out
])
def test_attention_mistakes_are_named_where_their_values_are_bound(attention, component, name, planted):
    result, lines, report = attention
    finding = _finding(result, component)
    assert finding.name == name and _quotes(lines, finding, planted), report


@pytest.mark.parametrize("style, component, name, planted", [
    ("learners_flash_attention", "CausalSelfAttention", "causal_mask_missing", "is_causal=False"),
    ("learners_minbpe_discard", "BasicTokenizer", "bpe_counts_not_updated", "merge(ids, pair, idx)"),
])
def test_a_one_component_file_s_mistake_is_named_at_its_line(style, component, name, planted):
    result, lines, report = _run(style)
    finding = _finding(result, component)
    assert finding.name == name and _quotes(lines, finding, planted), report


def test_rotary_positions_from_zero_are_quoted_where_they_are_made():
    """A model whose positions index its rotary table from 0 on every call (`pos = torch.arange(seqlen)`,
    `self.freqs_cos[pos]`) is quoted there, not at a slice of its generate loop below it."""
    from handformer.check.core.source import locate

    lines = [(10, "        pos = torch.arange(seqlen, device=input_ids.device)"),
             (11, "        freqs_cos, freqs_sin = self.freqs_cos[pos], self.freqs_sin[pos]"),
             (30, "            logits, _ = self(generated[:, -self.args.max_seq_len:])")]
    assert locate("rope_no_offset", lines)[0] == 10
    assert locate("rope_no_offset", [(5, "cos = self.cos[:seqlen]"), *lines])[0] == 5
