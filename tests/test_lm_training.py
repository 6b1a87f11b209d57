"""The language-model job: reading text, the embedded corpus, the validation split, random-window
batches, `handformer train` on an LM config (a complete run directory, overfitting, resume,
config errors), and `handformer eval` scoring a run on a text."""

import functools
import gzip
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from handformer.cli import main
from handformer.data.text import (
    LMWindows,
    load_text,
    pydoc_corpus,
    read_text,
    split_text,
    validation_batches,
)
from handformer.data.tokenizer import Tokenizer
from handformer.tasks.lm.job import LMJob
from handformer.tasks.lm.run import load_lm
from handformer.tasks.lm.scoring import eval_text, score_text
from handformer.training import loop as train_module
from handformer.training.checkpoint import read_safetensors

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TINY_LM = str(CONFIGS / "tiny_lm.toml")
FOX = "the quick brown fox jumps over the lazy dog. " * 50


pytestmark = pytest.mark.usefixtures("one_thread")


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def train_cli(out: Path, *pairs: str, config: str = TINY_LM) -> int:
    return main(["train", "--config", config, *sets("train.progress=false", "train.device=cpu", *pairs),
                 "--out", str(out)])


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock fields."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def saved_tensors(run_dir: Path, name: str) -> dict:
    tensors, _ = read_safetensors(run_dir / name)
    return {k: v for k, v in tensors.items() if not k.startswith("rng/")}


# --- reading text -------------------------------------------------------------------------------

def test_read_a_file_and_a_gzipped_file(tmp_path):
    text = "first line\nsecond line, ünïcode ✓\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "packed.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    assert read_text(tmp_path / "plain.txt") == text
    assert read_text(tmp_path / "packed.txt.gz") == text
    assert load_text(str(tmp_path / "plain.txt")) == text


def test_a_folder_is_its_files_sorted_and_joined_by_newlines(tmp_path):
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("sea\n")
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write("ay")
    (tmp_path / ".hidden").write_text("never read")
    assert read_text(tmp_path) == "ay\nbee\nsea\n"


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", b"", "empty.txt is empty"),
    ("blank.txt", b" \n\n", "blank.txt is empty"),
    ("latin1.txt", "caf\u00e9".encode("latin-1"), "latin1.txt is not UTF-8"),
    ("fake.gz", b"not gzip at all", "cannot read"),
])
def test_unusable_files_are_errors_naming_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        read_text(tmp_path / name)
    assert name in str(err.value)
    (tmp_path / "good.txt").write_text("fine")  # one bad file spoils a folder, by name
    with pytest.raises(ValueError, match=name):
        read_text(tmp_path)


def test_missing_paths_and_empty_folders_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        read_text(tmp_path / "nowhere.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no text files"):
        read_text(tmp_path / "empty")


def test_the_embedded_corpus_is_the_pydoc_topics_in_key_order():
    from pydoc_data.topics import topics

    text = pydoc_corpus()
    assert len(text) > 100_000
    assert text == pydoc_corpus() == load_text("pydoc")
    assert text == "\n".join(topics[k] for k in sorted(topics))


# --- the validation split -----------------------------------------------------------------------

def test_the_validation_split_is_the_fixed_last_fraction():
    text = pydoc_corpus()
    train, val = split_text(text, 0.1)
    assert train + val == text  # disjoint and complete
    assert len(val) == round(0.1 * len(text))
    assert split_text(text, 0.1) == (train, val)
    assert split_text(text, 0.0) == (text, "")
    with pytest.raises(ValueError, match="val_fraction"):
        split_text(text, 1.0)


