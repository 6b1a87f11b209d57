"""Distributed training on CPU with gloo and 2 processes (forked by torch.multiprocessing): the global
batch's gradient does not depend on how it is split over ranks and micro-steps, a 2-process run
follows the single-process loss curve, checkpoints from DDP and FSDP2 runs load into a plain model,
and the data shards are disjoint. The torchrun CLI runs of the tiny configs are marked slow."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import join_ranks, spawn_ranks

from handformer.adapters.lora import LoRAConfig, add_lora
from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.data.batching import collate
from handformer.data.text import LMBatch, LMWindows, validation_batches
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.tasks.lm.train import lm_loss
from handformer.tasks.translation.train import seq2seq_loss
from handformer.training import distributed
from handformer.training.checkpoint import load_checkpoint, load_weights, read_safetensors
from handformer.training.loop import TrainConfig, forward_backward, make_optimizer, train

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2


def _model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(CausalLMConfig.from_dict({
        **CausalLMConfig.gpt2_style().to_dict(), "vocab_size": 23, "d_model": 16, "n_heads": 2,
        "d_ff": 32, "n_layers": 2, "max_positions": 8, "dropout": 0.0}))


def _global_batch() -> LMBatch:
    g = torch.Generator().manual_seed(1)
    chunk = torch.randint(0, 23, (8, 9), generator=g)  # 8 windows of T = 8, plus the next token
    return LMBatch(chunk[:, :-1], chunk[:, 1:], chunk[:, 1:].numel())


def _split(batch: LMBatch, size: int) -> list[LMBatch]:
    return [LMBatch(batch.x[i:i + size], batch.y[i:i + size], batch.y[i:i + size].numel())
            for i in range(0, len(batch.x), size)]


def _seq2seq() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(Seq2SeqConfig(
        src_vocab_size=19, tgt_vocab_size=19, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
        n_decoder_layers=1, dropout=0.0, max_positions=16))


def _padded_batches() -> list:
    """4 padded batches with different numbers of real target tokens (3 to 11 per row)."""
    g = torch.Generator().manual_seed(2)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 19, (n,), generator=g).tolist()
    sizes = [(2, 3, 9), (3, 5, 4), (2, 8, 11), (1, 6, 6)]  # (rows, source length, max target length)
    return [collate([ids(S) for _ in range(B)], [ids(1 + (i * 7) % T) for i in range(B)],
                    pad_id=0, bos_id=1, eos_id=2) for B, S, T in sizes]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


# --- gradients --------------------------------------------------------------------------------

def _grad_worker(rank: int, out: str) -> None:
    ctx = distributed.DistContext(rank, WORLD)
    cfg = TrainConfig(label_smoothing=0.0)
    results = {}
    for per_rank, accumulation in ((4, 1), (2, 2)):
        model = _model()
        ddp = distributed.wrap(model, ctx, torch.device("cpu"))
        # The loop's sharding: rank r takes batches r, r + W, ... of the global list.
        micro = list(distributed.Shard(_split(_global_batch(), per_rank), rank, WORLD))
        assert len(micro) == accumulation
        loss, tokens, _ = forward_backward(ddp, micro, lm_loss, torch.device("cpu"), cfg, ctx)
        results[f"{per_rank}x{accumulation}"] = (loss, tokens, _grads(model))
    # Padded seq2seq batches whose real tokens differ between ranks: rank 0 gets 0 and 2.
    model = _seq2seq()
    ddp = distributed.wrap(model, ctx, torch.device("cpu"))
    micro = list(distributed.Shard(_padded_batches(), rank, WORLD))
    loss, tokens, _ = forward_backward(ddp, micro, seq2seq_loss, torch.device("cpu"), cfg, ctx)
    results["seq2seq"] = (loss, tokens, _grads(model))
    if rank == 0:
        torch.save(results, out)


def test_gradients_do_not_depend_on_the_split_over_ranks_and_micro_steps(ranked):
    model = _model()
    batch = _global_batch()
    loss, tokens, _ = forward_backward(model, [batch], lm_loss, torch.device("cpu"),
                                    TrainConfig(label_smoothing=0.0))
    expected = _grads(model)
    model = _seq2seq()
    s2s_loss, s2s_tokens, _ = forward_backward(model, _padded_batches(), seq2seq_loss,
                                            torch.device("cpu"), TrainConfig(label_smoothing=0.0))
    s2s_expected = _grads(model)
    results = torch.load(ranked / "grads.pt")
    d_loss, d_tokens, grads = results.pop("seq2seq")
    assert d_tokens == s2s_tokens and d_loss == pytest.approx(s2s_loss, rel=1e-6)
    for key, g in s2s_expected.items():
        torch.testing.assert_close(grads[key], g, atol=1e-6, rtol=1e-5, msg=f"seq2seq {key}")
    for name, (d_loss, d_tokens, grads) in results.items():
        assert d_tokens == tokens == 64, name
        assert d_loss == pytest.approx(loss, rel=1e-6), name
        for key, g in expected.items():
            torch.testing.assert_close(grads[key], g, atol=1e-6, rtol=1e-5, msg=f"{name} {key}")


# --- training runs ----------------------------------------------------------------------------

def _data(batch_size: int):
    torch.manual_seed(0)
    ids = torch.randint(0, 23, (2000,))
    return (LMWindows(ids[:1800], 8, batch_size, 100, seed=0),
            validation_batches(ids[1800:], 8, 4))  # 24 chunks: 6 batches of 4


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"steps": 6, "lr": 3e-3, "schedule": "cosine", "warmup": 2,
                          "label_smoothing": 0.0, "eval_every": 3, "log_every": 1, "progress": False,
                          "clip_grad": 1.0, **kw})


def _train_worker(rank: int, run_dir: str, parallel: str) -> None:
    windows, val = _data(batch_size=4)
    train(_model(), _cfg(parallel=parallel, activation_checkpointing=parallel == "fsdp"),
          windows, val, lm_loss, run_dir)


def _curve(run_dir: Path) -> list[tuple[float, float | None]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["train_loss"], r.get("val_loss")) for r in lines]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory) -> Path:
    """The reference: one process, batches of 4 windows, accumulation 2 (a global batch of 8)."""
    run_dir = tmp_path_factory.mktemp("single")
    windows, val = _data(batch_size=4)
    train(_model(), _cfg(accumulation=2), windows, val, lm_loss, run_dir)
    return run_dir


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_follow_the_single_process_curve_and_write_plain_checkpoints(
        parallel, single_run, ranked):
    run_dir = ranked / parallel
    expected, got = _curve(single_run), _curve(run_dir)
    assert len(got) == len(expected) == 6
    for (e_train, e_val), (g_train, g_val) in zip(expected, got):
        assert g_train == pytest.approx(e_train, rel=1e-5)
        assert (g_val is None) == (e_val is None)
        if e_val is not None:
            assert g_val == pytest.approx(e_val, rel=1e-5)

    # Strict key matching into a plain model: no "module." or "_orig_mod." prefixes.
    model = _model()
    tensors, _ = read_safetensors(run_dir / "model.safetensors")
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in tensors)
    load_weights(model, run_dir / "model.safetensors")
    state = load_checkpoint(run_dir / "checkpoint.safetensors", model,
                            make_optimizer(model, _cfg(), torch.device("cpu")))
    assert state["step"] == 6 and state["position"] == 6 * 2  # global batches read this epoch
    reference = _model()
    load_weights(reference, single_run / "model.safetensors")
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def _resume_worker(rank: int, run_dir: str) -> None:
    windows, val = _data(batch_size=4)
    train(_model(), _cfg(steps=3, schedule="constant"), windows, val, lm_loss, run_dir)


def test_a_two_process_run_resumes_in_one_process_with_the_same_global_batch(ranked, tmp_path):
    """Steps 1-3 on 2 ranks (4 windows each), steps 4-6 resumed in one process with accumulation
    2: the curve of one uninterrupted single-process run, because the checkpoint counts global
    batches."""
    windows, val = _data(batch_size=4)
    reference = tmp_path / "reference"
    train(_model(), _cfg(schedule="constant", accumulation=2), windows, val, lm_loss, reference)
    resumed = ranked / "resumed"
    train(_model(), _cfg(schedule="constant", accumulation=2), windows, val, lm_loss, resumed,
          resume=True)
    for (e_train, e_val), (g_train, g_val) in zip(_curve(reference), _curve(resumed), strict=True):
        assert g_train == pytest.approx(e_train, rel=1e-5)
        assert g_val == pytest.approx(e_val, rel=1e-5) if e_val is not None else g_val is None


# --- LoRA -------------------------------------------------------------------------------------

def _lora_model() -> CausalLM:
    model = _model()
    add_lora(model, LoRAConfig(rank=2, alpha=4.0, targets="all-linear"))
    return model


def _lora_worker(rank: int, run_dir: str, parallel: str) -> None:
    windows, val = _data(batch_size=4)
    train(_lora_model(), _cfg(parallel=parallel), windows, val, lm_loss, run_dir,
          weights_file="adapters.safetensors")


# --- every 2-rank job of the default run in one start -----------------------------------------

# (job, its arguments after rank; the first is the output path under the module's folder)
JOBS = {"grads": (_grad_worker, "grads.pt"), "ddp": (_train_worker, "ddp", "ddp"),
        "fsdp": (_train_worker, "fsdp", "fsdp"), "resumed": (_resume_worker, "resumed"),
        "lora-ddp": (_lora_worker, "lora-ddp", "ddp"), "lora-fsdp": (_lora_worker, "lora-fsdp", "fsdp")}
DEFAULT_JOBS = ["grads", "ddp", "fsdp", "resumed", "lora-ddp"]  # lora-fsdp: slow, spawned by its test


def _jobs(rank: int, port: int, root: str, names: list[str]) -> None:
    """The jobs in turn in one process group: the ranks start (and import torch) once a module."""
    join_ranks(rank, port)
    for name in names:
        fn, out, *args = JOBS[name]
        fn(rank, str(Path(root) / out), *args)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranked(tmp_path_factory) -> Path:
    """The folder where every job of JOBS wrote its output (one start of 2 ranks for the module)."""
    root = tmp_path_factory.mktemp("ranked")
    spawn_ranks(_jobs, str(root), DEFAULT_JOBS)
    return root


@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_lora_on_two_processes_follows_the_single_process_curve(parallel, ranked, tmp_path):
    """Only the adapters train and are saved; the frozen base is replicated (DDP) or sharded
    (FSDP2) and never updated; the adapters equal a single process's."""
    windows, val = _data(batch_size=4)
    single = tmp_path / "single"
    train(_lora_model(), _cfg(accumulation=2), windows, val, lm_loss, single,
          weights_file="adapters.safetensors")
    if parallel == "ddp":
        two = ranked / "lora-ddp"
    else:  # slow: a spawn of its own
        spawn_ranks(_jobs, str(tmp_path), ["lora-fsdp"])
        two = tmp_path / "lora-fsdp"
    expected, got = _curve(single), _curve(two)
    assert len(got) == len(expected) == 6
    for (e_train, e_val), (g_train, g_val) in zip(expected, got):
        assert g_train == pytest.approx(e_train, rel=1e-5)
        assert g_val == pytest.approx(e_val, rel=1e-5) if e_val is not None else g_val is None
    a, _ = read_safetensors(single / "adapters.safetensors")
    b, _ = read_safetensors(two / "adapters.safetensors")
    assert sorted(a) == sorted(b) and all("lora_" in k for k in a) and len(a) == 2 * 2 * 6
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=1e-4, msg=key)
    state, _ = read_safetensors(two / "checkpoint.safetensors")
    assert {k.split("/")[1] for k in state if k.startswith("optim/")} == {str(i) for i in range(len(a))}
    model = _lora_model()  # the checkpoint loads back into a single-process LoRA model
    load_checkpoint(two / "checkpoint.safetensors", model,
                    make_optimizer(model, _cfg(), torch.device("cpu")))


