"""`handformer check`: the correct learner file passes, every planted mistake gets its own diagnosis
and no other, random pairs of mistakes are both named, and broken learner files get a clear report.

The diagnosis tests run in this process (the fixtures are our own code); the sandbox tests start
child processes, so they share them (module-scoped) and exhaustive runs are marked slow.
"""

from __future__ import annotations

import difflib
import itertools
import json
from pathlib import Path

import pytest
import torch
from check_plants import (
    CORRECT,
    COVERING_PAIRS,
    HIDE_EVERY_QUERY,
    PLANTS,
    THREE_MISTAKES,
    correct_file,
    plant,
    planted_file,
    planted_source,
)

from handformer.check.core.discovery import find_components
from handformer.check.core.engine import check_file, import_learner
from handformer.check.core.report import exit_code, format_report, to_json
from handformer.check.core.result import FileResult, LearnerError
from handformer.check.core.sandbox import check_in_child
from handformer.check.reference import variants as V
from handformer.check.reference.diagnoses import CATALOG, EXCLUSIVE, MASKING
from handformer.cli import main
from handformer.cli.check import parse_components
from handformer.config import BlockConfig
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.blocks import DecoderLayer, EncoderLayer
from handformer.nn.positions import sinusoidal_table

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
EXPECTED_KINDS = ["causal_mask", "sdpa", "mha", "ffn", "ffn", "layernorm", "rmsnorm", "positional_encoding",
                  "encoder_layer", "decoder_layer", "block"]


def findings(result) -> set[str]:
    return {f.name for c in result.components for f in c.findings}


def assert_exactly(result, expected: set[str]) -> None:
    """Every named diagnosis is expected, every expected one is named, and every component either
    passes or is explained by a finding."""
    assert result.error is None, result.error
    assert findings(result) == expected, format_report(result)
    for c in result.components:
        assert c.error is None or c.findings, format_report(result)
        if not c.findings:
            assert c.status in ("pass", "differs"), format_report(result)


def test_correct_file_passes():
    result = check_file(str(CORRECT))
    assert [c.kind for c in result.components] == EXPECTED_KINDS
    assert all(c.status == "pass" for c in result.components), format_report(result)
    assert exit_code(result) == 0
    mha = next(c for c in result.components if c.kind == "mha")
    assert mha.mapping == ["w_q -> W_Q", "w_k -> W_K", "w_v -> W_V", "fc -> W_O"]
    assert mha.convention["en"].startswith("0/1 int")
    assert mha.max_abs_error < 1e-5


def test_fixture_files_are_the_plants_applied():
    for name in PLANTS:
        assert planted_file(name).read_text() == planted_source([name]), f"run python tests/check_plants.py ({name})"


def test_every_diagnosis_has_a_planted_file():
    planted = {d for p in PLANTS.values() for d in p.expected}
    assert planted == set(CATALOG), f"no plant for {set(CATALOG) - planted}, unknown {planted - set(CATALOG)}"


def edited_lines(name: str) -> set[int]:
    """The lines of a planted file that its edits wrote (for a deleted line, the two around it),
    not counting the docstring's line that names the plant."""
    p = PLANTS[name]
    old = correct_file(p.family).read_text().splitlines()
    new = planted_file(name).read_text().splitlines()
    out: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag != "equal":
            out |= set(range(j1 + 1, j2 + 1)) or {j1, j1 + 1}
    return {n for n in out if "planted mistake" not in new[n - 1]}


@pytest.fixture
def short_bpe_timing(monkeypatch):
    """A BPE trainer's mistakes are named on the fixture corpus; the timing corpus only times it (slow
    is not wrong: tests/test_check_bpe.py's), so here the trainer is stopped there after 0.1 s."""
    import handformer.check.runners.bpe as bpe

    monkeypatch.setattr(bpe, "CEILING", 0.1)