def test_validation_batches_are_fixed_non_overlapping_chunks():
    ids = torch.arange(1000, dtype=torch.int32)
    T, B = 10, 4
    every = validation_batches(ids, T, B)
    starts = torch.cat([b.x[:, 0] for b in every])
    assert starts.tolist() == list(range(0, 990, 10))  # chunk k starts at k * T, all 99 of them
    assert sum(b.n_tokens for b in every) == 99 * T
    for b in every:
        assert torch.equal(b.y, b.x + 1) and b.x.dtype == torch.long
    some = validation_batches(ids, T, B, max_batches=2)
    starts = torch.cat([b.x[:, 0] for b in some])
    assert len(some) == 2 and starts[0] == 0 and starts[-1] == 980  # spread over the whole split
    assert (starts.diff() >= T).all()  # still non-overlapping
    assert all(torch.equal(a.x, b.x) for a, b in zip(some, validation_batches(ids, T, B, 2)))
    with pytest.raises(ValueError, match="validation split has 10 tokens"):
        validation_batches(ids[:10], T, B)


# --- random windows -----------------------------------------------------------------------------

def test_windows_shapes_targets_and_determinism():
    ids = torch.arange(500, dtype=torch.int32)  # token i has id i: offsets are visible
    windows = LMWindows(ids, block_size=16, batch_size=5, batches_per_epoch=7, seed=3)
    batches = windows.epoch(0)
    assert len(batches) == 7
    for b in batches:
        assert b.x.shape == b.y.shape == (5, 16) and b.x.dtype == b.y.dtype == torch.long
        assert b.n_tokens == 80
        assert torch.equal(b.y, b.x + 1)  # y is x shifted by one
        assert torch.equal(b.x, b.x[:, :1] + torch.arange(16))  # contiguous windows
    again = LMWindows(ids, 16, 5, 7, seed=3)
    assert all(torch.equal(a.x, b.x) for a, b in zip(batches, again.epoch(0)))
    assert not torch.equal(batches[0].x, windows.epoch(1)[0].x)  # epochs differ
    assert not torch.equal(batches[0].x, LMWindows(ids, 16, 5, 7, seed=4).epoch(0)[0].x)
    assert all(torch.equal(a.x, batches[i].x) for a, i in zip(batches[2:5], range(2, 5)))


def test_windows_reach_both_ends_of_the_stream():
    ids = torch.arange(19)
    batches = LMWindows(ids, block_size=16, batch_size=8, batches_per_epoch=10).epoch(0)
    starts = {int(s) for b in batches for s in b.x[:, 0]}
    assert starts == {0, 1, 2}  # the last window's target is the last token
    with pytest.raises(ValueError, match="fewer than block_size"):
        LMWindows(ids[:16], 16, 8, 10)


@st.composite
def streams(draw):
    """(n, block): a block of 1-40 tokens and a stream of at least block + 1 tokens (every draw is used)."""
    block = draw(st.integers(1, 40))
    return draw(st.integers(block + 1, 300)), block


@settings(max_examples=25, deadline=None, derandomize=True)  # the same draws in every run (CI has no database)
@given(sizes=streams(), batch=st.integers(1, 6), seed=st.integers(0, 9))
def test_every_window_is_a_slice_of_the_stream(sizes, batch, seed):
    n, block = sizes
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).int()
    for b in LMWindows(ids, block, batch, 2, seed).epoch(seed):
        for x, y in zip(b.x, b.y):
            start = int((ids == x[0]).nonzero())  # ids are distinct: the window's offset
            assert torch.equal(x, ids[start: start + block].long())
            assert torch.equal(y, ids[start + 1: start + block + 1].long())


# --- the job ------------------------------------------------------------------------------------

