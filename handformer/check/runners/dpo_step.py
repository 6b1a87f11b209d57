"""The runner of one DPO training step (the DPO paper; TRL's DPOTrainer and eric-mitchell's trainers.py
written as one function): `dpo_step(policy, ref_model, optimizer, batch, beta)`, the batch a dict of
the chosen and rejected replies whose keys are read by their words (`chosen_input_ids`,
`rejected_labels`, `chosen_attention_mask`, `rejected_loss_mask`, f"{side}_input_ids", ...); a key
whose words name none is check's own error, and the step is NOT CHECKED.

It is handed two tiny causal language models of check's (the policy and a frozen reference with other
weights), an SGD optimizer on the policy, and a batch of 2 pairs whose prompt (3 tokens) is masked with
-100 in the labels (or 0 in a loss mask); the model takes the ids (and any mask) and returns logits
that also answer `.logits`. Compared with handformer's DPO (token_logprobs summed over the reply,
-log sigmoid(beta * ((policy chosen - rejected) - (reference chosen - rejected))), their mean): the
loss it returns, the policy's parameters after the update, and the reference left as it was.

Shape legend: B pairs, T tokens (prompt then reply), V vocabulary, D width.
"""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import (
    BATCH_NAMES,
    OPTIMIZER_NAMES,
    REFERENCE_MODEL_NAMES,
    call_parameters,
    names_of,
)
from handformer.check.core.context import Context, error_text, finish
from handformer.check.core.defaults import keyword
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.objective import unreferenced_objective
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.core.source import with_called_code
from handformer.check.runners.preference import dpo_views
from handformer.tasks.post.logprobs import token_logprobs
from handformer.tasks.post.packing import IGNORE

B, PROMPT, REPLY, V, D = 2, 3, 4, 13, 8
T = PROMPT + REPLY
BETA, LR, TOL = 0.1, 0.5, 1e-6
ROLES = {"policy": r"(?i)^(policy|model|policy_model|pi|actor|pi_model|policy_net)$",
         "reference": "(?i)^(" + "|".join(REFERENCE_MODEL_NAMES) + ")$",
         "optimizer": "^(" + "|".join(OPTIMIZER_NAMES) + ")$", "batch": "^(" + "|".join(BATCH_NAMES) + ")$",
         "beta": r"^beta$"}
TAKES = ("a DPO step takes the policy (policy, model), the frozen reference (ref_model, reference), the "
         "optimizer, a batch (a dict of chosen and rejected ids, labels, masks) and maybe beta",
         "DPO 的一步接受策略模型（policy、model）、冻结的参考模型（ref_model、reference）、优化器、"
         "一个 batch（chosen 和 rejected 的 id、标签、掩码组成的字典），还可以有 beta")
# a batch key's words -> what it holds: its side (chosen / rejected) and its field
SIDES = {"chosen": r"chosen|pos|win|prefer", "rejected": r"rejected|neg|los|dispref"}
FIELDS = {"labels": r"label|target", "loss_mask": r"loss_mask|response_mask|completion_mask",
          "attention_mask": r"attention_mask|attn_mask|mask", "input_ids": r"input_ids|ids|tokens|input"}


