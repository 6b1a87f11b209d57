"""`handformer speedrun chat`, end to end on its smoke preset (seconds): every stage trains and is
scored on held-out questions that no stage's data holds, the table and plot are written, a second
call skips the finished stages, and the result chats. The measured full run is in
docs/benchmarks.md."""

import json

import pytest

from handformer.cli import main
from handformer.tasks.speedrun_chat.pipeline import STAGES, SpeedrunChatConfig, config_for, text_reply
from handformer.tasks.speedrun_chat.problems import KINDS, ProblemSet, exact_answer, held_out, is_correct

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_smoke_run_goes_from_nothing_to_a_chat_model(tmp_path, capsys):
    out = tmp_path / "speedrun"
    assert main(["speedrun", "chat", "--preset", "smoke", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == list(STAGES)
    for stage in STAGES:
        result = report["stages"][stage]
        assert 0 <= result["accuracy"] <= 1 and set(result["per_kind"]) == set(KINDS)
        assert (out / stage / "config.json").is_file()
    table = (out / "accuracy.md").read_text()
    assert table in printed and "| + GRPO |" in table and "held-out accuracy" in table
    assert (out / "accuracy.png").stat().st_size > 1000
    assert json.loads((out / "grpo" / "config.json").read_text())["post_training"]["task"] == "grpo"

    # no held-out question in any stage's data
    problems = ProblemSet(0)
    held = problems.sample(3 * len(KINDS), "held_out", "eval")
    texts = "".join((out / "data" / name).read_text() for name in ("sft.jsonl", "dpo.jsonl", "grpo.jsonl"))
    for p in held:
        assert json.dumps(p.question)[1:-1] not in texts
    # a second call resumes: every stage is done
    assert main(["speedrun", "chat", "--preset", "smoke", "--out", str(out)]) == 0
    assert capsys.readouterr().out.count("done earlier") == len(STAGES)

    # the result chats: `chat` at temperature 0 gives the reply the scorer counted, from the prompt
    # the scorer gave
    from handformer.generation.chat_template import load_chat_template
    from handformer.tasks.lm.chat import chat

    limit, template = config_for("smoke", {}).grpo_max_new_tokens, load_chat_template(out / "grpo")
    for example in report["stages"]["grpo"]["examples"][:4]:
        session = chat(out / "grpo", temperature=0, max_new_tokens=limit)
        assert session.send(example["question"]) == example["reply"], example
        asked = [{"role": "user", "content": example["question"]}]
        assert session.encode(session.messages[:1]) == \
            session.tokenizer.encode_with_special_tokens(template.render(asked, True))


def test_held_out_keys_are_never_drawn_for_training():
    problems = ProblemSet(0)
    train = problems.sample(400, "train", "sft")
    held = problems.sample(40, "held_out", "eval")
    assert not {(p.kind, p.key) for p in train} & {(p.kind, p.key) for p in held}
    assert all(held_out(p.kind, p.key, 0) for p in held) and not any(held_out(p.kind, p.key, 0) for p in train)
    assert problems.sample(8, "train", "sft") == ProblemSet(0).sample(8, "train", "sft")  # deterministic
    assert {p.kind for p in held} == set(KINDS)


def test_the_full_presets_held_out_questions_exist_and_too_many_is_a_clear_error():
    problems = ProblemSet(0)
    n = SpeedrunChatConfig().eval_per_kind
    held = problems.sample(n * len(KINDS), "held_out", "eval")
    assert all(sum(p.kind == k for p in held) == n for k in KINDS)
    assert len({(p.kind, p.key) for p in held}) == len(held)
    with pytest.raises(ValueError, match=r"spelling: only 92 distinct held-out questions .* lower eval_per_kind"):
        problems.sample(100 * len(KINDS), "held_out", "eval")


def test_a_base_model_that_continues_each_statement_right_is_scored_right():
    """The base model is asked with the statement's beginning; the statement's own continuation
    must count as the right answer in every task (counting's ends with " times")."""
    for p in ProblemSet(0).sample(4 * len(KINDS), "held_out", "eval"):
        continuation = p.statement[len(p.prefix):]
        assert is_correct(text_reply(continuation + "\n\"other\" is", p), p.answer), (p.kind, continuation)
        assert not is_correct(text_reply(" x" + continuation, p), p.answer)


def test_the_reward_is_the_exact_answer():
    assert exact_answer(None, ["85", " 85.", "86", [{"role": "assistant", "content": "85"}]], ["85"] * 4) == \
        [1.0, 1.0, 0.0, 1.0]
    assert is_correct("g a r d e n", "g a r d e n") and not is_correct("garden", "g a r d e n")


@pytest.mark.parametrize("overrides, message", [({"sft_steps": 0}, "sft_steps=0 is invalid"),
                                                ({"d_model": 30}, "multiple of n_heads"),
                                                ({"sft_lr": -1.0}, "sft_lr=-1.0 is invalid"),
                                                ({"steps": 3}, "unknown field(s) steps"),
                                                ({"grpo_countdown_share": 1.5},
                                                 "grpo_countdown_share=1.5 is invalid: it must be from 0 to 1")])
def test_bad_settings_are_one_clear_error(overrides, message, tmp_path, capsys):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_for("facts", overrides)
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    assert main(["speedrun", "chat", "--out", str(tmp_path / "x"), *sets]) == 2
    assert message in capsys.readouterr().err
    assert SpeedrunChatConfig().d_model % SpeedrunChatConfig().n_heads == 0


def test_added_role_tokens_grow_the_embeddings_and_keep_the_old_logits(tmp_path):
    import torch
    from post_helpers import CORPUS, model_config

    from handformer.data.special_tokens import SpecialTokens
    from handformer.data.tokenizer import Tokenizer
    from handformer.models.causal_lm import CausalLM
    from handformer.tasks.lm.run import load_lm, save_lm_run
    from handformer.tasks.lm.vocabulary import add_special_tokens

    tok = Tokenizer.train_bpe(CORPUS, 300)
    for position in ("rope", "learned"):  # untied and tied heads
        torch.manual_seed(0)
        model = CausalLM(model_config(tok.vocab_size, position))
        base = tmp_path / f"base_{position}"
        save_lm_run(base, model, tok, SpecialTokens(bos_id=1, eos_id=2, pad_id=0))
        ids = add_special_tokens(base, tmp_path / f"grown_{position}", ["<|im_start|>", "<|im_end|>"],
                                 end_of_turn="<|im_end|>")
        grown = load_lm(tmp_path / f"grown_{position}")
        assert ids == [tok.vocab_size, tok.vocab_size + 1] and grown.model.cfg.vocab_size == tok.vocab_size + 2
        assert grown.tokens.eos_ids == [2, ids[1]] and grown.tokens.bos_id == 1
        x = torch.tensor([tok.encode("what is two plus three?")])
        with torch.no_grad():
            old, new = load_lm(base).model(x).logits, grown.model(x).logits
        torch.testing.assert_close(new[..., :tok.vocab_size], old)
        torch.testing.assert_close(grown.model.embed.weight[ids[0]], load_lm(base).model.embed.weight.mean(0))
        assert grown.tokenizer.encode_with_special_tokens("<|im_end|>") == [ids[1]]


def test_the_reasoning_presets_fit_their_replies_and_their_questions_exist():
    """Every reasoning preset's worked replies fit its token limit and, with the question, its
    context; each of its held-out and training draws exists."""
    from handformer.tasks.speedrun_chat.pipeline import PRESETS, difficulty
    from handformer.tasks.speedrun_chat.reasoning import REASONING_KINDS, ReasoningSet
    from handformer.tasks.speedrun_chat.reasoning_stages import digit_tokenizer, document

    for name in ("reasoning", "mid-reasoning"):
        cfg = config_for(name, {})
        tasks = ReasoningSet(cfg.seed, difficulty(cfg))
        held = tasks.sample(cfg.eval_per_kind * len(REASONING_KINDS), "report", "eval")
        held += tasks.sample(cfg.eval_long_sums, "report", "eval", kinds=("long_addition",))[:100]
        train = tasks.sample(300, "train", "sft")
        tok = digit_tokenizer("\n\n".join(document(t) for t in train), PRESETS[name]["vocab_size"])
        for t in held[:300] + held[-100:] + train:
            reply = len(tok.encode(t.reply(True))) + 1  # and the end-of-turn token
            # a long sum's steps use merges this small tokenizer lacks: the preset's (40,000 documents)
            # writes the longest of the 1,000 report long sums in 104 tokens, this one in 108
            assert reply <= cfg.grpo_max_new_tokens + 4 * (t.kind == "long_addition"), (name, t)
            assert len(tok.encode(t.question)) + 12 + reply <= cfg.block_size, (name, t)


def test_the_default_is_the_recipe_where_grpo_goes_past_sfts_plateau():
    """The command's default preset, `reasoning`, gives SFT 30 worked long sums, 3 times each, for
    1,200 steps, DPO no long sums and GRPO 300 steps at 2e-4; the kept `reasoning-80` differs from it
    only there (80 seen once, 600 steps, 300 long sums in DPO, GRPO 100 steps at 1e-4). The mid
    preset runs the default's post-training on half the mix for half the steps (the same passes over
    SFT's data) and GRPO 200 steps at the default's 2e-4 (the default's long sums take off after about
    120 steps at 2e-4); `mid-reasoning-80` is `reasoning-80`'s with the mid preset's scoring."""
    import re
    from collections import Counter
    from dataclasses import asdict

    from handformer.cli import build_parser
    from handformer.tasks.speedrun_chat.pipeline import difficulty
    from handformer.tasks.speedrun_chat.reasoning import ReasoningSet
    from handformer.tasks.speedrun_chat.reasoning_stages import sft_records

    def changed(name: str, base: str) -> dict:
        cfg, other = asdict(config_for(name, {})), asdict(config_for(base, {}))
        return {k: cfg[k] for k in cfg if other[k] != cfg[k]}

    assert build_parser().parse_args(["speedrun", "chat"]).preset == "reasoning"
    default = config_for("reasoning", {})
    assert (default.grpo_steps, default.grpo_prompts, default.grpo_lr) == (300, 2400, 2e-4)
    assert changed("reasoning-80", "reasoning") == {
        "sft_long_sums": 80, "sft_long_repeats": 1, "sft_steps": 600, "dpo_long_sums": 300,
        "grpo_steps": 100, "grpo_prompts": 800, "grpo_lr": 1e-4}
    scoring = {"pretrain_facts", "pretrain_pydoc_chars", "pretrain_steps", "eval_per_kind", "eval_long_sums",
               "eval_samples", "eval_split"}
    assert set(changed("mid-reasoning-80", "reasoning-80")) == scoring
    mid = changed("mid-reasoning", "reasoning")
    assert set(mid) == scoring | {"sft_conversations", "sft_steps", "grpo_steps", "grpo_prompts"}
    assert (mid["sft_conversations"], mid["sft_steps"], mid["grpo_steps"], mid["grpo_prompts"]) == (4000, 600, 200, 1600)
    cfg = config_for("mid-reasoning", {})
    records = sft_records(90, ReasoningSet(cfg.seed, difficulty(cfg)), 0, cfg.sft_long_sums, cfg.sft_long_repeats)
    questions = [r["messages"][0]["content"] for r in records]
    long = Counter(q for q in questions if "days" not in q and max(map(len, re.findall(r"\d+", q))) == 4)
    assert len(records) == 180 and len(long) == 30 and set(long.values()) == {3}
    with pytest.raises(ValueError, match=r"speedrun chat: sft_long_repeats=0 is invalid"):
        config_for("mid-reasoning", {"sft_long_repeats": 0})


def test_a_digit_is_one_token_and_the_difficulty_bounds_the_problems():
    from handformer.tasks.speedrun_chat.reasoning import Difficulty, ReasoningSet
    from handformer.tasks.speedrun_chat.reasoning_stages import digit_tokenizer, document

    tasks = ReasoningSet(0, Difficulty(addition_digits=2, countdown_numbers=3, max_days=5))
    drawn = tasks.sample(60, "train", "x")
    for t in drawn:
        if t.kind == "addition":
            assert all(10 <= int(n) <= 99 for n in t.key.split("+"))
        elif t.kind == "countdown":
            assert len(t.key.split("=")[0].split(",")) == 3
        else:
            assert 1 <= int(t.key.split("+")[1]) <= 5
    tok = digit_tokenizer("\n\n".join(document(t) for t in drawn) * 20, 300)
    pieces = tok.hf.encode("What is 4817 + 2956? 2023-03-17").tokens
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("481729562023" "0317")
    assert tok.decode(tok.encode("Add 2023-03-17 and 45.")) == "Add 2023-03-17 and 45."
    with pytest.raises(ValueError, match=r"speedrun chat: max_days=0 is invalid: it must be an integer >= 1"):
        from handformer.tasks.speedrun_chat.pipeline import difficulty
        difficulty(config_for("reasoning", {"max_days": 0}))


def test_the_table_of_a_resumed_run_leaves_a_blank_where_a_stage_has_no_long_sums():
    """A run resumed with other `eval_long_sums` holds stages scored with and without the long sums."""
    from handformer.tasks.speedrun_chat.report import accuracy_table

    def figures(greedy: float) -> dict:
        share = {"value": greedy, "interval_95": [greedy - 0.05, greedy + 0.05]}
        return {"greedy": share, "pass@4": share, "ended_and_parsed": share}

    stage = {"accuracy": 0.5, "per_kind": {"addition": 0.5}, "reasoning": figures(0.5), "seconds": 1}
    table = accuracy_table({"stages": {"base": {**stage, "long_sums": figures(0.25)}, "sft": stage}})
    base, sft = table.splitlines()[2:]
    assert "| 25.0%, 25.0% |" in base and sft.count("|") == base.count("|"), table
