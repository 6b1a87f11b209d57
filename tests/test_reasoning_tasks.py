"""The reasoning tasks of `speedrun chat` (tasks/speedrun_chat/reasoning.py) and their evaluation
harness (scoring.py): the worked solutions are right step by step, the three splits never share a
problem, a reply is read and checked as the docs say (Countdown by evaluating the expression), the
reward scores form and answer, and the harness counts greedy accuracy, pass@k, the replies' form and
95 % intervals from replies, and decodes reproducibly through the engine."""

import contextlib
import functools
import io
import json
import random
import re
from collections import Counter

import pytest
from post_helpers import make_chat_base

from handformer.cli import main
from handformer.generation.chat_template import ChatTemplate, load_chat_template
from handformer.tasks.speedrun_chat import reasoning, scoring
from handformer.tasks.speedrun_chat.pipeline import STAGES, config_for
from handformer.tasks.speedrun_chat.reasoning import (
    DRAW,
    LONG_KIND,
    REASONING_KINDS,
    ReasoningSet,
    Task,
    is_right,
    parse_reply,
    reasoning_reward,
    split_of,
)
from handformer.tasks.speedrun_chat.scoring import Reply, score, wilson_interval

pytestmark = pytest.mark.usefixtures("one_thread")
QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]


def kind_and_key(question: str, digits: int = 4) -> tuple[str, str]:
    """A question's kind and key, read back from its words (to check which split it is in); a sum
    with a number of more than `digits` digits is a long sum."""
    numbers = [int(n) for n in re.findall(r"(?<![-\d])\d+(?![-\d])", question)]
    if date := re.search(r"\d{4}-\d{2}-\d{2}", question):
        return "days", f"{date.group()}+{numbers[0]}"
    if question.startswith(("Make", "Using")):
        target, given = (numbers[0], numbers[1:]) if question.startswith("Make") else (numbers[-1], numbers[:-1])
        return "countdown", f"{','.join(map(str, sorted(given)))}={target}"
    return "long_addition" if max(numbers) >= 10 ** digits else "addition", f"{numbers[0]}+{numbers[1]}"


def drawn(n: int, seed: int = 1) -> list[Task]:
    rng = random.Random(seed)
    return [DRAW[REASONING_KINDS[i % 3]](rng) for i in range(n)]


def test_every_worked_solution_is_right_line_by_line():
    for task in drawn(3000):
        assert kind_and_key(task.question) == (task.kind, task.key)  # the tests' reader is right
        for think in (True, False):
            reading = parse_reply(task.reply(think), task.kind)
            assert reading.well_formed and reading.thought == think and is_right(task.kind, task.key, reading.answer)
        lines = task.thinking.split("\n")
        for line in lines[:-1]:  # each written operation is true
            for left, right in re.findall(r"(\d+(?: ?[-+*] ?\d+)+) ?= ?(\d+)", line):
                assert eval(left) == int(right), (task, line)
        if task.kind == "addition":
            a, b = map(int, task.key.split("+"))
            digits = "".join(re.findall(r"write (\d)", task.thinking))[::-1]  # the written digits
            digits = ("1" if "carry 1 is the first digit" in task.thinking else "") + digits
            assert int(digits) == a + b, task
        if task.kind == "days":
            assert lines[-1] == f"so {task.answer}"
            assert lines[0].startswith(f"{int(task.key[8:10])} + ")


def test_countdown_tries_are_true_steps_that_miss_and_the_reply_still_answers():
    from handformer.tasks.speedrun_chat.reasoning import with_tries

    tried = 0
    for task in drawn(600):
        worked = with_tries(task, 3)
        assert worked == with_tries(task, 3) and worked.answer == task.answer  # drawn from the key
        assert worked.thinking.endswith(task.thinking) and len(worked.thinking) <= max(100, len(task.thinking))
        reading = parse_reply(worked.reply(True), task.kind)
        assert reading.well_formed and is_right(task.kind, task.key, reading.answer)
        target = task.key.split("=")[1] if task.kind == "countdown" else None
        for line in worked.thinking.split("\n")[:-1]:
            for left, right in re.findall(r"(\d+ [-+*] \d+) = (\d+)", line):
                assert eval(left) == int(right), (worked, line)
            if ", not " in line:
                tried += 1
                assert line.endswith(f", not {target}") and line.split(" = ")[1].split(",")[0] != target
    assert tried > 50 and with_tries(drawn(1)[0], 3) == drawn(1)[0]  # an addition is left as it is


