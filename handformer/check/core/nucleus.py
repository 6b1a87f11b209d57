"""The tokens a top-p (nucleus) filter keeps, by the reference's rule or a classic mistake's: one home
for the sampling runner and the probe of a generation loop's top-p."""

import operator

import torch
from torch import Tensor

EQUALITY = "top_p_extra_at_equality"  # a flag of the search only: a convention, never a finding
# the rule a top-p keeps tokens by: (compared on the cumulative sum? else on the mass ranked above a token,
# the comparison with p): the reference's (mass above < p), then the classic mistakes: the crossing token
# dropped (cum <= p, or cum < p), one more kept at equality (mass above <= p)
TOP_P_RULES = {"": (False, operator.lt), "top_p_drops_crossing:le": (True, operator.le),
               "top_p_drops_crossing:lt": (True, operator.lt), EQUALITY: (False, operator.le)}
TOP_P_FLAGS = ("top_p_drops_crossing:le", "top_p_drops_crossing:lt", EQUALITY,
               "top_p_empty_set")


def top_p_keep(logits: Tensor, p: float, flags: frozenset[str] = frozenset()) -> Tensor:
    """The tokens top-p keeps (bool, like logits), exactly (no tolerance), by the rule the flags name
    (TOP_P_RULES); top_p_empty_set: no guard for the most likely token, which follows the rule's
    comparison on its own cumulative sum (the set may be empty)."""
    probs, order = torch.sort(torch.softmax(logits, -1), dim=-1, descending=True, stable=True)
    cum = probs.cumsum(-1)
    rule = min(flags & TOP_P_RULES.keys(), key=list(TOP_P_RULES).index, default="")  # the first flagged
    on_cum, keeps = TOP_P_RULES[rule]
    keep = keeps(cum if on_cum else cum - probs, p)  # cum - probs: the probability ranked above a token
    keep[..., 0] = keeps(cum[..., 0], p) if "top_p_empty_set" in flags else True
    return torch.zeros_like(keep).scatter(-1, order, keep)
