"""Zero to chat on a CPU: `handformer speedrun chat` builds a small assistant from nothing.

    1. base   a BPE tokenizer (with ChatML's role tokens reserved) and a Llama-style model
              pretrained on the tasks' facts as plain text ("37 plus 48 is 85.") and on the
              embedded pydoc corpus; the chat template written here (ChatML, replies marked; on
              the reasoning tasks with the thinking switch `enable_thinking`)
    2. sft    supervised fine-tuning on conversations of the tasks (one to three turns, some with
              a system message), the loss on the assistant's replies only, packed
    3. dpo    preference pairs on other training questions: the right answer over the SFT
              model's own wrong one (or a near miss where it was right)
    4. grpo   completions sampled for further questions, rewarded 1 for the exact answer

With `tasks = "reasoning"` the stages learn multi-step problems instead (reasoning.py: addition,
Countdown, date arithmetic, each with a worked solution inside <think>...</think>), from the data
of reasoning_stages.py, and each stage is scored greedily and by pass@k with 95 % intervals
(scoring.py) on the `search` split, or on the `report` split once at the end (`eval_split`).

After each stage the model answers the same held-out questions (problems.py: never seen in any
stage) greedily; the base model is asked with the statement's beginning ('37 plus 48 is') as
plain text, the others in the chat template. Each stage is a run directory under the output
folder (base/, sft/, dpo/, grpo/); a finished stage is skipped when the command runs again and an
interrupted one resumes from its checkpoint. `handformer chat OUT/grpo` talks to the result.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from handformer.config import dataclass_from_dict
from handformer.data.tokenizer import Tokenizer
from handformer.families.llama import LLAMA
from handformer.generation.chat_template import TEMPLATE_FILE, load_chat_template
from handformer.inference.threads import intra_op_threads
from handformer.io import atomic_write_text
from handformer.settings import is_int
from handformer.tasks.lm.job import LMJob
from handformer.tasks.lm.run import load_lm
from handformer.tasks.lm.train import run_train_lm
from handformer.tasks.post.job import PostJob
from handformer.tasks.post.train import run_post
from handformer.tasks.speedrun_chat import reasoning_stages
from handformer.tasks.speedrun_chat.problems import KINDS, Problem, ProblemSet, is_correct, wrong_answers
from handformer.tasks.speedrun_chat.reasoning import (
    LONG_KIND,
    REASONING_KINDS,
    SPLITS,
    Difficulty,
    ReasoningSet,
)
from handformer.tasks.speedrun_chat.scoring import figure_line, greedy, text_answers

ROLE_TOKENS = ("<|im_start|>", "<|im_end|>")
# ChatML, the assistant's reply and its end token marked for the loss.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SYSTEM_PROMPTS = ("You are a careful assistant. Answer with the answer only.", "Answer briefly.")
REWARD = "handformer.tasks.speedrun_chat.problems:exact_answer"
STAGES = ("base", "sft", "dpo", "grpo")
TASKS = ("facts", "reasoning")
CHOICES = {"tasks": TASKS, "eval_split": SPLITS[1:]}  # the settings that are words
DONE = "speedrun_stage.json"
# the float settings that may be 0: two shares (at most 1), then two weights
SHARES = ("grpo_countdown_share", "grpo_long_share", "grpo_beta", "dpo_sft_weight")


@dataclass
class SpeedrunChatConfig:
    seed: int = 0  # fixes the problems, the held-out split, initialization and data order
    # facts: the four tasks of problems.py | reasoning: multi-step problems with worked solutions
    # (reasoning.py)
    tasks: str = "facts"
    threads: int = 0  # torch's threads while training; 0 = one per core
    # the base model and its pretraining
    vocab_size: int = 2048  # BPE vocabulary (the role tokens come on top)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    block_size: int = 128  # the context: every stage's conversations fit it
    pretrain_facts: int = 120_000  # task statements in the pretraining text
    pretrain_pydoc_chars: int = 600_000  # characters of the pydoc corpus beside them
    pretrain_steps: int = 1500
    pretrain_batch: int = 32
    pretrain_lr: float = 3e-3
    # supervised fine-tuning
    sft_conversations: int = 8000
    sft_steps: int = 600
    sft_batch: int = 16  # windows of block_size, several conversations each
    sft_lr: float = 1e-3
    # reasoning: Countdown's worked replies in SFT and DPO first try up to this many orders and
    # operations that miss, each checked against the target (reasoning.with_tries; 0: none)
    sft_countdown_tries: int = 0
    # reasoning: worked long sums (addition_digits + 1 digits) among the SFT conversations: a few, so
    # GRPO has a skill to sharpen (docs/benchmarks.md)
    sft_long_sums: int = 0
    sft_long_repeats: int = 1  # reasoning: how many times SFT's data holds each worked long sum
    # preferences
    dpo_pairs: int = 2000
    dpo_steps: int = 150
    dpo_batch: int = 16
    dpo_lr: float = 5e-5  # 2e-4 lowered the held-out accuracy (docs/benchmarks.md)
    dpo_beta: float = 0.1
    # reasoning: pairs on long sums added to dpo_pairs, the rejected the SFT model's own wrong reply
    # (greedy, or the first wrong of eval_samples sampled; 0: none)
    dpo_long_sums: int = 0
    dpo_sft_weight: float = 0.0  # the chosen replies' log-likelihood in DPO's loss (0: none)
    # reinforcement learning with the exact-answer reward
    grpo_prompts: int = 2000
    grpo_steps: int = 60
    grpo_batch: int = 16  # prompts a step
    grpo_group: int = 8  # completions a prompt
    grpo_lr: float = 1e-4
    grpo_max_new_tokens: int = 24
    grpo_beta: float = 0.0  # weight of the KL term to the stage's start (0: none, no reference model)
    # reasoning: the share of GRPO's questions that are Countdown, and how many numbers they give
    # (3 to this many; an easier Countdown than the held-out's gives more groups a right reply)
    grpo_countdown_share: float = 1 / 3
    grpo_countdown_numbers: int = 4
    # reasoning: the share of GRPO's questions that are long sums (the rest as above)
    grpo_long_share: float = 0.0
    # evaluation
    eval_per_kind: int = 80  # held-out questions of each task (seed 0 holds out 92 words to spell)
    # reasoning: samples a question at temperature 1 (pass@k), and which held-out split is asked:
    # search (while choosing the recipe) or report (once, for the figures that are reported)
    eval_samples: int = 8
    eval_split: str = "search"
    # reasoning: held-out long sums scored apart after each stage (0: none), GRPO's target
    eval_long_sums: int = 0
    # reasoning: the task difficulty mix (reasoning.Difficulty)
    addition_digits: int = 4  # each number of a sum has 2 to this many digits
    countdown_numbers: int = 4  # a Countdown problem gives 3 to this many numbers
    max_days: int = 120  # the largest count of days a date question adds

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in CHOICES:
                if value not in CHOICES[f.name]:
                    raise ValueError(f"speedrun chat: {f.name}={value!r} is invalid: choose "
                                     f"{' or '.join(CHOICES[f.name])}")
                continue
            if f.type == "float":
                if f.name in SHARES[:2] and not 0 <= value <= 1:
                    raise ValueError(f"speedrun chat: {f.name}={value!r} is invalid: it must be from 0 to 1")
                if not (value >= 0 if f.name in SHARES else value > 0):
                    raise ValueError(f"speedrun chat: {f.name}={value!r} is invalid: it must be "
                                     f"{'>= 0' if f.name in SHARES else '> 0'}")
                continue
            low = 0 if f.name in ("seed", "threads", "pretrain_pydoc_chars", "sft_countdown_tries",
                                  "sft_long_sums", "eval_long_sums", "dpo_long_sums") else \
                3 if f.name == "grpo_countdown_numbers" else 1
            if not is_int(value) or value < low:
                raise ValueError(f"speedrun chat: {f.name}={value!r} is invalid: it must be an integer "
                                 f">= {low}")
        if self.d_model % self.n_heads:
            raise ValueError(f"speedrun chat: d_model={self.d_model} must be a multiple of "
                             f"n_heads={self.n_heads}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeedrunChatConfig:
        return dataclass_from_dict(cls, data, "speedrun chat")


PRESETS: dict[str, dict[str, Any]] = {
    "facts": {},  # the four fact tasks of problems.py, under an hour on a 2-core CPU
    # a few seconds a stage: the test suite runs the whole pipeline with it
    "smoke": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 2, "block_size": 96,
              "pretrain_facts": 400, "pretrain_pydoc_chars": 2000, "pretrain_steps": 20, "pretrain_batch": 8,
              "sft_conversations": 60, "sft_steps": 6, "sft_batch": 4, "dpo_pairs": 16, "dpo_steps": 4,
              "dpo_batch": 4, "grpo_prompts": 8, "grpo_steps": 3, "grpo_batch": 2, "grpo_group": 3,
              "grpo_max_new_tokens": 8, "eval_per_kind": 3},
}
# the smoke preset on the reasoning tasks: every stage and the pass@k evaluation in seconds
PRESETS["smoke-reasoning"] = {**PRESETS["smoke"], "tasks": "reasoning", "block_size": 160,
                              "grpo_max_new_tokens": 12, "eval_per_kind": 2, "eval_samples": 2,
                              "sft_long_sums": 2, "sft_long_repeats": 2, "dpo_long_sums": 2,
                              "dpo_sft_weight": 1.0, "grpo_long_share": 0.5, "grpo_beta": 0.04,
                              "eval_long_sums": 2}
# the reasoning tasks, the default preset (docs/benchmarks.md, "Zero to chat on a CPU": 2,043 s of CPU
# at threads=1, 35 min 32 s where it has a core of its own): digits one token each, sums of up to
# 3 digits and dates up to 60 days on, so a worked reply (up to 97 tokens) and its question fit the
# context; 1,002 held-out questions of the report split a stage, and 1,000 long sums (4 digits), GRPO's
# target. It is the recipe where GRPO teaches what SFT cannot ("RL past SFT's plateau"): SFT sees 30
# worked long sums, 3 times each, among 8,000 conversations, for 1,200 steps (its plateau on the AMD
# EPYC; 80 worked long sums for 600 steps left GRPO 6 points past SFT trained on for its time, 3,000
# lost 4 points of the base's mix). DPO sees 300 pairs of the mix and no long sums, 60 steps of 8 at
# 2e-5 with the chosen replies' log-likelihood in the loss (weight 1; long-sum pairs at 5e-5 broke the
# mix's 3-digit sums, 94% to 80%). So only GRPO, from questions alone, takes the long sums past SFT:
# 60% of its questions are long sums, rewarded on the answer alone, 300 steps at 2e-4 on 2,400 questions
# (on the Intel Xeon, greedy on the search split's long sums, SFT 35.7%: 100 steps at 1e-4 53.1%, their
# long sums still rising; 200 at 2e-4 79.8% with sampling seed 0 but 60.1% with seed 1 on the report
# split, where the long sums had not taken off by step 200; 300 steps took off with seeds 0, 1 and 2:
# docs/benchmarks.md, "Reasoning tasks").
PRESETS["reasoning"] = {
    "tasks": "reasoning", "vocab_size": 512, "block_size": 160, "addition_digits": 3, "max_days": 60,
    "pretrain_facts": 40_000, "pretrain_pydoc_chars": 100_000, "pretrain_steps": 1500,
    "sft_conversations": 8000, "sft_long_sums": 30, "sft_long_repeats": 3, "sft_steps": 1200,
    "dpo_pairs": 300, "dpo_long_sums": 0, "dpo_steps": 60, "dpo_batch": 8, "dpo_lr": 2e-5,
    "dpo_sft_weight": 1.0, "grpo_prompts": 2400, "grpo_steps": 300, "grpo_batch": 8, "grpo_lr": 2e-4,
    "grpo_long_share": 0.6, "grpo_max_new_tokens": 104, "eval_per_kind": 334, "eval_long_sums": 1000,
    "eval_split": "report"}
# the recipe search: the post-training stages on 240 questions and 100 long sums of the search split,
# from a pretrained base (`--base OUT/base` of a `reasoning` run; its own 300 steps of pretraining answer
# nothing right; SFT 150 steps broke the copying of digits, GRPO at 5e-4 the date steps). To fit 10
# minutes at one thread SFT sees half the mix (4,000 conversations and the same 30 worked long sums, 3
# times each) for half the steps, the same passes over its data; GRPO runs at the full preset's 2e-4 for
# 200 steps on 1,600 questions, two thirds of its steps (its long-sum gain on the search split, +39
# points, measured the full preset's +40; 100 steps at 1e-4 gave +27), and pass@k takes 2 samples: 597 s
# of CPU at threads=1 (docs/benchmarks.md, "The mid preset")
MID = {"pretrain_facts": 12_000, "pretrain_pydoc_chars": 50_000, "pretrain_steps": 300, "eval_per_kind": 80,
       "eval_long_sums": 100, "eval_samples": 4, "eval_split": "search"}
PRESETS["mid-reasoning"] = {**PRESETS["reasoning"], **MID, "sft_conversations": 4000, "sft_steps": 600,
                            "grpo_steps": 200, "grpo_prompts": 1600, "eval_samples": 2}
# the recipe with 80 worked long sums seen once, SFT 600 steps, DPO on 300 long sums beside the mix and
# GRPO 100 steps at 1e-4, kept only so the experiments of docs/benchmarks.md that ran it can be run
# again: there a longer SFT reaches most of what GRPO reaches (GRPO 6.1 points over SFT trained on for
# its time)
SFT_80 = {"sft_long_sums": 80, "sft_long_repeats": 1, "sft_steps": 600, "dpo_long_sums": 300,
          "grpo_steps": 100, "grpo_prompts": 800, "grpo_lr": 1e-4}
PRESETS["reasoning-80"] = {**PRESETS["reasoning"], **SFT_80}
PRESETS["mid-reasoning-80"] = {**PRESETS["reasoning-80"], **MID}


def config_for(preset: str, overrides: dict[str, Any]) -> SpeedrunChatConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose {' or '.join(PRESETS)}")
    return SpeedrunChatConfig.from_dict({**PRESETS[preset], **overrides})


# --- data ---------------------------------------------------------------------------------------

def write_jsonl(path: Path, records: list[dict]) -> Path:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return path


def pretraining_text(cfg: SpeedrunChatConfig, problems: ProblemSet | ReasoningSet) -> str:
    """Documents (separated by blank lines) of eight statements each, with pydoc paragraphs
    between them."""
    from handformer.data.text import pydoc_corpus

    if isinstance(problems, ReasoningSet):
        docs = reasoning_stages.pretraining_documents(cfg.pretrain_facts, problems)
    else:
        facts = [p.statement for p in problems.sample(cfg.pretrain_facts, "train", "pretrain")]
        docs = ["\n".join(facts[i:i + 8]) for i in range(0, len(facts), 8)]
    prose = [p.strip() for p in pydoc_corpus()[:cfg.pretrain_pydoc_chars].split("\n\n") if p.strip()]
    rng = random.Random(cfg.seed)
    mixed = docs + prose
    rng.shuffle(mixed)
    return "\n\n".join(mixed) + "\n"


def conversation(problems: list[Problem], rng: random.Random) -> dict:
    messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.3 else []
    for p in problems:
        messages += [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.answer}]
    return {"messages": messages}


def sft_records(cfg: SpeedrunChatConfig, problems: ProblemSet) -> list[dict]:
    pool = problems.sample(cfg.sft_conversations * 2, "train", "sft")
    rng, out, i = random.Random(cfg.seed + 1), [], 0
    while len(out) < cfg.sft_conversations:
        turns = rng.choice([1, 1, 2, 3])
        out.append(conversation(pool[i:i + turns], rng))
        i = (i + turns) % (len(pool) - 3)
    return out


# --- answering ----------------------------------------------------------------------------------

def chat_answers(run_dir: Path, questions: list[str], max_new_tokens: int = 24) -> list[str]:
    """The run's greedy replies to single user messages, in its chat template."""
    from handformer.generation.chat import stop_ids_for

    run = load_lm(run_dir, decoding=True)
    template = load_chat_template(run_dir)
    stops = stop_ids_for(run.tokenizer, run.tokens.eos_ids, template)
    encode = run.tokenizer.encode_with_special_tokens
    prompts = [encode(template.render([{"role": "user", "content": q}], True)) for q in questions]
    pad = run.tokens.pad_id if run.tokens.pad_id is not None else 0
    replies = greedy(run.model, prompts, stops, max_new_tokens, pad)
    decode = run.tokenizer.hf.decode
    return [decode([t for t in r if t not in stops], skip_special_tokens=True) for r in replies]