@pytest.mark.usefixtures("short_bpe_timing")
@pytest.mark.parametrize("name", list(PLANTS))
def test_planted_mistake_is_named(name):
    """Each planted mistake, its component checked alone (--component): its diagnosis and no other,
    the likely line (one the plant wrote), a measured observation, and the report in English and Chinese from one result."""
    p = PLANTS[name]
    result = check_file(str(planted_file(name)), only=[p.kind])
    if p.expected == {"nan_on_masked_rows"}:
        return assert_noted_at_planted_line(result, name)
    assert_exactly(result, p.expected)
    if not p.diagnosis:
        return
    assert exit_code(result) == 1
    finding = next(f for c in result.components for f in c.findings if f.name == p.diagnosis)
    assert finding.line is not None and finding.code, "the likely line is named"
    assert finding.line in edited_lines(name), ("not the planted line", finding.line, finding.code)
    assert any(ch.isdigit() for ch in finding.observed["en"]), "the observation has a number"
    d = CATALOG[p.diagnosis]
    en, zh = format_report(result, "en"), format_report(result, "zh")
    assert f"x {p.diagnosis}: {d.title['en']}" in en and finding.observed["en"] in en and d.fix["en"] in en
    assert f"x {p.diagnosis}：{d.title['zh']}" in zh and finding.observed["zh"] in zh and d.fix["zh"] in zh
    assert f"line {finding.line}: {finding.code}" in en and f"第 {finding.line} 行：{finding.code}" in zh


def assert_noted_at_planted_line(result, name: str) -> None:
    """NaN only on rows whose keys are all masked is what torch.nn's attention computes with -inf:
    DIFFERS, never FAIL, named in a note that quotes the planted line."""
    assert exit_code(result) == 0 and {c.status for c in result.components} == {"differs"}, format_report(result)
    notes = [n["en"] for c in result.components for n in c.notes if n["en"].startswith("nan_on_masked_rows")]
    assert any(f"line {n}:" in note for n in edited_lines(name) for note in notes), notes


def test_consistent_pre_norm_differs_by_design():
    result = check_file(str(planted_file("pre_norm_consistent")))
    layer = next(c for c in result.components if c.kind == "encoder_layer")
    assert layer.status == "differs" and layer.max_abs_error < 1e-5
    assert any("pre-norm" in n["en"] for n in layer.notes)
    assert exit_code(result) == 0


def pairs() -> list[tuple[str, str]]:
    """Every pair of planted mistakes of one fixture family with two different diagnoses, except the
    pairs docs/check.md lists as exclusive or as masking each other."""
    out = []
    for a, b in itertools.combinations([n for n in PLANTS if PLANTS[n].diagnosis], 2):
        da, db = PLANTS[a].diagnosis, PLANTS[b].diagnosis
        if PLANTS[a].family == PLANTS[b].family and da != db and frozenset({da, db}) not in EXCLUSIVE | MASKING.keys() \
                and frozenset({a, b}) not in {frozenset(p) for p in THREE_MISTAKES + HIDE_EVERY_QUERY}:
            out.append((a, b))
    return out


def check_pair(tmp_path: Path, a: str, b: str) -> None:
    path = tmp_path / f"{a}__{b}.py"
    path.write_text(planted_source([a, b]))
    assert_exactly(check_file(str(path), only=sorted({PLANTS[a].kind, PLANTS[b].kind})),
                   PLANTS[a].expected | PLANTS[b].expected)


def test_the_covering_pairs_name_every_diagnosis_once_at_least():
    named = {d for pair in COVERING_PAIRS for n in pair for d in PLANTS[n].expected}
    assert named == set(CATALOG), f"no covering pair names {set(CATALOG) - named}"
    every = {frozenset(pair) for pair in pairs()}
    assert all(frozenset(pair) in every for pair in COVERING_PAIRS), [p for p in COVERING_PAIRS if frozenset(p) not in every]


@pytest.mark.usefixtures("short_bpe_timing")
@pytest.mark.parametrize("pair", COVERING_PAIRS, ids="+".join)
def test_covering_pairs_of_mistakes_are_both_named(tmp_path, pair):
    check_pair(tmp_path, *pair)


@pytest.mark.slow
@pytest.mark.usefixtures("short_bpe_timing")
@pytest.mark.parametrize("pair", pairs(), ids="+".join)
def test_every_pair_of_mistakes_is_named(tmp_path, pair):
    check_pair(tmp_path, *pair)