def test_the_three_splits_share_no_problem_and_are_deterministic(monkeypatch):
    tasks = ReasoningSet(0)
    train = tasks.sample(900, "train", "sft")
    search = tasks.sample(300, "search", "eval")
    report = tasks.sample(300, "report", "eval")
    keys = [{(t.kind, t.key) for t in split} for split in (train, search, report)]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert len(keys[1]) == len(keys[2]) == 300  # distinct within a split
    assert all(split_of(t.kind, t.key, 0) == "report" for t in report)
    assert tasks.sample(9, "report", "eval") == ReasoningSet(0).sample(9, "report", "eval")
    assert ReasoningSet(1).sample(9, "report", "eval") != report[:9]  # the seed moves the split
    # the report split is drawn with another seed than the search's: not what the set's own seed draws
    assert (tasks.draw_seed("search"), tasks.draw_seed("report")) == (0, 1)
    monkeypatch.setattr(reasoning, "REPORT_SEED_OFFSET", 0)
    assert tasks.sample(9, "report", "eval") != report[:9]
    shares = [split_of("addition", f"{i}+7", 0) for i in range(5000)]
    assert 0.08 < shares.count("search") / 5000 < 0.12 and 0.08 < shares.count("report") / 5000 < 0.12
    with pytest.raises(ValueError, match="choose train, search, report"):
        tasks.sample(1, "held_out", "eval")


def test_a_countdown_answer_is_checked_by_evaluating_it():
    key = "3,6,7,8=24"  # 3, 6, 7, 8 make 24
    assert is_right("countdown", key, "(8 - 7 + 3) * 6")
    assert is_right("countdown", key, "6*(3+8-7)")  # another expression, the same numbers
    assert not is_right("countdown", key, "(8 - 7 + 3) * 6 + 0")  # a number not given
    assert not is_right("countdown", key, "3 * 8")  # numbers left out
    assert not is_right("countdown", key, "(8 - 7 + 3) * 7")  # wrong numbers
    assert parse_reply("__import__('os')", "countdown").answer is None
    assert parse_reply("8 / 2 * 6", "countdown").answer is None
    assert not is_right("addition", "12+30", "43") and is_right("addition", "12+30", "42")
    assert is_right("days", "2024-02-27+3", "2024-03-01")  # a leap year
    assert not is_right("days", "2023-02-27+3", "2023-03-01") and is_right("days", "2023-02-27+3", "2023-03-02")


def test_a_reply_is_read_after_its_thinking_and_in_the_kinds_form():
    assert parse_reply("<think>\n2+2=4\n</think>\n4.", "addition").answer == "4"
    assert parse_reply("<think>\n2+2=4\n</think>\nfour", "addition").answer is None
    unclosed = parse_reply("<think>\n2+2=4\n4", "addition")
    assert not unclosed.well_formed and unclosed.answer is None
    assert not parse_reply("4</think>", "addition").well_formed
    assert parse_reply(" 2024-03-01 ", "days").answer == "2024-03-01"
    assert parse_reply("2024-02-30", "days").answer is None


def test_the_reward_pays_for_the_answer_and_the_form_within_the_length():
    task = Task("addition", "What is 12 + 30?", "42", "2+0=2, write 2\n1+3=4, write 4\nso 12 + 30 = 42", "12+30")
    replies = [task.reply(True), task.reply(False), "<think>\n...\n</think>\n41", "<think>\n2+0=2", "forty-two"]
    n = len(replies)
    assert reasoning_reward([None] * n, replies, kind=["addition"] * n, key=["12+30"] * n) == [1.0, 1.0, 0.1, 0.0, 0.0]
    long = reasoning_reward([None] * 2, replies[:2], kind=["addition"] * 2, key=["12+30"] * 2, max_chars=[10, 10])
    assert long == [0.0, 1.0]  # the worked reply is past 10 characters


