"""The translation commands end to end on a tiny run: train, translate (argument and stdin), eval
(dates, TSV, aligned files), their errors, and corpus BLEU."""

import contextlib
import io
import json

import pytest
import sacrebleu

from handformer.cli import main
from handformer.data.dates import date_pairs
from handformer.tasks.translation.scores import corpus_scores
from handformer.tasks.translation.translator import Translator

TINY = ["data.n_train=300", "data.n_heldout=30", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "model.n_encoder_layers=1", "model.n_decoder_layers=1", "data.max_tokens=512",
        "train.steps=30", "train.eval_every=10", "train.log_every=5", "train.warmup=5",
        "train.progress=false", "train.device=cpu"]


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread):
    """One tiny trained run shared by the tests of this file: (run directory, train's output)."""
    run_dir = tmp_path_factory.mktemp("runs") / "dates"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["train", "--config", "demo", *sets(*TINY), "--out", str(run_dir)])
    assert rc == 0
    return run_dir, out.getvalue()


def test_train_writes_a_complete_run(run):
    run_dir, output = run
    assert "300 pairs from the embedded dates task" in output
    assert "done: 30 steps" in output
    for name in ("config.json", "tokenizer.json", "tokenizer.target.json", "model.safetensors",
                 "checkpoint.safetensors", "metrics.jsonl", "loss_curve.png"):
        assert (run_dir / name).is_file(), name
    assert not list(run_dir.glob(".*.tmp"))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"] == "translation"
    assert config["model"]["d_model"] == 32 and config["train"]["steps"] == 30
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in rows if "val_loss" in r] == [10, 20, 30]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]  # it learns something


