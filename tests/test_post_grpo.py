"""GRPO: completions sampled through the one decoding engine; TRL's GRPOTrainer, handed the same
completions (through its rollout_func), computes the same rewards, advantages and loss; the
reward function's failures are clear errors naming it; rollouts are written before they are
learned from and a resumed run reads them back to the straight run's curve."""

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import require_module
from post_helpers import CHATML, make_chat_base, post_run, quiet_sets, sums, write_jsonl

from handformer.cli import main
from handformer.convert.hf_export import export_state_dict
from handformer.tasks.lm.exports import export_hf, export_model_type
from handformer.tasks.lm.run import load_lm
from handformer.tasks.post import grpo
from handformer.tasks.post.job import GRPOConfig
from handformer.tasks.post.records import Prompt
from handformer.tasks.post.rewards import call_reward, load_reward

pytestmark = pytest.mark.usefixtures("one_thread")
TESTS = Path(__file__).resolve().parent


# loss_type, scale_rewards, beta, epsilon, iterations, temperature: each TRL setting the loss reads
CASES = [("dapo", "group", 0.04, 0.2, 2, 1.0), ("grpo", "batch", 0.0, 0.1, 2, 0.7),
         ("dr_grpo", "none", 0.1, 0.3, 1, 1.0), ("bnpo", "group", 0.0, 0.2, 2, 1.3)]


@pytest.mark.parametrize("loss_type, scale_rewards, beta, epsilon, iterations, temperature", CASES)
def test_the_loss_equals_trl_grpo_trainer_on_the_same_completions(tmp_path, loss_type, scale_rewards, beta,
                                                                 epsilon, iterations, temperature, monkeypatch):
    """Our engine samples G completions of 2 prompts and our reward scores them; TRL gets the same
    completions from its rollout_func and runs GRPOTrainer._generate_and_score_completions (its
    rewards, advantages, old and reference log-probabilities) and GRPOTrainer.compute_loss, after
    both policies moved by the same step away from the weights that sampled."""
    trl = require_module("trl", "pip install -e .[dev] (TRL is a pinned dev dependency)")
    datasets = require_module("datasets", "pip install -e .[dev]")
    transformers = require_module("transformers", "pip install -e .[dev]")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    G, max_new = 4, 6
    base = make_chat_base(tmp_path / "base", CHATML, seed=4)
    export_hf(base, tmp_path / "hf")
    cfg = GRPOConfig(reward="post_helpers:length_reward", group_size=G, max_new_tokens=max_new,
                     temperature=temperature, loss_type=loss_type, scale_rewards=scale_rewards, beta=beta,
                     epsilon=epsilon, iterations=iterations)
    prompts = [Prompt([{"role": "user", "content": "what is 2 plus 3?"}], {"answer": "5"}),
               Prompt([{"role": "user", "content": "hello there, spell cat"}], {"answer": "c a t"})]
    post = post_run(base)
    policy = load_lm(base).model
    sampler = grpo.Sampler(post, cfg, load_reward(cfg.reward), load_lm(base).model if beta else None, 96)
    sampler.model = policy
    rollout = sampler.sample(prompts, seed=11)
    assert len(rollout.completions) == 2 * G and len(set(map(tuple, rollout.completions))) > 2

    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=2 * G, num_generations=G,
                          max_completion_length=max_new, temperature=temperature, beta=beta, epsilon=epsilon,
                          loss_type=loss_type, scale_rewards=scale_rewards, num_iterations=iterations,
                          report_to="none", use_cpu=True, bf16=False)  # TRL defaults to bf16 autocast

    def rollout_func(trl_prompts, trainer):  # TRL's hook for completions made elsewhere: ours
        return {"prompt_ids": rollout.prompts, "completion_ids": rollout.completions, "logprobs": None}

    records = [{"prompt": p.prompt, "answer": p.columns["answer"]} for p in prompts]
    trainer = trl.GRPOTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float(),
                              reward_funcs=load_reward(cfg.reward), args=args, rollout_func=rollout_func,
                              processing_class=transformers.AutoTokenizer.from_pretrained(tmp_path / "hf"),
                              train_dataset=datasets.Dataset.from_list(records))
    trainer.model.train()
    inputs = trainer._generate_and_score_completions([records[0]] * G + [records[1]] * G)
    torch.testing.assert_close(inputs["advantages"], torch.tensor(rollout.advantages), atol=1e-5, rtol=0)

    # one step of the same noise on both policies: the ratio, its clipping and the KL term matter
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    moved = export_state_dict(policy.state_dict(), policy.cfg, export_model_type(load_lm(base), base))
    missing, unexpected = trainer.model.load_state_dict(moved, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing)
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's own loop sets before a step
    theirs = float(trainer.compute_loss(trainer.model, inputs))  # GRPOTrainer.compute_loss

    batch = grpo.rollout_batch(rollout, post.pad_id, cfg)
    loss, metrics = grpo.grpo_loss(policy.train(), batch, cfg)
    assert float(loss.detach()) / batch.n_tokens == pytest.approx(theirs, abs=1e-5)
    assert abs(theirs) > 1e-3
    assert {"reward", "reward_std", "completion_length", "frac_reward_zero_std"} <= set(metrics)
    assert ("kl" in metrics) == bool(beta)