def test_exclusive_and_masking_pairs_are_documented():
    doc = (ROOT / "docs" / "check.md").read_text()
    for pair in list(EXCLUSIVE) + list(MASKING):
        a, b = sorted(pair)
        assert f"`{a}` + `{b}`" in doc, f"docs/check.md must list {a} + {b}"
    for name in CATALOG:
        assert f"### `{name}`" in doc, f"docs/check.md must describe {name}"
    for a, b in THREE_MISTAKES + HIDE_EVERY_QUERY:
        assert f"`{a}` + `{b}`" in doc, f"docs/check.md must list the plants {a} + {b}"


def test_the_readmes_count_of_diagnoses_is_the_catalogues():
    for readme, phrase in (("README.md", "names {} classic mistakes"), ("README.zh.md", "能指出 {} 种常见错误")):
        assert phrase.format(len(CATALOG)) in (ROOT / readme).read_text(encoding="utf-8"), readme


def test_every_style_is_graded_with_the_tutorials_diagnoses():
    """The tutorials' attention, FFN, positional-encoding and decoder mistakes are planted in d2l's
    and nanoGPT's styles too (each named by test_planted_mistake_is_named)."""
    for family, expected in (
            ("d2l", {"no_scaling", "scale_by_dk", "softmax_wrong_dim", "mask_inverted", "kv_swapped",
                     "split_no_transpose", "concat_no_transpose", "no_output_projection", "ffn_no_activation",
                     "pe_sin_cos_swapped", "pe_wrong_frequency", "no_residual", "decoder_masks_swapped",
                     "causal_off_by_one", "mask_repeat_order"}),
            ("nanogpt", {"no_scaling", "kv_swapped", "softmax_wrong_dim", "concat_no_transpose",
                         "no_output_projection", "no_residual", "causal_off_by_one", "ffn_no_activation",
                         "mask_hides_queries", "causal_mask_not_cropped"})):
        planted = {p.diagnosis for p in PLANTS.values() if p.family == family}
        assert planted == expected, (family, planted ^ expected)


# --- the reference variants are anchored on handformer's own modules ------------------------------

