"""A config's special ids are kept inside check's vocabulary (core/special_config_ids.py).

A config class that gives the special ids of its real vocabulary (pad_token_id=50283 beside
vocab_size=50368; a dataclass's padding_idx=32001) is built at check's small vocabulary with each such
id moved to the vocabulary's last ids, so `nn.Embedding(vocab_size, d, padding_idx=...)` builds and the
model is graded: a keyword config and a dataclass config both pass
(tests/fixtures/learners_config_ids/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.special_config_ids import special_ids_within

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_config_ids"


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FOLDER / name), only=["gpt"]) for name in ("kwargs_config.py", "dataclass_config.py")}


@pytest.mark.parametrize("name", ["kwargs_config.py", "dataclass_config.py"])
def test_a_model_whose_config_pads_past_checks_vocabulary_builds_and_passes(results, name):
    c = component(results[name], "TinyLM")
    assert c.status == "pass", format_report(results[name])


def test_special_ids_keep_their_order_at_the_vocabularys_end():
    defaults = {"vocab_size": 50368, "pad_token_id": 50283, "cls_token_id": 50281, "sep_token_id": 3}
    assert special_ids_within(defaults, {"vocab_size": 29}) == {"cls_token_id": 27, "pad_token_id": 28}
    assert special_ids_within(defaults, {}) == {}
