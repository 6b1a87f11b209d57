"""The runner of speculative sampling (Leviathan et al. 2023, Chen et al. 2023): a loop
`speculative_sampling(prefix, draft, target, N, gamma, ...)` in which a small draft model proposes
gamma tokens, the target model checks them in one call, each is accepted with probability
min(1, q_target / p_draft), the first one rejected is replaced by a token drawn from the residual
max(0, q_target - p_draft) normalized, and a round whose tokens are all accepted ends with one more
token from the target.

It is driven with two stand-in models whose next token is certain (a logit of 0 on it, -1e4 on every
other: probabilities exactly 1 and 0), so that its tokens are known whatever it draws at random:
- the draft agrees with the target (both follow token t with t + 1 mod V): every proposal is
  accepted and every round ends with the target's token: the tokens follow the target's rule;
- the draft disagrees (it follows t with t + 2): the target gives each proposal probability 0, so it
  is always rejected, and the token drawn from the residual is the target's.
Where every token of the second run is the draft's instead, the residual is the draft's (the two
distributions subtracted the wrong way round): the line that subtracts them is quoted.

Certain models cannot tell the residual from the target's own distribution (their supports are apart),
nor a temperature that multiplies from one that divides. So it is driven a third way, in distribution:
two soft stand-ins (fixed random logits for each previous token), one new token asked for, a few hundred
seeded runs at temperature 2 where the loop takes one; the first new token must follow the target's
distribution softmax(logits / 2), as the paper proves it does (chi-square at a false-alarm rate of 1e-6).

Shape legend: B batch (1), T tokens, V vocabulary.
"""

from __future__ import annotations

import functools
import random
import re
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.catalog.base import DEPARTS
from handformer.check.core import stats
from handformer.check.core.argument_names import COUNT_NAMES, PROMPT_NAMES
from handformer.check.core.context import Context, finish, forward_parameters
from handformer.check.core.defaults import quietly, then
from handformer.check.core.discovery import Component, DiscoveryError
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, source_lines
from handformer.check.runners.generate_loop import styles_read

V, NEW, GAMMA = 11, 8, 3
PROMPT = torch.tensor([[3, 4]])  # (B, T)
# an argument's role by the words in its name, tried in order
ROLE_WORDS = (("draft", ("draft", "approx", "small", "assist", "m_q", "mq")),
              ("target", ("target", "large", "big", "main", "verif", "oracle", "m_p", "mp")),
              ("gamma", ("gamma", "lookahead", "num_draft", "n_draft", "draft_len", "speculative", "k")))
# a line that subtracts one distribution from the other inside a max (or clamp, relu): the residual;
# matched with what its brackets index left out (p[0, n + i - 1] - q[...] is p[] - q[])
RESIDUAL_LINE = (r"(max\w*|clamp\w*|relu|maximum)\s*\(.*[\w\]]\s*-\s*\w",
                 r"\([\w\[\]. ]+-[\w\[\]. ]+\)\s*\.clamp")
INDEXED = re.compile(r"\[[^\[\]]*\]")


# the soft stand-ins: row t holds the logits after token t (V, V), the target's and the draft's apart
@functools.cache
def _tables() -> Tensor:
    """(2, V, V), made when first asked (the fork server computes nothing: zygote.py)."""
    return torch.randn(2, V, V, generator=torch.Generator().manual_seed(77), dtype=torch.float64) * 1.5
SOFT_RUNS, SOFT_TEMPERATURE, SOFT_SEED = 1200, 2.0, 77
TEMPERATURE_NAMES = ("temperature", "temp", "tau")


class Soft(nn.Module):
    """A stand-in model whose logits after token t are row t of `table` (B, T, V), styled as `Certain`."""

    def __init__(self, table: torch.Tensor, style: str) -> None:
        super().__init__()
        self.table, self.style = table, style

    def forward(self, idx: Any, *args: Any, **kwargs: Any) -> Any:
        logits = self.table[torch.as_tensor(idx).long()].float()  # (B, T, V)
        styles = {"tuple": (logits, None), "object": types.SimpleNamespace(logits=logits)}
        return styles.get(self.style, logits)


class Certain(nn.Module):
    """A stand-in model that follows token t with (t + step) mod V for certain: logits (B, T, V), 0 on
    that token and -1e4 on every other; returned as the learner's loop reads it (`style`)."""

    def __init__(self, step: int, style: str) -> None:
        super().__init__()
        self.step, self.style = step, style

    def forward(self, idx: Any, *args: Any, **kwargs: Any) -> Any:
        ids = torch.as_tensor(idx).long()  # (B, T)
        logits = torch.full((*ids.shape, V), -1e4)
        logits.scatter_(-1, ((ids + self.step) % V)[..., None], 0.0)  # (B, T, V)
        styles = {"tuple": (logits, None), "object": types.SimpleNamespace(logits=logits)}
        return styles.get(self.style, logits)