def test_variants_without_mistakes_equal_handformer():
    torch.manual_seed(0)
    cfg = BlockConfig(d_model=16, n_heads=4, d_ff=40, dropout=0.0)
    enc, dec = EncoderLayer(cfg).double().eval(), DecoderLayer(cfg).double().eval()

    def mha(m: MultiHeadAttention) -> V.MHAWeights:
        lin = [(p.weight, p.bias) for p in (m.q_proj, m.k_proj, m.v_proj, m.o_proj)]
        return V.MHAWeights(*lin, n_heads=4)

    def norms(*ns):
        return [V.NormWeights(n.weight, n.bias, n.eps) for n in ns]

    ffn = V.FFNWeights((enc.ffn.up_proj.weight, enc.ffn.up_proj.bias),
                       (enc.ffn.down_proj.weight, enc.ffn.down_proj.bias))
    x, memory = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[1, ..., 4:] = False
    w = V.LayerWeights(mha(enc.self_attn), ffn, norms(enc.attn_norm, enc.ffn_norm))
    torch.testing.assert_close(V.encoder_layer(w, x, keep), enc(x, keep)[0], atol=1e-6, rtol=0)
    dffn = V.FFNWeights((dec.ffn.up_proj.weight, dec.ffn.up_proj.bias),
                        (dec.ffn.down_proj.weight, dec.ffn.down_proj.bias))
    dw = V.LayerWeights(mha(dec.self_attn), dffn, norms(dec.attn_norm, dec.cross_attn_norm, dec.ffn_norm),
                        mha(dec.cross_attn), sublayers=["attn", "cross", "ffn"])
    tgt = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    src = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    src[0, ..., 5:] = False
    torch.testing.assert_close(V.decoder_layer(dw, x, memory, src, tgt), dec(x, memory, self_mask=tgt, memory_mask=src)[0],
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(V.sinusoidal(20, 16), sinusoidal_table(20, 16).double(), atol=1e-6, rtol=0)


def test_every_mistake_changes_the_output():
    """A variant equal to the correct computation could never be told apart."""
    torch.manual_seed(0)
    lin = [(torch.randn(16, 16, dtype=torch.float64) / 4, torch.randn(16, dtype=torch.float64) / 5)
           for _ in range(4)]
    w = V.MHAWeights(*lin, n_heads=4)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    keep = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    correct = V.multi_head_attention(w, x, x, x, keep)[0]
    from handformer.check.core.context import ATTENTION_FLAGS, HEAD_FLAGS

    for flag in ATTENTION_FLAGS + HEAD_FLAGS:
        if flag == "nan_on_masked_rows":  # -inf for -1e9: it changes only rows that see no key
            continue
        out = V.multi_head_attention(w, x, x, x, keep, frozenset({flag}))[0]
        assert (out - correct).abs().max() > 1e-3, flag


# --- broken learner files, in the child process ---------------------------------------------------

BROKEN = """
import torch
import torch.nn as nn


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k)
    return torch.matmul(scores.softmax(-1), v)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.fc = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, q, k, v, mask=None):
        B, T, D = q.shape
        return self.w_q(q).view(B, T, self.h, -1).transpose(1, 2)


class FFN(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        raise RuntimeError("not finished")


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


class RMSNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        while True:
            x = x + 1


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        self.register_buffer("pe", torch.zeros(2 ** 31, 2))


class Attention(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        while True:
            pass


def generate(model, idx, max_new_tokens):
    while True:
        pass


def train_bpe(input_path, vocab_size, special_tokens):
    while True:
        counts = {}
"""
LIMIT = 1  # second a step of the broken file may run


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    """The sandbox on a file whose components break in every way (Attention named on the command line
    as causal self-attention): one run, a child process for each component that hangs or dies,
    shared by the tests below; the JSON as `handformer check --json` prints it."""
    path = tmp_path_factory.mktemp("broken") / "broken.py"
    path.write_text(BROKEN)
    result = check_in_child(str(path), {"causal_attention": "Attention"}, time_limit=LIMIT)
    assert exit_code(result) == 1, format_report(result)
    return result


@pytest.fixture(scope="module")
def broken(broken_run):
    return {c["name"]: c for c in json.loads(to_json(broken_run))["components"]}


def test_exception_in_forward_is_trimmed_to_the_learner_file(broken):
    err = broken["scaled_dot_product_attention"]["error"]
    assert err["kind"] == "exception" and err["where"] == "forward"
    assert err["message"].startswith("RuntimeError: ")
    assert err["traceback"] == ["line 7, in scaled_dot_product_attention: scores = torch.matmul(q, k)"]


def test_wrong_shape_is_reported(broken):
    err = broken["MultiHeadAttention"]["error"]
    assert "returned a tensor of shape (2, 4, 6, 4)" in err["message"] and "(B, T, D)" in err["message"]


def test_exception_in_init(broken):
    comp = broken["FFN"]  # their constructor raised on the arguments check gave it: not charged to them
    assert comp["status"] == "not_checked" and comp["error"]["where"] == "__init__"
    assert comp["adapter"] == "def make_ffn(d_model, d_ff):\n    return FFN(d_model=d_model, d_ff=d_ff)"
    assert comp["error"]["message"] == "RuntimeError: not finished"
    assert comp["error"]["traceback"] == ["line 27, in __init__: raise RuntimeError(\"not finished\")"]
    assert broken["FeedForward"]["status"] == "pass"


def test_infinite_loop_stops_at_the_limit_and_the_rest_still_runs(broken):
    err = broken["RMSNorm"]["error"]
    assert err["kind"] == "timeout" and f"{LIMIT:g} s of CPU time" in err["message"]
    assert err["message_zh"].startswith(f"在 RMSNorm 用了 {LIMIT:g} 秒 CPU 时间后被停止：死循环")  # --lang zh prints it
    assert err["traceback"] == ["line 46, in forward: x = x + 1"]


def test_huge_allocation_hits_the_memory_limit(broken):
    err = broken["PositionalEncoding"]["error"]
    assert err["kind"] == "memory" and err["where"] == "__init__"
    assert err["traceback"] == ['line 52, in __init__: self.register_buffer("pe", torch.zeros(2 ** 31, 2))']


def test_the_child_is_told_the_kind_each_component_is_checked_as(tmp_path):
    """What the sandbox's parent reports for a component that hangs or dies: the step and its kind
    come from the child, so a class named on the command line keeps the kind it was named for."""
    path = tmp_path / "mine.py"
    path.write_text(CORRECT.read_text().replace("class FFN(", "class Attention("))
    steps = []
    check_file(str(path), overrides={"ffn": "Attention"}, only=["ffn"], started=lambda *s: steps.append(s))
    assert steps == [("import", ""), ("Attention", "ffn")]
    kinds = [(c.kind, c.name) for c in find_components(import_learner(str(path)), {"ffn": "Attention"})]
    assert ("ffn", "Attention") in kinds and ("mha", "Attention") not in kinds  # not the mha it is named like


def test_a_component_named_on_the_command_line_keeps_its_kind_when_it_hangs(broken_run):
    """--component causal_attention=Attention: the report grades Attention (a name the tutorials use
    for multi-head attention) as causal self-attention, also when the child process has to be killed."""
    (comp,) = [c for c in broken_run.components if c.name == "Attention"]
    assert (comp.kind, comp.name, comp.status, comp.error.kind) == ("causal_attention", "Attention", "error",
                                                                    "timeout")
    assert "Attention (causal self-attention): ERROR" in format_report(broken_run).splitlines()


def test_a_generate_that_never_returns_ends_at_the_time_limit(broken_run):
    """In the child process: the report names generate, the time limit and the line it loops on."""
    (comp,) = [c for c in broken_run.components if c.name == "generate"]
    assert (comp.kind, comp.status, comp.error.kind) == ("generate", "error", "timeout")
    assert f"stopped after {LIMIT:g} s of CPU time in generate" in comp.error.message
    assert "max_new_tokens" in comp.error.message
    assert comp.error.traceback[-1] in ("line 64, in generate: pass", "line 63, in generate: while True:")


def test_a_runaway_bpe_trainer_is_stopped_in_the_child_and_named(broken_run):
    """The sandbox's step limit is the backstop of the BPE runner's own (tests/test_check_bpe.py)."""
    (comp,) = [c for c in broken_run.components if c.name == "train_bpe"]
    assert comp.status == "error" and comp.error.kind == "timeout" and comp.kind == "bpe"
    assert "never ends" in comp.error.message


ENDS_THE_PROGRAM = """
import os
import sys

import torch
import torch.nn as nn


def apply_temperature(logits, temperature):
    print("debugging", logits.shape, "x" * 10000)
    sys.exit(3)


def top_k_filter(logits, k):
    raise SystemExit("done here")


class RMSNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        print("norm of", x.shape)
        return torch.sqrt(x) * self.weight  # the square root of negative inputs


class LayerNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        os._exit(0)
"""


def test_prints_sys_exit_os_exit_and_nan_fail_a_component_never_the_grader(tmp_path, capsys):
    """Through the command line, as a classroom runs it: the learner's prints do not reach the JSON,
    sys.exit and SystemExit are their component's error with its line, os._exit ends one child and
    a new one checks the rest, and a NaN output fails with a note that says NaN."""
    path = tmp_path / "ends.py"
    path.write_text(ENDS_THE_PROGRAM)
    code = main(["check", str(path), "--json", "--time-limit", "10"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["error"] is None
    comps = {c["name"]: c for c in data["components"]}
    assert set(comps) == {"apply_temperature", "top_k_filter", "RMSNorm", "LayerNorm"}
    err = comps["apply_temperature"]["error"]
    assert err["kind"] == "exception" and "sys.exit(3)" in err["message"]
    assert err["traceback"] == ["line 11, in apply_temperature: sys.exit(3)"]
    assert "sys.exit('done here')" in comps["top_k_filter"]["error"]["message"]
    crash = comps["LayerNorm"]["error"]
    assert crash["kind"] == "crash" and "(exit 0)" in crash["message"] and "os._exit" in crash["message"]
    norm = comps["RMSNorm"]
    assert norm["status"] == "fail" and norm["error"] is None
    assert any("had a NaN in" in n["en"] and "NaN" in n["zh"] for n in norm["notes"])
    for c in data["components"]:
        assert c["error"] is None or c["error"]["kind"] != "internal", c


def test_syntax_error_is_reported_with_the_line(tmp_path):
    path = tmp_path / "syntax.py"
    path.write_text("import torch\nclass FFN(nn.Module)\n    pass\n")
    err = check_file(str(path)).error  # the child process runs this same function
    assert err.kind == "syntax" and err.where == "import"
    assert err.traceback == ["line 2: class FFN(nn.Module)"]
    text = format_report(FileResult(str(path), error=err))
    assert "SyntaxError" in text and "line 2: class FFN(nn.Module)" in text
    assert "fix: Python cannot read the file" in text.splitlines()[-1]
    zh = format_report(FileResult(str(path), error=err), "zh")
    assert "先改好上面这一行" in zh and "第 2 行：class FFN(nn.Module)" in zh and "line 2" not in zh
    frame = LearnerError("exception", "NameError: x", where="forward", traceback=["line 6, in forward: return x"])
    assert "第 6 行（forward 里）：return x" in format_report(FileResult(str(path), error=frame), "zh")


def test_nothing_recognisable(tmp_path):
    path = tmp_path / "nothing.py"
    path.write_text("def helper():\n    return 1\n")
    result = check_file(str(path))
    assert result.error.kind == "nothing_found" and "helper" in result.error.message
    assert exit_code(result) == 3  # nothing was checked and nothing failed: not the learner's FAIL
    assert "--component mha=MyAttention" in format_report(result).splitlines()[-1]


# --- the command line -----------------------------------------------------------------------------

def test_cli_json_and_exit_code():
    """--component mha causal_mask, in-process (the command line's child process is the broken file's
    and test_prints_sys_exit_os_exit_and_nan_fail_a_component_never_the_grader's)."""
    overrides, only = parse_components(["mha", "causal_mask"])
    assert (overrides, only) == ({}, ["mha", "causal_mask"])
    result = check_file(str(planted_file("kv_swapped")), overrides, only)
    data = json.loads(to_json(result))
    assert exit_code(result) == 1 and data["exit_code"] == 1 and not data["ok"]
    mask, mha = data["components"]
    assert mask["status"] == "pass" and [f["name"] for f in mha["findings"]] == ["kv_swapped"]
    assert mha["findings"][0]["line"] == 44
    assert mha["findings"][0]["fix"]["zh"]


def test_chinese_report_and_component_override(tmp_path):
    source = CORRECT.read_text().replace("class FFN(", "class MyFeedForward(")
    path = tmp_path / "mine.py"
    path.write_text(source)
    result = check_file(str(path), overrides={"ffn": "MyFeedForward"}, only=["ffn"])
    assert [c.name for c in result.components] == ["MyFeedForward"]
    assert "MyFeedForward（逐位置前馈网络）：通过" in format_report(result, "zh")
    err = check_file(str(path), overrides={"ffn": "Nope"}).error
    assert err.kind == "discovery" and "defines no 'Nope'" in err.message and "MyFeedForward" in err.message
    assert exit_code(FileResult(str(path), error=err)) == 2  # a bad argument, as an unknown kind


def test_cli_bad_arguments(capsys):
    assert main(["check", "no/such/file.py"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["check", str(CORRECT), "--component", "attention_thing"]) == 2
    assert "unknown kind" in capsys.readouterr().err


def test_torch_mask_convention_is_inverted_unless_asked(tmp_path):
    source = CORRECT.read_text().replace("masked_fill(mask == 0, -1e9)", "masked_fill(mask, -1e9)")
    path = tmp_path / "torch_style.py"
    path.write_text(source)
    auto = check_file(str(path), only=["sdpa"])
    assert findings(auto) == {"mask_inverted"}
    torch_style = check_file(str(path), only=["sdpa"], convention="torch")
    assert torch_style.components[0].status == "pass"
    assert torch_style.components[0].convention["en"].startswith("bool, True = masked")


def test_additive_mask_convention_is_detected(tmp_path):
    source = CORRECT.read_text().replace("scores = scores.masked_fill(mask == 0, -1e9)", "scores = scores + mask")
    path = tmp_path / "additive.py"
    path.write_text(source)
    result = check_file(str(path), only=["sdpa", "mha"])
    assert all(c.status == "pass" for c in result.components), format_report(result)
    assert result.components[0].convention["en"].startswith("additive")


def test_report_text_names_line_and_fix():
    result = check_file(str(planted_file("no_scaling")), only=["mha"])
    text = format_report(result, "en")
    assert "x no_scaling: the scores are not scaled by 1/sqrt(d_k)" in text
    assert "line 16: scores = torch.matmul(q, k.transpose(-2, -1))" in text
    zh = format_report(result, "zh")
    assert "注意力分数没有除以 sqrt(d_k)" in zh and "第 16 行" in zh
    assert json.loads(to_json(result))["exit_code"] == 1


NANOGPT_ATTENTION = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout=0.1):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.attn_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)
'''


def test_nanogpt_style_causal_attention_with_a_fused_projection(tmp_path):
    path = tmp_path / "gpt.py"
    path.write_text(NANOGPT_ATTENTION)
    result = check_file(str(path))
    (comp,) = result.components
    assert comp.kind == "causal_attention" and comp.status == "pass", format_report(result)
    assert comp.mapping[:3] == ["c_attn[0:16] -> W_Q", "c_attn[16:32] -> W_K", "c_attn[32:48] -> W_V"]
    path.write_text(NANOGPT_ATTENTION.replace("torch.ones(block_size, block_size))",
                                              "torch.ones(block_size, block_size), diagonal=1)"))
    result = check_file(str(path))
    assert_exactly(result, {"causal_off_by_one"})
    assert result.components[0].findings[0].form == "sees_next"
    path.write_text(NANOGPT_ATTENTION.replace("torch.ones(block_size, block_size))",
                                              "torch.ones(block_size, block_size), diagonal=-1)"))
    assert_exactly(check_file(str(path)), {"causal_off_by_one", "nan_on_masked_rows"})  # token 0 sees nothing


def test_nan_on_rows_that_a_mistake_hides_is_named_with_it(tmp_path):
    """An inverted mask hides every key of the last query; with -inf that row is NaN. The search
    compares each variant on the rows its own mask leaves visible, so both mistakes are named."""
    path = tmp_path / "inverted_inf.py"
    path.write_text(plant(CORRECT.read_text(), ["mask_inverted", "nan_on_masked_rows"]))
    result = check_file(str(path), only=["sdpa", "mha", "encoder_layer"])
    assert_exactly(result, {"mask_inverted", "nan_on_masked_rows"})
    assert all({f.name for f in c.findings} == {"mask_inverted", "nan_on_masked_rows"}
               for c in result.components), format_report(result)


MODEL = '''

class Transformer(nn.Module):
    def __init__(self, src_vocab_size, tgt_vocab_size, d_model, num_heads, num_layers, d_ff, max_len,
                 dropout=0.1):
        super().__init__()
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder_layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout)
                                             for _ in range(num_layers)])
        self.decoder_layers = nn.ModuleList([DecoderLayer(d_model, num_heads, d_ff, dropout)
                                             for _ in range(num_layers)])
        self.fc = nn.Linear(d_model, tgt_vocab_size)
        self.d_model = d_model

    def forward(self, src, tgt):
        src_mask = (src != 0).unsqueeze(1).unsqueeze(2)
        tgt_mask = (tgt != 0).unsqueeze(1).unsqueeze(2) & subsequent_mask(tgt.size(1)).bool()
        x = self.positional_encoding(self.src_embedding(src) * math.sqrt(self.d_model))
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        y = self.positional_encoding(self.tgt_embedding(tgt) * math.sqrt(self.d_model))
        for layer in self.decoder_layers:
            y, _ = layer(y, x, src_mask, tgt_mask)
        return self.fc(y)
