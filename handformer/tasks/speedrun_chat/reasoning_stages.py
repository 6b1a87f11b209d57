"""Each stage's data and evaluation when `speedrun chat` runs the reasoning tasks (`tasks =
"reasoning"`, reasoning.py): what pretraining, SFT, DPO and GRPO learn from, and how a stage's
run is scored on held-out questions.

    pretraining  worked solutions as text (question, <think> steps </think>, answer), with the
                 facts the steps use (the days of each month, sums of two digits)
    sft          one-turn conversations: half with the worked steps inside <think>...</think>,
                 half answered directly, rendered as the template renders enable_thinking=False
                 (an empty <think></think> written before the answer, not learned); and a few
                 worked long sums (one digit longer than the rest)
    dpo          the worked reply over the SFT model's own wrong reply (or, where it was right,
                 over a worked reply whose last step went wrong)
    grpo         the questions with their kind and key: reasoning_reward checks the answer, the
                 form and the length; most of them long sums, which SFT saw a few worked examples of

The chat template (CHAT_TEMPLATE) is ChatML with Qwen3's thinking switch: a reply that does not
open `<think>` is written after an empty section `<think>\n\n</think>\n`, outside the text the
loss learns, and `enable_thinking=False` ends the generation prompt with that empty section; left
undefined or true, the prompt ends at the assistant header and the model opens `<think>` itself
(learned from the replies that think). So one model answers both ways, and the switch is the
template's (`handformer chat --no-think`, serve's `reasoning_effort: "none"`).

Every stage draws from the `train` split; the evaluation asks the `search` split (the recipe
search looks at it) or, once at the end, the `report` split (`eval_split`).
"""

from __future__ import annotations

import calendar
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from handformer.data.tokenizer import SPECIAL_TOKENS, UNK, Tokenizer
from handformer.tasks.lm.run import load_lm
from handformer.tasks.speedrun_chat.reasoning import (
    LONG_KIND,
    REASONING_KINDS,
    SUM_KINDS,
    THINK_CLOSE,
    THINK_OPEN,
    ReasoningSet,
    Task,
    parse_reply,
    with_tries,
)
from handformer.tasks.speedrun_chat.scoring import Reply, greedy, replies, score

REWARD = "handformer.tasks.speedrun_chat.reasoning:reasoning_reward"
THINK_SHARE = 0.5  # SFT conversations with the worked steps
THINK_TOKENS = (THINK_OPEN, THINK_CLOSE)  # tokens of their own (not special: a reply's text keeps them)
EMPTY_THINKING = "<think>\n\n</think>\n"  # before a reply that does not think
# A worked reply's tokens and its end: up to 98 (medians 41 to 70 a kind), measured with BPE
# vocabularies of 512 and 2,048 tokens; fewer new tokens cut every reply that thinks.
WORKED_REPLY_TOKENS = 100
# ChatML with the thinking switch; the assistant's reply and its end token marked for the loss.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% if not m['content'].startswith('<think>') %}{{ '<think>\\n\\n</think>\\n' }}{% endif %}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n' }}{% endif %}"
    "{% endif %}")


def length_note(max_new_tokens: int) -> str | None:
    """What to change when the replies' token limit cuts the worked replies (None: it does not)."""
    if max_new_tokens >= WORKED_REPLY_TOKENS:
        return None
    return (f"note: grpo_max_new_tokens={max_new_tokens} (the reply length of GRPO and of the evaluation) "
            f"cuts the worked replies (up to about {WORKED_REPLY_TOKENS} tokens), so a reply that thinks "
            f"scores 0; --set grpo_max_new_tokens={WORKED_REPLY_TOKENS + 12} --set block_size=160")


def digit_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """Byte-level BPE that never merges digits: "4817" is four tokens, so a worked step reads a
    number's digits one at a time (a merged "48" "17" hides the digits the columns add)."""
    hf = HFTokenizer(models.BPE(unk_token=UNK))
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([text], trainer=trainer)
    return Tokenizer(hf)


def facts_text(seed: int) -> list[str]:
    """The facts the worked steps stand on, as documents: the days of every month of the years the
    dates span, and every sum of two digits with a carry of 0 or 1."""
    months = [f"{calendar.month_name[m]} {y} has {calendar.monthrange(y, m)[1]} days."
              for y in range(2000, 2040) for m in range(1, 13)]
    sums = [f"{a}+{b}={a + b}" + (f"\n{a}+{b}+1={a + b + 1}") for a in range(10) for b in range(10)]
    rng = random.Random(seed)
    rng.shuffle(months)
    rng.shuffle(sums)
    return ["\n".join(months[i:i + 12]) for i in range(0, len(months), 12)] + \
        ["\n".join(sums[i:i + 10]) for i in range(0, len(sums), 10)]


