"""A learner's file inside a package that imports its siblings relatively (LLMs-from-scratch's
`from .ch03 import MultiHeadAttention`) is checked as a module of that package, not left NOT CHECKED."""

from __future__ import annotations

import pytest

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")

PARTS = '''import torch.nn.functional as F


def activation(x):
    return F.relu(x)
'''

FFN = '''import torch.nn as nn

from .parts import activation


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(activation(self.linear1(x)))
'''


def test_a_relative_import_resolves_in_its_package(tmp_path):
    package = tmp_path / "course_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text(PARTS)
    (package / "ffn.py").write_text(FFN)
    result = check_file(str(package / "ffn.py"))
    assert result.error is None and not result.skipped, result
    (comp,) = result.components
    assert comp.kind == "ffn" and comp.status == "pass", comp
