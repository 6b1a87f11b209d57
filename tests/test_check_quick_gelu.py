"""The FFN activation a file's code shows (core/activations.py): quick_gelu, x * sigmoid(1.702 x),
OpenAI CLIP's, is tried on a file that writes it, as a module it holds (module.py, a GPT) or a
function it calls (function.py, a post-norm encoder layer); the reference then uses it, and the
report notes it. A QuickGELU module computing SiLU (module_silu.py) fails: the module its MLP builds
promises quick_gelu (runners/pieces.py, PROMISES)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handformer.check.core.activations import shown_in
from handformer.check.core.discovery import refine
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_quick_gelu"
KINDS = {"module.py": ["ffn", "block", "gpt"], "function.py": ["ffn", "encoder_layer"],
         "module_silu.py": ["ffn", "block"]}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kinds in KINDS.items():
        result = check_file(str(HERE / name), only=kinds)
        out[name] = ({c.kind: c.status for c in result.components}, format_report(result),
                     [(c.kind, f.name, f.line) for c in result.components for f in c.findings])
    return out


@pytest.mark.parametrize("name", ["module.py", "function.py"])
def test_a_quick_gelu_the_code_writes_is_the_reference(results, name):
    status, report, _ = results[name]
    assert status == dict.fromkeys(KINDS[name], "pass"), report
    assert "activation: quick_gelu" in report, report


def test_the_model_names_its_quick_gelu(results):
    assert "quick_gelu FFN" in results["module.py"][1]


def test_a_quick_gelu_module_computing_silu_fails_named(results):
    status, report, found = results["module_silu.py"]
    line = next(n for n, text in enumerate((HERE / "module_silu.py").read_text().splitlines(), 1)
                if "torch.sigmoid(x)" in text)
    assert status == {"ffn": "fail", "block": "fail"}, report
    assert ("ffn", "ffn_wrong_activation", line) in found, report


@pytest.mark.parametrize("source, shown", [
    ("return x * torch.sigmoid(1.702 * x)", ("quick_gelu",)), ("self.act = QuickGELU()", ("quick_gelu",)),
    ("h = F.gelu(h)", ())])
def test_an_activation_is_shown_by_its_constant_or_its_name(source, shown):
    assert shown_in(source) == shown


class TextImageModel(torch.nn.Module):  # CLIP's: token ids beside image features
    def forward(self, input_ids, image_embeds, return_loss=True):
        return input_ids


class AudioTextModel(torch.nn.Module):  # Whisper-like: features first named, ids after
    def forward(self, input_ids, audio_features):
        return input_ids


class TranslationModel(torch.nn.Module):  # an encoder-decoder: two sequences of token ids
    def forward(self, src, tgt, src_mask=None):
        return src


@pytest.mark.parametrize("cls, kind", [(TextImageModel, ""), (AudioTextModel, ""), (TranslationModel, "transformer")])
def test_a_model_of_ids_and_features_is_no_encoder_decoder(cls, kind):
    assert refine("gpt", cls) == kind
