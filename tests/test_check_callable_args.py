"""A constructor argument that is a callable is filled (core/callables.py): an init function with the
default the file gives an argument of that name in another signature, else a neutral one of its kind
(a normal init, nn.LayerNorm for a norm-layer factory), said in a note.

An MLP handed two init functions whose projections return their bias apart for the caller to add
(Megatron's skip_bias_add: fingerprint.first_tensor adds it); a pre-norm block handed a norm_layer
factory; a sequence-first attention handed an init function, its q/k/v fused per head (its layout found
with the input driven sequence-first) and its mask, True = masked, filled in a helper method
(context._fills_where_true). Each passes and a planted copy FAILs at its planted line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component, planted_copy

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_callable_args"
# file -> (kind, component, the note its callable gets, the planted edit (old, new))
FORMS = {
    "init_mlp": ("ffn", "MLP", "init_method = xavier_normal_: the default your file gives it", (
        "h = F.gelu(h + h_bias)", "h = F.gelu(h - h_bias)")),
    "norm_factory_block": ("block", "Block", "norm_layer: nn.LayerNorm, a neutral one", (
        "x = x + self.attention(self.norm1(x))", "x = self.attention(self.norm1(x))")),
    "time_first_attention": ("mha", "SelfAttention", "init_method: a normal init of std 0.02", (
        "/ math.sqrt(self.head_dim)", "/ self.head_dim")),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("callable_args")
    out = {}
    for name, (kind, _, _, edit) in FORMS.items():
        planted = planted_copy(folder, f"{name}_planted", FIXTURES / f"{name}.py", edit)
        out[name] = check_file(str(FIXTURES / f"{name}.py"), only=[kind])
        out[f"{name}_planted"] = check_file(planted, only=[kind])
    return out


@pytest.mark.parametrize("name", FORMS)
def test_a_callable_argument_is_filled_said_and_passes(results, name):
    c = component(results[name], FORMS[name][1])
    assert c.status == "pass", (c.status, c.error)
    assert any(FORMS[name][2] in note["en"] for note in c.notes), c.notes


@pytest.mark.parametrize("name", FORMS)
def test_its_planted_copy_fails_at_the_planted_line(results, name):
    c = component(results[f"{name}_planted"], FORMS[name][1])
    source = (FIXTURES / f"{name}.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if FORMS[name][3][0] in text)
    assert c.status == "fail", (c.status, c.error)
    # a projection whose bias is apart is compared without it: its line may be quoted as the departure
    quoted = {line, line - 1} if name == "init_mlp" else {line}
    assert len(c.findings) == 1 and c.findings[0].line in quoted, c.findings