def document(task: Task) -> str:
    """A worked solution as pretraining text; a base model is asked with its first line."""
    return f"{task.question}\n{task.reply(think=True)}"


def pretraining_documents(n: int, tasks: ReasoningSet) -> list[str]:
    return [document(t) for t in tasks.sample(n, "train", "pretrain")] + facts_text(tasks.seed)


def sft_records(n: int, tasks: ReasoningSet, countdown_tries: int = 0, long_sums: int = 0,
                long_repeats: int = 1) -> list[dict]:
    """One-turn conversations, THINK_SHARE of them with the worked steps (Countdown's with up to
    `countdown_tries` checked misses first, reasoning.with_tries); the others answer directly (the
    template writes the empty thinking section before them, as enable_thinking=False does). Then
    `long_sums` worked long sums, each `long_repeats` times, shuffled in."""
    rng = random.Random(f"{tasks.seed}:sft-think")
    records = [_conversation(with_tries(task, countdown_tries), rng.random() < THINK_SHARE)
               for task in tasks.sample(n, "train", "sft")]
    if long_sums:
        long = tasks.sample(long_sums, "train", "sft", kinds=(LONG_KIND,))
        records += [_conversation(task, True) for task in long] * long_repeats
        random.Random(f"{tasks.seed}:sft-long").shuffle(records)
    return records


def _conversation(task: Task, think: bool) -> dict:
    return {"messages": [{"role": "user", "content": task.question},
                         {"role": "assistant", "content": task.reply(think)}]}


def wrong_reply(task: Task) -> str:
    """A worked reply whose last step went wrong: the answer off by one (a day, a unit), Countdown's
    expression with its last number changed."""
    if task.kind == "countdown":
        head, _, last = task.answer.rpartition(" ")
        answer = f"{head} {int(last) + 1}"
    elif task.kind in SUM_KINDS:
        answer = str(int(task.answer) + 1)
    else:
        year, month, day = task.answer.split("-")
        answer = f"{year}-{month}-{int(day) % 28 + 1:02d}"
    lines = task.thinking.split("\n")
    steps = "\n".join(lines[:-1] + [f"so {answer}"])
    return Task(task.kind, task.question, answer, steps, task.key).reply(True)


def dpo_records(n: int, tasks: ReasoningSet, sft_dir: Path, max_new_tokens: int, countdown_tries: int = 0,
                long_sums: int = 0, samples: int = 4, seed: int = 0) -> tuple[list[dict], float]:
    """Pairs and the share of questions the SFT model got wrong (its reply is then the rejected);
    the chosen replies are worked as SFT's (`countdown_tries`). With `long_sums`, as many pairs on
    long sums: the worked sum over the SFT model's own wrong reply, greedy or else the first wrong
    one of `samples` at temperature 1 (on-policy: the mistakes it makes on the sums GRPO targets)."""
    pool = [with_tries(t, countdown_tries) for t in tasks.sample(n, "train", "dpo")]
    greedy, _ = replies(sft_dir, pool, k=0, max_new_tokens=max_new_tokens)
    picked = [[reply] for reply in greedy]
    if long_sums:
        long = tasks.sample(long_sums, "train", "dpo", kinds=(LONG_KIND,))
        long_greedy, sampled = replies(sft_dir, long, samples, 1.0, max_new_tokens, seed)
        pool, picked = pool + long, picked + [[g, *s] for g, s in zip(long_greedy, sampled)]
    out, wrong = [], 0
    for task, candidates in zip(pool, picked):
        mistaken = [r.text.strip() for r in candidates
                    if r.text.strip() and not score([task], [r], [[]])["greedy"]["right"]]
        wrong += bool(mistaken)
        out.append({"prompt": task.question, "chosen": task.reply(True),
                    "rejected": mistaken[0] if mistaken else wrong_reply(task)})
    if long_sums:
        random.Random(f"{tasks.seed}:dpo-mix").shuffle(out)
    return out, wrong / len(pool)


