"""The top-p of a sampling loop (`generate(input_ids, max_new_tokens, temperature=1.0, top_p=0.9)`, a
model's own method as Hugging Face ports write it): driven once more for one new token at top_p =
TOP_P (its temperature 1, its switch to sampling on), its model's logits handed as the model gives
them, and `torch.multinomial` answering the likeliest token while it records the probabilities it was
handed (generate_temperature.recorded_draws). Each row must keep as many tokens as top-p's nucleus of
the logits: the most likely ones until their mass reaches TOP_P, the token that crosses it kept
(counts, not places: Meta's sample_top_p samples from them sorted). A repetition penalty it takes is
handed 1 (none), a top-k on by default the whole vocabulary (it then keeps every token); a loop whose
min-p is on by default is not probed: its kept tokens are both filters'.

Shape legend: B prompts, V vocabulary.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from handformer.check.core.argument_names import K_NAMES, MIN_P_NAMES, P_NAMES, TEMPERATURE_NAMES, named
from handformer.check.core.context import Context, forward_defaults
from handformer.check.core.nucleus import top_p_keep
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines
from handformer.check.runners.generate_temperature import SOFT, VOCAB, Afresh, recorded_draws, sampling_on

TOP_P = 0.6
CROSSING = frozenset({"top_p_drops_crossing:le"})  # the token that crosses p dropped (cum <= p kept)
OFF = (None, 0, 0.0)  # another filter's default that leaves it off
REPEAT_NAMES = ("repetition_penalty", "rep_penalty", "repeat_penalty")  # handed 1: no penalty
BOUND = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)")  # the name a line binds: `cum = ...`
# a comparison with p, either side: `cum_probs > top_p`, `top_p < mass`
P_COMPARED = re.compile(rf"[<>]=?\s*(self\.)?({'|'.join(P_NAMES)})\b|\b({'|'.join(P_NAMES)})\s*[<>]")


def _options(comp: Any) -> dict[str, Any] | None:
    """The loop's top-p at TOP_P, its temperature at 1, a top-k it takes (on by default in Qwen's chat
    loop: top_k=20) the whole vocabulary (it keeps every token, whether the loop tests k > 0 or k is
    not None); None where it takes no top-p, or a min-p on by default."""
    defaults = forward_defaults(comp.obj)
    names = list(defaults)
    top_p = named(names, P_NAMES)
    options = {top_p: TOP_P, named(names, TEMPERATURE_NAMES): 1.0, named(names, REPEAT_NAMES): 1.0,
               named(names, K_NAMES): VOCAB, **sampling_on(comp.obj)}
    options.pop(None, None)  # no temperature, penalty or top-k taken
    return options if top_p in options and defaults.get(named(names, MIN_P_NAMES)) in OFF else None


def _counts(t: torch.Tensor) -> str:
    return ", ".join(map(str, t.tolist()))


def check_top_p(res: ComponentResult, ctx: Context, comp: Any, driver: Any, short: Any,
                run_generate: Any) -> None:
    """The probe of the module docstring (generate_loop's run_generate runs the loop); the crossing
    token dropped is named top_p_drops_crossing."""
    options = _options(comp)
    if options is None:
        return
    seen: list[torch.Tensor] = []
    B = short.prompt.size(0)
    with recorded_draws(seen, SOFT):
        run = run_generate(ctx, comp, Afresh(driver, seen), 1, B, short.as_list, options)
        logits = driver.logits(run.prompt)[:, -1].double()  # (B, V)
    if not seen or seen[0].shape[-1] != logits.size(-1):  # it never sampled, or sampled a subset
        return
    kept = (seen[0].reshape(-1, logits.size(-1))[:B] > 0).sum(-1)  # (B,) tokens each row keeps
    right = top_p_keep(logits, TOP_P).sum(-1)  # (B,)
    res.checks.append(Check(text(f"top_p={TOP_P}: it samples from the most likely tokens until their mass "
                                 f"reaches {TOP_P}, the token that crosses it kept",
                                 f"top_p={TOP_P}：它从概率最高、累计概率达到 {TOP_P} 的 token 中采样，"
                                 "越过阈值的那个 token 也保留"), torch.equal(kept, right),
                            text(f"it keeps {_counts(kept)} tokens; top-p keeps {_counts(right)}",
                                 f"它保留了 {_counts(kept)} 个 token；top-p 应保留 {_counts(right)} 个")))
    crossing = torch.equal(kept, top_p_keep(logits, TOP_P, CROSSING).sum(-1))
    if not torch.equal(kept, right):
        res.findings.append(_finding(ctx, comp, kept, right, crossing))


def _finding(ctx: Context, comp: Any, kept: torch.Tensor, right: torch.Tensor, crossing: bool) -> Finding:
    """top_p_drops_crossing where the loop keeps the nucleus less its crossing token; else the line that
    compares the cumulative mass with p, quoted as where the loop parts from top-p."""
    lines = source_lines(ctx.objects(comp, "top_p", "sample"))
    if crossing:
        number, code = locate("top_p_drops_crossing", lines)
        return Finding("top_p_drops_crossing", text(
            f"at top_p={TOP_P} your loop keeps {_counts(kept)} tokens: those whose cumulative probability "
            f"stays within {TOP_P}, the token that crosses it dropped",
            f"top_p={TOP_P} 时你的循环保留了 {_counts(kept)} 个 token：只保留累计概率不超过 {TOP_P} 的，"
            "越过阈值的那个 token 被去掉了"), number, code)
    number, code = mass_line(lines)
    return Finding(DEPARTS, text(
        f"at top_p={TOP_P} your loop keeps {_counts(kept)} tokens where top-p's nucleus holds "
        f"{_counts(right)}: it parts from top-p at the comparison of the mass with p",
        f"top_p={TOP_P} 时你的循环保留了 {_counts(kept)} 个 token，top-p 的核应有 {_counts(right)} 个："
        "它在累计概率与 p 的比较处与 top-p 分开"), number, code)


def mass_line(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first line that compares with p a cumulative sum, or a name bound to one (`remove =
    cum_probs > top_p`, `probs_sort[mass_above > p] = 0`); (None, None) where none does (a cumsum of
    positions is not one: no comparison with p reads it)."""
    code = [(n, line.split("#")[0]) for n, line in lines]  # a comment matches nothing
    summed = {bound[1] for _, line in code if "cumsum" in line and (bound := BOUND.match(line))}
    reads = re.compile("|".join(rf"\b{name}\b" for name in ("cumsum", *summed)))
    found = ((n, t.strip()) for n, t in code if P_COMPARED.search(t) and reads.search(t))
    return next(found, (None, None))
