"""What check's reference has no place for is no evidence (core/unmapped.py, core/rope_tables.py).

- Parameters that no reference weight took (LayerScale's vectors in a block, a learned temperature a
  head in an attention): at values other than ones and zeros, an unnamed departure of that component is
  NOT CHECKED naming them, and a mistake's name found there is dropped (a temperature of 2 is the
  missing 1/sqrt(d_k) at head width 4); held at ones, the component is graded as it is built, and a
  catalogued mistake FAILs named, as it does in a component beside one that holds them.
- QK-norm with partial rotary, (cos, sin) handed in: a LayerNorm a head on a fused [q | k | v] per head,
  and an RMSNorm over the whole width on separate projections. The tables for the turned part are
  tried in the plain shapes at every width before GPT-J's (sin, cos): read the other way round, they
  reproduced rope_rotation_sign exactly. Both pass; a rotation written the wrong way, or no scaling,
  FAILs named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
FILES = {
    "learners_unmapped_params/layer_scale.py": ["block", "gpt"],
    "learners_unmapped_params/layer_scale_no_scaling.py": ["causal_attention", "gpt"],
    "learners_unmapped_params/head_temperature.py": ["mha"],
    "learners_unmapped_params/head_temperature_two.py": ["mha"],
    "learners_unmapped_params/head_temperature_no_scaling.py": ["mha"],
    "learners_qk_norm_rotary/fused_layernorm.py": ["mha"],
    "learners_qk_norm_rotary/fused_layernorm_sign.py": ["mha"],
    "learners_qk_norm_rotary/whole_width_rmsnorm.py": ["mha"],
    "learners_qk_norm_rotary/whole_width_rmsnorm_no_scaling.py": ["mha"],
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kinds in FILES.items():
        result = check_file(str(FIXTURES / name), only=kinds)
        out[name.rpartition("/")[2]] = ({c.kind: c for c in result.components}, format_report(result))
    return out


def test_parts_no_reference_weight_took_make_an_unnamed_departure_not_checked(results):
    parts, report = results["head_temperature_two.py"]
    assert {k: c.status for k, c in parts.items()} == dict.fromkeys(parts, "not_checked"), report
    for c in parts.values():
        assert "computes something handformer's reference cannot express: it holds" in c.error.message
        assert "没有这些参数" in c.error.message_zh and not c.findings
    assert "temperature (4,)" in parts["mha"].error.message


def test_layer_scale_gains_are_folded_into_the_output_projections(results):
    """LayerScale's gamma_1 / gamma_2 (per-channel gains on the residual branches) are read as gains
    (gains.py) and folded into the projections they follow: the block and the model are compared."""
    parts, report = results["layer_scale.py"]
    assert {k: c.status for k, c in parts.items()} == dict.fromkeys(parts, "pass"), report


def test_held_at_ones_it_is_graded_as_built_and_a_named_mistake_fails(results):
    parts, report = results["head_temperature.py"]
    assert parts["mha"].status == "pass", report
    assert any("it holds temperature (4,)" in n["en"] for n in parts["mha"].notes), report
    parts, report = results["head_temperature_no_scaling.py"]
    assert [(f.name, f.line) for f in parts["mha"].findings] == [("no_scaling", 27)], report


def test_a_named_mistake_beside_the_held_parts_still_fails(results):
    parts, report = results["layer_scale_no_scaling.py"]
    assert [(f.name, f.line) for f in parts["causal_attention"].findings] == [("no_scaling", 34)], report
    assert parts["gpt"].status == "fail", report  # its gains folded: the model departs by the scores


@pytest.mark.parametrize("name", ["fused_layernorm.py", "whole_width_rmsnorm.py"])
def test_qk_norm_with_partial_rotary_passes(results, name):
    parts, report = results[name]
    assert parts["mha"].status == "pass", report
    assert any("on the first 2 dims of each head" in n["en"] for n in parts["mha"].notes), report


@pytest.mark.parametrize(("name", "mistake"), [("fused_layernorm_sign.py", "rope_rotation_sign"),
                                              ("whole_width_rmsnorm_no_scaling.py", "no_scaling")])
def test_qk_norm_with_partial_rotary_plants_fail_named(results, name, mistake):
    parts, report = results[name]
    assert parts["mha"].status == "fail" and mistake in [f.name for f in parts["mha"].findings], report