def grpo_prompts(n: int, tasks: ReasoningSet, countdown_share: float = 1 / 3,
                 countdown_numbers: int | None = None, long_share: float = 0.0) -> list[dict]:
    """`n` questions for GRPO: `long_share` of them long sums, and of the rest `countdown_share`
    Countdown (given 3 to `countdown_numbers` numbers; None: as `tasks` gives them), the others
    addition and dates in turn, shuffled. The long sums are what GRPO teaches (SFT saw a few);
    the other kinds are kept so their steps are not forgotten."""
    n_long = round(n * long_share)
    n_countdown = round((n - n_long) * countdown_share)
    numbers = countdown_numbers or tasks.level.countdown_numbers
    countdown = ReasoningSet(tasks.seed, replace(tasks.level, countdown_numbers=numbers))
    chosen = countdown.sample(n_countdown, "train", "grpo", kinds=("countdown",)) + \
        tasks.sample(n - n_long - n_countdown, "train", "grpo", kinds=("addition", "days")) + \
        (tasks.sample(n_long, "train", "grpo", kinds=(LONG_KIND,)) if n_long else [])
    random.Random(f"{tasks.seed}:grpo-mix").shuffle(chosen)
    return [{"prompt": t.question, "kind": t.kind, "key": t.key} for t in chosen]


def base_replies(run_dir: Path, held: list[Task], max_new_tokens: int) -> list[Reply]:
    """A base model asked as text: each question's first line, its continuation up to the end of
    the document (`ended` when it got there: the end-of-text token or a blank line)."""
    run = load_lm(run_dir, decoding=True)
    stops = list(run.tokens.eos_ids)
    pad = run.tokens.pad_id if run.tokens.pad_id is not None else 0
    prompts = [run.tokenizer.encode(f"{t.question}\n") for t in held]
    outs = greedy(run.model, prompts, stops, max_new_tokens, pad)
    texts = [run.tokenizer.decode(o) for o in outs]
    return [Reply(text.split("\n\n")[0], "\n\n" in text or (bool(o) and o[-1] in stops))
            for text, o in zip(texts, outs)]


def asked(stage: str, run_dir: Path, held: list[Task], k: int, max_new_tokens: int, seed: int,
          ) -> tuple[dict[str, Any], list[Reply]]:
    """`score` of a stage's replies, and its greedy replies: a base model asked as text (greedy
    only), a chat stage in its template with the thinking default, greedy and `k` samples at
    temperature 1.0."""
    if stage == "base":
        greedy, sampled = base_replies(run_dir, held, max_new_tokens), [[] for _ in held]
    else:
        greedy, sampled = replies(run_dir, held, k, 1.0, max_new_tokens, seed)
    settings = {"k": len(sampled[0]) if sampled else 0, "temperature": 1.0, "max_new_tokens": max_new_tokens,
                "seed": seed}
    return {**score(held, greedy, sampled), "settings": settings}, greedy


def stage_result(stage: str, run_dir: Path, held: list[Task], k: int, max_new_tokens: int, seed: int,
                 held_long: Sequence[Task] = (), long_k: int | None = None,
                 ) -> dict[str, Any]:
    """A stage's figures on the held-out questions: `accuracy` and `per_kind` (greedy, what the
    table and plot show) and `reasoning`, the whole of `score` (intervals, pass@k, the form); a
    chat stage is asked with the template's default (it thinks) and, greedily, with
    enable_thinking=False (`reasoning["no_thinking"]`: the same figures without pass@k). With
    `held_long`, the long sums GRPO targets are scored apart (`long_sums`, `long_accuracy`), with
    `long_k` samples a question (None: `k`)."""
    result, greedy = asked(stage, run_dir, held, k, max_new_tokens, seed)
    if stage != "base":
        direct, _ = replies(run_dir, held, 0, 1.0, max_new_tokens, seed, thinking=False)
        result["no_thinking"] = score(held, direct, [[] for _ in held])
    per_kind = {kind: result["per_kind"][kind]["greedy"]["value"]
                for kind in REASONING_KINDS if kind in result["per_kind"]}
    examples = [{"question": t.question, "reply": r.text, "answer": t.answer,
                 "read": parse_reply(r.text, t.kind).answer}
                for t, r in list(zip(held, greedy))[:: max(1, len(held) // 6)]]
    out = {"accuracy": result["greedy"]["value"], "per_kind": per_kind, "reasoning": result,
           "examples": examples}
    if held_long:
        samples = k if long_k is None else long_k
        long, _ = asked(stage, run_dir, list(held_long), samples, max_new_tokens, seed)
        out.update(long_accuracy=long["greedy"]["value"], long_sums=long)
    return out


__all__ = ["CHAT_TEMPLATE", "EMPTY_THINKING", "REWARD", "THINK_TOKENS", "WORKED_REPLY_TOKENS", "dpo_records",
           "grpo_prompts", "length_note", "pretraining_documents", "sft_records", "stage_result"]
