"""The top-k of a sampling loop (`generate(idx, max_new_tokens, temperature=1.0, top_k=None)`), driven
once more for one new token at top_k = TOP_K (its temperature 1, a top-p on by default handed 1, its
switch to sampling on), its model's logits handed as the model gives them (soft: the run with top_k = 1
sees a model whose likeliest token is certain, where a filter that keeps the wrong tokens still ends on
greedy's), and `torch.multinomial` answering the likeliest token while it records the probabilities it
was handed (generate_temperature.recorded_draws). Each row must keep exactly the TOP_K tokens of the
largest logits; another count kept quotes the line that filters the logits (the first that writes them
after they are ranked), where the loop parts from top-k (k tokens but others: the check fails, and
where the loop reads other logits its greedy runs say so). A loop whose min-p is on by default is not probed.

Shape legend: B prompts, V vocabulary.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.argument_names import MIN_P_NAMES, P_NAMES, TEMPERATURE_NAMES, named
from handformer.check.core.context import Context, forward_defaults
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import source_lines
from handformer.check.runners.generate_temperature import SOFT, Afresh, recorded_draws, sampling_on
from handformer.check.runners.generate_top_p import OFF, REPEAT_NAMES

TOP_K = 5
TOP_K_NAMES = ("top_k", "topk")  # not a bare k: speculative decoding's draft length, a beam's width
# a line that ranks the logits (`v, _ = torch.topk(logits, k)`, `sorted_logits = logits.sort(...)`), then
# the first line from there that writes the filtered logits (-inf, masked_fill, torch.where)
RANKS = re.compile(r"\b(topk|sort|argsort|kthvalue)\s*\(")
FILTERS = re.compile(r"(?i)inf\b|masked_fill|where\s*\(|-1e\d")


def _options(comp: Any) -> dict[str, Any] | None:
    """The loop's top-k at TOP_K, its temperature at 1, a top-p on by default at 1 (it keeps every
    token), a repetition penalty at 1; None where it takes no top-k, or a min-p on by default."""
    defaults = forward_defaults(comp.obj)
    names = list(defaults)
    top_k, top_p = named(names, TOP_K_NAMES), named(names, P_NAMES)
    options = {top_k: TOP_K, named(names, TEMPERATURE_NAMES): 1.0, named(names, REPEAT_NAMES): 1.0,
               **({top_p: 1.0} if defaults.get(top_p) not in OFF else {}), **sampling_on(comp.obj)}
    options.pop(None, None)  # no temperature, penalty or top-p taken
    return options if top_k in options and defaults.get(named(names, MIN_P_NAMES)) in OFF else None


def _tokens(keep: Tensor) -> str:
    return "; ".join(str(row.nonzero().flatten().tolist()) for row in keep)


def check_top_k(res: ComponentResult, ctx: Context, comp: Any, driver: Any, short: Any,
                run_generate: Any) -> None:
    """The probe of the module docstring (generate_loop's run_generate runs the loop)."""
    options = _options(comp)
    if options is None:
        return
    seen: list[Tensor] = []
    B = short.prompt.size(0)
    with recorded_draws(seen, SOFT):
        run = run_generate(ctx, comp, Afresh(driver, seen), 1, B, short.as_list, options)
        logits = driver.logits(run.prompt)[:, -1].double()  # (B, V)
    if not seen or seen[0].shape[-1] != logits.size(-1) or logits.size(-1) <= TOP_K:
        return  # it never sampled, sampled a subset, or k keeps every token
    kept = seen[0].reshape(-1, logits.size(-1))[:B] > 0  # (B, V) the tokens each row keeps
    right = torch.zeros_like(kept).scatter(-1, logits.topk(TOP_K, -1).indices, True)  # (B, V)
    said = text(f"it keeps the tokens {_tokens(kept)}; top-k keeps {_tokens(right)}",
                f"它保留的 token 是 {_tokens(kept)}；top-k 应保留 {_tokens(right)}")
    res.checks.append(Check(text(f"top_k={TOP_K}, its model's logits as they are: it samples from the "
                                 f"{TOP_K} likeliest tokens", f"top_k={TOP_K}，模型的 logits 原样使用："
                                 f"它从最可能的 {TOP_K} 个 token 中采样"), torch.equal(kept, right), said))
    # k tokens kept, but others: the loop may filter logits of another position (its own line, localized)
    if not torch.equal(kept.sum(-1), right.sum(-1)) and not res.has("top_k_off_by_one"):  # k-1: named at k=1
        res.findings.append(_finding(ctx, comp, said))


def _finding(ctx: Context, comp: Any, said: Text) -> Finding:
    """The line that filters the logits, quoted as where the loop parts from top-k."""
    number, code = filter_line(source_lines(ctx.objects(comp, "sample", "top_k", "top_p")))
    return Finding(DEPARTS, text(f"at top_k={TOP_K} {said['en']}: the filter at this line keeps other tokens",
                                 f"top_k={TOP_K} 时{said['zh']}：这一行的过滤保留了别的 token"), number, code)


def filter_line(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first line after the logits are ranked that writes the filtered logits; the ranking line
    where none does; (None, None) where nothing ranks them."""
    code = [(n, line.split("#")[0]) for n, line in lines]  # a comment matches nothing
    start = next((i for i, (_, line) in enumerate(code) if RANKS.search(line)), None)
    if start is None:
        return None, None
    number, line = next(((n, t) for n, t in code[start:] if FILTERS.search(t)), code[start])
    return number, line.strip()