def text_reply(continuation: str, problem: Problem) -> str:
    """A base model's answer in its continuation of the statement's beginning: the first line up
    to the full stop, without what the statement has after the answer (" times")."""
    reply = continuation.split("\n")[0].split(". ")[0].strip().rstrip(".")
    return reply.removesuffix(problem.after).strip()


def accuracy(stage: str, run_dir: Path, held: list[Problem], max_new_tokens: int) -> dict[str, Any]:
    """Held-out accuracy of a stage's run, overall and per task, and a few of its answers."""
    if stage == "base":
        texts = text_answers(run_dir, [p.prefix for p in held], max_new_tokens)
        replies = [text_reply(t, p) for t, p in zip(texts, held)]
    else:
        replies = chat_answers(run_dir, [p.question for p in held], max_new_tokens)
    right = [is_correct(r, p.answer) for r, p in zip(replies, held)]
    per_kind = {k: sum(c for c, p in zip(right, held) if p.kind == k) / max(1, sum(p.kind == k for p in held))
                for k in KINDS}
    examples = [{"question": p.question if stage != "base" else p.prefix, "reply": r, "answer": p.answer}
                for p, r in list(zip(held, replies))[:: max(1, len(held) // 8)]]
    return {"accuracy": sum(right) / len(right), "per_kind": per_kind, "examples": examples}


# --- stages -------------------------------------------------------------------------------------

def _stage_state(run_dir: Path) -> str:
    """done (finished earlier), resume (a checkpoint to continue) or new."""
    if (run_dir / DONE).is_file():
        return "done"
    return "resume" if (run_dir / "checkpoint.safetensors").is_file() else "new"


def _fresh(run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)


def train_base(cfg: SpeedrunChatConfig, problems: ProblemSet | ReasoningSet, out: Path, log) -> Path:
    from tokenizers import AddedToken

    from handformer.data.prepare import prepare

    run_dir, data = out / "base", out / "data"
    state = _stage_state(run_dir)
    if state == "new":
        _fresh(run_dir)
        data.mkdir(parents=True, exist_ok=True)
        text = pretraining_text(cfg, problems)
        atomic_write_text(data / "pretrain.txt", text)
        # reasoning: every digit a token of its own, as the worked steps read numbers digit by digit
        tok = reasoning_stages.digit_tokenizer(text, cfg.vocab_size) if cfg.tasks == "reasoning" else \
            Tokenizer.train_bpe([text], cfg.vocab_size)
        tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ROLE_TOKENS])
        if cfg.tasks == "reasoning":  # <think> and </think> one token each, as serve's thinking reads them
            tok.hf.add_tokens([AddedToken(t, special=False, normalized=False)
                               for t in reasoning_stages.THINK_TOKENS])
        tok.save(data / "tokenizer.json")
        prepare(data / "pretrain.txt", data / "shards", str(data / "tokenizer.json"), val_fraction=0.02,
                progress=False, log=log)
    job = LMJob.from_dict({
        "model": {"preset": LLAMA.model_type, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
                  "n_kv_heads": cfg.n_heads, "d_ff": 4 * cfg.d_model, "max_positions": cfg.block_size,
                  "dropout": 0.0},
        "train": _train(cfg, cfg.pretrain_steps, cfg.pretrain_lr, warmup=min(100, cfg.pretrain_steps // 10)),
        "data": {"shards": str(data / "shards"), "tokenizer": str(data / "tokenizer.json"),
                 "block_size": cfg.block_size, "batch_size": cfg.pretrain_batch, "eval_batches": 8}})
    run_train_lm(job, run_dir, resume=state == "resume", log=log)
    atomic_write_text(run_dir / TEMPLATE_FILE, chat_template(cfg))
    return run_dir


def chat_template(cfg: SpeedrunChatConfig) -> str:
    """ChatML; on the reasoning tasks with the thinking switch (enable_thinking)."""
    return reasoning_stages.CHAT_TEMPLATE if cfg.tasks == "reasoning" else CHAT_TEMPLATE


def _train(cfg: SpeedrunChatConfig, steps: int, lr: float, warmup: int) -> dict[str, Any]:
    every = max(1, steps // 4)
    return {"steps": steps, "lr": lr, "warmup": warmup, "schedule": "cosine", "min_lr": lr / 10,
            "eval_every": every, "log_every": max(1, steps // 40), "progress": False, "seed": cfg.seed,
            "threads": cfg.threads, "weight_decay": 0.0, "beta2": 0.99}


def post_stage(task: str, cfg: SpeedrunChatConfig, base: Path, out: Path, data: dict[str, Any],
               section: dict[str, Any], steps: int, lr: float, log) -> Path:
    run_dir = out / task
    state = _stage_state(run_dir)
    if state == "new":
        _fresh(run_dir)
    train = {"init_from": str(base), **_train(cfg, steps, lr, steps // 10)}
    job = PostJob.from_dict({"task": task, "train": train, "data": {"block_size": cfg.block_size, **data},
                             **section})
    run_post(job, run_dir, resume=state == "resume", log=log)
    return run_dir


def dpo_records(cfg: SpeedrunChatConfig, problems: ProblemSet, sft_dir: Path) -> tuple[list[dict], float]:
    """Pairs: the right answer over the SFT model's own wrong one, or a near miss where it was
    right. Returns them and the share of questions the SFT model got wrong."""
    pool = problems.sample(cfg.dpo_pairs, "train", "dpo")
    replies = chat_answers(sft_dir, [p.question for p in pool], cfg.grpo_max_new_tokens)
    rng, out, wrong = random.Random(cfg.seed + 2), [], 0
    for p, reply in zip(pool, replies):
        mistaken = not is_correct(reply, p.answer) and reply.strip()
        wrong += bool(mistaken)
        rejected = reply.strip() if mistaken else wrong_answers(p, rng)
        out.append({"prompt": p.question, "chosen": p.answer, "rejected": rejected})
    return out, wrong / len(pool)


def run_speedrun(cfg: SpeedrunChatConfig, out: str | Path, log=print, base: str | Path | None = None,
                 ) -> dict[str, Any]:
    """Every stage in turn (finished ones skipped), each evaluated on the held-out questions;
    returns the report (also written to OUT/report.json). `base`: start from this run instead of
    pretraining one (its vocabulary gains the role tokens, its embeddings a row each)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    problems = ProblemSet(cfg.seed) if cfg.tasks == "facts" else ReasoningSet(cfg.seed, difficulty(cfg))
    held = held_out_questions(cfg, problems)
    held_long = problems.sample(cfg.eval_long_sums, cfg.eval_split, "eval", kinds=(LONG_KIND,)) \
        if isinstance(problems, ReasoningSet) and cfg.eval_long_sums else []
    if cfg.tasks == "reasoning" and (note := reasoning_stages.length_note(cfg.grpo_max_new_tokens)):
        log(note)
    report: dict[str, Any] = {"config": asdict(cfg), "base": None if base is None else str(base),
                              "stages": {}}
    previous = None
    for stage in STAGES:
        run_dir = out / stage
        if _stage_state(run_dir) == "done":
            result = json.loads((run_dir / DONE).read_text())
            log(f"[{stage}] done earlier: held-out accuracy {result['accuracy']:.1%}")
        else:
            start = time.perf_counter()
            log(f"[{stage}] training")
            # `threads` holds for the evaluation and the DPO pairs' replies too (the loop restores
            # torch's count after training: two threads on a busy 2-core machine took 5x as long)
            with intra_op_threads(cfg.threads or None):
                notes = run_stage(stage, cfg, problems, out, previous, log, base)
                result = {**stage_accuracy(cfg, stage, run_dir, held, held_long),
                          "seconds": round(time.perf_counter() - start, 1), **notes}
            atomic_write_text(run_dir / DONE, json.dumps(result, indent=2) + "\n")
            kinds = ", ".join(f"{k} {v:.0%}" for k, v in result["per_kind"].items())
            log(f"[{stage}] held-out accuracy {result['accuracy']:.1%} ({kinds}) in "
                f"{result['seconds']:.0f} s")
            if "reasoning" in result:
                log(f"[{stage}] {cfg.eval_split} split: {figure_line(result['reasoning'])}")
            if "long_sums" in result:
                log(f"[{stage}] long sums: {figure_line(result['long_sums'])}")
        report["stages"][stage] = result
        previous = run_dir
    atomic_write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
    return report


def difficulty(cfg: SpeedrunChatConfig) -> Difficulty:
    try:
        return Difficulty(cfg.addition_digits, cfg.countdown_numbers, cfg.max_days)
    except ValueError as err:
        raise ValueError(f"speedrun chat: {err}") from None


def held_out_questions(cfg: SpeedrunChatConfig, problems: ProblemSet | ReasoningSet) -> list:
    """The questions every stage is scored on: the facts' held-out tenth, or the reasoning tasks'
    `eval_split`."""
    if isinstance(problems, ReasoningSet):
        return problems.sample(cfg.eval_per_kind * len(REASONING_KINDS), cfg.eval_split, "eval")
    return problems.sample(cfg.eval_per_kind * len(KINDS), "held_out", "eval")


def stage_accuracy(cfg: SpeedrunChatConfig, stage: str, run_dir: Path, held: list, held_long: Sequence = (),
                   ) -> dict[str, Any]:
    if cfg.tasks == "reasoning":
        # the pass@k GRPO's is set against is SFT's: DPO's long sums are scored greedily (8,000
        # fewer replies, about 2 minutes at 1 thread)
        long_k = 0 if stage == "dpo" else cfg.eval_samples
        return reasoning_stages.stage_result(stage, run_dir, held, cfg.eval_samples, cfg.grpo_max_new_tokens,
                                             cfg.seed, held_long, long_k)
    return accuracy(stage, run_dir, held, cfg.grpo_max_new_tokens)


def run_stage(stage: str, cfg: SpeedrunChatConfig, problems: ProblemSet | ReasoningSet, out: Path,
              previous: Path | None, log, base: str | Path | None = None) -> dict[str, Any]:
    """Train one stage from the previous stage's run; returns notes for the report."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if stage == "base" and base is not None:
        from handformer.tasks.lm.vocabulary import add_special_tokens

        _fresh(out / "base")
        ids = add_special_tokens(base, out / "base", list(ROLE_TOKENS), end_of_turn="<|im_end|>")
        atomic_write_text(out / "base" / TEMPLATE_FILE, chat_template(cfg))
        log(f"[base] {base} with the role tokens added (ids {ids}), its embeddings grown to match")
        return {"from": str(base)}
    if stage == "base":
        train_base(cfg, problems, out, log)
        return {}
    records, notes = stage_records(stage, cfg, problems, previous)
    path = write_jsonl(data / f"{stage}.jsonl", records)
    train_post_stage(stage, cfg, previous, out, path, log)
    return notes


def train_post_stage(stage: str, cfg: SpeedrunChatConfig, previous: Path, out: Path, path: Path,
                     log) -> Path:
    """Train a post-training stage (sft, dpo or grpo) from the run `previous` on the records in
    `path`; returns its run directory, OUT/STAGE."""
    if stage == "sft":
        data = {"path": str(path), "batch_size": cfg.sft_batch, "val_fraction": 0.02}
        return post_stage("sft", cfg, previous, out, data, {}, cfg.sft_steps, cfg.sft_lr, log)
    if stage == "dpo":
        return post_stage("dpo", cfg, previous, out, {"path": str(path), "batch_size": cfg.dpo_batch,
                                                      "val_fraction": 0.05},
                          {"dpo": {"beta": cfg.dpo_beta, "sft_weight": cfg.dpo_sft_weight}}, cfg.dpo_steps,
                          cfg.dpo_lr, log)
    reward = reasoning_stages.REWARD if cfg.tasks == "reasoning" else REWARD
    return post_stage("grpo", cfg, previous, out, {"path": str(path), "batch_size": cfg.grpo_batch,
                                                   "val_fraction": 0},
                      {"grpo": {"reward": reward, "group_size": cfg.grpo_group, "beta": cfg.grpo_beta,
                                "max_new_tokens": cfg.grpo_max_new_tokens}}, cfg.grpo_steps, cfg.grpo_lr, log)


def stage_records(stage: str, cfg: SpeedrunChatConfig, problems: ProblemSet | ReasoningSet,
                  previous: Path | None) -> tuple[list[dict], dict[str, Any]]:
    """A post-training stage's data (sft, dpo or grpo) from the tasks `problems` draws, and notes
    for the report."""
    if isinstance(problems, ReasoningSet):
        if stage == "sft":
            return reasoning_stages.sft_records(cfg.sft_conversations, problems, cfg.sft_countdown_tries,
                                                cfg.sft_long_sums, cfg.sft_long_repeats), {}
        if stage == "dpo":
            records, wrong = reasoning_stages.dpo_records(cfg.dpo_pairs, problems, previous,
                                                          cfg.grpo_max_new_tokens, cfg.sft_countdown_tries,
                                                          cfg.dpo_long_sums, cfg.eval_samples, cfg.seed)
            return records, {"rejected_from_the_model": round(wrong, 3)}
        return reasoning_stages.grpo_prompts(cfg.grpo_prompts, problems, cfg.grpo_countdown_share,
                                             cfg.grpo_countdown_numbers, cfg.grpo_long_share), {}
    if stage == "sft":
        return sft_records(cfg, problems), {}
    if stage == "dpo":
        records, wrong = dpo_records(cfg, problems, previous)
        return records, {"rejected_from_the_model": round(wrong, 3)}
    return [{"prompt": p.question, "answer": p.answer}
            for p in problems.sample(cfg.grpo_prompts, "train", "grpo")], {}


__all__ = ["CHAT_TEMPLATE", "PRESETS", "STAGES", "SpeedrunChatConfig", "accuracy", "config_for",
           "run_speedrun"]