'''


def test_full_model_against_handformer_and_reference_free_checks(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(CORRECT.read_text() + MODEL)
    result = check_file(str(path), only=["transformer"])
    (comp,) = result.components
    assert comp.status == "pass" and len(comp.checks) == 7, format_report(result)
    assert any(c.name["en"].startswith("matches handformer's Seq2SeqTransformer") for c in comp.checks)
    assert comp.convention["en"].startswith("embeddings scaled by sqrt(d_model); output layer separate, with a bias; "
                                            "post-norm layers")
    path.write_text(plant(CORRECT.read_text(), ["causal_sees_next"]) + MODEL)
    (comp,) = check_file(str(path), only=["transformer"]).components
    assert [c.name["en"].split(":")[0] for c in comp.checks if not c.ok] == [
        "matches handformer's Seq2SeqTransformer on your weights and choices (post-norm) on 3 shapes", "causality"]


ANNOTATED_STYLE = '''
import copy
import math

import torch
import torch.nn as nn


def clones(module, n):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


def attention(query, key, value, mask=None, dropout=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = scores.softmax(dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)  # (B, T|1, S) -> (B, 1, T|1, S): one mask for all heads
        n = query.size(0)
        q, k, v = [lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value))]
        x, _ = attention(q, k, v, mask, self.dropout)
        return self.linears[3](x.transpose(1, 2).contiguous().view(n, -1, self.h * self.d_k))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features)), eps

    def forward(self, x):
        return self.a_2 * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super().__init__()
        self.norm, self.dropout = LayerNorm(size), nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)
