"""The speedrun's table: held-out accuracy after each stage, overall and per task."""

from __future__ import annotations

from typing import Any

from handformer.tasks.speedrun_chat.problems import KINDS

LABELS = {"base": "base (pretrained, asked as text)", "sft": "+ SFT", "dpo": "+ DPO", "grpo": "+ GRPO"}


def accuracy_table(report: dict[str, Any]) -> str:
    """A Markdown table: one row a stage, its accuracy, the change from the stage before, the
    tasks' accuracies and the stage's seconds."""
    head = "| stage | held-out accuracy | change | " + " | ".join(KINDS) + " | seconds |"
    rows = [head, "|" + "---|" * (len(KINDS) + 4)]
    before = None
    for stage, result in report["stages"].items():
        acc = result["accuracy"]
        label = LABELS.get(stage, stage)
        if stage == "base" and result.get("from"):
            label = f"base ({result['from'].rstrip('/').split('/')[-1]}, asked as text)"
        change = "" if before is None or stage == "sft" else f"{100 * (acc - before):+.1f} points"
        kinds = " | ".join(f"{100 * result['per_kind'][k]:.0f}%" for k in KINDS)
        rows.append(f"| {label} | {100 * acc:.1f}% | {change} | {kinds} | "
                    f"{result.get('seconds', 0):.0f} |")
        before = acc
    return "\n".join(rows)


__all__ = ["accuracy_table"]