class TinyLM(nn.Module):
    """A causal language model of check's: each position's logits from the mean of the embeddings up
    to it, in float64; its logits answer `.logits` too (Hugging Face's output)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.head = nn.Embedding(V, D).double(), nn.Linear(D, V).double()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **_: Any) -> Tensor:
        h = self.embed(input_ids).cumsum(1) / torch.arange(1, input_ids.size(1) + 1)[:, None]  # (B, T, D)
        logits = self.head(h)  # (B, T, V)
        logits.logits = logits  # type: ignore[attr-defined]
        return logits


def _field(key: str) -> tuple[str, str] | None:
    """A batch key's (side, field) by its words (`chosen_input_ids`, `rejected_labels`); None where
    they name no side or no field."""
    side = next((s for s, words in SIDES.items() if re.search(words, key, re.I)), "")
    field = next((f for f, words in FIELDS.items() if re.search(words, key, re.I)), "")
    return (side, field) if side and field else None


class Batch(dict):
    """The pairs as a dict whose every key is built when it is read (`batch[f"{side}_input_ids"]`),
    from its words; those its code names are there from the start (for `batch.keys()`, `**batch`). A
    key whose words name no side's field is check's own KeyError: the step is then not driven."""

    def __init__(self, code: str) -> None:
        self.pairs = _pairs()
        named = re.findall(r"""["'](\w+)["']""", code)
        super().__init__({k: self[k] for k in dict.fromkeys(named) if _field(k)})

    def __missing__(self, key: str) -> Tensor:
        found = _field(str(key))
        if found is None:
            raise KeyError(f"check's batch has no {key!r}: its words name no chosen / rejected ids, labels "
                           "or mask")
        side, field = found
        return self.pairs[side][field].clone()

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if _field(str(key)) else super().get(key, default)


def _pairs() -> dict[str, dict[str, Tensor]]:
    """For each side: ids (B, T) whose first PROMPT tokens are the prompt they share, the labels (the
    ids, -100 on the prompt), a mask of ones and the loss mask of the reply."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, V, (B, PROMPT), generator=g)
    out = {}
    for side in SIDES:
        ids = torch.cat([prompt, torch.randint(0, V, (B, REPLY), generator=g)], 1)
        reply = torch.arange(T)[None].expand(B, T) >= PROMPT  # (B, T)
        out[side] = {"input_ids": ids, "labels": ids.masked_fill(~reply, IGNORE),
                     "attention_mask": torch.ones(B, T, dtype=torch.long), "loss_mask": reply.long()}
    return out


def _logps(model: nn.Module, fields: dict[str, Tensor]) -> Tensor:
    """(B,) each reply's summed log-probability under the model (handformer's token_logprobs)."""
    logits = model(fields["input_ids"])  # (B, T, V)
    return token_logprobs(logits[:, :-1], fields["labels"][:, 1:]).double().sum(-1)


@torch.no_grad()
def reference_step(policy: nn.Module, ref: nn.Module, beta: float) -> tuple[float, nn.Module]:
    """handformer's DPO step on a copy of the policy: the loss and the policy after SGD."""
    policy, pairs = copy.deepcopy(policy), _pairs()
    rc, rr = (_logps(ref, pairs[side]) for side in SIDES)
    with torch.enable_grad():  # a step's gradients, wherever check runs it
        pc, pr = (_logps(policy, pairs[side]) for side in SIDES)
        loss = -F.logsigmoid(beta * ((pc - pr) - (rc - rr))).mean()
        loss.backward()
    opt = torch.optim.SGD(policy.parameters(), lr=LR)
    opt.step()
    return float(loss), policy


def _roles(comp: Component) -> dict[str, str]:
    """Each role -> the argument that plays it; DiscoveryError where one is left unfilled."""
    names, required = names_of(call_parameters(comp.obj))
    roles = {role: next((n for n in names if re.search(pattern, n)), "") for role, pattern in ROLES.items()}
    cannot_fill(comp.name, required, set(roles.values()), all(roles[r] for r in ("policy", "reference",
                                                                                 "optimizer", "batch")),
                "reference", TAKES)
    return roles


def _beta(comp: Component, roles: dict[str, str]) -> float:
    """Its beta: its default where it has one, else check's (handed to it)."""
    default = getattr(inspect.signature(comp.obj).parameters.get(roles["beta"] or "beta"), "default", None)
    return BETA if default is inspect.Parameter.empty or default is None else float(default)


