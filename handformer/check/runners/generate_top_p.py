"""The top-p of a sampling loop (`generate(input_ids, max_new_tokens, temperature=1.0, top_p=0.9)`, a
model's own method as Hugging Face ports write it): driven once more for one new token at top_p =
TOP_P (its temperature 1, its switch to sampling on), its model's logits handed as the model gives
them, and `torch.multinomial` answering the likeliest token while it records the probabilities it was
handed (generate_temperature.recorded_draws). The tokens with a probability there must be top-p's
nucleus of the logits: the most likely ones until their mass reaches TOP_P, the token that crosses it
kept. A loop that takes another filter with a setting on by default (a top-k of 50) is not probed: its
kept tokens are both filters'.

Shape legend: B prompts, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch

from handformer.check.core.argument_names import K_NAMES, MIN_P_NAMES, P_NAMES, TEMPERATURE_NAMES
from handformer.check.core.context import Context, forward_parameters
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines
from handformer.check.runners.generate_temperature import SOFT, Afresh, recorded_draws, sampling_on
from handformer.check.runners.sampling import top_p_keep

TOP_P = 0.6
CROSSING = frozenset({"top_p_drops_crossing:le"})  # the token that crosses p dropped (cum <= p kept)


def _options(comp: Any) -> dict[str, Any] | None:
    """The loop's top-p at TOP_P, its temperature at 1; None where it takes no top-p, or another filter
    whose default is on."""
    params = forward_parameters(comp.obj)
    named = lambda aliases: [p for p in params if p.name.lower() in aliases]  # noqa: E731
    if not named(P_NAMES) or any(p.default not in (None, 0, 0.0) for p in named(K_NAMES + MIN_P_NAMES)):
        return None
    return {named(P_NAMES)[0].name: TOP_P, **dict.fromkeys((p.name for p in named(TEMPERATURE_NAMES)), 1.0),
            **sampling_on(comp.obj)}


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
    # how many tokens each row keeps (Meta's sample_top_p samples from them sorted: counts, not places)
    kept = (seen[0].reshape(-1, logits.size(-1))[:B] > 0).sum(-1)  # (B,)
    right = top_p_keep(logits, TOP_P).sum(-1)  # (B,)
    counts, expected = (", ".join(str(int(n)) for n in t) for t in (kept, right))
    res.checks.append(Check(text(f"top_p={TOP_P}: it samples from the most likely tokens until their mass "
                                 f"reaches {TOP_P}, the token that crosses it kept",
                                 f"top_p={TOP_P}：它从概率最高、累计概率达到 {TOP_P} 的 token 中采样，"
                                 "越过阈值的那个 token 也保留"), torch.equal(kept, right),
                            text(f"it keeps {counts} tokens; top-p keeps {expected}",
                                 f"它保留了 {counts} 个 token；top-p 应保留 {expected} 个")))
    if not torch.equal(kept, right) and torch.equal(kept, top_p_keep(logits, TOP_P, CROSSING).sum(-1)):
        number, code = locate("top_p_drops_crossing", source_lines(ctx.objects(comp, "top_p", "sample")))
        res.findings.append(Finding("top_p_drops_crossing", text(
            f"at top_p={TOP_P} your loop keeps {counts} tokens: those whose cumulative probability stays "
            f"within {TOP_P}, the token that crosses it dropped",
            f"top_p={TOP_P} 时你的循环保留了 {counts} 个 token：只保留累计概率不超过 {TOP_P} 的，"
            "越过阈值的那个 token 被去掉了"), number, code))