def test_presets_and_overrides_build_the_model_config():
    job = LMJob.from_dict({"data": {"block_size": 48},
                           "model": {"preset": "llama", "d_model": 64, "n_heads": 4, "n_kv_heads": 2,
                                     "d_ff": 96, "n_layers": 1}})
    cfg = job.model_config(vocab_size=77)
    assert (cfg.position, cfg.norm, cfg.activation, cfg.bias) == ("rope", "rmsnorm", "swiglu", False)
    assert (cfg.vocab_size, cfg.max_positions, cfg.n_kv_heads, cfg.d_model) == (77, 48, 2, 64)
    gpt2 = LMJob.from_dict({"model": {"preset": "gpt2", "max_positions": 512}}).model_config(5)
    assert (gpt2.position, gpt2.activation, gpt2.max_positions) == ("learned", "gelu_tanh", 512)
    assert LMJob.from_dict({}).train.label_smoothing == 0.0  # LM default, unless set
    assert LMJob.from_dict({"train": {"label_smoothing": 0.1}}).train.label_smoothing == 0.1


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_thread):
    """configs/tiny_lm.toml as shipped (the embedded corpus), trained once for this file."""
    run_dir = tmp_path_factory.mktemp("lm") / "tiny"
    assert train_cli(run_dir) == 0
    return run_dir


def test_tiny_config_writes_a_complete_lm_run(tiny_run):
    for name in ("config.json", "tokenizer.json", "model.safetensors", "checkpoint.safetensors",
                 "metrics.jsonl", "loss_curve.png"):
        assert (tiny_run / name).is_file(), name
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["task"] == "lm" and config["model"]["kind"] == "causal_lm"
    assert config["tokens"] == {"bos_id": None, "eos_id": None, "pad_id": 0, "eos_ids": []}
    assert config["data"]["path"] == "pydoc" and config["model"]["max_positions"] == 32
    rows = metric_rows(tiny_run)
    assert [r["step"] for r in rows if "val_loss" in r] == [20, 40]
    assert rows[-1]["val_loss"] < rows[0]["train_loss"]

    run = load_lm(tiny_run)
    assert run.tokens.bos_id is None and run.tokens.pad_id == run.tokenizer.pad_id
    assert run.model.cfg.vocab_size == run.tokenizer.vocab_size == config["model"]["vocab_size"]
    assert not run.model.training
    text = "The \"assert\" statement"
    assert run.tokenizer.decode(run.tokenizer.encode(text)) == text
    with torch.no_grad():
        logits = run.model(torch.tensor([run.tokenizer.encode(text)])).logits
    assert logits.shape == (1, len(text), run.model.cfg.vocab_size) and logits.isfinite().all()


def test_the_tokenizer_is_trained_on_the_training_split_only(tmp_path):
    (tmp_path / "text.txt").write_text("abcabcabc " * 20 + "xyz")  # x, y, z only in validation
    assert train_cli(tmp_path / "run", f"data.path={tmp_path / 'text.txt'}", "data.block_size=8",
                     "data.val_fraction=0.2", "train.steps=2", "train.eval_every=2") == 0
    tok = Tokenizer.load(tmp_path / "run" / "tokenizer.json")
    assert tok.encode("abc") != [tok.unk_id] * 3
    assert tok.encode("xyz") == [tok.unk_id] * 3


@pytest.mark.parametrize("pairs", [
    ("data.tokenizer=bpe", "data.vocab_size=300", "model.preset=llama", "model.n_kv_heads=1"),
    ("data.tokenizer=char", "model.preset=gpt2", "model.dropout=0.1"),
])
def test_a_tiny_task_is_overfit(tmp_path, pairs):
    (tmp_path / "fox.txt").write_text(FOX)
    assert train_cli(tmp_path / "run", f"data.path={tmp_path / 'fox.txt'}", "data.block_size=16",
                     "data.batch_size=16", "train.steps=60", "train.lr=1e-2", "train.eval_every=10",
                     *pairs) == 0
    val = [r["val_loss"] for r in metric_rows(tmp_path / "run") if "val_loss" in r]
    assert val[-1] < 0.5 * val[0] and val[-1] < 1.0  # the validation text is the same sentence


class Crash(Exception):
    pass


