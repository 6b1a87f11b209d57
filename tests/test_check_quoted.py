"""A FAIL quotes the line that was planted: a catalogued mistake whose patterns point elsewhere is
placed where the computation departs, and a mistake no catalogue names is a `departs` finding with
that line. One fixture (tests/fixtures/learners_quoted/correct.py), a small decoder-only model whose
names no pattern expects; each plant edits one line of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report, to_json
from handformer.check.core.result import DEPARTS, FileResult

CORRECT = Path(__file__).parent / "fixtures" / "learners_quoted" / "correct.py"
PLANTS = {  # (the line, as planted; the failing components -> the finding each names)
    # no pattern of no_residual's fits these names but `normal_(` in the model's init: the block's run
    # departs at the planted line, and the model inherits the block's finding
    "no_residual": (("h = h + self.expand(self.pre_expand(h))", "h = self.expand(self.pre_expand(h))"),
                    {"Block": "no_residual", "TinyGPT": "no_residual"}),
    # the scores scaled by 1/d_k**0.25: no known mistake; the attention, the block and the model quote it
    "unnamed_scale": (("(w // self.n_heads) ** -0.5", "(w // self.n_heads) ** -0.25"),
                      {"CausalAttention": DEPARTS, "Block": DEPARTS, "TinyGPT": DEPARTS}),
}


def test_the_correct_model_passes():
    result = check_file(str(CORRECT))
    assert [c.status for c in result.components] == ["pass"] * 4, format_report(result)


@pytest.mark.parametrize("plant", list(PLANTS))
def test_each_failing_component_quotes_the_planted_line(tmp_path, plant):
    (old, new), failing = PLANTS[plant]
    source = CORRECT.read_text()
    assert source.count(old) == 1
    path = tmp_path / "learner.py"
    path.write_text(source.replace(old, new))
    line = next(i + 1 for i, text in enumerate(path.read_text().splitlines()) if new in text)
    result = check_file(str(path))
    report = format_report(result)
    assert {c.name: [f.name for f in c.findings] for c in result.components if c.status == "fail"} == {
        name: [finding] for name, finding in failing.items()}, report
    data = json.loads(to_json(result))  # the JSON a grader reads: one line, the planted one
    assert all([f["line"] for f in c["findings"]] == [line] for c in data["components"] if c["findings"]), report
    if DEPARTS in failing.values():
        assert f"x {DEPARTS}: no known mistake reproduces it" in report and "d_k**0.25" in report, report


def test_an_error_under_the_mode_that_reads_cuda_as_the_cpu_is_the_learners(tmp_path):
    """A file that names a "cuda" device runs under CudaAsCpu, a torch function mode of handformer's
    under every torch call: a shape error at their line is their exception (a FAIL quoting the
    line), not a stand-in's refusal (NOT CHECKED)."""
    import importlib.util

    import torch

    from handformer.check.core.cpu_only import CudaAsCpu
    from handformer.check.core.source import learner_error

    path = tmp_path / "learner.py"
    path.write_text("def scores(q, k):\n    return q @ k  # k not transposed\n")
    spec = importlib.util.spec_from_file_location("learner_cuda", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with CudaAsCpu(), pytest.raises(RuntimeError) as raised:
        module.scores(torch.ones(2, 3), torch.ones(2, 3))
    error = learner_error(raised.value, str(path), "forward")
    assert (error.kind, error.traceback) == ("exception", ["line 2, in scores: return q @ k  # k not transposed"])


# small files of one component each, a planted line marked `# planted`: the failing component quotes it
ONE_COMPONENT = {
    # a float32 cast written for half precision keeps check's float64: the mistake's large output (a mean
    # square, not its root, divides) is still reproduced and named at its line
    "rmsnorm_no_sqrt": ("import torch\nfrom torch import nn\n\n\nclass RMSNorm(nn.Module):\n"
                        "    def __init__(self, d_model, eps=1e-5):\n        super().__init__()\n"
                        "        self.eps = eps\n        self.weight = nn.Parameter(torch.ones(d_model))\n\n"
                        "    def forward(self, x):\n        x = x.to(torch.float32)\n"
                        "        rms = x.pow(2).mean(dim=-1, keepdim=True) + self.eps  # planted\n"
                        "        return x / rms * self.weight\n"),
    # rows whose keys are all masked come out NaN (a file that never pads: noted, not a mistake); the
    # scores scaled by the query length still depart, at their line
    DEPARTS: ("import math\n\nimport torch\n\n\ndef attention(q, k, v, mask=None):\n"
              "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-2))  # planted\n"
              "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
              "    return torch.softmax(scores, dim=-1) @ v\n"),
}


@pytest.mark.parametrize("name", list(ONE_COMPONENT))
def test_a_one_component_file_quotes_its_planted_line(tmp_path, name):
    path = tmp_path / "learner.py"
    path.write_text(ONE_COMPONENT[name])
    line = next(i + 1 for i, text in enumerate(ONE_COMPONENT[name].splitlines()) if "# planted" in text)
    result = check_file(str(path))
    (comp,) = result.components
    assert comp.status == "fail" and [(f.name, f.line) for f in comp.findings] == [(name, line)], format_report(result)


def test_positions_counted_from_one_are_quoted_where_they_are_built(tmp_path):
    """The ids of the positions are made from no input (a constant): the model's run records them
    too, and the line that builds them departs (plus a constant 1), not the embedding that reads them
    (an IndexError at the longest input keeps only the frame where it raised: two lines at most)."""
    source = (Path(__file__).parent / "fixtures" / "learners_gpt" / "correct.py").read_text()
    old, new = "pos = torch.arange(0, T, dtype", "pos = torch.arange(1, T + 1, dtype"
    assert source.count(old) == 1
    path = tmp_path / "learner.py"
    path.write_text(source.replace(old, new))
    line = next(i + 1 for i, text in enumerate(path.read_text().splitlines()) if new in text)
    (model,) = check_file(str(path), only=["gpt"]).components
    data = json.loads(to_json(FileResult(str(path), [model])))["components"][0]
    lines = {f["line"] for f in data["findings"]} | {int(t.split(",")[0][5:]) for t in
                                                      (data["error"] or {}).get("traceback", [])}
    assert model.status == "fail" and line in lines and len(lines) <= 2, format_report(FileResult(str(path), [model]))
