"""Learned positions kept as one bare nn.Parameter on the model (fixtures/learners_position_tables/):
a (1, block_size, D) table sliced and added to the token embeddings, and a (max_len, D) one read into
a local name and then added. Whatever its name, the table the forward adds is mapped as the position
embedding, so the correct models pass (and a beam search taking a list prompt is driven through
them); a planted mistake FAILs at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handformer.check.core.engine import check_file
from handformer.check.core.position_tables import position_tables
from handformer.check.core.report import format_report
from handformer.check.core.stacked import described

HERE = Path(__file__).parent / "fixtures" / "learners_position_tables"


def _check(name: str, only: list[str]):
    return check_file(str(HERE / name), only=only)


@pytest.fixture(scope="module")
def gpt_param():
    return _check("gpt_param.py", ["gpt"])


@pytest.fixture(scope="module")
def final_norm_skipped():
    return _check("gpt_param_final_norm_skipped.py", ["gpt"])


@pytest.fixture(scope="module")
def table_2d():
    return _check("table_2d.py", ["gpt", "beam_search"])


@pytest.fixture(scope="module")
def shifted():
    return _check("table_2d_shifted.py", ["gpt"])


def _line(text: str, result) -> int:
    return next(n for n, line in enumerate(Path(result.path).read_text().splitlines(), 1) if text in line)


def test_a_1_t_d_parameter_is_the_position_embedding(gpt_param):
    (model,) = gpt_param.components
    assert model.status == "pass", format_report(gpt_param)
    assert "pos_emb -> position embedding" in model.mapping, model.mapping


def test_the_final_norm_skipped_is_named_at_its_line(final_norm_skipped):
    (model,) = final_norm_skipped.components
    found = [(f.name, f.line) for f in model.findings]
    line = _line("return self.head(x)", final_norm_skipped)
    assert model.status == "fail" and ("final_norm_missing", line) in found, format_report(final_norm_skipped)


def test_a_t_d_parameter_added_through_a_name_passes_and_drives_the_beam_search(table_2d):
    status = {c.name: c.status for c in table_2d.components}
    assert status == {"LanguageModel": "pass", "beam_search": "pass"}, format_report(table_2d)
    model = next(c for c in table_2d.components if c.name == "LanguageModel")
    assert "position_table -> position embedding" in model.mapping, model.mapping


def test_positions_read_one_row_late_fail_at_their_line(shifted):
    (model,) = shifted.components
    found = [(f.name, f.line) for f in model.findings]
    assert model.status == "fail" and ("departs", _line("where = self.position_table", shifted)) in found, \
        format_report(shifted)


class _ScoreBias(torch.nn.Module):
    """An attention that adds a learned (T, T) bias to its scores: not a position table."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.bias = torch.nn.Parameter(torch.zeros(8, 8))

    def forward(self, x):
        T = x.size(1)
        return (self.proj(x) @ x.transpose(1, 2) + self.bias[:T, :T]).softmax(-1) @ x


def test_a_score_bias_of_an_attention_is_no_position_table():
    sub = _ScoreBias()
    assert position_tables(sub, dict(sub.named_parameters(recurse=False))) == {}


@pytest.fixture(scope="module")
def beam_unsummed():
    return _check("table_2d_beam_unsummed.py", ["beam_search"])


def test_a_search_ranking_by_the_new_token_alone_is_named_at_its_line(beam_unsummed):
    (search,) = beam_unsummed.components
    found = [(f.name, f.line) for f in search.findings]
    line = _line("keys = logp", beam_unsummed)
    assert ("beam_scores_not_accumulated", line) in found, format_report(beam_unsummed)


class _Prepends(torch.nn.Module):
    """A classifier's front: a [CLS] vector (1, 1, D) put before the token embeddings, through a name
    (`named`) or directly."""

    def __init__(self, named: bool) -> None:
        super().__init__()
        self.named = named
        self.embed = torch.nn.Embedding(10, 8)
        self.cls_vector = torch.nn.Parameter(torch.zeros(1, 1, 8))
        self.gamma = torch.nn.Parameter(torch.ones(1, 1, 8))

    def forward(self, ids):
        x = self.embed(ids) * self.gamma
        if self.named:
            front = self.cls_vector.expand(ids.size(0), -1, -1)
            return torch.cat((front, x), dim=1)
        return torch.cat([self.cls_vector.expand(ids.size(0), 1, 8), x], 1)


@pytest.mark.parametrize("named", [True, False])
def test_a_cls_vector_put_in_front_is_named_so(named):
    sub = _Prepends(named)
    en, zh = described(sub, dict(sub.named_parameters(recurse=False)))
    assert en.startswith("a learned [CLS] vector (cls_vector (1, 1, 8))") and "gamma" not in en, en
    assert "[CLS]" in zh, zh