def test_the_wilson_interval_matches_its_formula_at_known_points():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(0, 6)[0] == 0.0 and wilson_interval(6, 6)[1] == 1.0  # exact at the ends
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(1000, 1000)[1] == 1.0 and wilson_interval(1000, 1000)[0] > 0.996
    low, high = wilson_interval(600, 1000)
    assert high - low == pytest.approx(2 * 1.96 * (0.6 * 0.4 / 1000) ** 0.5, rel=0.01)  # ~ the normal one


def test_score_counts_greedy_pass_at_k_and_the_replies_form():
    tasks = ReasoningSet(0).sample(4, "search", "eval", kinds=("addition", "days"))
    right = [Reply(t.reply(True), True) for t in tasks]
    wrong = Reply("<think>\n</think>\n0", True)
    greedy = [right[0], Reply(tasks[1].answer, False), wrong, Reply("<think>\nno end", False)]
    sampled = [[wrong, wrong], [wrong, right[1]], [wrong, wrong], [right[3], right[3]]]
    result = score(tasks, greedy, sampled)
    assert result["greedy"]["right"] == 2 and result["greedy"]["n"] == 4
    assert result["pass@2"]["right"] == 2  # questions 1 and 3 have a right sample
    assert result["sampled"]["right"] == 3 and result["sampled"]["n"] == 8
    assert result["ended"]["right"] == 2 and result["parsed"]["right"] == 3
    assert result["ended_and_parsed"]["right"] == 2
    # tasks 0 and 2 are additions (greedy: 0 right), 1 and 3 dates (greedy: 1 right, samples: both)
    assert result["per_kind"]["addition"]["greedy"]["right"] == 1
    assert result["per_kind"]["days"]["greedy"]["right"] == 1
    assert result["per_kind"]["days"]["pass@2"]["right"] == 2
    low, high = result["greedy"]["interval_95"]
    assert low < 0.5 < high
    assert "greedy 50.0% [" in scoring.figure_line(result) and "pass@2 50.0%" in scoring.figure_line(result)
    with pytest.raises(ValueError, match="one of each per task"):
        score(tasks, greedy[:3], sampled)


def test_replies_decode_through_the_engine_reproducibly(tmp_path):
    run = make_chat_base(tmp_path / "run")
    tasks = ReasoningSet(0).sample(3, "search", "eval")
    greedy, sampled = scoring.replies(run, tasks, k=3, max_new_tokens=6, seed=5)
    assert len(greedy) == 3 and [len(s) for s in sampled] == [3, 3, 3]
    assert not any(r.ended for r in greedy)  # random weights: each reply runs to the limit
    assert (greedy, sampled) == scoring.replies(run, tasks, k=3, max_new_tokens=6, seed=5)
    assert sampled != scoring.replies(run, tasks, k=3, max_new_tokens=6, seed=6)[1]
    assert len({r.text for s in sampled for r in s}) > 3  # temperature 1 samples differ
    one_at_a_time = functools.partial(scoring._run_rows, chunk=1)  # rows batched by prompt length or alone
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scoring, "_run_rows", one_at_a_time)
        assert (greedy, sampled) == scoring.replies(run, tasks, k=3, max_new_tokens=6, seed=5)


def test_a_reply_ended_by_the_end_of_turn_token_counts_as_ended(tmp_path, monkeypatch):
    """The engine replaced by a script: a right reply that ends with <|im_end|>, one cut by the
    limit and one that stops at the plain end-of-text token."""
    from handformer.data.tokenizer import Tokenizer

    run = make_chat_base(tmp_path / "run")
    tok = Tokenizer.load(run / "tokenizer.json")
    end = tok.hf.token_to_id("<|im_end|>")
    tasks = ReasoningSet(0).sample(3, "search", "eval", kinds=("addition",))
    scripts = [(tasks[0].answer, [end], "stop"), (tasks[1].answer, [], "length"), (tasks[2].answer, [tok.eos_id], "stop")]

    def run_rows(model, rows, pad_id, chunk=64):
        for i, row in enumerate(rows):
            text, stop, reason = scripts[i % 3] if i < 3 else ("", [end], "stop")
            row.tokens, row.finish_reason = tok.encode(text) + stop, reason

    monkeypatch.setattr(scoring, "_run_rows", run_rows)
    greedy, _ = scoring.replies(run, tasks, k=1, max_new_tokens=8)
    assert [r.ended for r in greedy] == [True, False, False]
    assert [r.text.strip() for r in greedy] == [t.answer for t in tasks]