'''


def test_annotated_transformer_style(tmp_path):
    """Modules passed to the layer's constructor, rank-3 masks, a ModuleList of four projections,
    pre-norm sublayers and a LayerNorm over the unbiased std."""
    path = tmp_path / "annotated.py"
    path.write_text(ANNOTATED_STYLE)
    result = check_file(str(path))
    status = {c.name: (c.status, sorted(f.name for f in c.findings)) for c in result.components}
    assert status == {"attention": ("pass", []), "MultiHeadedAttention": ("pass", []),
                      "PositionwiseFeedForward": ("pass", []),
                      "LayerNorm": ("fail", ["layernorm_unbiased_std"]),
                      "EncoderLayer": ("fail", ["layernorm_unbiased_std"])}, format_report(result)
    mha = result.components[1]
    assert mha.mapping == [f"linears.{i} -> W_{r}" for i, r in enumerate("QKVO")]
    assert "rank 3" in mha.convention["en"]
    layer = result.components[-1]
    assert any("pre-norm" in n["en"] for n in layer.notes)
    path.write_text(ANNOTATED_STYLE.replace("(x.std(-1, keepdim=True) + self.eps)",
                                            "torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps)"))
    result = check_file(str(path))
    assert {c.name: c.status for c in result.components}["EncoderLayer"] == "differs", format_report(result)
    assert exit_code(result) == 0


def test_unmatched_constructor_argument_gets_help(tmp_path):
    """The attention alone, no layer of the file that builds it (where one does, check builds it with
    the arguments that layer hands it: tests/test_check_host_built.py)."""
    path = tmp_path / "odd.py"
    text = CORRECT.read_text()
    alone = text[:text.index("\nclass ", text.index("class MultiHeadAttention") + 1)]
    path.write_text(alone.replace("def __init__(self, d_model, num_heads):",
                                  "def __init__(self, breadth, num_heads):").replace(
        "assert d_model % num_heads == 0", "d_model = breadth"))
    result = check_file(str(path), only=["mha"])
    err = result.components[0].error
    assert result.components[0].status == "not_checked" and err.kind == "mapping"
    assert exit_code(result) == 3
    assert result.components[0].adapter == ("def make_mha(n_heads):\n"
                                            "    return MultiHeadAttention(breadth=..., num_heads=n_heads)")
    assert "cannot fill the argument 'breadth' of MultiHeadAttention(breadth, num_heads)" in err.message
    assert "d_model: d_model, dim, embed_dim, hidden_size" in err.message


def test_report_language_follows_the_locale(monkeypatch):
    from handformer.check.core.report import default_language

    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert default_language() == "zh"
    monkeypatch.setenv("LC_ALL", "en_US.UTF-8")
    assert default_language() == "en"
