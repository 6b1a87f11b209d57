"""Held-out evaluation of a chat run on the reasoning tasks (reasoning.py).

Each question is asked as one user message in the run's chat template, and answered

- greedily (temperature 0): the accuracy, with a 95 % Wilson interval over the questions;
- `k` times sampled at temperature 1.0: pass@k, the share of questions with at least one right
  answer among the k (95 % Wilson interval), and the mean accuracy of the samples;

and the replies' form is counted: the share of greedy replies that stop at the end-of-turn token
within `max_new_tokens`, the share that parse to an answer in the task's form, and the share that
do both. `replies` decodes (the one decoding engine, seeded: the same seed gives the same
samples); `score` counts, from replies alone, so it is tested without a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handformer.generation.engine import Engine, Row, SamplingOptions
from handformer.modes import eval_mode
from handformer.tasks.lm.run import load_lm
from handformer.tasks.speedrun_chat.reasoning import Task, is_right, parse_reply

Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile: a two-sided 95 % interval


@dataclass(frozen=True)
class Reply:
    text: str  # decoded, without the stop token
    ended: bool  # stopped at an end-of-turn token within the token limit


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % by default); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # exactly 0 and 1 at the ends (the formula leaves rounding dust there)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    return low, 1.0 if successes == n else min(1.0, centre + half)


def _share(successes: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(successes, n)
    return {"value": successes / n if n else 0.0, "right": successes, "n": n, "interval_95": [low, high]}


def _right(task: Task, reply: Reply) -> bool:
    return is_right(task.kind, task.key, parse_reply(reply.text, task.kind).answer)


def score(tasks: Sequence[Task], greedy: Sequence[Reply], sampled: Sequence[Sequence[Reply]],
          ) -> dict[str, Any]:
    """The figures of one evaluation: greedy accuracy, pass@k and the samples' mean accuracy, each
    overall and per kind, and the greedy replies' form (ended, parsed, both)."""
    if not (len(tasks) == len(greedy) == len(sampled)):
        raise ValueError(f"score: {len(tasks)} tasks, {len(greedy)} greedy replies and {len(sampled)} "
                         "lists of samples; give one of each per task")
    k = len(sampled[0]) if sampled else 0
    readings = [parse_reply(r.text, t.kind) for t, r in zip(tasks, greedy)]
    parsed = [r.well_formed and r.answer is not None for r in readings]
    out = _figures(tasks, greedy, sampled, k)
    out["ended"] = _share(sum(r.ended for r in greedy), len(greedy))
    out["parsed"] = _share(sum(parsed), len(greedy))
    out["ended_and_parsed"] = _share(sum(r.ended and p for r, p in zip(greedy, parsed)), len(greedy))
    out["per_kind"] = {}
    for kind in dict.fromkeys(t.kind for t in tasks):
        mine = [i for i, t in enumerate(tasks) if t.kind == kind]
        out["per_kind"][kind] = _figures([tasks[i] for i in mine], [greedy[i] for i in mine],
                                         [sampled[i] for i in mine], k)
    return out


def _figures(tasks: Sequence[Task], greedy: Sequence[Reply], sampled: Sequence[Sequence[Reply]], k: int,
             ) -> dict[str, Any]:
    right = [_right(t, r) for t, r in zip(tasks, greedy)]
    sample_right = [[_right(t, r) for r in rs] for t, rs in zip(tasks, sampled)]
    out = {"greedy": _share(sum(right), len(tasks))}
    if k:
        out[f"pass@{k}"] = _share(sum(any(s) for s in sample_right), len(tasks))
        out["sampled"] = _share(sum(map(sum, sample_right)), k * len(tasks))
    return out


# --- decoding -----------------------------------------------------------------------------------

@torch.inference_mode()
def _run_rows(model: torch.nn.Module, rows: list[Row], pad_id: int, chunk: int = 512) -> None:
    """Decode `rows` in batches of up to `chunk` rows whose prompts have one length: no padding, so
    no attention mask until a row finishes (the unmasked kernel takes about half the masked one's
    time). Each row's own seed makes its samples the same in any batch."""
    by_length: dict[int, list[Row]] = {}
    for row in rows:
        by_length.setdefault(len(row.prompt), []).append(row)
    with eval_mode(model):
        for same in by_length.values():
            for i in range(0, len(same), chunk):
                engine = Engine(model, pad_id=pad_id)
                engine.add(same[i:i + chunk])
                engine.run()


