"""DPO: the loss and every gradient equal TRL's DPOTrainer on the same batch and weights (sigmoid,
IPO, and sigmoid with the chosen replies' log-likelihood added), the reference's log-probabilities are cached once (resumably) and equal the live
reference's, a toy preference task raises the held-out log-probability margin of the chosen reply
by at least 0.5 nats in each of 3 seeds, and `handformer train` runs, logs and resumes it."""

import json
from pathlib import Path

import pytest
import torch
from helpers import require_module
from post_helpers import CHATML, CHATML_MARKED, make_chat_base, post_run, quiet_sets, sums, write_jsonl

from handformer.cli import main
from handformer.convert.hf_export import export_state_dict
from handformer.tasks.lm.exports import export_hf, export_model_type
from handformer.tasks.lm.run import load_lm, save_lm_run
from handformer.tasks.post import dpo
from handformer.tasks.post.job import DPOConfig
from handformer.tasks.post.records import read_preferences
from handformer.training.checkpoint import read_safetensors

pytestmark = pytest.mark.usefixtures("one_thread")


def preference_lines(n: int, seed: int = 0) -> list[dict]:
    """The chosen reply answers with the sum; the rejected one does not answer."""
    return [{"prompt": q, "chosen": a, "rejected": "i do not know"} for q, a in sums(n, seed)]


def perturbed_copy(base: Path, out: Path, seed: int = 7) -> Path:
    """The base run with every weight moved a little: a policy that differs from its reference."""
    run = load_lm(base)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in run.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    save_lm_run(out, run.model, run.tokenizer, run.tokens)
    (out / "chat_template.jinja").write_text((base / "chat_template.jinja").read_text())
    return out


