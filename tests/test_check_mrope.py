"""Multimodal rotary positions (M-RoPE, as Qwen2-VL writes them; tests/fixtures/learners_mrope/): the
sections that cut each half of a head among three position streams, a config field or a module
constant, tie the file's head width; check fits them to its narrower heads (with equal streams the
cut changes no output). The rotary module takes position_ids (3, B, T) and the attention its tables
(3, B, T, Dh): both are handed three equal streams, as for text. Each correct file PASSes with every
component checked; each plant FAILs named at its line."""

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.sections import fitted

FIXTURES = Path(__file__).parent / "fixtures" / "learners_mrope"
PLANTS = {"config_sections_sign": ("Attention", "rope_rotation_sign", "return torch.cat([x2, -x1], dim=-1)"),
          "module_sections_base": ("RotaryEmbedding", "rope_wrong_base",
                                   "self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 1, "
                                   "dtype=torch.float32)[: dim // 2] / dim))")}


@pytest.fixture(scope="module", params=["config_sections", "module_sections", *PLANTS])
def checked(request):
    return request.param, check_file(str(FIXTURES / f"{request.param}.py"))


def test_sections_fitted_and_position_streams_handed(checked):
    name, result = checked
    by_name = {c.name: c for c in result.components}
    assert len(by_name) == 2 and result.error is None, format_report(result)
    if name not in PLANTS:
        assert {c.status for c in by_name.values()} == {"pass"}, format_report(result)
        return
    component, finding, line = PLANTS[name]
    others = {c.status for n, c in by_name.items() if n != component}
    assert others == {"pass"} and by_name[component].status == "fail", format_report(result)
    assert [(f.name, f.code) for f in by_name[component].findings] == [(finding, line)], format_report(result)


def test_sections_keep_their_proportions_largest_remainders_first():
    assert fitted([2, 1, 1], 2) == [1, 1, 0] and fitted([16, 24, 24], 32) == [8, 12, 12]
    assert fitted([2, 2, 2], 2) == [1, 1, 0] and sum(fitted([3, 5], 7)) == 7