def replies(run_dir: str | Path, tasks: Sequence[Task], k: int = 8, temperature: float = 1.0,
            max_new_tokens: int = 128, seed: int = 0, thinking: bool | None = None,
            ) -> tuple[list[Reply], list[list[Reply]]]:
    """The run's greedy reply to each task's question, and `k` replies sampled at `temperature`
    (sample j of question i seeded with seed + i * k + j: reproducible, and independent of the
    batch it runs in). `thinking`: the template's enable_thinking (None: its default)."""
    from handformer.generation.chat import END_OF_TURN_TOKENS, stop_ids_for
    from handformer.generation.chat_template import load_chat_template
    from handformer.tasks.lm.run import load_lm

    run = load_lm(run_dir, decoding=True)
    template = load_chat_template(run_dir)
    stops = frozenset(stop_ids_for(run.tokenizer, run.tokens.eos_ids, template))
    turn_names = [*END_OF_TURN_TOKENS, template.special_tokens.get("eos_token")]
    ends = {run.tokenizer.hf.token_to_id(n) for n in turn_names if n} & stops or stops
    encode = run.tokenizer.encode_with_special_tokens
    options = {} if thinking is None else {"enable_thinking": thinking}
    prompts = [encode(template.render([{"role": "user", "content": t.question}], True, **options))
               for t in tasks]
    pad = run.tokens.pad_id if run.tokens.pad_id is not None else 0
    greedy_rows = [Row(p, max_new_tokens, SamplingOptions(temperature=0), stops) for p in prompts]
    sampling = SamplingOptions(temperature=temperature, seed=seed)
    sampled_rows = [Row(p, max_new_tokens, sampling, stops, choice=i * k + j)
                    for i, p in enumerate(prompts) for j in range(k)]
    _run_rows(run.model, greedy_rows + sampled_rows, pad)

    def reply(row: Row) -> Reply:
        text = run.tokenizer.hf.decode([t for t in row.tokens if t not in stops], skip_special_tokens=True)
        return Reply(text, row.finish_reason == "stop" and bool(row.tokens) and row.tokens[-1] in ends)

    greedy = [reply(r) for r in greedy_rows]
    sampled = [[reply(r) for r in sampled_rows[i * k:(i + 1) * k]] for i in range(len(tasks))]
    return greedy, sampled


def evaluate_reasoning(run_dir: str | Path, tasks: Sequence[Task], k: int = 8, temperature: float = 1.0,
                       max_new_tokens: int = 128, seed: int = 0) -> dict[str, Any]:
    """`score` of the run's `replies`, with the settings it was measured under."""
    greedy, sampled = replies(run_dir, tasks, k, temperature, max_new_tokens, seed)
    return {**score(tasks, greedy, sampled), "settings": {"k": k, "temperature": temperature,
                                                        "max_new_tokens": max_new_tokens, "seed": seed}}


def figure_line(result: dict[str, Any]) -> str:
    """One line of a result: greedy and pass@k with their intervals, and the replies' form."""
    def pct(share: dict[str, Any]) -> str:
        low, high = share["interval_95"]
        return f"{100 * share['value']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"

    passes = [name for name in result if name.startswith("pass@")]
    parts = [f"greedy {pct(result['greedy'])}"] + [f"{name} {pct(result[name])}" for name in passes]
    parts.append(f"ended and parsed {100 * result['ended_and_parsed']['value']:.1f}%")
    return f"{', '.join(parts)} (n={result['greedy']['n']})"


__all__ = ["Reply", "evaluate_reasoning", "figure_line", "replies", "score", "wilson_interval"]


def greedy(model, prompts: list[list[int]], stop_ids: list[int], max_new_tokens: int, pad_id: int,
           ) -> list[list[int]]:
    """Each prompt's greedy continuation through the engine (batched as `_run_rows` batches)."""
    rows = [Row(p, max_new_tokens, SamplingOptions(temperature=0), frozenset(stop_ids)) for p in prompts]
    _run_rows(model, rows, pad_id)
    return [row.tokens for row in rows]


def text_answers(run_dir: Path, prefixes: list[str], max_new_tokens: int = 24) -> list[str]:
    """A base model's greedy continuations of statement beginnings (text_reply reads them)."""
    run = load_lm(run_dir, decoding=True)
    stops = list(run.tokens.eos_ids)
    pad = run.tokens.pad_id if run.tokens.pad_id is not None else 0
    outs = greedy(run.model, [run.tokenizer.encode(p) for p in prefixes], stops, max_new_tokens, pad)
    return [run.tokenizer.decode(o) for o in outs]