# the roles of the names a loop's prompt and its count go by, the whole name
EXACT_ROLES = {**dict.fromkeys(PROMPT_NAMES + ("prefix", "x", "input_ids"), "prompt"),
               **dict.fromkeys(COUNT_NAMES + ("max_len", "n"), "count")}


def _role(name: str) -> str | None:
    low = name.lower()
    # a short word is the whole name (mq, k), a longer one part of it (approx_model)
    return EXACT_ROLES.get(low, next((role for role, words in ROLE_WORDS
                                      if any(w == low or (len(w) > 3 and w in low) for w in words)), None))


def _arguments(fn: Callable[..., Any], draft: nn.Module, target: nn.Module) -> dict[str, Any]:
    """The loop's arguments by name: the prompt, the two models, the number of new tokens and gamma;
    the rest left to their defaults (a DiscoveryError for one that has none)."""
    values = {"prompt": PROMPT.clone(), "draft": draft, "target": target, "count": NEW, "gamma": GAMMA}
    out = {}
    for p in forward_parameters(fn):
        role = _role(p.name)
        if role in values:
            out[p.name] = values[role]
        elif p.default is p.empty:
            raise DiscoveryError(
                f"cannot fill the argument {p.name!r} of {fn.__name__}: handformer calls it with the prompt, "
                "the draft and target models (by names such as draft_model and target_model), the number of "
                "new tokens and gamma",
                zh=f"填不了 {fn.__name__} 的参数 {p.name!r}：handformer 传入提示词、draft 模型和 target 模型"
                   "（按 draft_model、target_model 这样的名字）、新 token 数和 gamma")
    return out


def _tokens(out: Any) -> list[int] | None:
    """The ids of the one sequence it returns (a (1, T) tensor, a (T,) one, or lists), or None."""
    return quietly(lambda: torch.as_tensor(out).long().reshape(-1).tolist(),
                   (TypeError, ValueError, RuntimeError))