# --- sharding ---------------------------------------------------------------------------------

def test_shards_are_disjoint_equal_and_cover_the_global_list():
    batches = list(range(11))
    shards = [list(distributed.Shard(batches, r, 3)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # 9 of 11: every rank steps equally
    assert distributed.Shard(batches, 1, 3)[1:3] == [4, 7]
    ctx = distributed.DistContext(rank=0, world=4)
    assert distributed.local_position(ctx, distributed.global_position(ctx, 5)) == 5
    assert distributed.local_position(distributed.DistContext(world=3), 20) == 6


def test_single_process_context_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx, device = distributed.setup("auto", "ddp")
    assert not ctx.enabled and ctx.is_main and device == "auto"
    model = _model()
    assert distributed.wrap(model, ctx, torch.device("cpu")) is model
    assert distributed.full_model_state(model, ctx) is None


def test_activation_checkpointing_keeps_gradients_and_names():
    plain, ckpt = _model(), _model()
    distributed.enable_activation_checkpointing(ckpt)
    assert list(plain.state_dict()) == list(ckpt.state_dict())
    batch = _global_batch()
    for m in (plain, ckpt):
        lm_loss(m, batch, 0.0)[0].backward()
    for (name, a), b in zip(_grads(plain).items(), _grads(ckpt).values()):
        torch.testing.assert_close(a, b, msg=name)


def test_parallel_must_be_ddp_or_fsdp():
    with pytest.raises(ValueError, match="parallel"):
        TrainConfig(parallel="zero3")


# --- the CLI under torchrun -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny_lm", "tiny_seq2seq"])
def test_torchrun_trains_the_tiny_configs(config, tmp_path):
    out = tmp_path / config
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "handformer", "train", "--config", str(ROOT / "configs" / f"{config}.toml"),
           "--out", str(out), "--set", "train.progress=false"]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=300, capture_output=True)
    assert (out / "model.safetensors").is_file() and (out / "checkpoint.safetensors").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["train_loss"] < records[0]["train_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_fine_tunes_with_lora(parallel, tmp_path):
    from handformer.cli import main

    base = tmp_path / "base"
    assert main(["train", "--config", str(ROOT / "configs" / "tiny_lm.toml"), "--out", str(base),
                 "--set", "train.progress=false", "--set", "train.steps=10"]) == 0
    out = tmp_path / "lora"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "handformer", "train", "--init-from", str(base), "--out", str(out),
           "--set", "train.progress=false", "--set", "train.steps=30", "--set", "train.lr=1e-2",
           "--set", "train.lora.rank=4", "--set", f"train.parallel={parallel}"]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=300, capture_output=True)
    assert (out / "adapters.safetensors").is_file() and not (out / "model.safetensors").exists()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert main(["generate", str(out), "--prompt", "The ", "--max-new-tokens", "5"]) == 0
