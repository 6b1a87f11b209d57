"""`handformer check` on the numbers a model takes from its settings (Granite's multipliers, Cohere's
logit scale, Gemma 2's query_pre_attn_scalar): read as conventions where the constructor sets them from
a setting and the forward reads them, never where a constant nobody configured stands; (cos, sin)
tables handed in the pairing the code rotates by (pairs (2j, 2j+1), Cohere's). One correct file passes,
its plants fail at their lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.score_scale import configured_scales, model_factors

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_multipliers"


@pytest.fixture(scope="module")
def checked():
    """The correct file checked once, and the most mistakes each of its components' searches looked
    for (fp.search's max_flags, by the kind being checked when it was called)."""
    import handformer.check.core.fingerprint as fp

    kind, most, search = [""], {}, fp.search

    def counted(*args):
        most.setdefault(kind[0], []).append(args[4])
        return search(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp, "search", counted)
        result = check_file(str(HERE / "configured.py"), started=lambda step, k: kind.__setitem__(0, k))
    return result, most


@pytest.fixture(scope="module")
def correct(checked):
    return checked[0]


def test_configured_multipliers_and_paired_tables_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert set(status.values()) == {"pass"} and len(status) == 5, format_report(correct)
    model = next(c for c in correct.components if c.kind == "gpt")
    for said in ("scores times 0.1", "token embeddings times 6", "logits times 0.25"):
        assert said in model.convention["en"], model.convention
    block = next(c for c in correct.components if c.kind == "block")
    assert any("each sublayer's output times 0.5" in n["en"] for n in block.notes)


@pytest.mark.parametrize(("old", "new", "kind", "line"), [
    # the scale a constant nobody configured: the same number, no setting read
    ("self.multiplier = s.score_multiplier", "self.multiplier = 0.1", "causal_attention", 52),
    ("x = x + self.mlp(rms(x)) * self.branch_multiplier", "x = x + self.mlp(rms(x))", "block", 92),
    ("return self.head(rms(x)) / self.s.logits_scaling", "return self.head(rms(x)) * self.s.logits_scaling",
     "gpt", 112),
])
def test_each_configured_plant_fails_at_its_line(tmp_path, old, new, kind, line):
    result = check_file(edited_copy(tmp_path, HERE / "configured.py", [(old, new)]), only=[kind])
    report = format_report(result)
    assert [c.status for c in result.components] == ["fail"], report
    assert f"line {line}: {new.strip()}" in report, report


def test_only_a_setting_that_is_no_size_is_a_configured_scale():
    spec = importlib.util.spec_from_file_location("learner_scales", HERE / "scales.py")
    scales = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scales)
    config = scales.Config()
    assert configured_scales(scales.FromMultiplier(config)) == (0.02,)  # its dropout is no factor
    assert configured_scales(scales.FromRoot(config)) == (0.02 ** 0.5,)
    # sizes and constants are no setting: 1 / sqrt(head_dim), 1 / hidden_size, Gemma 2's
    # query_pre_attn_scalar (check sets it to the head's width), 0.02 written out
    for cls in (scales.FromHeadDim, scales.FromWidth, scales.FromScalar, scales.WrittenOut):
        assert configured_scales(cls(config)) == (), cls.__name__
    config.logits_scaling = 8.0  # a config it holds, read by its forward: Granite's divisor
    assert model_factors(scales.HeldConfig(config)) == [0.125]


def test_a_block_holding_attention_sinks_is_compared_with_them():
    """gpt-oss's sinks, (H,) logits named sinks: handformer's SinkAttention holds them, the block passes."""
    result = check_file(str(HERE / "sinks.py"), only=["block"])
    block = result.components[0]
    assert block.status == "pass" and "self_attn.sinks -> sinks" in block.mapping, format_report(result)


def test_a_configured_scale_spares_the_attention_search_its_pairs(checked):
    """Granite's attention_multiplier explains the attention with no mistake: the search for a pair of
    mistakes in each (rotary layout, mask convention), its costliest round, is never run."""
    result, most = checked
    (attention,) = [c for c in result.components if c.kind == "causal_attention"]
    assert attention.status == "pass", format_report(result)
    assert any("scaled by 0.1" in note["en"] for note in attention.notes), format_report(result)
    assert most["causal_attention"] and 2 not in most["causal_attention"], most