def test_a_rejected_worked_reply_is_well_formed_and_wrong():
    from handformer.tasks.speedrun_chat.reasoning_stages import wrong_reply

    long = ReasoningSet(2).sample(100, "train", "test", kinds=(LONG_KIND,))
    for task in drawn(600, seed=2) + long:
        reading = parse_reply(wrong_reply(task), task.kind)
        assert reading.well_formed and reading.answer is not None
        assert not is_right(task.kind, task.key, reading.answer), task


def test_grpo_questions_follow_the_countdown_share_and_its_numbers():
    from handformer.tasks.speedrun_chat.reasoning import Difficulty
    from handformer.tasks.speedrun_chat.reasoning_stages import grpo_prompts

    tasks = ReasoningSet(0, Difficulty(3, 4, 60))
    prompts = grpo_prompts(90, tasks, countdown_share=0.6, countdown_numbers=3)
    kinds = [p["kind"] for p in prompts]
    assert (kinds.count("countdown"), kinds.count("addition"), kinds.count("days")) == (54, 18, 18)
    assert kinds[:54] != ["countdown"] * 54  # shuffled
    assert all(len(p["key"].split("=")[0].split(",")) == 3 for p in prompts if p["kind"] == "countdown")
    assert all(split_of(p["kind"], p["key"], 0) == "train" for p in prompts)
    assert len({p["key"] for p in prompts}) == 90


def test_long_sums_are_one_digit_longer_worked_right_and_drawn_where_asked():
    """The long sums GRPO targets: a number of addition_digits + 1 digits, steps that add up, read
    and checked as sums; SFT gets the few it is asked for, GRPO its share, all from the train split."""
    from handformer.tasks.speedrun_chat.reasoning import LONG_KIND, Difficulty
    from handformer.tasks.speedrun_chat.reasoning_stages import grpo_prompts, sft_records

    rng = random.Random(3)
    for task in [DRAW[LONG_KIND](rng, Difficulty(3, 4, 60)) for _ in range(500)]:
        a, b = map(int, task.key.split("+"))
        assert max(a, b) >= 1000 and min(a, b) >= 10 and max(a, b) <= 9999, task
        digits = "".join(re.findall(r"write (\d)", task.thinking))[::-1]
        digits = ("1" if "carry 1 is the first digit" in task.thinking else "") + digits
        assert int(digits) == a + b == int(task.answer), task
        assert is_right(task.kind, task.key, parse_reply(task.reply(True), task.kind).answer)
        assert not is_right(task.kind, task.key, str(a + b + 1))
    tasks = ReasoningSet(0, Difficulty(3, 4, 60))
    sft = [c["messages"][0]["content"] for c in sft_records(30, tasks, long_sums=5)]
    sums = [max(map(int, kind_and_key(q)[1].split("+"))) for q in sft if kind_and_key(q)[0] == "addition"]
    assert len(sft) == 35 and sum(n >= 1000 for n in sums) == 5
    repeated = [c["messages"][0]["content"] for c in sft_records(30, tasks, long_sums=5, long_repeats=3)]
    long = [q for q in sft if kind_and_key(q)[0] == "addition" and max(map(int, kind_and_key(q)[1].split("+"))) >= 1000]
    assert Counter(repeated) == Counter(sft + long * 2)  # the same 5 long sums, 3 times each
    prompts = grpo_prompts(50, tasks, countdown_share=0.5, long_share=0.6)
    kinds = [p["kind"] for p in prompts]
    assert (kinds.count(LONG_KIND), kinds.count("countdown")) == (30, 10)
    assert all(split_of(p["kind"], p["key"], 0) == "train" for p in prompts)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, one_thread):
    """`speedrun chat --preset smoke-reasoning`, run once: its output folder and what it printed."""
    out = tmp_path_factory.mktemp("reasoning") / "speedrun"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["speedrun", "chat", "--preset", "smoke-reasoning", "--out", str(out)]) == 0
    return out, printed.getvalue()


