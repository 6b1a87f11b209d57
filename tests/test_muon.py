"""Muon (training/muon.py): Newton-Schulz orthogonalizes, the Muon groups step exactly as
`torch.optim.Muon`, the AdamW groups as `torch.optim.AdamW`, the blocks' matrices and nothing else
go to Muon, and a Muon run resumes from its checkpoint as if never stopped."""

import functools
import json

import pytest
import torch
from helpers import missing

from handformer.cli import main
from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.training import loop
from handformer.training.checkpoint import read_safetensors
from handformer.training.loop import TrainConfig, make_optimizer
from handformer.training.muon import MuonAdamW, muon_params, newton_schulz

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def test_newton_schulz_sets_every_singular_value_near_one():
    torch.manual_seed(0)
    for shape in ((64, 16), (16, 64), (3, 16, 48)):  # rectangular: no singular value near 0
        g = torch.randn(*shape) * torch.logspace(-1, 1, shape[-1])  # scales over 2 decades
        s = torch.linalg.svdvals(newton_schulz(g).float())
        assert s.min() > 0.5 and s.max() < 1.3, (shape, s.min(), s.max())
        # the same directions as the SVD's U V^T
        u, _, vh = torch.linalg.svd(g.float(), full_matrices=False)
        cos = torch.nn.functional.cosine_similarity(newton_schulz(g).float().flatten(-2),
                                                    (u @ vh).flatten(-2), dim=-1)
        assert (cos > 0.9).all()


@pytest.mark.parametrize("shape", [(32, 32), (48, 16), (16, 48)])
@pytest.mark.parametrize("nesterov", [True, False])
def test_the_muon_groups_step_exactly_as_torch_optim_muon(shape, nesterov):
    if not hasattr(torch.optim, "Muon"):
        missing(f"torch {torch.__version__} has no torch.optim.Muon (torch >= 2.9 does)")
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(*shape)) for _ in range(3)]  # one batch of 3
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = MuonAdamW([{"params": ours, "muon": True, "weight_decay": 0.1}], lr=0.02, nesterov=nesterov,
                    ns_dtype=torch.bfloat16)
    ref = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=nesterov)
    for _ in range(6):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(*shape)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_adamw_groups_step_as_torch_optim_adamw():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = MuonAdamW([{"params": ours[:1], "weight_decay": 0.1}, {"params": ours[1:]}], lr=1e-2,
                    betas=(0.9, 0.99))
    ref = torch.optim.AdamW([{"params": theirs[:1], "weight_decay": 0.1},
                             {"params": theirs[1:], "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.99),
                            eps=1e-8, foreach=False)
    for _ in range(10):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build", [
    lambda: CausalLM(CausalLMConfig.gpt2_style(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                               max_positions=16)),
    lambda: CausalLM(CausalLMConfig.llama_style(vocab_size=40, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32,
                                                n_layers=2, max_positions=16)),
    lambda: Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2,
                                             d_ff=32, n_encoder_layers=1, n_decoder_layers=1)),
], ids=["gpt2", "llama", "seq2seq"])
def test_muon_gets_the_blocks_matrices_and_adamw_the_rest(build):
    model = build()
    names = {id(p): n for n, p in model.named_parameters()}
    matrices = {names[id(p)] for p in muon_params(model)}
    assert matrices and all(n.split(".")[-2].endswith("_proj") and n.endswith(".weight") for n in matrices)
    assert not any("embed" in n or "lm_head" in n or "generator" in n or "norm" in n for n in matrices)
    opt = make_optimizer(model, TrainConfig(optimizer="muon"), CPU)
    seen = [names[id(p)] for g in opt.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(set(names.values()))  # every parameter exactly once
    muon_group = next(g for g in opt.param_groups if g["muon"])
    assert {names[id(p)] for p in muon_group["params"]} == matrices
    assert muon_group["lr_ratio"] == pytest.approx(0.02 / 1e-3)


@pytest.mark.parametrize("override, message", [
    ({"optimizer": "sgd"}, "optimizer='sgd' is invalid: choose adamw or muon"),
    ({"muon_lr": 0}, "muon_lr=0 is invalid"),
    ({"muon_momentum": 1.0}, "muon_momentum=1.0 is invalid"),
    ({"optimizer": "muon", "parallel": "fsdp"}, "FSDP shards them"),
])
def test_bad_muon_settings_are_errors_naming_the_field(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        TrainConfig(**override)


class Crash(Exception):
    pass


def test_a_muon_run_trains_and_resumes_as_if_never_stopped(tmp_path, monkeypatch):
    """Crash at step 8 (an evaluation), resume from the step-6 checkpoint: the same validation
    losses and the same final weights and optimizer state (Muon's momentum buffers included)."""
    common = ["--config", "configs/tiny_lm.toml"] + [a for pair in (
        "train.progress=false", "train.optimizer=muon", "train.steps=10", "train.log_every=2",
        "train.eval_every=4", "train.checkpoint_every=3") for a in ("--set", pair)]
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert main(["train", *common, "--out", str(straight)]) == 0

    def crash(step, val_loss):
        if step == 8:
            raise Crash

    with monkeypatch.context() as m:
        m.setattr(loop, "train", functools.partial(loop.train, on_eval=crash))
        with pytest.raises(Crash):
            main(["train", *common, "--out", str(crashed)])
    assert main(["train", "--resume", str(crashed)]) == 0
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val_loss"] < rows[0]["train_loss"]  # it learns
    again = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("val_loss") for r in again] == [r.get("val_loss") for r in rows]
    a, _ = read_safetensors(straight / "checkpoint.safetensors")
    b, _ = read_safetensors(crashed / "checkpoint.safetensors")
    assert any("momentum_buffer" in k for k in a)  # Muon's state is in the checkpoint
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