@pytest.mark.parametrize("loss_type,sft_weight", [("sigmoid", 0.0), ("ipo", 0.0), ("sigmoid", 0.5)])
def test_loss_and_gradients_equal_trl_dpo_trainer(tmp_path, loss_type, sft_weight, monkeypatch):
    trl = require_module("trl", "pip install -e .[dev] (TRL is a pinned dev dependency)")
    datasets = require_module("datasets", "pip install -e .[dev]")
    transformers = require_module("transformers", "pip install -e .[dev]")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = make_chat_base(tmp_path / "base", CHATML, seed=2)
    policy_dir = perturbed_copy(base, tmp_path / "policy")
    export_hf(base, tmp_path / "hf_ref")
    export_hf(policy_dir, tmp_path / "hf_policy")
    lines = preference_lines(4, seed=3)
    lines[1]["rejected"] = "it is 12, or 13"  # replies of different lengths
    records = [{"prompt": [{"role": "user", "content": r["prompt"]}],
                "chosen": [{"role": "assistant", "content": r["chosen"]}],
                "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in lines]
    beta = 0.1
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf_policy").float()
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf_ref").float()
    losses = {"loss_type": [loss_type, "sft"], "loss_weights": [1.0, sft_weight]} if sft_weight else \
        {"loss_type": [loss_type]}  # the chosen replies' log-likelihood added: TRL's "sft" loss
    args = trl.DPOConfig(output_dir=str(tmp_path / "trl"), beta=beta, **losses,
                         per_device_train_batch_size=4, report_to="none", use_cpu=True, max_length=None,
                         bf16=False)  # TRL defaults to bf16 autocast; the proof is float32 to float32
    trainer = trl.DPOTrainer(model=model, ref_model=ref, args=args, processing_class=transformers.AutoTokenizer
                             .from_pretrained(tmp_path / "hf_policy"), train_dataset=datasets.Dataset.from_list(records))
    examples = [trainer.train_dataset[i] for i in range(4)]
    trainer.model.train()
    trl_loss = trainer.compute_loss(trainer.model, dict(trainer.data_collator(examples)))  # DPOTrainer.compute_loss
    trl_loss.backward()

    policy = load_lm(policy_dir)
    path = write_jsonl(tmp_path / "pairs.jsonl", lines)
    pairs, _ = dpo.encode_pairs(read_preferences(path), post_run(policy_dir).renderer, 96, "truncate")
    for pair, ex in zip(pairs, examples):  # TRL's split of prompt and replies
        assert (pair.prompt, pair.chosen, pair.rejected) == (ex["prompt_ids"], ex["chosen_ids"], ex["rejected_ids"])
    reference = load_lm(base).model
    batch = dpo.dpo_batch(pairs, policy.tokenizer.pad_id, None)
    model_ours = policy.model.train()
    loss, metrics = dpo.dpo_loss(model_ours, batch, DPOConfig(beta=beta, loss_type=loss_type,
                                                                    sft_weight=sft_weight), reference)
    (loss / batch.n_tokens).backward()
    assert float(loss.detach()) / batch.n_tokens == pytest.approx(float(trl_loss), abs=1e-5)
    assert float(trl_loss) > 0.01 and set(metrics) >= {"rewards_chosen", "reward_accuracy", "logp_margin"}

    state = {k: (v.grad if v.grad is not None else torch.zeros_like(v))
             for k, v in model_ours.state_dict(keep_vars=True).items()}
    ours = export_state_dict(state, model_ours.cfg, export_model_type(policy, policy_dir))
    theirs = {name: p.grad for name, p in trainer.model.named_parameters()}
    assert set(ours) == set(theirs)
    for name, grad in ours.items():
        torch.testing.assert_close(grad, theirs[name], atol=1e-5, rtol=1e-4, msg=name)
    assert max(float(g.abs().max()) for g in ours.values()) > 1e-3  # the gradients are not all ~0


@pytest.fixture(scope="module")
def dpo_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dpo")
    base = make_chat_base(tmp / "base", CHATML_MARKED)
    train = write_jsonl(tmp / "pairs.jsonl", preference_lines(48, seed=0))
    held_out = write_jsonl(tmp / "held_out.jsonl", preference_lines(16, seed=99))
    return tmp, base, train, held_out


def dpo_config(tmp_path: Path, base: Path, data: Path, val: Path | None = None, dpo_section: str = "") -> Path:
    val_line = f'val_path = "{val}"\n' if val else ""
    path = tmp_path / "dpo.toml"
    path.write_text(f'task = "dpo"\n[train]\ninit_from = "{base}"\n[data]\npath = "{data}"\n{val_line}'
                    f"[dpo]\n{dpo_section}\n")
    return path


DPO_SETS = ("train.lr=3e-3", "train.warmup=2", "train.log_every=5", "data.batch_size=8")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_toy_preference_task_raises_the_held_out_margin(dpo_inputs, tmp_path, seed):
    """Held-out prompts never trained on: the mean log-probability margin chosen - rejected rises
    by at least 0.5 nats from the reference's."""
    tmp, base, train, held_out = dpo_inputs
    run = tmp_path / "run"
    assert main(["train", "--config", str(dpo_config(tmp_path, base, train, held_out)), "--out", str(run),
                 *quiet_sets(*DPO_SETS, "train.steps=24", "train.eval_every=24", f"train.seed={seed}")]) == 0
    refs, _ = read_safetensors(run / dpo.REFERENCE_FILE)
    before = float((refs["val"][:, 0] - refs["val"][:, 1]).mean())
    after = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert after["val_logp_margin"] - before >= 0.5, (before, after["val_logp_margin"])
    assert after["val_reward_accuracy"] > 0.5


def test_the_cached_reference_equals_the_live_one_and_resumes_a_cut_computation(dpo_inputs, tmp_path,
                                                                                 monkeypatch):
    tmp, base, train, _ = dpo_inputs
    run = load_lm(base)
    pairs, _ = dpo.encode_pairs(read_preferences(train), post_run(base).renderer, 96, "truncate")
    path = tmp_path / dpo.REFERENCE_FILE
    full = dpo.cached_reference(path, {"train": pairs}, lambda: run.model, 0, 8, "sha")["train"]
    assert full.shape == (48, 2)
    # the cache gives the live reference's loss
    policy = load_lm(base).model.train()
    batch = dpo.dpo_batch(pairs[:8], 0, full)
    cfg = DPOConfig()
    cached_loss, _ = dpo.dpo_loss(policy, batch, cfg)
    live_loss, _ = dpo.dpo_loss(policy, dpo.dpo_batch(pairs[:8], 0, None), cfg, run.model)
    assert float(cached_loss) == pytest.approx(float(live_loss), abs=1e-6)
    # read back, not recomputed
    assert torch.equal(dpo.cached_reference(path, {"train": pairs}, None, 0, 8, "sha")["train"], full)
    # a computation cut after its first chunk: only the rest is computed
    from safetensors.torch import save as st_save

    stamp = dpo.fingerprint(pairs, "sha")
    path.write_bytes(st_save({"train": full[:20].contiguous()}, metadata={"train": stamp}))
    computed = []
    original = dpo.reference_logps
    monkeypatch.setattr(dpo, "reference_logps", lambda m, p, *a: computed.append(len(p)) or original(m, p, *a))
    again = dpo.cached_reference(path, {"train": pairs}, lambda: run.model, 0, 8, "sha")["train"]
    assert sum(computed) == 28
    torch.testing.assert_close(again, full, atol=1e-6, rtol=0)
    # other weights: recomputed from the start
    computed.clear()
    dpo.cached_reference(path, {"train": pairs}, lambda: run.model, 0, 8, "other sha")
    assert sum(computed) == 48


def test_dpo_from_the_command_line_logs_rewards_and_resumes(dpo_inputs, tmp_path, capsys):
    tmp, base, train, held_out = dpo_inputs
    config = dpo_config(tmp_path, base, train, held_out, 'loss_type = "ipo"\nbeta = 0.5')
    steps = ("train.schedule=constant", "train.eval_every=4", "train.log_every=2")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", "--config", str(config), "--out", str(straight), *quiet_sets(*DPO_SETS, *steps,
                 "train.steps=8")]) == 0
    assert "training: 48 pairs" in capsys.readouterr().out
    assert main(["train", "--config", str(config), "--out", str(resumed), *quiet_sets(*DPO_SETS, *steps,
                 "train.steps=4")]) == 0
    assert main(["train", "--resume", str(resumed), *quiet_sets("train.steps=8")]) == 0
    assert "read from" in capsys.readouterr().out  # the cache is not computed again

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "tokens_per_s")}
                for line in (run / "metrics.jsonl").read_text().splitlines()]
    a, b = rows(straight), rows(resumed)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [2, 4, 6, 8]
    assert {"rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin", "logp_margin",
            "val_logp_margin"} <= set(a[1])
    for x, y in zip(a, b):
        assert all(x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7) for k in x)
    config_json = json.loads((straight / "config.json").read_text())
    assert config_json["post_training"] == {"task": "dpo", "settings": {"beta": 0.5, "loss_type": "ipo",
                                                                        "reference": "cached", "sft_weight": 0.0}}