def check_dpo_step(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    roles = _roles(comp)
    unreferenced_objective(comp)  # KTO's: NOT CHECKED, named
    beta, batch = _beta(comp, roles), Batch(with_called_code(comp.obj))
    policy, ref = TinyLM(1), TinyLM(2)
    want_loss, want = reference_step(policy, ref, beta)
    ref_before = copy.deepcopy(ref.state_dict())
    given = _arguments(roles, policy, ref, batch, beta)
    with fp.dropout_off(), torch.enable_grad():
        out = ctx.learner.call("forward", comp.obj, **given)
    _compare(res, out, want_loss, policy, want, ref, ref_before, beta)
    if not all(c.ok for c in res.checks):
        note_departure(res, lambda: _localize(comp, ctx, roles, beta))
    return finish(res)


def _arguments(roles: dict[str, str], policy: nn.Module, ref: nn.Module, batch: Batch, beta: float,
               ) -> dict[str, Any]:
    """The step's arguments by their names: the policy, the reference, the batch, a fresh SGD over the
    policy, and beta where it takes one."""
    given = {roles["policy"]: policy, roles["reference"]: ref, roles["batch"]: batch,
             roles["optimizer"]: torch.optim.SGD(policy.parameters(), lr=LR)}
    return given | (keyword(roles["beta"], beta))


def _localize(comp: Component, ctx: Context, roles: dict[str, str], beta: float) -> Any:
    """The first line of its step whose value is none of the reference's: the four replies'
    log-probabilities, their log-ratios, the margin, beta times it, the losses (preference.dpo_views)."""
    policy, ref, pairs = TinyLM(1), TinyLM(2), _pairs()
    with torch.no_grad():
        logps = {f"{who}_{side}": _logps(model, pairs[side])
                 for who, model in (("policy", policy), ("reference", ref)) for side in SIDES}
    given = _arguments(roles, policy, ref, Batch(with_called_code(comp.obj)), beta)
    filename = inspect.getsourcefile(comp.obj) or ""

    def run() -> Any:
        with torch.enable_grad():
            return ctx.learner.call("forward", comp.obj, **given)
    steps = trace_steps(run, filename, None, (), constants=True)
    return first_departure(steps, dpo_views(logps, beta), filename, {"B": B})


def _loss_of(out: Any) -> float | None:
    """The loss a step returns: a number, a one-number tensor, the first of a tuple, a dict's "loss";
    None where it returns none."""
    if isinstance(out, dict):
        out = out.get("loss")
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if isinstance(out, Tensor) and out.numel() == 1:
        return float(out.detach())
    return float(out) if isinstance(out, (int, float)) and not isinstance(out, bool) else None


def _apart(a: nn.Module | dict[str, Tensor], b: nn.Module | dict[str, Tensor]) -> float:
    """The largest difference of two models' parameters (or state dicts), name by name."""
    sa, sb = (m if isinstance(m, dict) else m.state_dict() for m in (a, b))
    return max(fp.max_error(sa[k].double(), sb[k].double()) for k in sa)


def _compare(res: ComponentResult, out: Any, want_loss: float, policy: nn.Module, want: nn.Module,
             ref: nn.Module, ref_before: dict[str, Tensor], beta: float) -> None:
    got = _loss_of(out)
    if got is not None:
        err = abs(got - want_loss)
        res.checks.append(Check(text(f"beta={beta:g}: the loss it returns equals handformer's DPO loss "
                                     f"({want_loss:.6g}) on the same pairs",
                                     f"beta={beta:g}：它返回的损失与 handformer 在同样的偏好对上的 DPO 损失"
                                     f"（{want_loss:.6g}）一致"), err < TOL, error_text(err)))
    err = _apart(policy, want)
    res.max_abs_error = err
    res.checks.append(Check(text(f"SGD, learning rate {LR:g}: the policy's parameters after the step equal "
                                 "handformer's DPO step's",
                                 f"SGD，学习率 {LR:g}：这一步之后策略模型的参数与 handformer 的 DPO "
                                 "一步的结果一致"),
                            err < TOL, error_text(err)))
    moved = _apart(ref, ref_before)
    res.checks.append(Check(text("the reference model is left as it was (frozen)",
                                 "参考模型保持不变（冻结）"), moved == 0, error_text(moved)))

