"""Fine-tuning through the command line: `handformer train --init-from RUN` (full and LoRA) starts
from the run's weights, model and tokenizer and records where it came from; LoRA runs hold only
their adapters, load with their base (whose hash they check) in generate and eval, and merge into
an ordinary run; a LoRA fine-tune killed with `kill -9` resumes to the uninterrupted run; an
imported Llama fine-tunes; bad input is one clear error before anything is written."""

import functools
import io
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from helpers import dataset_file, kill_9_after_first_checkpoint, randomize_hf
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors

from handformer.cli import main
from handformer.data.text import split_text
from handformer.data.tokenizer import Tokenizer
from handformer.tasks.lm.finetune import weights_sha256
from handformer.tasks.lm.run import load_lm
from handformer.training import loop as train_module
from handformer.training.checkpoint import read_safetensors

ROOT = Path(__file__).resolve().parents[1]
TINY_LM = str(ROOT / "configs" / "tiny_lm.toml")
TEXT = "to be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 40
QUIET = ("train.progress=false", "train.device=cpu")

pytestmark = pytest.mark.usefixtures("one_thread")


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def finetune(out: Path, base: Path, text: Path, *pairs: str) -> int:
    return main(["train", "--init-from", str(base), "--out", str(out),
                 *sets(*QUIET, f"data.path={text}", "data.block_size=16", "data.batch_size=8",
                       "data.eval_batches=2", "train.steps=12", "train.eval_every=6", "train.log_every=3",
                       "train.warmup=2", "train.lr=1e-2", *pairs)])


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def tensors(path: Path) -> dict:
    return {k: v for k, v in read_safetensors(path)[0].items() if not k.startswith("rng/")}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny character-level GPT trained for a few steps on the embedded corpus."""
    run = tmp_path_factory.mktemp("base") / "run"
    assert main(["train", "--config", TINY_LM, "--out", str(run),
                 *sets(*QUIET, "train.steps=10", "train.eval_every=5")]) == 0
    return run


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "hamlet.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(scope="module")
def lora_run(base, text, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lora") / "run"
    assert finetune(run, base, text, "train.lora.rank=4", "train.lora.alpha=8",
                    'train.lora.targets=["q_proj", "v_proj", "up_proj"]') == 0
    return run


# --- full fine-tuning ---------------------------------------------------------------------------

def test_full_fine_tuning_starts_from_the_runs_weights_and_records_where_it_came_from(
        base, text, tmp_path, monkeypatch, capsys):
    started = {}

    def record(model, *args, **kwargs):
        started.update({k: v.clone() for k, v in model.state_dict().items()})
        return train(model, *args, **kwargs)

    train = train_module.train
    monkeypatch.setattr(train_module, "train", record)
    # Options of the loop beyond the defaults: another schedule, accumulation, decay, clipping.
    assert finetune(tmp_path / "ft", base, text, "train.schedule=inverse_sqrt", "train.accumulation=2",
                    "train.weight_decay=0.1", "train.clip_grad=0.5", "model.dropout=0.1") == 0
    out = capsys.readouterr().out
    assert f"fine-tuning {base.resolve()}" in out
    base_weights = tensors(base / "model.safetensors")
    assert started.keys() >= base_weights.keys()
    assert all(torch.equal(started[k], v) for k, v in base_weights.items())  # the base's weights, exactly

    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    base_config = json.loads((base / "config.json").read_text())
    assert config["init_from"] == {"path": str(base.resolve()), "relative": os.path.relpath(base, tmp_path / "ft"),
                                   "sha256": weights_sha256(base / "model.safetensors"), "lora": False}
    assert config["model"] == {**base_config["model"], "dropout": 0.1}  # the base's architecture
    assert config["tokens"] == base_config["tokens"]
    assert (tmp_path / "ft" / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()
    tuned = tensors(tmp_path / "ft" / "model.safetensors")
    assert tuned.keys() == base_weights.keys() and not torch.equal(tuned["embed.weight"], base_weights["embed.weight"])
    rows = metric_rows(tmp_path / "ft")
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert val[-1] < val[0]


def test_zero_init_projections_with_a_fine_tune_is_one_error(base, tmp_path, capsys):
    assert main(["train", "--config", TINY_LM, "--init-from", str(base), "--out", str(tmp_path / "ft"),
                 *sets(*QUIET, "train.zero_init_projections=true")]) == 2
    assert "zero_init_projections=true would erase the base run's" in capsys.readouterr().err


def test_the_model_section_may_restate_the_base_but_not_change_it(base, text, tmp_path, capsys):
    config = tmp_path / "job.toml"
    config.write_text(f'task = "lm"\n[model]\nd_model = 32\nn_layers = 2\n[train]\ninit_from = "{base}"\n')
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "ok"),
                 *sets(*QUIET, f"data.path={text}", "data.block_size=16", "train.steps=2")]) == 0
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "bad"),
                 *sets(*QUIET, f"data.path={text}", "model.n_layers=3")]) == 2
    assert ("[model] n_layers=3 disagrees with the run in [train] init_from" in capsys.readouterr().err)
    # The job file the base was trained with, preset included, describes the base: it agrees.
    assert main(["train", "--config", TINY_LM, "--init-from", str(base), "--out", str(tmp_path / "same"),
                 *sets(*QUIET, f"data.path={text}", "train.steps=2", "model.dropout=0.3")]) == 0
    assert json.loads((tmp_path / "same" / "config.json").read_text())["model"]["dropout"] == 0.3


# --- LoRA ---------------------------------------------------------------------------------------

def test_a_lora_run_holds_its_adapters_and_a_pointer_to_its_unchanged_base(base, lora_run):
    config = json.loads((lora_run / "config.json").read_text())
    assert config["lora"] == {"rank": 4, "alpha": 8, "dropout": 0.0, "targets": ["q_proj", "v_proj", "up_proj"]}
    assert config["init_from"]["lora"] and config["init_from"]["sha256"] == weights_sha256(base / "model.safetensors")
    assert not (lora_run / "model.safetensors").exists()
    adapters = tensors(lora_run / "adapters.safetensors")
    assert sorted(adapters) == sorted(f"layers.{i}.{name}.lora_{m}" for i in range(2) for m in "AB"
                                      for name in ("self_attn.q_proj", "self_attn.v_proj", "ffn.up_proj"))
    assert all(torch.count_nonzero(v) for v in adapters.values())  # B moved away from zero
    run = load_lm(lora_run)
    trained = {k: v for k, v in run.model.state_dict().items() if "lora_" not in k}
    base_weights = tensors(base / "model.safetensors")
    assert all(torch.equal(trained[k], v) for k, v in base_weights.items())  # bit for bit


def test_generate_and_eval_load_base_plus_adapters_and_merge_writes_an_equal_ordinary_run(
        base, lora_run, tmp_path, capsys):
    generate = ["--prompt", "to be", "--max-new-tokens", "20", "--temperature", "0"]
    results = {}
    for name, run in (("base", base), ("lora", lora_run)):
        assert main(["generate", str(run), *generate]) == 0
        assert main(["eval", str(run), "--data", "val"]) == 0
        results[name] = capsys.readouterr().out
    merged = tmp_path / "merged"
    assert main(["merge", str(lora_run), str(merged)]) == 0
    assert f"-> {merged}" in capsys.readouterr().out
    assert main(["generate", str(merged), *generate]) == 0
    assert main(["eval", str(merged), "--data", "val"]) == 0
    results["merged"] = capsys.readouterr().out
    assert results["merged"] == results["lora"] != results["base"]

    config = json.loads((merged / "config.json").read_text())
    assert "lora" not in config and config["merged_from"]["lora"]["rank"] == 4
    assert sorted(tensors(merged / "model.safetensors")) == sorted(tensors(base / "model.safetensors"))
    assert main(["merge", str(lora_run), str(merged)]) == 2  # not over an existing model
    assert "already holds a model" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["quantize", "--int8"], ["export-hf"]])
def test_quantize_and_export_ask_for_a_merge_first(lora_run, tmp_path, command, capsys):
    assert main([command[0], str(lora_run), str(tmp_path / "out"), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "holds LoRA adapters on a base run; fold them in first with `handformer merge" in err
    assert not (tmp_path / "out").exists()


def test_merging_a_run_without_adapters_is_a_clear_error(base, tmp_path, capsys):
    assert main(["merge", str(base), str(tmp_path / "out")]) == 2
    assert "has no LoRA adapters to merge" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_adapters_refuse_a_changed_base_and_follow_a_base_moved_with_them(base, lora_run, tmp_path, capsys):
    moved = tmp_path / "moved"
    shutil.copytree(base, moved / "base")
    shutil.copytree(lora_run, moved / "runs" / "lora")
    config_path = moved / "runs" / "lora" / "config.json"
    config = json.loads(config_path.read_text())
    config["init_from"]["relative"] = "../../base"
    config["init_from"]["path"] = str(tmp_path / "gone")
    config_path.write_text(json.dumps(config))
    load_lm(moved / "runs" / "lora")  # found next to the run, hash equal

    weights, _ = read_safetensors(moved / "base" / "model.safetensors")
    weights["embed.weight"][0, 0] += 1.0
    from safetensors.torch import save_file
    save_file(weights, moved / "base" / "model.safetensors")
    assert main(["generate", str(moved / "runs" / "lora"), "--prompt", "to"]) == 2
    err = capsys.readouterr().err
    assert "has changed since" in err and "restore the base run or fine-tune again" in err
    (moved / "base" / "model.safetensors").unlink()
    assert main(["eval", str(moved / "runs" / "lora"), "--data", "val"]) == 2
    assert "which has no model.safetensors any more" in capsys.readouterr().err


@pytest.mark.parametrize("pairs, message", [
    (("INIT=no/such/run",), "[train] init_from='no/such/run': no such run directory"),
    (("INIT=TRANSLATION",), "it holds a 'translation' run; fine-tuning starts from a language-model run"),
    (("INIT=QUANTIZED",), "it holds a model quantized to int8, whose weights cannot train; fine-tune the "
                          "full-precision run ("),
    (("INIT=LORA",), "it holds LoRA adapters, not a whole model; fold them in first with `handformer merge"),
    (("train.lora.targets=[\"q_proj\", \"wq\"]",), "'wq' matches no linear layer of the model's blocks; their "
                                                   "layers are named down_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    (("train.lora.rank=0",), "[train.lora] rank=0 is invalid: it must be a positive integer"),
    (("train.lora.rank=33",), "rank=33 is invalid: it is larger than layer layers.0.self_attn.q_proj (32 -> 32)"),
    (("train.lora.targets=all",), "[train.lora] targets='all' is invalid"),
    (("model.d_model=64",), "[model] d_model=64 disagrees with the run in [train] init_from"),
    (("model.preset=llama",), "[model] d_model=512 (from preset 'llama') disagrees with the run in [train] "
                              "init_from"),
    (("data.block_size=64",), "[data] block_size=64 is invalid: the run in [train] init_from has a context of "
                              "max_positions=32"),
])
def test_bad_fine_tuning_input_is_one_clear_error_before_any_work(base, lora_run, text, tmp_path, pairs,
                                                                   message, capsys):
    translation = tmp_path / "translation"
    translation.mkdir()
    (translation / "config.json").write_text('{"task": "translation"}')
    if "INIT=QUANTIZED" in pairs:
        assert main(["quantize", str(base), str(tmp_path / "quantized"), "--int8"]) == 0
    pairs = [p.replace("TRANSLATION", str(translation)).replace("LORA", str(lora_run))
             .replace("QUANTIZED", str(tmp_path / "quantized")) for p in pairs]
    init_from = [p[len("INIT="):] for p in pairs if p.startswith("INIT=")]  # as given to --init-from
    pairs = [p for p in pairs if not p.startswith("INIT=")]
    assert finetune(tmp_path / "out", init_from[0] if init_from else base, text, "train.lora.rank=2", *pairs) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_lora_without_init_from_and_fine_tuning_a_translation_job_are_refused(tmp_path, capsys):
    assert main(["train", "--config", TINY_LM, "--out", str(tmp_path / "a"), *sets("train.lora.rank=2")]) == 2
    assert '[train.lora] needs [train] init_from = "RUN_DIR"' in capsys.readouterr().err
    assert main(["train", "--config", "demo", "--init-from", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    assert "fine-tune language models" in capsys.readouterr().err


def test_text_the_tokenizer_cannot_encode_is_a_warning_with_a_count_and_examples(base, tmp_path, capsys):
    text = tmp_path / "euro.txt"
    text.write_text("price: 5€, 7€ and ±2 §3 " * 3 + TEXT + "№1")  # the last 10% is for validation
    assert finetune(tmp_path / "out", base, text, "train.lora.rank=2", "train.steps=1") == 0
    out = capsys.readouterr().out
    assert ("warning: the base run's tokenizer encodes 12 of the 3,163 training tokens as unknown (<unk>), "
            "from 3 character(s) it never saw: '§', '±', '€'") in out
    assert "encodes 1 of the 351 validation tokens as unknown (<unk>), from 1 character(s) it never saw: '№'" in out


# --- resume -------------------------------------------------------------------------------------

def test_kill_9_then_resume_of_a_lora_fine_tune_equals_a_straight_run(base, text, tmp_path, capsys):
    """A real `kill -9` after the first checkpoint; `--resume` finishes exactly as an uninterrupted
    run (adapter dropout makes the restored RNG matter)."""
    args = ["train", "--init-from", str(base), *sets(*QUIET, f"data.path={text}", "data.block_size=16",
            "data.batch_size=4", "data.eval_batches=2", "data.batches_per_epoch=30", "train.steps=80",
            "train.eval_every=50", "train.checkpoint_every=10", "train.log_every=7", "train.lr=3e-3",
            "train.lora.rank=2", "train.lora.dropout=0.1", "train.lora.targets=all-linear")]
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    kill_9_after_first_checkpoint(args, killed)
    _, metadata = read_safetensors(killed / "checkpoint.safetensors")
    assert 0 < json.loads(metadata["state"])["step"] < 80, "the run finished before it could be killed"

    assert main(["train", "--resume", str(killed)]) == 0
    assert main([*args, "--out", str(straight)]) == 0
    assert "done: 80 steps" in capsys.readouterr().out
    assert metric_rows(killed) == metric_rows(straight)
    for name in ("adapters.safetensors", "checkpoint.safetensors"):
        a, b = tensors(killed / name), tensors(straight / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_an_in_process_crash_resumes_a_full_fine_tune_to_the_straight_run(base, text, tmp_path, monkeypatch):
    class Crash(Exception):
        pass

    def crash(step, val_loss):
        if step == 12:
            raise Crash

    pairs = ("train.checkpoint_every=4", "model.dropout=0.2")
    assert finetune(tmp_path / "straight", base, text, *pairs) == 0
    with monkeypatch.context() as m:
        m.setattr(train_module, "train", functools.partial(train_module.train, on_eval=crash))
        with pytest.raises(Crash):
            finetune(tmp_path / "crashed", base, text, *pairs)
    shutil.move(base, base.with_name("away"))  # a full fine-tune resumes from its own checkpoint
    try:
        assert main(["train", "--resume", str(tmp_path / "crashed")]) == 0
    finally:
        shutil.move(base.with_name("away"), base)
    assert metric_rows(tmp_path / "crashed") == metric_rows(tmp_path / "straight")
    a, b = tensors(tmp_path / "crashed" / "model.safetensors"), tensors(tmp_path / "straight" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- an imported model --------------------------------------------------------------------------

def test_an_imported_llama_fine_tunes_with_lora_and_keeps_its_bos_and_chat_template(tmp_path, capsys,
                                                                                    monkeypatch):
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 40)]
    hf_dir = tmp_path / "hf"
    torch.manual_seed(0)
    hf = randomize_hf(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(words), hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})), 0.1)
    hf.save_pretrained(hf_dir, safe_serialization=True)
    tokenizer = HFTokenizer(models.WordLevel({t: i for i, t in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text('{"add_bos_token": true}')
    (hf_dir / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] + ' ' }}{% endfor %}")
    assert main(["import-hf", str(hf_dir), str(tmp_path / "imported")]) == 0
    text = tmp_path / "words.txt"
    text.write_text(" ".join(f"w{3 + (i * 7) % 11}" for i in range(3000)))  # a repeating pattern
    assert finetune(tmp_path / "lora", tmp_path / "imported", text, "train.lora.rank=4",
                    "train.lora.targets=all-linear", "train.lr=3e-2", "train.steps=30", "train.eval_every=10") == 0
    config = json.loads((tmp_path / "lora" / "config.json").read_text())
    assert config["tokens"]["bos_id"] == 1 and config["model"]["position"] == "rope"
    capsys.readouterr()
    losses = []
    for run in ("imported", "lora"):  # the same text, scored after the same BOS
        assert main(["eval", str(tmp_path / run), "--data", str(text), "--block-size", "32"]) == 0
        losses.append(float(capsys.readouterr().out.split()[1]))
    assert losses[1] < 0.5 * losses[0]
    assert main(["generate", str(tmp_path / "lora"), "--prompt", "w3 w10", "--max-new-tokens", "4",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("w3 w10")
    # The chat template comes along: the LoRA run and its merge chat, and say the same.
    assert main(["merge", str(tmp_path / "lora"), str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    replies = []
    for run in ("lora", "merged"):
        assert (tmp_path / run / "chat_template.jinja").is_file()
        monkeypatch.setattr("sys.stdin", io.StringIO("w3 w10 w6\n"))
        assert main(["chat", str(tmp_path / run), "--temperature", "0", "--max-new-tokens", "5"]) == 0
        replies.append(capsys.readouterr().out)
    assert replies[0] == replies[1] and replies[0].strip()


def test_the_llama2c_stories260K_import_fine_tunes_full_and_with_lora(tmp_path, capsys):
    """The real stories260K (llama2.c's format, a sentencepiece tokenizer with byte fallback):
    new text with characters it never saw still has no unknown tokens; both kinds of fine-tune keep
    its BOS and stop ids and lower the loss on the new text."""
    data = dataset_file("stories260K")
    imported = tmp_path / "stories260K"
    assert main(["import-llama2c", str(data / "stories260K.bin"), str(data / "tok512.bin"), str(imported)]) == 0
    text = tmp_path / "verse.txt"
    text.write_text("ROMEO: Thou art more lovely, Juliet; thy brow is fair as Æthon's. " * 60)
    base_tokens = json.loads((imported / "config.json").read_text())["tokens"]
    losses = {}
    for name, pairs in (("full", ()), ("lora", ("train.lora.rank=4", "train.lora.targets=all-linear"))):
        assert finetune(tmp_path / name, imported, text, "data.block_size=32", "train.lr=1e-2", *pairs) == 0
        out = capsys.readouterr().out
        assert "the base run's tokenizer: 512 tokens" in out and "unknown" not in out
        assert json.loads((tmp_path / name / "config.json").read_text())["tokens"] == base_tokens
        for run in (imported, tmp_path / name):
            assert main(["eval", str(run), "--data", str(text), "--block-size", "32"]) == 0
            losses[run.name] = float(capsys.readouterr().out.split()[1])
    assert losses["full"] < losses["stories260K"] and losses["lora"] < losses["stories260K"]


def test_a_bpe_base_encodes_the_new_text_with_its_own_tokenizer(text, tmp_path, capsys):
    bpe = tmp_path / "bpe"
    assert main(["train", "--config", TINY_LM, "--out", str(bpe),
                 *sets(*QUIET, "data.tokenizer=bpe", "data.vocab_size=300", "train.steps=2")]) == 0
    assert finetune(tmp_path / "ft", bpe, text, "train.steps=2") == 0
    tokenizer = Tokenizer.load(bpe / "tokenizer.json")
    train_text = split_text(text.read_text(), 0.1)[0]
    assert f"{len(tokenizer.encode(train_text)):,} training tokens" in capsys.readouterr().out
    assert (tmp_path / "ft" / "tokenizer.json").read_bytes() == (bpe / "tokenizer.json").read_bytes()


def test_train_threads_sets_torchs_threads_for_the_loop_only(base, text, tmp_path, monkeypatch, capsys):
    seen = []

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return train(*args, **kwargs)

    train = train_module.train
    monkeypatch.setattr(train_module, "train", record)
    before = torch.get_num_threads()
    assert finetune(tmp_path / "ft", base, text, "train.lora.rank=2", "train.steps=2", "train.threads=3") == 0
    assert seen == [3] and torch.get_num_threads() == before
    assert "training 2 steps on cpu, 3 thread(s)" in capsys.readouterr().out
    assert finetune(tmp_path / "bad", base, text, "train.threads=-1") == 2
    assert "threads=-1 is invalid: it must be an integer >= 0" in capsys.readouterr().err


# (adapters, losses), relative. Measured with bf16: the adapters 0.005 apart (median over tensors), 0.21 at
# most (Adam moves a weight whose gradient is near 0 by lr either way), the losses 2e-5; one trained at
# twice the rate is 0.87 apart
TOLERANCE = {"train.bf16=true": (0.5, 1e-2), "train.compile=true": (0.5, 1e-3)}


@pytest.mark.parametrize("option", ["train.bf16=true", pytest.param("train.compile=true", marks=pytest.mark.slow)])
def test_lora_fine_tunes_under_bf16_autocast_and_torch_compile(base, text, tmp_path, option):
    """The adapters trained under the option end where an fp32 eager run's from the same start end,
    to bf16's rounding, and so do the logged losses."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 on a CPU without fast bf16 says it is slow
        assert finetune(tmp_path / "ft", base, text, "train.lora.rank=2", "train.steps=4", option) == 0
    assert finetune(tmp_path / "fp32", base, text, "train.lora.rank=2", "train.steps=4") == 0
    adapters = tensors(tmp_path / "ft" / "adapters.safetensors")
    reference = tensors(tmp_path / "fp32" / "adapters.safetensors")
    assert adapters and adapters.keys() == reference.keys() and all("lora_" in k for k in adapters)
    assert any(k.endswith("lora_B") and v.abs().sum() > 0 for k, v in adapters.items())  # they trained
    for k, v in adapters.items():
        assert torch.isfinite(v).all() and (v - reference[k]).norm() <= TOLERANCE[option][0] * reference[k].norm(), k
    losses = [[r["train_loss"] for r in metric_rows(tmp_path / d) if "train_loss" in r] for d in ("ft", "fp32")]
    assert len(losses[0]) == len(losses[1]) > 0 and losses[0] == pytest.approx(losses[1], rel=TOLERANCE[option][1])


@pytest.mark.parametrize("section, agrees", [({"logit_softcap": 30.0}, False), ({"family": {"logit_softcap": 30.0}}, False),
                                             ({"logit_softcap": None}, True), ({"family": {}}, True)])
def test_a_jobs_model_section_may_give_family_settings_flat_or_nested(section, agrees):
    from handformer.tasks.lm.finetune import model_config_from_base, read_base_run

    base = read_base_run(str(Path(__file__).resolve().parent / "fixtures" / "runs" / "plain"))
    given = {k: (v, None) for k, v in section.items()}
    if agrees:
        assert model_config_from_base(given, base, "base") == base.model_cfg
    else:
        with pytest.raises(ValueError, match=r"base has family(\.logit_softcap=None|=\{\})\); a fine-tuning job keeps"):
            model_config_from_base(given, base, "base")
