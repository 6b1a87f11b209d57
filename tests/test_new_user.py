"""What a newcomer meets first, as one met it: the help says what handformer is, Ctrl-C in training
ends in one line that says how to go on, finished files keep the mode any other file gets, a lost
best-weights file comes back on resume, a port in use and a folder given as --config are errors that
name the fix, and every run directory a README command reads is made by a README command."""

import dataclasses
import gc
import io
import json
import os
import re
import socket
import stat
import unicodedata
from pathlib import Path

import pytest
import torch
from docs_helpers import ROOT, blocks, commands, handformer_args, headings, pages
from serve_helpers import make_lm_run

from handformer.cli import build_parser, main
from handformer.io import atomic_write_text
from handformer.training.loop import LoopState

CONFIGS = ROOT / "configs"
TINY = ["train.progress=false", "train.device=cpu", "data.block_size=16", "train.steps=4",
        "train.eval_every=2", "train.log_every=2", "train.warmup=1"]

pytestmark = pytest.mark.usefixtures("one_thread")


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def test_the_help_says_what_handformer_is_in_whole_sentences():
    description = build_parser().description
    assert description.endswith(".") and "Transformer" in description


def test_ctrl_c_in_training_is_one_line_that_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    def interrupted(job, run_dir, resume):
        (run_dir / "checkpoint.safetensors").write_bytes(b"")  # as a run past its first checkpoint
        raise KeyboardInterrupt

    monkeypatch.setattr("handformer.tasks.lm.train.run_train_lm", interrupted)
    out = tmp_path / "run"
    assert main(["train", "--config", str(CONFIGS / "tiny_lm.toml"), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"`handformer train --resume {out}`" in err


def test_finished_files_get_the_mode_open_gives_them(tmp_path):
    atomic_write_text(tmp_path / "atomic.json", "{}")
    (tmp_path / "plain.json").write_text("{}")
    assert os.stat(tmp_path / "atomic.json").st_mode == os.stat(tmp_path / "plain.json").st_mode


def test_a_file_is_never_written_in_place_of_a_pipe_a_device_or_a_folder(tmp_path, capsys):
    """atomic_write renames its finished file over the target: over /dev/null, as root, that put a
    file in place of the device (`experts RUN TEXT --out /dev/null`). A pipe stands in for it here."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name, kind in (("fifo", "a named pipe (FIFO)"), ("folder", "a folder")):
        with pytest.raises(ValueError, match=rf"{name} is {re.escape(kind)}, not a file; give the path of a file"):
            atomic_write_text(tmp_path / name, "{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "elapsed_s": 0.5, "lr": 0.001, "train_loss": 2.0}\n')
    assert main(["plot", str(run), "--out", str(tmp_path / "fifo")]) == 2
    assert "fifo is a named pipe (FIFO), not a file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode) and not any(tmp_path.glob(".*.tmp"))


def test_resume_writes_lost_best_weights_again(tmp_path, monkeypatch, capsys):
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 20)
    run = tmp_path / "run"
    assert main(["train", "--config", str(CONFIGS / "tiny_lm.toml"), *sets(*TINY, f"data.path={tmp_path}/text.txt"),
                 "--out", str(run)]) == 0
    (run / "model.safetensors").write_bytes(b"\0" * 16)  # a torn file
    assert main(["train", "--resume", str(run)]) == 2  # finished: nothing evaluates again
    assert "--set train.steps=N" in capsys.readouterr().err
    resumed = LoopState.resumed  # a best no later evaluation beats: the weights come back all the same

    def unbeatable(saved, ctx):
        return dataclasses.replace(resumed(saved, ctx), best_val_loss=float("-inf"))

    monkeypatch.setattr(LoopState, "resumed", unbeatable)
    assert main(["train", "--resume", str(run), *sets("train.steps=6")]) == 0
    assert main(["generate", str(run), "--prompt", "the ", "--max-new-tokens", "2"]) == 0


def test_a_port_in_use_is_an_error_naming_the_fix(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(run), "--port", str(port), "--log-level", "critical"]) == 2
    err = capsys.readouterr().err
    assert f"error: port {port} of 127.0.0.1 is taken" in err and "choose another --port" in err


def test_a_language_model_given_to_translate_names_the_command_to_use(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    assert main(["translate", str(run), "hello"]) == 2
    assert "`handformer generate`" in capsys.readouterr().err


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "a folder, not a TOML file; to go on with a run give --resume RUN_DIR"),
    (lambda p: p.write_bytes(b'task = "lm"\n# \xff\n'), "is not UTF-8 text (byte 14"),
])
def test_a_config_that_is_no_toml_text_names_the_fix(tmp_path, capsys, make, message):
    make(tmp_path / "job.toml")
    assert main(["train", "--config", str(tmp_path / "job.toml"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_the_course_tables_keep_their_columns(capsys):
    from handformer.cli.learn import print_tutorials
    from handformer.course.chapters import CHAPTERS

    def columns(text: str) -> int:  # a Chinese character takes two columns of a terminal
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    for lang in ("en", "zh"):
        print_tutorials(lang)
        rows = capsys.readouterr().out.splitlines()[1:]
        starts = {columns(row[: row.index(ch.tutorial[lang == "zh"])]) for row, ch in zip(rows, CHAPTERS)}
        assert len(starts) == 1, (lang, starts)  # every tutorial starts in the same column


# --- the READMEs ---------------------------------------------------------------------------------

READS = {"generate": "run_dir", "translate": "run_dir", "eval": "run_dir", "chat": "run_dir",
         "quantize": "run_dir", "merge": "run_dir", "export-hf": "run_dir", "export-gguf": "run_dir",
         "serve": "runs", "experts": "run_dir", "viz": "run_dir"}
WRITES = {"train": "out", "import-hf": "run_dir", "import-llama2c": "run_dir", "import-gguf": "run_dir",
          "quantize": "out_dir", "merge": "out_dir"}


def readme_commands(readme: Path) -> list[list[str]]:
    """The handformer command lines of a README: its code blocks', then its inline code's."""
    lines = [handformer_args(words) for block in blocks(readme) if block.lang == "bash"
             for _, words in commands(block)]
    inline = re.findall(r"`(handformer [^`]+)`", readme.read_text(encoding="utf-8").replace("\n", " "))
    return [args for args in lines if args] + [line.split()[1:] for line in inline]


@pytest.mark.parametrize("readme", ["README.md", "README.zh.md"])
def test_every_run_a_readme_command_reads_is_made_by_one_of_its_commands(readme):
    parser, made, read = build_parser(), set(), []
    for args in readme_commands(ROOT / readme):
        try:
            parsed = parser.parse_args(args)
        except SystemExit:
            continue  # test_docs names command lines that do not parse
        for dest in ([WRITES[parsed.command]] if parsed.command in WRITES else []):
            made.add(getattr(parsed, dest))
        for dest in ([READS[parsed.command]] if parsed.command in READS else []):
            value = getattr(parsed, dest)
            read += [(" ".join(args), v.split("=")[-1]) for v in (value if isinstance(value, list) else [value])]
        if getattr(parsed, "resume", None) or getattr(parsed, "init_from", None):
            read.append((" ".join(args), parsed.resume or parsed.init_from))
    unmade = [f"handformer {line}: {run}" for line, run in read if run not in made and not run.isupper()]
    assert not unmade, f"{readme} reads runs none of its commands makes:\n" + "\n".join(unmade)


def test_no_heading_sets_an_anchor_of_its_own():
    """`## Title {#id}` works on the site (attr_list) but GitHub shows the braces and keeps its own
    anchor: link to the heading's text instead (#推理任务)."""
    found = [f"{page.relative_to(ROOT)}:{line}: {text}" for page in pages()
             for line, _, text in headings(page) if re.search(r"\{#[^}]*\}\s*$", text)]
    assert not found, "headings with {#id}; drop it and link to the heading's own anchor:\n" + "\n".join(found)


@pytest.mark.parametrize("device, message", [
    ("nosuch", "device 'nosuch' is not one torch knows; use cpu, cuda, cuda:N or mps"),
    ("cuda" if not torch.cuda.is_available() else "mps", "this machine has none"),
])
def test_a_device_this_machine_lacks_is_refused_before_anything_runs(tmp_path, capsys, device, message):
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has both a GPU and mps")
    with pytest.raises(SystemExit) as exit_:
        main(["generate", str(tmp_path), "--prompt", "x", "--device", device])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --device: " in err and message in err


def test_a_file_where_a_folder_belongs_is_named_with_the_fix(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    (tmp_path / "taken").write_text("mine")
    assert main(["quantize", str(run), str(tmp_path / "taken"), "--int8"]) == 2
    assert f"{tmp_path / 'taken'} is a file, where a folder is needed" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "mine"


def test_a_host_that_is_no_address_here_is_named_with_the_fix(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    assert main(["serve", str(run), "--host", "no-such-host.invalid", "--log-level", "critical"]) == 2
    assert "--host no-such-host.invalid: no such address" in capsys.readouterr().err


def test_a_text_without_pairs_given_to_a_translation_run_says_what_pairs_look_like(tmp_path, capsys):
    from serve_helpers import make_translation_run

    run = make_translation_run(tmp_path / "dates")
    (tmp_path / "plain.txt").write_text("one sentence\nanother one\n")
    assert main(["eval", str(run), "--data", str(tmp_path / "plain.txt")]) == 2
    assert "give a TSV file, one `source<TAB>target` pair a line" in capsys.readouterr().err


def test_trace_given_a_training_job_says_to_train_it_first(capsys):
    assert main(["trace", str(CONFIGS / "tiny_lm.toml")]) == 2
    err = capsys.readouterr().err
    assert "is a training job" in err and "then trace RUN" in err


def test_compare_given_no_checkpoint_folder_names_it_and_asks_no_hub(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    assert main(["compare", str(run), str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    assert "nothing is not a Hugging Face checkpoint folder (nothing is there)" in capsys.readouterr().err
    assert main(["compare", str(run), str(tmp_path), "--prompt", "x"]) == 2
    assert f"{tmp_path} is not a Hugging Face checkpoint folder (no config.json)" in capsys.readouterr().err


def test_ctrl_c_in_prepare_says_the_same_command_goes_on(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("handformer.data.prepare.prepare", interrupted)
    (tmp_path / "text.txt").write_text("some text\n")
    assert main(["prepare", str(tmp_path / "text.txt"), str(tmp_path / "shards"), "--tokenizer", "char"]) == 130
    err = capsys.readouterr().err
    assert "keeps its finished shards; run the same command again" in err and "Traceback" not in err


@pytest.mark.parametrize("make, lang, message", [
    (lambda d: d, "en", "is a folder: give the .py file"),
    (lambda d: d / "notes.txt", "en", "is not a Python file (.py)"),
    (lambda d: d / "missing.py", "en", "no such file"),
    (lambda d: d / "utf16.py", "en", "it holds NUL bytes (a binary file, or text saved as UTF-16?)"),
    (lambda d: d, "zh", "是文件夹：请给出定义组件的 .py 文件"),
    (lambda d: d / "missing.py", "zh", "没有这个文件"),
    (lambda d: d / "utf16.py", "zh", "里面有 NUL 字节"),
])
def test_check_given_no_python_file_is_a_usage_error_naming_the_fix(tmp_path, capsys, make, lang, message):
    (tmp_path / "notes.txt").write_text("attention notes\n")
    (tmp_path / "utf16.py").write_text("import torch\n", encoding="utf-16")  # Notepad's "Unicode"
    assert main(["check", str(make(tmp_path)), "--lang", lang]) == 2
    assert message in capsys.readouterr().err


def test_check_reads_a_path_written_after_its_component_kinds(tmp_path, capsys):
    """`--component ffn model.py` (argparse reads both as kinds): the .py value is the path; no path
    at all is a usage error that shows the command."""
    learner = tmp_path / "ffn.py"
    learner.write_text("import torch.nn as nn\n\n\nclass FFN(nn.Module):\n    def __init__(self, d_model, d_ff):\n"
                       "        super().__init__()\n        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)\n\n"
                       "    def forward(self, x):\n        return self.w2(self.w1(x).relu())\n")
    assert main(["check", "--component", "ffn", str(learner)]) == 0
    assert "1 passed" in capsys.readouterr().out
    assert main(["check", "--component", "ffn"]) == 2
    assert "give the file to check: handformer check FILE" in capsys.readouterr().err


@pytest.mark.parametrize("argv, usage", [
    (["explain", "softmax"], "usage: handformer explain"),
    (["speedrun", "chat", "--bogus"], "usage: handformer speedrun chat"),
])
def test_an_argument_left_over_is_reported_with_its_commands_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(usage) and "unrecognized arguments" in err


# --- what a newcomer's trial found ---------------------------------------------------------------

@pytest.mark.parametrize("setting, named", [
    ("train.lr=-1", "[train] lr=-1 is invalid: it must be > 0"),
    ("model.d_model=7", "[model] d_model=7 is invalid"),
    ("model.moe.bogus=0", "[model.moe] unknown field(s) bogus"),
])
def test_a_bad_setting_is_named_as_the_user_wrote_it(tmp_path, capsys, setting, named):
    assert main(["train", "--config", str(CONFIGS / "tiny_lm.toml"), "--out", str(tmp_path / "run"),
                 "--set", setting]) == 2
    err = capsys.readouterr().err
    assert named in err and "Config." not in err, err


def test_import_hf_of_a_folder_without_config_json_says_where_to_get_one(tmp_path, capsys):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert main(["import-hf", str(tmp_path), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and "huggingface-cli download" in err and "import-gguf" in err, err


@pytest.mark.parametrize("lost, fix", [
    ("tokenizer.json", "import-hf HF_DIR RUN_DIR --overwrite"),
    ("model.safetensors", "import-hf HF_DIR RUN_DIR --overwrite"),
])
def test_generate_on_a_run_missing_a_file_names_the_fix(tmp_path, capsys, lost, fix):
    run = make_lm_run(tmp_path / "story", chat=False)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "source": {"hf_dir": "somewhere"}}))
    (run / lost).unlink()
    assert main(["generate", str(run), "--prompt", "the"]) == 2
    err = capsys.readouterr().err
    assert f"has no {lost}" in err and fix in err, err


def test_a_torn_tokenizer_names_the_fix(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    (run / "tokenizer.json").write_text('{"model": ')
    assert main(["generate", str(run), "--prompt", "the"]) == 2
    err = capsys.readouterr().err
    assert "is not a valid tokenizer.json" in err and "train the run again" in err, err


@pytest.mark.parametrize("lost, fix", [("tokenizer.json", "train the run again"),
                                       ("model.safetensors", "re-run training")])
def test_a_translation_run_missing_a_file_names_the_fix(tmp_path, capsys, lost, fix):
    from serve_helpers import make_translation_run

    run = make_translation_run(tmp_path / "dates")
    (run / lost).unlink()
    assert main(["translate", str(run), "the first of may"]) == 2
    err = capsys.readouterr().err
    assert lost in err and fix in err, err


def test_a_trained_run_missing_its_weights_says_resume(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    (run / "checkpoint.safetensors").write_bytes(b"")
    (run / "model.safetensors").unlink()
    assert main(["generate", str(run), "--prompt", "the"]) == 2
    assert f"handformer train --resume {run}" in capsys.readouterr().err


def test_a_char_tokenizer_says_once_which_characters_it_never_saw(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    stdin = io.StringIO("the Ж\nwho € Ж\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", stdin)
        assert main(["generate", str(run), "--max-new-tokens", "1", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("never saw") == 1 and "'Ж'" in err and "<unk>" in err, err


def test_chat_says_once_which_characters_its_char_tokenizer_never_saw(tmp_path, capsys, monkeypatch):
    run = make_lm_run(tmp_path / "story")
    monkeypatch.setattr("sys.stdin", io.StringIO("the Ж\nwho € Ж\n"))
    assert main(["chat", str(run), "--system", "the fox", "--max-new-tokens", "1", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("never saw") == 1 and "never saw 'Ж';" in err and "<unk>" in err, err


def test_serve_names_its_address_only_once_it_listens(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(run), "--port", str(port), "--log-level", "critical"]) == 2
    err = capsys.readouterr().err
    assert "is taken" in err and "serving" not in err, err


def test_ctrl_c_closes_the_progress_bar_before_the_interrupted_line(tmp_path, monkeypatch, capsys):
    from handformer.training import loop

    step = loop.train_step

    def interrupted(run, state, micro, logging):
        if state.step == 2:
            raise KeyboardInterrupt
        return step(run, state, micro, logging)

    monkeypatch.setattr(loop, "train_step", interrupted)
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 20)
    tiny = [s for s in TINY if not s.startswith("train.progress")]
    assert main(["train", "--config", str(CONFIGS / "tiny_lm.toml"), "--out", str(tmp_path / "run"),
                 *sets(*tiny, "train.progress=true", f"data.path={tmp_path}/text.txt")]) == 130
    gc.collect()
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1].startswith("interrupted"), err[-500:]


def test_the_readme_imports_stories260k_by_its_file_names_from_any_folder(tmp_path, monkeypatch, capsys):
    from helpers import dataset_file

    dataset_file("stories260K")
    monkeypatch.chdir(tmp_path)  # a folder without the files, as after `handformer data get stories260K`
    assert main(["import-llama2c", "stories260K.bin", "tok512.bin", "runs/stories260K"]) == 0
    assert "reading the stories260K dataset's" in capsys.readouterr().err
    assert (tmp_path / "runs/stories260K/model.safetensors").is_file()


def test_an_empty_config_is_refused_rather_than_training_every_default(tmp_path, capsys):
    (tmp_path / "job.toml").write_text("# to fill in\n")
    assert main(["train", "--config", str(tmp_path / "job.toml"), "--out", str(tmp_path / "run")]) == 2
    assert "job.toml holds no settings; write a job" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("option, value, message", [
    ("--top-p", "2", "argument --top-p: must be a number above 0 and at most 1, got 2"),
    ("--temperature", "-1", "argument --temperature: must be a number >= 0, got -1"),
    ("--top-k", "0", "argument --top-k: must be an integer >= 1, got 0"),
])
def test_a_sampling_option_out_of_range_is_named_as_typed(tmp_path, capsys, command, option, value, message):
    with pytest.raises(SystemExit) as stopped:
        main([command, str(tmp_path), "--prompt" if command == "generate" else "--system", "x", option, value])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_eval_reads_a_translation_runs_own_test_split_by_name(tmp_path, capsys):
    from serve_helpers import make_translation_run

    run = make_translation_run(tmp_path / "dates")
    config = json.loads((run / "config.json").read_text())
    (tmp_path / "test.tsv").write_text("one\t1\ntwo\t2\n")
    config["data"].update(train=str(tmp_path / "train.tsv"), test=str(tmp_path / "test.tsv"))
    (run / "config.json").write_text(json.dumps(config))
    assert main(["eval", str(run), "--data", "test"]) == 0
    assert "(2 sentences)" in capsys.readouterr().out
    assert main(["eval", str(run), "--data", "val"]) == 2
    assert "was trained without a val split" in capsys.readouterr().err


def test_int4_group_size_0_is_refused_rather_than_read_as_the_default(tmp_path, capsys):
    run = make_lm_run(tmp_path / "story", chat=False)
    assert main(["quantize", str(run), str(tmp_path / "q"), "--int4", "--group-size", "0"]) == 2
    assert "int4 group size is 0; choose one of 32" in capsys.readouterr().err


def test_shards_prepared_from_an_empty_text_say_how_to_make_them_again(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    assert main(["prepare", str(tmp_path / "empty.txt"), str(tmp_path / "shards"), "--tokenizer", "char"]) == 2
    assert "the source holds no documents" in capsys.readouterr().err
    assert main(["train", "--config", str(CONFIGS / "tiny_lm.toml"), "--out", str(tmp_path / "run"),
                 *sets(*TINY, f"data.shards={tmp_path / 'shards'}")]) == 2
    assert "prepare it again from text" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["train", "--config", "/dev/null"], "/dev/null: a character device, not a TOML file; give the path of a job"),
    (["train", "--config", "{fifo}"], "fifo: a named pipe (FIFO), not a TOML file"),
    (["train", "--config", str(CONFIGS / "tiny_lm.toml"), "--set", "data.path=/dev/null", "--out", "{tmp}/run"],
     "/dev/null is a character device, not a text file or folder; give a file of text"),
    (["train", "--resume", "{file}"], "file is a file, not a folder; give the --out folder"),
    (["generate", "{file}", "--prompt", "x"], "file is not a run directory (it is a file)"),
    (["generate", "{tmp}/nothing", "--prompt", "x"], "nothing is not a run directory (nothing is there)"),
    (["import-hf", "{file}", "{tmp}/run"], "no Hugging Face checkpoint directory at {file} (a file is there); give"),
    (["import-llama2c", "{tmp}", "{tmp}", "{tmp}/run"], "is a folder, not a llama2.c checkpoint; give the"),
    (["import-gguf", "/dev/null", "{tmp}/run"], "/dev/null is a character device, not a GGUF file"),
    (["prepare", "{fifo}", "{tmp}/shards", "--tokenizer", "char"], "fifo is a named pipe (FIFO), not a text file"),
    (["check", "/dev/null"], "/dev/null is a character device, not a Python file; give the .py file"),
    (["export-gguf", "{tmp}/run", "{fifo}", "--overwrite"], "fifo is a named pipe (FIFO), not a file; give the"),
    (["import-gguf", "{file}", "{fifo}"], "fifo is a named pipe (FIFO); give a directory for the run"),
    (["trace", "/dev/null"], "/dev/null is a character device, not a config file; give a run directory, a config"),
    (["trace", "{tmp}"], "is a folder with no config.json, not a run directory; give a run directory"),
    (["plot", "{fifo}"], "fifo is not a training run directory (it is a named pipe (FIFO)); give the --out folder"),
    (["plot", "{file}"], "file is not a training run directory (it is a file); give the --out folder"),
    (["viz", "{file}", "x"], "file is not a run directory (it is a file)"),
])
def test_a_path_that_is_there_but_no_file_is_named_for_what_it_is(tmp_path, capsys, argv, message):
    """A folder, a device or a pipe where a file belongs is not "no such file": the error says what
    is there (a pipe is never opened: reading one would wait for a writer forever)."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("not a run\n")
    names = {"tmp": str(tmp_path), "fifo": str(tmp_path / "fifo"), "file": str(tmp_path / "file")}
    assert main([arg.format(**names) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message.format(**names) in err and err.count("\n") == 1, err
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)  # never replaced by a file (--overwrite)


@pytest.mark.parametrize("argv, argument", [
    (["prepare", "", "{tmp}/shards", "--tokenizer", "char"], "source"),
    (["generate", "", "--prompt", "x"], "run_dir"),
    (["eval", "{tmp}", "--data", ""], "--data"),
    (["train", "--config", " "], "--config"),
])
def test_an_empty_path_is_refused_not_read_as_this_folder(tmp_path, capsys, monkeypatch, argv, argument):
    """Path("") is ".": an empty path argument would read every file here (prepare) or look for a
    run here; it is the parser's usage error instead, naming the argument."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([arg.format(tmp=tmp_path) for arg in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {argument}: an empty path; give a file or a folder" in err, err