def check_speculative(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    style = styles_read(comp.obj)[0]
    runs = {}
    for draft_step in (1, 2):
        args = _arguments(comp.obj, Certain(draft_step, style), Certain(1, style))
        with torch.no_grad():
            runs[draft_step] = _tokens(ctx.learner.call("forward", comp.obj, **args))
    for draft_step, (en, zh) in ((1, ("a draft that agrees with the target: every proposal accepted, each "
                                      "round ending with the target's token",
                                      "draft 与 target 一致：每个候选都被接受，"
                                      "每一轮最后再加 target 的 token")),
                                 (2, ("a draft that disagrees: each proposal rejected, the token drawn from "
                                      "the residual max(0, q_target - p_draft) is the target's",
                                      "draft 与 target 不一致：每个候选都被拒绝，从残差 max(0, q_target - "
                                      "p_draft) 里抽到的是 target 的 token"))):
        ids = runs[draft_step]
        ok, got = _follows(ids, 1)
        res.checks.append(Check(text(f"{en}: the tokens follow the target's rule (t -> t + 1)",
                                     f"{zh}：token 都符合 target 的规律（t -> t + 1）"), ok,
                                text(f"got {got}", f"实际得到 {got}")))
    res.checks.append(_distribution_check(ctx, comp, style))
    if not res.checks[1].ok and _follows(runs[2], 2)[0]:
        _residual_finding(res, ctx, comp, runs[2])
    elif not res.checks[1].ok and _steps(runs[2]) == {1, 2}:
        _accepted_finding(res, ctx, comp, runs[2])
    return finish(res)


def _distribution_check(ctx: Context, comp: Component, style: str) -> Check:
    """The first new token of many seeded runs with soft stand-ins follows the target's distribution."""
    args = _arguments(comp.obj, Soft(_tables()[1], style), Soft(_tables()[0], style))
    args.update({name: 1 for name in args if _role(name) == "count"})
    temperature = {p.name: SOFT_TEMPERATURE for p in forward_parameters(comp.obj)
                   if p.name.lower() in TEMPERATURE_NAMES}  # none where it takes none: then 1
    args.update(temperature)
    torch.manual_seed(SOFT_SEED)
    random.seed(SOFT_SEED)
    counts, T = torch.zeros(V), PROMPT.size(1)
    for _ in range(SOFT_RUNS):
        args.update({name: PROMPT.clone() for name in args if _role(name) == "prompt"})  # fresh each run
        with torch.no_grad():
            ids = (_tokens(ctx.learner.call("forward", comp.obj, **args)) or []) + [0] * (T + 1)
        counts[ids[T]] += 1  # (token 0 where it gave no new token)
    right = torch.softmax(_tables()[0, PROMPT[0, -1]] / next(iter(temperature.values()), 1.0), -1)  # (V,)
    setting = "".join(f" at {name}={value:g}" for name, value in temperature.items())
    return _distribution_verdict(counts, right, setting)


def _distribution_verdict(counts: torch.Tensor, right: torch.Tensor, at: str) -> Check:
    """The chi-square test of the first new tokens' counts (V,) against the target's distribution."""
    test = stats.chi_square(counts, right)
    expected = [round(float(x) * SOFT_RUNS) for x in right]
    return Check(text(f"in distribution{at}: the first new token of {SOFT_RUNS} seeded runs with a soft draft"
                      " and target follows the target's distribution (chi-square p = "
                      f"{test.p_value:.2g}; rejected below 1e-6)",
                      f"按分布{at.replace(' at ', '（')}{'）' * bool(at)}：draft 与 target 都是软分布时，"
                      f"{SOFT_RUNS} 次带种子的运行里"
                      f"第一个新 token 服从 target 的分布（卡方 p = {test.p_value:.2g}；低于 1e-6 即不符）"),
                 not test.rejected, text(f"counts {counts.long().tolist()}, expected {expected}",
                                         f"计数 {counts.long().tolist()}，期望 {expected}"))


def _steps(ids: list[int] | None) -> set[int]:
    """The steps (mod V) from each token to the next, the prompt's last one on."""
    T = PROMPT.size(1)
    new = (ids or [])[T - 1:]
    return {(b - a) % V for a, b in zip(new, new[1:])}


# a line that takes the smaller of 1 and a ratio of probabilities (min, clamp(max=1), minimum), else
# one that compares a draw with a ratio: the acceptance test
ACCEPT_LINE = (r"(min|clamp|minimum)\w*\s*\(.*[\w\]]\s*/\s*\w", r"[<>]=?.*[\w\]]\s*/\s*\w")


def _accepted_finding(res: ComponentResult, ctx: Context, comp: Component, ids: list[int]) -> None:
    """The disagreeing run accepts the draft's proposals (t + 2) and ends each round with the target's
    (t + 1): it accepts a token the target gives probability 0, the ratio inverted (p_draft / q_target)."""
    lines = source_lines(ctx.objects(comp))
    bare = [(n, INDEXED.sub("[]", INDEXED.sub("[]", line))) for n, line in lines]
    number, _ = first_line(ACCEPT_LINE, bare)
    code = then(number, lambda n: dict(lines)[n].strip())
    res.findings.append(Finding(DEPARTS, text(
        "it accepts the draft's proposals that the target gives probability 0 (tokens "
        f"{ids[PROMPT.size(1):]}: t + 2 from the draft, then t + 1 where a round ends): the acceptance is "
        "min(1, p_draft / q_target), "
        "the ratio inverted (it must be min(1, q_target / p_draft))",
        f"它接受了 target 给出概率为 0 的 draft 候选（token {ids[PROMPT.size(1):]}：draft 的 t + 2，"
        "每轮最后是 t + 1）：接受概率写成了 min(1, p_draft / q_target)，比值反了"
        "（应为 min(1, q_target / p_draft)）"), number, code))


def _follows(ids: list[int] | None, step: int) -> tuple[bool, list[int] | None]:
    """Whether the ids start with the prompt and each new one is the one before plus `step` (mod V)."""
    T = PROMPT.size(1)
    if ids is None or ids[:T] != PROMPT[0].tolist() or len(ids) <= T:
        return False, ids
    return all(b == (a + step) % V for a, b in zip(ids[T - 1:], ids[T:])), ids[T:]


def _residual_finding(res: ComponentResult, ctx: Context, comp: Component, ids: list[int]) -> None:
    """Every token of the disagreeing run is the draft's: the residual is max(0, p_draft - q_target)."""
    lines = source_lines(ctx.objects(comp))
    bare = [(n, INDEXED.sub("[]", INDEXED.sub("[]", line))) for n, line in lines]
    number, _ = first_line(RESIDUAL_LINE, bare)
    code = then(number, lambda n: dict(lines)[n].strip())
    new = ids[PROMPT.size(1):]
    res.findings.append(Finding(DEPARTS, text(
        f"on a rejection it draws the draft's token: with a draft certain of t + 2 and a target certain of "
        f"t + 1, its {len(new)} tokens {new} are all the draft's; the residual it draws from is "
        "max(0, p_draft - q_target), the distributions subtracted the wrong way round "
        "(it must be max(0, q_target - p_draft), normalized)",
        f"拒绝之后它抽到的是 draft 的 token：draft 确定给出 t + 2、target 确定给出 t + 1 时，它的 "
        f"{len(new)} 个 token {new} 全是 draft 的；它抽样用的残差是 max(0, p_draft - q_target)，"
        "两个分布减反了（应为 max(0, q_target - p_draft)，再归一化）"), number, code))


