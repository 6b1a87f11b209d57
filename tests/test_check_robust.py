"""The grader never breaks: a learner's mistake may fail a check, never handformer's own code.
Random mutations of every correct learner file (tests/check_mutants.py: swap two arguments of a
call, delete a statement, change a dim, drop a return's value) each get a report in which every
component passes, fails, raised in the learner's code, or is NOT CHECKED with the adapter that would
let check build it; never an internal error, and both
languages and the JSON render. A seeded sample runs by default, every mutant in the slow run.
(The planted mistakes and their pairs, tests/test_check.py, are the rest of the catalogue.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from check_mutants import Mutant, mutants, sample
from check_plants import FAMILIES, correct_file

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report, to_json
from handformer.check.core.result import DRIVER, ERROR, NOT_CHECKED

pytestmark = pytest.mark.usefixtures("one_thread", "short_bpe_limits")


@pytest.fixture
def short_bpe_limits(monkeypatch):
    """A BPE trainer or codec a mutation made endless is stopped after 1 s, not 10 (the correct
    trainer takes a few hundredths of a second on the fixture corpus), and on the timing corpus after
    0.5 s (slow is not wrong); a WordPiece tokenizer's loop made endless after 1 s, not 10: the report
    is what is tested here, the limits are tests/test_check_bpe.py's and tests/test_check_wordpiece.py's."""
    import handformer.check.runners.bpe as bpe
    import handformer.check.runners.bpe_codec as codec
    import handformer.check.runners.wordpiece as wordpiece

    monkeypatch.setattr(bpe, "FIXTURE_LIMIT", 1.0)
    monkeypatch.setattr(bpe, "CEILING", 0.5)
    monkeypatch.setattr(codec, "CODEC_LIMIT", 1.0)
    monkeypatch.setattr(wordpiece, "LIMIT", 1.0)

ROOT = Path(__file__).resolve().parents[1]
FILES = [correct_file(f) for f in FAMILIES]
DEFAULT = 72  # mutants in the default run (every file's in turn)


def _id(m: Mutant) -> str:
    return f"{m.path.parent.name}:{m.site}"


def check_mutant(tmp_path: Path, mutant: Mutant) -> None:
    path = tmp_path / f"{mutant.path.parent.name}_{mutant.site}.py"
    path.write_text(mutant.source())
    result = check_file(str(path))
    report = format_report(result, "en")
    format_report(result, "zh")
    json.loads(to_json(result))
    where = f"{mutant.path.parent.name}/correct.py, {mutant.what}"
    assert result.error is None or result.error.kind != "internal", (where, report)
    for c in result.components:
        assert c.status in ("pass", "fail", "differs", ERROR, NOT_CHECKED), (where, report)
        assert c.status != NOT_CHECKED or c.adapter, (where, report)  # the way to make it checkable
        assert c.error is None or c.error.kind != "internal", (where, report)
        if c.error is not None and c.error.kind == "exception" and c.error.traceback:
            assert all(line.startswith("line ") for line in c.error.traceback), (where, report)


def test_there_are_mutants_of_every_kind():
    seen = set()
    for path in FILES:
        kinds = {m.kind for m in mutants(path)}
        assert {"return", "delete"} <= kinds and kinds & {"swap", "dim"}, (path, kinds)
        seen |= kinds
    assert seen == {"swap", "dim", "return", "delete"}


def test_the_docs_count_of_mutants_is_the_mutants():
    total = sum(len(mutants(path)) for path in FILES)
    en = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    zh = (ROOT / "docs" / "zh" / "check.md").read_text(encoding="utf-8")
    words = {5: ("five", "五"), 6: ("six", "六"), 7: ("seven", "七"), 8: ("eight", "八"), 9: ("nine", "九"),
             10: ("ten", "十"), 11: ("eleven", "十一"), 12: ("twelve", "十二"), 13: ("thirteen", "十三"),
             14: ("fourteen", "十四"), 15: ("fifteen", "十五"), 16: ("sixteen", "十六"),
             17: ("seventeen", "十七"),
             18: ("eighteen", "十八"), 19: ("nineteen", "十九"), 20: ("twenty", "二十"),
             21: ("twenty-one", "二十一")}[len(FILES)]
    assert f"{total} mutants of the\n{words[0]} files, a seeded {DEFAULT} of them in the default run" in en
    assert f"{words[1]}个文件共 {total} 个变异体，默认测试里按固定种子抽 {DEFAULT} 个" in zh


@pytest.mark.parametrize("mutant", sample(FILES, DEFAULT, seed=0), ids=_id)
def test_a_mutant_gets_a_report_not_an_internal_error(tmp_path, mutant):
    check_mutant(tmp_path, mutant)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [m for path in FILES for m in mutants(path)], ids=_id)
def test_every_mutant_gets_a_report_not_an_internal_error(tmp_path, mutant):
    check_mutant(tmp_path, mutant)


def test_torch_refusing_a_dtype_inside_checks_softmax_is_the_learners_exception(tmp_path):
    """torch's NotImplementedError ("not implemented for 'Long'") raised through the float64 softmax
    check patches in is the learner's bug at their line: neither a starter's TODO nor a stand-in's."""
    from handformer.check.core.precision import float64_kept
    from handformer.check.core.source import learner_error

    path = tmp_path / "loss.py"
    path.write_text("import torch.nn.functional as F\n\n\ndef loss(targets):\n"
                    "    return F.log_softmax(targets, dim=-1)\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    with float64_kept(), pytest.raises(NotImplementedError) as raised:
        namespace["loss"](torch.zeros(2, 3, dtype=torch.long))
    err = learner_error(raised.value, str(path), "forward")
    assert err.kind == "exception", err
    assert err.traceback == ["line 5, in loss: return F.log_softmax(targets, dim=-1)"], err


GRU_SEARCH = '''import torch
import torch.nn as nn


class Translator(nn.Module):
    def __init__(self, vocab_size, hidden=16):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.enc = nn.GRU(hidden, hidden, batch_first=True)
        self.dec = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def encode(self, src):
        return self.enc(self.embed(src))[1]

    def decode(self, ys, state):
        return self.out(self.dec(self.embed(ys), state)[0][:, -1])


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    state = model.encode(src)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        ys = torch.cat([ys, model.decode(ys, state).argmax(-1, keepdim=True)], dim=1)
        if (ys[:, -1] == eos_id).all():
            break
    return ys.tolist()  # a batch of one: [[ids]]
'''


def test_a_search_written_for_a_model_the_file_does_not_define_is_not_checked_never_an_error(tmp_path):
    """A greedy decoder calling `model.decode(ys, state)` on a model its file does not define is driven
    by the Annotated Transformer's stand-in, whose decode takes (memory, src_mask, ys, tgt_mask): the
    stand-in's TypeError is never the learner's."""
    path = tmp_path / "gru_search.py"
    path.write_text(GRU_SEARCH[:GRU_SEARCH.index("class Translator")] + GRU_SEARCH[GRU_SEARCH.index("@torch"):])
    result = check_file(str(path))
    assert [(c.name, c.status) for c in result.components] == [("greedy_decode", NOT_CHECKED)], format_report(
        result)
    assert result.components[0].error.kind == "stand_in"


def test_a_search_is_driven_through_its_files_own_seq2seq_that_is_no_transformer(tmp_path):
    """The file's GRU seq2seq (its own encode and decode) is built and drives the search, its output
    layer steered by hooks (it is no tokenizer either: a torch module's train() is the mode switch); a
    loop that never stops at EOS is named at its line."""
    path = tmp_path / "gru_search.py"
    path.write_text(GRU_SEARCH)
    result = check_file(str(path))
    assert [(c.name, c.status) for c in result.components] == [("greedy_decode", "pass")], format_report(result)
    assert "your own Translator" in result.components[0].driven["en"]
    path.write_text(GRU_SEARCH.replace("if (ys[:, -1] == eos_id).all():", "if False:"))
    (comp,) = check_file(str(path)).components
    assert [(f.name, f.line) for f in comp.findings] == [("greedy_no_stop_at_eos", 25)], format_report(
        check_file(str(path)))


GRU_BEAM = GRU_SEARCH + '''

@torch.no_grad()
def beam_search(model, src, max_len, bos_id, eos_id, beam_size=2):
    state = model.encode(src)
    alive, done = [(0.0, [bos_id])], []
    for _ in range(max_len):
        ys = torch.tensor([t for _, t in alive])
        logp = torch.log_softmax(model.decode(ys, state.repeat(1, len(alive), 1)), -1)
        cands = sorted(((s + float(logp[i, v]), t + [v]) for i, (s, t) in enumerate(alive)
                        for v in range(logp.size(-1))), key=lambda c: -c[0])[:2 * beam_size]
        alive = []
        for rank, (s, t) in enumerate(cands):
            if t[-1] == eos_id:
                if rank < beam_size:
                    done.append((s / (len(t) - 1), t))
            elif len(alive) < beam_size:
                alive.append((s, t))
        if len(done) >= beam_size:
            break
    else:
        done += [(s / (len(t) - 1), t) for s, t in alive]
    return [max(done)[::-1]]  # [(tokens, score)]
'''


def test_a_beam_search_over_its_files_own_gru_reads_the_steered_table_alone(tmp_path):
    """The GRU seq2seq's output layer steered by each scenario's table (its own logits left out, and
    the reference reads the table: it has no forward(src, tgt)); the search returns [(tokens, score)], a
    batch of one; returning the first finished hypothesis is named."""
    path = tmp_path / "gru_beam.py"
    path.write_text(GRU_BEAM)
    result = check_file(str(path), only=["beam_search"])
    assert [(c.name, c.status) for c in result.components] == [("beam_search", "pass")], format_report(result)
    path.write_text(GRU_BEAM.replace("return [max(done)[::-1]]", "return [done[0][::-1]]"))
    (comp,) = check_file(str(path), only=["beam_search"]).components
    assert [f.name for f in comp.findings] == ["beam_shortest_returned"], format_report(
        check_file(str(path), only=["beam_search"]))


TOY_SEQ2SEQ = '''import torch
from torch import nn


class ToyModel(nn.Module):
    """A stand-in for an encoder-decoder, to try a training loop on: no attention."""

    def __init__(self, vocab, d_model):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d_model)
        self.tgt_embed = nn.Embedding(vocab, d_model)
        self.mix = nn.Linear(2 * d_model, d_model)

    def forward(self, src, tgt, src_mask, tgt_mask):
        memory = self.src_embed(src).mean(dim=1, keepdim=True)
        h = self.tgt_embed(tgt)
        return torch.tanh(self.mix(torch.cat([h, memory.expand_as(h)], dim=-1)))
'''


def test_a_toy_model_with_no_attention_is_a_driver_never_failed(tmp_path):
    """forward(src, tgt, src_mask, tgt_mask) with no attention anywhere (one vocabulary for both
    sides): run on an encoder-decoder's inputs it raised on the target's tokens; it is no Transformer,
    a driver of a training loop, noted."""
    path = tmp_path / "toy.py"
    path.write_text(TOY_SEQ2SEQ)
    (model,) = check_file(str(path)).components
    assert (model.kind, model.status) == ("transformer", DRIVER), model
    assert "holds no attention" in model.notes[-1]["en"]