def test_the_smoke_reasoning_run_trains_every_stage_and_scores_it(smoke_run):
    """`speedrun chat --preset smoke-reasoning`: each stage learns from the train split only and is
    scored on the search split, greedy and pass@k with intervals; the table shows them."""
    out, printed = smoke_run
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == list(STAGES)
    for stage in STAGES:
        figures = report["stages"][stage]["reasoning"]
        assert figures["greedy"]["n"] == 6 and set(figures["per_kind"]) == set(REASONING_KINDS)
        low, high = figures["greedy"]["interval_95"]
        assert low <= figures["greedy"]["value"] <= high
        assert ("pass@2" in figures) == (stage != "base") and figures["settings"]["k"] == (0 if stage == "base" else 2)
    assert "pass@k" in (out / "accuracy.md").read_text() and "search split: greedy" in printed
    assert "note: grpo_max_new_tokens=12 " in printed  # too short for a worked reply: said, with the fix

    data = {name: (out / "data" / name).read_text() for name in ("pretrain.txt", "sft.jsonl", "dpo.jsonl", "grpo.jsonl")}
    documents = [d.split("\n")[0] for d in data["pretrain.txt"].split("\n\n") if "<think>" in d]
    sft = [json.loads(line) for line in data["sft.jsonl"].splitlines()]
    dpo = [json.loads(line) for line in data["dpo.jsonl"].splitlines()]
    questions = documents + [c["messages"][-2]["content"] for c in sft] + [p["prompt"] for p in dpo]
    assert len(documents) == 400 and all(split_of(*kind_and_key(q), 0) == "train" for q in questions)
    assert sum(kind_and_key(p["prompt"])[0] == LONG_KIND for p in dpo) == 2  # dpo_long_sums
    settings = {stage: json.loads((out / stage / "config.json").read_text())["post_training"]["settings"]
                for stage in ("dpo", "grpo")}
    assert settings["dpo"]["sft_weight"] == 1.0 and settings["grpo"]["beta"] == 0.04
    asked = [e["question"] for stage in STAGES for e in report["stages"][stage]["examples"]]
    assert asked and all(split_of(*kind_and_key(q), 0) == "search" for q in asked)
    thinking = [c["messages"][-1]["content"].startswith("<think>") for c in sft]
    assert any(thinking) and not all(thinking)
    for stage in STAGES:  # and on the long sums, apart
        assert report["stages"][stage]["long_sums"]["greedy"]["n"] == 2 and "long sums: greedy" in printed
        # sampled after SFT (GRPO's baseline) and GRPO; DPO's pairs hold none, its long sums greedy only
        assert ("pass@2" in report["stages"][stage]["long_sums"]) == (stage in ("sft", "grpo"))
    for stage in STAGES[1:]:  # each chat stage is asked with thinking and without
        assert report["stages"][stage]["reasoning"]["no_thinking"]["greedy"]["n"] == 6
    assert "no thinking" in (out / "accuracy.md").read_text()
    grpo = [json.loads(line) for line in data["grpo.jsonl"].splitlines()]
    assert all(split_of(p["kind"], p["key"], 0) == "train" for p in grpo)
    with pytest.raises(ValueError, match="tasks='sums' is invalid: choose facts or reasoning"):
        config_for("smoke", {"tasks": "sums"})
    with pytest.raises(ValueError, match="eval_split='train' is invalid: choose search or report"):
        config_for("smoke", {"eval_split": "train"})