@pytest.mark.parametrize("section, line, message", [
    ('loss_type = "hinge"', None, "[dpo] loss_type='hinge' is invalid"),
    ("beta = 0", None, "[dpo] beta=0 is invalid"),
    ('reference = "none"', None, "[dpo] reference='none' is invalid"),
    ("packing = true", None, "unknown field(s) packing"),
    ("", '{"prompt": "hi", "chosen": "yes"}', 'has no "rejected"'),
    ("", '{"chosen": "a", "rejected": "b"}', 'has no "prompt"'),
])
def test_bad_dpo_input_is_one_clear_error(dpo_inputs, tmp_path, capsys, section, line, message):
    tmp, base, train, _ = dpo_inputs
    data = train
    if line is not None:
        data = tmp_path / "bad.jsonl"
        data.write_text(train.read_text().splitlines()[0] + "\n" + line + "\n")
    assert main(["train", "--config", str(dpo_config(tmp_path, base, data, None, section)),
                 "--out", str(tmp_path / "run"), *quiet_sets()]) == 2
    err = capsys.readouterr().err
    assert message in err and (line is None or "bad.jsonl:2" in err)


def test_live_reference_trains_like_the_cached_one(dpo_inputs, tmp_path):
    tmp, base, train, _ = dpo_inputs
    curves = []
    for reference in ("cached", "live"):
        run = tmp_path / reference
        config = dpo_config(tmp_path, base, train, None, f'reference = "{reference}"')
        assert main(["train", "--config", str(config), "--out", str(run),
                     *quiet_sets(*DPO_SETS, "train.steps=4", "train.log_every=2", "data.val_fraction=0")]) == 0
        curves.append([json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()])
    assert curves[0] == pytest.approx(curves[1], rel=1e-5)
    assert not (tmp_path / "live" / dpo.REFERENCE_FILE).exists()