def test_resume_after_a_crash_equals_a_straight_run(tmp_path, monkeypatch, capsys):
    """Crash at step 12 (an evaluation, before its checkpoint), resume with `--resume` from the
    step-10 checkpoint: metrics and weights equal an uninterrupted run's. Dropout makes the restored
    RNG matter; 4 batches an epoch make the resumed run cross epochs."""
    (tmp_path / "fox.txt").write_text(FOX)
    pairs = (f"data.path={tmp_path / 'fox.txt'}", "data.block_size=16", "data.batches_per_epoch=4",
             "model.dropout=0.2", "train.steps=16", "train.eval_every=4", "train.checkpoint_every=5",
             "train.log_every=3", "train.accumulation=2")
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert train_cli(straight, *pairs) == 0

    def crash(step, val_loss):
        if step == 12:
            raise Crash

    with monkeypatch.context() as m:
        m.setattr(train_module, "train", functools.partial(train_module.train, on_eval=crash))
        with pytest.raises(Crash):
            train_cli(crashed, *pairs)
    _, metadata = read_safetensors(crashed / "checkpoint.safetensors")
    assert json.loads(metadata["state"])["step"] == 10
    assert main(["train", "--resume", str(crashed)]) == 0
    assert "done: 16 steps" in capsys.readouterr().out

    rows = metric_rows(straight)
    assert len({r["epoch"] for r in rows if "epoch" in r}) > 2
    assert metric_rows(crashed) == rows  # train_loss, lr, val_loss, epoch: exactly equal
    for name in ("checkpoint.safetensors", "model.safetensors"):
        a, b = saved_tensors(crashed, name), saved_tensors(straight, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("override, message", [
    ("data.block_sise=8", "[data] unknown field(s) block_sise (did you mean block_size?)"),
    ("model.d_modle=8", "[model] unknown field(s) d_modle (did you mean d_model?)"),
    ("model.bias=maybe", "[model] bias='maybe' is invalid: it must be true or false"),
    ("model.preset=bert", "preset='bert' is invalid"),
    ("model.vocab_size=50", "vocab_size is set from the tokenizer"),
    ("model.max_positions=16", "max_positions=16 is invalid"),
    ("model.n_heads=3", "d_model=32 is invalid"),
    ("data.tokenizer=word", "tokenizer='word' is invalid"),
    ("data.val_fraction=1.0", "val_fraction=1.0 is invalid"),
    ("data.block_size=0", "block_size=0 is invalid"),
    ("train.lr=0", "[train] lr=0 is invalid"),
    ("decode.beam=2", "unknown config section(s) decode"),
    ("data.path=no/such/file.txt", "no such text file or folder: no/such/file.txt"),
    ("data.val_fraction=0.00001", "validation split has 5 tokens"),
])
def test_bad_configs_are_clear_errors_naming_the_field(override, message, capsys, tmp_path):
    assert train_cli(tmp_path / "run", override) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing written before the config and data are checked


def test_an_unknown_task_is_refused(tmp_path, capsys):
    config = tmp_path / "job.toml"
    config.write_text('task = "poetry"\n')
    assert train_cli(tmp_path / "run", config=str(config)) == 2
    assert "error: unknown task 'poetry'" in capsys.readouterr().err


# --- scoring a run on text (handformer eval) ----------------------------------------------------

def window_losses_by_hand(run, text: str, block: int) -> tuple[float, int]:
    """The definition, written out: cut the ids into windows of block + 1 tokens overlapping by one,
    predict tokens 1..block of each from those before them in the window, average."""
    ids = run.tokenizer.encode(text)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - block, block):
            window = torch.tensor([ids[start:start + block + 1]])  # (1, block + 1)
            logits = run.model(window[:, :-1]).logits[0]  # (block, V)
            total += F.cross_entropy(logits, window[0, 1:], reduction="sum").item()
            count += block
    return total / count, count