def test_the_template_renders_both_ways_and_sft_learns_only_the_reply(smoke_run):
    """The thinking switch: enable_thinking=False ends the prompt with an empty <think> section; a
    reply without thinking is learned after that section (which the loss does not learn), a reply
    with thinking from its <think> token on."""
    from handformer.data.tokenizer import Tokenizer
    from handformer.tasks.post.records import Conversation
    from handformer.tasks.post.rendering import ConversationRenderer
    from handformer.tasks.speedrun_chat.reasoning_stages import EMPTY_THINKING

    out, _ = smoke_run
    template = load_chat_template(out / "grpo")
    header = "<|im_start|>assistant\n"
    assert template.render(QUESTION, True).endswith(header)
    assert template.render(QUESTION, True, enable_thinking=True).endswith(header)
    assert template.render(QUESTION, True, enable_thinking=False).endswith(header + EMPTY_THINKING)
    tok = Tokenizer.load(out / "base" / "tokenizer.json")
    think, end = tok.hf.token_to_id("<think>"), tok.hf.token_to_id("<|im_end|>")
    assert think is not None and tok.hf.token_to_id("</think>") is not None  # one token each
    renderer = ConversationRenderer(template, tok, [end])
    worked = "<think>\n2+0=2, write 2\n1+3=4, write 4\n</think>\n42"
    for reply in (worked, "42"):
        rendered = renderer.conversation(Conversation([*QUESTION, {"role": "assistant", "content": reply}]))
        learned = [t for t, keep in zip(rendered.ids, rendered.learned) if keep]
        assert tok.hf.decode(learned, skip_special_tokens=False) == reply + "<|im_end|>"
        assert (think in rendered.ids) and ((think in learned) == (reply == worked))


def test_the_think_flag_and_the_serve_request_reach_the_template(smoke_run, monkeypatch):
    """`handformer chat --think/--no-think` and serve's reasoning_effort set the template's
    enable_thinking: the prompt the model is given ends with the empty section only when it is off."""
    from handformer.serve.app import Routes
    from handformer.serve.openai_schema import parse_chat
    from handformer.serve.registry import load_served_models
    from handformer.tasks.speedrun_chat.reasoning_stages import EMPTY_THINKING

    out, _ = smoke_run
    prompts, render = [], ChatTemplate.render

    def recording(self, *args, **kwargs):
        prompts.append(render(self, *args, **kwargs))
        return prompts[-1]

    monkeypatch.setattr(ChatTemplate, "render", recording)
    for flag, off in (("--no-think", True), ("--think", False), (None, False)):
        monkeypatch.setattr("sys.stdin", io.StringIO("What is 12 + 30?\n"))
        args = ["chat", str(out / "grpo"), "--temperature", "0", "--max-new-tokens", "4"]
        assert main(args + ([flag] if flag else [])) == 0
        assert prompts[-1].endswith(EMPTY_THINKING) == off, flag

    models = load_served_models([f"m={out / 'grpo'}"])
    routes = Routes(models, {}, {"m": load_chat_template(out / "grpo")}, 1 << 20)
    assert routes.thinking["m"] is not None  # serve reads the run as one that thinks
    for effort, off in (("none", True), ("low", False), (None, False)):
        body = {"model": "m", "messages": QUESTION, **({"reasoning_effort": effort} if effort else {})}
        assert routes.render_chat(parse_chat(body))[3].endswith(EMPTY_THINKING) == off, effort


def test_chat_gives_the_reply_the_scorer_counted(smoke_run):
    """`chat` at temperature 0 answers a held-out question with the reply the stage's figure
    counted, from the prompt the scorer gave (the template with its thinking default)."""
    from handformer.tasks.lm.chat import chat

    out, _ = smoke_run
    scored = json.loads((out / "report.json").read_text())["stages"]["grpo"]["examples"]
    assert len({e["reply"] for e in scored}) > 1  # the replies differ by question: a wrong prompt shows
    limit = config_for("smoke-reasoning", {}).grpo_max_new_tokens
    template = load_chat_template(out / "grpo")
    for example in scored:
        session = chat(out / "grpo", temperature=0, max_new_tokens=limit)
        assert session.send(example["question"]) == example["reply"], example
        asked = [{"role": "user", "content": example["question"]}]  # the scorer's prompt, thinking on
        assert session.encode(session.messages[:1]) == \
            session.tokenizer.encode_with_special_tokens(template.render(asked, True))


def test_a_template_without_the_switch_refuses_think_and_no_think(tmp_path):
    from handformer.tasks.lm.chat import chat

    run = make_chat_base(tmp_path / "run")
    for thinking in (True, False):
        with pytest.raises(ValueError, match="has no thinking switch"):
            chat(run, thinking=thinking)
    assert chat(run, thinking=None, max_new_tokens=2, temperature=0).send("hi") is not None