def test_no_two_steps_sample_with_the_same_random_stream(tmp_path):
    """Every row of every step draws its own random numbers: two steps of the same prompts share no
    completion. (Seeds s + i handed row i of step s + 1 the numbers of row i + 1 of step s: a run
    explored with a few hundred streams, and its GRPO learned 22 points less than TRL's.)"""
    base = make_chat_base(tmp_path / "base", CHATML, seed=4)
    cfg = GRPOConfig(reward="post_helpers:length_reward", group_size=4, max_new_tokens=8, temperature=3.0)
    sampler = grpo.Sampler(post_run(base), cfg, load_reward(cfg.reward), None, 96)
    sampler.model = load_lm(base).model
    prompts = [Prompt([{"role": "user", "content": "what is 2 plus 3?"}], {"answer": "5"})] * 2
    first, second = ({tuple(c) for c in sampler.sample(prompts, seed=s).completions} for s in (11, 12))
    assert len(first) == len(second) == 8  # a random model at temperature 3: each row its own reply
    assert not first & second


def test_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv, std = grpo.group_advantages(rewards, 4, "group")
    torch.testing.assert_close(adv[:4], (rewards[:4] - 0.5) / (rewards[:4].std() + 1e-4))
    assert torch.equal(adv[4:], torch.zeros(4)) and float(std[5]) == 0
    adv, _ = grpo.group_advantages(rewards, 4, "none")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    adv, _ = grpo.group_advantages(rewards, 4, "batch")
    torch.testing.assert_close(adv[:4], (rewards[:4] - 0.5) / (rewards.std() + 1e-4))


REWARDS = '''
import time

def raises(prompts, completions, **columns):
    raise RuntimeError("no answer key")

def text(prompts, completions, **columns):
    return ["good"] * len(completions)

def short(prompts, completions, **columns):
    return [1.0]

def slow(prompts, completions, **columns):
    time.sleep(60)
    return [0.0] * len(completions)

def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)
'''


