"""Broken files in a run directory or a Hugging Face checkpoint: every command that reads them
(translate, generate, eval, viz, train --resume, import-hf) must stop with one line naming the file,
what is wrong and what to do, exit code 2, never a traceback. Every command x every fault class."""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import require_module

from handformer.cli import main

transformers = require_module("transformers", "pip install -e '.[dev]'")

pytestmark = pytest.mark.usefixtures("one_thread")

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import behaviour  # noqa: E402  (tests/golden/behaviour.py: the recorded behaviour)

WRITE_GOLDEN = os.environ.get("HANDFORMER_WRITE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def messages():
    """Every fault's message, as recorded in tests/golden/behaviour.json (section "faults"):
    compared one by one, or rewritten with HANDFORMER_WRITE_GOLDEN=1."""
    recorded = {} if WRITE_GOLDEN else behaviour.read()["faults"]
    yield recorded
    if WRITE_GOLDEN:
        behaviour.write("faults", dict(sorted(recorded.items())))


def same_message(messages: dict, key: str, err: str, tmp_path: Path) -> None:
    """The message as the golden file has it, with the test's folders written as TMP and the
    sizes of checkpoint headers (their metadata holds times) as N."""
    text = re.sub(r"claims [\d,]+ bytes; the file holds [\d,]+", "claims N bytes; the file holds N",
                  err.strip().replace(str(tmp_path), "TMP"))
    if WRITE_GOLDEN:
        messages[key] = text
    else:
        assert messages[key] == text, (key, text)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TRANSLATION = ["--config", "demo", "--set", "data.n_train=60", "--set", "data.n_heldout=6",
               "--set", "data.tokenizer=char", "--set", "model.d_model=16", "--set", "model.n_heads=2",
               "--set", "model.d_ff=32", "--set", "model.n_encoder_layers=1",
               "--set", "model.n_decoder_layers=1", "--set", "train.steps=4", "--set", "train.eval_every=2",
               "--set", "train.warmup=1", "--set", "train.progress=false", "--set", "train.device=cpu"]
LM = ["--config", str(CONFIGS / "tiny_lm.toml"), "--set", "train.steps=4", "--set", "train.eval_every=2",
      "--set", "train.progress=false", "--set", "train.device=cpu"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread):
    """A trained translation run, a trained language model and a Hugging Face GPT-2 directory."""
    root = tmp_path_factory.mktemp("faults")
    assert main(["train", *TRANSLATION, "--out", str(root / "translation")]) == 0
    assert main(["train", *LM, "--out", str(root / "lm")]) == 0
    hf = root / "hf"
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(hf)
    shutil.copy(root / "lm" / "tokenizer.json", hf / "tokenizer.json")
    return root


# command -> (which prepared directory, its arguments with RUN for the copy, the weights file read)
COMMANDS = {
    "translate": ("translation", ["translate", "RUN", "the first of may"], "model.safetensors"),
    "eval-translation": ("translation", ["eval", "RUN", "--data", "dates"], "model.safetensors"),
    "viz-translation": ("translation", ["viz", "RUN", "july 14", "--out", "OUT"], "model.safetensors"),
    "resume": ("translation", ["train", "--resume", "RUN"], "checkpoint.safetensors"),
    "resume-lm": ("lm", ["train", "--resume", "RUN"], "checkpoint.safetensors"),
    "generate": ("lm", ["generate", "RUN", "--prompt", "The "], "model.safetensors"),
    "eval-lm": ("lm", ["eval", "RUN", "--data", "val"], "model.safetensors"),
    "viz-lm": ("lm", ["viz", "RUN", "The ", "--out", "OUT"], "model.safetensors"),
    "import-hf": ("hf", ["import-hf", "RUN", "OUT"], "model.safetensors"),
}


def truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def make_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")


def pickle_renamed(path: Path) -> None:
    path.unlink()
    torch.save({"weight": torch.zeros(3)}, path)


WEIGHT_FAULTS = {
    "truncated": (lambda p: truncate(p, 0.6), "truncated"),
    "truncated-header": (lambda p: truncate(p, 0.0001), "truncated"),
    "empty": (lambda p: p.write_bytes(b""), "empty"),
    "pickle": (pickle_renamed, "pickle"),
    "directory": (make_dir, "directory"),
    "garbage": (lambda p: p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{notjson" + bytes(64)), "corrupt"),
}


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def model_section(data: dict) -> dict:
    return data["model"] if "model" in data else data  # a run's config.json, or Hugging Face's


def drop_size(data: dict) -> None:
    section = model_section(data)
    section.pop("d_model" if "d_model" in section else "n_embd")


def wrong_type(data: dict) -> None:
    section = model_section(data)
    section["d_model" if "d_model" in section else "n_embd"] = "wide"


CONFIG_FAULTS = {
    "missing-size-field": (lambda p: edit_json(p, drop_size), ("lacks", "n_embd|d_model")),
    "wrong-type": (lambda p: edit_json(p, wrong_type), ("wide",)),
    "missing-section": (lambda p: edit_json(p, lambda d: d.pop("model", None) or d.pop("model_type")),
                        ("model",)),
    "not-json": (lambda p: truncate(p, 0.5), ("not valid JSON",)),
    "empty": (lambda p: p.write_bytes(b""), ("JSON",)),
    "array": (lambda p: p.write_text("[1, 2]"), ("object",)),
    "directory": (make_dir, ("directory",)),
}


def run_broken(runs: Path, tmp_path: Path, command: str, capsys) -> tuple[Path, list[str]]:
    source, args, _ = COMMANDS[command]
    work = tmp_path / source
    shutil.copytree(runs / source, work)
    return work, [str(work) if a == "RUN" else str(tmp_path / "out") if a == "OUT" else a for a in args]


def assert_one_clear_line(code: int, err: str, file: Path, *words: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and str(file) in err, err
    for word in words:
        assert any(w in err for w in word.split("|")), (word, err)


@pytest.mark.parametrize("fault", WEIGHT_FAULTS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_broken_weights_file_is_one_clear_error(runs, tmp_path, capsys, messages, command, fault):
    work, args = run_broken(runs, tmp_path, command, capsys)
    path = work / COMMANDS[command][2]
    breaks, word = WEIGHT_FAULTS[fault]
    breaks(path)
    code = main(args)
    err = capsys.readouterr().err
    # What to do: re-run / resume / start over / download again, depending on the file.
    assert_one_clear_line(code, err, path, word, "re-run|resume|start the run over|download")
    same_message(messages, f"weights/{command}/{fault}", err, tmp_path)


@pytest.mark.parametrize("fault", CONFIG_FAULTS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_broken_config_json_is_one_clear_error(runs, tmp_path, capsys, messages, command, fault):
    work, args = run_broken(runs, tmp_path, command, capsys)
    path = work / "config.json"
    breaks, words = CONFIG_FAULTS[fault]
    breaks(path)
    code = main(args)
    err = capsys.readouterr().err
    assert_one_clear_line(code, err, path, *words)
    same_message(messages, f"config/{command}/{fault}", err, tmp_path)