def test_translate_text_matches_the_library(run, capsys):
    run_dir, _ = run
    text = "the first of may, nineteen ninety-nine"
    assert main(["translate", str(run_dir), text]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == Translator.load(run_dir).translate([text])


def test_translate_reads_stdin_lines_and_keeps_blank_ones_in_place(run, capsys, monkeypatch):
    run_dir, _ = run
    texts = ["march 3, 1999", "the second of june 2004"]
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{texts[0]}\n\n{texts[1]}\n"))
    assert main(["translate", str(run_dir), "--beam", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    first, second = Translator.load(run_dir).translate(texts, beam=3)
    assert printed == [first, "", second]  # output line i answers input line i


def test_translate_empty_text_is_an_error(run, capsys):
    run_dir, _ = run
    assert main(["translate", str(run_dir), " "]) == 2
    assert "TEXT is empty" in capsys.readouterr().err


def test_translate_empty_stdin_is_an_error(run, capsys, monkeypatch):
    run_dir, _ = run
    monkeypatch.setattr("sys.stdin", io.StringIO("\n  \n"))
    assert main(["translate", str(run_dir)]) == 2
    assert "nothing to translate" in capsys.readouterr().err


def _scores_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("loss "))


def test_eval_on_the_held_out_dates(run, capsys):
    run_dir, _ = run
    assert main(["eval", str(run_dir), "--data", "dates", "--beam", "1"]) == 0
    out = capsys.readouterr().out
    assert "30 pairs from the embedded dates task (held-out)" in out
    line = _scores_line(out)
    assert "(30 sentences)" in line and "beam 1" in line
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in out
    _, heldout = date_pairs(300, 30, seed=0)
    hyps = Translator.load(run_dir).translate([s for s, _ in heldout], beam=1)
    bleu = sacrebleu.corpus_bleu(hyps, [[t for _, t in heldout]]).score
    assert f"BLEU {bleu:.2f} " in line


def test_eval_on_a_tsv_and_on_aligned_files_agree(run, capsys, tmp_path):
    run_dir, _ = run
    _, heldout = date_pairs(300, 30, seed=0)
    pairs = heldout[:12]
    tsv = tmp_path / "test.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:6]) + "a line without a tab\n"
                   + "".join(f"{s}\t{t}\n" for s, t in pairs[6:]))
    src, ref = tmp_path / "test.src", tmp_path / "test.ref"
    src.write_text("".join(s + "\n" for s, _ in pairs))
    ref.write_text("".join(t + "\n" for _, t in pairs))
    hyp_file = tmp_path / "hyps.txt"

    assert main(["eval", str(run_dir), "--data", str(tsv), "--output", str(hyp_file)]) == 0
    tsv_out = capsys.readouterr().out
    assert "12 pairs" in tsv_out and "skipped 1 bad line(s) (line 7)" in tsv_out
    assert hyp_file.read_text().splitlines() == Translator.load(run_dir).translate([s for s, _ in pairs])

    assert main(["eval", str(run_dir), "--data", str(src), str(ref)]) == 0
    pair_out = capsys.readouterr().out
    assert f"12 pairs from {src} + {ref}" in pair_out
    assert _scores_line(pair_out) == _scores_line(tsv_out)

    assert main(["eval", str(run_dir), "--data", str(src), str(ref), "--limit", "5"]) == 0
    assert "(5 sentences)" in capsys.readouterr().out


def test_eval_refuses_language_model_options_on_a_translation_run(run, capsys):
    run_dir, _ = run
    assert main(["eval", str(run_dir), "--data", "dates", "--block-size", "8"]) == 2
    assert "--block-size is for language-model runs" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--data", "dates", "--stride", "8"]) == 2
    assert "--stride is for language-model runs" in capsys.readouterr().err


def test_eval_on_misaligned_files_names_both(run, capsys, tmp_path):
    run_dir, _ = run
    src, ref = tmp_path / "a.txt", tmp_path / "b.txt"
    src.write_text("one\ntwo\n")
    ref.write_text("1\n")
    assert main(["eval", str(run_dir), "--data", str(src), str(ref)]) == 2
    err = capsys.readouterr().err
    assert "misaligned" in err and str(src) in err and str(ref) in err


def test_a_directory_that_is_not_a_run(capsys, tmp_path):
    assert main(["translate", str(tmp_path), "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a run directory (no config.json)" in err
    assert main(["eval", str(tmp_path / "missing"), "--data", "dates"]) == 2
    assert "is not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("override, message", [
    ("optim.lr=0.1", "unknown section 'optim'"),
    ("train.learning_rate=0.1", "[train] unknown field(s) learning_rate"),
    ("data.bogus=1", "[data] unknown field(s) bogus"),
    ("decode.beam_width=3", "[decode] unknown field(s) beam_width"),
    ("model.n_layers=2", "[model] unknown field(s) n_layers"),
    ("train.steps=0", "[train] steps=0 is invalid"),
    ("train.keep_cpu_memory=maybe", "[train] keep_cpu_memory='maybe' is invalid: it must be true or false"),
    ("data.joint_vocab=1", "[data] joint_vocab=1 is invalid: it must be true or false"),
    # Every section is checked on construction, before any data is read or model built.
    ("decode.beam=0", "[decode] beam=0 is invalid: it must be an integer >= 1"),
    ("decode.length_penalty=nan", "[decode] length_penalty='nan' is invalid: it must be a number"),
    ("decode.max_len_a=-1", "[decode] max_len_a=-1 is invalid"),
    ("data.max_length=1", "[data] max_length=1 is invalid"),
    ("data.max_tokens=8", "[data] max_tokens=8 is invalid"),
    ('data.val=["a","b","c"]', "[data] val=['a', 'b', 'c'] is invalid: give a TSV path or exactly two"),
    ("data.tokenizer=words", "[data] tokenizer='words' is invalid: choose bpe or char"),
    ("train.lr=fast", "[train] lr='fast' is invalid: it must be a number"),
    ("train.min_lr=1", "[train] min_lr=1 is invalid"),
    ("model.d_model=wide", "[model] d_model='wide' is invalid: it must be an integer"),
])
def test_bad_overrides_are_clear_errors(override, message, capsys, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--config", "demo", *sets("data.n_train=20", "data.n_heldout=5", override),
            "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (out / "checkpoint.safetensors").exists()


def test_training_into_an_existing_run_needs_resume_or_overwrite(run, capsys):
    run_dir, _ = run
    before = (run_dir / "checkpoint.safetensors").read_bytes()
    assert main(["train", "--config", "demo", *sets(*TINY), "--out", str(run_dir)]) == 2  # as every error
    message = capsys.readouterr().err
    assert f"--resume {run_dir}" in message and "--overwrite" in message
    assert (run_dir / "checkpoint.safetensors").read_bytes() == before


def test_resume_needs_a_checkpoint(capsys, tmp_path):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert main(["train"]) == 2
    assert "error: give --config" in capsys.readouterr().err


@pytest.mark.parametrize("extra, named", [
    (["--out", "elsewhere"], "--out"), (["--config", "demo"], "--config"),
    (["--overwrite"], "--overwrite"), (["--config", "demo", "--out", "x"], "--config and --out"),
])
def test_resume_refuses_options_it_would_ignore(run, capsys, extra, named):
    run_dir, _ = run
    before = (run_dir / "checkpoint.safetensors").read_bytes()
    assert main(["train", "--resume", str(run_dir), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{named} would be ignored" in err and "--set" in err
    assert (run_dir / "checkpoint.safetensors").read_bytes() == before


@pytest.mark.parametrize("data", [["a.tsv", "b.tsv", "c.tsv"], ["dates", "b.tsv"]])
def test_eval_refuses_data_it_would_not_read(run, capsys, data):
    run_dir, _ = run
    assert main(["eval", str(run_dir), "--data", *data]) == 2
    assert f"got {len(data)} paths" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["translate", "RUN", "x", "--beam", "0"],
                                  ["eval", "RUN", "--data", "dates", "--beam", "-1"],
                                  ["translate", "RUN", "x", "--beam", "two"]])
def test_numeric_options_are_checked_before_any_work(run, capsys, args):
    run_dir, _ = run
    with pytest.raises(SystemExit) as info:
        main([str(run_dir) if a == "RUN" else a for a in args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --beam:" in err and ("must be an integer >= 1" in err or "expected an integer" in err)


def test_resuming_a_finished_run_with_more_steps_continues_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    tiny = [s for s in TINY if not s.startswith("train.steps")]
    assert main(["train", "--config", "demo", *sets(*tiny, "train.steps=10"), "--out", str(run_dir)]) == 0
    assert main(["train", "--resume", str(run_dir), *sets("train.steps=15")]) == 0
    assert "done: 15 steps" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [5, 10, 15]


# --- corpus BLEU --------------------------------------------------------------------------------

HYPOTHESES = [
    "the cat sat on the mat",
    "a quick brown fox jumps over the lazy dog",
    "1997-03-23",
    "hello there , general kenobi",
    "it is raining",
]
REFERENCES = [
    "the cat is sitting on the mat",
    "the quick brown fox jumped over the lazy dog",
    "1997-03-23",
    "hello there , general kenobi !",
    "it was raining heavily in the city",
]


def test_bleu_is_corpus_bleu_not_a_mean_of_sentence_scores():
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert scores.bleu == pytest.approx(expected.score, abs=1e-9)
    assert scores.chrf == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    mean_sentence = sum(sacrebleu.sentence_bleu(h, [r]).score
                        for h, r in zip(HYPOTHESES, REFERENCES)) / len(HYPOTHESES)
    assert abs(scores.bleu - mean_sentence) > 1.0  # the two really differ on this fixture
    assert scores.exact_match == pytest.approx(1 / 5)
    assert scores.n == 5 and "tok:13a" in scores.signature


def test_bleu_edge_cases():
    assert corpus_scores(REFERENCES, REFERENCES).bleu == pytest.approx(100.0)
    lower = corpus_scores(["The Cat sat on The Mat today"], ["the cat sat on the mat today"])
    assert lower.bleu < 100.0 and lower.bleu_lc_tok == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no sentences"):
        corpus_scores([], [])
