"""The speedrun's table: held-out accuracy after each stage, overall and per task."""

from __future__ import annotations

from typing import Any

from handformer.tasks.speedrun_chat.problems import KINDS

LABELS = {"base": "base (pretrained, asked as text)", "sft": "+ SFT", "dpo": "+ DPO", "grpo": "+ GRPO"}


def accuracy_table(report: dict[str, Any]) -> str:
    """A Markdown table: one row a stage, its accuracy, the change from the stage before, the
    tasks' accuracies and the stage's seconds; on the reasoning tasks also the greedy accuracy's
    95 % interval, pass@k, the greedy accuracy with thinking switched off and the share of replies
    that ended and parsed to an answer."""
    first = next(iter(report["stages"].values()))
    kinds = list(first.get("per_kind", {})) or list(KINDS)
    reasoning = "reasoning" in first
    extra = ["95% interval", "pass@k", "no thinking", "ended and parsed"] if reasoning else []
    extra += ["long sums (greedy, pass@k)"] if "long_sums" in first else []
    head = "| stage | held-out accuracy | change | " + " | ".join(extra + kinds) + " | seconds |"
    rows = [head, "|" + "---|" * (len(kinds) + len(extra) + 4)]
    before = None
    for stage, result in report["stages"].items():
        acc = result["accuracy"]
        label = LABELS.get(stage, stage)
        if stage == "base" and result.get("from"):
            label = f"base ({result['from'].rstrip('/').split('/')[-1]}, asked as text)"
        change = "" if before is None or stage == "sft" else f"{100 * (acc - before):+.1f} points"
        cells = _reasoning_cells(result["reasoning"]) if reasoning else []
        if "long_sums" in first:  # a run resumed with other settings may lack them in a later stage
            cells.append(_long_cell(result["long_sums"]) if "long_sums" in result else "")
        cells += [f"{100 * result['per_kind'][k]:.0f}%" for k in kinds]
        rows.append(f"| {label} | {100 * acc:.1f}% | {change} | {' | '.join(cells)} | "
                    f"{result.get('seconds', 0):.0f} |")
        before = acc
    return "\n".join(rows)


def _reasoning_cells(figures: dict[str, Any]) -> list[str]:
    low, high = figures["greedy"]["interval_95"]
    passes = [f"{name} {100 * figures[name]['value']:.1f}%" for name in figures if name.startswith("pass@")]
    direct = figures.get("no_thinking")  # greedy with enable_thinking=False (the chat stages)
    return [f"{100 * low:.1f} to {100 * high:.1f}%", passes[0] if passes else "",
            f"{100 * direct['greedy']['value']:.1f}%" if direct else "",
            f"{100 * figures['ended_and_parsed']['value']:.0f}%"]


def _long_cell(figures: dict[str, Any]) -> str:
    passes = [f", {100 * figures[name]['value']:.1f}%" for name in figures if name.startswith("pass@")]
    return f"{100 * figures['greedy']['value']:.1f}%" + (passes[0] if passes else "")


__all__ = ["accuracy_table"]