@pytest.mark.parametrize("name, message", [
    ("no_such_module:f", "importing 'no_such_module' failed"),
    ("rewards_for_test:missing", "has no function 'missing'"),
    ("rewards_for_test:raises", "rewards_for_test:raises raised RuntimeError: no answer key"),
    ("rewards_for_test:text", "returned 'good' for completion 0"),
    ("rewards_for_test:short", "returned 1 rewards for 2 completions"),
    ("rewards_for_test:slow", "ran past [grpo] reward_timeout=0.2 s"),
    ("rewards_for_test:nan", "returned nan for completion 0"),
])
def test_a_failing_reward_is_an_error_naming_the_function(tmp_path, monkeypatch, name, message):
    (tmp_path / "rewards_for_test.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("rewards_for_test", None)
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        call_reward(load_reward(name), name, [[], []], ["a", "b"], {}, timeout=0.2)
    assert message in str(err.value) and name.split(":")[0] in str(err.value)
    assert time.perf_counter() - start < 30  # the time limit stops a reward that would sleep 60 s


@pytest.fixture(scope="module")
def grpo_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo")
    base = make_chat_base(tmp / "base", CHATML)
    prompts = write_jsonl(tmp / "prompts.jsonl", [{"prompt": q, "answer": a} for q, a in sums(12)])
    return tmp, base, prompts


def grpo_config(tmp_path: Path, base: Path, data: Path, section: str = "") -> Path:
    path = tmp_path / "grpo.toml"
    path.write_text(f'task = "grpo"\n[train]\ninit_from = "{base}"\n[data]\npath = "{data}"\n'
                    f'[grpo]\nreward = "post_helpers:length_reward"\n{section}\n')
    return path


GRPO_SETS = ("train.lr=1e-2", "train.warmup=0", "train.schedule=constant", "train.log_every=1",
             "train.checkpoint_every=2", "data.batch_size=2", "grpo.group_size=3", "grpo.max_new_tokens=5")


def test_grpo_writes_its_rollouts_and_resumes_to_the_straight_run(grpo_inputs, tmp_path, monkeypatch):
    tmp, base, prompts = grpo_inputs
    monkeypatch.syspath_prepend(str(TESTS))
    config = grpo_config(tmp_path, base, prompts, "beta = 0.05\niterations = 2")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", "--config", str(config), "--out", str(straight), *quiet_sets(*GRPO_SETS, "train.steps=6")]) == 0
    assert sorted(p.name for p in (straight / grpo.ROLLOUTS).iterdir()) == ["000000.json", "000001.json",
                                                                           "000002.json"]
    rollout = json.loads((straight / grpo.ROLLOUTS / "000000.json").read_text())
    assert len(rollout["completions"]) == 6 and len(rollout["old_logps"][0]) == len(rollout["completions"][0])
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert {"reward", "reward_std", "completion_length", "kl", "frac_reward_zero_std"} <= set(rows[0])
    assert rows[-1]["kl"] > 0  # the policy moved from the reference

    assert main(["train", "--config", str(config), "--out", str(resumed), *quiet_sets(*GRPO_SETS, "train.steps=4")]) == 0
    (resumed / grpo.ROLLOUTS / "000002.json").unlink(missing_ok=True)
    assert main(["train", "--resume", str(resumed), *quiet_sets("train.steps=6")]) == 0
    got = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(rows, got, strict=True):
        for key in ("train_loss", "reward", "kl", "completion_length"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    for i in range(3):  # the same samples, read back or drawn again from the same seeds and weights
        name = f"{i:06d}.json"
        assert json.loads((resumed / grpo.ROLLOUTS / name).read_text())["completions"] == \
            json.loads((straight / grpo.ROLLOUTS / name).read_text())["completions"]


@pytest.mark.parametrize("section, message", [
    ('reward = "nomodule"', "name the reward function as \"module:function\""),
    ('reward = "no_such_module_x:f"', "importing 'no_such_module_x' failed"),
    ("group_size = 1", "group_size=1 is invalid"),
    ('loss_type = "ppo"', "loss_type='ppo' is invalid"),
    ('scale_rewards = "yes"', "scale_rewards='yes' is invalid"),
    ("temperature = 0", "temperature=0 is invalid"),
])
def test_bad_grpo_settings_are_one_clear_error(grpo_inputs, tmp_path, capsys, section, message):
    tmp, base, prompts = grpo_inputs
    config = grpo_config(tmp_path, base, prompts, section)
    text = config.read_text()
    if section.startswith("reward"):  # replace the default reward line
        text = text.replace('reward = "post_helpers:length_reward"\n', "")
    config.write_text(text)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), *quiet_sets()]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