def test_score_text_is_the_mean_next_token_loss_over_non_overlapping_windows(tiny_run):
    run = load_lm(tiny_run)
    text = pydoc_corpus()[:5000]
    for block in (32, 7):  # the training block size (the default) and another
        expected, count = window_losses_by_hand(run, text, block)
        score = score_text(run, text, None if block == 32 else block)
        assert score.block_size == block and score.tokens == count == score.windows * block
        assert score.loss == pytest.approx(expected, rel=1e-5)
        assert score.perplexity == pytest.approx(torch.tensor(expected).exp().item(), rel=1e-5)
        assert score.bits_per_token == pytest.approx(expected / 0.6931471805599453, rel=1e-5)
    first = score_text(run, text, 32, limit=3)
    assert first.windows == 3
    assert first.loss == pytest.approx(window_losses_by_hand(run, text[:97], 32)[0], rel=1e-5)


def test_a_sliding_window_scores_every_token_once_with_at_least_block_minus_stride_context(tiny_run):
    """Per token, by hand: target t (1 <= t <= T) comes from the first window, a later t from the
    window starting at k * stride, k = ceil((t - T) / stride): the window whose last `stride`
    tokens hold it. Its logits are those of that window's forward at position t - start - 1."""
    run = load_lm(tiny_run)
    ids = run.tokenizer.encode(pydoc_corpus()[:150])
    T, stride = 32, 8
    n_windows = (len(ids) - 1 - T) // stride + 1
    last = (n_windows - 1) * stride + T  # the last target scored
    losses, contexts = [], []
    with torch.no_grad():
        for t in range(1, last + 1):
            start = 0 if t <= T else -(-(t - T) // stride) * stride
            logits = run.model(torch.tensor([ids[start:start + T]])).logits[0, t - start - 1]
            losses.append(F.cross_entropy(logits, torch.tensor(ids[t])).item())
            contexts.append(t - start)
    assert min(contexts[T:]) == T - stride + 1  # tokens seen, the predicted one's own input included
    score = score_text(run, pydoc_corpus()[:150], T, stride=stride)
    assert (score.windows, score.tokens, score.stride) == (n_windows, last, stride)
    assert score.loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert f"windows of {T}, stride {stride})" in score.format()
    assert score_text(run, pydoc_corpus()[:150], T, stride=T) == score_text(run, pydoc_corpus()[:150], T)
    first_three = score_text(run, pydoc_corpus()[:150], T, limit=3, stride=stride)
    assert (first_three.windows, first_three.tokens) == (3, T + 2 * stride)
    assert first_three.loss == pytest.approx(sum(losses[:T + 2 * stride]) / (T + 2 * stride), rel=1e-5)


def test_the_score_does_not_depend_on_how_windows_are_batched(tiny_run, monkeypatch):
    run = load_lm(tiny_run)
    text = pydoc_corpus()[:3000]
    whole = score_text(run, text, 32, stride=8)
    monkeypatch.setattr("handformer.tasks.lm.scoring.EVAL_TOKENS_PER_BATCH", 64)  # 2 windows a forward
    split = score_text(run, text, 32, stride=8)
    assert (split.windows, split.tokens) == (whole.windows, whole.tokens)
    assert split.loss == pytest.approx(whole.loss, rel=1e-6)


def test_eval_prints_the_loss_on_the_runs_own_validation_split(tiny_run, capsys):
    run = load_lm(tiny_run)
    _, val_text = split_text(pydoc_corpus(), 0.1)
    assert eval_text(run, "val") == val_text
    expected = score_text(run, val_text)
    assert main(["eval", str(tiny_run), "--data", "val"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"loss {expected.loss:.4f} per token  perplexity {expected.perplexity:.2f}")
    assert f"({expected.tokens:,} tokens in {expected.windows:,} windows of 32)" in out
    assert "warning" not in out


def test_eval_scores_a_text_file_and_warns_about_unknown_characters(tiny_run, capsys, tmp_path):
    text = pydoc_corpus()[:2000]
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    assert main(["eval", str(tiny_run), "--data", str(tmp_path / "a.txt.gz"), "--limit", "4",
                 "--block-size", "16"]) == 0
    out = capsys.readouterr().out
    assert f"loss {score_text(load_lm(tiny_run), text, 16, 4).loss:.4f} per token" in out
    assert "(64 tokens in 4 windows of 16)" in out
    (tmp_path / "greek.txt").write_text("αβγ " * 20)  # not in the English training text
    assert main(["eval", str(tiny_run), "--data", str(tmp_path / "greek.txt")]) == 0
    # 80 characters: 2 windows of 32 score characters 1..64, of which 3 in every 4 are Greek
    assert "warning: 48 of the scored tokens are unknown to the tokenizer" in capsys.readouterr().out


def edited_run(tiny_run: Path, tmp_path: Path, edit) -> Path:
    """A copy of the tiny run whose config.json went through `edit`."""
    run_dir = tmp_path / "edited"
    run_dir.mkdir()
    for name in ("tokenizer.json", "model.safetensors"):
        (run_dir / name).write_bytes((tiny_run / name).read_bytes())
    config = json.loads((tiny_run / "config.json").read_text())
    edit(config)
    (run_dir / "config.json").write_text(json.dumps(config))
    return run_dir


@pytest.mark.parametrize("args, message", [
    (["--data", "val", "--block-size", "33"], "block size 33 is invalid: it must be between 1 and "
                                              "the model's context length (max_positions = 32)"),
    (["--data", "val", "--limit", "-1"], "limit -1 is invalid"),
    (["--data", "val", "--stride", "33"], "stride 33 is invalid: it must be between 1 and the block size (32)"),
    (["--data", "val", "--stride", "0"], "stride 0 is invalid"),
    (["--data", "a.txt", "b.txt"], "a language model scores one text"),
    (["--data", "val", "--beam", "2"], "--beam is for translation runs"),
    (["--data", "no/such.txt"], "no such text file or folder: no/such.txt"),
    (["--data", "SHORT"], "the text has 10 tokens; scoring needs at least block size + 1 = 33"),
])
def test_eval_errors_on_a_language_model_name_the_problem(tiny_run, args, message, capsys, tmp_path):
    (tmp_path / "short.txt").write_text("0123456789")
    args = [str(tmp_path / "short.txt") if a == "SHORT" else a for a in args]
    assert main(["eval", str(tiny_run), *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("data"), "no training data recorded in its config.json"),
    (lambda c: c["data"].update(val_fraction=0.0), "trained without a validation split"),
    (lambda c: c["data"].update(path="gone/text.txt"),
     "no such text file or folder: gone/text.txt (the run's training text, from its config.json)"),
])
def test_eval_on_val_needs_the_runs_validation_split(tiny_run, tmp_path, edit, message, capsys):
    assert main(["eval", str(edited_run(tiny_run, tmp_path, edit)), "--data", "val"]) == 2
    assert message in capsys.readouterr().err


# --- torch.compile (train.compile = true) -------------------------------------------------------

@pytest.mark.parametrize("style", ["gpt2_style", "llama_style"])
def test_the_training_forward_compiles_into_one_graph(style):
    """The input checks that read values (token-id range, positions past max_positions) step aside
    inside torch.compile, so the compiled training forward has no graph breaks (each would split
    the graph and sync the device); the eager forward still checks."""
    from handformer.config import CausalLMConfig
    from handformer.models.causal_lm import CausalLM

    model = CausalLM(getattr(CausalLMConfig, style)(vocab_size=50, d_model=16, n_heads=2, n_kv_heads=1,
                                                    d_ff=32, n_layers=1, max_positions=16))
    explained = torch._dynamo.explain(model)(torch.randint(0, 50, (2, 8)))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    with pytest.raises(ValueError, match="token id 50, outside the vocabulary"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match="needs 17 positions but the model has max_positions=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
