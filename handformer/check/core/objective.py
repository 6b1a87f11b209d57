"""What a training step's objective reads beyond logits and targets. A step whose loss reads a second
sequence (chosen and rejected responses), a reference model or a coefficient of a preference term
(DPO's, ORPO's beta, an odds ratio) is no plain next-token loss: comparing it with one says nothing
about it. Read from the names of the step's code and of the functions of its file it calls, in turn."""

from __future__ import annotations

import itertools
import re
from typing import Any

from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.source import code_text, functions_called

# the words (whole parts of a snake_case name) that say what a preference objective reads
WORDS = {"chosen": "chosen", "rejected": "rejected", "beta": "beta", "ref": "reference",
         "reference": "reference",
         "odds": "odds", "preferred": "chosen", "dispreferred": "rejected"}
DEPTH = 4  # calls followed from the step, at most
# objectives check has no reference for, by the words their code reads: (words, name, what it compares),
# the name and what in English, then in Chinese
UNREFERENCED = ((frozenset({"desirable", "undesirable", "kto"}), "KTO's", "KTO",
                 "desirable and undesirable examples apart, each against a KL reference point",
                 "分开的期望样本和非期望样本，各自和 KL 参考点比较"),)


def _called(fn: Any, depth: int = DEPTH) -> list[Any]:
    """The step and the functions of its file it calls, and those they call, `depth` levels down."""
    below = functions_called(fn) if depth else []
    return [fn, *itertools.chain.from_iterable(_called(g, depth - 1) for g in below)]


def objective_reads(fn: Any) -> list[str]:
    """What the step's objective reads that a next-token loss does not (chosen, rejected, reference,
    beta, odds), in that order; empty for a plain language model's step. Read from the words of the
    names in its code (`chosen_logps`: chosen; Adam's `beta1` or `betas` is no beta)."""
    words = set(re.findall(r"[a-z0-9]+", "\n".join(map(code_text, _called(fn))).lower()))
    return sorted({WORDS[w] for w in words & WORDS.keys()}, key=list(WORDS.values()).index)


def not_next_token(comp: Component) -> None:
    """A step whose objective reads more than logits and targets (a preference objective's chosen and
    rejected responses, its reference model, its beta) is not compared with a step on the
    cross-entropy: NOT CHECKED, what it reads named."""
    words = objective_reads(comp.obj)
    reads, reads_zh = ", ".join(words), "、".join(words)
    if words:
        raise DiscoveryError(
            f"its objective reads {reads}: a preference objective (DPO's, ORPO's), not the cross-entropy of "
            "next tokens, which is what check compares a training step with; its parts are checked on "
            "their own where check has their kinds (sequence_logps, dpo_loss, dpo_step: name one with "
            "--component)",
            zh=f"它的目标函数读取了 {reads_zh}：这是偏好目标（DPO、ORPO 那样的），不是下一个 token 的交叉熵，"
            "而检查程序只拿交叉熵的训练一步来比较；它的各个部分在检查程序有对应类型时单独检查"
            "（sequence_logps、dpo_loss、dpo_step：用 --component 指明）")


def unreferenced_objective(comp: Component) -> None:
    """A preference step whose objective is one check has no reference for (KTO's: desirable and
    undesirable examples, not chosen / rejected pairs), read from the words of its code and the code it
    calls: NOT CHECKED, the objective named, its model-side parts (log-probabilities) checked on their own."""
    words = set(re.findall(r"[a-z0-9]+", "\n".join(map(code_text, _called(comp.obj))).lower()))
    for name, name_zh, what, what_zh in [named[1:] for named in UNREFERENCED if words & named[0]]:
        raise DiscoveryError(
            f"its objective is {name} ({what}), which check has no reference for: the step is not "
            "compared; its model-side parts (the sequences' log-probabilities: sequence_logps) are "
            "checked on their own",
            zh=f"它的目标函数是 {name_zh} 的（{what_zh}），检查程序没有它的参考实现：这一步不做比较；"
            "模型那一侧的部分（序列的对数概率：sequence_logps）单独检查")
