"""Mixtures of experts (handformer/nn/moe.py, handformer/training/moe_loss.py): the router and the
weighted sum against a token-by-token reference; the load-balancing loss against transformers'
`load_balancing_loss_func` on the same router logits, and on a real forward of Mixtral and
Qwen3-MoE against their own aux_loss; training from scratch with `[model.moe]` (the loss logged,
the routers trained by it); LoRA on attention and experts, merged back to the same function.
"""

import json
from pathlib import Path

import pytest
import torch
from helpers import randomize_hf, require_module

from handformer.cli import main
from handformer.config import CausalLMConfig, MoEConfig
from handformer.families import build_causal_lm
from handformer.nn.moe import MixtureOfExperts
from handformer.tasks.lm.run import load_lm
from handformer.tasks.lm.train import moe_lm_loss
from handformer.training.moe_loss import RouterLogits, load_balancing_loss

transformers = require_module("transformers", "pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]
TINY_MOE = str(ROOT / "configs" / "tiny_moe.toml")
QUIET = ("train.progress=false", "train.device=cpu")
pytestmark = pytest.mark.usefixtures("one_thread")


def sets(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


@torch.no_grad()
@pytest.mark.parametrize("normalize, d_shared", [(True, 0), (False, 0), (False, 24)])
def test_mixture_equals_each_token_through_its_chosen_experts(normalize, d_shared):
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, n_experts=5, top_k=2, d_expert=12, normalize=normalize, d_shared=d_shared)
    x = torch.randn(3, 7, 16)
    out = moe(x)
    for b in range(3):
        for t in range(7):
            token = x[b, t]
            probs = torch.softmax(moe.router(token), dim=-1)  # (E,)
            weights, chosen = probs.topk(2)
            if normalize:
                weights = weights / weights.sum()
            expected = sum(w * moe.experts[e](token) for w, e in zip(weights, chosen.tolist()))
            if d_shared:
                expected = expected + torch.sigmoid(moe.shared_expert.gate(token)) * moe.shared_expert.expert(token)
            torch.testing.assert_close(out[b, t], expected, atol=1e-6, rtol=1e-6)
    weights, _ = moe.route(x.reshape(-1, 16))
    assert torch.allclose(weights.sum(-1), torch.ones(21)) == normalize


def test_only_the_chosen_experts_compute_and_get_gradients():
    torch.manual_seed(1)
    moe = MixtureOfExperts(8, n_experts=6, top_k=1, d_expert=8)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[4, 0] = 10.0  # tokens with a positive first feature all choose expert 4
    x = torch.randn(1, 5, 8).abs()
    moe(x).sum().backward()
    got = [e.gate_proj.weight.grad is not None and bool(e.gate_proj.weight.grad.any()) for e in moe.experts]
    assert got == [False, False, False, False, True, False]


def test_load_balancing_loss_equals_transformers():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    g = torch.Generator().manual_seed(2)
    logits = tuple(torch.randn(2 * 9, 6, generator=g) * 2 for _ in range(3))  # 3 layers, B=2, T=9, E=6
    for top_k in (1, 2, 3):
        expected = load_balancing_loss_func(logits, 6, top_k)
        torch.testing.assert_close(load_balancing_loss(logits, 6, top_k), expected, atol=1e-6, rtol=1e-6)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0  # left padding of the second row
    expected = load_balancing_loss_func(logits, 6, 2, mask)
    torch.testing.assert_close(load_balancing_loss(logits, 6, 2, mask), expected, atol=1e-6, rtol=1e-6)
    even = (torch.zeros(12, 4),)  # a router that favours no expert (uniform p): the loss is top_k
    assert abs(float(load_balancing_loss(even, 4, 2)) - 2.0) < 1e-6


SIZE = dict(vocab_size=61, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
            num_hidden_layers=2, max_position_embeddings=32, attn_implementation="eager",
            rope_parameters={"rope_type": "default", "rope_theta": 1e4}, output_router_logits=True)


@torch.no_grad()
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_router_logits_and_aux_loss_of_a_forward_equal_transformers(family):
    """The router logits the hooks take from handformer's model are transformers' own, layer by
    layer, and the aux loss of them (with left padding) is the one transformers returns."""
    from handformer.convert.hf_weights import model_from_hf

    torch.manual_seed(3)
    if family == "mixtral":
        hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(**SIZE, num_local_experts=4,
                                                                        num_experts_per_tok=2))
    else:
        hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **SIZE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True))
    hf = randomize_hf(hf, 0.2)
    ours = model_from_hf(hf.config.to_dict(), hf.state_dict()).eval()
    ids = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[0, :3] = 0
    out = hf(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    with RouterLogits(ours) as routers:
        ours(ids, attention_mask=mask)
    assert len(routers.logits) == 2
    for got, expected in zip(routers.logits, out.router_logits):
        torch.testing.assert_close(got[mask.reshape(-1).bool()], expected[mask.reshape(-1).bool()],
                                   atol=1e-5, rtol=1e-5)
    aux = load_balancing_loss(routers.logits, 4, 2, mask)
    torch.testing.assert_close(aux, out.aux_loss, atol=1e-5, rtol=1e-5)
    assert not routers._hooks  # removed on leaving the block


def _tiny_moe(**overrides) -> CausalLMConfig:
    return CausalLMConfig.llama_style(vocab_size=40, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, n_layers=2,
                                      max_positions=32, moe=MoEConfig(n_experts=4, top_k=2, d_expert=16),
                                      **overrides)


def test_the_training_loss_adds_the_weighted_aux_loss_and_trains_the_routers():
    from handformer.data.text import LMBatch

    torch.manual_seed(5)
    model = build_causal_lm(_tiny_moe()).train()
    x = torch.randint(0, 40, (4, 16))
    batch = LMBatch(x[:, :-1], x[:, 1:], 4 * 15)
    moe = model.cfg.moe
    loss, metrics = moe_lm_loss(moe)(model, batch)
    aux = metrics["moe_aux_loss"] / batch.n_tokens
    plain, plain_metrics = moe_lm_loss(MoEConfig(n_experts=4, top_k=2, d_expert=16, aux_loss_coef=0.0))(model, batch)
    torch.testing.assert_close(loss - plain, torch.tensor(moe.aux_loss_coef * aux * batch.n_tokens))
    assert plain_metrics["moe_aux_loss"] == metrics["moe_aux_loss"]  # logged whatever its weight
    assert 1.5 < float(aux) < 4.0  # near top_k, what a balanced router gives
    router = model.layers[0].ffn.router.weight
    (loss - plain).backward()  # the aux term alone reaches the routers
    assert router.grad is not None and router.grad.abs().sum() > 0
    with torch.no_grad():
        assert moe_lm_loss(moe)(model.eval(), batch)[1] == {}  # eval: the cross-entropy only


def test_training_a_mixture_from_scratch_logs_its_balance(tmp_path, capsys):
    """configs/tiny_moe.toml: [model.moe] in the job; the loss falls, metrics.jsonl has
    moe_aux_loss at every logged step, and the run generates."""
    run = tmp_path / "run"
    assert main(["train", "--config", TINY_MOE, "--out", str(run), *sets(*QUIET)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train_loss" in r]
    assert len(logged) == 4 and all(1.5 < r["moe_aux_loss"] < 4.0 for r in logged)
    assert logged[-1]["train_loss"] < logged[0]["train_loss"] - 0.5
    model = load_lm(run).model
    assert model.cfg.moe == MoEConfig(n_experts=4, top_k=2, d_expert=32, normalize=True, aux_loss_coef=0.01)
    assert isinstance(model.layers[1].ffn, MixtureOfExperts) and len(model.layers[1].ffn.experts) == 4
    assert main(["generate", str(run), "--prompt", "The ", "--max-new-tokens", "8", "--temperature", "0"]) == 0
    capsys.readouterr()


def test_lora_on_attention_and_experts_trains_adapters_only_and_merges(tmp_path, capsys):
    base = tmp_path / "base"
    assert main(["train", "--config", TINY_MOE, "--out", str(base), *sets(*QUIET, "train.steps=10")]) == 0
    text = tmp_path / "text.txt"
    text.write_text("the experts of a mixture each see some of the tokens. " * 40)
    lora = tmp_path / "lora"
    assert main(["train", "--init-from", str(base), "--out", str(lora), *sets(
        *QUIET, f"data.path={text}", "data.block_size=16", "data.batch_size=8", "data.eval_batches=2",
        "train.steps=12", "train.eval_every=6", "train.lr=1e-2", "train.lora.rank=4",
        'train.lora.targets=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]')]) == 0
    run = load_lm(lora)
    adapted = {n.rsplit(".", 1)[0] for n, p in run.model.named_parameters() if "lora_" in n}
    assert "layers.0.self_attn.q_proj" in adapted and "layers.1.ffn.experts.3.down_proj" in adapted
    assert len([n for n in adapted if ".experts." in n]) == 2 * 4 * 3  # every expert's three matrices
    assert "layers.0.ffn.router" not in adapted
    rows = [json.loads(line) for line in (lora / "metrics.jsonl").read_text().splitlines()]
    assert all("moe_aux_loss" in r for r in rows if "train_loss" in r)
    merged = tmp_path / "merged"
    assert main(["merge", str(lora), str(merged)]) == 0
    ids = torch.randint(0, run.model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(load_lm(merged).model(ids).logits, run.model(ids).logits, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(load_lm(base).model(ids).logits, run.model(ids).logits)
    capsys.readouterr()


def test_experts_command_shows_where_the_router_sends_each_token(tmp_path, capsys, monkeypatch):
    """`handformer experts RUN TEXT`: every token's top-k choices counted per layer (k x T in all),
    drawn in both languages (without --lang, the locale's, as viz chooses it); a run without
    experts is one clear error."""
    from handformer.see import experts
    from handformer.see.experts import expert_choices

    run = tmp_path / "run"
    assert main(["train", "--config", TINY_MOE, "--out", str(run), *sets(*QUIET, "train.steps=5")]) == 0
    capsys.readouterr()
    text = "def f(x): return x"
    choices = expert_choices(run, text)
    assert len(choices.tokens) == len(text) and choices.counts.shape == (2, 4)
    assert choices.counts.sum(dim=1).tolist() == [2 * len(text)] * 2
    for lang in ("en", "zh"):
        out = tmp_path / f"experts_{lang}.png"
        assert main(["experts", str(run), text, "--layer", "1", "--lang", lang, "--out", str(out)]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn_in = []  # the language each figure would be drawn in
    with monkeypatch.context() as mp:
        mp.setattr(experts, "figure_experts", lambda choices, out, lang, layer: drawn_in.append(lang))
        for var in ("LC_ALL", "LC_MESSAGES", "LANGUAGE"):
            mp.delenv(var, raising=False)
        for locale in ("zh_CN.UTF-8", "en_US.UTF-8"):
            mp.setenv("LANG", locale)
            assert main(["experts", str(run), text, "--out", str(tmp_path / "experts.png")]) == 0
    assert drawn_in == ["zh", "en"]
    printed = capsys.readouterr().out
    assert "2 mixture layers of 4 experts, top 2" in printed and "layer 1: tokens per expert" in printed
    assert main(["experts", str(run), text, "--layer", "2"]) == 2
    assert "--layer 2 is out of range: the run has 2 mixture layers (0..1)" in capsys.readouterr().err
    dense = tmp_path / "dense"
    assert main(["train", "--config", str(ROOT / "configs" / "tiny_lm.toml"), "--out", str(dense),
                 *sets(*QUIET, "train.steps=2")]) == 0
    capsys.readouterr()
    assert main(["experts", str(dense), text]) == 2
    assert "is not a mixture of experts" in capsys.readouterr().err
