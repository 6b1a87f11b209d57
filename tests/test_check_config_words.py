"""A config the learner's constructor reads is filled from its fields' words (core/discovery.py size_of,
core/own_defaults.py flags), in any form the code reads it, and a frozen dataclass is built, not
assigned to (discovery._with_values).

An argparse namespace (fairseq's args.encoder_embed_dim, args.encoder_normalize_before read in an if)
and a dict (cfg["enc_embed_dim"], cfg["pre_norm"]) of encoder layers; a frozen dataclass (width,
num_heads) and a plain one (model_width) of decoder blocks. Each correct file passes and a planted copy
FAILs at its planted line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component, planted_copy

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_config_words"
# file -> (kind, component, the planted edit (old, new))
FORMS = {
    "namespace_layer": ("encoder_layer", "EncoderLayer", (
        "scores = q @ k.transpose(-2, -1) / (D // H) ** 0.5", "scores = q @ k.transpose(-2, -1) / D ** 0.5")),
    "dict_layer": ("encoder_layer", "EncoderLayer", (
        "/ math.sqrt(D // self.heads)", "/ math.sqrt(D)")),
    "frozen_block": ("block", "Block", (
        "x = x + self.attend(self.attn_norm(x))", "x = self.attend(self.attn_norm(x))")),
    "plain_block": ("block", "Block", (
        "x = x + self.attend(self.attn_norm(x))", "x = self.attend(self.attn_norm(x))")),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("config_words")
    out = {}
    for name, (kind, _, edit) in FORMS.items():
        planted = planted_copy(folder, f"{name}_planted", FIXTURES / f"{name}.py", edit)
        out[name] = check_file(str(FIXTURES / f"{name}.py"), only=[kind])
        out[f"{name}_planted"] = check_file(planted, only=[kind])
    return out


@pytest.mark.parametrize("name", FORMS)
def test_a_config_read_by_its_words_is_filled_and_passes(results, name):
    c = component(results[name], FORMS[name][1])
    assert c.status == "pass", (c.status, c.error)


@pytest.mark.parametrize("name", FORMS)
def test_its_planted_copy_fails_at_the_planted_line(results, name):
    c = component(results[f"{name}_planted"], FORMS[name][1])
    assert c.status == "fail", (c.status, c.error)
    assert [f.line for f in c.findings] == [_line(name)], c.findings


def _line(name: str) -> int:
    """The 1-based line of the planted edit (it keeps the lines in place)."""
    source = (FIXTURES / f"{name}.py").read_text().splitlines()
    return next(i for i, text in enumerate(source, 1) if FORMS[name][2][0] in text)


@pytest.mark.parametrize("pad", [0, 1, 3])
def test_a_table_whose_rows_start_after_the_padding_row_is_read_from_there(pad):
    """fairseq's sinusoidal table: the row of its padding index zero, its positions from the row after."""
    from torch import nn

    from handformer.check.reference import variants as V
    from handformer.check.runners.model import MAX_LEN, D, _table

    table = V.sinusoidal(MAX_LEN + pad + 1, D, layout="t2t").float()  # (L, D): [sin | cos]
    table[pad] = 0
    module = nn.Module()
    module.register_buffer("weights", table)
    read = _table(module)
    assert read is not None and (read - table[pad + 1:pad + 1 + MAX_LEN].double()).abs().max() == 0
